//! The control API (`docs/admin-api.md`): the live status and its feed, admin actions, the admin
//! token, the desktop webview's CORS, the embedded UI, and the node's settings, roles and setup.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use relay_core::node::{Node, NodeOptions, Roles, WorkerState};
use relay_core::protocol::ServerToWorker;
use relay_core::settings::Overrides;
use serde_json::{json, Value};

use crate::support::*;

const MODEL: &str = "llama3-8b";

/// A node on loopback with a fixed secret, its config file in a fresh temp dir, and a worker
/// role (when on) pointed at `backend`.
async fn start_node(roles: Roles, backend: Option<&str>, listen: &str) -> (Node, TempConfig) {
    let dir = TempConfig::new();
    let node = Node::start(NodeOptions {
        config_path: Some(dir.path.clone()),
        overrides: Overrides {
            listen: Some(listen.to_string()),
            worker_secret: Some(SECRET.to_string()),
            admin_token: (!listen.starts_with("127."))
                .then(|| "admin-s3cret-0123456789".to_string()),
            backend_url: Some(backend.unwrap_or("http://127.0.0.1:9").to_string()),
            worker_name: Some("node-worker".to_string()),
            ..Overrides::default()
        },
        roles: Some(roles),
        data_dir: Some(dir.dir.clone()),
        ..NodeOptions::default()
    })
    .await
    .expect("node starts");
    if let Some(token) = node.admin_token() {
        owners().insert(node.url(), token);
    }
    (node, dir)
}

/// Admin tokens of the nodes these tests started, by base URL. The tests' settings and setup
/// requests come from each node's owner: [`send_json`] and [`owner_auth`] give them its
/// token, as the dashboard's session would (a request from this machine is not a login;
/// `security/control_plane.rs` shows what one without a credential gets).
fn owners() -> std::sync::MutexGuard<'static, std::collections::BTreeMap<String, String>> {
    static OWNERS: std::sync::Mutex<std::collections::BTreeMap<String, String>> =
        std::sync::Mutex::new(std::collections::BTreeMap::new());
    OWNERS.lock().unwrap_or_else(|p| p.into_inner())
}

/// `Authorization` for requests to `url` from its node's owner, when a test node serves it.
fn owner_token(url: &str) -> Option<String> {
    owners()
        .iter()
        .find(|(base, _)| url.starts_with(base.as_str()))
        .map(|(_, token)| format!("Bearer {token}"))
}

/// The owner's `Authorization` value for `node`, for [`get_json`].
fn owner_auth(node: &Node) -> String {
    format!(
        "Bearer {}",
        node.admin_token().expect("every node has a token")
    )
}

/// A config file path in its own temp directory, removed on drop.
pub struct TempConfig {
    dir: PathBuf,
    path: PathBuf,
}

impl TempConfig {
    fn new() -> Self {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("mr-control-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempConfig {
            path: dir.join("config.toml"),
            dir,
        }
    }

    fn text(&self) -> String {
        std::fs::read_to_string(&self.path).unwrap_or_default()
    }
}

impl Drop for TempConfig {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

const PROXY_ONLY: Roles = Roles {
    proxy: true,
    worker: false,
};

async fn send_json(url: &str, request: reqwest::RequestBuilder, body: &Value) -> (u16, Value) {
    let request = match owner_token(url) {
        Some(token) => request.header("authorization", token),
        None => request,
    };
    let response = request
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("response");
    let status = response.status().as_u16();
    let text = response.text().await.expect("body");
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn put_json(url: &str, body: &Value) -> (u16, Value) {
    send_json(url, http().put(url), body).await
}

async fn post_json(url: &str, body: &Value) -> (u16, Value) {
    send_json(url, http().post(url), body).await
}

/// Opens `/api/events` at `base` (checking it is an event stream) and reads its first status:
/// the body, what is buffered of it, and that status.
async fn open_feed(
    base: &str,
) -> (
    impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin,
    String,
    Value,
) {
    let response = http()
        .get(format!("{base}/api/events"))
        .send()
        .await
        .expect("feed");
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut body = response.bytes_stream();
    let mut text = String::new();
    let first = next_status(&mut body, &mut text).await;
    (body, text, first)
}

/// Reads SSE from `body` until the next `status` event, returning its data.
async fn next_status(
    body: &mut (impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    text: &mut String,
) -> Value {
    loop {
        if let Some(end) = text.find("\n\n") {
            let event: String = text.drain(..end + 2).collect();
            if let Some(data) = event
                .lines()
                .find_map(|l| l.strip_prefix("data:"))
                .filter(|_| event.contains("event: status"))
            {
                return serde_json::from_str::<Value>(data.trim()).expect("status json");
            }
            continue;
        }
        let chunk = tokio::time::timeout(WAIT, body.next())
            .await
            .expect("feed within bound")
            .expect("feed open")
            .expect("chunk");
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
}

async fn status_of(base: &str) -> Value {
    let (status, body) = get_json(base, "/api/status", &[]).await;
    assert_eq!(status, 200, "{body}");
    body
}

#[tokio::test]
async fn status_shows_workers_models_queue_and_in_flight_requests_with_ttft_and_tokens() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, ack) = ScriptedWorker::join(proxy.addr, "gpu-a", &[MODEL], 2).await;
    let base = proxy.url();
    let client = tokio::spawn({
        let base = base.clone();
        async move {
            post(
                &base,
                "/v1/chat/completions",
                &json!({"model": MODEL, "stream": true, "messages": []}),
            )
            .await
        }
    });
    let request = worker.next_request().await;
    worker
        .chunk(
            &request.request_id,
            "data: {\"n\":1}\n\ndata: {\"n\":2}\n\n",
        )
        .await;
    let mut status = Value::Null;
    for _ in 0..50 {
        status = status_of(&base).await;
        if status["in_flight"][0]["tokens"] == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let w = &status["workers"][0];
    assert_eq!(w["id"], ack.worker_id.as_str());
    assert_eq!(w["name"], "gpu-a");
    assert_eq!(w["host"], "127.0.0.1");
    assert_eq!(w["models"], json!([MODEL]));
    assert_eq!(
        (w["load"].as_u64(), w["max_concurrent"].as_u64()),
        (Some(1), Some(2))
    );
    assert_eq!(w["state"], "busy");
    assert!(w["connected_unix_ms"].as_u64().unwrap() > 1_700_000_000_000);
    assert_eq!(
        status["models"],
        json!([{"name": MODEL, "provider": "local", "workers": [ack.worker_id]}])
    );
    assert_eq!(status["queues"], json!([{"provider": "local", "depth": 0}]));
    let r = &status["in_flight"][0];
    assert_eq!(r["model"], MODEL);
    assert_eq!(r["worker"], ack.worker_id.as_str());
    assert_eq!(r["state"], "running");
    assert_eq!(r["streaming"], true);
    assert!(r["ttft_ms"].is_u64(), "{r}");
    assert_eq!(r["tokens"], 2);
    worker.chunk(&request.request_id, "data: [DONE]\n\n").await;
    worker.complete(&request.request_id, "").await;
    let (code, _, _) = client.await.expect("client");
    assert_eq!(code, 200);
    wait_until("the request is counted", || {
        proxy.hub.telemetry().totals().requests == 1
    })
    .await;
    let status = status_of(&base).await;
    assert_eq!(status["in_flight"], json!([]));
    assert_eq!(status["totals"]["requests"], 1);
    assert_eq!(status["totals"]["tokens"], 2);
    assert_eq!(
        status["node"]["roles"],
        json!({"proxy": true, "worker": false})
    );
    assert_eq!(status["node"]["admin_token_required"], false);
    proxy.shutdown().await;
}

#[tokio::test]
async fn heartbeat_round_trip_is_shown_per_worker() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, ack) = ScriptedWorker::join(proxy.addr, "gpu-a", &[MODEL], 1).await;
    // The test config pings every 200 ms; answer one.
    loop {
        if let ServerToWorker::Ping(ping) = worker.recv_any().await {
            worker
                .send(&relay_core::protocol::WorkerToServer::Pong(
                    relay_core::protocol::PongMessage {
                        current_load: 0,
                        timestamp_unix_ms: ping.timestamp_unix_ms,
                        hardware: None,
                        model_states: None,
                    },
                ))
                .await;
            break;
        }
    }
    wait_until("the heartbeat is recorded", || {
        proxy
            .hub
            .telemetry()
            .worker(&ack.worker_id)
            .is_some_and(|w| w.heartbeat.is_some())
    })
    .await;
    let status = status_of(&proxy.url()).await;
    assert!(status["workers"][0]["heartbeat_ms"].is_f64(), "{status}");
    proxy.shutdown().await;
}

#[tokio::test]
async fn events_feed_sends_status_at_once_then_on_change_and_every_second() {
    let proxy = start_proxy(test_config()).await;
    let (mut body, mut text, first) = open_feed(&proxy.url()).await;
    assert_eq!(first["workers"], json!([]));
    let started = std::time::Instant::now();
    let (_worker, _) = ScriptedWorker::join(proxy.addr, "gpu-a", &[MODEL], 1).await;
    let mut seen = next_status(&mut body, &mut text).await;
    while seen["workers"].as_array().unwrap().is_empty() {
        seen = next_status(&mut body, &mut text).await;
    }
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "a change is pushed promptly, not on the next heartbeat: {:?}",
        started.elapsed()
    );
    // Nothing changes now, yet the chart's next point arrives within about a second.
    let quiet = std::time::Instant::now();
    let _ = next_status(&mut body, &mut text).await;
    assert!(quiet.elapsed() < Duration::from_millis(2500));
    proxy.shutdown().await;
}

#[tokio::test]
async fn beyond_max_event_subscribers_a_feed_gets_503_until_one_closes() {
    let mut config = test_config();
    config.max_event_subscribers = 2;
    let proxy = start_proxy(config).await;
    let (first, _, _) = open_feed(&proxy.url()).await;
    let (_second, _, _) = open_feed(&proxy.url()).await;
    let refused = http()
        .get(format!("{}/api/events", proxy.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().contains_key("retry-after"));
    let body: Value = serde_json::from_str(&refused.text().await.unwrap()).unwrap();
    assert_eq!(body["error"]["code"], "too_many_subscribers", "{body}");
    drop(first);
    // The closed feed's slot is free once the proxy notices the connection went away.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let response = http()
            .get(format!("{}/api/events", proxy.url()))
            .send()
            .await
            .unwrap();
        if response.status() == 200 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the slot never freed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    proxy.shutdown().await;
}

#[tokio::test]
async fn an_open_events_feed_ends_when_the_proxy_shuts_down_instead_of_holding_it_up() {
    let proxy = start_proxy(test_config()).await;
    let (mut body, _, _) = open_feed(&proxy.url()).await;
    // Without the closing signal the server waits for the feed until its 5 s stop timeout.
    let stopping = tokio::spawn(proxy.shutdown());
    let ended = tokio::time::timeout(Duration::from_secs(3), async {
        while let Some(chunk) = body.next().await {
            if chunk.is_err() {
                break;
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the feed is still open after shutdown began");
    tokio::time::timeout(Duration::from_secs(3), stopping)
        .await
        .expect("shutdown finishes promptly once the feed has ended")
        .expect("shutdown task");
}

#[tokio::test]
async fn draining_a_worker_from_the_dashboard_closes_it_once_idle_and_keeps_it_out() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, ack) = ScriptedWorker::join(proxy.addr, "gpu-a", &[MODEL], 1).await;
    let (code, body) = post_json(
        &format!("{}/api/workers/{}/drain", proxy.url(), ack.worker_id),
        &json!({}),
    )
    .await;
    assert_eq!(code, 202, "{body}");
    let reason = worker.closed().await;
    assert!(reason.contains("drained"), "{reason}");
    let mut again = ScriptedWorker::connect(proxy.addr).await;
    again
        .send(&relay_core::protocol::WorkerToServer::Register(
            relay_core::protocol::RegisterMessage {
                warm_ups: None,
                sides_first: None,
                worker_name: "gpu-a".to_string(),
                models: vec![MODEL.to_string()],
                max_concurrent: 1,
                protocol_version: None,
                current_load: None,
                mac_address: None,
                sleeps_when_idle: None,
                context_windows: None,
            },
        ))
        .await;
    let refused = again.closed().await;
    assert!(refused.contains("drained by an admin"), "{refused}");
    let (code, body) = post_json(
        &format!("{}/api/workers/w-999/drain", proxy.url()),
        &json!({}),
    )
    .await;
    assert_eq!(code, 404);
    assert_eq!(body["error"]["code"], "worker_not_found");
    proxy.shutdown().await;
}

#[tokio::test]
async fn refreshing_models_from_the_dashboard_asks_every_worker() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "gpu-a", &[MODEL], 1).await;
    let (code, body) = post_json(&format!("{}/api/models/refresh", proxy.url()), &json!({})).await;
    assert_eq!((code, body["workers"].as_u64()), (202, Some(1)));
    loop {
        if let ServerToWorker::ModelsRefresh(_) = worker.recv_any().await {
            break;
        }
    }
    proxy.shutdown().await;
}

#[tokio::test]
async fn beyond_loopback_the_control_api_requires_the_admin_token() {
    let (node, _dir) = start_node(PROXY_ONLY, None, "0.0.0.0:0").await;
    let base = format!("http://127.0.0.1:{}", node.addr().port());
    let (code, body) = get_json(&base, "/api/status", &[]).await;
    assert_eq!(code, 401);
    assert_eq!(body["error"]["code"], "admin_token_required");
    let (code, body) = get_json(&base, "/api/settings", &[("authorization", "Bearer wrong")]).await;
    assert_eq!(code, 401);
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("wrong admin token"));
    let (code, body) = get_json(
        &base,
        "/api/status",
        &[("authorization", "Bearer admin-s3cret-0123456789")],
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(body["node"]["admin_token_required"], true);
    let in_url = http()
        .get(format!("{base}/api/events?token=admin-s3cret-0123456789"))
        .send()
        .await
        .expect("feed");
    assert_eq!(in_url.status(), 401, "a token in a URL is not read");
    let feed = http()
        .get(format!("{base}/api/events"))
        .bearer_auth("admin-s3cret-0123456789")
        .send()
        .await
        .expect("feed");
    assert_eq!(feed.status(), 200);
    drop(feed);
    // The page itself loads without the token, so it can ask for one.
    let page = http().get(format!("{base}/")).send().await.expect("page");
    assert_eq!(page.status(), 200);
    node.shutdown().await;
}

#[tokio::test]
async fn on_loopback_the_status_is_open_and_everything_else_needs_a_sign_in() {
    let (node, dir) = start_node(PROXY_ONLY, None, "127.0.0.1:0").await;
    // The token was generated into the data directory, readable only by the node's owner.
    let stored = std::fs::read_to_string(dir.dir.join("admin-token")).expect("token stored");
    assert_eq!(node.admin_token().as_deref(), Some(stored.trim()));
    let (status, body) = get_json(&node.url(), "/api/status", &[]).await;
    assert_eq!(status, 200);
    assert_eq!(body["node"]["admin_token_required"], false, "{body}");
    for path in ["/api/settings", "/api/join-code", "/api/keys", "/api/usage"] {
        let (status, body) = get_json(&node.url(), path, &[]).await;
        assert_eq!(status, 401, "{path}: {body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("modelrelay dashboard"),
            "{body}"
        );
    }
    // The documented way in: a one-time link that sets the session cookie.
    let link = node
        .login_link(std::time::Duration::from_secs(60))
        .expect("a node signs its links");
    let no_redirects = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let signed_in = no_redirects.get(&link).send().await.expect("link");
    assert_eq!(signed_in.status(), 303);
    let cookie = signed_in.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let session = cookie.split(';').next().unwrap().to_string();
    let (status, body) = get_json(&node.url(), "/api/settings", &[("cookie", &session)]).await;
    assert_eq!(status, 200, "{body}");
    let again = no_redirects.get(&link).send().await.expect("link");
    assert_eq!(again.status(), 403, "a link works once");
    node.shutdown().await;
}

/// A request to `url` from a page of `origin` (a preflight for `OPTIONS`): its status and the
/// origin it was granted, if any.
async fn cross_origin(url: &str, method: reqwest::Method, origin: &str) -> (u16, Option<String>) {
    let answer = http()
        .request(method, url)
        .header("origin", origin)
        .header("access-control-request-method", "GET")
        .send()
        .await
        .expect("a cross-origin request");
    let granted = answer
        .headers()
        .get("access-control-allow-origin")
        .map(|v| v.to_str().unwrap_or_default().to_string());
    (answer.status().as_u16(), granted)
}

#[tokio::test]
async fn no_other_origin_is_granted_the_control_api_not_even_the_desktop_apps_old_ones() {
    // The desktop window shows the node's own page; no origin is granted cross-origin access.
    let proxy = start_proxy(test_config()).await;
    for path in ["/api/status", "/api/join-code"] {
        let url = format!("{}{path}", proxy.url());
        for origin in [
            "tauri://localhost",
            "http://tauri.localhost",
            "https://evil.example",
        ] {
            let (status, granted) = cross_origin(&url, reqwest::Method::GET, origin).await;
            assert_eq!(status, 403, "{path} from {origin}");
            assert_eq!(granted, None);
            let (_, granted) = cross_origin(&url, reqwest::Method::OPTIONS, origin).await;
            assert_eq!(granted, None, "preflight of {path} from {origin}");
        }
    }
    proxy.shutdown().await;
}

#[tokio::test]
async fn the_dashboard_and_the_setup_wizard_are_served_at_the_runbooks_addresses() {
    let proxy = start_proxy(test_config()).await;
    let root = http().get(proxy.url()).send().await.expect("page");
    let root_csp = root.headers()["content-security-policy"].clone();
    let index = root.text().await.expect("html");
    for path in ["/dashboard", "/setup"] {
        let page = http()
            .get(format!("{}{path}", proxy.url()))
            .send()
            .await
            .expect("page");
        assert_eq!(page.status(), 200, "{path}");
        assert_eq!(page.headers()["content-type"], "text/html", "{path}");
        assert_eq!(page.headers()["cache-control"], "no-cache", "{path}");
        assert_eq!(
            page.headers()["content-security-policy"],
            root_csp,
            "{path}: the UI's own CSP"
        );
        // The page itself; it opens the route its path names (ui/src/hash.ts, e2e-tested).
        assert_eq!(page.text().await.expect("html"), index, "{path}");
    }
    // Only those two: other paths are still unknown routes.
    let (status, _) = get_json(&proxy.url(), "/dashboards", &[]).await;
    assert_eq!(status, 404);
    proxy.shutdown().await;
}

#[tokio::test]
async fn the_web_ui_is_served_at_the_root_with_its_assets() {
    let proxy = start_proxy(test_config()).await;
    let page = http().get(proxy.url()).send().await.expect("page");
    assert_eq!(page.status(), 200);
    assert_eq!(page.headers()["content-type"], "text/html");
    let html = page.text().await.expect("html");
    // Every script and stylesheet the page names is served too.
    let assets: Vec<&str> = html
        .split(['"', '\''])
        .filter(|s| s.ends_with(".js") || s.ends_with(".css"))
        .collect();
    for asset in &assets {
        let path = asset.trim_start_matches('.');
        let response = http()
            .get(format!("{}{path}", proxy.url()))
            .send()
            .await
            .expect("asset");
        assert_eq!(response.status(), 200, "{asset}");
        assert!(response.headers()["cache-control"]
            .to_str()
            .unwrap()
            .contains("immutable"));
    }
    proxy.shutdown().await;
}

#[tokio::test]
async fn settings_round_trip_keeps_comments_and_lists_what_needs_a_restart() {
    let (node, dir) = start_node(PROXY_ONLY, None, "127.0.0.1:0").await;
    std::fs::write(
        &dir.path,
        "# my relay\n[proxy]\n# queue size\nmax_queue_len = 50\n",
    )
    .unwrap();
    let url = format!("{}/api/settings", node.url());
    let (code, body) = put_json(
        &url,
        &json!({"proxy": {"listen": "127.0.0.1:9999", "max_queue_len": 7, "aliases": {"claude-*": MODEL}}}),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["settings"]["proxy"]["max_queue_len"], 7);
    assert_eq!(body["settings"]["proxy"]["aliases"]["claude-*"], MODEL);
    assert_eq!(
        body["restart_required"],
        json!(["proxy.listen"]),
        "aliases and the queue bound apply live; the listen address needs a restart"
    );
    let text = dir.text();
    assert!(text.contains("# queue size\nmax_queue_len = 7"), "{text}");
    assert!(text.starts_with("# my relay"), "{text}");
    let (_, again) = get_json(
        &node.url(),
        "/api/settings",
        &[("authorization", &owner_auth(&node))],
    )
    .await;
    assert_eq!(again["settings"], body["settings"]);
    assert_eq!(again["path"], dir.path.display().to_string());
    node.shutdown().await;
}

#[tokio::test]
async fn invalid_settings_get_a_400_naming_the_field_and_nothing_is_written() {
    let (node, dir) = start_node(PROXY_ONLY, None, "127.0.0.1:0").await;
    let url = format!("{}/api/settings", node.url());
    for (patch, field) in [
        (json!({"worker": {"max_concurrency": 0}}), "MAX_CONCURRENCY"),
        (json!({"proxy": {"listen": "nowhere"}}), "proxy.listen"),
        (json!({"proxy": {"bogus": 1}}), "proxy.bogus"),
    ] {
        let (code, body) = put_json(&url, &patch).await;
        assert_eq!(code, 400, "{patch}");
        assert_eq!(body["error"]["code"], "invalid_settings");
        assert!(
            body["error"]["message"].as_str().unwrap().contains(field),
            "{body}"
        );
    }
    let (code, _) = put_json(
        &format!("{}/api/config", node.url()),
        &json!({"toml": "[proxy\nmax_queue_len = 1"}),
    )
    .await;
    assert_eq!(code, 400);
    let malformed = http()
        .put(&url)
        .header("authorization", owner_auth(&node))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .expect("response");
    assert_eq!(malformed.status(), 400);
    assert_eq!(dir.text(), "", "nothing was written");
    node.shutdown().await;
}

#[tokio::test]
async fn the_whole_config_file_can_be_replaced_and_is_applied() {
    let (node, dir) = start_node(PROXY_ONLY, None, "127.0.0.1:0").await;
    let text = "# written by hand\n[roles]\nproxy = false\nworker = false\n";
    let (code, body) = put_json(
        &format!("{}/api/config", node.url()),
        &json!({"toml": text}),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(dir.text(), text);
    assert_eq!(
        body["settings"]["roles"],
        json!({"proxy": false, "worker": false})
    );
    assert!(!node.hub().is_serving());
    node.shutdown().await;
}

#[tokio::test]
async fn with_the_proxy_role_off_clients_get_503_in_their_dialect_and_the_dashboard_still_works() {
    let (node, dir) = start_node(PROXY_ONLY, None, "127.0.0.1:0").await;
    node.set_roles(Roles {
        proxy: false,
        worker: false,
    })
    .await
    .expect("roles saved");
    assert!(dir.text().contains("proxy = false"), "{}", dir.text());
    let base = node.url();
    let (code, _, body) = post(&base, "/v1/messages", &json!({"model": MODEL})).await;
    assert_eq!(code, 503);
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["type"], "error", "Anthropic shape: {body}");
    assert!(try_connect(node.addr(), "local", Some(SECRET), None)
        .await
        .is_err());
    let status = status_of(&base).await;
    assert_eq!(status["node"]["roles"]["proxy"], false);
    node.set_roles(PROXY_ONLY).await.expect("roles saved");
    assert!(try_connect(node.addr(), "local", Some(SECRET), None)
        .await
        .is_ok());
    node.shutdown().await;
}

#[tokio::test]
async fn turning_the_worker_role_on_joins_this_nodes_proxy_and_off_leaves_it() {
    let backend = MockBackend::start(&[MODEL]).await;
    let (node, _dir) = start_node(PROXY_ONLY, Some(&backend.url()), "127.0.0.1:0").await;
    let mut state = node.state();
    node.set_roles(Roles::default()).await.expect("worker on");
    wait_until("the own worker joins", || node.hub().counts().0 == 1).await;
    tokio::time::timeout(WAIT, state.wait_for(|s| s.worker == WorkerState::Connected))
        .await
        .expect("tray state follows")
        .expect("state");
    let status = status_of(&node.url()).await;
    assert_eq!(status["node"]["worker"]["state"], "connected");
    assert_eq!(status["workers"][0]["name"], "node-worker");
    let (code, _, _) = post(
        &node.url(),
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": []}),
    )
    .await;
    assert_eq!(code, 200);
    node.set_roles(PROXY_ONLY).await.expect("worker off");
    wait_until("the own worker leaves", || node.hub().counts().0 == 0).await;
    let status = status_of(&node.url()).await;
    assert_eq!(status["node"]["worker"]["state"], "off");
    node.shutdown().await;
}

#[tokio::test]
async fn model_aliases_saved_in_settings_apply_to_the_next_request_without_a_restart() {
    let backend = MockBackend::start(&[MODEL]).await;
    let (node, _dir) = start_node(Roles::default(), Some(&backend.url()), "127.0.0.1:0").await;
    wait_until("the own worker joins", || node.hub().counts().0 == 1).await;
    let ask = |model: &'static str| {
        let base = node.url();
        async move {
            post(
                &base,
                "/v1/chat/completions",
                &json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}),
            )
            .await
            .0
        }
    };
    // Nobody serves it yet: it waits in the queue for a worker to announce it.
    let waits = |model: &'static str| {
        let (base, hub) = (node.url(), node.hub().clone());
        async move {
            let client = spawn_post(
                &base,
                "/v1/chat/completions",
                json!({"model": model, "messages": []}),
            );
            wait_until("the request waits in the queue", || hub.counts().1 == 1).await;
            client.abort();
            wait_until("it left with its client", || hub.tracked_requests() == 0).await;
        }
    };
    // (Not a Claude name: those go to the model chosen for Claude Code; see claude_code.rs.)
    waits("coder-small-4-5").await;

    let url = format!("{}/api/settings", node.url());
    let (code, body) = put_json(&url, &json!({"proxy": {"aliases": {"coder-*": MODEL}}})).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["restart_required"], json!([]));
    assert_eq!(ask("coder-small-4-5").await, 200);
    let seen = backend.seen();
    assert_eq!(seen.last().expect("forwarded").body["model"], MODEL);

    // And removed again just as live: default_model too.
    let (code, _) = put_json(
        &url,
        &json!({"proxy": {"aliases": null, "default_model": MODEL}}),
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(ask("gpt-anything").await, 200, "default_model catches it");
    let (code, _) = put_json(&url, &json!({"proxy": {"default_model": null}})).await;
    assert_eq!(code, 200);
    waits("gpt-anything").await;
    node.shutdown().await;
}

#[tokio::test]
async fn a_queue_bound_saved_in_settings_applies_to_the_next_request_without_a_restart() {
    let (node, _dir) = start_node(PROXY_ONLY, None, "127.0.0.1:0").await;
    let (mut worker, _) = ScriptedWorker::join(node.addr(), "gpu-a", &[MODEL], 1).await;
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]});
    let running = spawn_post(&node.url(), "/v1/chat/completions", body.clone());
    let first = worker.next_request().await;
    let queued = spawn_post(&node.url(), "/v1/chat/completions", body.clone());
    wait_until("the second request queues", || {
        node.hub()
            .queue_depths()
            .iter()
            .any(|(_, depth)| *depth == 1)
    })
    .await;

    let url = format!("{}/api/settings", node.url());
    let (code, saved) = put_json(&url, &json!({"proxy": {"max_queue_len": 1}})).await;
    assert_eq!(code, 200, "{saved}");
    assert_eq!(saved["restart_required"], json!([]));
    let (code, _, text) = post(&node.url(), "/v1/chat/completions", &body).await;
    assert_eq!(code, 429, "the queue is full at the new bound: {text}");
    let error: Value = serde_json::from_str(&text).expect("json error");
    assert!(error["error"]["message"].is_string(), "{error}");

    // What was accepted before the change still gets its answer.
    worker.complete(&first.request_id, r#"{"ok":true}"#).await;
    assert_eq!(running.await.expect("first").0, 200);
    let second = worker.next_request().await;
    worker.complete(&second.request_id, r#"{"ok":true}"#).await;
    assert_eq!(queued.await.expect("second").0, 200);
    node.shutdown().await;
}

#[tokio::test]
async fn join_test_reports_success_a_wrong_secret_and_an_unreachable_proxy_clearly() {
    let (node, _dir) = start_node(PROXY_ONLY, None, "127.0.0.1:0").await;
    let url = format!("{}/api/join/test", node.url());
    let (code, ok) = post_json(&url, &json!({"proxy_url": node.url(), "secret": SECRET})).await;
    assert_eq!((code, &ok["ok"]), (200, &json!(true)), "{ok}");
    let (_, wrong) = post_json(&url, &json!({"proxy_url": node.url(), "secret": "nope"})).await;
    assert_eq!(wrong["ok"], false);
    assert!(
        wrong["message"]
            .as_str()
            .unwrap()
            .contains("refused the secret"),
        "{wrong}"
    );
    let dead = dead_addr().await;
    let (_, gone) = post_json(
        &url,
        &json!({"proxy_url": format!("http://{dead}"), "secret": SECRET}),
    )
    .await;
    assert_eq!(gone["ok"], false);
    assert!(
        gone["message"].as_str().unwrap().contains("cannot reach"),
        "{gone}"
    );
    let (code, bad) = post_json(&url, &json!({"code": "not-a-code"})).await;
    assert_eq!(code, 400);
    assert_eq!(bad["error"]["code"], "invalid_join_code");
    node.shutdown().await;
}

#[tokio::test]
async fn a_join_code_from_one_node_joins_another_nodes_worker_to_it() {
    let backend = MockBackend::start(&[MODEL]).await;
    let (hub_node, _a) = start_node(PROXY_ONLY, None, "127.0.0.1:0").await;
    let (box_node, box_dir) = start_node(
        Roles {
            proxy: false,
            worker: false,
        },
        Some(&backend.url()),
        "127.0.0.1:0",
    )
    .await;
    let (_, code) = get_json(
        &hub_node.url(),
        "/api/join-code",
        &[("authorization", &owner_auth(&hub_node))],
    )
    .await;
    assert!(code["code"].as_str().unwrap().starts_with("mrj1."));
    // Joining is a change: a request without the box's credential changes nothing.
    let unauthorised = http()
        .post(format!("{}/api/join", box_node.url()))
        .header("content-type", "application/json")
        .body(json!({"code": code["code"]}).to_string())
        .send()
        .await
        .expect("response");
    assert_eq!(unauthorised.status(), 401);
    assert!(!box_dir.text().contains("worker_secret"));
    let (status, body) = post_json(
        &format!("{}/api/join", box_node.url()),
        &json!({"code": code["code"]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["settings"]["worker"]["proxy_url"], hub_node.url());
    assert_eq!(body["settings"]["worker"]["worker_secret_set"], true);
    assert!(
        !body.to_string().contains(SECRET),
        "the secret is never echoed"
    );
    assert!(
        box_dir.text().contains("worker_secret"),
        "saved for the next start"
    );
    wait_until("the box's worker joins the hub", || {
        hub_node.hub().counts().0 == 1
    })
    .await;
    let (code, _, _) = post(
        &hub_node.url(),
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": []}),
    )
    .await;
    assert_eq!(
        code, 200,
        "a request through the hub reaches the box's backend"
    );
    let (code, body) = get_json(
        &box_node.url(),
        "/api/join-code",
        &[("authorization", &owner_auth(&box_node))],
    )
    .await;
    assert_eq!(code, 404, "a worker-only node has nothing to join: {body}");
    box_node.shutdown().await;
    hub_node.shutdown().await;
}

#[tokio::test]
async fn lifecycle_routes_answer_404_for_models_outside_the_map() {
    let (node, _dir) = start_node(PROXY_ONLY, None, "127.0.0.1:0").await;
    let (code, body) = get_json(&node.url(), "/api/lifecycle", &[]).await;
    assert_eq!(code, 200);
    assert_eq!(body, json!({"models": []}));
    let (code, body) = post_json(
        &format!("{}/api/lifecycle/nope/load", node.url()),
        &json!({}),
    )
    .await;
    assert_eq!(code, 404);
    assert_eq!(body["error"]["code"], "model_not_mapped");
    node.shutdown().await;
}

#[tokio::test]
async fn discovery_lists_local_model_servers_on_the_configured_ports() {
    let backend = MockBackend::start(&[MODEL]).await;
    let port = backend.url().rsplit(':').next().unwrap().to_string();
    let (node, _dir) = start_node(PROXY_ONLY, None, "127.0.0.1:0").await;
    // The environment variable is read per discovery, so other tests are unaffected.
    std::env::set_var("MODELRELAY_DISCOVERY_PORTS", &port);
    let (code, body) = get_json(
        &node.url(),
        "/api/discovery",
        &[("authorization", &owner_auth(&node))],
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let backends = body["backends"].as_array().unwrap();
    assert!(
        backends
            .iter()
            .any(|b| b["url"] == backend.url() && b["models"] == json!([MODEL])),
        "{body}"
    );
    assert!(body["proxies"].is_array());
    node.shutdown().await;
}

/// A node with the worker role only, joined to `proxy` as `desk-box`; its state feed once
/// the worker is connected.
async fn worker_node_joined_to(
    proxy: &relay_core::proxy::RunningProxy,
    backend: &MockBackend,
    dir: &TempConfig,
) -> (
    Node,
    tokio::sync::watch::Receiver<relay_core::node::NodeState>,
) {
    let node = Node::start(NodeOptions {
        config_path: Some(dir.path.clone()),
        overrides: Overrides {
            listen: Some("127.0.0.1:0".to_string()),
            worker_secret: Some(SECRET.to_string()),
            proxy_url: Some(proxy.url()),
            backend_url: Some(backend.url()),
            worker_name: Some("desk-box".to_string()),
            ..Overrides::default()
        },
        roles: Some(Roles {
            proxy: false,
            worker: true,
        }),
        data_dir: Some(dir.dir.clone()),
        ..NodeOptions::default()
    })
    .await
    .expect("node starts");
    owners().insert(
        node.url(),
        node.admin_token().expect("every node has a token"),
    );
    let mut state = node.state();
    tokio::time::timeout(WAIT, state.wait_for(|s| s.worker == WorkerState::Connected))
        .await
        .expect("joins in time")
        .expect("state feed");
    (node, state)
}

#[tokio::test]
async fn a_node_worker_comes_back_by_itself_when_its_proxy_restarts() {
    let proxy = start_proxy(test_config()).await;
    let addr = proxy.addr;
    let backend = MockBackend::start(&[MODEL]).await;
    let dir = TempConfig::new();
    let (node, mut state) = worker_node_joined_to(&proxy, &backend, &dir).await;

    // The proxy stops the ordinary way (SIGTERM, the tray's Quit): the worker finishes, shows a
    // short outage rather than a drain, and needs no click.
    proxy.shutdown().await;
    tokio::time::timeout(
        WAIT,
        state.wait_for(|s| s.worker == WorkerState::Disconnected),
    )
    .await
    .expect("disconnected in time")
    .expect("state feed");
    let status = status_of(&node.url()).await;
    assert_eq!(
        status["node"]["worker"]["state"], "disconnected",
        "{status}"
    );
    let why = status["node"]["worker"]["last_error"]
        .as_str()
        .unwrap_or_default();
    assert!(why.contains("the proxy stopped"), "{status}");
    assert!(why.contains("reconnecting"), "{status}");

    // A proxy is back at the same address a little later: the worker is back within seconds.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .expect("the address again");
    let proxy = relay_core::proxy::start(test_config(), listener)
        .await
        .expect("proxy starts");
    let listening = std::time::Instant::now();
    wait_until("the worker came back by itself", || {
        proxy.hub.counts().0 == 1
    })
    .await;
    assert!(
        listening.elapsed() < Duration::from_secs(5),
        "back {:?} after the proxy listened again",
        listening.elapsed()
    );
    let (code, _, _) = post(
        &proxy.url(),
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": []}),
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(node.state().borrow().worker, WorkerState::Connected);
    node.shutdown().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_node_worker_drained_by_an_admin_shows_drained_stays_away_and_rejoins_with_one_call() {
    let proxy = start_proxy(test_config()).await;
    let addr = proxy.addr;
    let backend = MockBackend::start(&[MODEL]).await;
    let dir = TempConfig::new();
    let (node, mut state) = worker_node_joined_to(&proxy, &backend, &dir).await;

    // An admin drains this worker on purpose: it finishes and stays away.
    let id = proxy.hub.workers()[0].id.clone();
    assert!(proxy.hub.drain_worker(&id));
    tokio::time::timeout(WAIT, state.wait_for(|s| s.worker == WorkerState::Drained))
        .await
        .expect("drained in time")
        .expect("state feed");
    let status = status_of(&node.url()).await;
    assert_eq!(status["node"]["worker"]["state"], "drained", "{status}");
    let why = status["node"]["worker"]["last_error"]
        .as_str()
        .unwrap_or_default();
    assert!(why.contains("drained by the proxy"), "{status}");

    // Even a restarted proxy (which forgot the drain) does not bring it back by itself...
    proxy.shutdown().await;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .expect("the address again");
    let proxy = relay_core::proxy::start(test_config(), listener)
        .await
        .expect("proxy starts");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(proxy.hub.counts().0, 0, "no reconnect by itself");
    assert_eq!(node.state().borrow().worker, WorkerState::Drained);

    // ... but one call (the dashboard's button) brings it back.
    let (code, body) = post_json(&format!("{}/api/worker/rejoin", node.url()), &json!({})).await;
    assert_eq!(code, 200, "{body}");
    wait_until("the worker rejoined", || proxy.hub.counts().0 == 1).await;
    let (code, _, _) = post(
        &proxy.url(),
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": []}),
    )
    .await;
    assert_eq!(code, 200);
    node.shutdown().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn rejoin_with_the_worker_role_off_is_409() {
    let (node, _dir) = start_node(PROXY_ONLY, None, "127.0.0.1:0").await;
    let (code, body) = post_json(&format!("{}/api/worker/rejoin", node.url()), &json!({})).await;
    assert_eq!(code, 409, "{body}");
    assert_eq!(body["error"]["code"], "worker_role_off");
    node.shutdown().await;
}

#[tokio::test]
async fn a_node_keeps_its_keys_and_usage_database_in_its_own_data_directory() {
    let (node, dir) = start_node(
        Roles {
            proxy: true,
            worker: false,
        },
        None,
        "127.0.0.1:0",
    )
    .await;
    assert!(
        dir.dir.join(relay_core::paths::DATABASE_FILE).exists(),
        "the SQLite file is in the node's data directory, not the user's"
    );
    node.shutdown().await;
}

/// A login entry kept in memory, as the desktop app's would be.
struct MemoryLoginEntry(std::sync::Mutex<bool>);

impl relay_core::node::start_on_login::LoginEntry for MemoryLoginEntry {
    fn enabled(&self) -> Result<bool, String> {
        Ok(*self.0.lock().unwrap())
    }
    fn set_enabled(&self, enabled: bool) -> Result<bool, String> {
        *self.0.lock().unwrap() = enabled;
        Ok(enabled)
    }
}

#[tokio::test]
async fn the_desktop_apps_start_on_login_is_served_by_its_node_to_the_signed_in_dashboard_only() {
    // Without an entry (the headless binary), the dashboard hides the switch.
    let (node, _dir) = start_node(PROXY_ONLY, None, "127.0.0.1:0").await;
    let url = format!("{}/api/start-on-login", node.url());
    let (code, body) = get_json(
        &node.url(),
        "/api/start-on-login",
        &[("authorization", &owner_auth(&node))],
    )
    .await;
    assert_eq!(
        (code.as_u16(), body["available"].as_bool()),
        (200, Some(false))
    );
    let (code, body) = put_json(&url, &json!({"enabled": true})).await;
    assert_eq!(code, 404, "{body}");
    node.shutdown().await;

    // The desktop app hands its entry to the node.
    let entry = Arc::new(MemoryLoginEntry(std::sync::Mutex::new(false)));
    let dir = TempConfig::new();
    let node = Node::start(NodeOptions {
        config_path: Some(dir.path.clone()),
        overrides: Overrides {
            listen: Some("127.0.0.1:0".to_string()),
            worker_secret: Some(SECRET.to_string()),
            ..Overrides::default()
        },
        roles: Some(PROXY_ONLY),
        data_dir: Some(dir.dir.clone()),
        start_on_login: Some(relay_core::node::start_on_login::StartOnLogin(
            entry.clone(),
        )),
    })
    .await
    .expect("node starts");
    owners().insert(node.url(), node.admin_token().unwrap());
    let url = format!("{}/api/start-on-login", node.url());
    // Another local process cannot switch it.
    let anonymous = http()
        .put(&url)
        .header("content-type", "application/json")
        .body(r#"{"enabled":true}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
    assert!(!*entry.0.lock().unwrap());
    let (code, body) = put_json(&url, &json!({"enabled": true})).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body, json!({"available": true, "enabled": true}));
    assert!(*entry.0.lock().unwrap());
    let (_, body) = get_json(
        &node.url(),
        "/api/start-on-login",
        &[("authorization", &owner_auth(&node))],
    )
    .await;
    assert_eq!(body["enabled"], true);
    node.shutdown().await;
}

#[tokio::test]
async fn the_tray_state_names_the_model_claude_code_uses_and_follows_models_and_aliases() {
    use relay_core::protocol::{ModelsUpdateMessage, WorkerToServer};
    let (node, _dir) = start_node(PROXY_ONLY, None, "127.0.0.1:0").await;
    let mut state = node.state();
    let follows = |state: &mut tokio::sync::watch::Receiver<relay_core::node::NodeState>,
                   model: &'static str| {
        let mut state = state.clone();
        async move {
            tokio::time::timeout(
                WAIT,
                state.wait_for(|s| s.claude_code_model.as_deref() == Some(model)),
            )
            .await
            .unwrap_or_else(|_| panic!("the tray state names {model}"))
            .expect("state");
        }
    };
    assert_eq!(state.borrow_and_update().claude_code_model, None);
    let addr = node.url().trim_start_matches("http://").parse().unwrap();
    let (mut worker, _) = ScriptedWorker::join(addr, "gpu-box", &["qwen2.5-7b"], 1).await;
    follows(&mut state, "qwen2.5-7b").await;
    // A larger model arriving by models_update (no worker joins or leaves) is seen too.
    worker
        .send(&WorkerToServer::ModelsUpdate(ModelsUpdateMessage {
            warm_ups: None,
            sides_first: None,
            models: vec!["qwen2.5-7b".to_string(), "qwen2.5-32b".to_string()],
            current_load: 0,
            going_to_sleep: None,
            context_windows: None,
            model_states: None,
        }))
        .await;
    follows(&mut state, "qwen2.5-32b").await;
    // The user's pick (an alias saved in settings) wins, at once.
    let url = format!("{}/api/settings", node.url());
    let (code, body) = put_json(
        &url,
        &json!({"proxy": {"aliases": {"claude-*": "qwen2.5-7b"}}}),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    follows(&mut state, "qwen2.5-7b").await;
    drop(worker);
    node.shutdown().await;
}
