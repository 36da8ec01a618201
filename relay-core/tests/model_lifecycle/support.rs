//! Harness for the lifecycle process tests: the fake llama-server (compiled once with rustc into
//! the target directory, rebuilt when its source is newer), temporary data directories, model
//! maps, and guards so that no test leaves a process behind.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub use crate::inprocess::{eventually, http};
use relay_core::lifecycle::{os, LifecycleConfig, LifecycleManager, LifecycleSection};

/// Bound on every test.
pub const TEST_BOUND: Duration = Duration::from_secs(60);

/// The fake llama-server binary, built on first use.
pub fn fake_server() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(build_fake_server)
}

fn build_fake_server() -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake_llama_server.rs");
    let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let binary = out_dir.join("fake-llama-server");
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    if let (Some(built), Some(written)) = (modified(&binary), modified(&source)) {
        if built >= written {
            return binary;
        }
    }
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_string());
    // Build under a unique name and rename, so a concurrent build never runs a half-written file.
    let partial = out_dir.join(format!("fake-llama-server.{}.tmp", std::process::id()));
    let status = std::process::Command::new(rustc)
        .args(["--edition", "2021", "-C", "debuginfo=0", "-o"])
        .arg(&partial)
        .arg(&source)
        .status()
        .expect("run rustc");
    assert!(status.success(), "building the fake llama-server failed");
    std::fs::rename(&partial, &binary).expect("install fake llama-server");
    binary
}

/// A temporary directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// A fresh directory named after `label`.
    pub fn new(label: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "relay-lifecycle-{label}-{}-{}",
            std::process::id(),
            rand_suffix()
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create temp dir");
        TempDir(path)
    }

    /// A path inside it.
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A model-map entry running the fake server with `flags`, logging its starts to `log`.
pub fn fake_entry(name: &str, log: &Path, flags: &str, extra: &str) -> String {
    let args: Vec<String> = flags
        .split_whitespace()
        .map(|f| format!("{f:?}"))
        .chain([
            "\"--log\"".to_string(),
            format!("{:?}", log.display().to_string()),
        ])
        .collect();
    format!(
        "[worker.model_map.{name:?}]\nllama_server = {:?}\nmodel_file = \"/models/{name}.gguf\"\nargs = [{}]\n{extra}\n",
        fake_server().display().to_string(),
        args.join(", ")
    )
}

/// A resolved config from TOML text.
pub fn config(text: &str) -> LifecycleConfig {
    let section = LifecycleSection::from_config_text(text).expect("valid TOML");
    LifecycleConfig::resolve(&section).expect("valid lifecycle config")
}

/// Short timers for tests: startup 10 s, stop grace 2 s.
pub fn quick(mut config: LifecycleConfig) -> LifecycleConfig {
    config.startup_timeout = Duration::from_secs(10);
    config.stop_grace = Duration::from_secs(2);
    config
}

/// The pids of the start lines in a fake server log, in order.
pub fn starts(log: &Path) -> Vec<u32> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.strip_prefix("start ")?.split(' ').next()?.parse().ok())
        .collect()
}

/// Whether a process is alive (not gone, not a zombie).
pub fn alive(pid: u32) -> bool {
    os::identity(pid).is_some()
}

/// Waits until `pid` is gone; false after `bound`.
pub async fn gone_within(pid: u32, bound: Duration) -> bool {
    let deadline = Instant::now() + bound;
    while alive(pid) {
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

/// A manager over a fresh data dir, plus a guard that kills every process group it started
/// (by the pids its fake servers logged) if the test fails before shutting it down.
pub struct Harness {
    pub manager: LifecycleManager,
    pub dir: TempDir,
    logs: Vec<PathBuf>,
}

impl Harness {
    /// A manager for `config` whose fake servers log to the files in `logs`.
    pub fn new(dir: TempDir, config: LifecycleConfig, logs: &[PathBuf]) -> Self {
        let manager = LifecycleManager::new(config, &dir.join("data")).expect("manager");
        Harness {
            manager,
            dir,
            logs: logs.to_vec(),
        }
    }

    /// Shuts the manager down and checks that every process it started is gone.
    pub async fn finish(self) {
        self.manager.shutdown().await;
        for log in &self.logs {
            for pid in starts(log) {
                assert!(
                    gone_within(pid, Duration::from_secs(5)).await,
                    "process {pid} outlived shutdown"
                );
            }
        }
        let pid_files = std::fs::read_dir(self.dir.join("data/pids"))
            .map(|d| d.count())
            .unwrap_or(0);
        assert_eq!(pid_files, 0, "pid files are removed when processes stop");
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        // Normally a no-op (finish stopped everything); after a failed assertion this is what
        // keeps fake servers from outliving the test.
        for log in &self.logs {
            for pid in starts(log) {
                if alive(pid) {
                    os::kill_group(pid);
                    // A script's server is not its group's leader: kill it by pid as well.
                    let _ = std::process::Command::new("kill")
                        .args(["-KILL", &pid.to_string()])
                        .status();
                }
            }
        }
    }
}

/// Runs a test body bounded in time.
pub async fn bounded<F: std::future::Future<Output = ()>>(body: F) {
    tokio::time::timeout(TEST_BOUND, body)
        .await
        .expect("the test exceeded its time bound");
}

/// Asks a chat completion of the server behind `base_url`; the answer names the server's pid.
pub async fn chat(base_url: &str) -> Result<String, reqwest::Error> {
    let response = http()
        .post(format!("{base_url}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#)
        .send()
        .await?
        .error_for_status()?;
    let text = response.text().await?;
    let body: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    Ok(body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string())
}

/// A port nothing listens on now, in a range below the ephemeral ports.
pub fn free_port_near(base: u16) -> u16 {
    (base..base + 100)
        .find(|&p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok())
        .expect("a free port")
}
