//! The mock backend's native Anthropic Messages and OpenAI Responses routes (`--backend
//! --native`), for the `adapter` scenario's pass-through side: the same client against a backend
//! that serves the route itself, so the worker forwards the request untouched. Without
//! `--native` the backend serves chat completions only and the worker's adapter translates.
//!
//! A streamed answer has as many delta events as the request's output limit (`max_tokens`,
//! `max_output_tokens`), like the chat-only backend, with the opening and closing events a real
//! server sends, so both sides carry the same number of events.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use serde_json::Value;

const MESSAGE: &str = "{\"id\":\"msg_bench\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"bench\",\"content\":[{\"type\":\"text\",\"text\":\"hello\"}],\"stop_reason\":\"end_turn\",\"stop_sequence\":null,\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}";
const MESSAGE_HEAD: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_bench\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"bench\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":5,\"output_tokens\":0}}}\n\nevent: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n";
const MESSAGE_DELTA: &str = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"tok \"}}\n\n";
const MESSAGE_TAIL: &str = "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":200}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

const RESPONSE: &str = "{\"id\":\"resp_bench\",\"object\":\"response\",\"status\":\"completed\",\"model\":\"bench\",\"output\":[{\"type\":\"message\",\"id\":\"msg_bench\",\"status\":\"completed\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"hello\",\"annotations\":[]}]}],\"usage\":{\"input_tokens\":5,\"output_tokens\":1,\"total_tokens\":6}}";
const RESPONSE_HEAD: &str = "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_bench\",\"object\":\"response\",\"status\":\"in_progress\",\"model\":\"bench\",\"output\":[]}}\n\nevent: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"output_index\":0,\"item\":{\"type\":\"message\",\"id\":\"msg_bench\",\"status\":\"in_progress\",\"role\":\"assistant\",\"content\":[]}}\n\n";
const RESPONSE_DELTA: &str = "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"item_id\":\"msg_bench\",\"output_index\":0,\"content_index\":0,\"delta\":\"tok \"}\n\n";
const RESPONSE_TAIL: &str = "event: response.output_text.done\ndata: {\"type\":\"response.output_text.done\",\"item_id\":\"msg_bench\",\"output_index\":0,\"content_index\":0,\"text\":\"\"}\n\nevent: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_bench\",\"object\":\"response\",\"status\":\"completed\",\"model\":\"bench\",\"output\":[]}}\n\n";

/// `router` with the native routes added.
pub fn routes(router: Router) -> Router {
    router
        .route("/v1/messages", post(messages))
        .route("/v1/responses", post(responses))
}

/// One SSE answer: `head`, `deltas` copies of `delta`, `tail`.
fn stream(head: &'static str, delta: &'static str, deltas: u64, tail: &'static str) -> Response {
    let events = futures_util::stream::iter((0..deltas + 2).map(move |i| {
        let event = match i {
            0 => head,
            i if i <= deltas => delta,
            _ => tail,
        };
        Ok::<_, Infallible>(Bytes::from_static(event.as_bytes()))
    }));
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(events))
        .expect("response")
}

fn unary(body: &'static str) -> Response {
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from(body))
        .expect("response")
}

/// Whether the request streams, and its output limit.
fn shape(body: &Bytes, limit: &str) -> (bool, u64) {
    let request: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let streams = request.get("stream").and_then(Value::as_bool) == Some(true);
    let limit = request.get(limit).and_then(Value::as_u64).unwrap_or(1);
    (streams, limit.max(1))
}

async fn messages(body: Bytes) -> Response {
    match shape(&body, "max_tokens") {
        (true, deltas) => stream(MESSAGE_HEAD, MESSAGE_DELTA, deltas, MESSAGE_TAIL),
        (false, _) => unary(MESSAGE),
    }
}

async fn responses(body: Bytes) -> Response {
    match shape(&body, "max_output_tokens") {
        (true, deltas) => stream(RESPONSE_HEAD, RESPONSE_DELTA, deltas, RESPONSE_TAIL),
        (false, _) => unary(RESPONSE),
    }
}
