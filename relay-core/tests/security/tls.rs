//! Encrypted LAN joins without a CA: the proxy's own TLS, and workers pinned to its certificate.
//!
//! Each test runs the real binary: a proxy with `--tls self-signed` (or certificate files), and
//! workers given its fingerprint the way a join code or the banner gives it.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::binary::*;

/// The answer the stand-in model server gives every chat completion.
const ANSWER: &str = "pinned and encrypted";

/// A proxy serving TLS with a certificate it generated, on a fresh loopback port.
struct TlsProxy {
    running: Running,
    url: String,
    fingerprint: String,
    data: TempDir,
}

impl TlsProxy {
    fn start(data: TempDir) -> TlsProxy {
        let mut command = modelrelay(data.path());
        command.args(["serve", "--listen", "127.0.0.1:0", "--tls", "self-signed"]);
        let mut running = Running::spawn(command);
        let url = running.https_relay_url();
        let fingerprint = running.banner_fingerprint();
        TlsProxy {
            running,
            url,
            fingerprint,
            data,
        }
    }

    fn secret(&self) -> String {
        std::fs::read_to_string(self.data.path().join("worker-secret"))
            .expect("the proxy stores a generated secret")
            .trim()
            .to_string()
    }

    /// `GET path` as the node's owner (with its admin token).
    fn get(&self, path: &str) -> Value {
        let reply = https_exchange(
            "GET",
            &format!("{}{path}", self.url),
            &self.fingerprint,
            &[("Authorization", &owner_auth(self.data.path()))],
            None,
        );
        assert_eq!(reply.status, 200, "GET {path}: {reply:?}");
        serde_json::from_str(&reply.body).expect("JSON")
    }

    fn workers_connected(&self) -> u64 {
        self.get("/health")["workers_connected"]
            .as_u64()
            .expect("a count")
    }

    /// A worker joining this proxy pinned to `fingerprint`, forwarding model `m1` to `backend`.
    fn worker(&self, fingerprint: &str, backend: &str) -> (Running, TempDir) {
        let data = TempDir::new("tls-worker");
        let mut command = modelrelay(data.path());
        command.args([
            "worker",
            "--proxy-url",
            &self.url,
            "--proxy-fingerprint",
            fingerprint,
            "--worker-secret",
            &self.secret(),
            "--backend-url",
            backend,
            "--models",
            "m1",
        ]);
        (Running::spawn(command), data)
    }
}

/// A stand-in model server: answers every request with one chat completion, until the test
/// process ends.
fn model_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the model server");
    let url = format!("http://{}", listener.local_addr().unwrap());
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { break };
            thread::spawn(move || answer_one(stream));
        }
    });
    url
}

fn answer_one(mut stream: TcpStream) {
    if read_request(&mut stream).is_none() {
        return;
    }
    let answer = format!(
        r#"{{"id":"chatcmpl-1","object":"chat.completion","model":"m1","choices":[{{"index":0,"message":{{"role":"assistant","content":"{ANSWER}"}},"finish_reason":"stop"}}]}}"#
    );
    write_json(&mut stream, &answer);
}

#[test]
fn a_worker_pinned_to_the_right_fingerprint_joins_a_self_signed_proxy_and_serves_a_request() {
    let proxy = TlsProxy::start(TempDir::new("tls-join"));
    assert!(
        proxy.fingerprint.starts_with("sha256:") && proxy.fingerprint.len() == 7 + 64,
        "{}",
        proxy.fingerprint
    );
    let status = proxy.get("/api/status");
    assert_eq!(status["node"]["url"], proxy.url.as_str(), "{status}");

    let (worker, _worker_data) = proxy.worker(&proxy.fingerprint, &model_server());
    eventually("the pinned worker joins", &worker, || {
        proxy.workers_connected() == 1
    });
    let reply = https_exchange(
        "POST",
        &format!("{}/v1/chat/completions", proxy.url),
        &proxy.fingerprint,
        &[],
        Some(r#"{"model":"m1","messages":[{"role":"user","content":"hi"}]}"#),
    );
    assert_eq!(reply.status, 200, "{reply:?}\n{}", worker.output());
    assert!(reply.body.contains(ANSWER), "{reply:?}");
}

#[test]
fn a_worker_pinned_to_another_fingerprint_is_refused_with_a_clear_error_and_never_registers() {
    let proxy = TlsProxy::start(TempDir::new("tls-wrong-pin"));
    let wrong = format!("sha256:{}", "ab".repeat(32));
    let (mut worker, _worker_data) = proxy.worker(&wrong, &model_server());
    // The worker logs why each attempt failed; the first one is enough to judge.
    let deadline = Instant::now() + WAIT;
    let log = loop {
        let output = worker.output();
        if output.contains("pinned to") {
            break output;
        }
        assert!(
            Instant::now() < deadline,
            "no pin error within {WAIT:?}\n{output}"
        );
        assert!(
            worker.child.try_wait().unwrap().is_none(),
            "the worker exited instead of retrying\n{output}"
        );
        thread::sleep(Duration::from_millis(50));
    };
    let expected = format!(
        "the proxy at {} presented certificate {}, but this worker is pinned to {wrong}: ask the proxy's owner for a new join code",
        proxy.url, proxy.fingerprint
    );
    assert!(log.contains(&expected), "expected {expected:?} in\n{log}");
    // Give a (wrongly) accepted connection the time to register, then check none did.
    thread::sleep(Duration::from_millis(500));
    assert_eq!(proxy.workers_connected(), 0, "{}", proxy.running.output());
    worker.terminate_cleanly();
}

#[test]
fn a_worker_without_a_pin_does_not_trust_a_self_signed_proxy() {
    let proxy = TlsProxy::start(TempDir::new("tls-no-pin"));
    let data = TempDir::new("tls-unpinned-worker");
    let mut command = modelrelay(data.path());
    command.args([
        "worker",
        "--proxy-url",
        &proxy.url,
        "--worker-secret",
        &proxy.secret(),
        "--backend-url",
        &model_server(),
        "--models",
        "m1",
    ]);
    let worker = Running::spawn(command);
    eventually("the worker reports a certificate error", &worker, || {
        worker.output().contains("cannot connect to the proxy at")
    });
    assert!(
        worker.output().to_lowercase().contains("certificate"),
        "{}",
        worker.output()
    );
    assert_eq!(proxy.workers_connected(), 0);
}

#[test]
fn the_self_signed_certificate_is_generated_once_kept_private_and_reused_after_a_restart() {
    let data = TempDir::new("tls-reuse");
    let dir = data.path().to_path_buf();
    let mut first = TlsProxy::start(data);
    let cert = std::fs::read(dir.join("tls/cert.pem")).expect("the certificate is stored");
    assert!(String::from_utf8_lossy(&cert).contains("BEGIN CERTIFICATE"));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.join("tls/key.pem"))
            .expect("the key is stored")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "the private key is the owner's only");
    }
    let fingerprint = first.fingerprint.clone();
    first.running.terminate_cleanly();
    let TlsProxy { data, .. } = first;

    let second = TlsProxy::start(data);
    assert_eq!(second.fingerprint, fingerprint, "the same certificate");
    assert_eq!(std::fs::read(dir.join("tls/cert.pem")).unwrap(), cert);
    assert_eq!(second.get("/health")["status"], "ok");
}

#[test]
fn the_join_code_carries_the_fingerprint_and_the_https_url() {
    let proxy = TlsProxy::start(TempDir::new("tls-join-code"));
    let answer = proxy.get("/api/join-code");
    assert_eq!(
        answer["fingerprint"],
        proxy.fingerprint.as_str(),
        "{answer}"
    );
    assert_eq!(answer["url"], proxy.url.as_str(), "{answer}");
    let code = answer["code"].as_str().expect("a code");
    let details = relay_core::node::join_code::decode(code).expect("the code decodes");
    assert_eq!(details.url, proxy.url);
    assert_eq!(
        details.fingerprint.map(|f| f.to_string()),
        Some(proxy.fingerprint.clone())
    );
    // The banner's join command pins it too.
    let command = proxy.running.stdout();
    assert!(
        command.contains(&format!("--proxy-fingerprint {}", proxy.fingerprint)),
        "{command}"
    );
}

#[test]
fn plain_http_to_a_tls_proxy_gets_no_answer() {
    let proxy = TlsProxy::start(TempDir::new("tls-plain"));
    let plain = proxy.url.replacen("https://", "http://", 1);
    let host = plain.trim_start_matches("http://");
    let mut stream = TcpStream::connect(host).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    stream
        .write_all(format!("GET /api/join-code HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
        .unwrap();
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw);
    assert!(!text.contains("HTTP/1.1 200"), "{text}");
    assert!(!text.contains(&proxy.secret()), "no secret in the clear");
}

#[test]
fn given_certificate_files_are_served_and_their_fingerprint_shown() {
    let data = TempDir::new("tls-files");
    let key_pair = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    let certificate = params.self_signed(&key_pair).unwrap();
    let cert = data.path().join("mine.pem");
    let key = data.path().join("mine.key");
    std::fs::write(&cert, certificate.pem()).unwrap();
    std::fs::write(&key, key_pair.serialize_pem()).unwrap();
    let expected = relay_core::fingerprint::Fingerprint::of_der(certificate.der()).to_string();

    let mut command = modelrelay(data.path());
    command
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("TLS_CERT", &cert)
        .env("TLS_KEY", &key);
    let mut running = Running::spawn(command);
    let url = running.https_relay_url();
    assert_eq!(running.banner_fingerprint(), expected);
    let reply = https_exchange("GET", &format!("{url}/health"), &expected, &[], None);
    assert_eq!(reply.status, 200, "{reply:?}");
    assert!(
        !data.path().join("tls").exists(),
        "nothing generated when files are given"
    );
}

#[test]
fn the_wizards_connection_test_is_pinned_too_and_names_both_fingerprints_on_a_mismatch() {
    let proxy = TlsProxy::start(TempDir::new("tls-join-test"));
    let origin = proxy.url.clone();
    let test = |fingerprint: &str| -> Value {
        let body = serde_json::json!({
            "proxy_url": proxy.url,
            "secret": proxy.secret(),
            "fingerprint": fingerprint,
        })
        .to_string();
        let reply = https_exchange(
            "POST",
            &format!("{}/api/join/test", proxy.url),
            &proxy.fingerprint,
            &[
                ("Origin", origin.as_str()),
                ("Authorization", &owner_auth(proxy.data.path())),
            ],
            Some(&body),
        );
        assert_eq!(reply.status, 200, "{reply:?}");
        serde_json::from_str(&reply.body).expect("JSON")
    };
    let right = test(&proxy.fingerprint);
    assert_eq!(right["ok"], true, "{right}");
    let wrong = format!("sha256:{}", "cd".repeat(32));
    let refused = test(&wrong);
    assert_eq!(refused["ok"], false, "{refused}");
    let message = refused["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("presented certificate {}", proxy.fingerprint))
            && message.contains(&format!("pinned to {wrong}")),
        "{message}"
    );
    assert_eq!(
        proxy.workers_connected(),
        0,
        "a connection test never registers"
    );
}
