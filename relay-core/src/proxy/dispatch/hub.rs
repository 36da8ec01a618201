//! The hub joins the [`Scheduler`] to the sockets: it holds the lock around the scheduler, the
//! pending requests' payloads and answer channels, and each worker connection's outbound channel,
//! and it carries out the scheduler's [`Action`]s. Nothing here waits on I/O while holding the
//! lock: sends go into unbounded channels that the socket tasks drain.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::extract::ws::Utf8Bytes;
use axum::http::StatusCode;
use bytes::Bytes;
use tokio::sync::{mpsc, watch};

use crate::proxy::dispatch::scheduler::{
    parse_worker_wire_id, request_wire_id, unusable_name, worker_wire_id, Action, AffinityCounts,
    AsleepBox, CancelOutcome, Expired, ProviderLimits, RegisterError, Scheduler, WakeCause,
    WorkerId, WorkerSnapshot,
};
use crate::proxy::dispatch::sleepers::{
    Card, Remembered, Sleeper, SleeperLimits, Sleepers, WakeOrder,
};
use crate::proxy::dispatch::telemetry::unix_ms;

// The hub is dispatch's one door for the client routes (ARCHITECTURE.md): what they name of
// dispatch — a request's placement and id, why it was refused or failed, what the dashboard
// records of it — they name here.
use crate::dialect::ApiError;
use crate::protocol::{
    CancelMessage, CancelReason, GracefulShutdownMessage, ModelStateReport, ModelsRefreshMessage,
    PingMessage, RegisterAck, RegisterMessage, RequestMessage, ResponseCompleteMessage,
    ServerToWorker, Timings, WireHeaders, BRIDGE_PROTOCOL_VERSION,
};
pub use crate::proxy::dispatch::scheduler::{
    FailReason, KnownBox, Placement, RequestId, SubmitError, Submitted, Weighed,
};
pub use crate::proxy::dispatch::telemetry::{Telemetry, TrackedRequest};

mod answers;
mod kept;
mod workers;

use answers::*;
pub use answers::{fail_error, Refused};

/// What a waiting client hears about its request.
///
/// The rare variants are boxed: the answer channel allocates slots in blocks sized by the largest
/// variant, and thousands of open streams each hold one such block.
#[derive(Debug)]
pub enum ResponseEvent {
    /// SSE bytes of a streaming answer, in order.
    Chunk(Bytes),
    /// The end: final status, headers and (for non-streaming answers) the body, and the name
    /// of the worker that answered (`None` for an upstream's answer).
    Complete(Box<ResponseCompleteMessage>, Option<Arc<str>>),
    /// The relay gave up on the request.
    Failed(Box<ApiError>),
    /// The worker died before any byte was sent; the request waits in the queue again.
    Requeued {
        /// The new queue deadline.
        queue_deadline: Instant,
    },
}

/// Sender half of a request's answer channel.
pub type EventSender = mpsc::UnboundedSender<ResponseEvent>;

/// A request's stream bytes sent into its answer channel and not yet taken out by the client's
/// side: the worker's connection adds, the waiter subtracts, and beyond
/// `max_buffered_stream_bytes` the stream is ended (the channel itself is unbounded, so that one
/// slow client never holds up the other streams of the same worker).
pub type WaitingBytes = Arc<AtomicUsize>;

/// What a worker connection's task is asked to do.
#[derive(Debug)]
pub enum Outbound {
    /// Write this frame as is.
    Frame(Utf8Bytes),
    /// Start routing answers for `request` to `events`, then write its `request` frame.
    Dispatch {
        /// The request.
        request: RequestId,
        /// Its pre-serialized `request` message.
        frame: Utf8Bytes,
        /// Where its answer goes.
        events: EventSender,
        /// Its stream bytes not yet taken by the client's side.
        waiting: WaitingBytes,
    },
    /// Stop routing answers for a cancelled request whose worker never confirmed the end.
    Forget(RequestId),
    /// Close the connection with this reason.
    Close(String),
}

/// Timing settings the hub needs.
#[derive(Debug, Clone)]
pub struct HubSettings {
    /// How long a draining worker may take before it is closed anyway.
    pub drain_timeout: Duration,
    /// Providers whose workers get clients' credentials (`forward_client_auth`).
    pub client_auth_providers: Vec<String>,
    /// How sleeping boxes are remembered and how often one is sent a packet.
    pub sleepers: SleeperLimits,
    /// Where Wake-on-LAN packets go.
    pub wake_target: std::net::SocketAddr,
}

/// How a worker's connection ended, which decides whether its box is taken for asleep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Departure {
    /// The worker closed it (close frame, end of stream, connection error).
    WorkerClosed,
    /// It went silent past the heartbeat timeout: what a box that suspends without a word
    /// looks like.
    HeartbeatLost,
    /// The proxy closed it (drain, role off, a stalled writer, shutdown).
    ProxyClosed,
}

struct Pending {
    frame: Utf8Bytes,
    /// The same frame with the client's credentials, for workers of providers that opt in;
    /// built only when some provider does and the client sent any.
    frame_with_auth: Option<Utf8Bytes>,
    events: EventSender,
    waiting: WaitingBytes,
}

struct WorkerLink {
    outbound: mpsc::UnboundedSender<Outbound>,
    /// Its provider passes clients' credentials on.
    forwards_client_auth: bool,
    /// What is needed to remember its box if it goes to sleep.
    sleep: SleepInfo,
}

/// A connected worker's box, as far as sleeping goes.
struct SleepInfo {
    name: String,
    provider: String,
    mac: Option<crate::wake::MacAddress>,
    /// The address its connection comes from.
    address: IpAddr,
    /// It registered with `sleeps_when_idle`.
    sleeps_when_idle: bool,
    /// The models it serves now (as accepted), or served before its `going_to_sleep` notice.
    models: Vec<String>,
    /// It sent `going_to_sleep`: its leaving is a sleep, whatever the way it ends.
    announced_sleep: bool,
}

struct Inner {
    scheduler: Scheduler,
    pending: HashMap<RequestId, Pending>,
    links: HashMap<WorkerId, WorkerLink>,
    /// Names of workers an admin drained: they may not rejoin until the proxy restarts (a
    /// service manager restarts a headless worker that exited after its drain, which would
    /// otherwise undo it; the published worker may reconnect too).
    drained_names: HashSet<String>,
    /// Boxes that went to sleep: their models stay listed and claimed, and requests for them
    /// wake them.
    sleepers: Sleepers,
    /// Bumped on every change of `sleepers`, for the proxy's store.
    sleepers_changed: watch::Sender<u64>,
    /// Bumped whenever a box is measured (an answer's timings, a wake), for the proxy's store.
    measured: watch::Sender<u64>,
    telemetry: Arc<Telemetry>,
}

/// Shared proxy state; one per proxy, behind an `Arc`.
pub struct Hub {
    inner: Mutex<Inner>,
    next_request: AtomicU64,
    settings: HubSettings,
    started: Instant,
    telemetry: Arc<Telemetry>,
    /// False while the node's proxy role is off: clients and workers are turned away.
    serving: AtomicBool,
}

/// A request accepted by [`Hub::submit`].
pub struct Accepted {
    /// Its id.
    pub request: RequestId,
    /// Where it went.
    pub submitted: Submitted,
    /// The end of its life, fixed at arrival and kept across requeues.
    pub deadline: Instant,
    /// Its answer.
    pub events: mpsc::UnboundedReceiver<ResponseEvent>,
    /// Its stream bytes waiting in `events`.
    pub waiting: WaitingBytes,
}

/// A worker accepted by [`Hub::register_worker`].
pub struct Joined {
    /// Its id.
    pub worker: WorkerId,
    /// The `register_ack` to send.
    pub ack: RegisterAck,
    /// Frames and dispatches for its connection task to write.
    pub outbound: mpsc::UnboundedReceiver<Outbound>,
}

/// What one client request carries to a worker.
pub struct RequestSpec {
    /// The requested model.
    pub model: String,
    /// Backend path, query string included.
    pub endpoint_path: String,
    /// Whether the client asked for a stream.
    pub is_streaming: bool,
    /// The body, untouched.
    pub body: String,
    /// Forwarded headers, without the client's credentials.
    pub headers: WireHeaders,
    /// The client's credentials ([`crate::protocol::CLIENT_AUTH_HEADERS`]): sent only to workers
    /// of providers that opt in.
    pub client_auth: WireHeaders,
    /// Conversation, client and priority, for the scheduler.
    pub placement: Placement,
}

impl Hub {
    /// A hub around `scheduler`.
    pub fn new(scheduler: Scheduler, settings: HubSettings) -> Arc<Hub> {
        let telemetry = Arc::new(Telemetry::default());
        Arc::new(Hub {
            inner: Mutex::new(Inner {
                scheduler,
                pending: HashMap::new(),
                links: HashMap::new(),
                drained_names: HashSet::new(),
                sleepers: Sleepers::new(settings.sleepers),
                sleepers_changed: watch::Sender::new(0),
                measured: watch::Sender::new(0),
                telemetry: Arc::clone(&telemetry),
            }),
            next_request: AtomicU64::new(1),
            settings,
            started: Instant::now(),
            telemetry,
            serving: AtomicBool::new(true),
        })
    }

    /// Applies new limits to `provider` from now on (see [`Scheduler::set_limits`]).
    pub fn set_limits(&self, provider: &str, limits: ProviderLimits) -> bool {
        self.lock().scheduler.set_limits(provider, limits)
    }

    /// Whether the proxy role is on.
    pub fn is_serving(&self) -> bool {
        self.serving.load(Ordering::Relaxed)
    }

    /// Turns the proxy role on or off; turning it off closes every worker connection (their
    /// running requests are requeued or failed as on any disconnect).
    pub fn set_serving(&self, serving: bool) {
        if self.serving.swap(serving, Ordering::Relaxed) && !serving {
            self.close_all_workers("the proxy role was turned off on this node");
        }
        self.telemetry.touch();
    }

    /// What the dashboard sees: worker hosts and heartbeats, request progress, totals, series.
    pub fn telemetry(&self) -> &Arc<Telemetry> {
        &self.telemetry
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // The scheduler does no I/O and is tested not to panic, and to stay consistent, under any
        // sequence of events (`any_sequence_of_events_keeps_the_state_consistent_…`); were a
        // panic to happen anyway, serving on is better than refusing every request after it.
        self.inner
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// Seconds since the hub started.
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// Accepts a client request: dispatches it, queues it, or refuses it.
    pub fn submit(&self, spec: RequestSpec) -> Result<Accepted, Refused> {
        let request = self.next_request.fetch_add(1, Ordering::Relaxed);
        // Serialize once, outside the lock; requeues resend the same frame.
        let wire = ServerToWorker::Request(RequestMessage {
            request_id: request_wire_id(request),
            model: spec.model.clone(),
            endpoint_path: spec.endpoint_path,
            is_streaming: spec.is_streaming,
            body: spec.body,
            headers: spec.headers,
            conversation: spec.placement.affinity.map(RequestMessage::conversation_of),
            side_request: spec.placement.side.then_some(true),
        });
        let frame = Utf8Bytes::from(wire.to_json());
        // A second frame only on the opt-in path, so the default one costs nothing more.
        let frame_with_auth = match wire {
            ServerToWorker::Request(mut message)
                if !self.settings.client_auth_providers.is_empty()
                    && !spec.client_auth.is_empty() =>
            {
                message.headers.extend(spec.client_auth);
                Some(Utf8Bytes::from(ServerToWorker::Request(message).to_json()))
            }
            _ => None,
        };
        let (events, receiver) = mpsc::unbounded_channel();
        let waiting = WaitingBytes::default();
        let mut inner = self.lock();
        let now = Instant::now();
        inner.forget_old_sleepers(now);
        let submitted = match inner
            .scheduler
            .submit(request, &spec.model, spec.placement, now)
        {
            Ok(submitted) => submitted,
            Err(error) => {
                drop(inner);
                return Err(Refused {
                    error: submit_error(error.clone(), &spec.model),
                    reason: error,
                });
            }
        };
        let deadline = inner
            .scheduler
            .request_deadline(request)
            .expect("a submitted request is tracked");
        inner.pending.insert(
            request,
            Pending {
                frame,
                frame_with_auth,
                events,
                waiting: waiting.clone(),
            },
        );
        match submitted {
            Submitted::Dispatched { worker, .. } => {
                inner.execute(vec![Action::Dispatch { request, worker }]);
            }
            Submitted::Queued { .. } => {
                tracing::debug!(request = %request_wire_id(request), model = %spec.model, "request queued");
                // Nothing awake serves the model, or cost routing found a sleeping box sooner.
                let wake = inner
                    .scheduler
                    .box_to_wake(request)
                    .map(|(b, cause)| (b.map(str::to_string), cause));
                let nothing_awake = !inner.scheduler.is_served(&spec.model);
                let wake = wake.or(nothing_awake.then_some((None, WakeCause::NothingAwake)));
                if let Some((only, cause)) = wake {
                    let orders = inner.sleepers.wake_for(
                        &spec.model,
                        only.as_deref(),
                        cause,
                        now,
                        unix_ms(),
                    );
                    if !orders.is_empty() {
                        inner.relay_wake_packets(&orders);
                        drop(inner);
                        self.telemetry.touch();
                        self.send_wake_packets(orders);
                    }
                }
            }
        }
        Ok(Accepted {
            request,
            submitted,
            deadline,
            events: receiver,
            waiting,
        })
    }

    /// Sends the magic packets off the lock, in a task (the hub does no I/O itself).
    fn send_wake_packets(&self, orders: Vec<WakeOrder>) {
        let target = self.settings.wake_target;
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            for order in orders {
                match crate::wake::send_magic_packet(order.mac, target).await {
                    Ok(()) => {
                        tracing::info!(name = %order.name, mac = %order.mac, %target, cause = order.cause.as_str(), "Wake-on-LAN packet sent")
                    }
                    Err(error) => {
                        tracing::warn!(name = %order.name, mac = %order.mac, %target, "Wake-on-LAN packet not sent: {error}")
                    }
                }
            }
        });
    }

    /// The name worker `worker` registered with (as the scheduler keeps it, cleaned).
    pub fn worker_name(&self, worker: WorkerId) -> Option<String> {
        self.lock()
            .scheduler
            .worker_name(worker)
            .map(str::to_string)
    }

    /// Starts tracking a request that an upstream serves instead of a worker, so the dashboard
    /// and the metrics count it like any other (its id comes from the same sequence).
    pub fn track_upstream(
        &self,
        model: &str,
        streaming: bool,
        upstream: &str,
        key: Cow<'static, str>,
    ) -> TrackedRequest {
        let request = self.next_request.fetch_add(1, Ordering::Relaxed);
        self.telemetry
            .begin_via(request, model, streaming, Some(upstream), key)
    }

    /// The client is gone or timed out: unqueue the request, or tell its worker to stop and hold
    /// the worker's slot until it confirms or the grace period ends.
    pub fn cancel(self: &Arc<Self>, request: RequestId, reason: CancelReason) {
        let mut inner = self.lock();
        let outcome = inner.scheduler.cancel(request);
        if outcome != CancelOutcome::Nothing {
            self.telemetry.cancelled(reason);
        }
        match outcome {
            CancelOutcome::RemovedFromQueue => {
                inner.pending.remove(&request);
                tracing::info!(request = %request_wire_id(request), reason = reason.as_str(), "queued request cancelled");
            }
            CancelOutcome::SendCancel { worker } => {
                inner.pending.remove(&request);
                let frame = ServerToWorker::Cancel(CancelMessage {
                    request_id: request_wire_id(request),
                    reason,
                })
                .to_json();
                inner.send(worker, Outbound::Frame(frame.into()));
                // The slot is free for the next queued request at once, as the seeds'
                // architecture says: a published worker never reports back after a cancel, and
                // ours stops the request before it reads the next frame. What the worker may
                // still send for the request is dropped.
                let actions = inner.scheduler.release_cancelled(request);
                inner.send(worker, Outbound::Forget(request));
                inner.execute(actions);
                drop(inner);
                tracing::info!(request = %request_wire_id(request), worker = %worker_wire_id(worker), reason = reason.as_str(), "cancel sent to worker; its slot is free");
            }
            CancelOutcome::Nothing => {}
        }
    }

    /// The waiter's queue deadline passed: if the request was still queued it is gone now, and
    /// this is the 504 to answer, naming the model it waited for.
    pub fn expire_queued(&self, request: RequestId) -> Option<ApiError> {
        let mut inner = self.lock();
        let mut actions = Vec::new();
        // A request that waited for a box to wake in vain takes an awake one or queues on.
        if inner
            .scheduler
            .stop_waiting_for_wake(request, Instant::now(), &mut actions)
        {
            inner.execute(actions);
            return None;
        }
        let expired = inner.scheduler.expire_queued(request, Instant::now())?;
        inner.pending.remove(&request);
        inner.release_idle_capacity();
        let (sleepers, served) = if expired.served {
            (Vec::new(), Vec::new())
        } else {
            let served = inner
                .scheduler
                .models()
                .into_iter()
                .map(|(m, _)| m)
                .collect();
            (inner.sleepers.gave_up(&expired.model), served)
        };
        drop(inner);
        if !sleepers.is_empty() {
            self.telemetry.touch();
        }
        tracing::warn!(request = %request_wire_id(request), model = %expired.model, served = expired.served, asleep = ?sleepers, "queue timeout");
        Some(queue_timeout_error(&expired, &sleepers, &served))
    }

    /// For each request, where it is: `None` untracked, `Some(None)` queued, `Some(Some(id))`
    /// running on the worker with that wire id.
    pub fn assignments(&self, requests: &[RequestId]) -> Vec<Option<Option<String>>> {
        let inner = self.lock();
        requests
            .iter()
            .map(|r| {
                inner
                    .scheduler
                    .assignment(*r)
                    .map(|w| w.map(worker_wire_id))
            })
            .collect()
    }

    /// The worker finished `request`, in `timings` when it said how fast; false if it was not
    /// running there (duplicate or stray).
    pub fn finish(&self, worker: WorkerId, request: RequestId, timings: Option<&Timings>) -> bool {
        let mut inner = self.lock();
        if let Some(timings) = timings {
            inner.scheduler.learn(worker, request, timings);
            inner.measured.send_modify(|generation| *generation += 1);
        }
        let mut actions = Vec::new();
        let known = inner.scheduler.finish(worker, request, &mut actions);
        if known {
            inner.pending.remove(&request);
        }
        inner.execute(actions);
        inner.release_idle_capacity();
        known
    }

    /// The worker's attempt at `request` failed retryably before any output: requeue it (or fail
    /// it if it may not be). False if it was not running on that worker.
    pub fn retry(&self, worker: WorkerId, request: RequestId) -> bool {
        let mut inner = self.lock();
        let mut actions = Vec::new();
        let known = inner
            .scheduler
            .retry(worker, request, Instant::now(), &mut actions);
        inner.execute(actions);
        known
    }

    /// The worker refused `request` as beyond its `max_concurrent`: requeue it, the worker
    /// counted full until it reports its load ([`Scheduler::refused_as_busy`]).
    pub fn refused_as_busy(&self, worker: WorkerId, request: RequestId) -> bool {
        let mut inner = self.lock();
        let mut actions = Vec::new();
        let known = inner
            .scheduler
            .refused_as_busy(worker, request, Instant::now(), &mut actions);
        inner.execute(actions);
        known
    }

    /// The first byte of `request`'s answer went to its client: it may no longer be requeued.
    pub fn mark_started(&self, request: RequestId) {
        self.lock().scheduler.mark_started(request);
    }

    /// Requests still running on workers.
    pub fn in_flight(&self) -> usize {
        self.lock().scheduler.in_flight_count()
    }

    /// Connected workers and queued requests, for `/health`.
    pub fn counts(&self) -> (usize, usize) {
        let inner = self.lock();
        (
            inner.scheduler.worker_count(),
            inner.scheduler.queue_depth(),
        )
    }

    /// Requests the hub still tracks; zero when idle (used to check nothing leaks).
    pub fn tracked_requests(&self) -> usize {
        let inner = self.lock();
        inner.scheduler.tracked_requests().max(inner.pending.len())
    }

    /// Whether the workers claim `model` now: one serves it, a provider lists it, or its last
    /// worker left moments ago. Aliases and upstreams take only models nobody claims; any other
    /// model still queues for a worker to announce it.
    pub fn serves(&self, model: &str) -> bool {
        self.lock().scheduler.is_claimed(model, Instant::now())
    }

    /// Routable models with their providers: the connected workers', then those only
    /// sleeping boxes serve (a request for them wakes a box).
    pub fn models(&self) -> Vec<(String, String)> {
        let mut inner = self.lock();
        inner.forget_old_sleepers(Instant::now());
        let mut models = inner.scheduler.models();
        for (provider, model) in inner.sleepers.models() {
            if !models.iter().any(|(listed, _)| *listed == model) {
                models.push((model, provider));
            }
        }
        models.sort();
        models
    }

    /// The sleeping boxes, oldest sleeper first.
    pub fn sleepers(&self) -> Vec<Sleeper> {
        let mut inner = self.lock();
        inner.forget_old_sleepers(Instant::now());
        inner.sleepers.boxes().to_vec()
    }

    /// Every connected worker.
    pub fn workers(&self) -> Vec<WorkerSnapshot> {
        self.lock().scheduler.workers()
    }

    /// Queue depth per provider.
    pub fn queue_depths(&self) -> Vec<(String, usize)> {
        self.lock().scheduler.queue_depths()
    }

    /// Why each request went where it runs, with what cost routing weighed where it chose
    /// (`None`: queued, or untracked).
    pub fn reasons(&self, requests: &[RequestId]) -> Vec<Option<(&'static str, Option<Weighed>)>> {
        let inner = self.lock();
        requests
            .iter()
            .map(|r| {
                let reason = inner.scheduler.reason_of(*r)?;
                Some((reason.as_str(), inner.scheduler.weighed_of(*r).cloned()))
            })
            .collect()
    }

    /// Placements so far, by why they went where they did.
    pub fn reason_counts(&self) -> Vec<(&'static str, u64)> {
        let inner = self.lock();
        inner
            .scheduler
            .reason_counts()
            .into_iter()
            .map(|(reason, n)| (reason.as_str(), n))
            .collect()
    }

    /// Wake attempts begun so far, by cause.
    pub fn wake_counts(&self) -> Vec<(&'static str, u64)> {
        let inner = self.lock();
        let counts = inner.sleepers.attempt_counts().into_iter();
        counts.map(|(cause, n)| (cause.as_str(), n)).collect()
    }

    /// Conversation affinity placements so far (see [`Scheduler::affinity_counts`]). Counted
    /// inside the scheduler, under the lock every placement already takes, so the hot path pays
    /// three plain increments and no atomics.
    pub fn affinity_counts(&self) -> AffinityCounts {
        self.lock().scheduler.affinity_counts()
    }
}

/// Maps that grew past this many slots are shrunk once they empty.
const IDLE_SHRINK_THRESHOLD: usize = 1024;

/// Connected workers on one sleeping box's LAN that relay its magic packet at most: a proxy
/// elsewhere (a VPS) cannot broadcast onto that LAN, and one or two senders there suffice.
const MAX_WAKE_RELAYS: usize = 2;

impl Inner {
    /// Asks up to [`MAX_WAKE_RELAYS`] connected workers on each box's LAN (by the address
    /// their connections come from, see [`crate::wake::same_lan`]) to send its magic packet
    /// too, in an extension field of `ping` that workers without it ignore.
    fn relay_wake_packets(&self, orders: &[WakeOrder]) {
        let mut asked: HashMap<WorkerId, Vec<String>> = HashMap::new();
        for order in orders {
            let Some(address) = order.address else {
                continue;
            };
            let relays = self
                .links
                .iter()
                .filter(|(_, link)| crate::wake::same_lan(link.sleep.address, address))
                .take(MAX_WAKE_RELAYS);
            for (worker, _) in relays {
                asked
                    .entry(*worker)
                    .or_default()
                    .push(order.mac.to_string());
            }
        }
        for (worker, macs) in asked {
            tracing::info!(worker = %worker_wire_id(worker), cards = ?macs, "asking a worker on the sleeping box's LAN to send its Wake-on-LAN packet");
            let ping = ServerToWorker::Ping(PingMessage {
                timestamp_unix_ms: None,
                paused_requests: None,
                wake_macs: Some(macs),
            });
            if let Some(link) = self.links.get(&worker) {
                let _ = link
                    .outbound
                    .send(Outbound::Frame(Utf8Bytes::from(ping.to_json())));
            }
        }
    }

    /// Tells the scheduler which models sleeping boxes serve, so requests for them queue at
    /// their provider (and aliases and upstreams leave them alone).
    fn sync_asleep(&mut self) {
        let boxes: Vec<AsleepBox> = (self.sleepers.boxes().iter())
            .map(|s| AsleepBox {
                provider: s.provider.clone(),
                name: s.name.clone(),
                models: s.models.clone(),
            })
            .collect();
        self.scheduler.set_asleep(&boxes);
        // The proxy stores them on every change, so a restart still knows them.
        self.sleepers_changed
            .send_modify(|generation| *generation += 1);
    }

    fn forget_old_sleepers(&mut self, now: Instant) {
        if self.sleepers.forget_expired(now) {
            self.sync_asleep();
        }
    }
    /// After a burst, give back the capacity the request maps grew to: a proxy idle after
    /// 10,000 streams should use the memory of an idle proxy.
    fn release_idle_capacity(&mut self) {
        if self.pending.is_empty() && self.pending.capacity() > IDLE_SHRINK_THRESHOLD {
            self.pending.shrink_to_fit();
            self.scheduler.shrink_if_idle();
        }
    }

    fn send(&self, worker: WorkerId, message: Outbound) {
        if let Some(link) = self.links.get(&worker) {
            // A closed channel means the connection task is exiting; it will call worker_gone,
            // which requeues whatever this message was about.
            let _ = link.outbound.send(message);
        }
    }

    fn execute(&mut self, actions: Vec<Action>) {
        for action in actions {
            match action {
                Action::Dispatch { request, worker } => {
                    let Some(pending) = self.pending.get(&request) else {
                        continue;
                    };
                    tracing::debug!(request = %request_wire_id(request), worker = %worker_wire_id(worker), "request dispatched");
                    self.telemetry.touch();
                    let with_auth = self
                        .links
                        .get(&worker)
                        .is_some_and(|link| link.forwards_client_auth);
                    let frame = match (&pending.frame_with_auth, with_auth) {
                        (Some(frame), true) => frame.clone(),
                        _ => pending.frame.clone(),
                    };
                    self.send(
                        worker,
                        Outbound::Dispatch {
                            request,
                            frame,
                            events: pending.events.clone(),
                            waiting: pending.waiting.clone(),
                        },
                    );
                }
                Action::Requeued {
                    request,
                    queue_deadline,
                } => {
                    tracing::info!(request = %request_wire_id(request), "request requeued");
                    self.telemetry.requeued();
                    if let Some(pending) = self.pending.get(&request) {
                        let _ = pending
                            .events
                            .send(ResponseEvent::Requeued { queue_deadline });
                    }
                }
                Action::Fail { request, reason } => {
                    if reason == FailReason::RequeueExhausted {
                        tracing::warn!(request = %request_wire_id(request), "requeue exhausted");
                    }
                    if let Some(pending) = self.pending.remove(&request) {
                        let _ = pending
                            .events
                            .send(ResponseEvent::Failed(Box::new(fail_error(reason))));
                    }
                }
                Action::CloseDrained { worker } => {
                    tracing::info!(worker = %worker_wire_id(worker), "worker drained");
                    self.telemetry.touch();
                    self.send(worker, Outbound::Close("worker drained".to_string()));
                }
            }
        }
    }
}
