//! The fault-injection suite: the real `modelrelay` binaries (a proxy, workers) with real traffic,
//! while processes are killed, backends misbehave and clients flood. Each scenario ends with a
//! line such as
//!
//! `faults worker_killed_mid_stream: accepted 24, answered 24 (4 as clean errors), lost 0, hung 0, proxy RSS +1.2 MB`
//!
//! where *answered* means the client got a whole answer (a complete body, a stream ending with
//! its terminator, or a clean error in its dialect: a status with an error body, or an error
//! event ending the stream), *lost* a connection that broke or a stream cut without either, and
//! *hung* no end within the bound. Lost and hung must be 0.
//!
//! The test command runs a short version; `scripts/faults.sh` runs the same scenarios larger
//! against the release binary (`MODELRELAY_TEST_BIN`, `FAULTS_SCALE`) and prints the table kept
//! in RELIABILITY.md.

#[path = "../common/binary.rs"]
mod binary;
#[path = "../common/inprocess.rs"]
mod inprocess;
#[path = "../common/netns.rs"]
mod netns;
// The contract suite's mock backend; the rest of its support goes unused here.
#[allow(unused_imports)]
#[path = "../contract/support/mod.rs"]
mod support;

mod bad_backends;
mod partition;
mod restarts;
mod scenarios;
mod soak;
mod storage;
mod versions;

use std::time::Duration;

use binary::{modelrelay, Running, TempDir};
use serde_json::Value;

/// The worker secret of every process here.
const SECRET: &str = "faults-secret";
/// No request may take longer than this to end, whatever happened: beyond the proxy's queue
/// timeout (30 s), so a request that waited its whole queue time still counts as answered.
const BOUND: Duration = Duration::from_secs(60);

/// How much larger than the short version to run (`FAULTS_SCALE`, default 1).
fn scale() -> usize {
    std::env::var("FAULTS_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1)
}

/// A worker's `MAX_CONCURRENCY`: the load grows with the scale, and so does the capacity, so
/// that what a scenario measures is the fault, not a queue that is simply too long.
fn concurrency() -> String {
    (4 * scale()).to_string()
}

/// A proxy queue long enough for every request of a scenario (all but the flood).
const ROOMY_QUEUE: (&str, &str) = ("MAX_QUEUE_LEN", "100000");

/// How one request ended.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    /// A whole answer: 200 and a complete body, or a stream ending with `[DONE]`.
    Answered,
    /// A clean error: a status with an error body, or a stream ending with an error event.
    CleanError(u16),
    /// The connection broke, or a stream stopped without terminator or error event.
    Lost(String),
    /// No end within [`BOUND`].
    Hung,
}

/// What a scenario counts.
#[derive(Debug, Default)]
struct Tally {
    outcomes: Vec<Outcome>,
}

impl Tally {
    fn answered(&self) -> usize {
        self.outcomes
            .iter()
            .filter(|o| matches!(o, Outcome::Answered | Outcome::CleanError(_)))
            .count()
    }

    fn clean_errors(&self) -> usize {
        self.count(|o| matches!(o, Outcome::CleanError(_)))
    }

    fn count(&self, which: impl Fn(&Outcome) -> bool) -> usize {
        self.outcomes.iter().filter(|o| which(o)).count()
    }

    fn lost(&self) -> Vec<&Outcome> {
        self.outcomes
            .iter()
            .filter(|o| matches!(o, Outcome::Lost(_)))
            .collect()
    }

    fn hung(&self) -> usize {
        self.count(|o| *o == Outcome::Hung)
    }

    /// Prints the scenario's line and fails when anything was lost or hung.
    fn report(&self, scenario: &str, rss_growth_kb: i64) {
        println!(
            "faults {scenario}: accepted {}, answered {} ({} as clean errors), lost {}, hung {}, proxy RSS {:+.1} MB",
            self.outcomes.len(),
            self.answered(),
            self.clean_errors(),
            self.lost().len(),
            self.hung(),
            rss_growth_kb as f64 / 1024.0
        );
        assert!(self.lost().is_empty(), "{scenario}: lost {:?}", self.lost());
        assert_eq!(self.hung(), 0, "{scenario}: requests hung");
    }
}

/// Sends one request and classifies how it ended.
async fn call(client: &reqwest::Client, url: &str, body: Value) -> Outcome {
    let streaming = body["stream"].as_bool() == Some(true);
    let attempt = async {
        let response = client
            .post(format!("{url}/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| format!("send: {e}"))?;
        let status = response.status().as_u16();
        let text = response.text().await.map_err(|e| format!("body: {e}"))?;
        Ok::<_, String>((status, text))
    };
    match tokio::time::timeout(BOUND, attempt).await {
        Err(_) => Outcome::Hung,
        Ok(Err(why)) => Outcome::Lost(why),
        Ok(Ok((status, text))) => classify(streaming, status, &text),
    }
}

fn classify(streaming: bool, status: u16, text: &str) -> Outcome {
    let error_body = || {
        serde_json::from_str::<Value>(text)
            .ok()
            .is_some_and(|v| v.get("error").is_some())
    };
    if status != 200 {
        return if error_body() {
            Outcome::CleanError(status)
        } else {
            Outcome::Lost(format!("{status} without an error body: {text:.200}"))
        };
    }
    if !streaming {
        return if serde_json::from_str::<Value>(text).is_ok() {
            Outcome::Answered
        } else {
            Outcome::Lost(format!("200 with a body that is not JSON: {text:.200}"))
        };
    }
    let last_data = text
        .lines()
        .rev()
        .find_map(|line| line.strip_prefix("data:"))
        .map(str::trim);
    match last_data {
        Some("[DONE]") => Outcome::Answered,
        Some(data) if data.contains("\"error\"") => Outcome::CleanError(200),
        _ => Outcome::Lost(format!("a stream cut without terminator: {text:.300}")),
    }
}

/// A process's resident memory in KiB.
fn rss_kb(pid: u32) -> i64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// The control API's token of every proxy here (beyond loopback it guards `/api/status`).
const ADMIN_TOKEN: &str = "faults-admin-token-0123";

/// `GET route` with the admin token, as JSON.
async fn admin_json(url: &str, route: &str) -> Value {
    let text = inprocess::http()
        .get(format!("{url}{route}"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect(route)
        .text()
        .await
        .expect(route);
    serde_json::from_str(&text).expect(route)
}

/// A proxy (`modelrelay serve`) on 127.0.0.1:`port` with `env`.
fn start_proxy(data: &TempDir, port: u16, env: &[(&str, &str)]) -> (Running, String) {
    start_proxy_at(data, &format!("127.0.0.1:{port}"), env)
}

/// A proxy listening on `listen` with `env`; its URL from the banner.
fn start_proxy_at(data: &TempDir, listen: &str, env: &[(&str, &str)]) -> (Running, String) {
    spawn_proxy(proxy_command(data, listen, env))
}

/// The command [`start_proxy_at`] runs.
fn proxy_command(data: &TempDir, listen: &str, env: &[(&str, &str)]) -> std::process::Command {
    let mut command = modelrelay(data.path());
    command
        .args(["serve", "--listen", listen])
        .env("WORKER_SECRET", SECRET)
        .env("MODELRELAY_ADMIN_TOKEN", ADMIN_TOKEN)
        .env("LOG_LEVEL", "warn");
    for (name, value) in env {
        command.env(name, value);
    }
    command
}

/// Runs a proxy's `command`; its URL from the banner.
fn spawn_proxy(command: std::process::Command) -> (Running, String) {
    let mut proxy = Running::spawn(command);
    let banner = proxy.wait_for_stdout_line("ModelRelay is serving at ");
    let url = banner
        .split("ModelRelay is serving at ")
        .nth(1)
        .expect("the banner names the URL")
        .trim()
        .to_string();
    (proxy, url)
}

/// A worker (`modelrelay worker`) joining `proxy_url`, forwarding to `backend`.
fn start_worker(
    data: &TempDir,
    name: &str,
    proxy_url: &str,
    backend: &str,
    env: &[(&str, &str)],
) -> Running {
    Running::spawn(worker_command(data, name, proxy_url, backend, env))
}

/// The command [`start_worker`] runs.
fn worker_command(
    data: &TempDir,
    name: &str,
    proxy_url: &str,
    backend: &str,
    env: &[(&str, &str)],
) -> std::process::Command {
    let mut command = modelrelay(&data.path().join(name));
    command
        .arg("worker")
        .env("WORKER_SECRET", SECRET)
        .env("PROXY_URL", proxy_url)
        .env("BACKEND_URL", backend)
        .env("WORKER_NAME", name)
        .env("LOG_LEVEL", "warn");
    for (key, value) in env {
        command.env(key, value);
    }
    command
}

/// `command` with another program (the same arguments and environment).
fn with_program(
    command: &std::process::Command,
    program: &std::path::Path,
) -> std::process::Command {
    let mut other = std::process::Command::new(program);
    other.args(command.get_args());
    for (name, value) in command.get_envs() {
        match value {
            Some(value) => other.env(name, value),
            None => other.env_remove(name),
        };
    }
    other
}

/// Waits until the proxy's dashboard lists `count` workers.
async fn wait_for_workers(url: &str, count: usize) -> Duration {
    wait_for_workers_within(url, count, BOUND).await
}

/// [`wait_for_workers`] with its own bound.
async fn wait_for_workers_within(url: &str, count: usize, bound: Duration) -> Duration {
    let started = std::time::Instant::now();
    let client = inprocess::http();
    loop {
        let status = client
            .get(format!("{url}/api/status"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await;
        if let Ok(response) = status {
            let text = response.text().await.unwrap_or_default();
            let body: Value = serde_json::from_str(&text).unwrap_or_default();
            if body["workers"].as_array().map_or(0, Vec::len) == count {
                return started.elapsed();
            }
        }
        assert!(
            started.elapsed() < bound,
            "the proxy at {url} did not list {count} workers within {bound:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
