//! End-to-end harness: a real proxy on 127.0.0.1:0 and the real worker daemon with a model map,
//! either in this process (`worker::run`) or as a `modelrelay worker` child process that a test
//! can kill with SIGKILL. Model servers are found by the pids their logs (or the pid files)
//! name, and killed on drop if a test fails before stopping them.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use relay_core::lifecycle::{os, LifecycleConfig};
use relay_core::proxy::{ProxyConfig, RunningProxy};
use relay_core::worker::{self, Backends, WorkerConfig};
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::support::*;

/// The worker secret of every test proxy.
pub const SECRET: &str = "lifecycle-secret";

/// A proxy with short timers on 127.0.0.1:0.
pub async fn start_proxy() -> RunningProxy {
    let mut config = ProxyConfig::with_secret(SECRET);
    config.heartbeat_interval = Duration::from_millis(500);
    config.heartbeat_timeout = Duration::from_secs(10);
    config.drain_timeout = Duration::from_secs(5);
    crate::inprocess::start_proxy(config).await
}

/// A worker joining `proxy` with `lifecycle` as its model map, keeping its pid files under
/// `data_dir`, with no backend of its own and short timers.
pub fn worker_config(
    proxy: &RunningProxy,
    lifecycle: LifecycleConfig,
    data_dir: &Path,
) -> WorkerConfig {
    let mut config = WorkerConfig::new(&proxy.url(), SECRET, "http://unused");
    config.name = "lifecycle-worker".to_string();
    config.backends = Backends::Fixed(Vec::new());
    config.lifecycle = Some(lifecycle);
    config.data_dir = data_dir.to_path_buf();
    config.reconnect_min = Duration::from_millis(100);
    config.reconnect_max = Duration::from_millis(500);
    config.model_refresh_interval = Duration::from_secs(1);
    config.drain_timeout = Duration::from_secs(5);
    config
}

/// A proxy and an in-process worker, plus a guard that kills every model server they started.
pub struct Relay {
    pub proxy: Option<RunningProxy>,
    pub url: String,
    pub dir: TempDir,
    worker: Option<(watch::Sender<bool>, JoinHandle<()>)>,
    logs: Vec<PathBuf>,
    /// Pids seen in pid files: model servers whose logs the harness cannot read (real ones).
    seen: Vec<u32>,
}

impl Relay {
    /// A fresh proxy and a worker with `lifecycle`, whose data directory is `dir/data`; `logs`
    /// are the fake servers' start logs (checked and cleaned up by pid).
    pub async fn start(dir: TempDir, lifecycle: LifecycleConfig, logs: &[PathBuf]) -> Relay {
        let proxy = start_proxy().await;
        let config = worker_config(&proxy, lifecycle, &dir.join("data"));
        Relay::start_with(proxy, dir, config, logs).await
    }

    /// A proxy and a worker with a full configuration.
    pub async fn start_with(
        proxy: RunningProxy,
        dir: TempDir,
        config: WorkerConfig,
        logs: &[PathBuf],
    ) -> Relay {
        let mut relay = Relay::idle(proxy, dir, logs);
        relay.start_worker(config);
        relay
    }

    /// A proxy with no in-process worker yet (one may join from another process).
    pub fn idle(proxy: RunningProxy, dir: TempDir, logs: &[PathBuf]) -> Relay {
        Relay {
            url: proxy.url(),
            proxy: Some(proxy),
            dir,
            worker: None,
            logs: logs.to_vec(),
            seen: Vec::new(),
        }
    }

    /// Starts (another) in-process worker.
    pub fn start_worker(&mut self, config: WorkerConfig) {
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(worker::run(config, Default::default(), stopped));
        self.worker = Some((stop, task));
    }

    /// The proxy.
    pub fn proxy(&self) -> &RunningProxy {
        self.proxy.as_ref().expect("the proxy runs")
    }

    /// The pid-file directory of the worker.
    pub fn pid_dir(&self) -> PathBuf {
        self.dir.join("data").join("lifecycle").join("pids")
    }

    /// The pids named by the pid files now (remembered for the cleanup guard).
    pub fn recorded_pids(&mut self) -> Vec<u32> {
        let pids = pids_in(&self.pid_dir());
        for pid in &pids {
            if !self.seen.contains(pid) {
                self.seen.push(*pid);
            }
        }
        pids
    }

    /// Waits until the proxy routes every one of `models`.
    pub async fn wait_for_models(&self, models: &[&str]) {
        let hub = self.proxy().hub.clone();
        let listed = eventually(Duration::from_secs(20), || {
            let routed: Vec<String> = hub.models().into_iter().map(|(m, _)| m).collect();
            models.iter().all(|m| routed.iter().any(|r| r == m))
        })
        .await;
        assert!(listed, "the proxy never listed {models:?}");
    }

    /// Stops the worker as SIGTERM does, bounded in time.
    pub async fn stop_worker(&mut self) {
        if let Some((stop, task)) = self.worker.take() {
            let _ = stop.send(true);
            tokio::time::timeout(Duration::from_secs(20), task)
                .await
                .expect("the worker stops in time")
                .expect("the worker task");
        }
    }

    /// Every model server process started so far: by the fake servers' logs and the pid files.
    pub fn all_pids(&mut self) -> Vec<u32> {
        self.recorded_pids();
        let mut pids: Vec<u32> = self.logs.iter().flat_map(|log| starts(log)).collect();
        pids.extend(self.seen.iter().copied());
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Stops the worker and the proxy, and checks that no model server and no pid file is left.
    pub async fn finish(mut self) {
        self.recorded_pids();
        self.stop_worker().await;
        for pid in self.all_pids() {
            assert!(
                gone_within(pid, Duration::from_secs(5)).await,
                "model server {pid} outlived the worker"
            );
        }
        assert!(pids_in(&self.pid_dir()).is_empty(), "pid files are removed");
        if let Some(proxy) = self.proxy.take() {
            proxy.shutdown().await;
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if let Some((_, task)) = self.worker.take() {
            task.abort();
        }
        for pid in self.all_pids() {
            if alive(pid) {
                os::kill_group(pid);
            }
        }
    }
}

/// The pids named by the pid files in `dir`.
pub fn pids_in(dir: &Path) -> Vec<u32> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.strip_suffix(".json")?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// A client's answer: status, headers, body.
pub struct Answer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: String,
}

impl Answer {
    /// The body as JSON (Null when it is not).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }

    /// The pid a fake server named in its answer ("pid N").
    pub fn pid(&self) -> u32 {
        let content = self.json()["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        content
            .strip_prefix("pid ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no pid in answer {}: {}", self.status, self.body))
    }
}

/// POSTs a chat completion for `model` through the relay at `url`; `extra` fields are merged
/// into the body.
pub async fn chat_via(
    url: &str,
    path: &str,
    model: &str,
    extra: Value,
    headers: &[(&str, &str)],
) -> Answer {
    let mut body = json!({
        "model": model,
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}],
    });
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client");
    let mut request = client
        .post(format!("{url}{path}"))
        .header("content-type", "application/json")
        .body(body.to_string());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("the relay answers");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.text().await.expect("the whole answer");
    Answer {
        status,
        headers,
        body,
    }
}

/// A chat completion through the relay that must succeed.
pub async fn chat_ok(url: &str, model: &str) -> Answer {
    let answer = chat_via(url, "/v1/chat/completions", model, json!({}), &[]).await;
    assert_eq!(answer.status, 200, "{model}: {}", answer.body);
    answer
}

/// The `modelrelay` binary run as a worker: a process of its own, so killing it with SIGKILL
/// leaves its model servers behind exactly as a crash would. Killed on drop.
pub struct WorkerProcess(pub tokio::process::Child);

impl WorkerProcess {
    /// Runs `modelrelay worker --config CONFIG` joining `proxy`, with `data_dir` as its data
    /// directory; its output goes to `log`.
    pub fn start(proxy: &RunningProxy, config: &Path, data_dir: &Path, log: &Path) -> Self {
        let output = std::fs::File::create(log).expect("worker log");
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_modelrelay"))
            .arg("worker")
            .arg("--config")
            .arg(config)
            .args(["--proxy-url", &proxy.url(), "--worker-secret", SECRET])
            .args(["--worker-name", "doomed-worker"])
            .env("MODELRELAY_DATA_DIR", data_dir)
            .env("LOG_LEVEL", "info")
            .stdin(Stdio::null())
            .stdout(output.try_clone().expect("log handle"))
            .stderr(output)
            .kill_on_drop(true)
            .spawn()
            .expect("run modelrelay worker");
        WorkerProcess(child)
    }

    /// SIGKILL, and reap it.
    pub async fn kill(mut self) {
        self.0.kill().await.expect("kill the worker process");
    }
}
