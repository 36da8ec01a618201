//! A network partition between a worker and its proxy: the worker runs in a network namespace
//! of its own, joined to this one by a veth pair, and the link is taken down and brought back.
//! Needs root (to create the namespace); elsewhere the scenario says why it is skipped.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::binary::{modelrelay, unused_port, Running, TempDir};
use super::netns::FarSide;
use super::support::MockBackend;
use super::*;

fn slow_unary() -> Value {
    json!({"model": "m", "messages": [], "mock": {"delay_ms": 1500}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_partition_between_a_worker_and_its_proxy() {
    let far = match FarSide::create("faults", 213) {
        Ok(far) => far,
        Err(why) => {
            println!("faults network_partition_between_a_worker_and_its_proxy: skipped: {why}");
            return;
        }
    };
    let backend = MockBackend::start_at(
        format!("{}:0", far.host_ip).parse().expect("address"),
        &["m"],
    )
    .await;
    let data = TempDir::new("faults-partition");
    let listen = format!("{}:{}", far.host_ip, unused_port());
    let heartbeat = [
        ("HEARTBEAT_INTERVAL_SECS", "1"),
        ("HEARTBEAT_TIMEOUT_SECS", "3"),
        ROOMY_QUEUE,
    ];
    let (proxy, url) = start_proxy_at(&data, &listen, &heartbeat);
    let slots = concurrency();
    let env = [
        ("MAX_CONCURRENCY", slots.as_str()),
        ("PROXY_SILENCE_TIMEOUT_SECS", "4"),
    ];
    let _near = start_worker(&data, "near", &url, &backend.url(), &env);
    let far_worker = {
        let mut inner = modelrelay(&data.path().join("far"));
        inner
            .arg("worker")
            .env("WORKER_SECRET", SECRET)
            .env("PROXY_URL", &url)
            .env("BACKEND_URL", backend.url())
            .env("WORKER_NAME", "far")
            .env("LOG_LEVEL", "warn");
        for (key, value) in env {
            inner.env(key, value);
        }
        Running::spawn(far.command(&inner))
    };
    wait_for_workers(&url, 2).await;
    let before = rss_kb(proxy.child.id());

    // Requests under way on both workers when the link drops.
    let sending = tokio::spawn({
        let url = url.clone();
        let bodies = vec![slow_unary(); 8 * scale()];
        async move { super::scenarios::send_all(&url, bodies).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    far.cut();
    let cut = Instant::now();
    wait_for_workers_within(&url, 1, Duration::from_secs(10)).await;
    let detected = cut.elapsed();
    let mut outcomes = sending.await.expect("clients end");

    far.heal();
    let healed = Instant::now();
    wait_for_workers_within(&url, 2, Duration::from_secs(30)).await;
    let rejoined = healed.elapsed();
    outcomes.extend(super::scenarios::send_all(&url, vec![slow_unary(); 8 * scale()]).await);
    println!(
        "faults network_partition_between_a_worker_and_its_proxy: the proxy dropped the far worker {:.1} s after the cut (heartbeat 1 s, timeout 3 s); it rejoined {:.1} s after the link came back",
        detected.as_secs_f64(),
        rejoined.as_secs_f64()
    );
    let tally = Tally { outcomes };
    tally.report(
        "network_partition_between_a_worker_and_its_proxy",
        rss_kb(proxy.child.id()) - before,
    );
    assert_eq!(
        tally.clean_errors(),
        0,
        "what the far worker held was requeued, not failed: {:?}",
        tally.outcomes
    );
    assert!(detected < Duration::from_secs(6), "{detected:?}");
    drop(far_worker);
}
