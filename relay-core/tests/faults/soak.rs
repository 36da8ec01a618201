//! The soak: traffic and faults mixed for `SOAK_MINUTES` (only when set: `scripts/faults.sh`
//! with `SOAK_MINUTES=30`), checking that nothing is lost or hung and that the proxy's memory
//! stays flat. Every second: unary requests and streams. Every 2 minutes one worker is killed
//! (`kill -9`) and started again; every 5 minutes a flood of 500 requests hits a short queue.
//! The proxy's RSS is sampled every 10 s and printed as a curve, minute by minute.

use std::time::{Duration, Instant};

use serde_json::json;

use super::binary::{unused_port, TempDir};
use super::scenarios::send_all;
use super::support::MockBackend;
use super::*;

/// How long each soak runs: `SOAK_MINUTES`, when set.
fn soak_minutes() -> Option<u64> {
    std::env::var("SOAK_MINUTES").ok()?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_with_traffic_and_faults() {
    let Some(minutes) = soak_minutes() else {
        println!("faults soak: skipped (set SOAK_MINUTES, e.g. SOAK_MINUTES=30 scripts/faults.sh)");
        return;
    };
    let backend = MockBackend::start(&["m"]).await;
    let data = TempDir::new("faults-soak");
    let env = [("MAX_QUEUE_LEN", "200")];
    let (proxy, url) = start_proxy(&data, unused_port(), &env);
    let worker_env = [("MAX_CONCURRENCY", "8")];
    let mut workers = [
        start_worker(&data, "soak-a", &url, &backend.url(), &worker_env),
        start_worker(&data, "soak-b", &url, &backend.url(), &worker_env),
    ];
    wait_for_workers(&url, 2).await;
    let pid = proxy.child.id();
    let started = Instant::now();
    let end = started + Duration::from_secs(minutes * 60);
    let mut tally = Tally::default();
    let mut samples: Vec<(u64, i64)> = Vec::new();
    let mut next_sample = started;
    let mut next_kill = started + Duration::from_secs(120);
    let mut next_flood = started + Duration::from_secs(300);
    let mut victim = 0;
    while Instant::now() < end {
        let tick = Instant::now();
        if tick >= next_sample {
            samples.push((started.elapsed().as_secs(), rss_kb(pid)));
            next_sample += Duration::from_secs(10);
        }
        if tick >= next_kill {
            let name = ["soak-a", "soak-b"][victim];
            workers[victim].child.kill().expect("SIGKILL a worker");
            let _ = workers[victim].child.wait();
            workers[victim] = start_worker(&data, name, &url, &backend.url(), &worker_env);
            victim = 1 - victim;
            next_kill += Duration::from_secs(120);
        }
        let mut bodies = vec![json!({"model": "m", "messages": [], "mock": {"delay_ms": 20}}); 10];
        bodies.extend(vec![
            json!({"model": "m", "stream": true, "messages": [],
                   "mock": {"chunks": 10, "chunk_delay_ms": 50}});
            4
        ]);
        if tick >= next_flood {
            bodies.extend(vec![
                json!({"model": "m", "messages": [], "mock": {"delay_ms": 100}});
                500
            ]);
            next_flood += Duration::from_secs(300);
        }
        tally.outcomes.extend(send_all(&url, bodies).await);
        let rest = Duration::from_secs(1).saturating_sub(tick.elapsed());
        tokio::time::sleep(rest).await;
    }
    samples.push((started.elapsed().as_secs(), rss_kb(pid)));
    println!("faults soak: proxy RSS over {minutes} min (minute: MB)");
    for (secs, kb) in samples.iter().filter(|(secs, _)| secs % 60 < 10) {
        println!(
            "faults soak:   {:>3}: {:.1}",
            secs / 60,
            *kb as f64 / 1024.0
        );
    }
    // Flat: the last quarter's median within 10% (and 4 MB) of the second quarter's, after the
    // first floods and kills have grown the allocator's pools to their working size.
    let quarter = samples.len() / 4;
    let median = |part: &[(u64, i64)]| {
        let mut kb: Vec<i64> = part.iter().map(|(_, kb)| *kb).collect();
        kb.sort_unstable();
        kb[kb.len() / 2]
    };
    let early = median(&samples[quarter..2 * quarter]);
    let late = median(&samples[3 * quarter..]);
    let growth = late - early;
    tally.report("soak", growth);
    assert!(
        growth <= (early / 10).max(4096),
        "RSS grew from {early} KB to {late} KB"
    );
    let refused = tally.count(|o| *o == Outcome::CleanError(429));
    println!(
        "faults soak: {} requests, {refused} refused by the floods' full queue",
        tally.outcomes.len()
    );
}

/// The soak with the proxy restarted the ordinary way (SIGTERM, as `systemctl restart` or an
/// upgrade does) every `SOAK_RESTART_EVERY_SECS` (default 180) for `SOAK_MINUTES`, under the same
/// traffic: each restart lands while a batch is under way, which must finish in the drain; the
/// proxy exits 0; started again on the same port, both workers must be back within 5 s with
/// nobody touching them. Between the signal and the new proxy listening no request is sent (a
/// client would get a refused connection, not a lost request). Nothing lost or hung.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_with_proxy_restarts() {
    let Some(minutes) = soak_minutes() else {
        println!("faults soak with proxy restarts: skipped (set SOAK_MINUTES)");
        return;
    };
    let every = Duration::from_secs(
        std::env::var("SOAK_RESTART_EVERY_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(180),
    );
    let backend = MockBackend::start(&["m"]).await;
    let data = TempDir::new("faults-soak-restarts");
    let port = unused_port();
    let env = [("MAX_QUEUE_LEN", "200"), ("DRAIN_TIMEOUT_SECS", "30")];
    let (mut proxy, url) = start_proxy(&data, port, &env);
    let worker_env = [("MAX_CONCURRENCY", "8")];
    let _workers = [
        start_worker(&data, "soak-a", &url, &backend.url(), &worker_env),
        start_worker(&data, "soak-b", &url, &backend.url(), &worker_env),
    ];
    wait_for_workers(&url, 2).await;
    let batch = || {
        let mut bodies = vec![json!({"model": "m", "messages": [], "mock": {"delay_ms": 20}}); 10];
        bodies.extend(vec![
            json!({"model": "m", "stream": true, "messages": [],
                   "mock": {"chunks": 10, "chunk_delay_ms": 50}});
            4
        ]);
        bodies
    };
    let started = Instant::now();
    let end = started + Duration::from_secs(minutes * 60);
    let mut next_restart = started + every;
    let mut tally = Tally::default();
    let mut back_after: Vec<Duration> = Vec::new();
    while Instant::now() < end {
        let tick = Instant::now();
        if tick >= next_restart {
            // A batch under way when the signal comes: the drain must finish it.
            let under_way = tokio::spawn({
                let url = url.clone();
                let bodies = batch();
                async move { send_all(&url, bodies).await }
            });
            tokio::time::sleep(Duration::from_millis(150)).await;
            let status = tokio::task::spawn_blocking(move || {
                let status = proxy.terminate();
                (status, proxy)
            })
            .await
            .expect("the stop ends");
            assert_eq!(status.0.code(), Some(0), "SIGTERM drains and exits 0");
            drop(status.1);
            tally
                .outcomes
                .extend(under_way.await.expect("the batch ends"));
            let (again, again_url) = start_proxy(&data, port, &env);
            assert_eq!(again_url, url, "the same address");
            proxy = again;
            back_after.push(wait_for_workers_within(&url, 2, Duration::from_secs(5)).await);
            next_restart += every;
        }
        tally.outcomes.extend(send_all(&url, batch()).await);
        let rest = Duration::from_secs(1).saturating_sub(tick.elapsed());
        tokio::time::sleep(rest).await;
    }
    let slowest = back_after.iter().max().copied().unwrap_or_default();
    println!(
        "faults soak with proxy restarts: {} requests over {minutes} min, {} restarts (SIGTERM), \
         both workers back after each within {:.1} s of the proxy listening",
        tally.outcomes.len(),
        back_after.len(),
        slowest.as_secs_f64()
    );
    tally.report("soak_with_proxy_restarts", 0);
}
