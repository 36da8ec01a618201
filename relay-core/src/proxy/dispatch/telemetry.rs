//! What the dashboard shows that routing does not need: where each worker connects from and its
//! heartbeat, each request's time to first byte and token count, totals, and a per-second series
//! for the live charts.
//!
//! The same observations feed `/metrics` (`metrics.rs`): ended requests add up in a [`Ledger`],
//! and requeues, cancels, worker joins and failed worker authentications in counters.
//!
//! Kept apart from the scheduler on purpose: the hot path only touches atomics here (a chunk adds
//! to a counter), and the request map has its own lock, taken once when a request arrives and
//! once when it ends (which is also when the ledger counts it).

mod hardware;
mod ledger;

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

use crate::protocol::{CancelReason, HardwareReport, ModelStateReport, TokenCounts};
use crate::proxy::dispatch::scheduler::RequestId;
use crate::store::usage::{Outcome as UsageOutcome, UsageLog, UsageRecord};
pub use hardware::{vram_percent, BoxHistory, WorkerBox, HISTORY_POINTS};
pub use ledger::{
    Histogram, Latency, Ledger, Outcome, Tokens, MAX_KEY_LABELS, MAX_LABEL_BYTES, MAX_MODEL_LABELS,
    OTHER,
};

/// The `key` label (and usage account) of requests that came without a client API key.
pub const ANONYMOUS_KEY: &str = crate::store::usage::ANONYMOUS;

/// Points kept for the charts: five minutes at one a second.
pub const SERIES_POINTS: usize = 300;

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

/// One request from arrival to its end.
#[derive(Debug)]
pub struct RequestRecord {
    /// The requested model (after aliasing).
    pub model: String,
    /// Whether the client asked for a stream.
    pub streaming: bool,
    /// When it arrived.
    pub arrived: Instant,
    /// The upstream serving it (`[[proxy.upstreams]]` name), for requests no worker runs.
    pub upstream: Option<String>,
    /// The client key it came with, as the metrics' `key` label shows it ([`ANONYMOUS_KEY`]
    /// without one). Borrowed for the constant, so an anonymous request allocates nothing more.
    pub key: Cow<'static, str>,
    /// Nanoseconds from arrival to the answer's first byte; 0 until then.
    first_byte_nanos: AtomicU64,
    /// Output tokens so far.
    tokens: AtomicU64,
}

impl RequestRecord {
    /// Time to first byte, once the answer started.
    pub fn ttft(&self) -> Option<Duration> {
        match self.first_byte_nanos.load(Ordering::Relaxed) {
            0 => None,
            nanos => Some(Duration::from_nanos(nanos)),
        }
    }

    /// Output tokens so far.
    pub fn tokens(&self) -> u64 {
        self.tokens.load(Ordering::Relaxed)
    }
}

/// Where a worker connects from and how its heartbeat looks.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerRecord {
    /// The peer address of its connection.
    pub host: String,
    /// When it registered.
    pub connected_unix_ms: u64,
    /// The last ping → pong round trip.
    pub heartbeat: Option<Duration>,
    /// What its pongs said of its box (our workers'; a published worker says nothing).
    pub reported: WorkerBox,
}

/// Running totals since start.
#[derive(Debug, Default)]
struct Totals {
    requests: AtomicU64,
    errors: AtomicU64,
    tokens: AtomicU64,
}

/// Totals as numbers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct TotalsSnapshot {
    /// Requests that ended (answered or failed).
    pub requests: u64,
    /// Requests that ended with a relay error or a backend status of 400 or more.
    pub errors: u64,
    /// Output tokens.
    pub tokens: u64,
}

/// The charts' data, oldest point first.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct Series {
    /// Seconds between points.
    pub interval_secs: u64,
    /// Each point's time.
    pub unix_secs: Vec<u64>,
    /// Requests ended per second.
    pub requests_per_sec: Vec<u64>,
    /// Output tokens per second.
    pub tokens_per_sec: Vec<u64>,
    /// Errors per second.
    pub errors_per_sec: Vec<u64>,
    /// Queued requests at the point.
    pub queue_depth: Vec<u64>,
}

#[derive(Debug, Clone, Copy)]
struct Point {
    unix_secs: u64,
    requests: u64,
    tokens: u64,
    errors: u64,
    queue_depth: u64,
}

#[derive(Debug, Default)]
struct SeriesState {
    points: VecDeque<Point>,
    last_totals: TotalsSnapshot,
}

/// Requests in flight and what the ended ones add up to, under one lock: a request's end
/// leaves the one and counts in the other in the same critical section.
#[derive(Debug, Default)]
struct Requests {
    live: HashMap<RequestId, Arc<RequestRecord>>,
    ended: Ledger,
}

/// Events counted for `/metrics` that are not requests ending.
#[derive(Debug, Default)]
struct Counters {
    requeues: AtomicU64,
    /// One per [`CancelReason`], in [`CANCEL_REASONS`] order.
    cancels: [AtomicU64; CANCEL_REASONS.len()],
    worker_auth_failures: AtomicU64,
    /// Requests refused for a missing, wrong or revoked client API key.
    client_auth_failures: AtomicU64,
    worker_registrations: AtomicU64,
}

/// Every cancel reason, in the order of [`CountersSnapshot::cancels`].
pub const CANCEL_REASONS: [CancelReason; 6] = [
    CancelReason::ClientDisconnect,
    CancelReason::Timeout,
    CancelReason::GracefulShutdown,
    CancelReason::WorkerDisconnect,
    CancelReason::RequeueExhausted,
    CancelReason::ServerShutdown,
];

/// The counters as numbers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CountersSnapshot {
    /// Requests put back in the queue after their worker failed or left before answering.
    pub requeues: u64,
    /// Cancels, per reason in [`CANCEL_REASONS`] order.
    pub cancels: [u64; CANCEL_REASONS.len()],
    /// Worker connections refused for a missing or wrong secret.
    pub worker_auth_failures: u64,
    /// Requests refused for a missing, wrong or revoked client API key.
    pub client_auth_failures: u64,
    /// Workers that registered (each reconnect counts).
    pub worker_registrations: u64,
}

/// The proxy's observations; one per hub.
#[derive(Debug, Default)]
pub struct Telemetry {
    /// Bumped on every change the dashboard shows; the live feed sends when it moves.
    version: AtomicU64,
    /// Bumped when a worker joins or leaves: what the node's watch over its workers waits on.
    roster: watch::Sender<u64>,
    requests: Mutex<Requests>,
    workers: Mutex<HashMap<String, WorkerRecord>>,
    totals: Totals,
    counters: Counters,
    series: Mutex<SeriesState>,
    /// Where finished requests are accounted, once the proxy's database is open.
    usage: std::sync::OnceLock<UsageLog>,
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Telemetry is never worth a panic; a poisoned map is still a usable map.
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

impl Telemetry {
    /// Something the dashboard shows changed.
    pub fn touch(&self) {
        self.version.fetch_add(1, Ordering::Relaxed);
    }

    /// A number that changes whenever something the dashboard shows changed.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Relaxed)
    }

    /// A request was accepted for a worker; the returned handle records its progress and end.
    pub fn begin(
        self: &Arc<Self>,
        request: RequestId,
        model: &str,
        streaming: bool,
        key: Cow<'static, str>,
    ) -> TrackedRequest {
        self.begin_via(request, model, streaming, None, key)
    }

    /// A request accepted for `upstream` (or a worker, with `None`), from client key `key`.
    pub fn begin_via(
        self: &Arc<Self>,
        request: RequestId,
        model: &str,
        streaming: bool,
        upstream: Option<&str>,
        key: Cow<'static, str>,
    ) -> TrackedRequest {
        let record = Arc::new(RequestRecord {
            model: model.to_string(),
            streaming,
            arrived: Instant::now(),
            upstream: upstream.map(str::to_string),
            key,
            first_byte_nanos: AtomicU64::new(0),
            tokens: AtomicU64::new(0),
        });
        locked(&self.requests)
            .live
            .insert(request, Arc::clone(&record));
        self.touch();
        TrackedRequest {
            telemetry: Arc::clone(self),
            request,
            record,
            failed: false,
            status: None,
            input_tokens: 0,
            delivered: false,
            worker: None,
            claimed: true,
        }
    }

    /// A request the relay answered itself before any worker or upstream took it (bad input,
    /// unknown model, full queue, ...): counted for `/metrics` only. `model` is `None` when the
    /// proxy does not route it, so names that clients make up do not become labels.
    pub fn refused(&self, model: Option<&str>, key: &str, status: u16) {
        locked(&self.requests).ended.record(Outcome {
            model,
            key,
            status,
            tokens: Tokens::default(),
            ttft: None,
            duration: None,
        });
    }

    /// What the ended requests add up to.
    pub fn ledger(&self) -> Ledger {
        locked(&self.requests).ended.clone()
    }

    /// Requests accepted and not yet ended (queued ones included).
    pub fn in_flight(&self) -> usize {
        locked(&self.requests).live.len()
    }

    /// A request goes back to the queue.
    pub fn requeued(&self) {
        self.counters.requeues.fetch_add(1, Ordering::Relaxed);
    }

    /// A request was cancelled for `reason`.
    pub fn cancelled(&self, reason: CancelReason) {
        let index = CANCEL_REASONS
            .iter()
            .position(|r| *r == reason)
            .expect("every reason is listed");
        self.counters.cancels[index].fetch_add(1, Ordering::Relaxed);
    }

    /// A request was refused for its client API key.
    pub fn client_auth_failed(&self) {
        self.counters
            .client_auth_failures
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Accounts every finished request in `usage` from now on.
    pub fn account_usage_in(&self, usage: UsageLog) {
        let _ = self.usage.set(usage);
    }

    /// A worker presented no secret or a wrong one.
    pub fn worker_auth_failed(&self) {
        self.counters
            .worker_auth_failures
            .fetch_add(1, Ordering::Relaxed);
    }

    /// The counters now.
    pub fn counters(&self) -> CountersSnapshot {
        let c = &self.counters;
        CountersSnapshot {
            requeues: c.requeues.load(Ordering::Relaxed),
            cancels: std::array::from_fn(|i| c.cancels[i].load(Ordering::Relaxed)),
            worker_auth_failures: c.worker_auth_failures.load(Ordering::Relaxed),
            client_auth_failures: c.client_auth_failures.load(Ordering::Relaxed),
            worker_registrations: c.worker_registrations.load(Ordering::Relaxed),
        }
    }

    /// Requests in flight, oldest first.
    pub fn requests(&self) -> Vec<(RequestId, Arc<RequestRecord>)> {
        let mut all: Vec<(RequestId, Arc<RequestRecord>)> = locked(&self.requests)
            .live
            .iter()
            .map(|(id, record)| (*id, Arc::clone(record)))
            .collect();
        all.sort_unstable_by_key(|(id, _)| *id);
        all
    }

    /// A worker registered from `host`.
    pub fn worker_joined(&self, wire_id: &str, host: IpAddr) {
        locked(&self.workers).insert(
            wire_id.to_string(),
            WorkerRecord {
                host: host.to_string(),
                connected_unix_ms: unix_ms(),
                heartbeat: None,
                reported: WorkerBox::default(),
            },
        );
        self.counters
            .worker_registrations
            .fetch_add(1, Ordering::Relaxed);
        self.touch();
        self.roster.send_modify(|n| *n += 1);
    }

    /// A worker's connection ended.
    pub fn worker_left(&self, wire_id: &str) {
        locked(&self.workers).remove(wire_id);
        self.touch();
        self.roster.send_modify(|n| *n += 1);
    }

    /// A worker's models changed (`models_update`): what a name goes to may have too.
    pub fn models_changed(&self) {
        self.roster.send_modify(|n| *n += 1);
    }

    /// Changes whenever a worker joins or leaves or changes its models (then read
    /// [`Telemetry::worker`] and the hub's workers): waiting on it costs nothing while the roster
    /// stays the same.
    pub fn roster_changes(&self) -> watch::Receiver<u64> {
        self.roster.subscribe()
    }

    /// A worker answered a ping after `round_trip`.
    pub fn heartbeat(&self, wire_id: &str, round_trip: Duration) {
        if let Some(record) = locked(&self.workers).get_mut(wire_id) {
            record.heartbeat = Some(round_trip);
        }
    }

    /// A worker's pong told of its box (either part may be absent: unchanged).
    pub fn worker_box(
        &self,
        wire_id: &str,
        hardware: Option<HardwareReport>,
        model_states: Option<Vec<ModelStateReport>>,
    ) {
        if hardware.is_none() && model_states.is_none() {
            return;
        }
        if let Some(record) = locked(&self.workers).get_mut(wire_id) {
            record.reported.record(hardware, model_states, unix_ms());
        }
        self.touch();
    }

    /// What is known about a connected worker.
    pub fn worker(&self, wire_id: &str) -> Option<WorkerRecord> {
        locked(&self.workers).get(wire_id).cloned()
    }

    /// Totals since start.
    pub fn totals(&self) -> TotalsSnapshot {
        TotalsSnapshot {
            requests: self.totals.requests.load(Ordering::Relaxed),
            errors: self.totals.errors.load(Ordering::Relaxed),
            tokens: self.totals.tokens.load(Ordering::Relaxed),
        }
    }

    /// Adds one chart point: what ended since the last point, and the queue depth now.
    pub fn sample(&self, unix_secs: u64, queue_depth: usize) {
        let totals = self.totals();
        let mut series = locked(&self.series);
        let last = series.last_totals;
        series.points.push_back(Point {
            unix_secs,
            requests: totals.requests - last.requests,
            tokens: totals.tokens - last.tokens,
            errors: totals.errors - last.errors,
            queue_depth: queue_depth as u64,
        });
        if series.points.len() > SERIES_POINTS {
            series.points.pop_front();
        }
        series.last_totals = totals;
        drop(series);
        self.touch();
    }

    /// The chart points.
    pub fn series(&self) -> Series {
        let series = locked(&self.series);
        let column = |f: fn(&Point) -> u64| series.points.iter().map(f).collect();
        Series {
            interval_secs: 1,
            unix_secs: column(|p| p.unix_secs),
            requests_per_sec: column(|p| p.requests),
            tokens_per_sec: column(|p| p.tokens),
            errors_per_sec: column(|p| p.errors),
            queue_depth: column(|p| p.queue_depth),
        }
    }
}

/// A request being watched; dropping it records the request's end.
#[derive(Debug)]
pub struct TrackedRequest {
    telemetry: Arc<Telemetry>,
    request: RequestId,
    record: Arc<RequestRecord>,
    failed: bool,
    /// The status the answer ended with, once known (see [`TrackedRequest::status`]).
    status: Option<u16>,
    /// Prompt tokens, from the backend's usage.
    input_tokens: u64,
    /// The stream's `data: [DONE]` went out: the client has the whole answer.
    delivered: bool,
    /// The worker that answered.
    worker: Option<Arc<str>>,
    /// Some worker or provider claimed the model's name when the request arrived. A request
    /// for a name nobody claims that nobody then served counts under `other` in `/metrics`
    /// and usage: a client inventing names must not create a label or a usage row per name.
    claimed: bool,
}

/// The status a request counts under when its client went away before the answer started:
/// nginx's "client closed request", the usual choice of HTTP servers and dashboards.
pub const CLIENT_CLOSED_STATUS: u16 = 499;

/// The status of a stream: its headers went out with it.
const STREAM_STATUS: u16 = 200;

impl TrackedRequest {
    /// Bytes of the answer are about to reach the client; SSE `data:` lines count as tokens
    /// until the backend's own count arrives at the end. They count in the totals at once, so
    /// the tokens/s chart moves while a long answer streams, not in one jump at its end.
    pub fn chunk(&mut self, bytes: &[u8]) {
        self.first_byte();
        let (events, done) = count_data_lines(bytes);
        self.delivered |= done;
        if events > 0 {
            self.record.tokens.fetch_add(events, Ordering::Relaxed);
            self.telemetry
                .totals
                .tokens
                .fetch_add(events, Ordering::Relaxed);
        }
    }

    /// Whether a worker or provider claimed the model's name on arrival (see the field).
    pub fn name_claimed(mut self, claimed: bool) -> Self {
        self.claimed = claimed;
        self
    }

    /// The model name to count this request under: its own when it was claimed or served,
    /// else none (it counts as `other`).
    fn counted_model(&self) -> Option<&str> {
        let served =
            self.worker.is_some() || self.record.upstream.is_some() || self.record.ttft().is_some();
        (self.claimed || served).then_some(self.record.model.as_str())
    }

    /// The answer is complete, with the backend's status and usage.
    /// From `worker` (`None` for an upstream's answer: the record names the upstream).
    pub fn complete(&mut self, status: u16, usage: Option<&TokenCounts>, worker: Option<Arc<str>>) {
        self.first_byte();
        self.status = Some(status);
        self.worker = worker;
        if let Some(tokens) = usage.and_then(|u| u.prompt_tokens) {
            self.input_tokens = u64::from(tokens);
        }
        if let Some(tokens) = usage.and_then(|u| u.completion_tokens) {
            // The backend's count replaces the estimate, in the totals too.
            let counted = self
                .record
                .tokens
                .swap(u64::from(tokens), Ordering::Relaxed);
            let totals = &self.telemetry.totals.tokens;
            match u64::from(tokens).checked_sub(counted) {
                Some(more) => totals.fetch_add(more, Ordering::Relaxed),
                None => totals.fetch_sub(counted - u64::from(tokens), Ordering::Relaxed),
            };
        }
        if status >= 400 {
            self.failed = true;
        }
    }

    /// The relay answered with an error of `status` instead of the backend (mid-stream: an
    /// error event; the request counts under the error's status, not the stream's 200).
    pub fn fail(&mut self, status: u16) {
        self.failed = true;
        self.status = Some(status);
    }

    /// The HTTP status the client got: the answer's or the relay's error's; for a stream the
    /// client left, the 200 its headers carried (a client that reads a stream to its end
    /// often closes before the relay sees the worker's `response_complete`); 499 if the client
    /// left before any byte.
    fn status(&self) -> u16 {
        match (self.status, self.record.ttft()) {
            (Some(status), _) => status,
            (None, Some(_)) => STREAM_STATUS,
            (None, None) => CLIENT_CLOSED_STATUS,
        }
    }

    /// What usage to account for this request, now that it ended: an answer with a status
    /// (the backend's or the relay's error) is `ok` or `error`; one without (the client left
    /// first) is `cancelled`.
    fn usage_record(&self) -> UsageRecord {
        let record = &self.record;
        let outcome = match self.status {
            _ if self.failed => UsageOutcome::Error,
            Some(status) if status >= 400 => UsageOutcome::Error,
            Some(_) => UsageOutcome::Ok,
            None => UsageOutcome::Cancelled,
        };
        UsageRecord {
            at: unix_ms() as i64,
            key: record.key.clone(),
            model: self
                .counted_model()
                .unwrap_or(crate::store::usage::OTHER_MODEL)
                .to_string(),
            worker: match (&self.worker, &record.upstream) {
                (Some(worker), _) => worker.to_string(),
                (None, Some(upstream)) => upstream.clone(),
                (None, None) => String::new(),
            },
            outcome,
            status: self.status(),
            input_tokens: self.input_tokens,
            output_tokens: record.tokens(),
            ttft_ms: record.ttft().map(|t| t.as_millis() as u64),
            duration_ms: record.arrived.elapsed().as_millis() as u64,
        }
    }

    /// Whether the stream's `data: [DONE]` went out to the client (OpenAI streams end with it).
    pub fn delivered(&self) -> bool {
        self.delivered
    }

    /// The telemetry it reports to.
    pub fn telemetry(&self) -> &Arc<Telemetry> {
        &self.telemetry
    }

    fn first_byte(&self) {
        if self.record.first_byte_nanos.load(Ordering::Relaxed) == 0 {
            // At least 1 ns, so "started" never reads as "not yet".
            let nanos = (self.record.arrived.elapsed().as_nanos() as u64).max(1);
            self.record.first_byte_nanos.store(nanos, Ordering::Relaxed);
            self.telemetry.touch();
        }
    }
}

impl Drop for TrackedRequest {
    fn drop(&mut self) {
        let telemetry = &self.telemetry;
        let record = &self.record;
        let ttft = record.ttft().filter(|_| record.streaming);
        let outcome = Outcome {
            model: self.counted_model(),
            key: &record.key,
            status: self.status(),
            tokens: Tokens {
                input: self.input_tokens,
                output: record.tokens(),
            },
            ttft,
            duration: Some(record.arrived.elapsed()),
        };
        let mut requests = locked(&telemetry.requests);
        requests.live.remove(&self.request);
        requests.ended.record(outcome);
        drop(requests);
        if let Some(usage) = telemetry.usage.get() {
            usage.record(self.usage_record());
        }
        telemetry.totals.requests.fetch_add(1, Ordering::Relaxed);
        if self.failed {
            telemetry.totals.errors.fetch_add(1, Ordering::Relaxed);
        }
        telemetry.touch();
    }
}

/// SSE events in `bytes` that carry data (a chat stream sends about one per token), not counting
/// the `[DONE]` terminator; and whether that terminator is among them (found in the same pass).
fn count_data_lines(bytes: &[u8]) -> (u64, bool) {
    let mut count = 0;
    let mut done = false;
    let mut at_line_start = true;
    for (i, byte) in bytes.iter().enumerate() {
        if at_line_start && bytes[i..].starts_with(b"data:") {
            if bytes[i + 5..].trim_ascii_start().starts_with(b"[DONE]") {
                done = true;
            } else {
                count += 1;
            }
        }
        at_line_start = *byte == b'\n';
    }
    (count, done)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ANONYMOUS: Cow<'static, str> = Cow::Borrowed(ANONYMOUS_KEY);

    #[test]
    fn data_lines_are_counted_and_done_is_not() {
        let chunk = b"data: {\"a\":1}\n\ndata: {\"a\":2}\n\nevent: x\ndata:{}\n\ndata: [DONE]\n\n";
        assert_eq!(count_data_lines(chunk), (3, true));
        assert_eq!(count_data_lines(b": keep-alive\n\n"), (0, false));
        assert_eq!(count_data_lines(b"xdata: no\n"), (0, false));
        assert_eq!(
            count_data_lines(b"data: {\"a\":\"[DONE]\"}\n\n"),
            (1, false)
        );
    }

    #[test]
    fn a_request_is_listed_until_its_handle_drops_then_counted() {
        let telemetry = Arc::new(Telemetry::default());
        let before = telemetry.version();
        let mut tracked = telemetry.begin(7, "m", true, ANONYMOUS);
        assert!(!tracked.delivered());
        assert!(telemetry.version() > before);
        assert_eq!(telemetry.requests().len(), 1);
        assert!(telemetry.requests()[0].1.ttft().is_none());
        tracked.chunk(b"data: {}\n\ndata: {}\n\n");
        assert!(!tracked.delivered());
        tracked.chunk(b"data: [DONE]\n\n");
        assert!(tracked.delivered(), "the client has the whole stream");
        let record = Arc::clone(&telemetry.requests()[0].1);
        assert!(record.ttft().is_some());
        assert_eq!(record.tokens(), 2);
        assert_eq!(
            telemetry.totals().tokens,
            2,
            "streamed tokens count while the answer streams"
        );
        tracked.complete(
            200,
            Some(&TokenCounts {
                completion_tokens: Some(5),
                ..TokenCounts::default()
            }),
            None,
        );
        drop(tracked);
        assert!(telemetry.requests().is_empty());
        assert_eq!(
            telemetry.totals(),
            TotalsSnapshot {
                requests: 1,
                errors: 0,
                tokens: 5
            }
        );
    }

    #[test]
    fn a_backend_count_below_the_estimate_corrects_the_totals_down() {
        let telemetry = Arc::new(Telemetry::default());
        let mut tracked = telemetry.begin(1, "m", true, ANONYMOUS);
        tracked.chunk(b"data: {}\n\ndata: {}\n\ndata: {}\n\n");
        tracked.complete(
            200,
            Some(&TokenCounts {
                completion_tokens: Some(1),
                ..TokenCounts::default()
            }),
            None,
        );
        drop(tracked);
        assert_eq!(telemetry.totals().tokens, 1);
    }

    #[test]
    fn failures_and_error_statuses_count_as_errors() {
        let telemetry = Arc::new(Telemetry::default());
        telemetry.begin(1, "m", false, ANONYMOUS).fail(502);
        telemetry
            .begin(2, "m", false, ANONYMOUS)
            .complete(502, None, None);
        telemetry
            .begin(3, "m", false, ANONYMOUS)
            .complete(200, None, None);
        assert_eq!(telemetry.totals().errors, 2);
        assert_eq!(telemetry.totals().requests, 3);
    }

    #[test]
    fn ended_requests_count_in_the_ledger_under_the_status_the_client_got() {
        let telemetry = Arc::new(Telemetry::default());
        let mut answered = telemetry.begin(1, "m", true, ANONYMOUS);
        answered.chunk(b"data: {}\n\n");
        answered.complete(
            200,
            Some(&TokenCounts {
                prompt_tokens: Some(7),
                completion_tokens: Some(3),
                ..TokenCounts::default()
            }),
            None,
        );
        drop(answered);
        let mut cut = telemetry.begin(2, "m", true, ANONYMOUS);
        cut.chunk(b"data: {}\n\n");
        cut.fail(502);
        drop(cut);
        drop(telemetry.begin(3, "m", false, Cow::Owned("key-1".to_string())));
        let mut left = telemetry.begin(4, "m", true, ANONYMOUS);
        left.chunk(b"data: {}\n\n");
        drop(left);
        telemetry.refused(None, ANONYMOUS_KEY, 404);
        let ledger = telemetry.ledger();
        assert_eq!(
            ledger.requests(),
            vec![
                ("m", "anonymous", 200, 2),
                ("m", "anonymous", 502, 1),
                ("m", "key-1", CLIENT_CLOSED_STATUS, 1),
                (OTHER, "anonymous", 404, 1),
            ]
        );
        assert_eq!(
            ledger.tokens()[0],
            (
                "m",
                "anonymous",
                Tokens {
                    input: 7,
                    output: 5
                }
            ),
            "the backend's count for one, the streams' events for the others"
        );
        let latency = ledger.latency();
        assert_eq!(latency[0].1.ttft.count(), 3, "only streams have a TTFT");
        assert_eq!(
            latency[0].1.duration.count(),
            4,
            "refusals have no duration"
        );
        assert_eq!(telemetry.in_flight(), 0);
    }

    #[test]
    fn counters_count_requeues_cancels_by_reason_and_worker_events() {
        let telemetry = Telemetry::default();
        telemetry.requeued();
        telemetry.cancelled(CancelReason::Timeout);
        telemetry.cancelled(CancelReason::Timeout);
        telemetry.worker_auth_failed();
        telemetry.worker_joined("w-1", "127.0.0.1".parse().unwrap());
        let counters = telemetry.counters();
        assert_eq!(counters.requeues, 1);
        let timeout = CANCEL_REASONS
            .iter()
            .position(|r| *r == CancelReason::Timeout)
            .unwrap();
        assert_eq!(counters.cancels[timeout], 2);
        assert_eq!(counters.cancels.iter().sum::<u64>(), 2);
        assert_eq!(counters.worker_auth_failures, 1);
        assert_eq!(counters.worker_registrations, 1);
    }

    #[test]
    fn series_points_are_per_second_differences_and_bounded() {
        let telemetry = Arc::new(Telemetry::default());
        telemetry.begin(1, "m", false, ANONYMOUS);
        telemetry.sample(100, 3);
        telemetry.begin(2, "m", false, ANONYMOUS);
        telemetry.begin(3, "m", false, ANONYMOUS);
        telemetry.sample(101, 0);
        let series = telemetry.series();
        assert_eq!(series.unix_secs, vec![100, 101]);
        assert_eq!(series.requests_per_sec, vec![1, 2]);
        assert_eq!(series.queue_depth, vec![3, 0]);
        for second in 0..(SERIES_POINTS as u64 + 10) {
            telemetry.sample(200 + second, 0);
        }
        assert_eq!(telemetry.series().unix_secs.len(), SERIES_POINTS);
    }

    #[test]
    fn worker_records_follow_joins_heartbeats_and_leaves() {
        let telemetry = Telemetry::default();
        telemetry.worker_joined("w-1", "10.0.0.5".parse().unwrap());
        telemetry.heartbeat("w-1", Duration::from_millis(3));
        let record = telemetry.worker("w-1").unwrap();
        assert_eq!(record.host, "10.0.0.5");
        assert_eq!(record.heartbeat, Some(Duration::from_millis(3)));
        telemetry.worker_left("w-1");
        assert!(telemetry.worker("w-1").is_none());
    }
}
