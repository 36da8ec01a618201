//! Test harness: a real proxy on 127.0.0.1:0, a scripted WebSocket worker that speaks the wire
//! protocol by hand (as a worker written only from the seeds would), the real worker daemon, and
//! a mock backend whose behavior each request chooses through a `mock` field in its body.

#![allow(dead_code)]

use std::collections::BTreeMap;
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
use futures_util::{SinkExt, StreamExt};
use relay_core::protocol::{RegisterAck, RegisterMessage, ServerToWorker, WorkerToServer};
use relay_core::proxy::{self, ProxyConfig, RunningProxy};
use relay_core::worker::{self, WorkerConfig};
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// The secret every test proxy uses.
pub const SECRET: &str = "test-secret";
/// Bound on any single wait in a test.
pub const WAIT: Duration = Duration::from_secs(10);

/// A proxy configuration with short timers, suitable for tests.
pub fn test_config() -> ProxyConfig {
    let mut config = ProxyConfig::with_secret(SECRET);
    config.heartbeat_interval = Duration::from_millis(200);
    config.heartbeat_timeout = Duration::from_secs(5);
    config.register_timeout = Duration::from_secs(2);
    config.cancel_grace = Duration::from_millis(500);
    config.drain_timeout = Duration::from_secs(5);
    config
}

/// Starts a proxy with `config` on 127.0.0.1:0.
pub async fn start_proxy(config: ProxyConfig) -> RunningProxy {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
    proxy::start(config, listener).expect("start proxy")
}

/// A plain HTTP client for talking to the proxy as a client would.
pub fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client")
}

/// POSTs JSON `body` to `url` + `path`; returns status, headers and body text.
pub async fn post(base: &str, path: &str, body: &Value) -> (StatusCode, HeaderMap, String) {
    post_raw(base, path, body.to_string(), &[]).await
}

/// POSTs raw `body` with extra headers.
pub async fn post_raw(
    base: &str,
    path: &str,
    body: String,
    headers: &[(&str, &str)],
) -> (StatusCode, HeaderMap, String) {
    let mut request = http()
        .post(format!("{base}{path}"))
        .header("content-type", "application/json")
        .body(body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = tokio::time::timeout(WAIT, request.send())
        .await
        .expect("response in time")
        .expect("request sent");
    let status = response.status();
    let headers = response.headers().clone();
    let text = tokio::time::timeout(WAIT, response.text())
        .await
        .expect("body in time")
        .expect("body");
    (status, headers, text)
}

/// GETs `url` + `path` as JSON.
pub async fn get_json(base: &str, path: &str, headers: &[(&str, &str)]) -> (StatusCode, Value) {
    let mut request = http().get(format!("{base}{path}"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("request sent");
    let status = response.status();
    let body = response.text().await.expect("body");
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// Polls `condition` until it holds (test-only; fails after [`WAIT`]).
pub async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A worker driven message by message from the test.
pub struct ScriptedWorker {
    pub socket: WebSocketStream<MaybeTlsStream<TcpStream>>,
}

/// Why a WebSocket connection attempt failed: the HTTP status the proxy answered.
pub async fn try_connect(
    addr: SocketAddr,
    provider: &str,
    secret: Option<&str>,
    query_secret: Option<&str>,
) -> Result<ScriptedWorker, StatusCode> {
    let mut url = format!("ws://{addr}/v1/worker/connect?provider={provider}");
    if let Some(secret) = query_secret {
        url.push_str(&format!("&secret={secret}"));
    }
    let mut request = url.into_client_request().expect("request");
    if let Some(secret) = secret {
        request
            .headers_mut()
            .insert("x-worker-secret", secret.parse().expect("header"));
    }
    match tokio_tungstenite::connect_async(request).await {
        Ok((socket, _)) => Ok(ScriptedWorker { socket }),
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => Err(response.status()),
        Err(other) => panic!("unexpected connect error: {other}"),
    }
}

impl ScriptedWorker {
    /// Connects to provider `local` with the test secret.
    pub async fn connect(addr: SocketAddr) -> ScriptedWorker {
        try_connect(addr, "local", Some(SECRET), None)
            .await
            .expect("worker connects")
    }

    /// Connects and registers; returns the worker and its ack.
    pub async fn join(
        addr: SocketAddr,
        name: &str,
        models: &[&str],
        max_concurrent: u32,
    ) -> (ScriptedWorker, RegisterAck) {
        let mut worker = ScriptedWorker::connect(addr).await;
        let ack = worker.register(name, models, max_concurrent).await;
        (worker, ack)
    }

    /// Sends `register` with the seeds' protocol version and waits for `register_ack`.
    pub async fn register(
        &mut self,
        name: &str,
        models: &[&str],
        max_concurrent: u32,
    ) -> RegisterAck {
        self.send(&WorkerToServer::Register(RegisterMessage {
            worker_name: name.to_string(),
            models: models.iter().map(|m| m.to_string()).collect(),
            max_concurrent,
            protocol_version: Some("1".to_string()),
            current_load: Some(0),
        }))
        .await;
        match self.recv().await {
            ServerToWorker::RegisterAck(ack) => ack,
            other => panic!("expected register_ack, got {other:?}"),
        }
    }

    /// Sends one protocol message.
    pub async fn send(&mut self, message: &WorkerToServer) {
        self.send_text(&serde_json::to_string(message).expect("serialize"))
            .await;
    }

    /// Sends a raw text frame.
    pub async fn send_text(&mut self, text: &str) {
        self.socket
            .send(Message::Text(text.to_string().into()))
            .await
            .expect("send frame");
    }

    /// The next protocol message, skipping pings (answered with pong, load 0).
    pub async fn recv(&mut self) -> ServerToWorker {
        loop {
            let message = self.recv_any().await;
            if let ServerToWorker::Ping(ping) = &message {
                let pong = WorkerToServer::Pong(relay_core::protocol::PongMessage {
                    current_load: 0,
                    timestamp_unix_ms: ping.timestamp_unix_ms,
                });
                self.send(&pong).await;
                continue;
            }
            return message;
        }
    }

    /// The next protocol message, pings included.
    pub async fn recv_any(&mut self) -> ServerToWorker {
        loop {
            let frame = tokio::time::timeout(WAIT, self.socket.next())
                .await
                .expect("message in time")
                .expect("socket open")
                .expect("frame");
            match frame {
                Message::Text(text) => {
                    return serde_json::from_str(&text).expect("valid server message")
                }
                Message::Close(frame) => panic!("socket closed: {frame:?}"),
                _ => continue,
            }
        }
    }

    /// Waits for the proxy to close the socket; returns the close reason.
    pub async fn closed(&mut self) -> String {
        loop {
            let frame = tokio::time::timeout(WAIT, self.socket.next())
                .await
                .expect("close in time");
            match frame {
                Some(Ok(Message::Close(frame))) => {
                    return frame.map(|f| f.reason.to_string()).unwrap_or_default()
                }
                Some(Ok(_)) => continue,
                Some(Err(_)) | None => return String::new(),
            }
        }
    }

    /// The next `request` message.
    pub async fn next_request(&mut self) -> relay_core::protocol::RequestMessage {
        match self.recv().await {
            ServerToWorker::Request(request) => request,
            other => panic!("expected request, got {other:?}"),
        }
    }

    /// Answers `request_id` with a 200 JSON body.
    pub async fn complete(&mut self, request_id: &str, body: &str) {
        self.send(&WorkerToServer::ResponseComplete(
            relay_core::protocol::ResponseCompleteMessage {
                request_id: request_id.to_string(),
                status_code: 200,
                headers: BTreeMap::from([(
                    "content-type".to_string(),
                    "application/json".to_string(),
                )]),
                body: Some(body.to_string()),
                token_counts: None,
            },
        ))
        .await;
    }

    /// Sends one SSE chunk for `request_id`.
    pub async fn chunk(&mut self, request_id: &str, chunk: &str) {
        self.send(&WorkerToServer::ResponseChunk(
            relay_core::protocol::ResponseChunkMessage {
                request_id: request_id.to_string(),
                chunk: chunk.to_string(),
            },
        ))
        .await;
    }

    /// Drops the connection without a close frame, as a crashed worker would.
    pub fn crash(self) {
        drop(self.socket);
    }
}

/// The real worker daemon, running in this process until dropped or stopped.
pub struct RunningWorker {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl RunningWorker {
    /// Starts a worker joining `proxy` and forwarding to `backend` with `models` (None = ask).
    pub fn start(
        proxy: &RunningProxy,
        backend: &str,
        models: Option<&[&str]>,
        max_concurrent: u32,
    ) -> RunningWorker {
        let mut config = WorkerConfig::new(&proxy.url(), SECRET, backend);
        config.name = "test-worker".to_string();
        config.models = models.map(|m| m.iter().map(|s| s.to_string()).collect());
        config.max_concurrent = max_concurrent;
        config.reconnect_min = Duration::from_millis(100);
        config.reconnect_max = Duration::from_millis(500);
        config.model_refresh_interval = Duration::from_millis(300);
        RunningWorker::start_with(config)
    }

    /// Starts a worker with a full configuration.
    pub fn start_with(config: WorkerConfig) -> RunningWorker {
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(worker::run(config, stopped));
        RunningWorker { stop, task }
    }

    /// Signals shutdown (as SIGTERM does) and waits for the worker to exit.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("worker exits in time")
            .expect("worker task");
    }

    /// Kills the worker task abruptly, as a crash would.
    pub fn kill(self) {
        self.task.abort();
    }
}

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
}

/// A fake OpenAI/Anthropic backend. Each request picks its behavior with an optional `mock`
/// object in the body: `status` (answer with this status and an error body), `delay_ms` (before
/// answering), `chunks` (stream this many content chunks), `chunk_delay_ms`, `hang` (stream one
/// chunk then nothing until the client leaves).
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
    let stream = async_stream(state, model, chunks, chunk_delay, hang);
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
) -> impl futures_util::Stream<Item = Result<Bytes, std::convert::Infallible>> {
    let end = StreamEnd {
        state,
        finished: false,
    };
    futures_util::stream::unfold((0u64, end), move |(i, mut end)| {
        let model = model.clone();
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
                    json!({"id": "chatcmpl-mock", "model": model, "choices": [{"index": 0, "delta": {"content": format!("tok{i} ")}}]})
                )
            } else if i == chunks {
                format!(
                    "data: {}\n\n",
                    json!({"id": "chatcmpl-mock", "model": model, "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": chunks, "total_tokens": 5 + chunks}})
                )
            } else {
                "data: [DONE]\n\n".to_string()
            };
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

impl ScriptedWorker {
    /// The next protocol message within `within`, answering pings with pong (load 0) on the way;
    /// `None` when nothing but pings arrived in time. Panics if the socket closes.
    pub async fn recv_within(&mut self, within: Duration) -> Option<ServerToWorker> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let frame = match tokio::time::timeout_at(deadline, self.socket.next()).await {
                Err(_) => return None,
                Ok(frame) => frame.expect("socket open").expect("frame"),
            };
            let text = match frame {
                Message::Text(text) => text,
                Message::Close(frame) => panic!("socket closed: {frame:?}"),
                _ => continue,
            };
            let message: ServerToWorker =
                serde_json::from_str(&text).expect("valid server message");
            if let ServerToWorker::Ping(ping) = &message {
                let pong = WorkerToServer::Pong(relay_core::protocol::PongMessage {
                    current_load: 0,
                    timestamp_unix_ms: ping.timestamp_unix_ms,
                });
                self.send(&pong).await;
                continue;
            }
            return Some(message);
        }
    }

    /// The next `request`, read without answering pings (a worker whose heartbeat is dead).
    pub async fn next_request_silently(&mut self) -> relay_core::protocol::RequestMessage {
        loop {
            match self.recv_any().await {
                ServerToWorker::Ping(_) => continue,
                ServerToWorker::Request(request) => return request,
                other => panic!("expected request, got {other:?}"),
            }
        }
    }
}

/// Serves a mock backend's `app` on `addr` (port 0 for any free port) until the task is aborted.
pub async fn serve_app(app: Router, addr: SocketAddr) -> (SocketAddr, JoinHandle<()>) {
    let listener = TcpListener::bind(addr).await.expect("bind backend");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.expect("backend serves");
    });
    (addr, task)
}

/// An address on 127.0.0.1 where nothing listens (a backend that is down).
pub async fn dead_addr() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    addr
}

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

/// Shorthand for the request message type the scripted workers receive.
pub type WireRequest = relay_core::protocol::RequestMessage;

impl ScriptedWorker {
    /// Sends a hand-built `register` and returns the proxy's first answer (normally the ack).
    pub async fn register_message(&mut self, register: RegisterMessage) -> RegisterAck {
        self.send(&WorkerToServer::Register(register)).await;
        match self.recv().await {
            ServerToWorker::RegisterAck(ack) => ack,
            other => panic!("expected register_ack, got {other:?}"),
        }
    }

    /// The next non-ping message within `within`, WITHOUT answering pings (so the worker's
    /// reported load is not touched); `None` if nothing else arrived. Panics if the socket closes.
    pub async fn next_message_quietly(&mut self, within: Duration) -> Option<ServerToWorker> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let frame = match tokio::time::timeout_at(deadline, self.socket.next()).await {
                Err(_) => return None,
                Ok(Some(Ok(frame))) => frame,
                Ok(other) => panic!("worker socket ended: {other:?}"),
            };
            match frame {
                Message::Text(text) => {
                    let message: ServerToWorker =
                        serde_json::from_str(&text).expect("valid server message");
                    if !matches!(message, ServerToWorker::Ping(_)) {
                        return Some(message);
                    }
                }
                Message::Close(frame) => panic!("worker socket closed: {frame:?}"),
                _ => {}
            }
        }
    }

    /// Asserts that nothing but pings reaches this worker for `period` (pings are not answered).
    pub async fn assert_nothing_for(&mut self, period: Duration, why: &str) {
        if let Some(message) = self.next_message_quietly(period).await {
            panic!("{why}: expected no message, got {message:?}");
        }
    }

    /// Waits for a `cancel` (skipping pings, which are answered) and returns it.
    pub async fn next_cancel(&mut self) -> relay_core::protocol::CancelMessage {
        match self.recv().await {
            ServerToWorker::Cancel(cancel) => cancel,
            other => panic!("expected cancel, got {other:?}"),
        }
    }

    /// Answers `request_id` with an arbitrary status, headers and body.
    pub async fn complete_with(
        &mut self,
        request_id: &str,
        status_code: u16,
        headers: &[(&str, &str)],
        body: &str,
    ) {
        self.send(&WorkerToServer::ResponseComplete(
            relay_core::protocol::ResponseCompleteMessage {
                request_id: request_id.to_string(),
                status_code,
                headers: headers
                    .iter()
                    .map(|(n, v)| (n.to_string(), v.to_string()))
                    .collect(),
                body: Some(body.to_string()),
                token_counts: None,
            },
        ))
        .await;
    }

    /// Ends a streaming answer with `response_complete` (status 200, no body).
    pub async fn finish_stream(&mut self, request_id: &str) {
        self.send(&WorkerToServer::ResponseComplete(
            relay_core::protocol::ResponseCompleteMessage {
                request_id: request_id.to_string(),
                status_code: 200,
                headers: BTreeMap::from([(
                    "content-type".to_string(),
                    "text/event-stream".to_string(),
                )]),
                body: None,
                token_counts: None,
            },
        ))
        .await;
    }

    /// Sends a worker `error`, scoped to `request_id` when given.
    pub async fn fail(&mut self, request_id: Option<&str>, message: &str) {
        self.send(&WorkerToServer::Error(relay_core::protocol::ErrorMessage {
            request_id: request_id.map(str::to_string),
            code: "backend_unavailable".to_string(),
            message: message.to_string(),
        }))
        .await;
    }
}

/// A `register` message as a worker written from the seeds would send it.
pub fn register_message(
    name: &str,
    models: &[&str],
    max_concurrent: u32,
    protocol_version: Option<&str>,
    current_load: Option<u32>,
) -> RegisterMessage {
    RegisterMessage {
        worker_name: name.to_string(),
        models: models.iter().map(|m| m.to_string()).collect(),
        max_concurrent,
        protocol_version: protocol_version.map(str::to_string),
        current_load,
    }
}

/// Waits for the next `request` on either worker: (0 for `a`, 1 for `b`, the request).
pub async fn next_request_on_either(
    a: &mut ScriptedWorker,
    b: &mut ScriptedWorker,
) -> (usize, WireRequest) {
    tokio::select! {
        request = a.next_request() => (0, request),
        request = b.next_request() => (1, request),
    }
}

/// Runs [`post`] in the background (for requests that wait on a worker).
pub fn spawn_post(
    base: &str,
    path: &str,
    body: Value,
) -> JoinHandle<(StatusCode, HeaderMap, String)> {
    let (base, path) = (base.to_string(), path.to_string());
    tokio::spawn(async move { post(&base, &path, &body).await })
}

/// Awaits a background [`spawn_post`] within [`WAIT`].
pub async fn answer_of(
    task: JoinHandle<(StatusCode, HeaderMap, String)>,
) -> (StatusCode, HeaderMap, String) {
    tokio::time::timeout(WAIT, task)
        .await
        .expect("answer in time")
        .expect("client task")
}

/// An HTTP/1.1 client on a raw TCP socket, so a test controls exactly when it disconnects.
pub struct RawHttpClient {
    stream: TcpStream,
    received: Vec<u8>,
}

impl RawHttpClient {
    /// Connects to `addr` and sends a JSON POST to `path`.
    pub async fn post(addr: SocketAddr, path: &str, body: &Value) -> RawHttpClient {
        use tokio::io::AsyncWriteExt;
        let body = body.to_string();
        let mut stream = TcpStream::connect(addr).await.expect("connect to proxy");
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await.expect("write head");
        stream.write_all(body.as_bytes()).await.expect("write body");
        RawHttpClient {
            stream,
            received: Vec::new(),
        }
    }

    /// Reads until the bytes received so far contain `needle`; returns them as text.
    pub async fn read_until(&mut self, needle: &str) -> String {
        use tokio::io::AsyncReadExt;
        let deadline = tokio::time::Instant::now() + WAIT;
        while !String::from_utf8_lossy(&self.received).contains(needle) {
            let mut buf = [0u8; 4096];
            let n = tokio::time::timeout_at(deadline, self.stream.read(&mut buf))
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "timed out waiting for {needle:?}; got {:?}",
                        String::from_utf8_lossy(&self.received)
                    )
                })
                .expect("read");
            assert!(
                n > 0,
                "connection closed before {needle:?}; got {:?}",
                String::from_utf8_lossy(&self.received)
            );
            self.received.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&self.received).into_owned()
    }

    /// Closes the connection, as a client that gives up would.
    pub fn disconnect(self) {
        drop(self.stream);
    }
}

// --- protocol adapter (issue 3): a backend that speaks only OpenAI chat completions ---

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
