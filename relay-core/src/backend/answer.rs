//! Answers built in one place: a backend's answer passed on, or an error answered in the
//! client's dialect instead of the backend (the worker and the model lifecycle use them too).

use axum::http::StatusCode;

use super::{Answer, BackendEvent};
use crate::dialect::{ApiError, Dialect};
use crate::protocol::{HeaderMap, TokenCounts};

/// The final event with everything given.
pub fn complete(
    status: StatusCode,
    headers: HeaderMap,
    body: Option<String>,
    token_counts: Option<TokenCounts>,
) -> BackendEvent {
    BackendEvent::Complete(Box::new(Answer {
        status,
        headers,
        body,
        token_counts,
    }))
}

/// `content-type: application/json`.
pub fn json_headers() -> HeaderMap {
    HeaderMap::from([("content-type".to_string(), "application/json".to_string())])
}

/// A JSON body answered with `status`.
pub fn json(status: StatusCode, body: String) -> BackendEvent {
    complete(status, json_headers(), Some(body), None)
}

/// `error` as the whole answer, in `dialect`'s shape, with `Retry-After` when it has one.
pub fn error(dialect: Dialect, error: &ApiError) -> BackendEvent {
    let mut headers = json_headers();
    if let Some(after) = error.retry_after {
        headers.insert(
            "retry-after".to_string(),
            after.as_secs().max(1).to_string(),
        );
    }
    let body = dialect.error_body(error.status, error.code, &error.message);
    complete(error.status, headers, Some(body), None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn an_error_answer_has_the_dialects_shape_and_its_retry_hint() {
        let refusal = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "model_failed", "later")
            .retry_after(Duration::from_secs(30));
        let BackendEvent::Complete(answer) = error(Dialect::Anthropic, &refusal) else {
            panic!("a complete answer");
        };
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(answer.headers["retry-after"], "30");
        assert_eq!(answer.headers["content-type"], "application/json");
        let body: serde_json::Value = serde_json::from_str(&answer.body.unwrap()).unwrap();
        assert_eq!(body["type"], "error");
        assert_eq!(body["error"]["message"], "later");
    }
}
