//! One task per worker connection: the `register` handshake, then a loop that routes the worker's
//! chunks and completions to waiting clients, writes dispatched requests and control frames, and
//! runs the heartbeat. Chunks are routed through a map local to this task, so the streaming hot
//! path takes no shared lock.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket};
use axum::http::StatusCode;
use bytes::Bytes;
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio::time::{interval_at, timeout, Instant, MissedTickBehavior};

use crate::dialect::{is_retryable_code, ApiError, WORKER_BUSY_CODE};
use crate::protocol::{
    is_accepted_protocol_version, CancelReason, ErrorMessage, PingMessage, RegisterMessage,
    ResponseChunkMessage, ResponseCompleteMessage, ServerToWorker, WorkerToServer,
    ACCEPTED_PROTOCOL_VERSIONS, CANCELLED_CODE,
};
use crate::proxy::dispatch::hub::{
    Departure, EventSender, Hub, Outbound, ResponseEvent, WaitingBytes,
};
use crate::proxy::dispatch::scheduler::{
    parse_request_wire_id, worker_wire_id, RegisterError, RequestId, WorkerId,
};
use crate::proxy::dispatch::stream_pause::StreamPauses;
use crate::proxy::dispatch::telemetry::unix_ms;

/// WebSocket close code for a protocol violation (RFC 6455).
const CLOSE_PROTOCOL_ERROR: u16 = 1002;
/// WebSocket close code for a policy refusal (RFC 6455).
const CLOSE_POLICY: u16 = 1008;
/// WebSocket close code for a normal close (RFC 6455).
const CLOSE_NORMAL: u16 = 1000;

/// Limits and timers of a worker connection.
#[derive(Debug, Clone)]
pub struct SocketSettings {
    /// How often to ping.
    pub heartbeat_interval: Duration,
    /// Close a worker not heard from for this long.
    pub heartbeat_timeout: Duration,
    /// How long a new connection may take to send `register`.
    pub register_timeout: Duration,
    /// A streaming answer larger than this is ended with an SSE error.
    pub max_stream_bytes: u64,
    /// A stream whose unread bytes exceed this is ended with an SSE error (the client is too
    /// slow).
    pub max_buffered_stream_bytes: usize,
    /// A write to the worker (requests, pings) that cannot complete within this means the worker
    /// stopped reading: the connection is closed and its requests requeued or failed, instead of
    /// the connection's task waiting inside the write while requests keep being sent to it.
    pub write_timeout: Duration,
}

/// How long the close frame may take to go out: a worker that stopped reading never takes it.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

/// The close reason of a worker that went silent (also how its departure is recognised: a
/// box that suspends without a word looks like this).
const HEARTBEAT_LOST: &str = "worker heartbeat timed out";

/// How often paused streams are checked for clients that caught up (only while any is paused).
const RESUME_CHECK: Duration = Duration::from_millis(20);

/// Where one dispatched request's answer goes.
struct Route {
    events: EventSender,
    /// Stream bytes in `events` the client's side has not taken yet.
    waiting: WaitingBytes,
    started: bool,
    bytes: u64,
}

type Sink = SplitSink<WebSocket, Message>;

/// Runs a worker connection from the first frame to the last.
pub async fn serve_worker(
    socket: WebSocket,
    hub: Arc<Hub>,
    provider: String,
    settings: SocketSettings,
    peer: IpAddr,
) {
    let (mut sink, mut stream) = socket.split();
    let register = match timeout(settings.register_timeout, read_register(&mut stream)).await {
        Ok(Ok(register)) => register,
        Ok(Err(reason)) => {
            tracing::warn!(provider, "worker rejected: {reason}");
            close(&mut sink, CLOSE_PROTOCOL_ERROR, &reason).await;
            return;
        }
        Err(_) => {
            let reason = "no register message within the registration timeout";
            tracing::warn!(provider, "worker rejected: {reason}");
            close(&mut sink, CLOSE_PROTOCOL_ERROR, reason).await;
            return;
        }
    };
    let version = register.protocol_version.as_deref();
    if !is_accepted_protocol_version(version) {
        let reason = format!(
            "protocol error: unsupported protocol_version {:?}; this proxy accepts {} or none",
            version.unwrap_or_default(),
            ACCEPTED_PROTOCOL_VERSIONS.join(", ")
        );
        tracing::warn!(provider, worker_name = %register.worker_name, "worker rejected: {reason}");
        close(&mut sink, CLOSE_PROTOCOL_ERROR, &reason).await;
        return;
    }
    let joined = match hub.register_worker(&provider, &register, peer) {
        Ok(joined) => joined,
        Err(error) => {
            let reason = match error {
                RegisterError::UnknownProvider => format!("unknown provider {provider}"),
                RegisterError::ProviderDisabled => "Provider is currently disabled".to_string(),
                RegisterError::ShuttingDown => "the proxy is shutting down".to_string(),
                RegisterError::Drained => {
                    "this worker was drained by an admin; it may rejoin after the proxy restarts"
                        .to_string()
                }
            };
            close(&mut sink, CLOSE_POLICY, &reason).await;
            return;
        }
    };
    tracing::info!(
        worker = %joined.ack.worker_id,
        name = %register.worker_name,
        provider,
        models = ?joined.ack.models,
        max_concurrent = register.max_concurrent,
        "worker registered"
    );
    for warning in &joined.ack.warnings {
        tracing::warn!(worker = %joined.ack.worker_id, "registration: {warning}");
    }
    hub.telemetry().worker_joined(&joined.ack.worker_id, peer);
    let ack = ServerToWorker::RegisterAck(joined.ack).to_json();
    let sent = timeout(settings.write_timeout, sink.send(Message::Text(ack.into()))).await;
    if !matches!(sent, Ok(Ok(()))) {
        hub.worker_gone(joined.worker);
        return;
    }
    let mut connection = Connection {
        hub: Arc::clone(&hub),
        worker: joined.worker,
        name: Arc::from(hub.worker_name(joined.worker).unwrap_or_default()),
        routes: HashMap::new(),
        pauses: StreamPauses::new(settings.max_buffered_stream_bytes),
        settings,
        ping_sent: None,
        flow_pings_unanswered: 0,
    };
    let reason = connection.run(&mut sink, stream, joined.outbound).await;
    if let Some(reason) = &reason {
        close(&mut sink, CLOSE_NORMAL, reason).await;
    }
    tracing::info!(worker = %worker_wire_id(joined.worker), reason = reason.as_deref().unwrap_or("connection closed"), "worker disconnected");
    let departure = match reason.as_deref() {
        None => Departure::WorkerClosed,
        Some(HEARTBEAT_LOST) => Departure::HeartbeatLost,
        Some(_) => Departure::ProxyClosed,
    };
    hub.worker_left(joined.worker, departure);
}

async fn read_register(stream: &mut SplitStream<WebSocket>) -> Result<RegisterMessage, String> {
    loop {
        match stream.next().await {
            Some(Ok(Message::Text(text))) => {
                return match serde_json::from_str::<WorkerToServer>(&text) {
                    Ok(WorkerToServer::Register(register)) => Ok(register),
                    Ok(_) => Err("protocol error: the first message must be register".to_string()),
                    Err(error) => Err(format!("protocol error: invalid register message: {error}")),
                };
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            Some(Ok(Message::Binary(_))) => {
                return Err("protocol error: expected a JSON text message".to_string())
            }
            _ => return Err("connection closed before register".to_string()),
        }
    }
}

async fn close(sink: &mut Sink, code: u16, reason: &str) {
    // Close reasons are limited to 123 bytes by RFC 6455.
    let mut reason = reason.to_string();
    while reason.len() > 123 {
        reason.pop();
    }
    let frame = CloseFrame {
        code,
        reason: Utf8Bytes::from(reason),
    };
    let _ = timeout(CLOSE_TIMEOUT, sink.send(Message::Close(Some(frame)))).await;
}

struct Connection {
    hub: Arc<Hub>,
    worker: WorkerId,
    /// The name it registered with, for the usage of the requests it answers.
    name: Arc<str>,
    routes: HashMap<RequestId, Route>,
    /// Streams the worker was asked to hold back because their clients fell behind.
    pauses: StreamPauses,
    settings: SocketSettings,
    /// When the last heartbeat ping went out, to time the worker's pong.
    ping_sent: Option<Instant>,
    /// Pings sent only to carry `paused_requests` whose pongs have not come back: they carry no
    /// timestamp, so their pongs must not be taken for the heartbeat's.
    flow_pings_unanswered: u32,
}

impl Connection {
    /// Runs until the connection ends; returns a close reason when the proxy ends it.
    async fn run(
        &mut self,
        sink: &mut Sink,
        mut stream: SplitStream<WebSocket>,
        mut outbound: mpsc::UnboundedReceiver<Outbound>,
    ) -> Option<String> {
        let interval = self.settings.heartbeat_interval;
        let mut heartbeat = interval_at(Instant::now() + interval, interval);
        heartbeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut last_heard = Instant::now();
        let mut resume_check = tokio::time::interval(RESUME_CHECK);
        resume_check.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                // Writes first: a new request's dispatch must not wait behind a backlog of
                // other streams' chunks (a client's time to first byte waits on it); then the
                // heartbeat, which a steady stream of frames must not starve.
                biased;
                message = outbound.recv() => {
                    let message = message?;
                    let limit = self.settings.write_timeout;
                    match timeout(limit, self.write(sink, message, &mut outbound)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(reason)) => return reason,
                        Err(_) => return Some(self.stalled()),
                    }
                }
                _ = heartbeat.tick() => {
                    if last_heard.elapsed() > self.settings.heartbeat_timeout {
                        tracing::warn!(worker = %worker_wire_id(self.worker), "worker heartbeat timed out");
                        return Some(HEARTBEAT_LOST.to_string());
                    }
                    let ping = ServerToWorker::Ping(PingMessage { timestamp_unix_ms: Some(unix_ms()), paused_requests: None, wake_macs: None }).to_json();
                    match timeout(self.settings.write_timeout, sink.send(Message::Text(ping.into()))).await {
                        Ok(Ok(())) => {}
                        Ok(Err(_)) => return None,
                        Err(_) => return Some(self.stalled()),
                    }
                    self.ping_sent = Some(Instant::now());
                }
                _ = resume_check.tick(), if self.pauses.any() => {
                    let routes = &self.routes;
                    self.pauses.resume_caught_up(|request| {
                        routes.get(&request).map(|route| route.waiting.load(Ordering::Relaxed))
                    });
                    if let Err(reason) = self.send_pauses(sink).await {
                        return reason;
                    }
                }
                frame = stream.next() => match frame {
                    Some(Ok(Message::Text(text))) => {
                        last_heard = Instant::now();
                        self.on_text(&text);
                        if let Err(reason) = self.send_pauses(sink).await {
                            return reason;
                        }
                    }
                    Some(Ok(Message::Binary(_))) => {
                        tracing::warn!(worker = %worker_wire_id(self.worker), "ignoring binary frame from worker: the protocol is JSON text");
                    }
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => last_heard = Instant::now(),
                    Some(Ok(Message::Close(_))) | None => return None,
                    Some(Err(error)) => {
                        tracing::warn!(worker = %worker_wire_id(self.worker), "worker connection error: {error}");
                        return None;
                    }
                },
            }
        }
    }

    /// Tells the worker which streams to hold back, when that changed. Err carries the close
    /// reason when the connection must end.
    async fn send_pauses(&mut self, sink: &mut Sink) -> Result<(), Option<String>> {
        let Some(paused) = self.pauses.take_update() else {
            return Ok(());
        };
        let ping = ServerToWorker::Ping(PingMessage {
            timestamp_unix_ms: None,
            paused_requests: Some(paused),
            wake_macs: None,
        });
        let frame = Message::Text(ping.to_json().into());
        match timeout(self.settings.write_timeout, sink.send(frame)).await {
            Ok(Ok(())) => {
                self.flow_pings_unanswered += 1;
                Ok(())
            }
            Ok(Err(_)) => Err(None),
            Err(_) => Err(Some(self.stalled())),
        }
    }

    /// The close reason for a worker whose writes stopped completing.
    fn stalled(&self) -> String {
        let secs = self.settings.write_timeout.as_secs_f64();
        tracing::warn!(worker = %worker_wire_id(self.worker), "worker stopped reading: a write did not complete within {secs} s; closing");
        format!("the worker stopped reading (a write took over {secs} s)")
    }

    /// Writes `first` and everything else already waiting, then flushes once. Err carries the
    /// close reason when the connection must end.
    async fn write(
        &mut self,
        sink: &mut Sink,
        first: Outbound,
        outbound: &mut mpsc::UnboundedReceiver<Outbound>,
    ) -> Result<(), Option<String>> {
        let mut next = Some(first);
        while let Some(message) = next {
            let frame = match message {
                Outbound::Frame(frame) => frame,
                Outbound::Dispatch {
                    request,
                    frame,
                    events,
                    waiting,
                } => {
                    self.routes.insert(
                        request,
                        Route {
                            events,
                            waiting,
                            started: false,
                            bytes: 0,
                        },
                    );
                    frame
                }
                Outbound::Forget(request) => {
                    self.routes.remove(&request);
                    self.pauses.forget(request);
                    next = outbound.try_recv().ok();
                    continue;
                }
                Outbound::Close(reason) => return Err(Some(reason)),
            };
            if sink.feed(Message::Text(frame)).await.is_err() {
                return Err(None);
            }
            next = outbound.try_recv().ok();
        }
        sink.flush().await.map_err(|_| None)
    }

    fn on_text(&mut self, text: &str) {
        let message = match WorkerToServer::from_json(text) {
            Ok(message) => message,
            Err(error) => {
                let preview: String = text.chars().take(80).collect();
                tracing::warn!(worker = %worker_wire_id(self.worker), "ignoring malformed worker message ({error}): {preview}");
                return;
            }
        };
        match message {
            WorkerToServer::ResponseChunk(chunk) => self.on_chunk(chunk),
            WorkerToServer::ResponseComplete(complete) => self.on_complete(complete),
            WorkerToServer::Error(error) => self.on_error(error),
            WorkerToServer::Pong(pong) => {
                // Pongs come back in the order of their pings; one without a timestamp answers
                // a flow ping first (or the heartbeat of a worker that does not echo it).
                let answers_flow_ping =
                    pong.timestamp_unix_ms.is_none() && self.flow_pings_unanswered > 0;
                if answers_flow_ping {
                    self.flow_pings_unanswered -= 1;
                } else if let Some(sent) = self.ping_sent.take() {
                    self.hub
                        .telemetry()
                        .heartbeat(&worker_wire_id(self.worker), sent.elapsed());
                }
                self.hub
                    .update_load(self.worker, pong.current_load, pong.model_states.as_deref());
                self.hub.telemetry().worker_box(
                    &worker_wire_id(self.worker),
                    pong.hardware,
                    pong.model_states,
                );
            }
            WorkerToServer::ModelsUpdate(update) => {
                let going_to_sleep = update.going_to_sleep == Some(true);
                let (models, warnings) = self.hub.update_models(self.worker, &update);
                let states = update.model_states;
                (self.hub.telemetry()).worker_box(&worker_wire_id(self.worker), None, states);
                tracing::info!(worker = %worker_wire_id(self.worker), ?models, going_to_sleep, "models updated");
                for warning in warnings {
                    tracing::warn!(worker = %worker_wire_id(self.worker), "models_update: {warning}");
                }
            }
            WorkerToServer::Register(_) => {
                tracing::warn!(worker = %worker_wire_id(self.worker), "ignoring a second register message on the same connection");
            }
        }
    }

    fn route_of(&self, wire_id: &str, what: &str) -> Option<RequestId> {
        let id = parse_request_wire_id(wire_id);
        if id.is_none_or(|id| !self.routes.contains_key(&id)) {
            tracing::debug!(worker = %worker_wire_id(self.worker), request = wire_id, "dropping {what} for an unknown, finished or cancelled request");
            return None;
        }
        id
    }

    fn on_chunk(&mut self, chunk: ResponseChunkMessage) {
        let Some(request) = self.route_of(&chunk.request_id, "response_chunk") else {
            return;
        };
        let route = self.routes.get_mut(&request).expect("checked by route_of");
        let len = chunk.chunk.len();
        route.bytes += len as u64;
        let waiting = route.waiting.fetch_add(len, Ordering::Relaxed) + len;
        let ended = if route.bytes > self.settings.max_stream_bytes {
            let limit = self.settings.max_stream_bytes;
            tracing::warn!(request = %chunk.request_id, limit, "stream size limit exceeded; cancelling");
            Some(ApiError::new(
                StatusCode::BAD_GATEWAY,
                "stream_too_large",
                format!("the response exceeded the relay's stream size limit of {limit} bytes"),
            ))
        } else if waiting > self.settings.max_buffered_stream_bytes {
            let limit = self.settings.max_buffered_stream_bytes;
            tracing::warn!(request = %chunk.request_id, waiting, limit, "client reads too slowly; ending its stream and cancelling");
            Some(ApiError::new(
                StatusCode::BAD_GATEWAY,
                "client_too_slow",
                format!(
                    "the stream was ended: {waiting} bytes of it waited for this client to read \
                     them, beyond the relay's {limit} (max_buffered_stream_bytes)"
                ),
            ))
        } else {
            None
        };
        if let Some(error) = ended {
            let route = self.routes.remove(&request).expect("present");
            self.pauses.forget(request);
            let _ = route.events.send(ResponseEvent::Failed(Box::new(error)));
            self.hub.cancel(request, CancelReason::ClientDisconnect);
            return;
        }
        // A closed channel means the client left; its cancel guard tells the worker.
        let _ = route
            .events
            .send(ResponseEvent::Chunk(Bytes::from(chunk.chunk)));
        if !route.started {
            route.started = true;
            self.hub.mark_started(request);
        }
        self.pauses.after_chunk(request, waiting);
    }

    /// Gives back the route map's capacity after a burst.
    fn shrink_routes_if_idle(&mut self) {
        if self.routes.is_empty() && self.routes.capacity() > 1024 {
            self.routes.shrink_to_fit();
        }
    }

    fn on_complete(&mut self, complete: ResponseCompleteMessage) {
        let Some(id) = parse_request_wire_id(&complete.request_id) else {
            tracing::warn!(request = %complete.request_id, "ignoring response_complete for an id this proxy never issued");
            return;
        };
        let route = self.routes.remove(&id);
        self.pauses.forget(id);
        self.shrink_routes_if_idle();
        if !self.hub.finish(self.worker, id, complete.timings.as_ref()) {
            tracing::warn!(worker = %worker_wire_id(self.worker), request = %complete.request_id, "ignoring response_complete for an unknown or already completed request");
            return;
        }
        tracing::debug!(request = %complete.request_id, status = complete.status_code, tokens = ?complete.token_counts, "response complete");
        if let Some(route) = route {
            let _ = route.events.send(ResponseEvent::Complete(
                Box::new(complete),
                Some(Arc::clone(&self.name)),
            ));
        }
    }

    fn on_error(&mut self, error: ErrorMessage) {
        let Some(wire_id) = error.request_id.as_deref() else {
            tracing::warn!(worker = %worker_wire_id(self.worker), code = %error.code, "worker reported an error: {}", error.message);
            return;
        };
        let Some(id) = parse_request_wire_id(wire_id) else {
            tracing::warn!(
                request = wire_id,
                "ignoring error for an id this proxy never issued"
            );
            return;
        };
        let route = self.routes.remove(&id);
        self.pauses.forget(id);
        let unstarted = route.as_ref().is_some_and(|r| !r.started);
        if unstarted && error.code == WORKER_BUSY_CODE {
            if self.hub.refused_as_busy(self.worker, id) {
                tracing::info!(worker = %worker_wire_id(self.worker), request = wire_id, "request requeued: the worker was fuller than it had said; {}", error.message);
            }
            return;
        }
        if unstarted && is_retryable_code(&error.code) {
            if self.hub.retry(self.worker, id) {
                tracing::info!(worker = %worker_wire_id(self.worker), request = wire_id, code = %error.code, "request requeued after a retryable worker error: {}", error.message);
            }
            return;
        }
        if !self.hub.finish(self.worker, id, None) {
            tracing::debug!(
                request = wire_id,
                "worker error for a finished or cancelled request: {}",
                error.message
            );
            return;
        }
        let client_gone = route.as_ref().is_none_or(|r| r.events.is_closed());
        if error.code == CANCELLED_CODE && client_gone {
            // The worker confirmed our cancel: the slot is free now.
            tracing::debug!(request = wire_id, "worker confirmed the cancellation");
            return;
        }
        tracing::warn!(worker = %worker_wire_id(self.worker), request = wire_id, code = %error.code, "worker failed request: {}", error.message);
        if let Some(route) = route {
            let _ = route
                .events
                .send(ResponseEvent::Failed(Box::new(ApiError::new(
                    StatusCode::BAD_GATEWAY,
                    "worker_error",
                    format!("the worker failed this request: {}", error.message),
                ))));
        }
    }
}
