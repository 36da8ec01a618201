//! Forwarding a request to the backend's own route, and reading its answer: a stream as chunks
//! of whole SSE events, anything else as one body.

use axum::http::StatusCode;
use futures_util::{FutureExt, StreamExt};

use super::answer;
use super::endpoint;
use super::sse::{SseSplitter, UsageTracker};
use super::{Backend, BackendEvent, BackendRequest, Events};
use crate::dialect::{ApiError, Dialect};
use crate::protocol::HeaderMap;

/// A non-streaming backend body larger than this fails the request instead of exhausting memory
/// (the worker protocol's frame limit, which no body could cross anyway).
const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

/// Stream bytes already received are gathered into one chunk up to about this size.
const COALESCE_BYTES: usize = 32 * 1024;

/// Client headers that must not be copied to the backend request: reqwest sets them itself.
fn skip_request_header(name: &str) -> bool {
    matches!(
        name,
        "content-length" | "host" | "connection" | "transfer-encoding"
    )
}

/// Forwards `request` to the backend's own route for it, untouched.
pub(super) async fn serve_native(backend: &Backend, request: BackendRequest, events: &Events) {
    let BackendRequest {
        id,
        path,
        is_streaming,
        body,
        headers,
    } = request;
    match send(backend, &path, &headers, body).await {
        Ok(response) => deliver(response, &id, is_streaming, events).await,
        Err(error) => unreachable(backend, &path, &id, &error, events).await,
    }
}

/// Why a request never got an answer from the backend.
#[derive(Debug)]
pub(super) enum SendError {
    /// The path would leave the backend ([`endpoint::join`]): nothing was sent.
    Refused(String),
    /// The backend could not be reached.
    Http(reqwest::Error),
}

/// POSTs `body` with `headers` to `path` on the backend.
pub(super) async fn send(
    backend: &Backend,
    path: &str,
    headers: &HeaderMap,
    body: String,
) -> Result<reqwest::Response, SendError> {
    let url = endpoint::join(&backend.base_url, path).map_err(SendError::Refused)?;
    tracing::debug!(%url, "forwarding request");
    let mut builder = backend.client.post(url).body(body);
    let mut has_content_type = false;
    for (name, value) in headers {
        let name = name.to_ascii_lowercase();
        if skip_request_header(&name) {
            continue;
        }
        has_content_type |= name == "content-type";
        builder = builder.header(name, value);
    }
    if !has_content_type {
        builder = builder.header("content-type", "application/json");
    }
    builder.send().await.map_err(SendError::Http)
}

/// Reports a request the backend never answered: a 502 in the dialect of `path` when it could
/// not be reached, a 400 when its path was refused.
pub(super) async fn unreachable(
    backend: &Backend,
    path: &str,
    id: &str,
    error: &SendError,
    events: &Events,
) {
    let base_url = &backend.base_url;
    let (status, code, message) = match error {
        SendError::Http(error) => {
            tracing::warn!(request = %id, backend = %base_url, "backend error: {error}");
            (
                StatusCode::BAD_GATEWAY,
                "backend_unavailable",
                format!(
                    "the backend at {base_url} is unreachable: {}",
                    error_chain(error)
                ),
            )
        }
        SendError::Refused(why) => {
            tracing::warn!(request = %id, "{why}");
            (
                StatusCode::BAD_REQUEST,
                "invalid_endpoint_path",
                why.clone(),
            )
        }
    };
    let error = ApiError::new(status, code, message);
    let _ = events
        .send(answer::error(Dialect::for_path(path), &error))
        .await;
}

/// The backend's headers that are valid text.
pub(super) fn response_headers(response: &reqwest::Response) -> HeaderMap {
    response
        .headers()
        .iter()
        .filter_map(|(name, value)| {
            Some((name.as_str().to_string(), value.to_str().ok()?.to_string()))
        })
        .collect()
}

/// Whether the backend answered with an SSE stream.
pub(super) fn is_sse(headers: &HeaderMap) -> bool {
    headers
        .get("content-type")
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// Reports the backend's answer as it is: a stream as chunks, anything else as one body.
pub(super) async fn deliver(
    response: reqwest::Response,
    id: &str,
    is_streaming: bool,
    events: &Events,
) {
    let status = response.status();
    let headers = response_headers(&response);
    let mut usage = UsageTracker::default();
    let outcome = if is_streaming && status.is_success() && is_sse(&headers) {
        stream_body(response, &mut usage, events).await
    } else {
        read_body(response, &mut usage).await.map(Some)
    };
    let last = match outcome {
        Ok(body) => {
            if !status.is_success() {
                tracing::warn!(request = %id, status = status.as_u16(), "backend error status");
            }
            answer::complete(status, headers, body, usage.token_counts())
        }
        Err(message) => failed(id, message),
    };
    let _ = events.send(last).await;
}

/// The backend failed mid-answer.
pub(super) fn failed(id: &str, message: String) -> BackendEvent {
    tracing::warn!(request = %id, "backend error: {message}");
    BackendEvent::Failed(Box::new(ApiError::new(
        StatusCode::BAD_GATEWAY,
        "backend_error",
        message,
    )))
}

/// Sends the SSE body as chunks of whole events; `Ok(None)` when it ended (or the receiver
/// left).
async fn stream_body(
    response: reqwest::Response,
    usage: &mut UsageTracker,
    events: &Events,
) -> Result<Option<String>, String> {
    let broke_off =
        |e: reqwest::Error| format!("the backend stream broke off: {}", error_chain(&e));
    let mut splitter = SseSplitter::default();
    let mut body = response.bytes_stream();
    let mut ended = false;
    while !ended {
        let Some(piece) = body.next().await else {
            break;
        };
        splitter.feed(&piece.map_err(broke_off)?);
        // What the backend already sent goes out as one chunk: backends write an HTTP chunk
        // per event, and a message per event would cost a frame, a parse and a client write
        // each (stream64: four times the proxy's writes to clients).
        while splitter.pending_len() < COALESCE_BYTES {
            match body.next().now_or_never() {
                Some(Some(piece)) => splitter.feed(&piece.map_err(broke_off)?),
                Some(None) => {
                    ended = true;
                    break;
                }
                None => break,
            }
        }
        if let Some(text) = splitter.ready() {
            usage.observe_events(&text);
            if events.send(BackendEvent::Chunk(text)).await.is_err() {
                return Ok(None);
            }
        }
    }
    if let Some(rest) = splitter.finish() {
        usage.observe_events(&rest);
        let _ = events.send(BackendEvent::Chunk(rest)).await;
    }
    Ok(None)
}

/// Reads a whole body, bounded by [`MAX_BODY_BYTES`].
pub(super) async fn read_body(
    response: reqwest::Response,
    usage: &mut UsageTracker,
) -> Result<String, String> {
    let mut bytes = Vec::new();
    let mut body = response.bytes_stream();
    while let Some(piece) = body.next().await {
        let piece = piece
            .map_err(|e| format!("reading the backend's answer failed: {}", error_chain(&e)))?;
        if bytes.len() + piece.len() > MAX_BODY_BYTES {
            return Err(format!(
                "the backend's answer exceeds {MAX_BODY_BYTES} bytes"
            ));
        }
        bytes.extend_from_slice(&piece);
    }
    usage.observe_body(&bytes);
    let text = String::from_utf8(bytes)
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
    Ok(text)
}

/// An error with its causes, e.g. "error sending request: connection refused".
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
