//! End-to-end tests of the `modelrelay` command: each test spawns the built binary as a child
//! process with its own data directory (so a generated worker secret never lands in the real one)
//! and talks to it over plain HTTP. Every child is killed when its guard drops, and every wait is
//! bounded, so a broken binary fails a test instead of hanging it or leaking a process.

#[path = "common/binary.rs"]
mod binary;

use binary::*;

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

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
fn banner_shows_url_and_join_command_and_where_the_private_secret_file_is() {
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
        !stdout.contains(secret),
        "the banner names the secret's file, never the secret: {stdout}"
    );
    assert!(
        stdout.contains(&secret_path.display().to_string()),
        "the banner says where the secret is: {stdout}"
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
        let url = relay.relay_url();
        secrets.push(
            owner_get_json(&format!("{url}/api/join-code"), data.path())["secret"].to_string(),
        );
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
        "TLS_CERT",
        "TLS_KEY",
        "MODELRELAY_TLS",
        "PROXY_FINGERPRINT",
        "MODELRELAY_METRICS_PUBLIC",
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
        let request = read_request(&mut stream).expect("the request");
        let answer = r#"{"id":"chatcmpl-up","object":"chat.completion","model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"from upstream"},"finish_reason":"stop"}]}"#;
        write_json(&mut stream, answer);
        request
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

/// A model server that holds each chat completion for `hold` before answering, and reports
/// on `started` when one arrives; `GET`s get a one-model list. Serves until the test ends.
fn slow_backend(hold: Duration) -> (u16, std::sync::mpsc::Receiver<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind backend");
    let port = listener.local_addr().unwrap().port();
    let (started, arrivals) = std::sync::mpsc::channel();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let started = started.clone();
            thread::spawn(move || {
                let Some(head) = read_request(&mut stream) else {
                    return;
                };
                let answer = if head.starts_with("POST") {
                    let _ = started.send(());
                    thread::sleep(hold);
                    r#"{"id":"chatcmpl-1","object":"chat.completion","model":"m1","choices":[{"index":0,"message":{"role":"assistant","content":"finished"},"finish_reason":"stop"}]}"#
                } else {
                    M1_MODELS
                };
                write_json(&mut stream, answer);
            });
        }
    });
    (port, arrivals)
}

/// A proxy (`serve`) and a headless worker (`worker`) joined to it, serving model `m1` from the
/// backend on `backend_port`; returns once the worker has joined, with the processes' data
/// directories (kept as long as they run).
fn proxy_with_a_worker(
    name: &str,
    backend_port: u16,
    extra: &[&str],
) -> (Running, String, Running, [TempDir; 2]) {
    let data = TempDir::new(name);
    let mut command = modelrelay(data.path());
    command.args(["serve", "--listen", "127.0.0.1:0"]);
    let mut proxy = Running::spawn(command);
    let url = proxy.relay_url();
    let secret = std::fs::read_to_string(data.path().join("worker-secret")).expect("secret");
    let worker_data = TempDir::new(&format!("{name}-worker"));
    let mut command = headless_worker(worker_data.path(), &url, &secret, backend_port);
    command.args(extra);
    let worker = Running::spawn(command);
    eventually("the worker joins", &worker, || {
        get_json(&format!("{url}/health"))["workers_connected"] == 1
    });
    (proxy, url, worker, [data, worker_data])
}

#[test]
fn a_headless_worker_drained_by_its_proxy_finishes_its_request_and_exits_0_without_reconnecting() {
    let (port, arrivals) = slow_backend(Duration::from_millis(1500));
    let (mut proxy, url, mut worker, dirs) =
        proxy_with_a_worker("drained", port, &["--worker-name", "gpu-box-1"]);

    // A request in flight when the proxy drains the worker.
    let chat_url = format!("{url}/v1/chat/completions");
    let client = thread::spawn(move || {
        http(
            "POST",
            &chat_url,
            Some(r#"{"model":"m1","messages":[{"role":"user","content":"hi"}]}"#),
        )
    });
    arrivals
        .recv_timeout(WAIT)
        .expect("the request reaches the backend");
    let status = get_json(&format!("{url}/api/status"));
    let id = status["workers"][0]["id"]
        .as_str()
        .expect("worker id")
        .to_string();
    let (code, body) = owner_http(
        "POST",
        &format!("{url}/api/workers/{id}/drain"),
        dirs[0].path(),
        Some("{}"),
    );
    assert_eq!(code, 202, "drain accepted: {body}");

    // It finishes the request, closes, and the process exits 0 by itself.
    let exit = worker.wait_exit(WAIT);
    assert_eq!(exit.code(), Some(0), "{}", worker.output());
    let (code, body) = client.join().expect("client thread");
    assert_eq!(code, 200, "the in-flight request finished: {body}");
    assert!(body.contains("finished"), "{body}");
    assert!(
        worker.stderr().contains("drained by the proxy"),
        "{}",
        worker.output()
    );
    thread::sleep(Duration::from_millis(500));
    assert_eq!(
        get_json(&format!("{url}/health"))["workers_connected"],
        0,
        "nothing reconnected"
    );
    proxy.terminate_cleanly();
}

#[test]
fn a_headless_worker_comes_back_by_itself_when_its_proxy_restarts_with_sigterm() {
    let (port, _arrivals) = slow_backend(Duration::ZERO);
    let (mut proxy, url, mut worker, dirs) = proxy_with_a_worker("proxy-restarts", port, &[]);
    // The ordinary restart (`systemctl restart`, Ctrl-C, the tray's Quit then start): the
    // proxy's graceful_shutdown says it stops itself, so the worker keeps running...
    proxy.terminate_cleanly();
    eventually("the worker notices the proxy stopped", &worker, || {
        worker.stderr().contains("reconnecting when it is back")
    });
    thread::sleep(Duration::from_secs(2));
    assert!(
        worker.child.try_wait().expect("try_wait").is_none(),
        "the worker must not exit when its proxy restarts\n{}",
        worker.output()
    );

    // ... and is back within seconds of the proxy listening again at its address.
    let listen = url.trim_start_matches("http://").to_string();
    let mut command = modelrelay(dirs[0].path());
    command.args(["serve", "--listen", &listen]);
    let mut proxy = Running::spawn(command);
    proxy.relay_url();
    let listening = Instant::now();
    eventually("the worker rejoins by itself", &worker, || {
        get_json(&format!("{url}/health"))["workers_connected"] == 1
    });
    assert!(
        listening.elapsed() < Duration::from_secs(5),
        "back {:?} after the proxy listened again\n{}",
        listening.elapsed(),
        worker.output()
    );
    let (code, body) = http(
        "POST",
        &format!("{url}/v1/chat/completions"),
        Some(r#"{"model":"m1","messages":[{"role":"user","content":"hi"}]}"#),
    );
    assert_eq!(code, 200, "{body}");
    worker.terminate_cleanly();
    proxy.terminate_cleanly();
}

/// `modelrelay` started with an open-files limit of `soft` (and a hard limit of `hard`).
#[cfg(unix)]
fn with_open_files_limit(command: &mut Command, soft: u64, hard: u64) {
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec the closure only calls setrlimit, which is async-signal-safe.
    unsafe {
        command.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: soft as libc::rlim_t,
                rlim_max: hard as libc::rlim_t,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The soft and hard open-files limits of a running process (`/proc/PID/limits`).
fn open_files_limits(pid: u32) -> (u64, u64) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("an open-files line");
    let numbers: Vec<u64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    (numbers[0], numbers[1])
}

#[cfg(target_os = "linux")]
#[test]
fn the_open_files_limit_is_raised_to_the_hard_limit_and_max_connections_fits_under_it() {
    // A soft limit below the hard one, as many systems start services: raised at start. The
    // hard limit is below what max_connections (20,000) needs: the bound is lowered to fit what
    // was raised, less what other descriptors need, and the log says so.
    let data = TempDir::new("nofile");
    let mut command = modelrelay(data.path());
    command.args(["serve", "--listen", "127.0.0.1:0"]);
    with_open_files_limit(&mut command, 512, 4096);
    let mut proxy = Running::spawn(command);
    let url = proxy.relay_url();
    assert_eq!(open_files_limits(proxy.child.id()), (4096, 4096));
    eventually("the lowered bound is logged", &proxy, || {
        proxy.stderr().contains("max_connections lowered to 3840")
    });
    assert_eq!(get_json(&format!("{url}/health"))["status"], "ok");
    proxy.terminate_cleanly();
}

#[test]
fn a_short_admin_token_is_refused_at_start_and_the_token_file_is_read() {
    let data = TempDir::new("short-token");
    let mut command = modelrelay(data.path());
    command
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("MODELRELAY_ADMIN_TOKEN", "secret");
    let (status, _, stderr) = run_to_exit(command);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("is 6 characters; use at least 20"),
        "{stderr}"
    );

    let token = "a-token-read-from-a-file-0123";
    let file = data.path().join("admin-token.txt");
    std::fs::write(&file, format!("{token}\n")).expect("token file");
    let mut command = modelrelay(data.path());
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--admin-token-file"])
        .arg(&file);
    let mut proxy = Running::spawn(command);
    let url = proxy.relay_url();
    // Configured on purpose, it guards the control API even on loopback.
    let (status, _) = http("GET", &format!("{url}/api/status"), None);
    assert_eq!(status, 401);
    let bearer = format!("Bearer {token}");
    let reply = exchange(
        "GET",
        &format!("{url}/api/status"),
        &[("authorization", &bearer)],
        None,
    );
    assert_eq!(reply.status, 200, "{reply:?}");
    proxy.terminate_cleanly();
}
