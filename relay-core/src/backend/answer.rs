//! Answers built in one place: a backend's answer passed on, or an error answered in the
//! client's dialect instead of the backend (the worker and the model lifecycle use them too).

use axum::http::StatusCode;

use super::{Answer, BackendEvent};
use crate::dialect::{ApiError, Dialect};
use crate::protocol::{TokenCounts, WireHeaders};

/// The final event with everything given.
pub fn complete(
    status: StatusCode,
    headers: WireHeaders,
    body: Option<String>,
    token_counts: Option<TokenCounts>,
) -> BackendEvent {
    BackendEvent::Complete(Box::new(Answer {
        status,
        headers,
        body,
        token_counts,
        timings: None,
        clocked: None,
    }))
}

/// `content-type: application/json`.
pub fn json_headers() -> WireHeaders {
    WireHeaders::from([("content-type".to_string(), "application/json".to_string())])
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

/// A backend's refusal of a prompt longer than its context window, as `(prompt tokens,
/// window)`: llama-server's `exceed_context_size_error` (`n_prompt_tokens`, `n_ctx`, or its
/// message "request (N tokens) exceeds the available context size (M tokens)"), vLLM's "This
/// model's maximum context length is M tokens. However, you requested N tokens".
pub fn context_overflow(status: StatusCode, body: &str) -> Option<(u64, u64)> {
    if status != StatusCode::BAD_REQUEST || !body.contains("context") {
        return None;
    }
    let value: serde_json::Value = serde_json::from_str(body).ok()?;
    let error = value.get("error").unwrap_or(&value);
    let message = error
        .get("message")
        .and_then(serde_json::Value::as_str)
        .unwrap_or_default();
    if error.get("type").and_then(serde_json::Value::as_str) == Some("exceed_context_size_error") {
        let field = |name: &str| error.get(name).and_then(serde_json::Value::as_u64);
        if let (Some(tokens), Some(window)) = (field("n_prompt_tokens"), field("n_ctx")) {
            return Some((tokens, window));
        }
        return Some((
            number_after(message, "request (")?,
            number_after(message, "context size (")?,
        ));
    }
    let window = number_after(message, "maximum context length is ")?;
    let tokens = number_after(message, "you requested ")
        .or_else(|| number_after(message, "resulted in "))?;
    Some((tokens, window))
}

/// The number that follows `marker` in `text`.
fn number_after(text: &str, marker: &str) -> Option<u64> {
    let rest = &text[text.find(marker)? + marker.len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// A backend's whole answer (`body`), passed on as it is — except a refusal of a prompt longer
/// than its context window, which is answered in the client's `dialect` in the words Claude
/// Code compacts on ([`prompt_too_long`]). Every whole answer a worker passes on goes through
/// here, whichever way the request reached the backend.
pub fn passed_on(
    dialect: Dialect,
    status: StatusCode,
    headers: WireHeaders,
    body: String,
    token_counts: Option<TokenCounts>,
) -> BackendEvent {
    match context_overflow(status, &body) {
        Some((tokens, window)) => prompt_too_long(dialect, tokens, window),
        None => complete(status, headers, Some(body), token_counts),
    }
}

/// The client's answer to a prompt longer than the window: Anthropic's wording, which Claude
/// Code answers by compacting the conversation; `context_length_exceeded` for OpenAI clients.
pub fn prompt_too_long(dialect: Dialect, tokens: u64, window: u64) -> BackendEvent {
    let refusal = ApiError::new(
        StatusCode::BAD_REQUEST,
        "context_length_exceeded",
        format!("prompt is too long: {tokens} tokens > {window} maximum"),
    );
    error(dialect, &refusal)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_backends_context_overflow_is_read_in_each_servers_shape() {
        let llama = r#"{"error":{"code":400,"message":"request (13392 tokens) exceeds the available context size (8192 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":13392,"n_ctx":8192}}"#;
        assert_eq!(
            context_overflow(StatusCode::BAD_REQUEST, llama),
            Some((13392, 8192))
        );
        let older = r#"{"error":{"code":400,"message":"request (9412 tokens) exceeds the available context size (8192 tokens), try increasing it","type":"exceed_context_size_error"}}"#;
        assert_eq!(
            context_overflow(StatusCode::BAD_REQUEST, older),
            Some((9412, 8192))
        );
        let vllm = r#"{"object":"error","message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.","type":"BadRequestError","param":null,"code":400}"#;
        assert_eq!(
            context_overflow(StatusCode::BAD_REQUEST, vllm),
            Some((5000, 4096))
        );
        for other in [r#"{"error":{"message":"bad json"}}"#, "not json", ""] {
            assert_eq!(context_overflow(StatusCode::BAD_REQUEST, other), None);
        }
        assert_eq!(
            context_overflow(StatusCode::INTERNAL_SERVER_ERROR, llama),
            None
        );
        let BackendEvent::Complete(answer) = prompt_too_long(Dialect::Anthropic, 13392, 8192)
        else {
            panic!("an answer");
        };
        let body: serde_json::Value = serde_json::from_str(&answer.body.unwrap()).unwrap();
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(
            body["error"]["message"],
            "prompt is too long: 13392 tokens > 8192 maximum"
        );
    }

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
