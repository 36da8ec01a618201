//! Forwarding a request to the backend's own route, and reading its answer: a stream as chunks
//! of whole SSE events, anything else as one body.

use axum::http::StatusCode;
use futures_util::FutureExt;

use super::answer;
use super::endpoint;
use super::http::{HttpError, Response};
use super::sse::{SseSplitter, UsageTracker};
use super::{Backend, BackendEvent, BackendRequest, Events};
use crate::dialect::{ApiError, Dialect};
use crate::protocol::WireHeaders;

/// A non-streaming backend body larger than this fails the request instead of exhausting memory
/// (the worker protocol's frame limit, which no body could cross anyway).
const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

/// Stream bytes already received are gathered into one chunk up to about this size.
const COALESCE_BYTES: usize = 32 * 1024;

/// Forwards `request` to the backend's own route for it, untouched.
pub(super) async fn serve_native(backend: &Backend, request: BackendRequest, events: &Events) {
    let BackendRequest {
        id,
        path,
        is_streaming,
        body,
        headers,
        ..
    } = request;
    // Usage is counted for every request, whether or not its client asked for it.
    let asked = is_streaming
        .then(|| super::sse::asking_for_usage(&path, &body))
        .flatten();
    let hide_usage = asked.is_some();
    let body = asked.unwrap_or(body);
    match send(backend, &path, &headers, body).await {
        Ok(response) => {
            deliver_hiding(response, &id, &path, is_streaming, hide_usage, events).await
        }
        Err(error) => unreachable(backend, &path, &id, &error, events).await,
    }
}

/// Why a request never got an answer from the backend.
#[derive(Debug)]
pub(super) enum SendError {
    /// The path would leave the backend ([`endpoint::join`]): nothing was sent.
    Refused(String),
    /// The backend could not be reached.
    Http(HttpError),
}

/// POSTs `body` with `headers` to `path` on the backend.
///
/// Sent once more when the backend closed the connection without a byte of an answer
/// ([`closed_unanswered`]): an idle pooled connection the backend was closing as the request
/// went out, which the affinity bench met about once in a thousand turns against llama-server.
/// The backend answered nothing, so its client has nothing to see twice, and a model server
/// abandons the work of a connection it closed; a second such close is the backend's answer.
pub(super) async fn send(
    backend: &Backend,
    path: &str,
    headers: &WireHeaders,
    body: String,
) -> Result<Response, SendError> {
    let url = endpoint::join(&backend.base_url, path).map_err(SendError::Refused)?;
    tracing::debug!(%url, "forwarding request");
    let headers = with_content_type(headers);
    // Shared, so a second send costs no copy of the body.
    let body = bytes::Bytes::from(body);
    match backend
        .client
        .post(url.clone(), &headers, body.clone())
        .await
    {
        Err(error) if error.closed_unanswered() => {
            tracing::debug!(
                backend = %backend.base_url,
                "sending once more: {}",
                error_chain(&error)
            );
            backend
                .client
                .post(url, &headers, body)
                .await
                .map_err(SendError::Http)
        }
        sent => sent.map_err(SendError::Http),
    }
}

/// The client's `headers`, with a JSON content type unless one was given.
fn with_content_type(headers: &WireHeaders) -> std::borrow::Cow<'_, WireHeaders> {
    if headers
        .keys()
        .any(|name| name.eq_ignore_ascii_case("content-type"))
    {
        return std::borrow::Cow::Borrowed(headers);
    }
    let mut headers = headers.clone();
    headers.insert("content-type".into(), "application/json".into());
    std::borrow::Cow::Owned(headers)
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
            let why = error_chain(error);
            tracing::warn!(request = %id, backend = %base_url, "backend error: {why}");
            (
                StatusCode::BAD_GATEWAY,
                "backend_unavailable",
                format!("the backend at {base_url} is unreachable: {why}"),
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
pub(super) fn response_headers(response: &Response) -> WireHeaders {
    response
        .headers()
        .iter()
        .filter_map(|(name, value)| {
            Some((name.as_str().to_string(), value.to_str().ok()?.to_string()))
        })
        .collect()
}

/// Whether the backend answered with an SSE stream.
pub(super) fn is_sse(headers: &WireHeaders) -> bool {
    headers
        .get("content-type")
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// Reports the backend's answer to a request for `path`: a stream as chunks, anything else as
/// one body ([`answer::passed_on`]).
pub(super) async fn deliver(
    response: Response,
    id: &str,
    path: &str,
    is_streaming: bool,
    events: &Events,
) {
    deliver_hiding(response, id, path, is_streaming, false, events).await
}

/// [`deliver`], keeping the usage-only events out of the stream when the relay asked for them
/// (`hide_usage`) and not the client.
async fn deliver_hiding(
    response: Response,
    id: &str,
    path: &str,
    is_streaming: bool,
    hide_usage: bool,
    events: &Events,
) {
    let status = response.status();
    let headers = response_headers(&response);
    let mut usage = UsageTracker::since(response.sent());
    let outcome = if is_streaming && status.is_success() && is_sse(&headers) {
        stream_body(response, &mut usage, hide_usage, events).await
    } else {
        read_body(response, &mut usage).await.map(Some)
    };
    let last = match outcome {
        Ok(body) => {
            if !status.is_success() {
                tracing::warn!(request = %id, status = status.as_u16(), "backend error status");
            }
            let counts = usage.token_counts();
            let mut last = match body {
                Some(body) => {
                    answer::passed_on(Dialect::for_path(path), status, headers, body, counts)
                }
                None => answer::complete(status, headers, None, counts),
            };
            if let BackendEvent::Complete(answer) = &mut last {
                answer.timings = usage.timings();
                // Timed where the first event is the first token (the translated path times the
                // backend's chat completions stream).
                answer.clocked = usage
                    .clocked()
                    .filter(|_| crate::endpoint::Endpoint::of(path).first_event_is_first_token());
            }
            last
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
    mut response: Response,
    usage: &mut UsageTracker,
    hide_usage: bool,
    events: &Events,
) -> Result<Option<String>, String> {
    let shown = |text: String| -> String {
        if hide_usage {
            super::sse::without_usage_only_events(text)
        } else {
            text
        }
    };
    let broke_off = |e: HttpError| format!("the backend stream broke off: {}", error_chain(&e));
    let mut splitter = SseSplitter::default();
    let mut ended = false;
    while !ended {
        let Some(piece) = response.chunk().await else {
            break;
        };
        splitter.feed(&piece.map_err(broke_off)?);
        // What the backend already sent goes out as one chunk: backends write an HTTP chunk
        // per event, and a message per event would cost a frame, a parse and a client write
        // each (stream64: four times the proxy's writes to clients).
        while splitter.pending_len() < COALESCE_BYTES {
            match response.chunk().now_or_never() {
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
            let text = shown(text);
            if !text.is_empty() && events.send(BackendEvent::Chunk(text)).await.is_err() {
                return Ok(None);
            }
        }
    }
    if let Some(rest) = splitter.finish() {
        usage.observe_events(&rest);
        let rest = shown(rest);
        if !rest.is_empty() {
            let _ = events.send(BackendEvent::Chunk(rest)).await;
        }
    }
    Ok(None)
}

/// Reads a whole body, bounded by [`MAX_BODY_BYTES`].
pub(super) async fn read_body(
    response: Response,
    usage: &mut UsageTracker,
) -> Result<String, String> {
    let text = response
        .text(MAX_BODY_BYTES)
        .await
        .map_err(|e| format!("reading the backend's answer failed: {}", error_chain(&e)))?;
    usage.observe_body(text.as_bytes());
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::http::{HttpClient, LocalClient};
    use crate::backend::testing::counting_backend;
    use crate::backend::{Capabilities, Speaks};
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    /// Both clients a backend may be reached with: every test runs with each.
    fn clients() -> [HttpClient; 2] {
        [
            HttpClient::General(reqwest::Client::new()),
            HttpClient::Local {
                local: LocalClient::new(8, Duration::from_secs(4)),
                general: reqwest::Client::new(),
            },
        ]
    }

    fn backend_at(base_url: String, client: HttpClient) -> Backend {
        Backend {
            base_url,
            speaks: Speaks::OpenAi,
            client,
            capabilities: Capabilities::default(),
        }
    }

    /// Sends a chat request that the backend does not answer: the client's error.
    async fn send_unanswered(backend: &Backend) -> HttpError {
        let sent = send(
            backend,
            "/v1/chat/completions",
            &WireHeaders::new(),
            "{}".into(),
        )
        .await;
        match sent {
            Err(SendError::Http(error)) => error,
            Err(SendError::Refused(why)) => panic!("the path was refused: {why}"),
            Ok(response) => panic!("answered: {}", response.status()),
        }
    }

    #[tokio::test]
    async fn a_request_the_backend_closed_on_without_answering_is_sent_once_more() {
        for client in clients() {
            let (base_url, accepted) = counting_backend(1).await;
            let backend = backend_at(base_url, client);
            let response = send(
                &backend,
                "/v1/chat/completions",
                &WireHeaders::new(),
                "{}".into(),
            )
            .await
            .expect("the second send is answered");
            assert_eq!(response.status(), StatusCode::OK);
            assert_eq!(response.text(1024).await.unwrap(), "{}");
            assert_eq!(accepted.load(Ordering::SeqCst), 2);
        }
    }

    #[tokio::test]
    async fn a_backend_that_closes_every_time_gets_the_request_twice_then_a_502() {
        for client in clients() {
            let (base_url, accepted) = counting_backend(usize::MAX).await;
            let error = send_unanswered(&backend_at(base_url, client)).await;
            assert!(error.closed_unanswered(), "{}", error_chain(&error));
            assert_eq!(accepted.load(Ordering::SeqCst), 2, "one more send, no more");
        }
    }

    #[tokio::test]
    async fn a_refused_connect_is_not_sent_again() {
        for client in clients() {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let base_url = format!("http://{}", listener.local_addr().unwrap());
            drop(listener);
            let error = send_unanswered(&backend_at(base_url, client)).await;
            assert!(!error.closed_unanswered());
            let why = error_chain(&error);
            assert!(why.contains("refused"), "{why}");
        }
    }

    /// What a caller's headers become at the backend, read off the wire.
    #[tokio::test]
    async fn a_header_that_would_smuggle_another_is_refused_before_anything_is_sent() {
        for client in clients() {
            let (base_url, accepted) = counting_backend(0).await;
            let backend = backend_at(base_url, client);
            let headers =
                WireHeaders::from([("x-note".to_string(), "1\r\nx-injected: yes".to_string())]);
            let sent = send(&backend, "/v1/chat/completions", &headers, "{}".into()).await;
            assert!(sent.is_err(), "a header with CRLF was sent");
            assert_eq!(accepted.load(Ordering::SeqCst), 0);
        }
    }
}
