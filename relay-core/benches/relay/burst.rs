//! The `burst` scenario: N streams opened at the same instant, on the direct path and through
//! the relay, with what each costs in first-byte time, in the kernel's listen-queue counters and
//! in the worker's peak memory.
//!
//! The load generator is a raw HTTP/1.1 client so that its own connections are opened *before*
//! the burst, in bounded waves: the burst is then N requests written at once on N open
//! connections, and whatever connects and listen-queue overflows happen during it are the
//! relay's own (the worker's connections to its backend), not the load generator's.
//! First byte is the first SSE event's data (not the response head), timed from the request's
//! own write.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{watch, Semaphore};

use crate::report::Row;
use crate::{info, Stack, KB, MB};

/// Load-generator connections opened at once while preparing a burst: far below any listen
/// backlog, so preparing causes no overflow of its own.
const PREPARE_CONNECTS: usize = 32;

/// The kernel's TCP counters a burst is judged by (`/proc/net/netstat`, machine-wide).
#[derive(Debug, Clone, Copy, Default)]
pub struct KernelCounters {
    /// `TcpExtListenOverflows`: connections dropped because an accept queue was full.
    pub listen_overflows: i64,
    /// `TcpExtTCPSynRetrans`: SYNs sent again (after 1 s, the first time) for lack of an answer.
    pub syn_retrans: i64,
}

impl KernelCounters {
    /// The counters now.
    pub fn read() -> KernelCounters {
        let text = std::fs::read_to_string("/proc/net/netstat").unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let mut counters = KernelCounters::default();
        // The file pairs a line of names with a line of values, each starting "TcpExt:".
        for pair in lines.chunks(2) {
            let [names, values] = pair else { continue };
            if !names.starts_with("TcpExt:") {
                continue;
            }
            for (name, value) in names.split_whitespace().zip(values.split_whitespace()) {
                let value = value.parse().unwrap_or(0);
                match name {
                    "ListenOverflows" => counters.listen_overflows = value,
                    "TCPSynRetrans" => counters.syn_retrans = value,
                    _ => {}
                }
            }
        }
        counters
    }

    /// What was counted since `before`.
    pub fn since(self, before: KernelCounters) -> KernelCounters {
        KernelCounters {
            listen_overflows: self.listen_overflows - before.listen_overflows,
            syn_retrans: self.syn_retrans - before.syn_retrans,
        }
    }
}

/// `net.core.somaxconn`: the kernel's cap on any listen backlog.
pub fn somaxconn() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// What one burst came to.
#[derive(Debug, Default)]
pub struct BurstOutcome {
    /// Time to the first SSE event of each stream that got one, in microseconds.
    pub first_byte_us: Vec<u64>,
    /// Streams that received every event.
    pub complete: u64,
    /// Streams that failed, were refused or came up short.
    pub failed: u64,
    /// The kernel's counters over the burst.
    pub kernel: KernelCounters,
}

impl BurstOutcome {
    /// The `q`-quantile of first-byte times, in milliseconds.
    pub fn quantile_ms(&mut self, q: f64) -> f64 {
        if self.first_byte_us.is_empty() {
            return f64::NAN;
        }
        self.first_byte_us.sort_unstable();
        let index = ((self.first_byte_us.len() - 1) as f64 * q).round() as usize;
        self.first_byte_us[index] as f64 / 1000.0
    }
}

/// Opens `count` connections to `127.0.0.1:port` (at most [`PREPARE_CONNECTS`] connecting at
/// once), then writes a streaming request for `events` events, `interval` apart, on all of them
/// at once. Calls `at_peak` once every stream has had its first event (or after a bound), then
/// waits for every stream to end.
pub async fn run(
    port: u16,
    count: usize,
    events: u64,
    interval: Duration,
    at_peak: impl FnOnce(),
) -> BurstOutcome {
    let body = format!(
        "{{\"model\":\"bench\",\"stream\":true,\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}],\"bench\":{{\"chunks\":{events},\"interval_ms\":{}}}}}",
        interval.as_millis()
    );
    let request: Arc<[u8]> = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
    .into();
    let sockets = prepare(port, count).await;
    let prepared = sockets.len();
    let (go, ready) = watch::channel(false);
    let (first_tx, mut first_rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
    let tasks: Vec<_> = sockets
        .into_iter()
        .map(|socket| {
            let mut ready = ready.clone();
            let request = request.clone();
            let first_tx = first_tx.clone();
            tokio::spawn(async move {
                let _ = ready.wait_for(|go| *go).await;
                stream_one(socket, &request, events, first_tx).await
            })
        })
        .collect();
    drop(first_tx);
    // Every task is parked on the signal before it is given.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = KernelCounters::read();
    let _ = go.send(true);
    let mut outcome = BurstOutcome {
        failed: (count - prepared) as u64,
        ..BurstOutcome::default()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while outcome.first_byte_us.len() < prepared {
        match tokio::time::timeout_at(deadline, first_rx.recv()).await {
            Ok(Some(us)) => outcome.first_byte_us.push(us),
            _ => break,
        }
    }
    at_peak();
    for task in tasks {
        match task.await {
            Ok(true) => outcome.complete += 1,
            _ => outcome.failed += 1,
        }
    }
    outcome.kernel = KernelCounters::read().since(before);
    outcome
}

/// `count` open connections, opened [`PREPARE_CONNECTS`] at a time.
async fn prepare(port: u16, count: usize) -> Vec<TcpStream> {
    let permits = Arc::new(Semaphore::new(PREPARE_CONNECTS));
    let connects: Vec<_> = (0..count)
        .map(|_| {
            let permits = permits.clone();
            tokio::spawn(async move {
                let _permit = permits.acquire_owned().await.ok()?;
                let socket = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
                socket.set_nodelay(true).ok()?;
                Some(socket)
            })
        })
        .collect();
    let mut sockets = Vec::with_capacity(count);
    for connect in connects {
        if let Ok(Some(socket)) = connect.await {
            sockets.push(socket);
        }
    }
    sockets
}

/// Writes `request` on `socket` and reads the streamed answer; reports the first event's time
/// on `first`; true when the stream ended with `[DONE]` after `events` events.
async fn stream_one(
    mut socket: TcpStream,
    request: &[u8],
    events: u64,
    first: tokio::sync::mpsc::UnboundedSender<u64>,
) -> bool {
    let sent = Instant::now();
    if socket.write_all(request).await.is_err() {
        return false;
    }
    let mut received = Vec::with_capacity(4096);
    let mut buffer = [0u8; 4096];
    let mut reported = false;
    let mut body_at = None;
    let deadline = Duration::from_secs(30) + Duration::from_secs(events * 4);
    let outcome = tokio::time::timeout(deadline, async {
        loop {
            let read = socket.read(&mut buffer).await.ok()?;
            if read == 0 {
                return None;
            }
            received.extend_from_slice(&buffer[..read]);
            if body_at.is_none() {
                body_at = find(&received, b"\r\n\r\n").map(|at| at + 4);
                if body_at.is_some() && !received.starts_with(b"HTTP/1.1 200") {
                    return None;
                }
            }
            let Some(body_at) = body_at else { continue };
            let body = &received[body_at..];
            if !reported && find(body, b"data: ").is_some() {
                reported = true;
                let _ = first.send(sent.elapsed().as_micros() as u64);
            }
            if find(body, b"data: [DONE]").is_some() {
                return Some(count(body, b"\"content\"") as u64);
            }
        }
    })
    .await;
    matches!(outcome, Ok(Some(seen)) if seen == events)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn count(haystack: &[u8], needle: &[u8]) -> usize {
    haystack
        .windows(needle.len())
        .filter(|w| *w == needle)
        .count()
}

/// The events of each burst stream and the time between them: the streams stay open for about
/// five seconds, long enough to read the worker's memory with all of them open.
const EVENTS: u64 = 5;
const INTERVAL: Duration = Duration::from_secs(1);

/// Streams of a full burst, unless `RELAY_BENCH_BURST` names another number.
pub fn streams(quick: bool) -> usize {
    std::env::var("RELAY_BENCH_BURST")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(if quick { 200 } else { 2000 })
}

/// A figure naming the burst's size (rows hold static text; the bench runs once per process).
fn figure(text: String) -> &'static str {
    Box::leak(text.into_boxed_str())
}

/// The scenario's rows: `count` streams at once, direct then through the relay.
pub async fn rows(count: usize) -> Vec<Row> {
    let scenario = "burst";
    // A burst holds a socket per stream.
    let limit = relay_core::startup::raise_open_files_limit().unwrap_or(0);
    assert!(
        limit as usize > count + 256,
        "a burst of {count} streams needs more than {limit} open files"
    );
    let stack = Stack::start(&["--max-queue-len", "100000"], count as u32 + 100).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    eprintln!(
        "burst: {count} streams at once; the mock backend listens with tokio's backlog of 128 \
         (the kernel caps it at net.core.somaxconn = {}; llama-server's is also 128); kernel counters \
         are machine-wide",
        somaxconn().map_or("?".to_string(), |n| n.to_string())
    );
    let mut direct = run(stack.backend_port, count, EVENTS, INTERVAL, || {}).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut floor = run(
        crate::floor::start(stack.backend_port),
        count,
        EVENTS,
        INTERVAL,
        || {},
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let worker_before = stack.worker.rss();
    let proxy_before = stack.proxy.rss();
    let (mut at_peak, mut proxy_at_peak) = (0, 0);
    let mut relay = run(stack.proxy_port, count, EVENTS, INTERVAL, || {
        at_peak = stack.worker.rss();
        proxy_at_peak = stack.proxy.rss();
    })
    .await;
    // VmHWM is updated lazily by the kernel: never below what was seen at the peak.
    let worker_peak = crate::procs::peak_rss_of(stack.worker.pid()).max(at_peak);
    eprintln!(
        "burst: direct {} complete / {} failed, {:?}; relay {} complete / {} failed, {:?}; \
         worker RSS {:.1} MB before, {:.1} MB with the streams open, peak {:.1} MB; open fds: worker {}",
        direct.complete,
        direct.failed,
        direct.kernel,
        relay.complete,
        relay.failed,
        relay.kernel,
        worker_before as f64 / MB,
        at_peak as f64 / MB,
        worker_peak as f64 / MB,
        stack.worker.open_fds(),
    );
    let (d99, r99) = (direct.quantile_ms(0.99), relay.quantile_ms(0.99));
    eprintln!(
        "burst: bare forwarder (the floor under any relay) {} complete / {} failed, {:?}",
        floor.complete, floor.failed, floor.kernel
    );
    vec![
        info(
            scenario,
            figure(format!("first byte p50 (ms), {count} streams at once")),
            Some(direct.quantile_ms(0.5)),
            relay.quantile_ms(0.5),
        ),
        info(
            scenario,
            figure(format!("first byte p90 (ms), {count} streams at once")),
            Some(direct.quantile_ms(0.9)),
            relay.quantile_ms(0.9),
        ),
        Row {
            scenario,
            figure: figure(format!("first byte p99 (ms), {count} streams at once")),
            direct: Some(d99),
            relay: r99,
            target: "≤ direct + 50 ms".to_string(),
            met: Some(r99 <= d99 + 50.0),
        },
        info(
            scenario,
            figure(format!(
                "first byte p50 (ms), {count} streams, bare forwarder in place of the relay"
            )),
            Some(direct.quantile_ms(0.5)),
            floor.quantile_ms(0.5),
        ),
        info(
            scenario,
            figure(format!(
                "first byte p99 (ms), {count} streams, bare forwarder in place of the relay"
            )),
            Some(d99),
            floor.quantile_ms(0.99),
        ),
        Row {
            scenario,
            figure: "streams completed",
            direct: Some(direct.complete as f64),
            relay: relay.complete as f64,
            target: format!("all {count}"),
            met: Some(relay.complete == count as u64),
        },
        info(
            scenario,
            "TcpExtListenOverflows during the burst",
            Some(direct.kernel.listen_overflows as f64),
            relay.kernel.listen_overflows as f64,
        ),
        info(
            scenario,
            "TcpExtTCPSynRetrans during the burst",
            Some(direct.kernel.syn_retrans as f64),
            relay.kernel.syn_retrans as f64,
        ),
        Row {
            scenario,
            figure: figure(format!("worker peak RSS (MB), {count} open streams")),
            direct: None,
            relay: worker_peak as f64 / MB,
            target: "≤ 40 MB".to_string(),
            met: Some(worker_peak as f64 <= 40.0 * MB),
        },
        info(
            scenario,
            "worker KB per open stream (RSS at the peak − before)",
            None,
            at_peak.saturating_sub(worker_before) as f64 / KB / count as f64,
        ),
        // Every KB a stream needs is a page the kernel first faults in and zeroes: in the
        // proxy that is about half its CPU during a burst (BENCHMARKS.md, 2026-11-28).
        info(
            scenario,
            "proxy KB per open stream (RSS at the peak − before)",
            None,
            proxy_at_peak.saturating_sub(proxy_before) as f64 / KB / count as f64,
        ),
    ]
}
