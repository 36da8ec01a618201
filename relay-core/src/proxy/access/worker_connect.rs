//! The worker endpoint, `GET /v1/worker/connect`: the worker secret checked (the header, or the
//! seeds' URL form for old workers, never both), the connection counted against
//! `max_workers`, and the WebSocket handed to dispatch ([`serve_worker`]). A plain HTTP request
//! here gets `426 Upgrade Required`, before any authentication.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{ConnectInfo, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::dialect::{ApiError, Dialect};
use crate::proxy::access::credentials::secrets_match;
use crate::proxy::dispatch::scheduler::RegisterError;
use crate::proxy::dispatch::worker_socket::serve_worker;
use crate::proxy::AppState;

/// Read buffer of each worker connection.
const WORKER_READ_BUFFER_BYTES: usize = 16 * 1024;

/// The worker endpoint's route.
pub fn routes() -> Router<AppState> {
    Router::new().route("/v1/worker/connect", get(worker_connect))
}

async fn worker_connect(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    let dialect = Dialect::OpenAi;
    if !state.hub.is_serving() {
        return crate::proxy::edge::answers::proxy_role_off().into_response(dialect);
    }
    // Before any authentication: a plain request (a browser, the runbook's `curl -v`) learns
    // what this endpoint is, and never counts as a failed worker login.
    let upgrade = match upgrade {
        Ok(upgrade) => upgrade,
        Err(rejection) => return not_a_websocket_upgrade(&headers, &rejection),
    };
    let now = std::time::Instant::now();
    if let Err(retry_after) = state.limiter.check_worker(peer.ip(), now) {
        tracing::warn!(peer = %peer.ip(), "worker auth rate-limited");
        return ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "auth_rate_limited",
            "too many failed worker authentication attempts from this address; wait and retry",
        )
        .retry_after(retry_after)
        .into_response(dialect);
    }
    let provider = query
        .get("provider")
        .cloned()
        .unwrap_or_else(|| state.config.providers[0].name.clone());
    if let Err(error) = state.hub.check_provider(&provider) {
        let (status, code, message) = match error {
            RegisterError::UnknownProvider => (
                StatusCode::NOT_FOUND,
                "unknown_provider",
                format!("unknown provider {provider}"),
            ),
            RegisterError::ProviderDisabled => (
                StatusCode::FORBIDDEN,
                "provider_disabled",
                "Provider is currently disabled".to_string(),
            ),
            RegisterError::ShuttingDown => (
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting_down",
                "the proxy is shutting down".to_string(),
            ),
            RegisterError::Drained => (
                StatusCode::FORBIDDEN,
                "worker_drained",
                "this worker was drained by an admin; it may rejoin after the proxy restarts"
                    .to_string(),
            ),
        };
        return ApiError::new(status, code, message).into_response(dialect);
    }
    let in_header = headers
        .get("x-worker-secret")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    // The seeds keep the URL form for workers older than the header (ours and the published
    // worker send the header). A worker that sends the header gets nothing from the URL form,
    // so carrying both is refused: the secret would be in access logs for nothing.
    let in_url = query
        .get("worker_secret")
        .or_else(|| query.get("secret"))
        .cloned();
    if in_header.is_some() && in_url.is_some() {
        return ApiError::new(
            StatusCode::BAD_REQUEST,
            "secret_in_url",
            "the worker secret is in both the X-Worker-Secret header and the URL: send it in the \
             header only (URLs end up in access logs)",
        )
        .into_response(dialect);
    }
    if in_header.is_none() && in_url.is_some() {
        tracing::warn!(
            peer = %peer.ip(),
            provider,
            "a worker sent its secret in the URL (the legacy form, kept for old workers): URLs \
             end up in access logs; upgrade it to send the X-Worker-Secret header"
        );
    }
    let presented = in_header.or(in_url);
    let expected = state
        .config
        .providers
        .iter()
        .find(|p| p.name == provider)
        .map(|p| p.secret.as_str())
        .unwrap_or_default();
    let authorized = presented
        .as_deref()
        .is_some_and(|secret| !expected.is_empty() && secrets_match(secret, expected));
    if !authorized {
        state.limiter.record_failure(peer.ip(), now);
        state.hub.telemetry().worker_auth_failed();
        tracing::warn!(peer = %peer.ip(), provider, "worker authentication failed");
        let message = if presented.is_none() {
            "missing worker secret: send it in the X-Worker-Secret header"
        } else {
            "invalid worker secret for this provider"
        };
        return ApiError::new(StatusCode::UNAUTHORIZED, "invalid_worker_secret", message)
            .into_response(dialect);
    }
    state.limiter.record_success(peer.ip());
    // While it is connected, its address stays open to workers whatever else fails there.
    let live = state.limiter.worker_connected(peer.ip());
    // Held for the connection's life: a proxy serves at most `max_workers` at once.
    let Ok(slot) = state.worker_slots.clone().try_acquire_owned() else {
        tracing::warn!(peer = %peer.ip(), max = state.config.max_workers, "worker refused: max_workers reached");
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too_many_workers",
            format!(
                "this proxy already serves {} workers (max_workers); retry later or raise it",
                state.config.max_workers
            ),
        )
        .retry_after(Duration::from_secs(30))
        .into_response(dialect);
    };
    let hub = state.hub.clone();
    let settings = state.socket_settings.clone();
    upgrade
        // tungstenite preallocates a 128 KiB read buffer per connection by default: 128 MB for
        // 1,000 idle workers. 16 KiB still reads a burst of coalesced chunks in a few calls.
        .read_buffer_size(WORKER_READ_BUFFER_BYTES)
        .max_message_size(state.config.max_ws_message_bytes)
        .max_frame_size(state.config.max_ws_message_bytes)
        .on_upgrade(move |socket| async move {
            serve_worker(socket, hub, provider, settings, peer.ip()).await;
            drop((slot, live));
        })
        .into_response()
}

/// The answer to a request on the worker endpoint that is not a WebSocket handshake: 426 with
/// `Upgrade: websocket` when it did not ask for one (RFC 9110 §15.5.22), 400 naming what is
/// wrong when it asked for one but the handshake is malformed.
fn not_a_websocket_upgrade(headers: &HeaderMap, rejection: &WebSocketUpgradeRejection) -> Response {
    let asked = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    if asked {
        return ApiError::new(
            StatusCode::BAD_REQUEST,
            "websocket_handshake_invalid",
            format!("malformed WebSocket handshake on the worker endpoint: {rejection}"),
        )
        .into_response(Dialect::OpenAi);
    }
    let mut response = ApiError::new(
        StatusCode::UPGRADE_REQUIRED,
        "websocket_required",
        "this is the worker endpoint: workers connect here over WebSocket \
         (`modelrelay worker --proxy-url` with this proxy's address); a plain HTTP request \
         reaching it means the proxy is up and reachable",
    )
    .into_response(Dialect::OpenAi);
    let headers = response.headers_mut();
    headers.insert(
        header::UPGRADE,
        header::HeaderValue::from_static("websocket"),
    );
    headers.insert(
        header::CONNECTION,
        header::HeaderValue::from_static("Upgrade"),
    );
    response
}
