//! Day two (issue 28): the proxy restarted the ordinary way — SIGTERM, as `systemctl restart`,
//! Ctrl-C or the tray's *Quit* send it — while streams run, and a worker or the proxy frozen
//! (SIGSTOP, as a suspended box or a stopped container is) then thawed. Each counts what it
//! accepted; nothing may be lost or hang, and every worker comes back by itself.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::binary::{unused_port, TempDir};
use super::scenarios::send_all;
use super::support::MockBackend;
use super::*;

fn stream(chunks: u32, chunk_delay_ms: u64) -> Value {
    json!({"model": "m", "stream": true, "messages": [],
           "mock": {"chunks": chunks, "chunk_delay_ms": chunk_delay_ms}})
}

fn unary(delay_ms: u64) -> Value {
    json!({"model": "m", "messages": [], "mock": {"delay_ms": delay_ms}})
}

/// Sends `signal` (`TERM`, `STOP`, `CONT`) to `pid`.
fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} {pid}");
}

/// How long a frozen process stays frozen: `FAULTS_FREEZE_SECS` (scripts/faults.sh runs 120),
/// else long enough for the proxy to give a silent worker up (its heartbeat timeout here is 3 s).
fn freeze() -> Duration {
    Duration::from_secs(
        std::env::var("FAULTS_FREEZE_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(6),
    )
}

/// A proxy quick to notice a silent worker: pings every second, gone after 3 s of silence.
const QUICK_HEARTBEAT: [(&str, &str); 2] = [
    ("HEARTBEAT_INTERVAL_SECS", "1"),
    ("HEARTBEAT_TIMEOUT_SECS", "3"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_restarted_with_sigterm_while_streams_run() {
    let backend = MockBackend::start(&["m"]).await;
    let data = TempDir::new("faults-sigterm-proxy");
    let port = unused_port();
    let drain = ("DRAIN_TIMEOUT_SECS", "20");
    let (mut first, url) = start_proxy(&data, port, &[ROOMY_QUEUE, drain]);
    let slots = concurrency();
    let env = [("MAX_CONCURRENCY", slots.as_str())];
    let _a = start_worker(&data, "a", &url, &backend.url(), &env);
    let _b = start_worker(&data, "b", &url, &backend.url(), &env);
    wait_for_workers(&url, 2).await;

    // Streams of about 2 s under way when the proxy is told to stop: the drain lets them end.
    let under_way = tokio::spawn({
        let url = url.clone();
        async move { send_all(&url, vec![stream(20, 100); 8 * scale()]).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    signal(first.child.id(), "TERM");
    let status = tokio::task::spawn_blocking(move || {
        let status = first.wait_exit(Duration::from_secs(30));
        (status, first)
    })
    .await
    .expect("the wait ends");
    assert_eq!(status.0.code(), Some(0), "SIGTERM drains and exits 0");

    // The same proxy started again, as a service manager would: every worker back by itself.
    let (proxy, again) = start_proxy(&data, port, &[ROOMY_QUEUE, drain]);
    assert_eq!(again, url, "the same address");
    let listening = Instant::now();
    let back = wait_for_workers_within(&url, 2, Duration::from_secs(5)).await;
    let before = rss_kb(proxy.child.id());
    let after: Vec<Value> = (0..16 * scale())
        .map(|i| {
            if i % 4 == 0 {
                stream(10, 20)
            } else {
                unary(20)
            }
        })
        .collect();
    let mut outcomes = under_way.await.expect("the streams end");
    let drained = outcomes.len();
    assert!(
        outcomes.iter().all(|o| *o == Outcome::Answered),
        "the streams under way finished in the drain: {outcomes:?}"
    );
    outcomes.extend(send_all(&url, after).await);
    let tally = Tally { outcomes };
    println!(
        "faults proxy_restarted_with_sigterm_while_streams_run: {drained} streams finished in the \
         drain, both workers back {:.1} s after the proxy listened again",
        back.as_secs_f64()
    );
    tally.report(
        "proxy_restarted_with_sigterm_while_streams_run",
        rss_kb(proxy.child.id()) - before,
    );
    assert_eq!(tally.clean_errors(), 0, "{:?}", tally.outcomes);
    assert!(
        back <= listening.elapsed() && back < Duration::from_secs(5),
        "{back:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_and_then_the_proxy_frozen_and_thawed() {
    let backend = MockBackend::start(&["m"]).await;
    let data = TempDir::new("faults-frozen");
    let port = unused_port();
    let env = [ROOMY_QUEUE, QUICK_HEARTBEAT[0], QUICK_HEARTBEAT[1]];
    let (proxy, url) = start_proxy(&data, port, &env);
    let slots = concurrency();
    let worker_env = [("MAX_CONCURRENCY", slots.as_str())];
    let a = start_worker(&data, "a", &url, &backend.url(), &worker_env);
    let _b = start_worker(&data, "b", &url, &backend.url(), &worker_env);
    wait_for_workers(&url, 2).await;
    let before = rss_kb(proxy.child.id());

    // A worker frozen with requests on it: the proxy gives it up after the heartbeat timeout and
    // sends its requests to the other one; thawed, it finds its connection gone, drops what it
    // can no longer answer, and joins again.
    let load = tokio::spawn({
        let url = url.clone();
        async move { send_all(&url, vec![unary(300); 16 * scale()]).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    signal(a.child.id(), "STOP");
    tokio::time::sleep(freeze()).await;
    signal(a.child.id(), "CONT");
    // Given up by the proxy during the freeze (3 s of silence), it is listed again only once it
    // has joined anew.
    let worker_back = wait_for_workers_within(&url, 2, Duration::from_secs(30)).await;
    let mut outcomes = load.await.expect("the load ends");

    // The proxy frozen with nothing in flight: thawed, it serves again and both workers are
    // (or are soon again) connected.
    signal(proxy.child.id(), "STOP");
    tokio::time::sleep(freeze()).await;
    signal(proxy.child.id(), "CONT");
    let thawed = Instant::now();
    wait_for_workers_within(&url, 2, Duration::from_secs(30)).await;
    outcomes.extend(send_all(&url, vec![unary(20); 16 * scale()]).await);
    let proxy_back = thawed.elapsed();
    // Frozen past the workers' silence timeout, they gave the proxy up and kept trying; each
    // attempt that timed out against the frozen proxy started the next at once, so one is under
    // way when it thaws.
    assert!(proxy_back < Duration::from_secs(5), "{proxy_back:?}");

    let tally = Tally { outcomes };
    println!(
        "faults a_worker_and_then_the_proxy_frozen_and_thawed: frozen {} s each; the worker \
         back {:.1} s after its thaw, the proxy serving both workers {:.1} s after its own",
        freeze().as_secs(),
        worker_back.as_secs_f64(),
        proxy_back.as_secs_f64()
    );
    tally.report(
        "a_worker_and_then_the_proxy_frozen_and_thawed",
        rss_kb(proxy.child.id()) - before,
    );
    assert_eq!(tally.clean_errors(), 0, "{:?}", tally.outcomes);
}

/// Whether SQLite finds the database file at `path` whole (`PRAGMA integrity_check`), by the
/// system's Python (its `sqlite3` module is SQLite itself).
fn integrity_of(path: &std::path::Path) -> String {
    let output = std::process::Command::new("python3")
        .args([
            "-c",
            "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('PRAGMA integrity_check').fetchone()[0])",
        ])
        .arg(path)
        .output()
        .expect("run python3");
    String::from_utf8_lossy(&output.stdout).trim().to_string()
        + &String::from_utf8_lossy(&output.stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_killed_while_keys_are_made_and_usage_is_written() {
    let backend = MockBackend::start(&["m"]).await;
    let data = TempDir::new("faults-kill-writes");
    let port = unused_port();
    let (mut first, url) = start_proxy(&data, port, &[ROOMY_QUEUE]);
    let slots = concurrency();
    let _a = start_worker(
        &data,
        "a",
        &url,
        &backend.url(),
        &[("MAX_CONCURRENCY", &slots)],
    );
    wait_for_workers(&url, 1).await;
    let client = inprocess::http();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));

    // Keys made one after another, each noted once the relay answered 201 with it.
    let made = tokio::spawn({
        let (client, url, stop) = (client.clone(), url.clone(), stop.clone());
        async move {
            let mut made = Vec::new();
            for i in 0.. {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let answer = client
                    .post(format!("{url}/api/keys"))
                    .bearer_auth(ADMIN_TOKEN)
                    .header("content-type", "application/json")
                    .body(json!({"name": format!("key-{i}")}).to_string())
                    .send()
                    .await;
                let Ok(answer) = answer else { continue };
                if answer.status().as_u16() == 201 {
                    let text = answer.text().await.unwrap_or_default();
                    let key: Value = serde_json::from_str(&text).unwrap_or_default();
                    if let Some(id) = key["id"].as_str() {
                        made.push(id.to_string());
                    }
                }
            }
            made
        }
    });
    // Requests from four clients at once, each answer's time noted.
    let answered: Vec<_> = (0..4)
        .map(|_| {
            let (client, url, stop) = (client.clone(), url.clone(), stop.clone());
            tokio::spawn(async move {
                let mut at = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if call(&client, &url, unary(0)).await == Outcome::Answered {
                        at.push(Instant::now());
                    }
                }
                at
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    first.child.kill().expect("SIGKILL the proxy");
    let killed = Instant::now();
    let _ = first.child.wait();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let made = made.await.expect("the key maker ends");
    let mut times = Vec::new();
    for task in answered {
        times.extend(task.await.expect("a client ends"));
    }
    let answered = times.len();
    // The usage writer stores every 500 ms (or 2,000 records): what ended in the last second
    // before the kill may not have been stored yet; nothing older may be missing.
    let recent = times
        .iter()
        .filter(|t| killed.duration_since(**t) < Duration::from_secs(1))
        .count();

    let database = data.path().join("modelrelay.db");
    assert_eq!(integrity_of(&database), "ok", "{}", database.display());
    let (_proxy, again) = start_proxy(&data, port, &[ROOMY_QUEUE]);
    let keys = admin_json(&again, "/api/keys").await;
    let kept: std::collections::BTreeSet<&str> = keys["keys"]
        .as_array()
        .or(keys.as_array())
        .into_iter()
        .flatten()
        .filter_map(|k| k["id"].as_str())
        .collect();
    let missing: Vec<&String> = made
        .iter()
        .filter(|id| !kept.contains(id.as_str()))
        .collect();
    let usage = admin_json(&again, "/api/usage").await;
    let stored = usage["totals"]["requests"].as_u64().unwrap_or(0) as usize;
    println!(
        "faults proxy_killed_while_keys_are_made_and_usage_is_written: database integrity ok; \
         {} keys answered, {} kept; {answered} requests answered, {stored} in the usage records \
         ({} not stored, {recent} answered in the last second before the kill)",
        made.len(),
        made.len() - missing.len(),
        answered.saturating_sub(stored),
    );
    assert!(
        made.len() >= 5 && answered >= 20,
        "the load ran: {made:?} {answered}"
    );
    assert!(
        missing.is_empty(),
        "keys answered to a client and lost: {missing:?}"
    );
    assert!(
        stored + recent >= answered,
        "usage lost beyond the last second: {answered} answered, {stored} stored, {recent} recent"
    );
}
