//! The scenarios. Each starts its own processes on loopback ports and ends with its line.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::bad_backends::{BadBackend, Misbehaviour};
use super::binary::{unused_port, TempDir};
use super::support::{MockBackend, RawHttpClient};
use super::*;

/// Sends every body at once; returns the outcomes in order.
pub(super) async fn send_all(url: &str, bodies: Vec<Value>) -> Vec<Outcome> {
    let client = inprocess::http();
    let tasks: Vec<_> = bodies
        .into_iter()
        .map(|body| {
            let (client, url) = (client.clone(), url.to_string());
            tokio::spawn(async move { call(&client, &url, body).await })
        })
        .collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.expect("the client task ends"));
    }
    outcomes
}

fn slow_stream() -> Value {
    json!({"model": "m", "stream": true, "messages": [],
           "mock": {"chunks": 20, "chunk_delay_ms": 100}})
}

fn slow_unary(delay_ms: u64) -> Value {
    json!({"model": "m", "messages": [], "mock": {"delay_ms": delay_ms}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_killed_mid_stream() {
    let backend = MockBackend::start(&["m"]).await;
    let data = TempDir::new("faults-kill-worker");
    let (proxy, url) = start_proxy(&data, unused_port(), &[ROOMY_QUEUE]);
    let slots = concurrency();
    let env = [("MAX_CONCURRENCY", slots.as_str())];
    let mut doomed = start_worker(&data, "doomed", &url, &backend.url(), &env);
    let _survivor = start_worker(&data, "survivor", &url, &backend.url(), &env);
    wait_for_workers(&url, 2).await;
    let before = rss_kb(proxy.child.id());
    // Half streams of two seconds, half answers after 800 ms: two thirds run, the rest queue.
    let bodies: Vec<Value> = (0..12 * scale())
        .map(|i| {
            if i % 2 == 0 {
                slow_stream()
            } else {
                slow_unary(800)
            }
        })
        .collect();
    let sending = tokio::spawn({
        let url = url.clone();
        async move { send_all(&url, bodies).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    doomed.child.kill().expect("SIGKILL the worker");
    let outcomes = sending.await.unwrap();
    let tally = Tally {
        outcomes: outcomes.clone(),
    };
    tally.report(
        "worker_killed_mid_stream",
        rss_kb(proxy.child.id()) - before,
    );
    // What had not sent a byte went to the survivor and was answered; only streams already
    // under way on the killed worker end with an error event.
    for (i, outcome) in outcomes.iter().enumerate() {
        if i % 2 == 1 {
            assert_eq!(*outcome, Outcome::Answered, "request {i} was requeued");
        }
    }
    assert!(tally.clean_errors() <= 4 * scale(), "{outcomes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_killed_and_restarted() {
    let backend = MockBackend::start(&["m"]).await;
    let data = TempDir::new("faults-kill-proxy");
    let port = unused_port();
    let (mut first, url) = start_proxy(&data, port, &[ROOMY_QUEUE]);
    let slots = concurrency();
    let env = [("MAX_CONCURRENCY", slots.as_str())];
    let _a = start_worker(&data, "a", &url, &backend.url(), &env);
    let _b = start_worker(&data, "b", &url, &backend.url(), &env);
    wait_for_workers(&url, 2).await;
    let warm = send_all(&url, vec![slow_unary(0); 8]).await;
    assert!(warm.iter().all(|o| *o == Outcome::Answered), "{warm:?}");
    first.child.kill().expect("SIGKILL the proxy");
    let _ = first.child.wait();
    let killed = Instant::now();
    let (proxy, again) = start_proxy(&data, port, &[ROOMY_QUEUE]);
    assert_eq!(again, url, "the same address");
    wait_for_workers(&url, 2).await;
    let rejoined = killed.elapsed();
    let before = rss_kb(proxy.child.id());
    let bodies: Vec<Value> = (0..16 * scale())
        .map(|i| {
            if i % 4 == 0 {
                slow_stream()
            } else {
                slow_unary(50)
            }
        })
        .collect();
    let tally = Tally {
        outcomes: send_all(&url, bodies).await,
    };
    println!(
        "faults proxy_killed_and_restarted: both workers rejoined {:.1} s after the kill",
        rejoined.as_secs_f64()
    );
    tally.report(
        "proxy_killed_and_restarted",
        rss_kb(proxy.child.id()) - before,
    );
    assert_eq!(tally.clean_errors(), 0, "{:?}", tally.outcomes);
    assert!(rejoined < Duration::from_secs(15), "{rejoined:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flood_against_a_full_queue() {
    let backend = MockBackend::start(&["m"]).await;
    let data = TempDir::new("faults-flood");
    let env = [("MAX_QUEUE_LEN", "20"), ("QUEUE_TIMEOUT_SECS", "20")];
    let (proxy, url) = start_proxy(&data, unused_port(), &env);
    let two = [("MAX_CONCURRENCY", "2")];
    let _worker = start_worker(&data, "only", &url, &backend.url(), &two);
    wait_for_workers(&url, 1).await;
    let before = rss_kb(proxy.child.id());
    let flood = 1_000 * scale();
    let tally = Tally {
        outcomes: send_all(&url, vec![slow_unary(200); flood]).await,
    };
    tally.report(
        "flood_against_a_full_queue",
        rss_kb(proxy.child.id()) - before,
    );
    let refused = tally.count(|o| *o == Outcome::CleanError(429));
    assert!(refused > flood / 2, "most are refused at once: {refused}");
    assert_eq!(
        tally.count(|o| matches!(o, Outcome::CleanError(status) if *status != 429)),
        0,
        "only queue_full refusals"
    );
    let after = send_all(&url, vec![slow_unary(0)]).await;
    assert_eq!(after, vec![Outcome::Answered], "the proxy still serves");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_that_crash_stall_or_answer_garbage() {
    let data = TempDir::new("faults-bad-backends");
    let env = [("REQUEST_TIMEOUT_SECS", "3"), ROOMY_QUEUE];
    let (proxy, url) = start_proxy(&data, unused_port(), &env);
    let slots = concurrency();
    let worker_env =
        |models: &'static str| [("MODELS", models), ("MAX_CONCURRENCY", slots.as_str())];
    let crash = BadBackend::start(Misbehaviour::CrashMidStream);
    let silent = BadBackend::start(Misbehaviour::NeverAnswers);
    let garbage = BadBackend::start(Misbehaviour::Garbage);
    let _workers = [
        start_worker(&data, "crash", &url, &crash.url, &worker_env("crash")),
        start_worker(&data, "silent", &url, &silent.url, &worker_env("silent")),
        start_worker(&data, "garbage", &url, &garbage.url, &worker_env("garbage")),
    ];
    wait_for_workers(&url, 3).await;
    let before = rss_kb(proxy.child.id());
    let n = 4 * scale();
    let mut bodies = Vec::new();
    for _ in 0..n {
        bodies.push(json!({"model": "crash", "stream": true, "messages": []}));
        bodies.push(json!({"model": "silent", "messages": []}));
        bodies.push(json!({"model": "garbage", "messages": []}));
    }
    let outcomes = send_all(&url, bodies).await;
    let tally = Tally {
        outcomes: outcomes.clone(),
    };
    tally.report(
        "backends_that_crash_stall_or_answer_garbage",
        rss_kb(proxy.child.id()) - before,
    );
    for chunk in outcomes.chunks(3) {
        assert_eq!(
            chunk[0],
            Outcome::CleanError(200),
            "a crash mid-stream is an error event"
        );
        assert_eq!(
            chunk[1],
            Outcome::CleanError(504),
            "a backend that never answers times out"
        );
        assert_eq!(
            chunk[2],
            Outcome::CleanError(502),
            "garbage is a bad gateway"
        );
    }
    for backend in [&crash, &silent, &garbage] {
        let reached = backend.accepted.load(std::sync::atomic::Ordering::SeqCst);
        assert!(
            reached >= n,
            "every request reached its backend: {reached} of {n}"
        );
    }
    // Every worker stays connected through its backend's faults.
    wait_for_workers(&url, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_joining_all_at_once() {
    use super::support::{try_connect, ScriptedWorker};
    use relay_core::protocol::ServerToWorker;

    let data = TempDir::new("faults-join-burst");
    let (proxy, url) = start_proxy(&data, unused_port(), &[ROOMY_QUEUE]);
    let addr: std::net::SocketAddr = url
        .trim_start_matches("http://")
        .parse()
        .expect("a loopback address");
    let count = 100 * scale();
    let before = rss_kb(proxy.child.id());
    // As after a proxy restart: every worker of a fleet connects and registers at the same time.
    let started = Instant::now();
    let joins: Vec<_> = (0..count)
        .map(|i| {
            tokio::spawn(async move {
                let mut worker = try_connect(addr, "local", Some(SECRET), None)
                    .await
                    .expect("the proxy takes the connection");
                worker.register(&format!("box-{i}"), &["m"], 1).await;
                worker
            })
        })
        .collect();
    let mut workers = Vec::new();
    for join in joins {
        workers.push(join.await.expect("each worker registers"));
    }
    wait_for_workers(&url, count).await;
    let joined_in = started.elapsed();
    // Each answers what it is sent, as a worker would.
    let serving: Vec<_> = workers
        .into_iter()
        .map(|mut worker: ScriptedWorker| {
            tokio::spawn(async move {
                while let Some(message) = worker.recv_within(Duration::from_secs(20)).await {
                    if let ServerToWorker::Request(request) = message {
                        worker.complete(&request.request_id, r#"{"ok":true}"#).await;
                    }
                }
            })
        })
        .collect();
    let tally = Tally {
        outcomes: send_all(&url, vec![slow_unary(0); count]).await,
    };
    println!(
        "faults workers_joining_all_at_once: {count} workers connected and registered in {:.2} s",
        joined_in.as_secs_f64()
    );
    tally.report(
        "workers_joining_all_at_once",
        rss_kb(proxy.child.id()) - before,
    );
    assert_eq!(tally.clean_errors(), 0, "{:?}", tally.outcomes);
    for task in serving {
        task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_that_send_garbage() {
    use super::support::{try_connect, ScriptedWorker};
    use futures_util::SinkExt;
    use relay_core::protocol::ServerToWorker;
    use tokio_tungstenite::tungstenite::Message;

    let data = TempDir::new("faults-garbage-workers");
    let env = [("REQUEST_TIMEOUT_SECS", "3"), ROOMY_QUEUE];
    let (proxy, url) = start_proxy(&data, unused_port(), &env);
    let addr: std::net::SocketAddr = url.trim_start_matches("http://").parse().unwrap();
    let join = |name: &'static str, models: &'static [&'static str], slots: u32| async move {
        let mut worker = try_connect(addr, "local", Some(SECRET), None)
            .await
            .unwrap();
        worker.register(name, models, slots).await;
        worker
    };
    // Each misbehaves its own way on every request, then (but for the mute one) answers it.
    let behaviours: [(&'static str, u32); 4] = [
        ("truncating", 1),
        ("duplicating", 1),
        ("mute", 1),
        ("good", 4),
    ];
    let mut tasks = Vec::new();
    for (name, slots) in behaviours {
        let models: &'static [&'static str] = if name == "good" {
            &["m", "only-good"]
        } else {
            &["m"]
        };
        let mut worker: ScriptedWorker = join(name, models, slots).await;
        tasks.push(tokio::spawn(async move {
            while let Some(message) = worker.recv_within(Duration::from_secs(30)).await {
                let ServerToWorker::Request(request) = message else {
                    continue;
                };
                let id = request.request_id.as_str();
                match name {
                    "truncating" => {
                        worker
                            .send_text(r#"{"type":"response_chunk","request_id":"#)
                            .await;
                        let _ = worker
                            .socket
                            .send(Message::Binary(vec![0xff, 0xfe, 0x00].into()))
                            .await;
                        worker
                            .send_text(r#"{"type":"mystery","request_id":"x"}"#)
                            .await;
                        worker.send_text(r#"{"type":"response_complete"}"#).await;
                        worker.complete(id, r#"{"ok":"truncating"}"#).await;
                    }
                    "duplicating" => {
                        worker.complete(id, r#"{"ok":"first"}"#).await;
                        worker.complete(id, r#"{"ok":"second"}"#).await;
                        worker.chunk(id, "data: {\"late\":true}\n\n").await;
                        worker.complete("not-a-request-of-mine", "{}").await;
                    }
                    "mute" => {}
                    _ => worker.complete(id, r#"{"ok":"good"}"#).await,
                }
            }
        }));
    }
    wait_for_workers(&url, 4).await;
    let before = rss_kb(proxy.child.id());
    let tally = Tally {
        outcomes: send_all(&url, vec![slow_unary(0); 20 * scale()]).await,
    };
    tally.report(
        "workers_that_send_garbage",
        rss_kb(proxy.child.id()) - before,
    );
    assert!(
        tally
            .outcomes
            .iter()
            .all(|o| matches!(o, Outcome::Answered | Outcome::CleanError(504))),
        "answers, or the mute worker's timeouts: {:?}",
        tally.outcomes
    );
    let after = send_all(&url, vec![json!({"model": "only-good", "messages": []})]).await;
    assert_eq!(
        after,
        vec![Outcome::Answered],
        "the proxy and the good worker still serve"
    );
    wait_for_workers(&url, 4).await;
    for task in tasks {
        task.abort();
    }
}

/// The most a TCP receive buffer and a send buffer may grow to here (tcp_rmem's and
/// tcp_wmem's maxima), or Linux's defaults when they cannot be read.
fn socket_buffer_bytes() -> usize {
    let max = |path: &str, default: usize| {
        std::fs::read_to_string(path)
            .ok()
            .and_then(|text| text.split_whitespace().nth(2)?.parse().ok())
            .unwrap_or(default)
    };
    max("/proc/sys/net/ipv4/tcp_rmem", 6 * 1024 * 1024)
        + max("/proc/sys/net/ipv4/tcp_wmem", 4 * 1024 * 1024)
}

/// Clients that read one byte a second while their streams run: their streams are held back at
/// the worker (the proxy keeps a few hundred KiB of each, not the whole answer), the other
/// clients of the same worker are served meanwhile, and when the slow ones read again they get
/// their whole stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_reading_a_byte_a_second() {
    const SLOW_PHASE: Duration = Duration::from_secs(6);
    const CHUNK_BYTES: usize = 32 * 1024;
    // More than the kernel's socket buffers on both sides of the worker can hold, or the
    // backend writes everything into them however well the worker holds back: Linux grows a
    // receive buffer up to tcp_rmem's maximum (32 MiB on some machines; a busy machine reaches
    // it more often), so a fixed 12.5 MiB passed here and failed there.
    let chunks = (socket_buffer_bytes() + 8 * 1024 * 1024)
        .div_ceil(CHUNK_BYTES)
        .max(400);
    let backend = MockBackend::start(&["m"]).await;
    let data = TempDir::new("faults-slow-clients");
    let (proxy, url) = start_proxy(&data, unused_port(), &[ROOMY_QUEUE]);
    let slots = concurrency();
    let _worker = start_worker(
        &data,
        "only",
        &url,
        &backend.url(),
        &[("MAX_CONCURRENCY", slots.as_str())],
    );
    wait_for_workers(&url, 1).await;
    let addr: std::net::SocketAddr = url
        .trim_start_matches("http://")
        .parse()
        .expect("the proxy's address");
    let before = rss_kb(proxy.child.id());
    // Half the worker's slots go to clients that read a byte a second: each asks for more than
    // the kernel's socket buffers on both sides of the worker hold.
    let slow_count = 2 * scale();
    let big = json!({"model": "m", "stream": true, "messages": [],
        "mock": {"chunks": chunks, "chunk_bytes": CHUNK_BYTES}});
    let slow: Vec<_> = (0..slow_count)
        .map(|_| {
            let big = big.clone();
            tokio::spawn(async move {
                let mut client = RawHttpClient::post_with_receive_buffer(
                    addr,
                    "/v1/chat/completions",
                    &big,
                    16 * 1024,
                )
                .await;
                let slow_until = Instant::now() + SLOW_PHASE;
                while Instant::now() < slow_until {
                    if !client.read_one_byte().await {
                        return Err(Outcome::Lost("closed while read slowly".to_string()));
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Ok(client)
            })
        })
        .collect();
    // The other half serve everyone else meanwhile.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let others = Instant::now();
    let bodies: Vec<Value> = (0..8 * scale())
        .map(|i| {
            if i % 2 == 0 {
                slow_stream()
            } else {
                slow_unary(100)
            }
        })
        .collect();
    let mut outcomes = send_all(&url, bodies).await;
    let others = others.elapsed();
    assert!(
        outcomes.iter().all(|o| *o == Outcome::Answered),
        "everyone else is answered: {outcomes:?}"
    );
    let held = rss_kb(proxy.child.id()) - before;
    let streamed = backend.streamed_events();
    // Every event of the others, and every event of the slow streams were they not held back.
    let others_events = 8 * scale() / 2 * (20 + 2);
    let all_events = slow_count * (chunks + 2) + others_events;
    // Then the slow clients read at full speed and get everything.
    for task in slow {
        outcomes.push(match task.await.expect("the slow client's task") {
            Ok(mut client) => {
                let body = client.read_chunked_body(BOUND).await;
                let text = String::from_utf8_lossy(&body);
                classify(true, client.status().unwrap_or(0), &text)
            }
            Err(outcome) => outcome,
        });
    }
    let tally = Tally { outcomes };
    println!(
        "faults slow_clients_reading_a_byte_a_second: {slow_count} slow streams of {:.1} MiB \
         read a byte a second for {} s, the others answered in {:.1} s, proxy RSS {:+.1} MB \
         meanwhile, backend events written by then {streamed} of {}",
        (chunks * CHUNK_BYTES) as f64 / 1048576.0,
        SLOW_PHASE.as_secs(),
        others.as_secs_f64(),
        held as f64 / 1024.0,
        all_events
    );
    tally.report(
        "slow_clients_reading_a_byte_a_second",
        rss_kb(proxy.child.id()) - before,
    );
    assert_eq!(tally.clean_errors(), 0, "{:?}", tally.outcomes);
    assert!(
        streamed < all_events,
        "the backend was held back: it wrote {streamed} of {all_events} events"
    );
    // Held back at the worker, each slow stream costs the proxy well under its whole size.
    let bound_kb = (slow_count * 1024 + 6 * 1024) as i64;
    assert!(
        held < bound_kb,
        "the proxy held {held} KB for {slow_count} slow streams (bound {bound_kb} KB)"
    );
}
