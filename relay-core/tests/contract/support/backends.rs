//! Backends the tests stand up: a mock whose behaviour each request picks, one that holds
//! requests and changes its models, and a chat-only server like Ollama before 0.14.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing;
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::task::JoinHandle;

use super::*;

/// What the mock backend saw.
#[derive(Debug, Clone)]
pub struct SeenRequest {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Value,
}

#[derive(Default)]
struct MockState {
    models: Vec<String>,
    seen: Mutex<Vec<SeenRequest>>,
    /// Streams whose client (the worker) went away before the end.
    aborted_streams: AtomicUsize,
    /// Stream events handed to the HTTP server so far, over all streams: it takes the next one
    /// only once the last one found room (in its buffers and the socket's), so this stops
    /// growing when the reader stops reading.
    streamed_events: AtomicUsize,
}

/// A fake OpenAI/Anthropic backend. Each request picks its behavior with an optional `mock`
/// object in the body: `status` (answer with this status and an error body), `delay_ms` (before
/// answering), `chunks` (stream this many content chunks), `chunk_delay_ms`, `hang` (stream one
/// chunk then nothing until the client leaves), `chunk_bytes` (pad each content chunk to about
/// this size).
pub struct MockBackend {
    pub addr: SocketAddr,
    state: Arc<MockState>,
    task: JoinHandle<()>,
}

impl MockBackend {
    /// Starts a backend that lists `models`.
    pub async fn start(models: &[&str]) -> MockBackend {
        let state = Arc::new(MockState {
            models: models.iter().map(|m| m.to_string()).collect(),
            ..MockState::default()
        });
        let app = Router::new()
            .route("/v1/models", routing::get(mock_models))
            .route("/v1/chat/completions", routing::post(mock_inference))
            .route("/v1/completions", routing::post(mock_inference))
            .route("/v1/embeddings", routing::post(mock_inference))
            .route("/v1/responses", routing::post(mock_inference))
            .route("/v1/messages", routing::post(mock_inference))
            .route("/v1/messages/count_tokens", routing::post(mock_inference))
            .with_state(state.clone());
        let (addr, task) = serve_app(app, "127.0.0.1:0".parse().expect("address")).await;
        MockBackend { addr, state, task }
    }

    /// Its base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Requests seen so far.
    pub fn seen(&self) -> Vec<SeenRequest> {
        self.state.seen.lock().unwrap().clone()
    }

    /// Streams that ended because the worker closed the connection.
    pub fn aborted_streams(&self) -> usize {
        self.state.aborted_streams.load(Ordering::SeqCst)
    }

    /// Stream events the backend has written (or handed to its HTTP server) so far.
    pub fn streamed_events(&self) -> usize {
        self.state.streamed_events.load(Ordering::SeqCst)
    }
}

impl Drop for MockBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn mock_models(State(state): State<Arc<MockState>>) -> Json<Value> {
    let data: Vec<Value> = state
        .models
        .iter()
        .map(|m| json!({"id": m, "object": "model", "owned_by": "mock"}))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

/// Counts a stream as aborted when dropped before its end.
struct StreamEnd {
    state: Arc<MockState>,
    finished: bool,
}

impl StreamEnd {
    fn mark_finished(&mut self) {
        self.finished = true;
    }
}

impl Drop for StreamEnd {
    fn drop(&mut self) {
        if !self.finished {
            self.state.aborted_streams.fetch_add(1, Ordering::SeqCst);
        }
    }
}

async fn mock_inference(
    State(state): State<Arc<MockState>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    state.seen.lock().unwrap().push(SeenRequest {
        path: uri.to_string(),
        headers,
        body: body.clone(),
    });
    let mock = body.get("mock").cloned().unwrap_or(Value::Null);
    let number = |name: &str| mock.get(name).and_then(Value::as_u64);
    if let Some(delay) = number("delay_ms") {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    if let Some(status) = number("status") {
        let status = StatusCode::from_u16(status as u16).expect("status");
        return (
            status,
            [("content-type", "application/json"), ("x-mock-backend", "error")],
            json!({"error": {"message": "mock backend error", "type": "invalid_request_error", "code": "mock"}}).to_string(),
        )
            .into_response();
    }
    let model = body
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let streaming = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    if !streaming {
        return (
            [("content-type", "application/json"), ("x-mock-backend", "1")],
            json!({
                "id": "chatcmpl-mock",
                "object": "chat.completion",
                "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello from mock"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
            })
            .to_string(),
        )
            .into_response();
    }
    let chunks = number("chunks").unwrap_or(3);
    let chunk_delay = Duration::from_millis(number("chunk_delay_ms").unwrap_or(0));
    let hang = mock.get("hang").and_then(Value::as_bool).unwrap_or(false);
    let padding = " ".repeat(number("chunk_bytes").unwrap_or(0) as usize);
    let stream = async_stream(state, model, chunks, chunk_delay, hang, padding);
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .expect("response")
}

fn async_stream(
    state: Arc<MockState>,
    model: String,
    chunks: u64,
    chunk_delay: Duration,
    hang: bool,
    padding: String,
) -> impl futures_util::Stream<Item = Result<Bytes, std::convert::Infallible>> {
    let end = StreamEnd {
        state,
        finished: false,
    };
    futures_util::stream::unfold((0u64, end), move |(i, mut end)| {
        let model = model.clone();
        let padding = padding.clone();
        async move {
            if hang && i == 1 {
                // Hold the connection open until the worker goes away (drops this stream).
                std::future::pending::<()>().await;
            }
            if i > chunks + 1 {
                end.mark_finished();
                return None;
            }
            if i > 0 && !chunk_delay.is_zero() {
                tokio::time::sleep(chunk_delay).await;
            }
            let text = if i < chunks {
                format!(
                    "data: {}\n\n",
                    json!({"id": "chatcmpl-mock", "model": model, "choices": [{"index": 0, "delta": {"content": format!("tok{i} {padding}")}}]})
                )
            } else if i == chunks {
                format!(
                    "data: {}\n\n",
                    json!({"id": "chatcmpl-mock", "model": model, "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": chunks, "total_tokens": 5 + chunks}})
                )
            } else {
                "data: [DONE]\n\n".to_string()
            };
            end.state.streamed_events.fetch_add(1, Ordering::SeqCst);
            Some((Ok(Bytes::from(text)), (i + 1, end)))
        }
    })
}

/// Splits an SSE body into its `data:` payloads.
pub fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|event| {
            event
                .lines()
                .find_map(|line| line.strip_prefix("data: ").map(str::to_string))
        })
        .collect()
}

// --- helpers added for walkthrough/bad input ---

impl MockBackend {
    /// Starts the mock backend on a given address (to bring a backend that was down back up).
    pub async fn start_at(addr: SocketAddr, models: &[&str]) -> MockBackend {
        let state = Arc::new(MockState {
            models: models.iter().map(|m| m.to_string()).collect(),
            ..MockState::default()
        });
        let app = Router::new()
            .route("/v1/models", routing::get(mock_models))
            .route("/v1/chat/completions", routing::post(mock_inference))
            .route("/v1/messages", routing::post(mock_inference))
            .with_state(state.clone());
        let (addr, task) = serve_app(app, addr).await;
        MockBackend { addr, state, task }
    }
}

#[derive(Default)]
struct ControlledState {
    models: Mutex<Vec<String>>,
    answered: Mutex<Vec<String>>,
    started: AtomicUsize,
    dropped: AtomicUsize,
}

/// A backend whose model list changes at runtime and which can hold a non-streaming request
/// without ever answering (`{"mock": {"hang": true}}`), counting requests whose worker gave up
/// (the handler was dropped before it answered).
pub struct ControlledBackend {
    pub addr: SocketAddr,
    state: Arc<ControlledState>,
    task: JoinHandle<()>,
}

/// Counts a handler dropped before it answered.
struct HandlerEnd {
    state: Arc<ControlledState>,
    finished: bool,
}

impl Drop for HandlerEnd {
    fn drop(&mut self) {
        if !self.finished {
            self.state.dropped.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl ControlledBackend {
    /// Starts a backend listing `models`.
    pub async fn start(models: &[&str]) -> ControlledBackend {
        let state = Arc::new(ControlledState::default());
        *state.models.lock().unwrap() = models.iter().map(|m| m.to_string()).collect();
        let app = Router::new()
            .route("/v1/models", routing::get(controlled_models))
            .route("/v1/chat/completions", routing::post(controlled_inference))
            .with_state(state.clone());
        let (addr, task) = serve_app(app, "127.0.0.1:0".parse().expect("address")).await;
        ControlledBackend { addr, state, task }
    }

    /// Its base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Replaces the listed models.
    pub fn set_models(&self, models: &[&str]) {
        *self.state.models.lock().unwrap() = models.iter().map(|m| m.to_string()).collect();
    }

    /// Models of the requests answered so far, in order.
    pub fn answered(&self) -> Vec<String> {
        self.state.answered.lock().unwrap().clone()
    }

    /// Inference requests received so far.
    pub fn started(&self) -> usize {
        self.state.started.load(Ordering::SeqCst)
    }

    /// Requests whose client (the worker) went away before the answer.
    pub fn dropped(&self) -> usize {
        self.state.dropped.load(Ordering::SeqCst)
    }
}

impl Drop for ControlledBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn controlled_models(State(state): State<Arc<ControlledState>>) -> Json<Value> {
    let data: Vec<Value> = state
        .models
        .lock()
        .unwrap()
        .iter()
        .map(|m| json!({"id": m, "object": "model", "owned_by": "controlled"}))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

async fn controlled_inference(
    State(state): State<Arc<ControlledState>>,
    Json(body): Json<Value>,
) -> Json<Value> {
    state.started.fetch_add(1, Ordering::SeqCst);
    let mut end = HandlerEnd {
        state: state.clone(),
        finished: false,
    };
    if body["mock"]["hang"].as_bool() == Some(true) {
        std::future::pending::<()>().await;
    }
    let model = body["model"].as_str().unwrap_or_default().to_string();
    state.answered.lock().unwrap().push(model.clone());
    end.finished = true;
    Json(json!({
        "id": "chatcmpl-controlled",
        "object": "chat.completion",
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": format!("served {model}")}, "finish_reason": "stop"}]
    }))
}

// --- helpers added for contract modules ---

/// What [`ChatOnlyBackend`] answers with text: `reply to: ` and the last message's text.
pub const CHAT_ONLY_REPLY_PREFIX: &str = "reply to: ";
/// The usage every [`ChatOnlyBackend`] answer reports.
pub const CHAT_ONLY_USAGE: (u64, u64) = (11, 7);

#[derive(Default)]
struct ChatOnlyState {
    models: Vec<String>,
    seen: Mutex<Vec<SeenRequest>>,
}

/// A backend like Ollama before 0.14 or llamafile: `/v1/models` and `/v1/chat/completions`
/// only; every other route is a 404 (`404 page not found`). Answers are deterministic:
///
/// - with `tools` and a last message that is not a tool result: a call of the first tool, each
///   schema property filled with `"mock <name>"` (streamed as id/name, then the arguments in
///   two fragments);
/// - otherwise text: [`CHAT_ONLY_REPLY_PREFIX`] + the last message's text (streamed word by
///   word);
/// - model `broken`: a 503 OpenAI error; model `cut-off`: a stream that stops after its first
///   text chunk, without a finish reason or `[DONE]`.
pub struct ChatOnlyBackend {
    pub addr: SocketAddr,
    state: Arc<ChatOnlyState>,
    task: JoinHandle<()>,
}

impl ChatOnlyBackend {
    /// Starts a backend listing `models`.
    pub async fn start(models: &[&str]) -> ChatOnlyBackend {
        let state = Arc::new(ChatOnlyState {
            models: models.iter().map(|m| m.to_string()).collect(),
            ..ChatOnlyState::default()
        });
        let app = Router::new()
            .route("/v1/models", routing::get(chat_only_models))
            .route("/v1/chat/completions", routing::post(chat_only_chat))
            // The worker asks every backend for its context window now and then (llama-server
            // answers at /props, Ollama at /api/ps); not requests these tests follow.
            .route("/props", routing::get(|| async { StatusCode::NOT_FOUND }))
            .route("/api/ps", routing::get(|| async { StatusCode::NOT_FOUND }))
            .fallback(chat_only_missing)
            .with_state(state.clone());
        let (addr, task) = serve_app(app, "127.0.0.1:0".parse().expect("address")).await;
        ChatOnlyBackend { addr, state, task }
    }

    /// Its base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Requests seen so far, 404s included.
    pub fn seen(&self) -> Vec<SeenRequest> {
        self.state.seen.lock().unwrap().clone()
    }

    /// The paths of the requests seen so far.
    pub fn paths(&self) -> Vec<String> {
        self.seen().into_iter().map(|r| r.path).collect()
    }

    /// The chat-completions bodies seen so far.
    pub fn chat_bodies(&self) -> Vec<Value> {
        self.seen()
            .into_iter()
            .filter(|r| r.path == "/v1/chat/completions")
            .map(|r| r.body)
            .collect()
    }
}

impl Drop for ChatOnlyBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn chat_only_models(State(state): State<Arc<ChatOnlyState>>) -> Json<Value> {
    let data: Vec<Value> = state
        .models
        .iter()
        .map(|m| json!({"id": m, "object": "model", "owned_by": "chat-only"}))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

fn chat_only_record(state: &ChatOnlyState, uri: &Uri, headers: HeaderMap, body: &Bytes) {
    state.seen.lock().unwrap().push(SeenRequest {
        path: uri.to_string(),
        headers,
        body: serde_json::from_slice(body).unwrap_or(Value::Null),
    });
}

async fn chat_only_missing(
    State(state): State<Arc<ChatOnlyState>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    chat_only_record(&state, &uri, headers, &body);
    (
        StatusCode::NOT_FOUND,
        [("content-type", "text/plain")],
        "404 page not found",
    )
        .into_response()
}

/// The text of a chat message's content (a string or a list of text parts).
fn chat_text(content: &Value) -> String {
    match content {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

async fn chat_only_chat(
    State(state): State<Arc<ChatOnlyState>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    chat_only_record(&state, &uri, headers, &body);
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let model = body["model"].as_str().unwrap_or_default().to_string();
    if model == "broken" {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [("content-type", "application/json")],
            json!({"error": {"message": "mock backend is overloaded", "type": "server_error", "code": null}}).to_string(),
        )
            .into_response();
    }
    let last = body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .cloned()
        .unwrap_or(Value::Null);
    let tool = body["tools"]
        .as_array()
        .and_then(|t| t.first())
        .filter(|_| last["role"] != "tool")
        .map(|t| t["function"].clone());
    let (input, output) = CHAT_ONLY_USAGE;
    let usage = json!({"prompt_tokens": input, "completion_tokens": output, "total_tokens": input + output});
    let streaming = body["stream"].as_bool().unwrap_or(false);
    let text = format!("{CHAT_ONLY_REPLY_PREFIX}{}", chat_text(&last["content"]));
    let call = tool.map(|function| {
        let properties = function["parameters"]["properties"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        let arguments: serde_json::Map<String, Value> = properties
            .keys()
            .map(|name| (name.clone(), json!(format!("mock {name}"))))
            .collect();
        (
            function["name"].as_str().unwrap_or("tool").to_string(),
            Value::Object(arguments).to_string(),
        )
    });
    if !streaming {
        let (message, finish) = match &call {
            Some((name, arguments)) => (
                json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_mock_1", "type": "function", "function": {"name": name, "arguments": arguments}}]}),
                "tool_calls",
            ),
            None => (json!({"role": "assistant", "content": text}), "stop"),
        };
        return Json(json!({
            "id": "chatcmpl-chat-only",
            "object": "chat.completion",
            "created": 1,
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": usage,
        }))
        .into_response();
    }
    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({"id": "chatcmpl-chat-only", "object": "chat.completion.chunk", "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
    };
    let mut events = vec![chunk(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
    )];
    match &call {
        Some((name, arguments)) => {
            let half = arguments.len() / 2;
            events.push(chunk(
                json!({"tool_calls": [{"index": 0, "id": "call_mock_1", "type": "function", "function": {"name": name, "arguments": ""}}]}),
                Value::Null,
            ));
            for fragment in [&arguments[..half], &arguments[half..]] {
                events.push(chunk(
                    json!({"tool_calls": [{"index": 0, "function": {"arguments": fragment}}]}),
                    Value::Null,
                ));
            }
            events.push(chunk(json!({}), json!("tool_calls")));
        }
        None => {
            for (i, word) in text.split(' ').enumerate() {
                let piece = if i == 0 {
                    word.to_string()
                } else {
                    format!(" {word}")
                };
                events.push(chunk(json!({"content": piece}), Value::Null));
            }
            events.push(chunk(json!({}), json!("stop")));
        }
    }
    if model == "cut-off" {
        events.truncate(2);
    } else {
        if body["stream_options"]["include_usage"] == true {
            events.push(format!(
                "data: {}\n\n",
                json!({"id": "chatcmpl-chat-only", "object": "chat.completion.chunk", "model": model, "choices": [], "usage": usage})
            ));
        }
        events.push("data: [DONE]\n\n".to_string());
    }
    sse_response(events)
}

/// A `text/event-stream` response sending `events` (whole SSE events) one after another.
pub fn sse_response(events: Vec<String>) -> Response {
    let stream = futures_util::stream::iter(
        events
            .into_iter()
            .map(|e| Ok::<_, std::convert::Infallible>(Bytes::from(e))),
    );
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .expect("response")
}
