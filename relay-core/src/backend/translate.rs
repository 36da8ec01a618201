//! Anthropic Messages and OpenAI Responses requests for backends that speak only OpenAI chat
//! completions.
//!
//! For each such request the backend's [`Capabilities`](super::Capabilities) say whether it
//! serves the route itself. If it does, the request passes through untouched; if it does not, the body is
//! converted by the [`adapter`], sent to `/v1/chat/completions`, and the answer converted back:
//! a whole answer at once, a stream event by event as it arrives (nothing waits for the end).
//! Token counts come from the backend's usage, read by the translator. `count_tokens` is
//! forwarded when the backend has it, and estimated ([`count_tokens::estimate`]) when not.
//!
//! An Anthropic API gets the same machinery the other way round ([`serve_from_anthropic`]):
//! OpenAI Chat and Responses requests become Messages requests.
//!
//! Content the adapter cannot translate (an audio block, say) is answered here with a 400 in the
//! client's dialect naming the field: the backend never sees it.

use axum::http::StatusCode;
use serde_json::{json, Value};

use super::answer;
use super::capabilities::{Route, Support};
use super::count_tokens;
use super::forward::{
    deliver, error_chain, failed, is_sse, read_body, response_headers, send, serve_native,
    unreachable,
};
use super::http::Response;
use super::sse::{SseSplitter, UsageTracker};
use super::{Backend, BackendEvent, BackendRequest, Events};
use crate::adapter::{
    self, canonical::Usage, AdapterError, BackendApi, ClientApi, StreamTranslator,
};
use crate::dialect::{ApiError, Dialect};
use crate::endpoint::Endpoint;
use crate::protocol::{TokenCounts, WireHeaders};

/// The translatable route of a request path (query string allowed), if any.
pub fn route_of(path: &str) -> Option<Route> {
    match Endpoint::of(path) {
        Endpoint::Messages => Some(Route::Messages),
        Endpoint::Responses => Some(Route::Responses),
        Endpoint::CountTokens => Some(Route::CountTokens),
        _ => None,
    }
}

/// Client-facing ids for a translated answer, created now.
fn minted_now() -> adapter::Identity {
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    adapter::Identity::minted(created)
}

/// How long counting with the backend's tokenizer may take before the estimate answers.
const TOKENIZE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// A tokenizer's answer longer than this is not read (a token list for the longest prompts).
const MAX_TOKENIZER_ANSWER: usize = 16 * 1024 * 1024;

/// The input tokens of an Anthropic Messages `body` as the backend's own tokenizer counts them
/// — vLLM's `POST /tokenize` with the chat messages and tools; llama-server's `/tokenize` takes
/// text only, so there the chat is rendered with the model's own template (`/apply-template`)
/// and that text counted — or `None` where it has no such route (learned once per probe
/// period) or does not answer in time.
async fn count_with_tokenizer(
    backend: &Backend,
    request: &BackendRequest,
    body: &Value,
) -> Option<u64> {
    if backend
        .capabilities
        .support(&backend.base_url, Route::Tokenize)
        == Support::Translated
    {
        return None;
    }
    let chat = adapter::to_chat_request(ClientApi::AnthropicMessages, body).ok()?;
    let mut ask = json!({
        "model": chat.get("model"),
        "messages": chat.get("messages"),
        "add_generation_prompt": true,
    });
    if let Some(tools) = chat.get("tools") {
        ask["tools"] = tools.clone();
    }
    let headers = chat_headers(&request.headers);
    let learn = |known| {
        backend
            .capabilities
            .learn(&backend.base_url, Route::Tokenize, known)
    };
    let counted = match ask_tokenizer(backend, Route::Tokenize.path(), &headers, &ask).await? {
        TokenizerAnswer::Missing => {
            learn(false);
            return None;
        }
        TokenizerAnswer::Json(counted) => counted,
    };
    if let Some(count) = counted.get("count").and_then(Value::as_u64) {
        learn(true);
        return Some(count);
    }
    // A tokenizer of text (llama-server's answers `{"tokens": []}` to messages).
    counted.get("tokens")?.as_array()?;
    ask.as_object_mut()?.remove("add_generation_prompt");
    let TokenizerAnswer::Json(rendered) =
        ask_tokenizer(backend, "/apply-template", &headers, &ask).await?
    else {
        learn(false);
        return None;
    };
    let text = json!({ "content": rendered.get("prompt")?.as_str()? });
    let TokenizerAnswer::Json(tokens) =
        ask_tokenizer(backend, Route::Tokenize.path(), &headers, &text).await?
    else {
        return None;
    };
    let count = tokens.get("tokens")?.as_array()?.len() as u64;
    learn(true);
    Some(count)
}

/// What a backend's tokenizer route answered.
enum TokenizerAnswer {
    /// The route does not exist there.
    Missing,
    /// A JSON answer.
    Json(Value),
}

/// Posts `ask` to the backend's `path` within [`TOKENIZE_TIMEOUT`]; `None` on a transport
/// failure, a timeout, an error status or an answer that is not JSON.
async fn ask_tokenizer(
    backend: &Backend,
    path: &str,
    headers: &WireHeaders,
    ask: &Value,
) -> Option<TokenizerAnswer> {
    let sent = send(backend, path, headers, ask.to_string());
    let response = tokio::time::timeout(TOKENIZE_TIMEOUT, sent)
        .await
        .ok()?
        .ok()?;
    let status = response.status();
    let text = tokio::time::timeout(TOKENIZE_TIMEOUT, response.text(MAX_TOKENIZER_ANSWER))
        .await
        .ok()?
        .ok()?;
    if super::route_missing(status, &text) {
        return Some(TokenizerAnswer::Missing);
    }
    if !status.is_success() {
        return None;
    }
    serde_json::from_str(&text).ok().map(TokenizerAnswer::Json)
}

/// Serves `request` for `route`: passed through, probed, or translated.
pub(super) async fn serve(
    backend: &Backend,
    request: BackendRequest,
    route: Route,
    events: &Events,
) {
    // Pinned to a slot: only chat completions carry the hint to llama-server.
    if request.slot.is_some() && route == Route::Messages {
        return serve_translated(backend, request, route, events).await;
    }
    match backend.capabilities.support(&backend.base_url, route) {
        Support::Native => serve_native(backend, request, events).await,
        Support::Translated => serve_translated(backend, request, route, events).await,
        Support::Probe => probe(backend, request, route, events).await,
    }
}

/// Sends the request to its own route; an answer saying the route does not exist switches to
/// translation (for this request and, for a while, the backend), any other answer is passed on.
async fn probe(backend: &Backend, request: BackendRequest, route: Route, events: &Events) {
    let (id, path) = (&request.id, &request.path);
    let response = match send(backend, path, &request.headers, request.body.clone()).await {
        Ok(response) => response,
        Err(error) => return unreachable(backend, path, id, &error, events).await,
    };
    let learn = |native| backend.capabilities.learn(&backend.base_url, route, native);
    let status = response.status();
    let headers = response_headers(&response);
    if is_sse(&headers) {
        learn(true);
        return deliver(response, id, path, request.is_streaming, events).await;
    }
    let mut usage = UsageTracker::default();
    let body = match read_body(response, &mut usage).await {
        Ok(body) => body,
        Err(message) => return send_last(events, failed(id, message)).await,
    };
    if super::route_missing(status, &body) {
        learn(false);
        return serve_translated(backend, request, route, events).await;
    }
    learn(true);
    let dialect = Dialect::for_path(path);
    let answer = answer::passed_on(dialect, status, headers, body, usage.token_counts());
    send_last(events, answer).await;
}

/// Sends a request's final event (the receiver may have left: then nobody waits for it).
async fn send_last(events: &Events, event: BackendEvent) {
    let _ = events.send(event).await;
}

/// Serves `request` through the backend's chat completions (or, for `count_tokens`, the
/// estimate).
async fn serve_translated(
    backend: &Backend,
    request: BackendRequest,
    route: Route,
    events: &Events,
) {
    let dialect = Dialect::for_path(&request.path);
    let body = match client_body(&request) {
        Ok(body) => body,
        Err(error) => return send_last(events, rejection(&request.id, dialect, &error)).await,
    };
    let api = match route {
        Route::Messages => ClientApi::AnthropicMessages,
        Route::Responses => ClientApi::OpenAiResponses,
        // Never a client's route (`route_of` does not name it); answered all the same.
        Route::Tokenize => {
            let refusal = ApiError::new(
                StatusCode::NOT_FOUND,
                "route_not_translated",
                format!("{} is not a route the worker translates", request.path),
            );
            return send_last(events, answer::error(dialect, &refusal)).await;
        }
        Route::CountTokens => {
            // The backend's own tokenizer where it has one; else the estimate, which says so.
            let answer = match count_with_tokenizer(backend, &request, &body).await {
                Some(tokens) => {
                    answer::json(StatusCode::OK, json!({"input_tokens": tokens}).to_string())
                }
                None => match count_tokens::estimate(&body) {
                    Ok(tokens) => answer::json(
                        StatusCode::OK,
                        json!({"input_tokens": tokens, "estimated": true}).to_string(),
                    ),
                    Err(error) => rejection(&request.id, dialect, &error),
                },
            };
            return send_last(events, answer).await;
        }
    };
    let target = Target {
        backend: BackendApi::OpenAiChat,
        api,
        body,
    };
    translate_via(backend, request, target, events).await;
}

/// Serves an OpenAI Chat Completions or Responses `request` from an Anthropic Messages API: the
/// request is converted to a Messages request, and the answer (whole, or a stream event by
/// event) back into the client's dialect. Anything else is sent as it is.
pub(super) async fn serve_from_anthropic(
    backend: &Backend,
    request: BackendRequest,
    events: &Events,
) {
    let api = match ClientApi::of(Endpoint::of(&request.path)) {
        Some(api @ (ClientApi::OpenAiChat | ClientApi::OpenAiResponses)) => api,
        _ => return serve_native(backend, request, events).await,
    };
    let body = match client_body(&request) {
        Ok(body) => body,
        Err(error) => {
            let dialect = Dialect::for_path(&request.path);
            return send_last(events, rejection(&request.id, dialect, &error)).await;
        }
    };
    let target = Target {
        backend: BackendApi::AnthropicMessages,
        api,
        body,
    };
    translate_via(backend, request, target, events).await;
}

/// The client's body as JSON.
fn client_body(request: &BackendRequest) -> Result<Value, AdapterError> {
    serde_json::from_str(&request.body).map_err(|error| AdapterError {
        path: "body".into(),
        message: format!("invalid JSON: {error}"),
    })
}

/// What a request is translated between: the client's `api` and `body`, and the `backend` API
/// it is served by.
struct Target {
    backend: BackendApi,
    api: ClientApi,
    body: Value,
}

/// Sends the request converted for `target.backend` to that API's route, and the answer back
/// converted for the client.
async fn translate_via(
    backend: &Backend,
    request: BackendRequest,
    target: Target,
    events: &Events,
) {
    let dialect = Dialect::for_path(&request.path);
    let id = request.id.as_str();
    let mut converted = match adapter::to_backend_request(target.backend, target.api, &target.body)
    {
        Ok(converted) => converted,
        Err(error) => return send_last(events, rejection(id, dialect, &error)).await,
    };
    if let (Some(slot), Some(object)) = (request.slot, converted.as_object_mut()) {
        object.insert("id_slot".to_string(), slot.into());
        object
            .entry("cache_prompt")
            .or_insert(serde_json::Value::Bool(true));
    }
    let headers = backend_headers(target.backend, &request.headers);
    let path = target.backend.path();
    let response = match send(backend, path, &headers, converted.to_string()).await {
        Ok(response) => response,
        Err(error) => return unreachable(backend, &request.path, id, &error, events).await,
    };
    let status = response.status();
    if request.is_streaming && status.is_success() && is_sse(&response_headers(&response)) {
        stream_translated(response, &target, id, events).await;
    } else {
        complete_translated(response, &target, dialect, id, events).await;
    }
}

/// Converts a whole backend answer (or a backend error) into the client's dialect.
async fn complete_translated(
    response: Response,
    target: &Target,
    dialect: Dialect,
    id: &str,
    events: &Events,
) {
    let status = response.status();
    let mut usage = UsageTracker::default();
    let text = match read_body(response, &mut usage).await {
        Ok(text) => text,
        Err(message) => return send_last(events, failed(id, message)).await,
    };
    let (status, body) = if status.is_success() {
        let translated = serde_json::from_str::<Value>(&text)
            .map_err(|e| e.to_string())
            .and_then(|answer| {
                adapter::from_backend_response_with(
                    target.backend,
                    target.api,
                    &target.body,
                    &answer,
                    &minted_now(),
                )
                .map_err(|e| e.to_string())
            });
        match translated {
            Ok(answer) => (status, answer.to_string()),
            Err(error) => {
                tracing::warn!(request = %id, "untranslatable backend answer: {error}");
                let message = format!("the backend's answer could not be translated: {error}");
                let status = StatusCode::BAD_GATEWAY;
                (
                    status,
                    dialect.error_body(status, "invalid_backend_response", &message),
                )
            }
        }
    } else if let Some((tokens, window)) = answer::context_overflow(status, &text) {
        tracing::info!(request = %id, tokens, window, "prompt longer than the backend's context window");
        return send_last(events, answer::prompt_too_long(dialect, tokens, window)).await;
    } else {
        tracing::warn!(request = %id, status = status.as_u16(), "backend error status");
        (
            status,
            dialect.error_body(status, "backend_error", &error_message(&text)),
        )
    };
    let mut complete = answer::complete(
        status,
        answer::json_headers(),
        Some(body),
        usage.token_counts(),
    );
    if let BackendEvent::Complete(answer) = &mut complete {
        answer.timings = usage.timings();
    }
    send_last(events, complete).await;
}

/// Translates a backend stream as it arrives: each burst of whole backend events becomes the
/// client's events at once; the end (or a stream cut off without its terminator) gets the
/// closing events the client's SDK needs.
async fn stream_translated(mut response: Response, target: &Target, id: &str, events: &Events) {
    let mut translator = StreamTranslator::for_backend_with_identity(
        target.backend,
        target.api,
        &target.body,
        minted_now(),
    );
    let mut splitter = SseSplitter::default();
    // llama-server's `timings` ride in the backend's own last event, which no client dialect
    // carries: read before translation, they tell the proxy how fast the box was (Claude Code's
    // turns pinned to a slot come this way).
    let mut timed = UsageTracker::since(response.sent());
    let send_text = |text: String| async move {
        text.is_empty() || events.send(BackendEvent::Chunk(text)).await.is_ok()
    };
    while let Some(piece) = response.chunk().await {
        let piece = match piece {
            Ok(piece) => piece,
            Err(error) => {
                let message = format!("the backend stream broke off: {}", error_chain(&error));
                return send_last(events, failed(id, message)).await;
            }
        };
        if let Some(text) = splitter.push(&piece) {
            timed.observe_events(&text);
            if !send_text(translator.push(&text)).await {
                break;
            }
        }
    }
    let mut tail = splitter
        .finish()
        .map(|rest| {
            timed.observe_events(&rest);
            translator.push(&rest)
        })
        .unwrap_or_default();
    tail.push_str(&translator.finish());
    send_text(tail).await;
    let headers =
        WireHeaders::from([("content-type".to_string(), "text/event-stream".to_string())]);
    let usage = translator.usage().map(token_counts);
    let mut complete = answer::complete(StatusCode::OK, headers, None, usage);
    if let BackendEvent::Complete(answer) = &mut complete {
        answer.timings = timed.timings();
        answer.clocked = timed.clocked();
    }
    send_last(events, complete).await;
}

/// A 400 in the client's dialect naming the field the adapter could not take. OpenAI clients
/// also get the field as `param`, where their SDKs look for it.
fn rejection(id: &str, dialect: Dialect, error: &AdapterError) -> BackendEvent {
    tracing::info!(request = %id, "untranslatable request: {error}");
    let status = StatusCode::BAD_REQUEST;
    let body = match dialect {
        Dialect::Anthropic => dialect.error_body(status, "invalid_request", &error.to_string()),
        Dialect::OpenAi | Dialect::OpenAiResponses => json!({"error": {
            "message": error.to_string(),
            "type": "invalid_request_error",
            "param": error.path,
            "code": "invalid_request",
        }})
        .to_string(),
    };
    answer::json(status, body)
}

/// The headers for the route of `backend`: [`chat_headers`], or for Anthropic the client's
/// without the OpenAI ones (the upstream's key and version were already set by the proxy).
fn backend_headers(backend: BackendApi, client: &WireHeaders) -> WireHeaders {
    match backend {
        BackendApi::OpenAiChat => chat_headers(client),
        BackendApi::AnthropicMessages => client
            .iter()
            .filter(|(name, _)| !name.to_ascii_lowercase().starts_with("openai-"))
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect(),
    }
}

/// The headers for the backend's chat route: the client's, without the Anthropic ones a chat
/// route has no use for, and with an `x-api-key` also offered as a bearer token (chat servers
/// such as vLLM only read `Authorization`).
fn chat_headers(client: &WireHeaders) -> WireHeaders {
    let mut headers: WireHeaders = client
        .iter()
        .filter(|(name, _)| !name.to_ascii_lowercase().starts_with("anthropic-"))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    let has_authorization = headers
        .keys()
        .any(|name| name.eq_ignore_ascii_case("authorization"));
    if !has_authorization {
        let key = headers
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case("x-api-key"))
            .map(|(_, value)| value.clone());
        if let Some(key) = key {
            headers.insert("authorization".to_string(), format!("Bearer {key}"));
        }
    }
    headers
}

/// The message of a backend's error body: OpenAI's `error.message`, a plain `error` string
/// (LM Studio), `message` or `detail`, else the text itself (shortened).
fn error_message(text: &str) -> String {
    let parsed: Option<Value> = serde_json::from_str(text).ok();
    let found = parsed.as_ref().and_then(|v| {
        [
            v.pointer("/error/message"),
            v.get("error"),
            v.get("message"),
            v.get("detail"),
        ]
        .into_iter()
        .flatten()
        .find_map(Value::as_str)
        .map(str::to_string)
    });
    found.unwrap_or_else(|| {
        let text = text.trim();
        match text.char_indices().nth(500) {
            Some((cut, _)) => format!("{}...", &text[..cut]),
            None if text.is_empty() => "the backend answered with an error".to_string(),
            None => text.to_string(),
        }
    })
}

fn token_counts(usage: Usage) -> TokenCounts {
    let count = |n: u64| u32::try_from(n).ok();
    TokenCounts {
        prompt_tokens: count(usage.input_tokens),
        completion_tokens: count(usage.output_tokens),
        total_tokens: count(usage.total_tokens()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn translatable_routes_are_found_with_or_without_a_query_string() {
        assert_eq!(route_of("/v1/messages?beta=true"), Some(Route::Messages));
        assert_eq!(route_of("/v1/responses"), Some(Route::Responses));
        assert_eq!(
            route_of("/v1/messages/count_tokens?beta=true"),
            Some(Route::CountTokens)
        );
        assert_eq!(route_of("/v1/chat/completions"), None);
        assert_eq!(route_of("/v1/responses/resp_1"), None);
    }

    #[test]
    fn chat_headers_drop_anthropic_headers_and_offer_the_api_key_as_a_bearer_token() {
        let client = WireHeaders::from([
            ("x-api-key".to_string(), "k".to_string()),
            ("anthropic-version".to_string(), "2023-06-01".to_string()),
            ("anthropic-beta".to_string(), "a,b".to_string()),
            ("content-type".to_string(), "application/json".to_string()),
        ]);
        let headers = chat_headers(&client);
        assert_eq!(
            headers.get("authorization").map(String::as_str),
            Some("Bearer k")
        );
        assert!(!headers.contains_key("anthropic-version"));
        assert!(!headers.contains_key("anthropic-beta"));
        let with_bearer = WireHeaders::from([
            ("authorization".to_string(), "Bearer b".to_string()),
            ("x-api-key".to_string(), "k".to_string()),
        ]);
        assert_eq!(chat_headers(&with_bearer)["authorization"], "Bearer b");
    }

    #[test]
    fn backend_error_messages_are_found_in_each_servers_shape() {
        assert_eq!(
            error_message(r#"{"error":{"message":"too long"}}"#),
            "too long"
        );
        assert_eq!(error_message(r#"{"error":"bad"}"#), "bad");
        assert_eq!(error_message(r#"{"detail":"Not Found"}"#), "Not Found");
        assert_eq!(error_message("plain text"), "plain text");
        assert_eq!(error_message(""), "the backend answered with an error");
    }
}
