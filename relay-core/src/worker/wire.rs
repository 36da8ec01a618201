//! Between the worker protocol and the backend module: a `request` message as a backend request,
//! and a request's backend events as the messages that answer it.

use axum::http::StatusCode;

use crate::backend::{BackendEvent, BackendRequest};
use crate::dialect::ApiError;
use crate::protocol::{
    json_string_len, ErrorMessage, RequestMessage, ResponseChunkMessage, ResponseCompleteMessage,
    WorkerToServer, FRAME_OVERHEAD_BYTES, MAX_FRAME_BYTES,
};

/// The backend request for a `request` message (its id names it in the logs).
pub fn backend_request(request: RequestMessage) -> BackendRequest {
    BackendRequest {
        id: request.request_id,
        path: request.endpoint_path,
        is_streaming: request.is_streaming,
        body: request.body,
        headers: request.headers,
        slot: None,
    }
}

/// The message for `event` of request `request_id`.
///
/// A whole answer that would not fit in a frame once escaped becomes an `error`: the proxy
/// would refuse the oversize frame by closing this worker's connection, and every stream on it.
pub fn message(request_id: &str, event: BackendEvent) -> WorkerToServer {
    match event {
        BackendEvent::Chunk(chunk) => WorkerToServer::ResponseChunk(ResponseChunkMessage {
            request_id: request_id.to_string(),
            chunk,
        }),
        BackendEvent::Complete(answer) => {
            let framed = answer
                .body
                .as_deref()
                .map_or(0, |body| json_string_len(body) + FRAME_OVERHEAD_BYTES);
            if framed > MAX_FRAME_BYTES {
                let message = format!(
                    "the backend's answer ({} bytes) would take {framed} bytes in a frame, \
                     beyond the {MAX_FRAME_BYTES} a proxy accepts",
                    answer.body.as_deref().map_or(0, str::len)
                );
                tracing::warn!(request = %request_id, "{message}");
                let error = ApiError::new(StatusCode::BAD_GATEWAY, "backend_error", message);
                return failure(request_id, error);
            }
            WorkerToServer::ResponseComplete(ResponseCompleteMessage {
                request_id: request_id.to_string(),
                status_code: answer.status.as_u16(),
                headers: answer.headers,
                body: answer.body,
                token_counts: answer.token_counts,
                timings: answer.timings,
            })
        }
        BackendEvent::Failed(failed) => failure(request_id, *failed),
    }
}

/// A request-scoped `error`: its code and message (the wire has no status; the proxy answers
/// 502, or requeues what [`ApiError::is_retryable`] allows).
pub fn failure(request_id: &str, error: ApiError) -> WorkerToServer {
    WorkerToServer::Error(ErrorMessage {
        request_id: Some(request_id.to_string()),
        code: error.code.to_string(),
        message: error.message,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::answer;

    #[test]
    fn events_become_the_messages_of_their_request() {
        let chunk = message("r1", BackendEvent::Chunk("data: {}\n\n".into()));
        assert_eq!(
            chunk.to_json(),
            r#"{"type":"response_chunk","request_id":"r1","chunk":"data: {}\n\n"}"#
        );
        let WorkerToServer::ResponseComplete(complete) =
            message("r1", answer::json(StatusCode::CREATED, "{}".into()))
        else {
            panic!("a response_complete");
        };
        assert_eq!(complete.status_code, 201);
        assert_eq!(complete.body.as_deref(), Some("{}"));
        let WorkerToServer::Error(error) = message(
            "r1",
            BackendEvent::Failed(Box::new(ApiError::new(
                StatusCode::BAD_GATEWAY,
                "backend_error",
                "broke off",
            ))),
        ) else {
            panic!("an error");
        };
        assert_eq!(error.request_id.as_deref(), Some("r1"));
        assert_eq!(error.code, "backend_error");
    }

    #[test]
    fn an_answer_too_large_for_a_frame_once_escaped_is_an_error_instead() {
        // Half the frame in quotes doubles past it once escaped.
        let body = "\"".repeat(MAX_FRAME_BYTES / 2 + 1);
        let event = answer::json(StatusCode::OK, body);
        let WorkerToServer::Error(error) = message("r1", event) else {
            panic!("an error");
        };
        assert_eq!(error.code, "backend_error");
        assert!(error.message.contains("frame"), "{}", error.message);
        let fits = answer::json(StatusCode::OK, "x".repeat(MAX_FRAME_BYTES / 2));
        assert!(matches!(
            message("r1", fits),
            WorkerToServer::ResponseComplete(_)
        ));
    }
}
