//! Error shapes in the dialect of each client-facing endpoint.
//!
//! OpenAI clients expect `{"error":{"message","type","code"}}`; Anthropic clients expect
//! `{"type":"error","error":{"type","message"}}`, and in a stream an `event: error`. Every error the
//! relay itself produces goes through [`ApiError`], so each failure is mapped to a status and a
//! body exactly once.

use crate::endpoint::Endpoint;
use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::json;

/// Which API family an endpoint belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// OpenAI Chat Completions, Completions, Embeddings, Models.
    OpenAi,
    /// OpenAI Responses: errors as OpenAI, but a stream error is a typed `error` event.
    OpenAiResponses,
    /// Anthropic Messages.
    Anthropic,
}

impl Dialect {
    /// The dialect of a request path (query string allowed), by its [`Endpoint`].
    pub fn for_path(path: &str) -> Dialect {
        Dialect::of(Endpoint::of(path))
    }

    /// The dialect of `endpoint`; OpenAI's for any route the relay does not know.
    pub fn of(endpoint: Endpoint) -> Dialect {
        if endpoint.is_anthropic() {
            Dialect::Anthropic
        } else if endpoint.is_responses() {
            Dialect::OpenAiResponses
        } else {
            Dialect::OpenAi
        }
    }

    /// The JSON error body for a non-streaming error.
    pub fn error_body(self, status: StatusCode, code: &str, message: &str) -> String {
        match self {
            Dialect::OpenAi | Dialect::OpenAiResponses => json!({
                "error": {"message": message, "type": openai_type(status), "code": code}
            }),
            Dialect::Anthropic => json!({
                "type": "error",
                "error": {"type": anthropic_type(status), "message": message}
            }),
        }
        .to_string()
    }

    /// One SSE event that ends a stream with an error, in the form the dialect's SDKs parse.
    pub fn sse_error(self, status: StatusCode, code: &str, message: &str) -> Bytes {
        let text = match self {
            Dialect::OpenAi => format!("data: {}\n\n", self.error_body(status, code, message)),
            Dialect::OpenAiResponses => format!(
                "event: error\ndata: {}\n\n",
                json!({"type": "error", "code": code, "message": message, "param": null})
            ),
            Dialect::Anthropic => format!(
                "event: error\ndata: {}\n\n",
                self.error_body(status, code, message)
            ),
        };
        Bytes::from(text)
    }
}

fn openai_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        429 => "rate_limit_error",
        503 => "service_unavailable_error",
        504 => "timeout_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

fn anthropic_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 => "overloaded_error",
        504 => "timeout_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

/// An error the relay answers itself, before any byte of a backend answer was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable machine-readable code (`queue_full`, `model_not_found`, ...).
    pub code: &'static str,
    /// What went wrong and, where useful, what to do.
    pub message: String,
    /// Sent as `Retry-After` so SDKs back off and retry.
    pub retry_after: Option<Duration>,
    /// A wrong credential was presented (not a missing one): the answer carries
    /// [`WrongCredential`] in its extensions, for the failure limiter around the route.
    pub wrong_credential: bool,
}

/// In a response's extensions: the request presented a wrong credential (admin token, API key,
/// worker secret), which the proxy's one failure limiter counts against its address.
#[derive(Debug, Clone, Copy)]
pub struct WrongCredential;

/// The `code` with which our worker refuses a request beyond its `max_concurrent` (a proxy that
/// over-dispatched, or one that lies): nothing reached the backend.
pub const WORKER_BUSY_CODE: &str = "worker_busy";

/// Codes meaning "this attempt failed before producing any output and may be retried on another
/// attempt" (a managed model process crashed, the worker was full). Our proxy requeues such a
/// request when no byte of it reached the client; an older proxy answers it with a 502 like any
/// other error. They travel as the worker protocol's `error.code`.
const RETRYABLE_CODES: &[&str] = &["model_crashed", WORKER_BUSY_CODE];

/// Whether an error with `code` may be retried elsewhere (see [`ApiError::is_retryable`]).
pub fn is_retryable_code(code: &str) -> bool {
    RETRYABLE_CODES.contains(&code)
}

impl ApiError {
    /// Whether the attempt failed before producing any output, so another attempt (on another
    /// worker) may succeed.
    pub fn is_retryable(&self) -> bool {
        is_retryable_code(self.code)
    }

    /// An error without a retry hint.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after: None,
            wrong_credential: false,
        }
    }

    /// The same error, marked as the refusal of a wrong credential.
    pub fn for_wrong_credential(mut self) -> Self {
        self.wrong_credential = true;
        self
    }

    /// Adds a `Retry-After` hint.
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    /// The response in `dialect`'s shape.
    pub fn into_response(self, dialect: Dialect) -> Response {
        let body = dialect.error_body(self.status, self.code, &self.message);
        let mut response = (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response();
        if let Some(after) = self.retry_after {
            let secs = after.as_secs().max(1);
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from_str(&secs.to_string()).expect("digits are a valid header"),
            );
        }
        if self.wrong_credential {
            response.extensions_mut().insert(WrongCredential);
        }
        response
    }

    /// The same error as a terminal SSE event, for streams already under way.
    pub fn to_sse(&self, dialect: Dialect) -> Bytes {
        dialect.sse_error(self.status, self.code, &self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_failures_before_any_output_are_retryable() {
        let busy = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, WORKER_BUSY_CODE, "full");
        let crashed = ApiError::new(StatusCode::BAD_GATEWAY, "model_crashed", "exit 9");
        let broke_off = ApiError::new(StatusCode::BAD_GATEWAY, "backend_error", "cut");
        assert!(busy.is_retryable() && crashed.is_retryable());
        assert!(!broke_off.is_retryable());
        assert!(is_retryable_code("worker_busy") && !is_retryable_code("cancelled"));
    }

    #[test]
    fn dialect_follows_the_path_including_query_strings() {
        assert_eq!(
            Dialect::for_path("/v1/messages?beta=true"),
            Dialect::Anthropic
        );
        assert_eq!(
            Dialect::for_path("/v1/messages/count_tokens"),
            Dialect::Anthropic
        );
        assert_eq!(Dialect::for_path("/v1/responses"), Dialect::OpenAiResponses);
        assert_eq!(Dialect::for_path("/v1/chat/completions"), Dialect::OpenAi);
    }

    #[test]
    fn openai_error_shape_has_message_type_and_code() {
        let body: serde_json::Value = serde_json::from_str(&Dialect::OpenAi.error_body(
            StatusCode::NOT_FOUND,
            "model_not_found",
            "no provider for model x",
        ))
        .unwrap();
        assert_eq!(body["error"]["code"], "model_not_found");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["message"], "no provider for model x");
    }

    #[test]
    fn anthropic_error_shape_has_type_error_and_typed_error() {
        let body: serde_json::Value = serde_json::from_str(&Dialect::Anthropic.error_body(
            StatusCode::TOO_MANY_REQUESTS,
            "queue_full",
            "busy",
        ))
        .unwrap();
        assert_eq!(body["type"], "error");
        assert_eq!(body["error"]["type"], "rate_limit_error");
        assert_eq!(body["error"]["message"], "busy");
    }

    #[test]
    fn anthropic_stream_error_is_an_error_event() {
        let event = Dialect::Anthropic.sse_error(StatusCode::BAD_GATEWAY, "worker_lost", "gone");
        let text = std::str::from_utf8(&event).unwrap();
        assert!(text.starts_with("event: error\ndata: {"));
        assert!(text.ends_with("\n\n"));
    }

    #[test]
    fn retry_after_header_is_whole_seconds() {
        let response = ApiError::new(StatusCode::TOO_MANY_REQUESTS, "queue_full", "full")
            .retry_after(Duration::from_millis(200))
            .into_response(Dialect::OpenAi);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
    }
}
