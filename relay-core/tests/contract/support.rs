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
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind backend");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("backend serves");
        });
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
