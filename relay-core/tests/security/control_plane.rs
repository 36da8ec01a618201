//! The control plane: DNS rebinding (`Host`), cross-site requests (`Origin`,
//! `Sec-Fetch-Site`), and the settings that need the admin token even on loopback. Each attack
//! runs against the zero-configuration binary (proxy + worker on 127.0.0.1) and checks the
//! refusal and that nothing changed: the config file's bytes, the relay's child processes, the
//! connected workers, and no secret in any refused answer.

use std::path::PathBuf;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::binary::*;

/// A config file a user already has: the attacks must leave these bytes as they are.
const USER_CONFIG: &str = "# my settings\n[proxy]\nmax_queue_len = 50\n";

/// What a web page tries to make the node run.
const LAUNCH_ATTACK: &str =
    "[worker.model_map.x]\nstart_script = \"/usr/bin/touch\"\nargs = [\"created-by-a-web-page\"]\n";

/// A zero-configuration relay with a known config file and data directory.
pub(crate) struct Relay {
    pub(crate) running: Running,
    pub(crate) url: String,
    data: TempDir,
    config: PathBuf,
}

impl Relay {
    pub(crate) fn start(extra: impl FnOnce(&mut Command)) -> Relay {
        let data = TempDir::new("security");
        let config = data.path().join("config.toml");
        std::fs::write(&config, USER_CONFIG).expect("write config");
        let mut command = modelrelay(data.path());
        command
            .args(["--listen", "127.0.0.1:0", "--config"])
            .arg(&config)
            .current_dir(data.path());
        extra(&mut command);
        let mut running = Running::spawn(command);
        let url = running.relay_url();
        Relay {
            running,
            url,
            data,
            config,
        }
    }

    fn host(&self) -> String {
        self.url.trim_start_matches("http://").to_string()
    }

    pub(crate) fn port(&self) -> String {
        self.url.rsplit(':').next().unwrap().to_string()
    }

    pub(crate) fn secret(&self) -> String {
        read_trimmed(&self.data.path().join("worker-secret"))
    }

    pub(crate) fn admin_token(&self) -> String {
        read_trimmed(&self.data.path().join("admin-token"))
    }

    /// `Authorization` as the node's owner sends it (a request from this machine is not a
    /// login: without it, only the live status answers).
    pub(crate) fn owner_auth(&self) -> String {
        format!("Bearer {}", self.admin_token())
    }

    pub(crate) fn data_dir(&self) -> &std::path::Path {
        self.data.path()
    }

    pub(crate) fn config_bytes(&self) -> Vec<u8> {
        std::fs::read(&self.config).expect("read config")
    }

    /// `/api/status` as the dashboard itself sees it.
    fn status(&self) -> Value {
        let reply = exchange("GET", &format!("{}/api/status", self.url), &[], None);
        assert_eq!(reply.status, 200, "{reply:?}");
        serde_json::from_str(&reply.body).expect("status JSON")
    }

    /// Waits for the in-process worker to register, and returns its id.
    fn worker_id(&self) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(id) = self.status()["workers"][0]["id"].as_str() {
                return id.to_string();
            }
            assert!(
                Instant::now() < deadline,
                "the in-process worker never registered\n{}",
                self.running.output()
            );
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Asserts the attack left no trace: same config bytes, no child process, no file made by
    /// the launch attack.
    pub(crate) fn assert_untouched(&self, config_before: &[u8]) {
        assert_eq!(
            self.config_bytes(),
            config_before,
            "the config file changed\n{}",
            self.running.output()
        );
        assert!(
            child_pids(self.running.child.id()).is_empty(),
            "the relay started a process: {:?}",
            child_pids(self.running.child.id())
        );
        assert!(
            !self.data.path().join("created-by-a-web-page").exists(),
            "the attacker's program ran"
        );
    }
}

fn read_trimmed(path: &std::path::Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .to_string()
}

fn config_body(toml: &str) -> String {
    serde_json::json!({ "toml": toml }).to_string()
}

pub(crate) fn error_code(reply: &Reply) -> String {
    let body: Value =
        serde_json::from_str(&reply.body).unwrap_or_else(|e| panic!("not JSON ({e}): {reply:?}"));
    body["error"]["code"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn a_rebinding_host_cannot_read_the_join_code() {
    let relay = Relay::start(|_| {});
    let evil_host = format!("evil.example:{}", relay.port());
    let refused = exchange(
        "GET",
        &format!("{}/api/join-code", relay.url),
        &[("Host", &evil_host)],
        None,
    );
    assert_eq!(refused.status, 403, "{refused:?}");
    assert_eq!(error_code(&refused), "host_not_allowed");
    assert!(!refused.body.contains(&relay.secret()), "{refused:?}");

    let own = exchange(
        "GET",
        &format!("{}/api/join-code", relay.url),
        &[("Authorization", &relay.owner_auth())],
        None,
    );
    assert_eq!(own.status, 200, "{own:?}");
    assert!(own.body.contains(&relay.secret()));
    assert_eq!(own.header("cache-control").as_deref(), Some("no-store"));
    assert_eq!(
        own.header("x-content-type-options").as_deref(),
        Some("nosniff")
    );
}

#[test]
fn a_rebinding_host_is_refused_on_every_route_of_a_loopback_listener() {
    let relay = Relay::start(|_| {});
    let evil_host = format!("evil.example:{}", relay.port());
    for (method, path, dialect_field) in [
        ("GET", "/", "error"),
        ("GET", "/v1/models", "error"),
        ("POST", "/v1/chat/completions", "error"),
        ("POST", "/v1/messages", "type"),
        ("GET", "/api/status", "error"),
    ] {
        let reply = exchange(
            method,
            &format!("{}{path}", relay.url),
            &[("Host", &evil_host)],
            Some("{\"model\":\"m\",\"messages\":[]}"),
        );
        assert_eq!(reply.status, 403, "{method} {path}: {reply:?}");
        let body: Value = serde_json::from_str(&reply.body).expect("JSON error");
        assert!(
            body.get(dialect_field).is_some(),
            "{path}: error in the route's dialect: {body}"
        );
    }
    // Anthropic's shape for /v1/messages.
    let messages = exchange(
        "POST",
        &format!("{}/v1/messages", relay.url),
        &[("Host", &evil_host)],
        Some("{}"),
    );
    let body: Value = serde_json::from_str(&messages.body).unwrap();
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], "permission_error", "{body}");
}

#[test]
fn a_rebinding_page_cannot_write_a_launch_command_into_the_config() {
    let relay = Relay::start(|_| {});
    let before = relay.config_bytes();
    let evil_host = format!("evil.example:{}", relay.port());
    let origin = format!("http://{evil_host}");
    let refused = exchange(
        "PUT",
        &format!("{}/api/config", relay.url),
        &[("Host", &evil_host), ("Origin", &origin)],
        Some(&config_body(LAUNCH_ATTACK)),
    );
    assert_eq!(refused.status, 403, "{refused:?}");
    let load = exchange(
        "POST",
        &format!("{}/api/lifecycle/x/load", relay.url),
        &[("Host", &evil_host), ("Origin", &origin)],
        None,
    );
    assert_eq!(load.status, 403, "{load:?}");
    relay.assert_untouched(&before);
}

#[test]
fn a_loopback_request_without_the_admin_token_cannot_add_a_program_to_the_model_map() {
    let relay = Relay::start(|_| {});
    let before = relay.config_bytes();
    // What another local user (or a page that got past the browser) sends: right Host, no Origin.
    let refused = exchange(
        "PUT",
        &format!("{}/api/config", relay.url),
        &[],
        Some(&config_body(LAUNCH_ATTACK)),
    );
    assert_eq!(refused.status, 401, "{refused:?}");
    assert_eq!(error_code(&refused), "admin_token_required");
    assert!(
        refused.body.contains("modelrelay dashboard"),
        "the refusal says how to sign in: {}",
        refused.body
    );
    assert!(!refused.body.contains(&relay.admin_token()));
    let wrong = exchange(
        "PUT",
        &format!("{}/api/config", relay.url),
        &[("Authorization", "Bearer not-the-token")],
        Some(&config_body(LAUNCH_ATTACK)),
    );
    assert_eq!(wrong.status, 401, "{wrong:?}");
    let load = exchange(
        "POST",
        &format!("{}/api/lifecycle/x/load", relay.url),
        &[],
        None,
    );
    assert_eq!(load.status, 401, "{load:?}");
    relay.assert_untouched(&before);

    // The same change with the token is saved: the rule guards, it does not forbid.
    let saved = exchange(
        "PUT",
        &format!("{}/api/config", relay.url),
        &[("Authorization", &relay.owner_auth())],
        Some(&config_body(&format!("{USER_CONFIG}{LAUNCH_ATTACK}"))),
    );
    assert_eq!(saved.status, 200, "{saved:?}");
    assert!(String::from_utf8(relay.config_bytes())
        .unwrap()
        .contains("start_script"));
}

#[test]
fn a_loopback_request_without_the_admin_token_cannot_redirect_the_worker_or_an_upstream() {
    let relay = Relay::start(|_| {});
    let before = relay.config_bytes();
    for (method, path, body) in [
        (
            "PUT",
            "/api/settings",
            r#"{"worker":{"backend_url":"http://127.0.0.1:1"}}"#.to_string(),
        ),
        (
            "PUT",
            "/api/settings",
            r#"{"proxy":{"aliases":{"m1":"attackers-model"},"default_model":"attackers-model"}}"#
                .to_string(),
        ),
        (
            "PUT",
            "/api/settings",
            r#"{"proxy":{"listen":"0.0.0.0:8080"}}"#.to_string(),
        ),
        (
            "POST",
            "/api/join",
            r#"{"proxy_url":"http://127.0.0.1:1","secret":"x"}"#.to_string(),
        ),
        (
            "PUT",
            "/api/config",
            config_body(
                "[[proxy.upstreams]]\nname = \"o\"\nbase_url = \"http://127.0.0.1:1\"\napi_key_env = \"HOME\"\n",
            ),
        ),
        (
            "PUT",
            "/api/config",
            config_body("[proxy]\nworker_secret = \"the-attackers-secret\"\n"),
        ),
        (
            "PUT",
            "/api/config",
            config_body("[proxy]\nallowed_hosts = [\"evil.example\"]\n"),
        ),
        // Even a harmless setting: a request from this machine is not a login.
        (
            "PUT",
            "/api/settings",
            r#"{"proxy":{"max_queue_len":7}}"#.to_string(),
        ),
    ] {
        let reply = exchange(method, &format!("{}{path}", relay.url), &[], Some(&body));
        assert_eq!(reply.status, 401, "{method} {path}: {reply:?}");
        assert_eq!(error_code(&reply), "admin_token_required", "{path}");
    }
    relay.assert_untouched(&before);
}

#[test]
fn a_cross_site_text_plain_post_cannot_refresh_drain_or_load() {
    let relay = Relay::start(|_| {});
    let worker = relay.worker_id();
    let before = relay.config_bytes();
    let attacks: [(&str, &[(&str, &str)]); 4] = [
        (
            "/api/models/refresh",
            &[
                ("Origin", "http://evil.example"),
                ("Content-Type", "text/plain"),
            ],
        ),
        (
            "/api/models/refresh",
            &[
                ("Sec-Fetch-Site", "cross-site"),
                ("Content-Type", "text/plain"),
            ],
        ),
        (
            "/api/lifecycle/x/load",
            &[
                ("Origin", "null"),
                ("Content-Type", "application/x-www-form-urlencoded"),
            ],
        ),
        (
            "drain",
            &[
                ("Origin", "http://127.0.0.1:1"),
                ("Content-Type", "text/plain"),
            ],
        ),
    ];
    for (path, headers) in attacks {
        let path = if path == "drain" {
            format!("/api/workers/{worker}/drain")
        } else {
            path.to_string()
        };
        let reply = exchange("POST", &format!("{}{path}", relay.url), headers, Some("x"));
        assert_eq!(reply.status, 403, "{path} {headers:?}: {reply:?}");
        assert_eq!(error_code(&reply), "cross_site_request", "{path}");
    }
    relay.assert_untouched(&before);
    let status = relay.status();
    assert_eq!(status["workers"][0]["id"], worker.as_str(), "{status}");
    assert_ne!(status["workers"][0]["state"], "draining", "{status}");

    // The dashboard's own page may (signed in).
    let own = format!("http://{}", relay.host());
    let reply = exchange(
        "POST",
        &format!("{}/api/models/refresh", relay.url),
        &[
            ("Origin", &own),
            ("Sec-Fetch-Site", "same-origin"),
            ("Authorization", &relay.owner_auth()),
        ],
        None,
    );
    assert_eq!(reply.status, 202, "{reply:?}");
}

#[test]
fn v1_refuses_a_foreign_origin_in_the_routes_dialect_and_serves_configured_ones() {
    let relay = Relay::start(|c| {
        c.env("MODELRELAY_CORS_ORIGINS", "https://chat.example");
    });
    let chat = exchange(
        "POST",
        &format!("{}/v1/chat/completions", relay.url),
        &[
            ("Origin", "http://evil.example"),
            ("Content-Type", "text/plain"),
        ],
        Some("{\"model\":\"m\",\"messages\":[]}"),
    );
    assert_eq!(chat.status, 403, "{chat:?}");
    assert_eq!(error_code(&chat), "origin_not_allowed");
    let messages = exchange(
        "POST",
        &format!("{}/v1/messages", relay.url),
        &[("Origin", "http://evil.example")],
        Some("{}"),
    );
    assert_eq!(messages.status, 403);
    let body: Value = serde_json::from_str(&messages.body).unwrap();
    assert_eq!(body["type"], "error", "Anthropic shape: {body}");

    let preflight = exchange(
        "OPTIONS",
        &format!("{}/v1/chat/completions", relay.url),
        &[
            ("Origin", "https://chat.example"),
            ("Access-Control-Request-Method", "POST"),
        ],
        None,
    );
    assert_eq!(preflight.status, 204, "{preflight:?}");
    assert_eq!(
        preflight.header("access-control-allow-origin").as_deref(),
        Some("https://chat.example")
    );
    let configured = exchange(
        "GET",
        &format!("{}/v1/models", relay.url),
        &[("Origin", "https://chat.example")],
        None,
    );
    assert_eq!(configured.status, 200, "{configured:?}");
    assert_eq!(
        configured.header("access-control-allow-origin").as_deref(),
        Some("https://chat.example")
    );
    // Clients that send no Origin (curl, the SDKs) are unaffected.
    let plain = exchange("GET", &format!("{}/v1/models", relay.url), &[], None);
    assert_eq!(plain.status, 200, "{plain:?}");
    assert_eq!(plain.header("access-control-allow-origin"), None);
}

#[test]
fn the_ui_is_served_with_a_csp_that_forbids_framing_and_sniffing() {
    let relay = Relay::start(|_| {});
    let page = exchange("GET", &format!("{}/", relay.url), &[], None);
    assert_eq!(page.status, 200, "{page:?}");
    let csp = page.header("content-security-policy").expect("CSP");
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    assert!(csp.contains("script-src 'self'"), "{csp}");
    assert_eq!(page.header("x-frame-options").as_deref(), Some("DENY"));
    assert_eq!(
        page.header("x-content-type-options").as_deref(),
        Some("nosniff")
    );
}

#[test]
fn a_configured_host_name_is_allowed() {
    let relay = Relay::start(|c| {
        c.env("MODELRELAY_ALLOWED_HOSTS", "relay.home.arpa, other.example");
    });
    let host = format!("relay.home.arpa:{}", relay.port());
    let reply = exchange(
        "GET",
        &format!("{}/api/status", relay.url),
        &[("Host", &host)],
        None,
    );
    assert_eq!(reply.status, 200, "{reply:?}");
    let localhost = format!("localhost:{}", relay.port());
    let reply = exchange(
        "GET",
        &format!("{}/api/status", relay.url),
        &[("Host", &localhost)],
        None,
    );
    assert_eq!(reply.status, 200, "{reply:?}");
}

#[test]
fn the_banner_says_where_the_secrets_are_and_never_prints_them() {
    let mut relay = Relay::start(|_| {});
    relay.running.wait_for_stdout_line("Worker secret:");
    let stdout = relay.running.stdout();
    assert!(!stdout.contains(&relay.secret()), "{stdout}");
    assert!(!stdout.contains(&relay.admin_token()), "{stdout}");
    let data = relay.data.path().display().to_string();
    assert!(stdout.contains(&format!("{data}/admin-token")), "{stdout}");
    assert!(
        stdout.contains(&format!("{data}/worker-secret")),
        "{stdout}"
    );
    relay.running.terminate_cleanly();
}

#[test]
fn the_worker_secret_file_keeps_the_secret_off_the_command_line() {
    let data = TempDir::new("secret-file");
    let file = data.path().join("secret");
    std::fs::write(&file, "from-a-file-0123456789\n").unwrap();
    let mut command = modelrelay(data.path());
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--worker-secret-file"])
        .arg(&file);
    let mut relay = Running::spawn(command);
    let url = relay.relay_url();
    let join = exchange(
        "GET",
        &format!("{url}/api/join-code"),
        &[("Authorization", &owner_auth(data.path()))],
        None,
    );
    assert_eq!(join.status, 200, "{join:?}");
    let body: Value = serde_json::from_str(&join.body).unwrap();
    assert_eq!(body["secret"], "from-a-file-0123456789");
    assert!(!relay.stdout().contains("from-a-file-0123456789"));
    relay.terminate_cleanly();
}

#[test]
fn a_worker_sending_its_secret_in_the_url_and_the_header_is_refused() {
    // Our worker and the published one send the header; the seeds keep the URL form for older
    // workers. One that sends both only puts the secret where access logs keep it.
    let relay = Relay::start(|_| {});
    let secret = relay.secret();
    let upgrade = |path: &str, header: Option<&str>| {
        let mut headers = vec![
            ("Connection", "Upgrade"),
            ("Upgrade", "websocket"),
            ("Sec-WebSocket-Version", "13"),
            ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ];
        if let Some(secret) = header {
            headers.push(("X-Worker-Secret", secret));
        }
        exchange_head("GET", &format!("{}{path}", relay.url), &headers).status
    };
    let in_url = format!("/v1/worker/connect?provider=local&secret={secret}");
    assert_eq!(upgrade(&in_url, Some(&secret)), 400, "both: refused");
    assert_eq!(
        upgrade("/v1/worker/connect?provider=local", Some(&secret)),
        101,
        "the header alone"
    );
    assert_eq!(
        upgrade(&in_url, None),
        101,
        "the legacy URL form alone, as the seeds keep it"
    );
}

#[test]
fn no_route_takes_the_admin_token_in_its_url() {
    // URLs end up in access logs, browser history and Referer headers.
    let relay = Relay::start(|c| {
        c.env("MODELRELAY_ADMIN_TOKEN", "configured-token-123");
    });
    for path in ["/api/status", "/api/join-code"] {
        let reply = exchange(
            "GET",
            &format!("{}{path}?token=configured-token-123", relay.url),
            &[],
            None,
        );
        assert_eq!(reply.status, 401, "{path}: {reply:?}");
    }
    let events = exchange_head(
        "GET",
        &format!("{}/api/events?token=configured-token-123", relay.url),
        &[],
    );
    assert_eq!(events.status, 401, "{events:?}");
    let header = exchange(
        "GET",
        &format!("{}/api/status", relay.url),
        &[("Authorization", "Bearer configured-token-123")],
        None,
    );
    assert_eq!(header.status, 200, "{header:?}");
}

#[test]
fn the_headless_binary_gives_the_desktop_apps_origins_no_secret() {
    // Any program can send `Origin: tauri://localhost`; only the desktop app's own node may
    // treat it as its window.
    let relay = Relay::start(|_| {});
    for origin in ["tauri://localhost", "http://tauri.localhost"] {
        let refused = exchange(
            "GET",
            &format!("{}/api/join-code", relay.url),
            &[("Origin", origin)],
            None,
        );
        assert_eq!(refused.status, 403, "{origin}: {refused:?}");
        assert!(!refused.body.contains(&relay.secret()), "{refused:?}");
        assert_eq!(refused.header("access-control-allow-origin"), None);
    }
}

#[test]
fn a_trickled_control_body_is_cut_off_with_408_and_changes_nothing() {
    use std::io::{Read, Write};
    let relay = Relay::start(|_| {});
    let before = relay.config_bytes();
    let mut stream = std::net::TcpStream::connect(relay.host()).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("read timeout");
    let body = config_body("[proxy]\nmax_queue_len = 7\n");
    let head = format!(
        "PUT /api/config HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Authorization: {}\r\nContent-Length: {}\r\n\r\n",
        relay.host(),
        relay.owner_auth(),
        body.len()
    );
    stream.write_all(head.as_bytes()).expect("head");
    // A byte a second: the body would take longer than the deadline to arrive.
    let started = Instant::now();
    let trickle = stream.try_clone().expect("clone");
    let bytes = body.into_bytes();
    let writer = thread::spawn(move || {
        let mut trickle = trickle;
        for byte in bytes.iter().take(15) {
            if trickle.write_all(&[*byte]).is_err() {
                return;
            }
            thread::sleep(Duration::from_secs(1));
        }
    });
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    let took = started.elapsed();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("body_timeout"), "{answer}");
    assert!(took < Duration::from_secs(14), "cut off after {took:?}");
    let _ = writer.join();
    relay.assert_untouched(&before);
}

#[test]
fn an_oversized_control_body_is_refused_with_413_and_changes_nothing() {
    let relay = Relay::start(|_| {});
    let before = relay.config_bytes();
    // A config file just over the 2 MiB a control request may carry (just over, so the whole
    // body is read before the refusal and no unread bytes reset the connection under it).
    let body = config_body(&format!("# {}\n", "x".repeat(2 * 1024 * 1024 + 1024)));
    let refused = exchange(
        "PUT",
        &format!("{}/api/config", relay.url),
        &[
            ("content-type", "application/json"),
            ("Authorization", &relay.owner_auth()),
        ],
        Some(&body),
    );
    assert_eq!(refused.status, 413, "{}", refused.head);
    assert_eq!(error_code(&refused), "body_too_large");
    relay.assert_untouched(&before);
}
