//! An idle box must cost nothing (issue 24): the real `modelrelay` binary, started the ways a box
//! runs it, settled, then watched for a few seconds with no client and no request. A task that
//! wakes itself — a watch read through a stale copy, a `select!` branch always ready — costs a
//! whole core and thousands of wake-ups a second; the bounds here are far above what an idle
//! process needs (~0% of a core, a few wake-ups a second: BENCHMARKS.md, "Rest") and far below
//! what such a loop burns, so a busy CI machine passes and a busy loop cannot.
//!
//! CPU and wake-ups are read from `/proc` (`common/rest.rs`). Linux only; elsewhere the tests
//! skip.

#[path = "common/binary.rs"]
mod binary;
#[path = "common/rest.rs"]
mod rest;

use binary::*;
use rest::{Reading, Rest};

use std::thread;
use std::time::Duration;

/// How long a started process may settle (connect, register, first samples) before it is watched.
const SETTLE: Duration = Duration::from_secs(3);
/// How long it is watched.
const WATCH: Duration = Duration::from_secs(5);
/// The most CPU an idle process may use while watched: 5% of one core.
const MAX_CORE_SHARE: f64 = 0.05;
/// The most wake-ups per second while watched (a busy loop makes thousands).
const MAX_WAKEUPS_PER_SEC: f64 = 200.0;

/// Watches `processes` for [`WATCH`] and returns what each used.
fn watch_rest(processes: &[&Running]) -> Vec<Rest> {
    let read = |p: &&Running| Reading::of(p.child.id()).expect("the process is running");
    let before: Vec<Reading> = processes.iter().map(read).collect();
    thread::sleep(WATCH);
    processes
        .iter()
        .map(read)
        .zip(&before)
        .map(|(after, before)| after.since(before))
        .collect()
}

fn assert_at_rest(what: &str, rest: &Rest, process: &Running) {
    assert!(
        rest.core_share() <= MAX_CORE_SHARE,
        "{what} used {:.1}% of a core while idle ({:.2} s CPU in {:.1} s, {:.0} wake-ups/s): \
         something wakes itself\n{}",
        rest.core_share() * 100.0,
        rest.cpu_seconds,
        rest.elapsed.as_secs_f64(),
        rest.wakeups_per_sec(),
        process.output()
    );
    assert!(
        rest.wakeups_per_sec() <= MAX_WAKEUPS_PER_SEC,
        "{what} woke {:.0} times a second while idle ({:.1}% of a core)\n{}",
        rest.wakeups_per_sec(),
        rest.core_share() * 100.0,
        process.output()
    );
}

fn workers_connected(url: &str) -> u64 {
    get_json(&format!("{url}/health"))["workers_connected"]
        .as_u64()
        .unwrap_or(0)
}

fn on_linux() -> bool {
    if std::path::Path::new("/proc/self/stat").exists() {
        return true;
    }
    eprintln!("skipped: /proc is Linux's");
    false
}

#[test]
fn an_idle_node_with_both_roles_uses_almost_no_cpu() {
    if !on_linux() {
        return;
    }
    let backend = model_server("127.0.0.1", "unused");
    let data = TempDir::new("idle-node");
    let mut command = modelrelay(data.path());
    // Zero configuration, as the tray runs it at login: proxy and worker in one process, the
    // worker finding this machine's model server by discovery.
    command
        .args(["--listen", "127.0.0.1:0"])
        .env("MODELRELAY_DISCOVERY_PORTS", backend.to_string());
    let mut node = Running::spawn(command);
    let url = node.relay_url();
    eventually("the node's own worker connects", &node, || {
        workers_connected(&url) == 1
    });
    thread::sleep(SETTLE);
    let rest = watch_rest(&[&node]);
    eprintln!("idle node, both roles: {:?}", rest[0]);
    assert_at_rest("an idle node with both roles", &rest[0], &node);
    node.terminate_cleanly();
}

#[test]
fn an_idle_worker_only_node_joined_to_a_proxy_and_that_proxy_use_almost_no_cpu() {
    if !on_linux() {
        return;
    }
    let backend = model_server("127.0.0.1", "unused");
    let proxy_data = TempDir::new("idle-proxy");
    let mut command = modelrelay(proxy_data.path());
    command.args(["serve", "--listen", "127.0.0.1:0"]);
    let mut proxy = Running::spawn(command);
    let url = proxy.relay_url();
    let secret =
        std::fs::read_to_string(proxy_data.path().join("worker-secret")).expect("proxy secret");

    // A GPU box that joined another proxy: a node with the worker role only.
    let node_data = TempDir::new("idle-worker-node");
    let config = node_data.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[roles]\nproxy = false\nworker = true\n\n[worker]\nproxy_url = \"{url}\"\n\
             worker_secret = \"{}\"\nbackend_url = \"http://127.0.0.1:{backend}\"\n\
             models = [\"m1\"]\n",
            secret.trim()
        ),
    )
    .expect("write the node's config");
    let mut command = modelrelay(node_data.path());
    command
        .arg("--config")
        .arg(&config)
        .args(["--listen", "127.0.0.1:0"]);
    let mut node = Running::spawn(command);
    eventually("the node's worker joins the proxy", &node, || {
        workers_connected(&url) == 1
    });
    thread::sleep(SETTLE);
    let rest = watch_rest(&[&node, &proxy]);
    eprintln!(
        "idle worker-only node: {:?}; its proxy: {:?}",
        rest[0], rest[1]
    );
    assert_at_rest("an idle worker-only node", &rest[0], &node);
    assert_at_rest("an idle proxy with one worker", &rest[1], &proxy);
    node.terminate_cleanly();
    proxy.terminate_cleanly();
}

/// The share of the executable's code mapping that is resident in process `pid`.
fn resident_code_share(pid: u32) -> f64 {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).expect("the process's executable");
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).expect("its smaps");
    let (mut size, mut rss, mut in_code) = (0u64, 0u64, false);
    for line in smaps.lines() {
        let fields: Vec<&str> = line.split_ascii_whitespace().collect();
        if fields.len() >= 5
            && fields[0].contains('-')
            && fields[0]
                .bytes()
                .all(|b| b.is_ascii_hexdigit() || b == b'-')
        {
            in_code = fields[1] == "r-xp" && line.trim_end().ends_with(&*exe.to_string_lossy());
            continue;
        }
        let kib = || {
            fields
                .get(1)
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0)
        };
        match fields.first() {
            Some(&"Size:") if in_code => size += kib(),
            Some(&"Rss:") if in_code => rss += kib(),
            _ => {}
        }
    }
    assert!(size > 0, "no code mapping of {}", exe.display());
    rss as f64 / size as f64
}

#[test]
fn a_started_proxy_lets_go_of_its_start_up_code_and_serves_on() {
    if !on_linux() {
        return;
    }
    let data = TempDir::new("idle-code");
    let mut command = modelrelay(data.path());
    command.args(["serve", "--listen", "127.0.0.1:0"]);
    let mut proxy = Running::spawn(command);
    let url = proxy.relay_url();
    // Start-up maps most of the binary's code (fault-around); once started, the proxy drops
    // that mapping (relay_core::resident) and only what runs maps back.
    thread::sleep(SETTLE);
    let share = resident_code_share(proxy.child.id());
    eprintln!(
        "resident share of the code mapping after start: {:.0}%",
        share * 100.0
    );
    assert!(
        share < 0.5,
        "{:.0}% of the code still mapped",
        share * 100.0
    );
    // Code runs again as it is needed.
    for _ in 0..3 {
        assert_eq!(get_json(&format!("{url}/health"))["status"], "ok");
    }
    proxy.terminate_cleanly();
}
