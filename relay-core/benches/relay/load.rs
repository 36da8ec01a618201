//! Load generators: closed-loop unary requests, back-to-back streams, slow idle streams and a
//! queue flood. Each takes a base URL, so the same code measures the direct and the relay path.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::json;

/// Latencies of successful requests (µs) and counts.
#[derive(Debug, Default)]
pub struct Samples {
    /// Per-request latency, or time to first byte for streams, in microseconds.
    pub latencies_us: Vec<u64>,
    /// Requests that completed with 2xx.
    pub ok: u64,
    /// Requests that failed (status or transport).
    pub failed: u64,
    /// SSE events received (streams only).
    pub events: u64,
    /// Wall time of the measurement.
    pub elapsed: Duration,
}

impl Samples {
    fn merge(&mut self, other: Samples) {
        self.latencies_us.extend(other.latencies_us);
        self.ok += other.ok;
        self.failed += other.failed;
        self.events += other.events;
    }

    /// The `q`-quantile of the latencies (0.5 = median), in milliseconds.
    pub fn quantile_ms(&mut self, q: f64) -> f64 {
        if self.latencies_us.is_empty() {
            return f64::NAN;
        }
        self.latencies_us.sort_unstable();
        let index = ((self.latencies_us.len() - 1) as f64 * q).round() as usize;
        self.latencies_us[index] as f64 / 1000.0
    }

    /// Successful requests per second.
    pub fn rate(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64()
    }

    /// SSE events per second.
    pub fn events_rate(&self) -> f64 {
        self.events as f64 / self.elapsed.as_secs_f64()
    }
}

/// A client with enough pooled connections for every concurrent loop.
pub fn client(connections: usize) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(connections)
        .timeout(Duration::from_secs(120))
        .build()
        .expect("client")
}

fn chat_url(base: &str) -> String {
    format!("{base}/v1/chat/completions")
}

/// `connections` closed loops of small non-streaming requests for `duration`.
pub async fn unary(base: &str, connections: usize, duration: Duration) -> Samples {
    let body =
        json!({"model": "bench", "messages": [{"role": "user", "content": "hi"}]}).to_string();
    unary_to(&chat_url(base), &body, connections, duration).await
}

/// `connections` closed loops posting `body` to `url` for `duration`.
pub async fn unary_to(url: &str, body: &str, connections: usize, duration: Duration) -> Samples {
    let client = client(connections);
    warm_up(&client, url, body, connections).await;
    let start = Instant::now();
    let end = start + duration;
    let loops = (0..connections).map(|_| {
        let client = client.clone();
        let url = url.to_string();
        let body = body.to_string();
        tokio::spawn(async move {
            let mut samples = Samples::default();
            while Instant::now() < end {
                let sent = Instant::now();
                let outcome = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body.clone())
                    .send()
                    .await;
                match outcome {
                    Ok(response) if response.status().is_success() => {
                        let _ = response.bytes().await;
                        samples.latencies_us.push(sent.elapsed().as_micros() as u64);
                        samples.ok += 1;
                    }
                    _ => samples.failed += 1,
                }
            }
            samples
        })
    });
    collect(loops, start).await
}

/// Opens pooled connections before measuring, so connection setup is not counted.
async fn warm_up(client: &reqwest::Client, url: &str, body: &str, connections: usize) {
    let requests = (0..connections).map(|_| {
        let request = client
            .post(url)
            .header("content-type", "application/json")
            .body(body.to_string());
        async move {
            if let Ok(response) = request.send().await {
                let _ = response.bytes().await;
            }
        }
    });
    futures_util::future::join_all(requests).await;
}

async fn collect(
    loops: impl Iterator<Item = tokio::task::JoinHandle<Samples>>,
    start: Instant,
) -> Samples {
    let mut total = Samples::default();
    for handle in loops.collect::<Vec<_>>() {
        total.merge(handle.await.expect("load loop"));
    }
    total.elapsed = start.elapsed();
    total
}

/// Counts SSE event ends ("\n\n") across reads, carrying the last byte between reads.
#[derive(Default)]
struct EventCounter {
    last: u8,
}

impl EventCounter {
    fn count(&mut self, bytes: &[u8]) -> u64 {
        let mut events = 0;
        for &b in bytes {
            if b == b'\n' && self.last == b'\n' {
                events += 1;
            }
            self.last = b;
        }
        events
    }
}

/// Streams one answer; returns (time to first byte in µs, events) or None on failure.
async fn stream_once(client: &reqwest::Client, url: &str, body: &str) -> Option<(u64, u64)> {
    let sent = Instant::now();
    let response = client
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .ok()?;
    if !response.status().is_success() {
        return None;
    }
    let mut body = response.bytes_stream();
    let mut counter = EventCounter::default();
    let mut ttfb = None;
    let mut events = 0;
    while let Some(piece) = body.next().await {
        let piece = piece.ok()?;
        ttfb.get_or_insert_with(|| sent.elapsed().as_micros() as u64);
        events += counter.count(&piece);
    }
    Some((ttfb?, events))
}

/// `clients` loops streaming `chunks`-event answers back to back for `duration`.
pub async fn streams(base: &str, clients: usize, chunks: u64, duration: Duration) -> Samples {
    let body = json!({"model": "bench", "stream": true, "bench": {"chunks": chunks}}).to_string();
    streams_to(&chat_url(base), &body, clients, duration).await
}

/// `clients` loops streaming the answers to `body` posted to `url`, back to back for `duration`.
pub async fn streams_to(url: &str, body: &str, clients: usize, duration: Duration) -> Samples {
    let client = client(clients);
    warm_up(&client, url, body, clients).await;
    let start = Instant::now();
    let end = start + duration;
    let loops = (0..clients).map(|_| {
        let client = client.clone();
        let url = url.to_string();
        let body = body.to_string();
        tokio::spawn(async move {
            let mut samples = Samples::default();
            while Instant::now() < end {
                match stream_once(&client, &url, &body).await {
                    Some((ttfb, events)) => {
                        samples.latencies_us.push(ttfb);
                        samples.events += events;
                        samples.ok += 1;
                    }
                    None => samples.failed += 1,
                }
            }
            samples
        })
    });
    collect(loops, start).await
}

/// What happened to a batch of idle streams.
pub struct IdleOutcome {
    /// Streams that received every event.
    pub complete: u64,
    /// Streams that failed or came up short.
    pub failed: u64,
}

/// Opens `count` slow streams (one event per `interval`, `events` in all), calling `at_peak` once
/// every stream has received its first event, and waits for all of them.
pub async fn idle_streams(
    base: &str,
    count: usize,
    events: u64,
    interval: Duration,
    at_peak: impl FnOnce(),
) -> IdleOutcome {
    let client = client(count);
    let body = json!({"model": "bench", "stream": true, "bench": {"chunks": events, "interval_ms": interval.as_millis() as u64}}).to_string();
    let started = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::with_capacity(count);
    for i in 0..count {
        let client = client.clone();
        let url = chat_url(base);
        let body = body.clone();
        let started = started.clone();
        handles.push(tokio::spawn(async move {
            let response = client
                .post(&url)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .ok()?;
            if !response.status().is_success() {
                return None;
            }
            let mut stream = response.bytes_stream();
            let mut counter = EventCounter::default();
            let mut seen = 0;
            let mut first = true;
            while let Some(piece) = stream.next().await {
                seen += counter.count(&piece.ok()?);
                if first {
                    first = false;
                    started.fetch_add(1, Ordering::Relaxed);
                }
            }
            Some(seen)
        }));
        // The accept backlog is finite: open connections in waves, not all in one instant.
        if i % 500 == 499 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let deadline = Instant::now() + interval * (events as u32 + 5) + Duration::from_secs(30);
    while started.load(Ordering::Relaxed) < count as u64 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    at_peak();
    let mut outcome = IdleOutcome {
        complete: 0,
        failed: 0,
    };
    for handle in handles {
        // events + [DONE]
        match handle.await.ok().flatten() {
            Some(seen) if seen == events + 1 => outcome.complete += 1,
            _ => outcome.failed += 1,
        }
    }
    outcome
}

/// What a flood of requests came to.
#[derive(Debug, Default)]
pub struct FloodOutcome {
    /// 2xx answers.
    pub served: u64,
    /// 429 answers (queue full).
    pub rejected: u64,
    /// 504 answers (queue or request timeout).
    pub timed_out: u64,
    /// Anything else: a lost or malformed answer.
    pub other: u64,
    /// Time until the last answer.
    pub elapsed: Duration,
}

/// Sends `count` non-streaming requests at once and waits for every answer.
pub async fn flood(base: &str, count: usize) -> FloodOutcome {
    let client = client(count);
    let body =
        json!({"model": "bench", "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let start = Instant::now();
    let mut handles = Vec::with_capacity(count);
    for i in 0..count {
        let request = client
            .post(chat_url(base))
            .header("content-type", "application/json")
            .body(body.clone());
        handles.push(tokio::spawn(async move {
            match request.send().await {
                Ok(response) => {
                    let status = response.status().as_u16();
                    let _ = response.bytes().await;
                    status
                }
                Err(_) => 0,
            }
        }));
        if i % 500 == 499 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let mut outcome = FloodOutcome::default();
    for handle in handles {
        match handle.await.unwrap_or(0) {
            200..=299 => outcome.served += 1,
            429 => outcome.rejected += 1,
            504 => outcome.timed_out += 1,
            _ => outcome.other += 1,
        }
    }
    outcome.elapsed = start.elapsed();
    outcome
}
