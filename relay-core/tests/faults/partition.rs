//! A network partition between a worker and its proxy: the worker runs in a network namespace
//! of its own, joined to this one by a veth pair, and the link is taken down and brought back.
//! Needs root (to create the namespace); elsewhere the scenario says why it is skipped.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::binary::{modelrelay, unused_port, Running, TempDir};
use super::support::MockBackend;
use super::*;

/// A namespace with a veth link to this one; removed on drop.
struct FarSide {
    ns: String,
    host_if: String,
    host_ip: String,
}

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl FarSide {
    /// The namespace and its link, or why they cannot be made here.
    fn create() -> Result<FarSide, String> {
        // Names and a /30 of our own, distinct between concurrent runs.
        let n = (std::process::id() % 200) + 20;
        let ns = format!("mr-faults-{n}");
        let (host_if, far_if) = (format!("mrf{n}h"), format!("mrf{n}w"));
        let (host_ip, far_ip) = (format!("10.213.{n}.1"), format!("10.213.{n}.2"));
        ip(&["link", "del", &host_if]);
        ip(&["netns", "del", &ns]);
        if !ip(&["netns", "add", &ns]) {
            return Err("cannot create a network namespace (needs root and iproute2)".into());
        }
        let side = FarSide {
            ns: ns.clone(),
            host_if: host_if.clone(),
            host_ip: host_ip.clone(),
        };
        let steps: [&[&str]; 7] = [
            &[
                "link", "add", &host_if, "type", "veth", "peer", "name", &far_if,
            ],
            &["link", "set", &far_if, "netns", &ns],
            &["addr", "add", &format!("{host_ip}/30"), "dev", &host_if],
            &["link", "set", &host_if, "up"],
            &[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{far_ip}/30"),
                "dev",
                &far_if,
            ],
            &["-n", &ns, "link", "set", &far_if, "up"],
            &["-n", &ns, "link", "set", "lo", "up"],
        ];
        for step in steps {
            if !ip(step) {
                return Err(format!("`ip {}` failed", step.join(" ")));
            }
        }
        Ok(side)
    }

    /// `command` run inside the namespace, with its arguments and environment.
    fn command(&self, inner: &Command) -> Command {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.ns])
            .arg(inner.get_program())
            .args(inner.get_args())
            .stdin(Stdio::null());
        for (key, value) in inner.get_envs() {
            match value {
                Some(value) => command.env(key, value),
                None => command.env_remove(key),
            };
        }
        command
    }

    fn cut(&self) {
        assert!(ip(&["link", "set", &self.host_if, "down"]), "cut the link");
    }

    fn heal(&self) {
        assert!(ip(&["link", "set", &self.host_if, "up"]), "heal the link");
    }
}

impl Drop for FarSide {
    fn drop(&mut self) {
        ip(&["link", "del", &self.host_if]);
        ip(&["netns", "del", &self.ns]);
    }
}

fn slow_unary() -> Value {
    json!({"model": "m", "messages": [], "mock": {"delay_ms": 1500}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_partition_between_a_worker_and_its_proxy() {
    let far = match FarSide::create() {
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
