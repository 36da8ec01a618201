//! One request for a model of the model map: a lease on its server (started first when needed,
//! with SSE keep-alive comments to a streaming client while it starts), the forward to that
//! server raced against the end of its process, and lifecycle failures as clean answers.
//!
//! The lease lives in the request's task, so the task's end (or its abort on cancel) releases it.

use std::time::Duration;

use axum::http::StatusCode;
use tokio::sync::mpsc;
use tokio::time::{interval_at, timeout, Instant};

use super::BackendAccess;
use crate::backend::{answer, BackendEvent, Events};
use crate::dialect::{ApiError, Dialect};
use crate::lifecycle::{Lease, LifecycleError, LifecycleManager};
use crate::protocol::{RequestMessage, WireHeaders};

/// How often a streaming client waiting for a model start gets an SSE comment. The first comes
/// after one period, so a quick start or a quick failure still answers with a plain status (and a
/// request that sent no byte can still be requeued by the proxy).
pub const LOADING_COMMENT_EVERY: Duration = Duration::from_secs(2);

/// How long a failed forward waits for its process's end to be reported: "crashed (exit code
/// 3)" tells the client more than "connection reset".
const CRASH_REPORT_GRACE: Duration = Duration::from_secs(2);

/// Serves `request` for a mapped model through `manager`, reporting through `events`.
pub async fn serve(
    manager: LifecycleManager,
    access: BackendAccess,
    request: RequestMessage,
    events: Events,
) {
    let session = manager.config().session_id(
        request
            .headers
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str())),
    );
    let mut reply = Reply {
        request_id: request.request_id.clone(),
        model: request.model.clone(),
        dialect: Dialect::for_path(&request.endpoint_path),
        events,
        streaming: false,
    };
    let acquired = acquire(&manager, &request, session.as_deref(), &mut reply).await;
    match acquired {
        Ok(lease) => relay(lease, &access, request, &mut reply).await,
        Err(error) => reply.lifecycle_error(&error).await,
    }
}

/// A lease on the request's model; a streaming request gets `: loading model NAME` comments
/// while it waits.
async fn acquire(
    manager: &LifecycleManager,
    request: &RequestMessage,
    session: Option<&str>,
    reply: &mut Reply,
) -> Result<Lease, LifecycleError> {
    let acquiring = manager.acquire(&request.model, session);
    if !request.is_streaming {
        return acquiring.await;
    }
    tokio::pin!(acquiring);
    let start = Instant::now() + LOADING_COMMENT_EVERY;
    let mut ticks = interval_at(start, LOADING_COMMENT_EVERY);
    let comment = format!(": loading model {}\n\n", one_line(&request.model));
    loop {
        tokio::select! {
            biased;
            acquired = &mut acquiring => return acquired,
            _ = ticks.tick() => reply.chunk(comment.clone()).await,
        }
    }
}

/// Forwards to the lease's server until the answer is complete or the process ends.
async fn relay(
    mut lease: Lease,
    access: &BackendAccess,
    request: RequestMessage,
    reply: &mut Reply,
) {
    // The forward reports into a channel of its own, so its events can be held back when the
    // process turns out to have died under it.
    let (tx, mut rx) = mpsc::channel(16);
    let backend = access.backend(lease.base_url());
    // The slot, like the lease, is held until this request's task ends.
    let (forwarded, _slot) = access.request_for(lease.base_url(), request).await;
    let forwarding = backend.serve(forwarded, tx);
    tokio::pin!(forwarding);
    let mut forwarded = false;
    loop {
        // What the forward already reported goes first: an answer that arrived just before the
        // process died is still the answer.
        tokio::select! {
            biased;
            event = rx.recv() => match event {
                Some(event) => {
                    if is_failure(&event) {
                        if let Ok(ended) = timeout(CRASH_REPORT_GRACE, lease.ended()).await {
                            return reply.process_ended(&ended).await;
                        }
                    }
                    reply.pass(event).await;
                }
                None => return,
            },
            ended = lease.ended() => return reply.process_ended(&ended).await,
            () = &mut forwarding, if !forwarded => forwarded = true,
        }
    }
}

/// A forward's final event that says the server failed (rather than answered).
fn is_failure(event: &BackendEvent) -> bool {
    match event {
        BackendEvent::Failed(_) => true,
        BackendEvent::Complete(answer) => answer.status == StatusCode::BAD_GATEWAY,
        BackendEvent::Chunk(_) => false,
    }
}

/// The request's way back to the connection loop.
struct Reply {
    request_id: String,
    model: String,
    dialect: Dialect,
    events: Events,
    /// Keep-alive comments went out: the proxy answers with an SSE stream now, so a failure
    /// must be an SSE error event rather than a status.
    streaming: bool,
}

impl Reply {
    async fn send(&self, event: BackendEvent) {
        let _ = self.events.send(event).await;
    }

    async fn chunk(&mut self, text: String) {
        self.streaming = true;
        self.send(BackendEvent::Chunk(text)).await;
    }

    /// A forward's event; after keep-alives a final whole-body answer becomes stream events.
    async fn pass(&mut self, event: BackendEvent) {
        let events = if self.streaming {
            as_stream(event, self.dialect)
        } else {
            vec![event]
        };
        for event in events {
            self.send(event).await;
        }
    }

    /// The model could not be leased: its status and a short message in the dialect's shape;
    /// the whole story (command, process output) goes to the log.
    async fn lifecycle_error(&mut self, error: &LifecycleError) {
        tracing::warn!(request = %self.request_id, model = %self.model, "{error}");
        for event in lifecycle_answer(self.dialect, error, self.streaming) {
            self.send(event).await;
        }
    }

    /// The process ended under the request: an `error` for it (an SSE error event if the client
    /// already got bytes; a failed request the proxy can tell apart otherwise).
    async fn process_ended(&mut self, error: &LifecycleError) {
        tracing::warn!(request = %self.request_id, model = %self.model, "request failed: {error}");
        let failed = ApiError::new(lifecycle_status(error), error.code(), short_message(error));
        self.send(BackendEvent::Failed(Box::new(failed))).await;
    }
}

/// The first line of a lifecycle error (the rest is the command and the process's output),
/// with a pointer to the log when something was left out.
fn short_message(error: &LifecycleError) -> String {
    let full = error.to_string();
    let mut lines = full.lines();
    let first = lines.next().unwrap_or_default().to_string();
    if lines.next().is_some() {
        format!("{first} (the worker's log has the details)")
    } else {
        first
    }
}

/// The HTTP status of a lifecycle error.
fn lifecycle_status(error: &LifecycleError) -> StatusCode {
    StatusCode::from_u16(error.status_code()).unwrap_or(StatusCode::BAD_GATEWAY)
}

/// The answer to a request whose model could not be leased.
fn lifecycle_answer(
    dialect: Dialect,
    error: &LifecycleError,
    streaming: bool,
) -> Vec<BackendEvent> {
    let status = lifecycle_status(error);
    let mut refusal = ApiError::new(status, error.code(), short_message(error));
    if let LifecycleError::BreakerOpen { retry_in, .. } = error {
        refusal = refusal.retry_after(*retry_in);
    }
    if !streaming {
        return vec![answer::error(dialect, &refusal)];
    }
    let mut headers = WireHeaders::new();
    if let Some(after) = refusal.retry_after {
        headers.insert(
            "retry-after".to_string(),
            after.as_secs().max(1).to_string(),
        );
    }
    let event = refusal.to_sse(dialect);
    vec![
        BackendEvent::Chunk(String::from_utf8_lossy(&event).into_owned()),
        answer::complete(status, headers, None, None),
    ]
}

/// A forward's message for a client that already gets an SSE stream (keep-alives went out): a
/// whole-body answer would be lost at the proxy, which ends a stream at `response_complete`, so
/// an error body becomes an error event and any other body a data event.
fn as_stream(event: BackendEvent, dialect: Dialect) -> Vec<BackendEvent> {
    let BackendEvent::Complete(mut complete) = event else {
        return vec![event];
    };
    let Some(body) = complete.body.take().filter(|b| !b.is_empty()) else {
        return vec![BackendEvent::Complete(complete)];
    };
    let status = complete.status;
    let event = if status.is_success() {
        format!("data: {}\n\n", one_line(&body))
    } else {
        let message = error_message_of(&body);
        String::from_utf8_lossy(&dialect.sse_error(status, "backend_error", &message)).into_owned()
    };
    vec![BackendEvent::Chunk(event), BackendEvent::Complete(complete)]
}

/// The message of an error body (`{"error":{"message"}}`, `{"error":"..."}`), or its text.
fn error_message_of(body: &str) -> String {
    let parsed: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    let error = &parsed["error"];
    error["message"]
        .as_str()
        .or_else(|| error.as_str())
        .map(str::to_string)
        .unwrap_or_else(|| body.chars().take(500).collect())
}

/// `text` without line breaks, so it cannot end an SSE line early.
fn one_line(text: &str) -> String {
    text.replace(['\r', '\n'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Answer;

    fn complete(status: u16, headers: WireHeaders, body: Option<String>) -> BackendEvent {
        answer::complete(StatusCode::from_u16(status).unwrap(), headers, body, None)
    }

    fn start_failed() -> LifecycleError {
        LifecycleError::StartFailed {
            model: "m".into(),
            command: "llama-server --port 8081".into(),
            reason: "it exited during startup (exit code 1)".into(),
            output: vec!["error: out of memory".into()],
        }
    }

    fn completion(event: &BackendEvent) -> &Answer {
        match event {
            BackendEvent::Complete(complete) => complete,
            other => panic!("expected an answer, got {other:?}"),
        }
    }

    fn chunk_text(event: &BackendEvent) -> &str {
        match event {
            BackendEvent::Chunk(chunk) => chunk,
            other => panic!("expected a chunk, got {other:?}"),
        }
    }

    #[test]
    fn a_lifecycle_error_answers_with_its_status_and_a_short_dialect_shaped_message() {
        let answer = lifecycle_answer(Dialect::Anthropic, &start_failed(), false);
        assert_eq!(answer.len(), 1);
        let complete = completion(&answer[0]);
        assert_eq!(complete.status, StatusCode::BAD_GATEWAY);
        let body: serde_json::Value =
            serde_json::from_str(complete.body.as_deref().unwrap()).unwrap();
        assert_eq!(body["type"], "error");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.starts_with("model \"m\" failed to start: it exited during startup"));
        assert!(
            message.ends_with("(the worker's log has the details)"),
            "{message}"
        );
        assert!(
            !message.contains("out of memory"),
            "the output stays in the log"
        );

        let open = LifecycleError::BreakerOpen {
            model: "m".into(),
            retry_in: Duration::from_secs(42),
            last_error: start_failed().to_string(),
        };
        let answer = lifecycle_answer(Dialect::OpenAi, &open, false);
        let complete = completion(&answer[0]);
        assert_eq!(complete.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(complete.headers["retry-after"], "42");
        let body: serde_json::Value =
            serde_json::from_str(complete.body.as_deref().unwrap()).unwrap();
        assert_eq!(body["error"]["code"], "model_failed");
    }

    #[test]
    fn after_keep_alives_a_lifecycle_error_is_an_sse_error_event() {
        let answer = lifecycle_answer(Dialect::OpenAi, &start_failed(), true);
        assert_eq!(answer.len(), 2);
        let event = chunk_text(&answer[0]);
        assert!(event.starts_with("data: {\"error\""), "{event}");
        assert!(event.contains("model_start_failed"));
        assert!(event.ends_with("\n\n"));
        assert_eq!(completion(&answer[1]).body, None);
    }

    #[test]
    fn after_keep_alives_a_whole_body_answer_becomes_stream_events() {
        let failed = complete(
            400,
            WireHeaders::new(),
            Some(r#"{"error":{"code":400,"message":"bad\nrequest"}}"#.into()),
        );
        let events = as_stream(failed, Dialect::Anthropic);
        let event = chunk_text(&events[0]);
        assert!(event.starts_with("event: error\ndata: "), "{event}");
        assert!(event.contains("bad\\nrequest"));
        assert_eq!(completion(&events[1]).body, None);

        let answered = complete(200, WireHeaders::new(), Some("{\"a\":\n1}".into()));
        let events = as_stream(answered, Dialect::OpenAi);
        assert_eq!(chunk_text(&events[0]), "data: {\"a\": 1}\n\n");

        let streamed = complete(200, WireHeaders::new(), None);
        assert_eq!(as_stream(streamed, Dialect::OpenAi).len(), 1);
    }

    #[test]
    fn a_forward_failure_is_told_apart_from_an_answer() {
        assert!(is_failure(&complete(502, WireHeaders::new(), None)));
        assert!(!is_failure(&complete(500, WireHeaders::new(), None)));
        assert!(is_failure(&BackendEvent::Failed(Box::new(ApiError::new(
            StatusCode::BAD_GATEWAY,
            "backend_error",
            "broke off"
        )))));
    }
}
