//! Client-facing routes: the OpenAI and Anthropic inference endpoints, `/v1/models`, `/health`,
//! and the worker WebSocket endpoint. Only `model`, `stream` and the few fields that name a
//! conversation ([`conversation`]) are read from a request body; the rest travels to the worker
//! untouched.

use std::borrow::Cow;
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;

use axum::body::{to_bytes, Body};
use axum::extract::{OriginalUri, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::dialect::{ApiError, Dialect};
use crate::endpoint::Endpoint;
use crate::protocol::{
    json_string_len, CLIENT_AUTH_HEADERS, FORWARDED_HEADERS, FRAME_OVERHEAD_BYTES,
};
use crate::proxy::access::client_keys::{self, ClientIdentity};
use crate::proxy::access::priority;
use crate::proxy::dispatch::hub::RequestSpec;
use crate::proxy::dispatch::hub::{Placement, SubmitError, Submitted};
use crate::proxy::edge::answers;
use crate::proxy::serving::conversation::{
    affinity_key, from_claude_code, has_session_header, is_subagent, key_of_body, side_request_key,
    BodyFields,
};
use crate::proxy::serving::response::{AnswerObserver, AnswerSource, CancelGuard, Waiter};
use crate::proxy::serving::responses_api;
use crate::proxy::serving::upstream::UpstreamRequest;
use crate::proxy::AppState;

/// The client API: inference, models, stored Responses. Each request passes
/// [`client_keys::identify`] first (mounted where the state is known, in `proxy::router`).
pub fn client_routes() -> Router<AppState> {
    Router::new()
        .route("/v1/chat/completions", post(relay))
        .route("/v1/completions", post(relay))
        .route("/v1/embeddings", post(relay))
        .route("/v1/responses", post(relay))
        .route(
            "/v1/responses/{id}",
            get(responses_api::get_response).delete(responses_api::delete_response),
        )
        .route(
            "/v1/responses/{id}/input_items",
            get(responses_api::list_input_items),
        )
        .route("/v1/messages", post(relay))
        .route("/v1/messages/count_tokens", post(relay))
        .route("/v1/models", get(list_models))
        .route("/v1/models/{*id}", get(get_model))
        .method_not_allowed_fallback(answers::wrong_method)
}

/// The health check.
pub fn routes() -> Router<AppState> {
    Router::new().route("/health", get(health))
}

fn bad_request(code: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, code, message)
}

/// Reserves the request body's bytes against [`AppState::request_bytes`] before it is read: its
/// declared length, or the body limit when it declares none.
fn reserve_body_bytes(
    state: &AppState,
    headers: &HeaderMap,
) -> Result<OwnedSemaphorePermit, ApiError> {
    let limit = state.config.max_body_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    // Over the limit it is refused (413) on reading; reserving the limit is enough.
    let wanted = declared.unwrap_or(limit).min(limit).max(1);
    let permits = u32::try_from(wanted).unwrap_or(u32::MAX);
    state
        .request_bytes
        .clone()
        .try_acquire_many_owned(permits)
        .map_err(|_| {
            tracing::warn!(
                bytes = wanted,
                "request refused: max_request_bytes_in_flight reached"
            );
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "too_many_request_bytes",
                format!(
                    "the relay holds as many request bytes as it accepts ({} bytes, \
                     max_request_bytes_in_flight); retry shortly",
                    state.config.max_request_bytes_in_flight
                ),
            )
            .retry_after(Duration::from_secs(1))
        })
}

/// A body that did not arrive within the deadline.
fn body_too_slow(deadline: Duration) -> ApiError {
    ApiError::new(
        StatusCode::REQUEST_TIMEOUT,
        "body_timeout",
        format!(
            "the request body did not arrive within {} s (body_read_timeout_secs)",
            deadline.as_secs_f64()
        ),
    )
}

/// What [`read_request`] takes from a body.
struct ReadRequest {
    model: String,
    body: String,
    is_streaming: bool,
    /// The conversation it continues, when affinity is wanted.
    affinity: Option<u64>,
    /// That key comes from a session header, not from the body.
    session_header: bool,
    /// A side request of a conversation, keyed by its own prompt.
    side_request: bool,
}

/// Reads the body within the configured limit and pulls out `model`, `stream` and, when
/// `wants_affinity`, the conversation's affinity key, in one pass.
async fn read_request(
    body: Body,
    headers: &HeaderMap,
    limit: usize,
    wants_affinity: bool,
) -> Result<ReadRequest, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
            format!("request body exceeds the relay's limit of {limit} bytes (MAX_BODY_BYTES)"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|len| len > limit) {
        return Err(too_large());
    }
    let bytes = to_bytes(body, limit).await.map_err(|error| {
        if std::error::Error::source(&error)
            .is_some_and(|e| e.is::<http_body_util::LengthLimitError>())
        {
            too_large()
        } else {
            bad_request(
                "invalid_body",
                format!("could not read the request body: {error}"),
            )
        }
    })?;
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(bad_request(
            "invalid_json",
            "request body must be a JSON object",
        ));
    }
    let sniffed: BodyFields<'_> = serde_json::from_slice(&bytes)
        .map_err(|e| bad_request("invalid_json", format!("invalid JSON in request body: {e}")))?;
    let model = match &sniffed.model {
        Some(Value::String(model)) if !model.trim().is_empty() => model.clone(),
        Some(Value::String(_)) => {
            return Err(bad_request("invalid_model", "`model` must not be empty"))
        }
        Some(_) => return Err(bad_request("invalid_model", "`model` must be a string")),
        None => {
            return Err(bad_request(
                "missing_model",
                "missing required field `model`",
            ))
        }
    };
    let is_streaming = matches!(sniffed.stream, Some(Value::Bool(true)));
    // Claude Code's side requests (titles, summaries) ask for its small model with the main
    // conversation's session id: keyed by their own prompt, they leave its slot alone. A
    // subagent on the small model (its Explore agent) is a conversation of its own instead,
    // keyed by the session and its prompt ([`affinity_key`]), whose turns keep a slot.
    let side_request = crate::proxy::serving::claude_code::is_claude(&model)
        && crate::proxy::serving::claude_code::is_small(&model)
        && !is_subagent(&sniffed);
    let affinity = if side_request {
        wants_affinity.then(|| side_request_key(&sniffed)).flatten()
    } else {
        wants_affinity
            .then(|| affinity_key(headers, &sniffed))
            .flatten()
    };
    let session_header = !side_request && affinity.is_some() && has_session_header(headers);
    drop(sniffed);
    let body = String::from_utf8(bytes.into())
        .map_err(|_| bad_request("invalid_json", "request body is not valid UTF-8"))?;
    Ok(ReadRequest {
        model,
        body,
        is_streaming,
        affinity,
        session_header,
        side_request,
    })
}

/// What the relay keeps of the request line and headers once the body is read.
///
/// Owned copies on purpose: hyper's header values and path are views into its read buffer, and
/// while any of them lives, hyper cannot reuse that buffer for the read with which it watches
/// for a client hang-up, so it allocates another 8 KiB one. Copying the few values the relay
/// needs and dropping the rest before the answer is awaited keeps a waiting request at one read
/// buffer (BENCHMARKS.md, "What changed the numbers").
struct RequestHead {
    dialect: Dialect,
    /// The path with its query, as the worker's backend is to be called.
    endpoint_path: String,
    /// The client headers carried to the worker ([`FORWARDED_HEADERS`]).
    forwarded: crate::protocol::WireHeaders,
    /// The client's credentials, for providers that opt in.
    client_auth: crate::protocol::WireHeaders,
    /// Its client and priority in the queue's turns.
    placement: Placement,
}

impl RequestHead {
    fn new(uri: axum::http::Uri, headers: HeaderMap, placement: Placement) -> Self {
        let copy = |names: &[&str]| {
            names
                .iter()
                .filter_map(|name| {
                    let value = headers.get(*name)?.to_str().ok()?;
                    Some((name.to_string(), value.to_string()))
                })
                .collect()
        };
        let forwarded = copy(FORWARDED_HEADERS);
        let client_auth = copy(CLIENT_AUTH_HEADERS);
        let endpoint_path = uri
            .path_and_query()
            .map_or_else(|| uri.path(), |pq| pq.as_str())
            .to_string();
        RequestHead {
            dialect: Dialect::for_path(uri.path()),
            endpoint_path,
            forwarded,
            client_auth,
            placement: Placement {
                slot_hinted: Endpoint::of(uri.path()).pinnable(),
                ..placement
            },
        }
    }

    fn is_responses_api(&self) -> bool {
        self.endpoint_path.split('?').next() == Some("/v1/responses")
    }
}

async fn relay(
    State(state): State<AppState>,
    axum::Extension(identity): axum::Extension<ClientIdentity>,
    OriginalUri(uri): OriginalUri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let dialect = Dialect::for_path(uri.path());
    let key = identity.account.clone();
    // Answers the relay gives before a worker or upstream takes the request: counted in the
    // metrics under `other` (the model is not routed, or not yet known).
    let turn_away = |error: ApiError| refuse(&state, None, &key, error, dialect);
    if !state.hub.is_serving() {
        return turn_away(answers::proxy_role_off());
    }
    let placement =
        match priority::placement_of(identity.key.as_deref(), identity.client.clone(), &headers) {
            Ok(placement) => placement,
            Err(error) => return turn_away(error),
        };
    // A key's limits are checked before its body is read: a refused request costs nothing.
    let permit = match identity.key.as_ref().map(|key| state.key_limits.admit(key)) {
        Some(Ok(permit)) => Some(permit),
        Some(Err(error)) => return turn_away(error),
        None => None,
    };
    // Held until the answer starts: the body stays in memory while the request is read,
    // queued and dispatched (a worker death before the first byte requeues it).
    let mut held = match reserve_body_bytes(&state, &headers) {
        Ok(held) => held,
        Err(error) => return turn_away(error),
    };
    let wants_affinity = state.config.affinity && Endpoint::of(uri.path()).keeps_a_prompt_cache();
    let reading = read_request(body, &headers, state.config.max_body_bytes, wants_affinity);
    let ReadRequest {
        model,
        body,
        is_streaming,
        affinity,
        session_header,
        side_request,
    } = match tokio::time::timeout(state.config.body_read_timeout, reading).await {
        Ok(Ok(parts)) => parts,
        Ok(Err(error)) => return turn_away(error),
        Err(_) => return turn_away(body_too_slow(state.config.body_read_timeout)),
    };
    // Keep only what the body takes.
    let _ = held.split(held.num_permits().saturating_sub(body.len()));
    let expects_side_requests = affinity.is_some() && from_claude_code(&headers);
    let mut head = RequestHead::new(uri, headers, placement);
    head.placement.affinity = affinity;
    head.placement.side = side_request && affinity.is_some();
    head.placement.expects_side_requests = expects_side_requests && !head.placement.side;
    let (model, body) = match apply_aliases(&state, model, body) {
        Ok(parts) => parts,
        Err(error) => return turn_away(error),
    };
    if let Err(error) = identity.check_model(&model) {
        return turn_away(error);
    }
    // The prompt's size, from the body's: long prompts go to a worker whose window holds them,
    // and one far beyond every window is refused at once (the scheduler's `PromptTooLong`).
    head.placement.prompt_tokens = Some(crate::affinity::estimated_prompt_tokens(body.len()));
    if identity.key.is_some() {
        // The relay's own key: it opens this relay, not the backends behind it.
        head.client_auth.clear();
    }
    // Only Responses requests pay for the store (continuation, then recording the answer) and
    // for having their streams patched.
    let responses = head.is_responses_api();
    let (body, observer, continues) = if responses {
        let prepared = responses_api::prepare(
            &state.responses,
            state.shared_responses.as_ref(),
            identity
                .client
                .clone()
                .unwrap_or_else(|| std::sync::Arc::from("")),
            body,
            state.config.max_body_bytes,
        )
        .await;
        match prepared {
            Ok(prepared) => (
                prepared.body,
                prepared
                    .recorder
                    .map(|r| Box::new(r) as Box<dyn AnswerObserver>),
                prepared.continues,
            ),
            Err(error) => return turn_away(error),
        }
    } else {
        (body, None, None)
    };
    if continues.is_some() && head.placement.affinity.is_some() && !session_header {
        // Keyed again on the expanded history, whose leading messages are the first turn's.
        head.placement.affinity = key_of_body(&body);
    }
    let answer = dispatch(
        &state,
        head,
        model,
        body,
        is_streaming,
        observer,
        key.clone(),
    )
    .await;
    drop(held);
    let answer = if responses {
        responses_api::patch_stream(answer, continues)
    } else {
        answer
    };
    match permit {
        // The key's place is taken until the answer has been sent, stream included.
        Some(permit) => client_keys::hold_until_sent(answer, permit),
        None => answer,
    }
}

/// Answers `error` for a request no worker or upstream took, counting it for the metrics under
/// `model` (`None`: `other`, for names the proxy does not route).
fn refuse(
    state: &AppState,
    model: Option<&str>,
    key: &str,
    error: ApiError,
    dialect: Dialect,
) -> Response {
    state
        .hub
        .telemetry()
        .refused(model, key, error.status.as_u16());
    error.into_response(dialect)
}

/// Hands a prepared request to the workers, or to an upstream when they refuse it, and waits
/// for the answer.
async fn dispatch(
    state: &AppState,
    head: RequestHead,
    model: String,
    body: String,
    is_streaming: bool,
    observer: Option<Box<dyn AnswerObserver>>,
    key: Cow<'static, str>,
) -> Response {
    let RequestHead {
        dialect,
        endpoint_path,
        forwarded,
        client_auth,
        placement,
    } = head;
    // Escaped into the `request` frame the body may grow past what a worker accepts, and the
    // worker would drop its whole connection: refuse it here, precisely.
    let framed = json_string_len(&body) + FRAME_OVERHEAD_BYTES;
    if framed > state.config.worker_frame_limit {
        let error = ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
            format!(
                "this request's body takes {framed} bytes once escaped into the worker \
                 protocol's frame, beyond the {} bytes a worker accepts; send less (quotes, \
                 backslashes and control characters count double or more)",
                state.config.worker_frame_limit
            ),
        );
        return refuse(state, None, &key, error, dialect);
    }
    // The hub consumes the request; a copy is kept only when an upstream may take it instead.
    let spare = (!state.upstreams.is_empty()).then(|| UpstreamRequest {
        model: model.clone(),
        endpoint_path: endpoint_path.clone(),
        is_streaming,
        body: body.clone(),
        headers: forwarded.clone(),
    });
    // A model the workers do not claim would wait in the queue for one to announce it; an
    // upstream that serves it (or the fallback) answers now instead.
    if let Some(request) = spare.as_ref().filter(|r| !state.hub.serves(&r.model)) {
        if let Some(upstream) = state.upstreams.for_unclaimed(&request.model) {
            let request = spare.expect("checked above");
            return serve_upstream(state, upstream, request, dialect, observer, key).await;
        }
    }
    let model_name = model.clone();
    let accepted = match state.hub.submit(RequestSpec {
        model,
        endpoint_path,
        is_streaming,
        body,
        headers: forwarded,
        client_auth,
        placement,
    }) {
        Ok(accepted) => accepted,
        Err(refused) => {
            let upstream = spare
                .as_ref()
                .and_then(|r| state.upstreams.for_refusal(&r.model, &refused.reason));
            return match (upstream, spare) {
                (Some(upstream), Some(request)) => {
                    serve_upstream(state, upstream, request, dialect, observer, key).await
                }
                _ => {
                    // A name nobody serves is the client's invention: it gets no label.
                    let known = !matches!(refused.reason, SubmitError::UnknownModel);
                    let model = known.then_some(model_name.as_str());
                    refuse(state, model, &key, refused.error, dialect)
                }
            };
        }
    };
    let queue_deadline = match accepted.submitted {
        Submitted::Queued { queue_deadline, .. } => Some(Instant::from_std(queue_deadline)),
        Submitted::Dispatched { .. } => None,
    };
    let guard = CancelGuard::new(state.hub.clone(), accepted.request);
    let tracked = state
        .hub
        .telemetry()
        .begin(accepted.request, &model_name, is_streaming, key)
        .name_claimed(state.hub.serves(&model_name));
    Waiter::new(
        guard,
        AnswerSource::Hub {
            events: accepted.events,
            waiting: accepted.waiting,
        },
        Instant::from_std(accepted.deadline),
        queue_deadline,
        dialect,
    )
    .observe(observer)
    .track(tracked)
    .respond()
    .await
}

/// Serves `request` from `upstream` instead of a worker, counted on the dashboard like one.
async fn serve_upstream(
    state: &AppState,
    upstream: &crate::proxy::serving::upstream::UpstreamConfig,
    request: UpstreamRequest,
    dialect: Dialect,
    observer: Option<Box<dyn AnswerObserver>>,
    key: Cow<'static, str>,
) -> Response {
    let tracked =
        state
            .hub
            .track_upstream(&request.model, request.is_streaming, &upstream.name, key);
    // Boxed: inline, this path's state would enlarge every request's future, including the
    // many that only wait in the queue.
    Box::pin(
        state
            .upstreams
            .serve(upstream, request, dialect, observer, tracked),
    )
    .await
}

/// The model (and body) after [`crate::proxy::serving::claude_code::NameRoutes::mapped`]; untouched when the name needs no mapping. The
/// body is re-serialized only when rewritten.
fn apply_aliases(
    state: &AppState,
    model: String,
    body: String,
) -> Result<(String, String), ApiError> {
    let Some(target) = state.names.mapped(&model) else {
        return Ok((model, body));
    };
    let mut value: Value = serde_json::from_str(&body)
        .map_err(|e| bad_request("invalid_json", format!("invalid JSON in request body: {e}")))?;
    value["model"] = Value::String(target.to_string());
    tracing::debug!(requested = %model, served = %target, "model alias applied");
    Ok((target.to_string(), value.to_string()))
}

fn model_object(id: &str, provider: &str, anthropic: bool) -> Value {
    if anthropic {
        json!({"type": "model", "id": id, "display_name": id, "created_at": "1970-01-01T00:00:00Z"})
    } else {
        json!({"id": id, "object": "model", "created": 0, "owned_by": provider})
    }
}

/// Every model a client can ask for: the workers' first, then the upstreams' (a model both
/// serve is listed once, as the workers', since workers come first).
async fn all_models(state: &AppState) -> Vec<(String, String)> {
    let mut models = state.hub.models();
    if !state.upstreams.is_empty() {
        for (model, upstream) in state.upstreams.models().await {
            if !models.iter().any(|(listed, _)| *listed == model) {
                models.push((model, upstream));
            }
        }
    }
    models
}

/// Every model this relay serves, or only those a client's key may use.
async fn visible_models(state: &AppState, identity: &ClientIdentity) -> Vec<(String, String)> {
    let mut models = all_models(state).await;
    if let Some(key) = &identity.key {
        models.retain(|(model, _)| key.allows(model));
    }
    models
}

async fn list_models(
    State(state): State<AppState>,
    axum::Extension(identity): axum::Extension<ClientIdentity>,
    headers: HeaderMap,
) -> Json<Value> {
    let models = visible_models(&state, &identity).await;
    let anthropic = headers.contains_key("anthropic-version");
    let data: Vec<Value> = models
        .iter()
        .map(|(id, provider)| model_object(id, provider, anthropic))
        .collect();
    if anthropic {
        Json(json!({
            "data": data,
            "has_more": false,
            "first_id": models.first().map(|(id, _)| id.as_str()),
            "last_id": models.last().map(|(id, _)| id.as_str()),
        }))
    } else {
        Json(json!({"object": "list", "data": data}))
    }
}

async fn get_model(
    State(state): State<AppState>,
    axum::Extension(identity): axum::Extension<ClientIdentity>,
    axum::extract::Path(id): axum::extract::Path<String>,
    headers: HeaderMap,
) -> Response {
    let anthropic = headers.contains_key("anthropic-version");
    match visible_models(&state, &identity)
        .await
        .into_iter()
        .find(|(model, _)| *model == id)
    {
        Some((model, provider)) => Json(model_object(&model, &provider, anthropic)).into_response(),
        None => ApiError::new(
            StatusCode::NOT_FOUND,
            "model_not_found",
            format!("no worker or upstream serves model {id}"),
        )
        .into_response(if anthropic {
            Dialect::Anthropic
        } else {
            Dialect::OpenAi
        }),
    }
}

async fn health(State(state): State<AppState>) -> Json<Value> {
    let (workers, queue_depth) = state.hub.counts();
    Json(json!({
        "status": "ok",
        "version": env!("CARGO_PKG_VERSION"),
        "workers_connected": workers,
        "queue_depth": queue_depth,
        "uptime_secs": state.hub.uptime().as_secs_f64(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(uri: &str, headers: &[(&'static str, &str)]) -> RequestHead {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.insert(*name, value.parse().expect("header value"));
        }
        RequestHead::new(uri.parse().expect("uri"), map, Placement::default())
    }

    #[test]
    fn the_request_head_keeps_the_query_and_only_the_forwarded_headers_with_credentials_apart() {
        let head = head(
            "/v1/messages?beta=true",
            &[
                ("x-api-key", "sk-1"),
                ("anthropic-version", "2023-06-01"),
                ("user-agent", "claude-cli"),
                ("accept-encoding", "gzip"),
            ],
        );
        assert_eq!(head.endpoint_path, "/v1/messages?beta=true");
        assert_eq!(head.dialect, Dialect::for_path("/v1/messages"));
        let names: Vec<&str> = head.forwarded.keys().map(String::as_str).collect();
        assert_eq!(names, ["anthropic-version"]);
        assert_eq!(head.client_auth["x-api-key"], "sk-1");
        assert!(!head.is_responses_api());
    }

    #[test]
    fn a_request_is_slot_hinted_only_on_the_routes_the_worker_pins() {
        // Cost routing counts a side request first on a box that pins slots only where the
        // worker can pin it: chat and text completions, and Claude Code's `/v1/messages`
        // (translated to chat completions to carry the hint); not the Responses API.
        for (path, hinted) in [
            ("/v1/chat/completions", true),
            ("/v1/completions", true),
            ("/v1/messages?beta=true", true),
            ("/v1/messages/count_tokens", false),
            ("/v1/responses", false),
        ] {
            assert_eq!(head(path, &[]).placement.slot_hinted, hinted, "{path}");
        }
    }

    #[test]
    fn the_responses_api_is_recognised_with_or_without_a_query() {
        assert!(head("/v1/responses", &[]).is_responses_api());
        assert!(head("/v1/responses?stream=true", &[]).is_responses_api());
        assert!(!head("/v1/responses/resp_1", &[]).is_responses_api());
    }
}
