//! One connection to the proxy: connect, `register`, then a loop over the proxy's messages, the
//! request tasks' output, the model refresh timer and the shutdown signal.
//!
//! What the request tasks report goes out in the order [`outbox`] decides (a request's first
//! message ahead of other requests' backlog), paced by [`window`] (a bound on what the proxy has
//! not read yet), so the backlog of busy streams stays where a new stream can overtake it.

mod liveness;
mod outbox;
mod updates;
mod wake_relay;
mod window;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::http::StatusCode;
use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio::task::AbortHandle;
use tokio::time::{interval_at, timeout, Instant, MissedTickBehavior};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use liveness::{Liveness, Verdict};
use outbox::{Outbox, Pulled};
use window::FlowWindow;

use super::catalog::{self, Catalog, Route};
use super::clocked::Clocks;
use super::{connect_url, managed, wire, BackendAccess, Running, WorkerConfig};
use crate::backend::{answer, endpoint, error_chain, BackendEvent};
use crate::dialect::{ApiError, Dialect, WORKER_BUSY_CODE};
use crate::lifecycle::LifecycleManager;
use crate::protocol::{
    PongMessage, RegisterMessage, RequestMessage, ServerToWorker, WorkerToServer, CANCELLED_CODE,
};

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// The largest message accepted from the proxy (a request with a large body).
const MAX_MESSAGE_BYTES: usize = crate::protocol::MAX_FRAME_BYTES;

/// The WebSocket's read buffer. tungstenite zero-fills the buffer's free space before every read
/// attempt, and the loop tries a read each time round: with the 128 KiB default that memset was
/// 2% of the worker's CPU under `unary64`. The proxy sends small messages; a large request body
/// just takes more reads.
const READ_BUFFER_BYTES: usize = 16 * 1024;

/// The longest a connection attempt (TCP, TLS and the WebSocket handshake) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Messages written in one burst before the loop looks at the proxy's messages again (a new
/// request or a pong must not wait behind a long burst).
const MAX_BURST: usize = 64;

/// How a session ended.
#[derive(Debug)]
pub enum SessionEnd {
    /// The local shutdown signal: do not reconnect.
    Shutdown,
    /// The proxy sent `graceful_shutdown` and the worker finished (or the drain timeout ended)
    /// its requests: do not reconnect by itself (the runbook: "the worker process exits").
    DrainedByProxy {
        /// The reason the proxy gave, if any.
        reason: String,
    },
    /// The proxy itself stopped (`graceful_shutdown` with `reconnect`: a restart, an upgrade)
    /// and the worker finished its requests: reconnect, soon and often, until it is back.
    ProxyStopped {
        /// The reason the proxy gave, if any.
        reason: String,
    },
    /// The box is going to sleep: the proxy was told (`going_to_sleep`) and the connection
    /// closed; reconnect after a pause (which a suspend freezes, so it ends after the resume).
    Asleep,
    /// The connection failed or ended; `registered` tells whether it got as far as `register_ack`.
    Disconnected {
        /// Whether registration succeeded (resets the reconnect backoff).
        registered: bool,
        /// What happened, for the log.
        reason: String,
        /// The attempt took its whole bound: the dial or `register` timed out, as against a
        /// proxy whose box is suspended or frozen (its kernel still takes the connection, nobody
        /// answers). The attempt was the wait; the next one starts at once, so a proxy that
        /// resumes finds its workers mid-attempt and has them back within a second or two,
        /// instead of after a backoff grown while it slept.
        waited_out: bool,
    },
}

fn disconnected(registered: bool, reason: impl Into<String>) -> SessionEnd {
    SessionEnd::Disconnected {
        registered,
        waited_out: false,
        reason: reason.into(),
    }
}

/// An attempt that took its whole bound ([`SessionEnd::Disconnected::waited_out`]).
fn waited_out(reason: impl Into<String>) -> SessionEnd {
    SessionEnd::Disconnected {
        registered: false,
        waited_out: true,
        reason: reason.into(),
    }
}

/// Connects, registers and serves until the connection ends or shutdown is requested. Requests
/// for the model map's models go through `lifecycle`.
pub async fn serve(running: Running<'_>, shutdown: &mut watch::Receiver<bool>) -> SessionEnd {
    let Running {
        config,
        access,
        report,
        lifecycle,
        hardware,
        ..
    } = running;
    // Before the catalog is read, so a warm-up measured while it is read is not missed.
    let warmed = access.warm_ups.subscribe();
    let pinned = access.slot_pins.subscribe();
    let catalog = catalog::load(config, access, mapped_models(lifecycle)).await;
    // Unbounded, a connect into a partition waits out the kernel's SYN retries (about two
    // minutes) before the backoff can try again.
    let proxy_url = running.proxy_url;
    let mut socket = match timeout(CONNECT_TIMEOUT, connect(config, proxy_url)).await {
        Ok(Ok(socket)) => socket,
        Ok(Err(reason)) => return disconnected(false, reason),
        Err(_) => {
            return waited_out(format!(
                "connecting to {} took over {} s",
                proxy_url,
                CONNECT_TIMEOUT.as_secs()
            ))
        }
    };
    tracing::info!(proxy = %proxy_url, "connected to proxy");
    let register = WorkerToServer::Register(RegisterMessage {
        warm_ups: catalog.warm_ups(),
        sides_first: catalog.sides_first(),
        worker_name: config.name.clone(),
        models: catalog.models(),
        max_concurrent: config.max_concurrent,
        protocol_version: config.protocol_version.clone(),
        current_load: Some(0),
        mac_address: config.mac_address.map(|mac| mac.to_string()),
        sleeps_when_idle: config.sleeps_when_idle.then_some(true),
        context_windows: catalog.context_windows(),
    });
    if let Err(error) = socket.send(Message::Text(register.to_json().into())).await {
        return disconnected(false, format!("sending register failed: {error}"));
    }
    match timeout(Duration::from_secs(10), await_ack(&mut socket)).await {
        Ok(Ok(())) => {}
        Ok(Err(reason)) => return disconnected(false, reason),
        Err(_) => return waited_out("the proxy did not answer register within 10s"),
    }
    report.set_state(crate::worker::report::ConnectionState::Connected, None);
    let mut window = FlowWindow::default();
    // Learns whether the proxy answers pings before the window limits anything.
    if let Err(error) = socket.send(Message::Ping(window.ping())).await {
        return disconnected(true, format!("sending failed: {error}"));
    }
    let mut session = Session {
        config,
        access,
        lifecycle,
        hardware,
        catalog,
        warmed,
        pinned,
        active: HashMap::new(),
        clocks: Clocks::new(access.resting.clone()),
        outbox: Outbox::default(),
        window,
        draining: false,
        drain_deadline: None,
        drained_by_proxy: None,
        proxy_stopping: None,
        sleep: running.sleep,
    };
    session.run(&mut socket, shutdown).await
}

async fn connect(config: &WorkerConfig, proxy_url: &str) -> Result<Socket, String> {
    let pin = config.proxy_fingerprint;
    let url = connect_url(proxy_url, &config.provider, pin.is_some())?;
    let mut request = url
        .as_str()
        .into_client_request()
        .map_err(|e| format!("invalid PROXY_URL {proxy_url:?}: {e}"))?;
    let secret = config.secret.parse().map_err(|_| {
        "WORKER_SECRET contains characters not allowed in an HTTP header".to_string()
    })?;
    request.headers_mut().insert("x-worker-secret", secret);
    let ws_config = WebSocketConfig::default()
        .read_buffer_size(READ_BUFFER_BYTES)
        .max_message_size(Some(MAX_MESSAGE_BYTES))
        .max_frame_size(Some(MAX_MESSAGE_BYTES));
    match super::dial(request, pin, Some(ws_config)).await {
        Ok(socket) => Ok(socket),
        Err(WsError::Http(response)) => {
            let status = response.status();
            let body = response
                .body()
                .as_deref()
                .map(String::from_utf8_lossy)
                .unwrap_or_default()
                .into_owned();
            let hint = match status.as_u16() {
                401 => " (check WORKER_SECRET: it must match the proxy's)",
                404 => " (check PROVIDER_NAME and that PROXY_URL points at a ModelRelay proxy)",
                429 => " (too many failed attempts from this address; it is let in again within seconds)",
                _ => "",
            };
            Err(format!(
                "the proxy refused the connection: HTTP {status}{hint}: {body}"
            ))
        }
        Err(error) => Err(
            super::pin_mismatch_message(proxy_url, &error).unwrap_or_else(|| {
                format!(
                    "cannot connect to the proxy at {proxy_url}: {}",
                    error_chain(&error)
                )
            }),
        ),
    }
}

async fn await_ack(socket: &mut Socket) -> Result<(), String> {
    while let Some(frame) = socket.next().await {
        match frame.map_err(|e| format!("connection failed during registration: {e}"))? {
            Message::Text(text) => match serde_json::from_str::<ServerToWorker>(&text) {
                Ok(ServerToWorker::RegisterAck(ack)) => {
                    tracing::info!(worker_id = %ack.worker_id, models = ?ack.models, "registered");
                    for warning in ack.warnings {
                        tracing::warn!("registration: {warning}");
                    }
                    return Ok(());
                }
                Ok(other) => tracing::debug!(?other, "message before register_ack ignored"),
                Err(error) => tracing::warn!("ignoring malformed proxy message: {error}"),
            },
            Message::Close(frame) => {
                let reason = frame.map(|f| f.reason.to_string()).unwrap_or_default();
                return Err(format!(
                    "the proxy closed the connection during registration: {reason}"
                ));
            }
            _ => {}
        }
    }
    Err("the connection closed during registration".to_string())
}

/// The model map's models, advertised whether loaded or not.
fn mapped_models(lifecycle: Option<&LifecycleManager>) -> Vec<String> {
    lifecycle.map(LifecycleManager::models).unwrap_or_default()
}

/// Where one request is forwarded.
enum Target {
    /// A model of the model map: a lease first, then its server.
    Managed(LifecycleManager),
    /// A backend's base URL.
    Backend(String),
}

struct Session<'a> {
    config: &'a WorkerConfig,
    access: &'a BackendAccess,
    lifecycle: Option<&'a LifecycleManager>,
    hardware: Option<&'a crate::hardware::Latest>,
    catalog: Catalog,
    /// Changes when a warm-up is measured ([`crate::worker::warm_up`]).
    warmed: watch::Receiver<u64>,
    /// Changes when a backend's slot hints turn on or off ([`crate::worker::slot_pins`]).
    pinned: watch::Receiver<u64>,
    /// Running requests by wire id.
    active: HashMap<String, AbortHandle>,
    /// What was true as each started: whether its answer's clock may say a speed.
    clocks: Clocks,
    /// Each running request's messages, waiting to be written.
    outbox: Outbox,
    /// Bytes written that the proxy has not read yet.
    window: FlowWindow,
    draining: bool,
    drain_deadline: Option<Instant>,
    /// The proxy told this worker to drain (`graceful_shutdown`), with its reason: however the
    /// connection ends afterwards, the worker does not reconnect.
    drained_by_proxy: Option<String>,
    /// The proxy said it is stopping itself (`graceful_shutdown` with `reconnect`), with its
    /// reason: once the connection ends, the worker reconnects.
    proxy_stopping: Option<String>,
    /// Notified when the box is about to suspend.
    sleep: &'a tokio::sync::Notify,
}

/// A freshly read catalog, and whether the proxy asked for it.
struct Refreshed {
    catalog: Catalog,
    requested: bool,
}

/// What the loop should do after handling a message.
enum Next {
    Continue,
    End(SessionEnd),
}

impl Session<'_> {
    async fn run(
        &mut self,
        socket: &mut Socket,
        shutdown: &mut watch::Receiver<bool>,
    ) -> SessionEnd {
        let period = self.config.model_refresh_interval;
        let mut refresh = interval_at(Instant::now() + period, period);
        refresh.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let (catalog_tx, mut catalogs) = mpsc::channel::<Refreshed>(1);
        let mut local_shutdown = false;
        // A half-open connection (a partition, a sleep) never ends by itself: see `liveness`.
        let silence = self.config.proxy_silence_timeout;
        let tick = liveness::TICK.min(silence / 4);
        let mut watchdog = interval_at(Instant::now() + tick, tick);
        watchdog.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut liveness = Liveness::new(silence, Instant::now().into_std(), SystemTime::now());
        let mut last_heard = Instant::now();
        let sleep = self.sleep;
        loop {
            let drain_deadline = self.drain_deadline;
            let bulk = self.window.is_open();
            let next = tokio::select! {
                // The proxy's messages first: a new request (its client waits for the first
                // byte) and the pongs that reopen the window must not wait behind our writes.
                biased;
                frame = socket.next() => match frame {
                    Some(Ok(Message::Text(text))) => {
                        last_heard = Instant::now();
                        self.on_proxy_message(socket, &text, &catalog_tx).await
                    }
                    Some(Ok(Message::Pong(payload))) => {
                        last_heard = Instant::now();
                        self.window.on_pong(&payload);
                        Next::Continue
                    }
                    Some(Ok(Message::Close(frame))) => {
                        let reason = frame.map(|f| f.reason.to_string()).filter(|r| !r.is_empty());
                        Next::End(disconnected(true, reason.unwrap_or_else(|| "the proxy closed the connection".into())))
                    }
                    Some(Ok(_)) => {
                        last_heard = Instant::now();
                        Next::Continue
                    }
                    Some(Err(error)) => Next::End(disconnected(true, format!("connection error: {error}"))),
                    None => Next::End(disconnected(true, "the connection closed")),
                },
                pulled = self.outbox.next(bulk) => self.on_pulled(socket, pulled).await,
                Some(refreshed) = catalogs.recv() => self.on_catalog(socket, refreshed).await,
                _ = refresh.tick() => {
                    self.spawn_refresh(&catalog_tx, false);
                    Next::Continue
                }
                // Not while draining: the proxy was told this worker serves nothing.
                _ = self.access.resting.changed(), if !self.draining => self.on_states_changed(socket).await,
                // A warm-up measured: the catalog read again carries it to the proxy.
                Ok(()) = self.warmed.changed() => {
                    self.spawn_refresh(&catalog_tx, false);
                    Next::Continue
                }
                // Slot hints turned on or off: the catalog read again says whose side
                // requests are evaluated first.
                Ok(()) = self.pinned.changed() => {
                    self.spawn_refresh(&catalog_tx, false);
                    Next::Continue
                }
                _ = watchdog.tick() => {
                    let verdict = liveness.tick(Instant::now().into_std(), SystemTime::now(), last_heard.into_std());
                    self.check_liveness(socket, verdict).await
                }
                _ = sleep.notified(), if !local_shutdown => self.go_to_sleep(socket).await,
                changed = shutdown.changed(), if !local_shutdown => {
                    if changed.is_err() || *shutdown.borrow() {
                        local_shutdown = true;
                        self.begin_local_drain(socket).await
                    } else {
                        Next::Continue
                    }
                }
                _ = tokio::time::sleep_until(drain_deadline.unwrap_or_else(Instant::now)), if drain_deadline.is_some() => {
                    tracing::warn!(left = self.active.len(), "drain timeout: abandoning requests still in flight");
                    for (_, task) in self.active.drain() {
                        task.abort();
                    }
                    close(socket, "worker drain timeout").await;
                    Next::End(disconnected(true, "drain timeout"))
                }
            };
            if let Next::End(end) = next {
                for (_, task) in self.active.drain() {
                    task.abort();
                }
                // After a local shutdown began, or the proxy drained this worker, however the
                // connection ends, do not reconnect; after the proxy said it stops, do.
                return if local_shutdown {
                    SessionEnd::Shutdown
                } else if let Some(reason) = self.drained_by_proxy.take() {
                    SessionEnd::DrainedByProxy { reason }
                } else if let Some(reason) = self.proxy_stopping.take() {
                    SessionEnd::ProxyStopped { reason }
                } else {
                    end
                };
            }
        }
    }

    async fn on_proxy_message(
        &mut self,
        socket: &mut Socket,
        text: &str,
        catalog_tx: &mpsc::Sender<Refreshed>,
    ) -> Next {
        let message = match ServerToWorker::from_json(text) {
            Ok(message) => message,
            Err(error) => {
                tracing::warn!("ignoring malformed proxy message: {error}");
                return Next::Continue;
            }
        };
        match message {
            ServerToWorker::Request(request) => {
                self.start_request(socket, request).await;
                Next::Continue
            }
            ServerToWorker::Cancel(cancel) => {
                if let Some(task) = self.active.remove(&cancel.request_id) {
                    task.abort();
                    self.clocks.forget(&cancel.request_id);
                    self.outbox.resume(&cancel.request_id);
                    tracing::info!(request = %cancel.request_id, reason = cancel.reason.as_str(), "cancelled");
                    // Confirm the end so the proxy frees the slot at once.
                    let reason = format!("request cancelled: {}", cancel.reason.as_str());
                    let cancelled = ApiError::new(StatusCode::BAD_GATEWAY, CANCELLED_CODE, reason);
                    let confirm = wire::failure(&cancel.request_id, cancelled);
                    if send(socket, &confirm).await.is_err() {
                        return Next::End(disconnected(true, "sending failed"));
                    }
                }
                self.maybe_drained(socket).await
            }
            ServerToWorker::Ping(ping) => {
                if let Some(paused) = ping.paused_requests {
                    // Only running requests: a proxy cannot make the set outgrow them.
                    let paused = paused
                        .into_iter()
                        .filter(|request| self.active.contains_key(request))
                        .map(Arc::from)
                        .collect();
                    self.outbox.set_paused(paused);
                }
                if let Some(macs) = ping.wake_macs {
                    wake_relay::relay_wake_packets(&macs, self.config.wake_target);
                }
                let pong = WorkerToServer::Pong(PongMessage {
                    current_load: self.active.len() as u32,
                    timestamp_unix_ms: ping.timestamp_unix_ms,
                    // The box rides on the heartbeat: no message of its own, which a published
                    // proxy would not know.
                    hardware: self
                        .hardware
                        .and_then(|latest| latest.borrow().as_ref().map(|s| s.report.clone())),
                    model_states: super::report::model_states(self.lifecycle, &self.access.resting),
                });
                sent(send(socket, &pong).await)
            }
            ServerToWorker::GracefulShutdown(message) => {
                tracing::info!(
                    reason = message.reason.as_deref().unwrap_or(""),
                    in_flight = self.active.len(),
                    "graceful shutdown"
                );
                self.draining = true;
                let reason = message.reason.clone().unwrap_or_default();
                if message.reconnect == Some(true) {
                    self.proxy_stopping = Some(reason);
                } else {
                    self.drained_by_proxy = Some(reason);
                }
                let timeout = message
                    .drain_timeout_secs
                    .map(Duration::from_secs)
                    .unwrap_or(self.config.drain_timeout);
                self.drain_deadline = Some(Instant::now() + timeout);
                self.maybe_drained(socket).await
            }
            ServerToWorker::ModelsRefresh(message) => {
                tracing::info!(
                    reason = message.reason.as_deref().unwrap_or(""),
                    "models refresh requested"
                );
                // The server behind a backend URL may have changed: learn its routes again.
                self.access.capabilities.forget(None);
                self.spawn_refresh(catalog_tx, true);
                Next::Continue
            }
            ServerToWorker::RegisterAck(_) => Next::Continue,
        }
    }

    async fn start_request(&mut self, socket: &mut Socket, mut request: RequestMessage) {
        if self.active.len() >= self.config.max_concurrent as usize {
            // More than it advertised: refuse before the backend sees it, retryably, so the
            // proxy gives the request to another worker (or to this one once a slot frees).
            tracing::warn!(request = %request.request_id, max_concurrent = self.config.max_concurrent, "refused a request beyond max_concurrent");
            let why = format!(
                "this worker already runs its {} requests (max_concurrent)",
                self.config.max_concurrent
            );
            let refusal = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, WORKER_BUSY_CODE, why);
            let busy = wire::failure(&request.request_id, refusal);
            let _ = send(socket, &busy).await;
            return;
        }
        endpoint::keep_forwarded_headers(&mut request.headers);
        if !self.config.forward_client_auth {
            endpoint::strip_client_auth(&mut request.headers);
        }
        let target = match self.catalog.route(&request.model) {
            Some(Route::Managed) => self.lifecycle.cloned().map(Target::Managed),
            Some(Route::Backend(url)) => Some(Target::Backend(url.to_string())),
            None => None,
        };
        let refusal = if let Err(why) = endpoint::check_path(&request.endpoint_path) {
            tracing::warn!(request = %request.request_id, "{why}");
            Some(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_endpoint_path",
                why,
            ))
        } else if let Err(why) =
            endpoint::check_route(&request.endpoint_path, &self.config.extra_routes)
        {
            tracing::warn!(request = %request.request_id, "{why}");
            Some(ApiError::new(
                StatusCode::FORBIDDEN,
                "route_not_forwarded",
                why,
            ))
        } else if self.draining {
            Some(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "worker_draining",
                "this worker is draining and takes no new requests",
            ))
        } else {
            target.is_none().then(|| {
                ApiError::new(
                    StatusCode::BAD_GATEWAY,
                    "backend_unavailable",
                    "this worker has no backend; start one (llama-server, Ollama, ...) or set BACKEND_URL",
                )
            })
        };
        if let Some(refusal) = refusal {
            let dialect = Dialect::for_path(&request.endpoint_path);
            let _ = send(
                socket,
                &wire::message(&request.request_id, answer::error(dialect, &refusal)),
            )
            .await;
            return;
        }
        let id = request.request_id.clone();
        let backend = match &target {
            Some(Target::Backend(url)) => Some((url.as_str(), request.model.as_str())),
            _ => None,
        };
        let alone = self.active.is_empty();
        (self.clocks).begin(&id, request.conversation_key(), alone, backend);
        let events = self.outbox.open(&id);
        // Aborting the task (cancel, disconnect) drops what it holds: the backend response and,
        // for a mapped model, its lease (or its wait for a start, which goes on for others).
        let task = match target.expect("checked above") {
            Target::Managed(manager) => {
                let access = self.access.clone();
                tokio::spawn(managed::serve(manager, access, request, events))
            }
            Target::Backend(url) => {
                let backend = self.access.backend(&url);
                let access = self.access.clone();
                tokio::spawn(async move {
                    // Held until the answer ends; a cancel while the turn waits for its slot
                    // ends the wait.
                    let (forwarded, _slot) = access.request_for(&url, request).await;
                    backend.serve(forwarded, events).await;
                })
            }
        };
        self.active.insert(id, task.abort_handle());
    }

    /// Acts on the watchdog's verdict: a ping asks for a pong (every WebSocket peer answers
    /// one); a dead connection ends, and its requests with it.
    async fn check_liveness(&mut self, socket: &mut Socket, verdict: Verdict) -> Next {
        match verdict {
            Verdict::Fine => Next::Continue,
            Verdict::Ping => match socket.send(Message::Ping(self.window.ping())).await {
                Ok(()) => Next::Continue,
                Err(_) => Next::End(disconnected(true, "sending failed")),
            },
            Verdict::GiveUp(why) => {
                tracing::warn!("{why}; reconnecting");
                Next::End(disconnected(true, why))
            }
        }
    }

    /// Writes a task's message, plus every other message the outbox lets out now (up to
    /// [`MAX_BURST`]), then a window ping when one is due, with one flush.
    async fn on_pulled(&mut self, socket: &mut Socket, first: Pulled) -> Next {
        let mut next = Some(first);
        let mut any_done = false;
        let mut written = 0;
        while let Some(Pulled { request, event }) = next {
            match event {
                // A late message of a cancelled request is not sent.
                Some(mut event) if self.active.contains_key(&*request) => {
                    let last = matches!(event, BackendEvent::Complete(_) | BackendEvent::Failed(_));
                    self.clocks.on_event(&request, &mut event);
                    let text = wire::message(&request, event).to_json();
                    self.window.wrote(text.len());
                    if socket.feed(Message::Text(text.into())).await.is_err() {
                        return Next::End(disconnected(true, "sending failed"));
                    }
                    written += 1;
                    if last {
                        // Free from the moment the proxy can learn so: its next request
                        // comes at once and must not be refused as beyond max_concurrent.
                        self.active.remove(&*request);
                        any_done = true;
                    }
                }
                Some(_) => {}
                // The task ended: finished, aborted or panicked.
                None => {
                    self.active.remove(&*request);
                    self.clocks.forget(&request);
                    if self.active.is_empty() && self.active.capacity() > 1024 {
                        // Give back what a burst of requests grew the map to.
                        self.active.shrink_to_fit();
                    }
                    any_done = true;
                }
            }
            next = if written < MAX_BURST {
                self.outbox.try_next(self.window.is_open())
            } else {
                None
            };
        }
        if let Some(payload) = self.window.ping_due() {
            if socket.feed(Message::Ping(payload)).await.is_err() {
                return Next::End(disconnected(true, "sending failed"));
            }
        }
        if socket.flush().await.is_err() {
            return Next::End(disconnected(true, "sending failed"));
        }
        if any_done {
            return self.maybe_drained(socket).await;
        }
        Next::Continue
    }

    /// SIGTERM: advertise no models (so no proxy, old or new, routes more work here), finish
    /// what is in flight, then close.
    async fn begin_local_drain(&mut self, socket: &mut Socket) -> Next {
        tracing::info!(
            in_flight = self.active.len(),
            "graceful shutdown: finishing in-flight requests"
        );
        self.draining = true;
        self.drain_deadline = Some(Instant::now() + self.config.drain_timeout);
        let update = self.models_update(None, None);
        if send(socket, &update).await.is_err() {
            return Next::End(SessionEnd::Shutdown);
        }
        self.maybe_drained(socket).await
    }

    /// The box is about to suspend: advertise no models with `going_to_sleep` (a proxy that
    /// ignores the field stops routing here, as on shutdown; ours keeps the models listed as
    /// asleep and wakes the box for them), then close. What is in flight is abandoned: the
    /// proxy requeues what had not started, and the machine is going down anyway.
    async fn go_to_sleep(&mut self, socket: &mut Socket) -> Next {
        tracing::info!(
            in_flight = self.active.len(),
            "going to sleep: telling the proxy and disconnecting"
        );
        let update = self.models_update(None, Some(true));
        if send(socket, &update).await.is_ok() {
            close(socket, "going to sleep").await;
        }
        Next::End(SessionEnd::Asleep)
    }

    /// Closes the connection once a draining worker has nothing left in flight.
    async fn maybe_drained(&mut self, socket: &mut Socket) -> Next {
        if self.draining && self.active.is_empty() {
            tracing::info!("drained: no requests in flight");
            close(socket, "worker drained").await;
            return Next::End(disconnected(true, "drained"));
        }
        Next::Continue
    }
}

/// What a message's sending leaves the session to do: go on, or end.
fn sent(result: Result<(), ()>) -> Next {
    match result {
        Ok(()) => Next::Continue,
        Err(()) => Next::End(disconnected(true, "sending failed")),
    }
}

async fn send(socket: &mut Socket, message: &WorkerToServer) -> Result<(), ()> {
    socket
        .send(Message::Text(message.to_json().into()))
        .await
        .map_err(|_| ())
}

async fn close(socket: &mut Socket, reason: &str) {
    let frame = CloseFrame {
        code: tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode::Normal,
        reason: reason.to_string().into(),
    };
    let _ = socket.close(Some(frame)).await;
}
