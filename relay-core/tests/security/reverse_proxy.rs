//! A reverse proxy in front, on the same host (issue 25: "a reverse proxy is not loopback"):
//! Debian's real nginx forwards to the relay on 127.0.0.1, so every request it passes arrives
//! from loopback with `Host: 127.0.0.1:PORT` — what the README's "nginx or Caddy in front"
//! gives. A request that says it was forwarded (`Forwarded`, `X-Forwarded-For`,
//! `X-Forwarded-Host`, `X-Real-IP`) is from beyond this machine, and gets no loopback trust:
//! no secret, no change, without the admin token. Skipped where nginx is not installed
//! (`scripts/install-deps.sh` installs it).

use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::binary::*;
use crate::control_plane::{error_code, Relay};

/// Request headers, as the test client sends them.
type Headers<'a> = Vec<(&'a str, &'a str)>;

/// nginx as a child process with a configuration and prefix of its own; stopped on drop.
struct Nginx {
    child: std::process::Child,
    /// Its plain `proxy_pass` server: nginx's defaults, no header of its own added.
    plain: String,
    /// Its server with the forwarding headers most guides add (`X-Forwarded-For`, `X-Real-IP`).
    forwarding: String,
    _prefix: TempDir,
}

impl Nginx {
    fn start(upstream: &str) -> Option<Nginx> {
        let binary = ["/usr/sbin/nginx", "/usr/bin/nginx"]
            .into_iter()
            .find(|path| Path::new(path).exists());
        let Some(binary) = binary else {
            println!("reverse proxy tests: skipped: nginx is not installed");
            return None;
        };
        let prefix = TempDir::new("nginx");
        let (plain_port, forwarding_port) = (unused_port(), unused_port());
        let dir = prefix.path().display().to_string();
        let config = format!(
            "daemon off;\nmaster_process off;\npid {dir}/nginx.pid;\nerror_log {dir}/error.log;\n\
             events {{}}\nhttp {{\n  access_log {dir}/access.log;\n\
               client_body_temp_path {dir}/body;\n  proxy_temp_path {dir}/proxy;\n\
               fastcgi_temp_path {dir}/fastcgi;\n  uwsgi_temp_path {dir}/uwsgi;\n\
               scgi_temp_path {dir}/scgi;\n\
               server {{ listen 127.0.0.1:{plain_port};\n\
                 location / {{ proxy_pass {upstream}; }} }}\n\
               server {{ listen 127.0.0.1:{forwarding_port};\n\
                 location / {{ proxy_pass {upstream};\n\
                   proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n\
                   proxy_set_header X-Real-IP $remote_addr; }} }}\n}}\n"
        );
        let config_path = prefix.path().join("nginx.conf");
        std::fs::write(&config_path, config).expect("write nginx.conf");
        let child = Command::new(binary)
            .arg("-p")
            .arg(prefix.path())
            .arg("-c")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nginx");
        let nginx = Nginx {
            child,
            plain: format!("http://127.0.0.1:{plain_port}"),
            forwarding: format!("http://127.0.0.1:{forwarding_port}"),
            _prefix: prefix,
        };
        let deadline = Instant::now() + WAIT;
        while std::net::TcpStream::connect(nginx.forwarding.trim_start_matches("http://")).is_err()
            || std::net::TcpStream::connect(nginx.plain.trim_start_matches("http://")).is_err()
        {
            assert!(Instant::now() < deadline, "nginx did not start");
            thread::sleep(Duration::from_millis(50));
        }
        Some(nginx)
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn through_a_same_host_reverse_proxy_nobody_reads_the_join_code_or_changes_a_setting() {
    let relay = Relay::start(|_| {});
    let Some(nginx) = Nginx::start(&relay.url) else {
        return;
    };
    let before = relay.config_bytes();
    let secret = relay.secret();
    let token = relay.admin_token();

    // The internet through nginx's plain proxy_pass, saying whom it is (as a client of a real
    // front end would be said to be), and through the usual forwarding configuration.
    let attempts: [(&str, &str, Headers); 3] = [
        (
            "plain",
            &nginx.plain,
            vec![("X-Forwarded-For", "203.0.113.9")],
        ),
        (
            "plain",
            &nginx.plain,
            vec![("Forwarded", "for=203.0.113.9")],
        ),
        ("forwarding", &nginx.forwarding, vec![]),
    ];
    for (server, base, headers) in &attempts {
        let read = exchange("GET", &format!("{base}/api/join-code"), headers, None);
        assert_eq!(read.status, 401, "{server} {headers:?}: {read:?}");
        assert_eq!(error_code(&read), "admin_token_required");
        assert!(read.body.contains("reverse proxy"), "{read:?}");
        assert!(!read.body.contains(&secret), "the secret leaked: {read:?}");

        let mut change = headers.clone();
        change.push(("content-type", "application/json"));
        let write = exchange(
            "PUT",
            &format!("{base}/api/settings"),
            &change,
            Some(r#"{"proxy":{"aliases":{"llama3":"attackers-model"},"listen":"0.0.0.0:8080"}}"#),
        );
        assert_eq!(write.status, 401, "{server} {headers:?}: {write:?}");

        let scrape = exchange("GET", &format!("{base}/metrics"), headers, None);
        assert_eq!(scrape.status, 401, "{server} {headers:?}: {scrape:?}");
    }
    relay.assert_untouched(&before);

    // The owner, remote through the same front end, with the admin token: served.
    let bearer = format!("Bearer {token}");
    let owner = exchange(
        "GET",
        &format!("{}/api/join-code", nginx.forwarding),
        &[("authorization", &bearer)],
        None,
    );
    assert_eq!(owner.status, 200, "{owner:?}");
    assert!(owner.body.contains(&secret));
    // And on this machine, without a front end, the dashboard stays as it was.
    let local = exchange("GET", &format!("{}/api/status", relay.url), &[], None);
    assert_eq!(local.status, 200, "{local:?}");
    // Inference through the front end is not the control plane: it is served as before.
    let models = exchange("GET", &format!("{}/v1/models", nginx.forwarding), &[], None);
    assert_eq!(models.status, 200, "{models:?}");
}
