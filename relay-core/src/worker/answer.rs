//! The worker's final messages for a request, built in one place: a backend's answer passed on,
//! or an error the worker answers itself in the client's dialect.

use axum::http::StatusCode;

use crate::dialect::{ApiError, Dialect};
use crate::protocol::{HeaderMap, ResponseCompleteMessage, TokenCounts, WorkerToServer};

/// A `response_complete` with everything given.
pub fn complete(
    request_id: &str,
    status: StatusCode,
    headers: HeaderMap,
    body: Option<String>,
    token_counts: Option<TokenCounts>,
) -> WorkerToServer {
    WorkerToServer::ResponseComplete(ResponseCompleteMessage {
        request_id: request_id.to_string(),
        status_code: status.as_u16(),
        headers,
        body,
        token_counts,
    })
}

/// `content-type: application/json`.
pub fn json_headers() -> HeaderMap {
    HeaderMap::from([("content-type".to_string(), "application/json".to_string())])
}

/// A JSON body answered with `status`.
pub fn json(request_id: &str, status: StatusCode, body: String) -> WorkerToServer {
    complete(request_id, status, json_headers(), Some(body), None)
}

/// `error` as the whole answer, in `dialect`'s shape, with `Retry-After` when it has one.
pub fn error(request_id: &str, dialect: Dialect, error: &ApiError) -> WorkerToServer {
    let mut headers = json_headers();
    if let Some(after) = error.retry_after {
        headers.insert(
            "retry-after".to_string(),
            after.as_secs().max(1).to_string(),
        );
    }
    let body = dialect.error_body(error.status, error.code, &error.message);
    complete(request_id, error.status, headers, Some(body), None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn an_error_answer_has_the_dialects_shape_and_its_retry_hint() {
        let refusal = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "model_failed", "later")
            .retry_after(Duration::from_secs(30));
        let WorkerToServer::ResponseComplete(answer) = error("r-1", Dialect::Anthropic, &refusal)
        else {
            panic!("a response_complete");
        };
        assert_eq!(answer.status_code, 503);
        assert_eq!(answer.headers["retry-after"], "30");
        assert_eq!(answer.headers["content-type"], "application/json");
        let body: serde_json::Value = serde_json::from_str(&answer.body.unwrap()).unwrap();
        assert_eq!(body["type"], "error");
        assert_eq!(body["error"]["message"], "later");
    }
}
