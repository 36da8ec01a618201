//! The benchmark's mock backend: as fast as a server can be, so the figures measure the relay.
//! It runs in its own process (the bench binary re-executed with `--backend`), so its sockets and
//! CPU are not counted against the load generator's or the relay's.
//!
//! Each request picks its answer with an optional `bench` object: `chunks` (stream this many
//! content events; without it, a stream has as many events as the request's `max_tokens`, which
//! is what a translated Anthropic or Responses request carries) and `interval_ms` (between
//! events). With `--native` it also serves `/v1/messages` and `/v1/responses` itself
//! (see `native_backend.rs`).

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use serde_json::Value;

/// One small content event, close in size to a real token event.
const CHUNK: &str = "data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok \"}}]}\n\n";
const DONE: &str = "data: [DONE]\n\n";
const UNARY: &str = "{\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion\",\"model\":\"bench\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"hello\"},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1,\"total_tokens\":6}}";

/// Serves until killed; prints `BACKEND <port>` once listening.
pub async fn serve(native: bool) {
    let mut app = Router::new()
        .route("/v1/chat/completions", post(answer))
        .route("/v1/models", axum::routing::get(models));
    if native {
        app = crate::native_backend::routes(app);
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind backend");
    println!("BACKEND {}", listener.local_addr().expect("addr").port());
    axum::serve(listener, app).await.expect("backend serves");
}

async fn models() -> &'static str {
    "{\"object\":\"list\",\"data\":[{\"id\":\"bench\",\"object\":\"model\",\"owned_by\":\"bench\"}]}"
}

async fn answer(body: Bytes) -> Response {
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    if request.get("stream").and_then(Value::as_bool) != Some(true) {
        return Response::builder()
            .header("content-type", "application/json")
            .body(Body::from(UNARY))
            .expect("response");
    }
    let bench = request.get("bench");
    let setting = |name: &str| {
        bench
            .and_then(|b| b.get(name))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    let chunks = match setting("chunks") {
        0 => request
            .get("max_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(1),
        n => n,
    }
    .max(1);
    let interval = Duration::from_millis(setting("interval_ms"));
    let events = futures_util::stream::unfold(0u64, move |sent| async move {
        if sent > chunks {
            return None;
        }
        if sent > 0 && !interval.is_zero() {
            tokio::time::sleep(interval).await;
        }
        let event = if sent < chunks { CHUNK } else { DONE };
        Some((
            Ok::<_, Infallible>(Bytes::from_static(event.as_bytes())),
            sent + 1,
        ))
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(events))
        .expect("response")
}
