//! The relay benchmark: the direct path (client → mock backend) and the relay path
//! (client → proxy → WebSocket → worker → mock backend), measured in one run on this machine,
//! each figure printed with its ratio to direct.
//!
//! Run: `cargo bench -p relay-core --bench relay` (all scenarios), or name scenarios:
//! `cargo bench -p relay-core --bench relay -- unary1 stream64`; `--quick` shortens every scenario
//! for a smoke run; `burst` opens `RELAY_BENCH_BURST` streams at once (default 2,000, 200 with
//! `--quick`). Results: `target/bench/relay.md` and `target/bench/relay.json`.
//! The method is described in BENCHMARKS.md.

mod adapter;
mod backend;
mod burst;
mod cpu;
mod fake_workers;
mod floor;
mod load;
mod native_backend;
mod procs;
mod realstack;
mod report;
mod rest;
#[path = "../../tests/common/rest.rs"]
mod rest_meter;

use std::time::{Duration, Instant};

use procs::{start_backend, start_proxy, start_worker, wait_for_workers, ChildProcess};
use report::Row;

const SCENARIOS: &[&str] = &[
    "unary1",
    "unary64",
    "stream64",
    "idle10k",
    "workers1k",
    "queue",
    "adapter",
    "realstack",
    "burst",
    "rest",
];
const KB: f64 = 1024.0;
/// Time for the allocator to return freed pages after a burst (it purges after a 1 s decay).
const SETTLE: Duration = Duration::from_secs(3);
const MB: f64 = 1024.0 * 1024.0;

/// Sizes of a run: full, or `--quick` for a smoke run.
struct Plan {
    duration: Duration,
    idle_streams: usize,
    idle_events: u64,
    fake_workers: usize,
    idle_window: Duration,
    flood: usize,
    burst_streams: usize,
    /// How long the idle processes of `rest` are watched.
    rest_window: Duration,
}

impl Plan {
    fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                duration: Duration::from_secs(1),
                idle_streams: 500,
                idle_events: 3,
                fake_workers: 100,
                idle_window: Duration::from_secs(3),
                flood: 1000,
                burst_streams: burst::streams(true),
                rest_window: Duration::from_secs(10),
            }
        } else {
            Plan {
                duration: Duration::from_secs(5),
                idle_streams: 10_000,
                idle_events: 10,
                fake_workers: 1000,
                idle_window: Duration::from_secs(20),
                flood: 10_000,
                burst_streams: burst::streams(false),
                // Four heartbeats and two model-list refreshes of every worker.
                rest_window: Duration::from_secs(60),
            }
        }
    }
}

/// A backend, a proxy and one worker.
struct Stack {
    backend: ChildProcess,
    backend_port: u16,
    proxy: ChildProcess,
    proxy_port: u16,
    worker: ChildProcess,
}

impl Stack {
    async fn start(proxy_flags: &[&str], max_concurrency: u32) -> Stack {
        let (backend, backend_port) = start_backend();
        let (proxy, proxy_port) = start_proxy(proxy_flags);
        let worker = start_worker(proxy_port, backend_port, max_concurrency);
        wait_for_workers(&load::client(1), proxy_port, 1).await;
        Stack {
            backend,
            backend_port,
            proxy,
            proxy_port,
            worker,
        }
    }

    fn direct(&self) -> String {
        format!("http://127.0.0.1:{}", self.backend_port)
    }

    fn relay(&self) -> String {
        format!("http://127.0.0.1:{}", self.proxy_port)
    }
}

fn info(scenario: &'static str, figure: &'static str, direct: Option<f64>, relay: f64) -> Row {
    Row {
        scenario,
        figure,
        direct,
        relay,
        target: "–".to_string(),
        met: None,
    }
}

async fn unary_rows(stack: &Stack, plan: &Plan, connections: usize) -> Vec<Row> {
    let scenario = if connections == 1 {
        "unary1"
    } else {
        "unary64"
    };
    let backend_meter = cpu::Meter::start(&[&stack.backend]);
    let mut direct = load::unary(&stack.direct(), connections, plan.duration).await;
    let backend_us = backend_meter.per_unit_us(direct.ok + direct.failed)[0];
    let relay_meter = cpu::Meter::start(&[&stack.proxy, &stack.worker]);
    let mut relay = load::unary(&stack.relay(), connections, plan.duration).await;
    let relay_us = relay_meter.per_unit_us(relay.ok + relay.failed);
    eprintln!(
        "{scenario}: direct {} ok / {} failed; relay {} ok / {} failed",
        direct.ok, direct.failed, relay.ok, relay.failed
    );
    let (d50, r50) = (direct.quantile_ms(0.5), relay.quantile_ms(0.5));
    let (d99, r99) = (direct.quantile_ms(0.99), relay.quantile_ms(0.99));
    let (drate, rrate) = (direct.rate(), relay.rate());
    let mut rows = Vec::new();
    if connections == 1 {
        rows.push(Row {
            scenario,
            figure: "p50 latency (ms)",
            direct: Some(d50),
            relay: r50,
            target: "added ≤ 0.5 ms".to_string(),
            met: Some(r50 - d50 <= 0.5),
        });
        rows.push(info(scenario, "p99 latency (ms)", Some(d99), r99));
        rows.push(info(scenario, "requests/s", Some(drate), rrate));
    } else {
        rows.push(Row {
            scenario,
            figure: "requests/s",
            direct: Some(drate),
            relay: rrate,
            target: "≥ 35% of direct".to_string(),
            met: Some(rrate >= 0.35 * drate),
        });
        rows.push(info(scenario, "p50 latency (ms)", Some(d50), r50));
        rows.push(info(scenario, "p99 latency (ms)", Some(d99), r99));
    }
    rows.push(Row {
        scenario,
        figure: "failed requests",
        direct: Some(direct.failed as f64),
        relay: relay.failed as f64,
        target: "0".to_string(),
        met: Some(relay.failed == 0),
    });
    rows.extend(cpu::rows(
        scenario,
        "request",
        backend_us,
        relay_us[0],
        relay_us[1],
        25.0,
    ));
    rows
}

async fn stream_rows(stack: &Stack, plan: &Plan) -> Vec<Row> {
    let scenario = "stream64";
    let backend_meter = cpu::Meter::start(&[&stack.backend]);
    let mut direct = load::streams(&stack.direct(), 64, 200, plan.duration).await;
    let backend_us = backend_meter.per_unit_us(direct.events)[0];
    let relay_meter = cpu::Meter::start(&[&stack.proxy, &stack.worker]);
    let mut relay = load::streams(&stack.relay(), 64, 200, plan.duration).await;
    let relay_us = relay_meter.per_unit_us(relay.events);
    eprintln!(
        "{scenario}: direct {} streams, relay {} streams ({} failed)",
        direct.ok, relay.ok, relay.failed
    );
    let (drate, rrate) = (direct.events_rate(), relay.events_rate());
    let (d50, r50) = (direct.quantile_ms(0.5), relay.quantile_ms(0.5));
    let (d99, r99) = (direct.quantile_ms(0.99), relay.quantile_ms(0.99));
    let cpu_rows = cpu::rows(scenario, "chunk", backend_us, relay_us[0], relay_us[1], 3.0);
    vec![
        Row {
            scenario,
            figure: "chunks/s",
            direct: Some(drate),
            relay: rrate,
            target: "≥ 50% of direct".to_string(),
            met: Some(rrate >= 0.5 * drate),
        },
        Row {
            scenario,
            figure: "TTFB p50 (ms)",
            direct: Some(d50),
            relay: r50,
            target: "added ≤ 2 ms".to_string(),
            met: Some(r50 - d50 <= 2.0),
        },
        info(scenario, "TTFB p99 (ms)", Some(d99), r99),
        Row {
            scenario,
            figure: "failed streams",
            direct: Some(direct.failed as f64),
            relay: relay.failed as f64,
            target: "0".to_string(),
            met: Some(relay.failed == 0),
        },
    ]
    .into_iter()
    .chain(cpu_rows)
    .collect()
}

async fn idle_rows(plan: &Plan) -> Vec<Row> {
    let scenario = "idle10k";
    let count = plan.idle_streams;
    let stack = Stack::start(&["--max-queue-len", "100000"], count as u32 + 100).await;
    let settle = || std::thread::sleep(Duration::from_millis(500));
    settle();
    let (proxy_before, worker_before, backend_before) =
        (stack.proxy.rss(), stack.worker.rss(), stack.backend.rss());
    let mut peak = (0u64, 0u64, 0u64);
    let outcome = load::idle_streams(
        &stack.relay(),
        count,
        plan.idle_events,
        Duration::from_secs(1),
        || {
            peak = (stack.proxy.rss(), stack.worker.rss(), stack.backend.rss());
        },
    )
    .await;
    // The allocator purges freed pages after a one-second decay; give it time to.
    std::thread::sleep(SETTLE);
    let (proxy_after, worker_after) = (stack.proxy.rss(), stack.worker.rss());
    // A second identical burst tells a one-time high-water residue from a leak.
    let second = load::idle_streams(
        &stack.relay(),
        count,
        plan.idle_events,
        Duration::from_secs(1),
        || {},
    )
    .await;
    std::thread::sleep(SETTLE);
    let proxy_after_second = stack.proxy.rss();
    eprintln!(
        "{scenario}: open fds after: proxy {}, worker {}",
        stack.proxy.open_fds(),
        stack.worker.open_fds()
    );
    eprintln!(
        "{scenario}: {} complete, {} failed; proxy RSS {:.1} → {:.1} → {:.1} MB; worker RSS {:.1} → {:.1} → {:.1} MB",
        outcome.complete, outcome.failed,
        proxy_before as f64 / MB, peak.0 as f64 / MB, proxy_after as f64 / MB,
        worker_before as f64 / MB, peak.1 as f64 / MB, worker_after as f64 / MB
    );
    let per_stream =
        |peak: u64, before: u64| peak.saturating_sub(before) as f64 / count as f64 / KB;
    let proxy_per_stream = per_stream(peak.0, proxy_before);
    vec![
        Row {
            scenario,
            figure: "streams completed",
            direct: None,
            relay: outcome.complete as f64,
            target: format!("all {count}"),
            met: Some(outcome.complete == count as u64),
        },
        Row {
            scenario,
            figure: "proxy KB per open stream (direct: a bare hyper backend)",
            direct: Some(per_stream(peak.2, backend_before)),
            relay: proxy_per_stream,
            target: "≤ 8 KB".to_string(),
            met: Some(proxy_per_stream <= 8.0),
        },
        info(
            scenario,
            "worker KB per open stream",
            None,
            per_stream(peak.1, worker_before),
        ),
        Row {
            scenario,
            figure: "proxy RSS after / before",
            direct: None,
            relay: proxy_after as f64 / proxy_before as f64,
            target: "back to baseline (≤ 1.10)".to_string(),
            met: Some(proxy_after as f64 <= proxy_before as f64 * 1.10),
        },
        Row {
            scenario,
            figure: "proxy RSS after a 2nd burst / after the 1st",
            direct: None,
            relay: proxy_after_second as f64 / proxy_after as f64,
            target: "no growth (≤ 1.05)".to_string(),
            met: Some(
                second.complete == count as u64
                    && proxy_after_second as f64 <= proxy_after as f64 * 1.05,
            ),
        },
    ]
}

async fn workers_rows(plan: &Plan) -> Vec<Row> {
    let scenario = "workers1k";
    let count = plan.fake_workers;
    let (proxy, port) = start_proxy(&[]);
    let workers = fake_workers::connect(port, count).await;
    wait_for_workers(&load::client(1), port, count as u64).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss = proxy.rss();
    let cpu_start = proxy.cpu_seconds();
    let window = Instant::now();
    tokio::time::sleep(plan.idle_window).await;
    let idle_cpu = (proxy.cpu_seconds() - cpu_start) / window.elapsed().as_secs_f64() * 100.0;
    let base = format!("http://127.0.0.1:{port}");
    let mut dispatch = load::unary(&base, 64, plan.duration).await;
    eprintln!(
        "{scenario}: RSS {:.1} MB, idle CPU {idle_cpu:.2}%, {} dispatched ({} failed)",
        rss as f64 / MB,
        dispatch.ok,
        dispatch.failed
    );
    for worker in workers {
        worker.abort();
    }
    vec![
        Row {
            scenario,
            figure: "proxy RSS (MB)",
            direct: None,
            relay: rss as f64 / MB,
            target: "≤ 64 MB".to_string(),
            met: Some(rss as f64 <= 64.0 * MB),
        },
        Row {
            scenario,
            figure: "proxy idle CPU (% of a core)",
            direct: None,
            relay: idle_cpu,
            target: "≤ 2%".to_string(),
            met: Some(idle_cpu <= 2.0),
        },
        info(
            scenario,
            "dispatch p50 (ms)",
            None,
            dispatch.quantile_ms(0.5),
        ),
        info(
            scenario,
            "dispatch p99 (ms)",
            None,
            dispatch.quantile_ms(0.99),
        ),
        info(scenario, "dispatched requests/s", None, dispatch.rate()),
    ]
}

async fn queue_rows(plan: &Plan) -> Vec<Row> {
    let scenario = "queue";
    let count = plan.flood;
    let stack = Stack::start(&["--max-queue-len", &count.to_string()], 8).await;
    std::thread::sleep(Duration::from_millis(500));
    let before = stack.proxy.rss();
    let outcome = load::flood(&stack.relay(), count).await;
    std::thread::sleep(SETTLE);
    let after = stack.proxy.rss();
    let answered = outcome.served + outcome.rejected + outcome.timed_out;
    eprintln!(
        "{scenario}: {outcome:?}; proxy RSS {:.1} → {:.1} MB",
        before as f64 / MB,
        after as f64 / MB
    );
    vec![
        Row {
            scenario,
            figure: "requests answered (served, 429 or 504)",
            direct: None,
            relay: answered as f64,
            target: format!("all {count}"),
            met: Some(answered == count as u64),
        },
        info(scenario, "served", None, outcome.served as f64),
        info(
            scenario,
            "drain rate (requests/s)",
            None,
            outcome.served as f64 / outcome.elapsed.as_secs_f64(),
        ),
        Row {
            scenario,
            figure: "proxy RSS after / before",
            direct: None,
            relay: after as f64 / before as f64,
            target: "≤ 1.10".to_string(),
            met: Some(after as f64 <= before as f64 * 1.10),
        },
    ]
    .into_iter()
    .chain(waiting_rows(&stack, count / 2).await)
    .collect()
}

/// Memory of requests waiting for a busy worker: its slots held by slow streams while `count`
/// requests queue behind them, the proxy's RSS sampled while none of them can be served.
async fn waiting_rows(stack: &Stack, count: usize) -> Vec<Row> {
    const SLOTS: usize = 8;
    const HOLD_EVENTS: u64 = 8;
    let relay = stack.relay();
    let before = stack.proxy.rss();
    let holders = load::idle_streams(&relay, SLOTS, HOLD_EVENTS, Duration::from_secs(1), || {});
    let waiters = async {
        // The holders first, so every slot is taken when the waiters arrive.
        tokio::time::sleep(Duration::from_millis(300)).await;
        load::flood(&relay, count).await
    };
    let sampler = async {
        let mut most = before;
        // Sampling stops a second before the first holder can finish and free a slot.
        let window = Duration::from_secs(HOLD_EVENTS - 1);
        let start = Instant::now();
        while start.elapsed() < window {
            most = most.max(stack.proxy.rss());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        most
    };
    let (held, waited, most) = tokio::join!(holders, waiters, sampler);
    eprintln!(
        "queue: {count} requests waiting behind {} held slots ({} failed): {waited:?}; proxy RSS {:.1} → {:.1} MB",
        held.complete,
        held.failed,
        before as f64 / MB,
        most as f64 / MB
    );
    let answered = waited.served + waited.rejected + waited.timed_out;
    vec![
        Row {
            scenario: "queue",
            figure: "requests waiting for a slot, then answered",
            direct: None,
            relay: answered as f64,
            target: format!("all {count}"),
            met: Some(answered == count as u64 && held.failed == 0),
        },
        info(
            "queue",
            "proxy KB per request waiting for a slot",
            None,
            most.saturating_sub(before) as f64 / KB / count as f64,
        ),
    ]
}

fn footprint_rows(idle_rss: u64) -> Vec<Row> {
    let size = std::fs::metadata(procs::modelrelay_binary())
        .map(|m| m.len())
        .unwrap_or(0);
    vec![
        Row {
            scenario: "footprint",
            figure: "proxy idle RSS (MB)",
            direct: None,
            relay: idle_rss as f64 / MB,
            target: "≤ 10 MB".to_string(),
            met: Some(idle_rss as f64 <= 10.0 * MB),
        },
        Row {
            scenario: "footprint",
            figure: "binary size (MB)",
            direct: None,
            relay: size as f64 / MB,
            target: "≤ 15 MB".to_string(),
            met: Some(size as f64 <= 15.0 * MB),
        },
    ]
}

async fn run(selected: Vec<String>, plan: Plan) -> Vec<Row> {
    let wants = |name: &str| selected.is_empty() || selected.iter().any(|s| s == name);
    let mut rows = Vec::new();
    if ["unary1", "unary64", "stream64"].iter().any(|s| wants(s)) || selected.is_empty() {
        let stack = Stack::start(&[], 1024).await;
        // Idle means settled: the proxy lets go of its start-up code 2 s after it started
        // (relay_core::resident), as a proxy that waits for its first client has.
        std::thread::sleep(relay_core::resident::AFTER_START + Duration::from_secs(1));
        rows.extend(footprint_rows(stack.proxy.rss()));
        if wants("unary1") {
            rows.extend(unary_rows(&stack, &plan, 1).await);
        }
        if wants("unary64") {
            rows.extend(unary_rows(&stack, &plan, 64).await);
        }
        if wants("stream64") {
            rows.extend(stream_rows(&stack, &plan).await);
        }
    }
    if wants("idle10k") {
        rows.extend(idle_rows(&plan).await);
    }
    if wants("workers1k") {
        rows.extend(workers_rows(&plan).await);
    }
    if wants("queue") {
        rows.extend(queue_rows(&plan).await);
    }
    if wants("adapter") {
        rows.extend(adapter::rows(plan.duration).await);
    }
    if wants("realstack") {
        rows.extend(realstack::rows(plan.duration).await);
    }
    if wants("burst") {
        rows.extend(burst::rows(plan.burst_streams).await);
    }
    if wants("rest") {
        rows.extend(rest::rows(plan.rest_window).await);
    }
    rows
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    if args.iter().any(|a| a == "--backend") {
        runtime.block_on(backend::serve(args.iter().any(|a| a == "--native")));
        return;
    }
    if !args.iter().any(|a| a == "--bench") {
        // `cargo test --all-targets` runs bench binaries without `--bench`: measure nothing then.
        eprintln!("the relay benchmark runs with `cargo bench -p relay-core --bench relay`");
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    // `cargo bench` passes `--bench`; anything else that is not a flag names a scenario.
    let selected: Vec<String> = args.into_iter().filter(|a| !a.starts_with("--")).collect();
    for name in &selected {
        assert!(
            SCENARIOS.contains(&name.as_str()),
            "unknown scenario {name}; choose from {SCENARIOS:?}"
        );
    }
    let started = Instant::now();
    let rows = runtime.block_on(run(selected, Plan::new(quick)));
    let table = report::markdown(&rows);
    let machine = format!(
        "{} cores, {}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        std::env::consts::ARCH
    );
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(dir.join("relay.md"), &table);
    let _ = std::fs::write(
        dir.join("relay.json"),
        serde_json::to_string_pretty(&report::json(&rows, &machine)).unwrap_or_default(),
    );
    println!("\n{table}");
    println!(
        "({} in {:.0}s; written to target/bench/relay.md and relay.json)",
        if quick { "quick run" } else { "full run" },
        started.elapsed().as_secs_f64()
    );
}
