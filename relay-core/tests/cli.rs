//! End-to-end tests of the `modelrelay` command: each test spawns the built binary as a child
//! process with its own data directory (so a generated worker secret never lands in the real one)
//! and talks to it over plain HTTP. Every child is killed when its guard drops, and every wait is
//! bounded, so a broken binary fails a test instead of hanging it or leaking a process.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

/// Bound on any single wait for the child (startup, registration, exit).
const WAIT: Duration = Duration::from_secs(15);
/// How long a SIGTERM'd process may take to drain and exit.
const SHUTDOWN: Duration = Duration::from_secs(10);

/// Every environment variable `modelrelay` reads: cleared for each child so the developer's
/// shell cannot change what a test sees.
const RELAY_ENV: &[&str] = &[
    "LISTEN_ADDR",
    "WORKER_SECRET",
    "PROVIDER_NAME",
    "MAX_QUEUE_LEN",
    "QUEUE_TIMEOUT_SECS",
    "REQUEST_TIMEOUT_SECS",
    "MAX_BODY_BYTES",
    "HEARTBEAT_INTERVAL_SECS",
    "HEARTBEAT_TIMEOUT_SECS",
    "DRAIN_TIMEOUT_SECS",
    "LOG_LEVEL",
    "PROXY_URL",
    "WORKER_NAME",
    "BACKEND_URL",
    "MODELS",
    "MAX_CONCURRENCY",
    "PROTOCOL_VERSION",
    "WORKER_DRAIN_TIMEOUT_SECS",
    "MODELRELAY_CONFIG",
    "MODELRELAY_DATA_DIR",
];

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(label: &str) -> TempDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let path = std::env::temp_dir().join(format!(
            "modelrelay-cli-{label}-{}-{}-{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).expect("create temp dir");
        TempDir(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `modelrelay` with a clean environment: `MODELRELAY_DATA_DIR` set to `data_dir`, no config
/// file from the user's home, info logs.
fn modelrelay(data_dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_modelrelay"));
    for name in RELAY_ENV {
        command.env_remove(name);
    }
    command
        .env("MODELRELAY_DATA_DIR", data_dir)
        // The default config file lives under XDG_CONFIG_HOME: point it at a directory with none.
        .env("XDG_CONFIG_HOME", data_dir.join("no-config-here"))
        .env("LOG_LEVEL", "info")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .stdin(Stdio::null());
    command
}

/// A running child whose stdout and stderr are collected by background threads. Killed on drop.
struct Running {
    child: Child,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
}

fn collect(pipe: impl Read + Send + 'static) -> Arc<Mutex<String>> {
    let text = Arc::new(Mutex::new(String::new()));
    let sink = text.clone();
    thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            let mut sink = sink.lock().unwrap();
            sink.push_str(&line);
            sink.push('\n');
        }
    });
    text
}

impl Running {
    fn spawn(mut command: Command) -> Running {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn modelrelay");
        let stdout = collect(child.stdout.take().expect("stdout"));
        let stderr = collect(child.stderr.take().expect("stderr"));
        Running {
            child,
            stdout,
            stderr,
        }
    }

    fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    fn output(&self) -> String {
        format!(
            "--- stdout ---\n{}--- stderr ---\n{}",
            self.stdout(),
            self.stderr()
        )
    }

    /// Waits until stdout has a line containing `needle`; returns that line.
    fn wait_for_stdout_line(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(line) = self.stdout().lines().find(|l| l.contains(needle)) {
                return line.to_string();
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                // Let the reader threads catch up before reporting.
                thread::sleep(Duration::from_millis(100));
                panic!(
                    "modelrelay exited ({status}) before printing {needle:?}\n{}",
                    self.output()
                );
            }
            assert!(
                Instant::now() < deadline,
                "no {needle:?} on stdout within {WAIT:?}\n{}",
                self.output()
            );
            thread::sleep(Duration::from_millis(25));
        }
    }

    /// The relay URL from the startup banner.
    fn relay_url(&mut self) -> String {
        let line = self.wait_for_stdout_line("ModelRelay is serving at ");
        let url = line
            .split("ModelRelay is serving at ")
            .nth(1)
            .expect("banner has a URL")
            .trim()
            .to_string();
        assert!(url.starts_with("http://127.0.0.1:"), "{url}");
        url
    }

    /// The exit status within `limit`, killing the child (and failing) if it is still running.
    fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                // Let the reader threads drain the pipes.
                thread::sleep(Duration::from_millis(100));
                return status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "modelrelay still running after {limit:?}\n{}",
                    self.output()
                );
            }
            thread::sleep(Duration::from_millis(25));
        }
    }

    /// Sends SIGTERM and returns the exit status (bounded by [`SHUTDOWN`]).
    fn terminate(&mut self) -> ExitStatus {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM failed");
        self.wait_exit(SHUTDOWN)
    }

    /// SIGTERM must drain and exit with status 0.
    fn terminate_cleanly(&mut self) {
        let status = self.terminate();
        assert_eq!(
            status.code(),
            Some(0),
            "exit after SIGTERM: {status}\n{}",
            self.output()
        );
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// Runs `command` to completion (bounded), returning status, stdout and stderr.
fn run_to_exit(command: Command) -> (ExitStatus, String, String) {
    let mut running = Running::spawn(command);
    let status = running.wait_exit(WAIT);
    (status, running.stdout(), running.stderr())
}

/// A plain HTTP/1.1 exchange with `Connection: close`; returns the status and the body.
fn http(method: &str, url: &str, body: Option<&str>) -> (u16, String) {
    let rest = url.strip_prefix("http://").expect("http URL");
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let mut stream = TcpStream::connect(host).unwrap_or_else(|e| panic!("connect {host}: {e}"));
    stream.set_read_timeout(Some(WAIT)).unwrap();
    stream.set_write_timeout(Some(WAIT)).unwrap();
    let body = body.unwrap_or("");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).expect("send request");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("read response");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("response head");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status code");
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase()
            .starts_with("transfer-encoding: chunked")
    });
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    (status, body)
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

fn get_json(url: &str) -> Value {
    let (status, body) = http("GET", url, None);
    assert_eq!(status, 200, "GET {url}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {url}: not JSON ({e}): {body}"))
}

/// Polls `check` every 50 ms until it returns true or [`WAIT`] passes.
fn eventually(what: &str, running: &Running, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !check() {
        assert!(
            Instant::now() < deadline,
            "{what}: not within {WAIT:?}\n{}",
            running.output()
        );
        thread::sleep(Duration::from_millis(50));
    }
}

fn model_ids(url: &str) -> Vec<String> {
    get_json(&format!("{url}/v1/models"))["data"]
        .as_array()
        .expect("data array")
        .iter()
        .filter_map(|m| m["id"].as_str().map(str::to_string))
        .collect()
}

/// A loopback port with nothing listening on it (bound, then released).
fn unused_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral port")
        .port()
}

#[test]
fn explicit_listen_address_in_use_exits_1_naming_the_address() {
    let data = TempDir::new("in-use");
    let taken = TcpListener::bind("127.0.0.1:0").expect("hold a port");
    let address = taken.local_addr().unwrap().to_string();
    let mut command = modelrelay(data.path());
    command.args(["--listen", &address]);
    let (status, stdout, stderr) = run_to_exit(command);
    assert_eq!(
        status.code(),
        Some(1),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(
        stderr.contains(&format!("cannot listen on {address}")),
        "{stderr}"
    );
    assert!(stderr.contains("in use"), "{stderr}");
    assert!(
        stderr.contains("--listen"),
        "the message says what to do: {stderr}"
    );
    assert!(
        !stdout.contains("ModelRelay is serving"),
        "no banner when nothing is served: {stdout}"
    );
}

#[test]
fn health_reports_its_fields_and_the_in_process_worker_connects() {
    let data = TempDir::new("health");
    let mut command = modelrelay(data.path());
    command.args(["--listen", "127.0.0.1:0"]);
    let mut relay = Running::spawn(command);
    let url = relay.relay_url();
    let health = get_json(&format!("{url}/health"));
    assert_eq!(health["status"], "ok", "{health}");
    assert_eq!(health["version"], env!("CARGO_PKG_VERSION"), "{health}");
    assert!(health["workers_connected"].is_u64(), "{health}");
    assert_eq!(health["queue_depth"], 0, "{health}");
    assert!(
        health["uptime_secs"].as_f64().is_some_and(|s| s >= 0.0),
        "{health}"
    );
    eventually("the in-process worker connects", &relay, || {
        get_json(&format!("{url}/health"))["workers_connected"] == 1
    });
    relay.terminate_cleanly();
}

#[test]
fn banner_shows_url_and_join_command_and_secret_file_is_private() {
    let data = TempDir::new("banner");
    let mut command = modelrelay(data.path());
    command.args(["--listen", "127.0.0.1:0"]);
    let mut relay = Running::spawn(command);
    let url = relay.relay_url();
    let join = relay.wait_for_stdout_line("modelrelay worker --proxy-url ");
    let stdout = relay.stdout();
    assert!(
        stdout.contains(&format!("{url}/v1")),
        "OpenAI base URL: {stdout}"
    );

    let secret_path = data.path().join("worker-secret");
    let secret = std::fs::read_to_string(&secret_path)
        .unwrap_or_else(|e| panic!("{}: {e}\n{}", secret_path.display(), relay.output()));
    let secret = secret.trim();
    assert_eq!(secret.len(), 32, "{secret:?}");
    assert!(
        secret.chars().all(|c| c.is_ascii_alphanumeric()),
        "{secret:?}"
    );
    let port = url.rsplit(':').next().unwrap();
    assert!(
        join.contains(&format!(":{port}")),
        "join command names the port: {join}"
    );
    assert!(
        join.trim_end()
            .ends_with(&format!("--worker-secret {secret}")),
        "join command carries the stored secret: {join}"
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&secret_path)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "secret file mode {:o}", mode & 0o777);
    }
    relay.terminate_cleanly();
}

#[test]
fn restart_reuses_the_stored_secret() {
    let data = TempDir::new("reuse");
    let mut secrets = Vec::new();
    for _ in 0..2 {
        let mut command = modelrelay(data.path());
        command.args(["serve", "--listen", "127.0.0.1:0"]);
        let mut relay = Running::spawn(command);
        let join = relay.wait_for_stdout_line("--worker-secret ");
        secrets.push(join.rsplit(' ').next().unwrap().to_string());
        relay.terminate_cleanly();
    }
    assert_eq!(secrets[0], secrets[1]);
}

#[test]
fn serve_mode_runs_no_worker_and_a_separate_worker_joins_and_reports_its_dead_backend() {
    let data = TempDir::new("serve");
    let mut command = modelrelay(data.path());
    command.args(["serve", "--listen", "127.0.0.1:0"]);
    let mut proxy = Running::spawn(command);
    let url = proxy.relay_url();
    let secret = std::fs::read_to_string(data.path().join("worker-secret"))
        .expect("serve stores a generated secret");
    let secret = secret.trim();
    // Give an in-process worker (if one were wrongly started) time to show up.
    thread::sleep(Duration::from_millis(500));
    assert_eq!(get_json(&format!("{url}/health"))["workers_connected"], 0);

    let dead_port = unused_port();
    let backend = format!("http://127.0.0.1:{dead_port}");
    let worker_data = TempDir::new("serve-worker");
    let mut command = modelrelay(worker_data.path());
    command.args([
        "worker",
        "--proxy-url",
        &url,
        "--worker-secret",
        secret,
        "--backend-url",
        &backend,
        "--models",
        "m1",
    ]);
    let mut worker = Running::spawn(command);
    eventually("the worker joins", &worker, || {
        get_json(&format!("{url}/health"))["workers_connected"] == 1
    });
    assert_eq!(model_ids(&url), vec!["m1".to_string()]);

    let (status, body) = http(
        "POST",
        &format!("{url}/v1/chat/completions"),
        Some(r#"{"model":"m1","messages":[{"role":"user","content":"hi"}]}"#),
    );
    assert_eq!(status, 502, "{body}");
    let error: Value = serde_json::from_str(&body).expect("JSON error body");
    let message = error["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&backend),
        "the error names the backend: {body}"
    );
    assert!(message.contains("unreachable"), "{body}");

    worker.terminate_cleanly();
    eventually("the worker leaves", &proxy, || {
        get_json(&format!("{url}/health"))["workers_connected"] == 0
    });
    proxy.terminate_cleanly();
}

#[test]
fn serve_flag_is_the_same_as_the_serve_command() {
    let data = TempDir::new("serve-flag");
    let mut command = modelrelay(data.path());
    command.args(["--serve", "--listen", "127.0.0.1:0"]);
    let mut proxy = Running::spawn(command);
    let url = proxy.relay_url();
    thread::sleep(Duration::from_millis(500));
    assert_eq!(get_json(&format!("{url}/health"))["workers_connected"], 0);
    proxy.terminate_cleanly();
}

#[test]
fn worker_without_a_secret_exits_1_mentioning_worker_secret() {
    let data = TempDir::new("no-secret");
    let mut command = modelrelay(data.path());
    command.args([
        "worker",
        "--proxy-url",
        &format!("http://127.0.0.1:{}", unused_port()),
    ]);
    let (status, stdout, stderr) = run_to_exit(command);
    assert_eq!(
        status.code(),
        Some(1),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stderr.contains("WORKER_SECRET"), "{stderr}");
    assert!(
        !data.path().join("worker-secret").exists(),
        "a worker must not invent a secret"
    );
}

#[test]
fn help_mentions_every_documented_environment_variable() {
    let data = TempDir::new("help");
    let mut command = modelrelay(data.path());
    command.arg("--help");
    let (status, stdout, stderr) = run_to_exit(command);
    assert_eq!(status.code(), Some(0), "{stderr}");
    let missing: Vec<&str> = [
        "LISTEN_ADDR",
        "WORKER_SECRET",
        "PROVIDER_NAME",
        "MAX_QUEUE_LEN",
        "QUEUE_TIMEOUT_SECS",
        "REQUEST_TIMEOUT_SECS",
        "LOG_LEVEL",
        "PROXY_URL",
        "WORKER_NAME",
        "BACKEND_URL",
        "MODELS",
        "MAX_CONCURRENCY",
    ]
    .into_iter()
    .filter(|name| !stdout.contains(name))
    .collect();
    assert!(missing.is_empty(), "--help lacks {missing:?}:\n{stdout}");
}

#[test]
fn config_file_with_an_unknown_key_exits_1_naming_the_key() {
    let data = TempDir::new("bad-config");
    let config = data.path().join("config.toml");
    std::fs::write(&config, "[proxy]\nlisten_addr = \"127.0.0.1:0\"\n").unwrap();
    let mut command = modelrelay(data.path());
    command
        .arg("--config")
        .arg(&config)
        .args(["--listen", "127.0.0.1:0"]);
    let (status, stdout, stderr) = run_to_exit(command);
    assert_eq!(
        status.code(),
        Some(1),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stderr.contains("listen_addr"), "names the key: {stderr}");
    assert!(
        stderr.contains(&config.display().to_string()),
        "names the file: {stderr}"
    );
    assert!(!stdout.contains("ModelRelay is serving"), "{stdout}");
}

#[test]
fn sigterm_makes_proxy_and_worker_exit_0() {
    let data = TempDir::new("sigterm");
    let mut command = modelrelay(data.path());
    command.args(["--listen", "127.0.0.1:0"]);
    let mut relay = Running::spawn(command);
    let url = relay.relay_url();
    eventually("the in-process worker connects", &relay, || {
        get_json(&format!("{url}/health"))["workers_connected"] == 1
    });
    let started = Instant::now();
    relay.terminate_cleanly();
    assert!(started.elapsed() < SHUTDOWN);
    assert!(
        TcpStream::connect(url.trim_start_matches("http://")).is_err(),
        "the port is released after exit"
    );
}

#[test]
fn discover_json_prints_a_json_array() {
    let data = TempDir::new("discover");
    let mut command = modelrelay(data.path());
    command.args(["discover", "--json"]);
    let (status, stdout, stderr) = run_to_exit(command);
    assert_eq!(status.code(), Some(0), "{stderr}");
    let found: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{stdout}"));
    let found = found.as_array().expect("a JSON array");
    for backend in found {
        assert!(backend.is_object(), "{backend}");
    }
}

#[test]
fn secrets_never_appear_in_logs_even_at_trace_level() {
    const SECRET: &str = "s3cret-value-that-must-not-leak";
    const WRONG: &str = "wrong-secret-that-must-not-leak";
    let data = TempDir::new("secret-logs");
    let mut command = modelrelay(data.path());
    command
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("WORKER_SECRET", SECRET)
        .env("LOG_LEVEL", "trace");
    let mut proxy = Running::spawn(command);
    let url = proxy.relay_url();
    let worker_data = TempDir::new("secret-logs-worker");
    let join = |secret: &str| {
        let mut command = modelrelay(worker_data.path());
        command
            .args(["worker", "--proxy-url", &url, "--models", "m1"])
            .args([
                "--backend-url",
                &format!("http://127.0.0.1:{}", unused_port()),
            ])
            .env("WORKER_SECRET", secret)
            .env("LOG_LEVEL", "trace");
        Running::spawn(command)
    };
    let mut rejected = join(WRONG);
    eventually("the rejected worker logs its refusal", &rejected, || {
        rejected.stderr().contains("401")
    });
    let mut accepted = join(SECRET);
    eventually("the worker joins", &accepted, || {
        get_json(&format!("{url}/health"))["workers_connected"] == 1
    });
    rejected.terminate();
    accepted.terminate_cleanly();
    proxy.terminate_cleanly();
    for (who, logs) in [
        ("proxy", proxy.stderr()),
        ("rejected worker", rejected.stderr()),
        ("accepted worker", accepted.stderr()),
    ] {
        assert!(!logs.is_empty(), "{who} logged nothing at trace level");
        assert!(!logs.contains(SECRET), "{who} logged the secret:\n{logs}");
        assert!(
            !logs.contains(WRONG),
            "{who} logged the presented secret:\n{logs}"
        );
    }
}

/// A `sleep` child standing in for a model server; killed on drop.
struct Sleeper(Child);

impl Sleeper {
    fn start() -> Sleeper {
        Sleeper(Command::new("sleep").arg("30").spawn().expect("run sleep"))
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn models_status_lists_the_model_map_and_the_recorded_servers_with_orphans_flagged() {
    use relay_core::lifecycle::os;
    use relay_core::lifecycle::pidfile::PidRecord;
    let data = TempDir::new("models-status");
    let config = data.path().join("config.toml");
    std::fs::write(
        &config,
        "[worker.model_map.a]\nstart_script = \"/s/a.sh\"\n[worker.model_map.b]\nstart_script = \"/s/b.sh\"\n",
    )
    .unwrap();
    let pids = data.path().join("lifecycle/pids");
    std::fs::create_dir_all(&pids).unwrap();
    let (me, my_identity) = os::me();
    let dead_worker = {
        let mut child = Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    };
    let (running, orphan) = (Sleeper::start(), Sleeper::start());
    let record = |server: &Sleeper, model: &str, owner_pid: u32| PidRecord {
        pid: server.0.id(),
        identity: os::identity(server.0.id()).expect("sleep runs"),
        model: model.to_string(),
        port: unused_port(),
        command: "llama-server".to_string(),
        owner_pid,
        owner: my_identity.clone(),
    };
    for record in [
        record(&running, "a", me),
        record(&orphan, "old", dead_worker),
    ] {
        let path = pids.join(format!("{}.json", record.pid));
        std::fs::write(path, serde_json::to_string(&record).unwrap()).unwrap();
    }
    let mut command = modelrelay(data.path());
    command
        .arg("--config")
        .arg(&config)
        .args(["models", "status"]);
    let (status, stdout, stderr) = run_to_exit(command);
    assert_eq!(status.code(), Some(0), "{stderr}");
    let row = |model: &str| {
        stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(model))
            .unwrap_or_else(|| panic!("no row for {model}:\n{stdout}"))
            .to_string()
    };
    let a = row("a");
    assert!(
        a.contains("starting"),
        "running, /health not answering: {a}"
    );
    assert!(a.contains(&running.0.id().to_string()), "{a}");
    assert!(row("b").contains("stopped"), "{stdout}");
    let old = row("old");
    assert!(
        old.contains("orphaned") && old.contains("its worker is gone"),
        "{old}"
    );
}

/// A one-request HTTP server standing in for a cloud API: answers one chat completion and
/// returns the request it received (head and body).
fn one_shot_upstream() -> (u16, thread::JoinHandle<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind upstream");
    let port = listener.local_addr().unwrap().port();
    let handle = thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("the relay connects");
        stream.set_read_timeout(Some(WAIT)).unwrap();
        let mut raw = Vec::new();
        let mut buf = [0u8; 4096];
        // Read the head, then as many body bytes as it announces.
        loop {
            let n = stream.read(&mut buf).expect("read request");
            raw.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&raw).to_string();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                    })
                    .unwrap_or(0);
                if body.len() >= length || n == 0 {
                    break;
                }
            }
            if n == 0 {
                break;
            }
        }
        let answer = r#"{"id":"chatcmpl-up","object":"chat.completion","model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"from upstream"},"finish_reason":"stop"}]}"#;
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
            answer.len()
        );
        stream.write_all(response.as_bytes()).expect("answer");
        String::from_utf8_lossy(&raw).into_owned()
    });
    (port, handle)
}

#[test]
fn upstream_api_keys_never_appear_in_logs_even_at_trace_level() {
    const KEY: &str = "sk-upstream-key-that-must-not-leak";
    let data = TempDir::new("upstream-key-logs");
    let (port, upstream) = one_shot_upstream();
    let config = data.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[[proxy.upstreams]]\nname = \"cloud\"\nbase_url = \"http://127.0.0.1:{port}\"\n\
             api_key = \"{KEY}\"\nmodels = [\"gpt-*\"]\n"
        ),
    )
    .unwrap();
    let mut command = modelrelay(data.path());
    command
        .arg("--config")
        .arg(&config)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("LOG_LEVEL", "trace");
    let mut proxy = Running::spawn(command);
    let url = proxy.relay_url();
    let (status, body) = http(
        "POST",
        &format!("{url}/v1/chat/completions"),
        Some(r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#),
    );
    assert_eq!(status, 200, "{body}\n{}", proxy.output());
    assert!(body.contains("from upstream"), "{body}");
    let received = upstream.join().expect("upstream thread");
    assert!(
        received.contains(&format!("Bearer {KEY}")),
        "the key was used: {received}"
    );
    proxy.terminate_cleanly();
    let logs = proxy.output();
    assert!(logs.contains("request sent upstream"), "{logs}");
    assert!(!logs.contains(KEY), "the upstream key was logged:\n{logs}");
}
