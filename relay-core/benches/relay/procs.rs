//! The processes of a benchmark run: the mock backend, the proxy and the worker, each a child of
//! the bench process (killed on drop), and what `/proc` says about their memory and CPU.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The worker secret of every benchmark run.
pub const SECRET: &str = "bench-secret";

/// The `modelrelay` binary under test: the one cargo built with this bench, or the one named by
/// `RELAY_BENCH_BINARY`, so two builds can be compared run for run on a noisy machine (the load
/// generator and the mock backend stay the same).
pub fn modelrelay_binary() -> std::path::PathBuf {
    std::env::var_os("RELAY_BENCH_BINARY")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_modelrelay").into())
}

/// A child process killed when dropped.
pub struct ChildProcess {
    child: Child,
    /// What it printed on its first matching stdout line, e.g. a port.
    pub announced: String,
}

impl ChildProcess {
    /// Starts `command`; with a `marker`, waits (bounded) for a stdout line containing it and
    /// keeps that line.
    pub fn start(mut command: Command, marker: Option<&str>) -> ChildProcess {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn benchmark child");
        let stdout = child.stdout.take().expect("stdout");
        let Some(marker) = marker else {
            // Keep draining stdout so the child never blocks on a full pipe.
            std::thread::spawn(move || std::io::copy(&mut { stdout }, &mut std::io::sink()));
            return ChildProcess {
                child,
                announced: String::new(),
            };
        };
        let (tx, rx) = mpsc::channel();
        let marker = marker.to_string();
        std::thread::spawn(move || {
            let mut announced = false;
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if !announced && line.contains(&marker) {
                    announced = true;
                    let _ = tx.send(line);
                }
            }
        });
        let announced = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("child announced itself in time");
        ChildProcess { child, announced }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident memory in bytes.
    pub fn rss(&self) -> u64 {
        rss_of(self.pid())
    }

    /// Open file descriptors (sockets, mostly).
    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map(|dir| dir.count())
            .unwrap_or(0)
    }

    /// User plus system CPU time so far, in seconds.
    pub fn cpu_seconds(&self) -> f64 {
        cpu_seconds_of(self.pid())
    }
}

impl Drop for ChildProcess {
    /// Asks the child to stop (SIGTERM: a node drains and exits, which also lets an allocator
    /// statistics dump such as `_RJEM_MALLOC_CONF=stats_print:true` run), and kills it if it
    /// has not exited within 5 s.
    fn drop(&mut self) {
        // SAFETY: `kill` only sends a signal to our own child's pid.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `VmRSS` of a process, in bytes.
pub fn rss_of(pid: u32) -> u64 {
    status_bytes(pid, "VmRSS:")
}

/// `VmHWM` (peak resident memory) of a process, in bytes.
pub fn peak_rss_of(pid: u32) -> u64 {
    status_bytes(pid, "VmHWM:")
}

/// A `kB` figure of `/proc/PID/status`, in bytes (0 when the process is gone).
fn status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

/// utime + stime of a process, in seconds (clock ticks are 100 per second on Linux).
pub fn cpu_seconds_of(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name is in parentheses and may contain spaces: split after the last ')'.
    let after_name = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // Fields 14 and 15 of stat are utime and stime; after the name they are at 11 and 12.
    (ticks(11) + ticks(12)) as f64 / 100.0
}

/// The mock backend: this bench binary re-executed with `--backend`.
pub fn start_backend() -> (ChildProcess, u16) {
    start_backend_with(&[])
}

/// The mock backend with extra flags (`--native`).
pub fn start_backend_with(flags: &[&str]) -> (ChildProcess, u16) {
    let exe = std::env::current_exe().expect("bench executable");
    let mut command = Command::new(exe);
    command.arg("--backend").args(flags);
    let backend = ChildProcess::start(command, Some("BACKEND "));
    let port = port_after(&backend.announced, "BACKEND ");
    (backend, port)
}

/// The proxy: `modelrelay serve` on an ephemeral port with the given extra flags.
pub fn start_proxy(extra: &[&str]) -> (ChildProcess, u16) {
    let mut command = Command::new(modelrelay_binary());
    command
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--worker-secret",
            SECRET,
        ])
        .args(extra)
        .env("LOG_LEVEL", "warn")
        .env(
            "MODELRELAY_DATA_DIR",
            std::env::temp_dir().join("modelrelay-bench"),
        );
    let proxy = ChildProcess::start(command, Some("serving at http://"));
    let port = port_after(&proxy.announced, "http://127.0.0.1:");
    (proxy, port)
}

/// A worker joining the proxy on `proxy_port`, forwarding model `bench` to the backend.
pub fn start_worker(proxy_port: u16, backend_port: u16, max_concurrency: u32) -> ChildProcess {
    start_worker_for("bench", proxy_port, backend_port, max_concurrency)
}

/// A worker joining the proxy on `proxy_port`, forwarding `model` to the backend.
pub fn start_worker_for(
    model: &str,
    proxy_port: u16,
    backend_port: u16,
    max_concurrency: u32,
) -> ChildProcess {
    let mut command = Command::new(modelrelay_binary());
    command
        .args(["worker", "--worker-secret", SECRET, "--models", model])
        .args(["--proxy-url", &format!("http://127.0.0.1:{proxy_port}")])
        .args(["--backend-url", &format!("http://127.0.0.1:{backend_port}")])
        .args(["--max-concurrency", &max_concurrency.to_string()])
        .env("LOG_LEVEL", "warn")
        .env(
            "MODELRELAY_DATA_DIR",
            std::env::temp_dir().join("modelrelay-bench"),
        );
    // Readiness is observed through the proxy's /health, not the worker's output.
    ChildProcess::start(command, None)
}

/// The port number that follows `prefix` in `line`.
pub fn port_after(line: &str, prefix: &str) -> u16 {
    line.split(prefix)
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|digits| digits.parse().ok())
        .unwrap_or_else(|| panic!("no port in {line:?}"))
}

/// Waits (bounded) until the proxy's `/health` reports `workers` connected workers.
pub async fn wait_for_workers(client: &reqwest::Client, proxy_port: u16, workers: u64) {
    let url = format!("http://127.0.0.1:{proxy_port}/health");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(response) = client.get(&url).send().await {
            if let Ok(text) = response.text().await {
                let health: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
                if health["workers_connected"].as_u64() == Some(workers) {
                    return;
                }
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "workers did not connect in time"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
