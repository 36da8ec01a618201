//! A join code works on the box it is pasted on (issue 28): a proxy listening on every address
//! (`--listen 0.0.0.0:PORT`, the dashboard's advice for letting other boxes join) here, and a
//! worker-only node on "another machine" — a network namespace joined to this one by a veth
//! pair — that joins with nothing but the code read from the proxy's `/api/join-code`. On that
//! other machine `0.0.0.0` would be itself, so the code must name addresses it can reach.
//! Needs root (the namespace); elsewhere the test says why it is skipped.
//!
//! And a proxy that moved is found again: restarted on a new address of its LAN (two namespaces
//! joined by a veth pair, a LAN of their own), the worker that joined it with its certificate
//! pinned finds it by its mDNS announcement and follows the fingerprint there.

#[path = "common/binary.rs"]
mod binary;
#[path = "common/netns.rs"]
mod netns;

use binary::*;
use netns::{FarSide, LanPair};

use serde_json::Value;

fn admin_token(data: &TempDir) -> String {
    std::fs::read_to_string(data.path().join("admin-token"))
        .expect("the node stored its admin token")
        .trim()
        .to_string()
}

fn get_with_token(url: &str, token: &str) -> Value {
    let bearer = format!("Bearer {token}");
    let reply = exchange("GET", url, &[("authorization", &bearer)], None);
    assert_eq!(reply.status, 200, "GET {url}: {}", reply.body);
    serde_json::from_str(&reply.body).expect("JSON")
}

#[test]
fn a_join_code_from_a_proxy_on_every_address_joins_a_worker_node_on_another_machine() {
    let far = match FarSide::create("join", 214) {
        Ok(far) => far,
        Err(why) => {
            println!("join across machines: skipped: {why}");
            return;
        }
    };
    // A model server on this side of the link.
    let backend = model_server(&far.host_ip, "from the far box");

    // The proxy, on every address of this machine.
    let proxy_data = TempDir::new("join-proxy");
    let port = unused_port();
    let mut command = modelrelay(proxy_data.path());
    command.args(["serve", "--listen", &format!("0.0.0.0:{port}")]);
    let mut proxy = Running::spawn(command);
    let banner_command = proxy.wait_for_stdout_line("modelrelay worker --proxy-url");
    let local = format!("http://127.0.0.1:{port}");
    let proxy_token = admin_token(&proxy_data);
    let info = get_with_token(&format!("{local}/api/join-code"), &proxy_token);
    let urls: Vec<String> = info["urls"]
        .as_array()
        .expect("urls")
        .iter()
        .map(|u| u.as_str().expect("a URL").to_string())
        .collect();
    eprintln!("the join code names {urls:?}");
    assert_eq!(info["url"], urls[0].as_str(), "{info}");
    assert!(
        urls.iter()
            .all(|u| !u.contains("0.0.0.0") && !u.contains("127.0.0.1") && !u.contains("[::")),
        "never a wildcard or loopback address: {urls:?}"
    );
    let over_the_link = format!("http://{}:{port}", far.host_ip);
    assert!(urls.contains(&over_the_link), "{urls:?}");
    assert!(
        urls.last()
            .is_some_and(|u| u.ends_with(&format!(".local:{port}"))),
        "the stable LAN name comes last: {urls:?}"
    );
    assert!(
        banner_command.contains(&urls[0]) && !banner_command.contains("0.0.0.0"),
        "the banner names what the code names: {banner_command}\n{}",
        proxy.output()
    );

    // The other machine: a worker-only node (its dashboard on its own link address), which
    // is given the code and nothing else.
    let node_data = TempDir::new("join-far-node");
    let config = node_data.path().join("config.toml");
    std::fs::write(&config, "[roles]\nproxy = false\nworker = true\n").expect("config");
    let node_port = unused_port();
    let mut inner = modelrelay(node_data.path());
    inner
        .arg("--config")
        .arg(&config)
        .args(["--listen", &format!("0.0.0.0:{node_port}")])
        .args([
            "--backend-url",
            &format!("http://{}:{backend}", far.host_ip),
        ])
        .args(["--models", "m1", "--worker-name", "far-box"]);
    let mut node = Running::spawn(far.command(&inner));
    node.wait_for_stdout_line("ModelRelay is serving at");
    let node_url = format!("http://{}:{node_port}", far.far_ip);
    let node_token = admin_token(&node_data);
    let bearer = format!("Bearer {node_token}");
    let body = format!(r#"{{"code":"{}"}}"#, info["code"].as_str().expect("code"));
    let reply = exchange(
        "POST",
        &format!("{node_url}/api/join"),
        &[
            ("authorization", &bearer),
            ("content-type", "application/json"),
        ],
        Some(&body),
    );
    assert_eq!(reply.status, 200, "join: {}\n{}", reply.body, node.output());

    // It joined over the link, at the first address it could reach, and serves.
    eventually("the far worker joins the proxy", &node, || {
        get_json(&format!("{local}/health"))["workers_connected"] == 1
    });
    let status = get_with_token(&format!("{node_url}/api/status"), &node_token);
    assert_eq!(
        status["node"]["worker"]["proxy_url"],
        over_the_link.as_str(),
        "{status}"
    );
    let (code, answer) = http(
        "POST",
        &format!("{local}/v1/chat/completions"),
        Some(r#"{"model":"m1","messages":[{"role":"user","content":"hi"}]}"#),
    );
    assert_eq!(code, 200, "{answer}");
    assert!(answer.contains("from the far box"), "{answer}");
    eprintln!("joined at {over_the_link}; {}", node.output());
    node.terminate_cleanly();
    proxy.terminate_cleanly();
}

/// Runs `program args` in namespace `ns` of `pair` to completion; its stdout.
fn run_in(pair: &LanPair, ns: &str, program: &str, args: &[&str]) -> String {
    let mut inner = std::process::Command::new(program);
    inner.args(args);
    let output = pair
        .command(ns, &inner)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `GET url` with `token`, from inside namespace `ns` (curl), as JSON (null when unreachable).
fn get_in(pair: &LanPair, ns: &str, url: &str, token: &str) -> Value {
    let bearer = format!("authorization: Bearer {token}");
    let body = run_in(pair, ns, "curl", &["-s", "-m", "5", "-H", &bearer, url]);
    serde_json::from_str(&body).unwrap_or(Value::Null)
}

#[test]
fn a_proxy_restarted_on_a_new_address_is_followed_by_its_certificate_within_30_s() {
    let mut lan = match LanPair::create("move", 216) {
        Ok(lan) => lan,
        Err(why) => {
            println!("a proxy that moved: skipped: {why}");
            return;
        }
    };
    // The worker's box: a model server on its loopback.
    let backend_port = unused_port();
    let mut backend_command = std::process::Command::new("python3");
    backend_command
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../scripts/smoke-backend.py"
        ))
        .args([&backend_port.to_string(), "2", "0.01"]);
    let _backend = Running::spawn(lan.command(&lan.b.clone(), &backend_command));

    // The proxy's box: HTTPS with its own certificate, announced on the LAN.
    let proxy_data = TempDir::new("move-proxy");
    let port = unused_port();
    let proxy_command = || {
        let mut command = modelrelay(proxy_data.path());
        command
            .args([
                "serve",
                "--listen",
                &format!("0.0.0.0:{port}"),
                "--tls",
                "self-signed",
            ])
            .env("WORKER_SECRET", "move-secret");
        command
    };
    let mut proxy = Running::spawn(lan.command(&lan.a.clone(), &proxy_command()));
    let fingerprint = proxy.banner_fingerprint();
    let token = admin_token(&proxy_data);
    let local = format!("https://127.0.0.1:{port}");
    let health = |lan: &LanPair| {
        let body = run_in(
            lan,
            &lan.a,
            "curl",
            &["-sk", "-m", "5", &format!("{local}/health")],
        );
        serde_json::from_str::<Value>(&body).unwrap_or(Value::Null)
    };

    // The worker-only node on the other box, pinned to the proxy's certificate at its first
    // address; its dashboard on its own loopback.
    let node_data = TempDir::new("move-node");
    let config = node_data.path().join("config.toml");
    std::fs::write(&config, "[roles]\nproxy = false\nworker = true\n").expect("config");
    let node_port = unused_port();
    let first_url = format!("https://{}:{port}", lan.a_ip);
    let mut inner = modelrelay(node_data.path());
    inner
        .arg("--config")
        .arg(&config)
        .args(["--listen", &format!("127.0.0.1:{node_port}")])
        .args([
            "--proxy-url",
            &first_url,
            "--proxy-fingerprint",
            &fingerprint,
        ])
        .args(["--worker-secret", "move-secret"])
        .args(["--backend-url", &format!("http://127.0.0.1:{backend_port}")])
        .args(["--worker-name", "far-box"]);
    let node = Running::spawn(lan.command(&lan.b.clone(), &inner));
    eventually(
        "the worker joins the proxy at its first address",
        &node,
        || health(&lan)["workers_connected"] == 1,
    );
    let node_token = admin_token(&node_data);
    let node_status = |lan: &LanPair| {
        get_in(
            lan,
            &lan.b,
            &format!("http://127.0.0.1:{node_port}/api/status"),
            &node_token,
        )
    };
    assert_eq!(
        node_status(&lan)["node"]["worker"]["proxy_url"],
        first_url.as_str()
    );

    // The proxy's box gets a new address from the router, and the proxy comes back on it.
    proxy.terminate_cleanly();
    lan.move_a(7);
    let moved_url = format!("https://{}:{port}", lan.a_ip);
    let mut proxy = Running::spawn(lan.command(&lan.a.clone(), &proxy_command()));
    assert_eq!(
        proxy.banner_fingerprint(),
        fingerprint,
        "the same certificate"
    );
    let listening = std::time::Instant::now();
    let deadline = listening + std::time::Duration::from_secs(30);
    while health(&lan)["workers_connected"] != 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the worker did not follow the proxy to {moved_url} within 30 s\n{}",
            node.output()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let followed = listening.elapsed();
    let status = node_status(&lan);
    assert_eq!(
        status["node"]["worker"]["proxy_url"],
        moved_url.as_str(),
        "the node's dashboard shows the address in use: {status}"
    );
    assert!(
        node.output().contains("the proxy moved"),
        "{}",
        node.output()
    );
    let bearer = format!("authorization: Bearer {token}");
    let answer = run_in(
        &lan,
        &lan.a,
        "curl",
        &[
            "-sk",
            "-m",
            "10",
            "-H",
            &bearer,
            "-H",
            "content-type: application/json",
            "-d",
            r#"{"model":"smoke-model","messages":[{"role":"user","content":"hi"}],"stream":true}"#,
            &format!("{local}/v1/chat/completions"),
        ],
    );
    assert!(answer.contains("[DONE]"), "served after the move: {answer}");
    println!(
        "a proxy that moved: {first_url} → {moved_url}; the worker followed its certificate and \
         served {:.1} s after the proxy listened again",
        followed.as_secs_f64()
    );
    proxy.terminate_cleanly();
}
