//! Forwarding one `request` to the local backend and reporting the answer back as
//! `response_chunk`s and a final `response_complete`.
//!
//! Each request runs in its own task; aborting the task drops the backend response, which closes
//! the backend connection, so the backend sees the cancellation.

use axum::http::StatusCode;
use futures_util::{FutureExt, StreamExt};
use tokio::sync::mpsc;

use super::sse::{SseSplitter, UsageTracker};
use super::{answer, endpoint, translate};
use crate::dialect::{ApiError, Dialect};
use crate::protocol::{
    json_string_len, ErrorMessage, HeaderMap, RequestMessage, ResponseChunkMessage, WorkerToServer,
    FRAME_OVERHEAD_BYTES, MAX_FRAME_BYTES,
};

/// A non-streaming backend body larger than this fails the request instead of exhausting memory.
const MAX_BODY_BYTES: usize = crate::protocol::MAX_FRAME_BYTES;

/// Stream bytes already received are gathered into one chunk up to about this size.
const COALESCE_BYTES: usize = 32 * 1024;

/// What a request task tells the connection loop.
#[derive(Debug)]
pub enum TaskEvent {
    /// A message to send to the proxy.
    Send(WorkerToServer),
    /// The request's task is done (its final message was already sent).
    Done(String),
}

/// Client headers that must not be copied to the backend request: reqwest sets them itself.
fn skip_request_header(name: &str) -> bool {
    matches!(
        name,
        "content-length" | "host" | "connection" | "transfer-encoding"
    )
}

/// Forwards `request` to `backend_url` and reports everything through `events`. Anthropic
/// Messages and OpenAI Responses requests go through [`translate`], which passes them through
/// when the backend serves the route itself and translates them to chat completions when not.
pub async fn forward(
    client: reqwest::Client,
    backend_url: String,
    request: RequestMessage,
    events: mpsc::Sender<TaskEvent>,
) {
    match translate::route_of(&request.endpoint_path) {
        Some(route) => translate::forward(client, backend_url, request, route, events).await,
        None => forward_native(client, backend_url, request, events).await,
    }
}

/// Forwards `request` to the backend's own route for it, untouched.
pub(super) async fn forward_native(
    client: reqwest::Client,
    backend_url: String,
    request: RequestMessage,
    events: mpsc::Sender<TaskEvent>,
) {
    let path = request.endpoint_path.clone();
    match send(&client, &backend_url, &path, &request.headers, request.body).await {
        Ok(response) => deliver(response, &request.request_id, request.is_streaming, &events).await,
        Err(error) => unreachable(&backend_url, &path, &request.request_id, &error, &events).await,
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

/// POSTs `body` with the client's `headers` to `path` on the backend.
pub(super) async fn send(
    client: &reqwest::Client,
    backend_url: &str,
    path: &str,
    headers: &HeaderMap,
    body: String,
) -> Result<reqwest::Response, SendError> {
    let url = endpoint::join(backend_url, path).map_err(SendError::Refused)?;
    tracing::debug!(%url, "forwarding request");
    let mut builder = client.post(url).body(body);
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
    backend_url: &str,
    path: &str,
    request_id: &str,
    error: &SendError,
    events: &mpsc::Sender<TaskEvent>,
) {
    let (status, code, message) = match error {
        SendError::Http(error) => {
            tracing::warn!(request = %request_id, %backend_url, "backend error: {error}");
            (
                StatusCode::BAD_GATEWAY,
                "backend_unavailable",
                format!(
                    "the worker's backend at {backend_url} is unreachable: {}",
                    error_chain(error)
                ),
            )
        }
        SendError::Refused(why) => {
            tracing::warn!(request = %request_id, "{why}");
            (
                StatusCode::BAD_REQUEST,
                "invalid_endpoint_path",
                why.clone(),
            )
        }
    };
    let failure = answer::error(
        request_id,
        Dialect::for_path(path),
        &ApiError::new(status, code, message),
    );
    finish(events, request_id, failure).await;
}

/// Sends a request's final message, then tells the connection loop the task is done.
pub(super) async fn finish(
    events: &mpsc::Sender<TaskEvent>,
    request_id: &str,
    message: WorkerToServer,
) {
    let _ = events.send(TaskEvent::Send(message)).await;
    let _ = events.send(TaskEvent::Done(request_id.to_string())).await;
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
    request_id: &str,
    is_streaming: bool,
    events: &mpsc::Sender<TaskEvent>,
) {
    let report = |message: WorkerToServer| {
        let events = events.clone();
        async move { events.send(TaskEvent::Send(message)).await.is_ok() }
    };
    let status = response.status();
    let headers = response_headers(&response);
    let mut usage = UsageTracker::default();
    let outcome = if is_streaming && status.is_success() && is_sse(&headers) {
        stream_body(response, request_id, &mut usage, &report).await
    } else {
        read_body(response, &mut usage).await.map(Some)
    };
    let final_message = match outcome {
        Ok(body) => {
            if !status.is_success() {
                tracing::warn!(request = %request_id, status = status.as_u16(), "backend error status");
            }
            answer::complete(request_id, status, headers, body, usage.token_counts())
        }
        Err(message) => backend_error(request_id, message),
    };
    finish(events, request_id, final_message).await;
}

/// A request-scoped `error`: the backend failed mid-answer.
pub(super) fn backend_error(request_id: &str, message: String) -> WorkerToServer {
    tracing::warn!(request = %request_id, "backend error: {message}");
    WorkerToServer::Error(ErrorMessage {
        request_id: Some(request_id.to_string()),
        code: "backend_error".to_string(),
        message,
    })
}

/// Sends the SSE body as chunks of whole events; `Ok(None)` when it ended cleanly.
async fn stream_body<F, Fut>(
    response: reqwest::Response,
    request_id: &str,
    usage: &mut UsageTracker,
    report: &F,
) -> Result<Option<String>, String>
where
    F: Fn(WorkerToServer) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
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
            if !report(chunk(request_id, text)).await {
                return Ok(None);
            }
        }
    }
    if let Some(rest) = splitter.finish() {
        usage.observe_events(&rest);
        report(chunk(request_id, rest)).await;
    }
    Ok(None)
}

/// A `response_chunk` of SSE text.
pub(super) fn chunk(request_id: &str, text: String) -> WorkerToServer {
    WorkerToServer::ResponseChunk(ResponseChunkMessage {
        request_id: request_id.to_string(),
        chunk: text,
    })
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
    // Escaped into the `response_complete` frame the body may grow: one the proxy would refuse
    // (closing this worker's connection, and every stream on it) is an error instead.
    let framed = json_string_len(&text) + FRAME_OVERHEAD_BYTES;
    if framed > MAX_FRAME_BYTES {
        return Err(format!(
            "the backend's answer ({} bytes) would take {framed} bytes in a frame, beyond the \
             {MAX_FRAME_BYTES} a proxy accepts",
            text.len()
        ));
    }
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
