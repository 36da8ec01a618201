//! What the dashboard shows that routing does not need: where each worker connects from and its
//! heartbeat, each request's time to first byte and token count, totals, and a per-second series
//! for the live charts.
//!
//! Kept apart from the scheduler on purpose: the hot path only touches atomics here (a chunk adds
//! to a counter), and the request map has its own lock, taken once when a request arrives and
//! once when it ends.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::scheduler::RequestId;
use crate::protocol::TokenCounts;
use crate::store::usage::{Outcome, UsageLog, UsageRecord};

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
    /// The client API key it was made with (its id), or `anonymous`.
    pub key: Arc<str>,
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
}

/// Running totals since start.
#[derive(Debug, Default)]
struct Totals {
    requests: AtomicU64,
    errors: AtomicU64,
    tokens: AtomicU64,
    /// Requests refused for a missing, wrong or revoked client API key.
    client_auth_failures: AtomicU64,
}

/// Totals as numbers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
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

/// The proxy's observations; one per hub.
#[derive(Debug, Default)]
pub struct Telemetry {
    /// Bumped on every change the dashboard shows; the live feed sends when it moves.
    version: AtomicU64,
    requests: Mutex<HashMap<RequestId, Arc<RequestRecord>>>,
    workers: Mutex<HashMap<String, WorkerRecord>>,
    totals: Totals,
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

    /// A request was refused for its client API key.
    pub fn client_auth_failed(&self) {
        self.totals
            .client_auth_failures
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Requests refused for their client API key since start.
    pub fn client_auth_failures(&self) -> u64 {
        self.totals.client_auth_failures.load(Ordering::Relaxed)
    }

    /// Accounts every finished request in `usage` from now on.
    pub fn account_usage_in(&self, usage: UsageLog) {
        let _ = self.usage.set(usage);
    }

    /// A request was accepted for a worker (or, with `upstream`, for that upstream), made with
    /// client key `key`; the returned handle records its progress and its end.
    pub fn begin(
        self: &Arc<Self>,
        request: RequestId,
        model: &str,
        streaming: bool,
        upstream: Option<&str>,
        key: &Arc<str>,
    ) -> TrackedRequest {
        let record = Arc::new(RequestRecord {
            model: model.to_string(),
            streaming,
            arrived: Instant::now(),
            upstream: upstream.map(str::to_string),
            key: Arc::clone(key),
            first_byte_nanos: AtomicU64::new(0),
            tokens: AtomicU64::new(0),
        });
        locked(&self.requests).insert(request, Arc::clone(&record));
        self.touch();
        TrackedRequest {
            telemetry: Arc::clone(self),
            request,
            record,
            end: None,
            input_tokens: 0,
            worker: None,
        }
    }

    /// Requests in flight, oldest first.
    pub fn requests(&self) -> Vec<(RequestId, Arc<RequestRecord>)> {
        let mut all: Vec<(RequestId, Arc<RequestRecord>)> = locked(&self.requests)
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
            },
        );
        self.touch();
    }

    /// A worker's connection ended.
    pub fn worker_left(&self, wire_id: &str) {
        locked(&self.workers).remove(wire_id);
        self.touch();
    }

    /// A worker answered a ping after `round_trip`.
    pub fn heartbeat(&self, wire_id: &str, round_trip: Duration) {
        if let Some(record) = locked(&self.workers).get_mut(wire_id) {
            record.heartbeat = Some(round_trip);
        }
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
    /// How it ended and the status the client got; `None` while running (and for a client that
    /// left first).
    end: Option<(Outcome, u16)>,
    input_tokens: u64,
    /// The worker that answered.
    worker: Option<Arc<str>>,
}

impl TrackedRequest {
    /// Bytes of the answer are about to reach the client; SSE `data:` lines count as tokens
    /// until the backend's own count arrives at the end. They count in the totals at once, so
    /// the tokens/s chart moves while a long answer streams, not in one jump at its end.
    pub fn chunk(&self, bytes: &[u8]) {
        self.first_byte();
        let events = count_data_lines(bytes);
        if events > 0 {
            self.record.tokens.fetch_add(events, Ordering::Relaxed);
            self.telemetry
                .totals
                .tokens
                .fetch_add(events, Ordering::Relaxed);
        }
    }

    /// The answer is complete, with the backend's status and usage, from `worker` (`None` for
    /// an upstream, named in the record).
    pub fn complete(&mut self, status: u16, usage: Option<&TokenCounts>, worker: Option<Arc<str>>) {
        self.first_byte();
        self.worker = worker;
        if let Some(input) = usage.and_then(|u| u.prompt_tokens) {
            self.input_tokens = u64::from(input);
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
        let outcome = if status >= 400 {
            Outcome::Error
        } else {
            Outcome::Ok
        };
        self.end = Some((outcome, status));
    }

    /// The relay answered with an error of `status` instead of the backend.
    pub fn fail(&mut self, status: u16) {
        self.end = Some((Outcome::Error, status));
    }

    /// What usage to account for this request, now that it ended.
    fn usage_record(&self) -> UsageRecord {
        let (outcome, status) = self.end.unwrap_or((Outcome::Cancelled, 0));
        let record = &self.record;
        UsageRecord {
            at: unix_ms() as i64,
            key: Arc::clone(&record.key),
            model: record.model.clone(),
            worker: match (&self.worker, &record.upstream) {
                (Some(worker), _) => worker.to_string(),
                (None, Some(upstream)) => upstream.clone(),
                (None, None) => String::new(),
            },
            outcome,
            status,
            input_tokens: self.input_tokens,
            output_tokens: record.tokens(),
            ttft_ms: record.ttft().map(|t| t.as_millis() as u64),
            duration_ms: record.arrived.elapsed().as_millis() as u64,
        }
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
        locked(&telemetry.requests).remove(&self.request);
        telemetry.totals.requests.fetch_add(1, Ordering::Relaxed);
        if matches!(self.end, Some((Outcome::Error, _))) {
            telemetry.totals.errors.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(usage) = telemetry.usage.get() {
            usage.record(self.usage_record());
        }
        telemetry.touch();
    }
}

/// SSE events in `bytes` that carry data (a chat stream sends about one per token), not counting
/// the `[DONE]` terminator.
fn count_data_lines(bytes: &[u8]) -> u64 {
    let mut count = 0;
    let mut at_line_start = true;
    for (i, byte) in bytes.iter().enumerate() {
        if at_line_start
            && bytes[i..].starts_with(b"data:")
            && !bytes[i + 5..].trim_ascii_start().starts_with(b"[DONE]")
        {
            count += 1;
        }
        at_line_start = *byte == b'\n';
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_lines_are_counted_and_done_is_not() {
        let chunk = b"data: {\"a\":1}\n\ndata: {\"a\":2}\n\nevent: x\ndata:{}\n\ndata: [DONE]\n\n";
        assert_eq!(count_data_lines(chunk), 3);
        assert_eq!(count_data_lines(b": keep-alive\n\n"), 0);
        assert_eq!(count_data_lines(b"xdata: no\n"), 0);
    }

    fn anon() -> Arc<str> {
        Arc::from(crate::store::usage::ANONYMOUS)
    }

    #[test]
    fn a_request_is_listed_until_its_handle_drops_then_counted() {
        let telemetry = Arc::new(Telemetry::default());
        let before = telemetry.version();
        let mut tracked = telemetry.begin(7, "m", true, None, &anon());
        assert!(telemetry.version() > before);
        assert_eq!(telemetry.requests().len(), 1);
        assert!(telemetry.requests()[0].1.ttft().is_none());
        tracked.chunk(b"data: {}\n\ndata: {}\n\n");
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
        let mut tracked = telemetry.begin(1, "m", true, None, &anon());
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
        telemetry.begin(1, "m", false, None, &anon()).fail(502);
        telemetry
            .begin(2, "m", false, None, &anon())
            .complete(502, None, None);
        telemetry
            .begin(3, "m", false, None, &anon())
            .complete(200, None, None);
        assert_eq!(telemetry.totals().errors, 2);
        assert_eq!(telemetry.totals().requests, 3);
    }

    #[test]
    fn series_points_are_per_second_differences_and_bounded() {
        let telemetry = Arc::new(Telemetry::default());
        telemetry.begin(1, "m", false, None, &anon());
        telemetry.sample(100, 3);
        telemetry.begin(2, "m", false, None, &anon());
        telemetry.begin(3, "m", false, None, &anon());
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
