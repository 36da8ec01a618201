//! The `modelrelay` binary as a child process, for the test binaries that run it (`cli.rs`,
//! `security/`): its own data directory (so a generated secret never lands in the real one),
//! a clean environment, output collected, killed on drop, every wait bounded, and a plain
//! HTTP/1.1 client that can send any header (a hostile `Host` or `Origin` included).
#![allow(dead_code)]

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
pub const WAIT: Duration = Duration::from_secs(15);
/// How long a SIGTERM'd process may take to drain and exit.
pub const SHUTDOWN: Duration = Duration::from_secs(10);

/// Every environment variable `modelrelay` reads: cleared for each child so the developer's
/// shell cannot change what a test sees.
pub const RELAY_ENV: &[&str] = &[
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
    "PROXY_SILENCE_TIMEOUT_SECS",
    "MODELRELAY_CONFIG",
    "MODELRELAY_DATA_DIR",
    "MODELRELAY_ADMIN_TOKEN",
    "MODELRELAY_ALLOWED_HOSTS",
    "MODELRELAY_CORS_ORIGINS",
    "WORKER_SECRET_FILE",
    "MODELRELAY_ADMIN_TOKEN_FILE",
    "FORWARD_CLIENT_AUTH",
    "TLS_CERT",
    "TLS_KEY",
    "MODELRELAY_TLS",
    "PROXY_FINGERPRINT",
];

/// The binary under test: the one cargo built for these tests, or `MODELRELAY_TEST_BIN` (e.g. the
/// release build: `MODELRELAY_TEST_BIN=target/release/modelrelay cargo test --test security`).
pub fn binary_path() -> PathBuf {
    std::env::var_os("MODELRELAY_TEST_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_modelrelay")))
}

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(label: &str) -> TempDir {
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

    pub fn path(&self) -> &Path {
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
pub fn modelrelay(data_dir: &Path) -> Command {
    let mut command = Command::new(binary_path());
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
pub struct Running {
    pub child: Child,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
}

pub fn collect(pipe: impl Read + Send + 'static) -> Arc<Mutex<String>> {
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
    pub fn spawn(mut command: Command) -> Running {
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

    pub fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    pub fn output(&self) -> String {
        format!(
            "--- stdout ---\n{}--- stderr ---\n{}",
            self.stdout(),
            self.stderr()
        )
    }

    /// Waits until stdout has a line containing `needle`; returns that line.
    pub fn wait_for_stdout_line(&mut self, needle: &str) -> String {
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
    pub fn relay_url(&mut self) -> String {
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

    /// The relay URL from the startup banner of a proxy serving TLS.
    pub fn https_relay_url(&mut self) -> String {
        let line = self.wait_for_stdout_line("ModelRelay is serving at ");
        let url = line
            .split("ModelRelay is serving at ")
            .nth(1)
            .expect("banner has a URL")
            .trim()
            .to_string();
        assert!(url.starts_with("https://127.0.0.1:"), "{url}");
        url
    }

    /// The certificate fingerprint from the startup banner of a proxy serving TLS.
    pub fn banner_fingerprint(&mut self) -> String {
        let line = self.wait_for_stdout_line("TLS certificate:");
        line.split("TLS certificate:")
            .nth(1)
            .expect("banner has a fingerprint")
            .trim()
            .to_string()
    }

    /// The exit status within `limit`, killing the child (and failing) if it is still running.
    pub fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
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
    pub fn terminate(&mut self) -> ExitStatus {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM failed");
        self.wait_exit(SHUTDOWN)
    }

    /// SIGTERM must drain and exit with status 0.
    pub fn terminate_cleanly(&mut self) {
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
pub fn run_to_exit(command: Command) -> (ExitStatus, String, String) {
    let mut running = Running::spawn(command);
    let status = running.wait_exit(WAIT);
    (status, running.stdout(), running.stderr())
}

/// Whether `GET url` (plain HTTP) answers 200 now: false on any failure, a connection refused
/// or reset included — for waiting on a server that is still starting (llama-server accepts,
/// then resets, connections while it loads its model).
pub fn answers_200(url: &str) -> bool {
    let (host, path) = host_and_path(url);
    let Ok(mut stream) = TcpStream::connect(host) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(WAIT));
    let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    let mut raw = Vec::new();
    if stream.write_all(request.as_bytes()).is_err() || stream.read_to_end(&mut raw).is_err() {
        return false;
    }
    String::from_utf8_lossy(&raw).split_whitespace().nth(1) == Some("200")
}

/// A plain HTTP/1.1 exchange with `Connection: close`; returns the status and the body.
pub fn http(method: &str, url: &str, body: Option<&str>) -> (u16, String) {
    let reply = exchange(method, url, &[], body);
    (reply.status, reply.body)
}

/// An answer read off the socket as it came.
#[derive(Debug)]
pub struct Reply {
    /// The status code.
    pub status: u16,
    /// The header lines, as sent.
    pub head: String,
    /// The body, de-chunked.
    pub body: String,
}

impl Reply {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<String> {
        self.head.lines().skip(1).find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.trim()
                .eq_ignore_ascii_case(name)
                .then(|| value.trim().to_string())
        })
    }
}

/// An HTTP/1.1 exchange with `Connection: close` and any `headers`; a `Host` among them replaces
/// the real one (what a DNS-rebinding page's request carries).
pub fn exchange(method: &str, url: &str, headers: &[(&str, &str)], body: Option<&str>) -> Reply {
    let (mut stream, host, path) = connect(url);
    exchange_over(&mut stream, method, &host, &path, headers, body)
}

/// A plain connection to `url`'s host, with its host and path.
/// The host (with its port) and the path of a plain `http://` URL.
fn host_and_path(url: &str) -> (&str, &str) {
    let rest = url.strip_prefix("http://").expect("http URL");
    match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    }
}

fn connect(url: &str) -> (TcpStream, String, String) {
    let (host, path) = host_and_path(url);
    let stream = TcpStream::connect(host).unwrap_or_else(|e| panic!("connect {host}: {e}"));
    stream.set_read_timeout(Some(WAIT)).unwrap();
    stream.set_write_timeout(Some(WAIT)).unwrap();
    (stream, host.to_string(), path.to_string())
}

/// [`exchange`] over HTTPS with a proxy serving TLS, trusting only the certificate with
/// `fingerprint` (as a pinned worker does).
pub fn https_exchange(
    method: &str,
    url: &str,
    fingerprint: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Reply {
    let rest = url.strip_prefix("https://").expect("https URL");
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let pin = fingerprint.parse().expect("a fingerprint");
    let config = relay_core::tls::pinned::client_config(pin);
    // The pin ignores the name; rustls only needs one to start the handshake.
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let connection = rustls::ClientConnection::new(config, name).expect("TLS client");
    let tcp = TcpStream::connect(host).unwrap_or_else(|e| panic!("connect {host}: {e}"));
    tcp.set_read_timeout(Some(WAIT)).unwrap();
    tcp.set_write_timeout(Some(WAIT)).unwrap();
    let mut stream = rustls::StreamOwned::new(connection, tcp);
    exchange_over(&mut stream, method, host, path, headers, body)
}

/// Writes one request with `Connection: close`; a `Host` among `headers` replaces the real one
/// (what a DNS-rebinding page's request carries).
fn write_request(
    stream: &mut impl Write,
    method: &str,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) {
    let body = body.unwrap_or("");
    let has = |name: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(name));
    let mut request = format!("{method} {path} HTTP/1.1\r\n");
    if !has("host") {
        request.push_str(&format!("Host: {host}\r\n"));
    }
    if !has("content-type") {
        request.push_str("Content-Type: application/json\r\n");
    }
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str(&format!(
        "Connection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    ));
    stream.write_all(request.as_bytes()).expect("send request");
}

/// The status code of a response head.
fn status_of(head: &str) -> u16 {
    head.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status code")
}

/// One request with `Connection: close` on `stream`, and its whole answer.
fn exchange_over(
    stream: &mut (impl Read + Write),
    method: &str,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Reply {
    write_request(stream, method, host, path, headers, body);
    let mut raw = Vec::new();
    if let Err(error) = stream.read_to_end(&mut raw) {
        // A TLS peer that closes without close_notify: the answer is complete all the same.
        assert!(
            error.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty(),
            "read response: {error}"
        );
    }
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("response head");
    let status = status_of(head);
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase()
            .starts_with("transfer-encoding: chunked")
    });
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    Reply {
        status,
        head: head.to_string(),
        body,
    }
}

pub fn dechunk(mut body: &str) -> String {
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

/// `Authorization` for requests from the owner of the relay whose data directory is
/// `data_dir`: its stored admin token (a request from this machine is not a login).
pub fn owner_auth(data_dir: &std::path::Path) -> String {
    let token = std::fs::read_to_string(data_dir.join("admin-token"))
        .unwrap_or_else(|e| panic!("the admin token in {}: {e}", data_dir.display()));
    format!("Bearer {}", token.trim())
}

/// `method url` with `body` from the owner of the relay whose data directory is `data_dir`.
pub fn owner_http(
    method: &str,
    url: &str,
    data_dir: &std::path::Path,
    body: Option<&str>,
) -> (u16, String) {
    let auth = owner_auth(data_dir);
    let reply = exchange(method, url, &[("authorization", &auth)], body);
    (reply.status, reply.body)
}

/// [`get_json`] from the owner of the relay whose data directory is `data_dir`.
pub fn owner_get_json(url: &str, data_dir: &std::path::Path) -> Value {
    let (status, body) = owner_http("GET", url, data_dir, None);
    assert_eq!(status, 200, "GET {url}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {url}: not JSON ({e}): {body}"))
}

pub fn get_json(url: &str) -> Value {
    let (status, body) = http("GET", url, None);
    assert_eq!(status, 200, "GET {url}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {url}: not JSON ({e}): {body}"))
}

/// Polls `check` every 50 ms until it returns true or [`WAIT`] passes.
pub fn eventually(what: &str, running: &Running, mut check: impl FnMut() -> bool) {
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

pub fn model_ids(url: &str) -> Vec<String> {
    get_json(&format!("{url}/v1/models"))["data"]
        .as_array()
        .expect("data array")
        .iter()
        .filter_map(|m| m["id"].as_str().map(str::to_string))
        .collect()
}

/// A loopback port with nothing listening on it (bound, then released).
pub fn unused_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral port")
        .port()
}

/// Sends a request and reads only the status line and headers (for streams that never end).
pub fn exchange_head(method: &str, url: &str, headers: &[(&str, &str)]) -> Reply {
    let (mut stream, host, path) = connect(url);
    write_request(&mut stream, method, &host, &path, headers, None);
    let mut raw = Vec::new();
    let mut byte = [0u8; 1];
    while !raw.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => raw.push(byte[0]),
            _ => break,
        }
    }
    let head = String::from_utf8_lossy(&raw).trim_end().to_string();
    Reply {
        status: status_of(&head),
        head,
        body: String::new(),
    }
}

/// The child processes of `pid` (Linux: /proc/PID/task/*/children); empty elsewhere.
pub fn child_pids(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut children: Vec<u32> = tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|text| {
            text.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect();
    children.sort_unstable();
    children.dedup();
    children
}

/// Reads one HTTP/1.1 request off `stream` (its head, then as many body bytes as the head's
/// `Content-Length` announces); returns it as text, or `None` when the peer closed first.
pub fn read_request(stream: &mut TcpStream) -> Option<String> {
    let _ = stream.set_read_timeout(Some(WAIT));
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        raw.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&raw);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                })
                .unwrap_or(0);
            if body.len() >= length {
                return Some(text.into_owned());
            }
        }
    }
}

/// Answers `200` with a JSON `body` and `Connection: close`.
pub fn write_json(stream: &mut TcpStream, body: &str) {
    let response = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes());
}

/// The list of models a [`model_server`] serves: one, `m1`.
pub const M1_MODELS: &str = r#"{"object":"list","data":[{"id":"m1","object":"model"}]}"#;

/// A model server listening on `ip` that lists model `m1` on every `GET` and answers every
/// `POST` with a chat completion saying `content`; its port. Runs until the test ends.
pub fn model_server(ip: &str, content: &'static str) -> u16 {
    let listener = TcpListener::bind(format!("{ip}:0")).expect("bind the model server");
    let port = listener.local_addr().expect("its address").port();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            thread::spawn(move || {
                let Some(head) = read_request(&mut stream) else {
                    return;
                };
                if head.starts_with("POST") {
                    let answer = format!(
                        r#"{{"id":"chatcmpl-1","object":"chat.completion","model":"m1","choices":[{{"index":0,"message":{{"role":"assistant","content":"{content}"}},"finish_reason":"stop"}}]}}"#
                    );
                    write_json(&mut stream, &answer);
                } else {
                    write_json(&mut stream, M1_MODELS);
                }
            });
        }
    });
    port
}

/// `modelrelay worker` (data directory `data_dir`) joining the proxy at `proxy_url` with
/// `secret`, serving model `m1` from the model server on `backend_port`.
pub fn headless_worker(
    data_dir: &Path,
    proxy_url: &str,
    secret: &str,
    backend_port: u16,
) -> Command {
    let mut command = modelrelay(data_dir);
    command.args([
        "worker",
        "--proxy-url",
        proxy_url,
        "--worker-secret",
        secret.trim(),
        "--backend-url",
        &format!("http://127.0.0.1:{backend_port}"),
        "--models",
        "m1",
    ]);
    command
}
