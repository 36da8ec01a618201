//! Workers driven by the tests: one speaking the wire protocol by hand, as a worker written only
//! from the seeds would, and the real worker daemon in this process.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use axum::http::StatusCode;
use futures_util::{SinkExt, StreamExt};
use relay_core::protocol::{RegisterAck, RegisterMessage, ServerToWorker, WorkerToServer};
use relay_core::proxy::RunningProxy;
use relay_core::worker::{self, WorkerConfig};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use super::*;

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
            warm_ups: None,
            sides_first: None,
            worker_name: name.to_string(),
            models: models.iter().map(|m| m.to_string()).collect(),
            max_concurrent,
            protocol_version: Some("1".to_string()),
            current_load: Some(0),
            mac_address: None,
            sleeps_when_idle: None,
            context_windows: None,
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
        // Pings keep coming while nothing else does: bound the whole wait, not each message.
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let message = tokio::time::timeout_at(deadline, self.recv_any())
                .await
                .expect("a message other than ping in time");
            if let ServerToWorker::Ping(ping) = &message {
                let pong = WorkerToServer::Pong(relay_core::protocol::PongMessage {
                    current_load: 0,
                    timestamp_unix_ms: ping.timestamp_unix_ms,
                    hardware: None,
                    model_states: None,
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
        self.answer(request_id, body, None).await;
    }

    /// Answers `request_id` with a 200 JSON body and the timings llama-server would report for
    /// 1,000 prompt tokens evaluated at `prompt_tps` (what the proxy learns a box's speed from).
    pub async fn complete_timed(&mut self, request_id: &str, prompt_tps: f64) {
        let timings = relay_core::protocol::Timings {
            prompt_tokens: 1000,
            prompt_ms: 1000.0 * 1000.0 / prompt_tps,
            cached_tokens: None,
            generated_tokens: 10,
            generation_ms: 100.0,
        };
        self.answer(request_id, r#"{"ok":true}"#, Some(timings))
            .await;
    }

    async fn answer(
        &mut self,
        request_id: &str,
        body: &str,
        timings: Option<relay_core::protocol::Timings>,
    ) {
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
                timings,
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
        let task = tokio::spawn(worker::run(config, Default::default(), stopped));
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
                    hardware: None,
                    model_states: None,
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
                timings: None,
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
                timings: None,
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
        warm_ups: None,
        sides_first: None,
        worker_name: name.to_string(),
        models: models.iter().map(|m| m.to_string()).collect(),
        max_concurrent,
        protocol_version: protocol_version.map(str::to_string),
        current_load,
        mac_address: None,
        sleeps_when_idle: None,
        context_windows: None,
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
