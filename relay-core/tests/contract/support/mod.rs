//! Test harness: a real proxy on 127.0.0.1:0, a scripted WebSocket worker that speaks the wire
//! protocol by hand (as a worker written only from the seeds would), the real worker daemon, and
//! a mock backend whose behavior each request chooses through a `mock` field in its body.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use axum::Router;
use relay_core::proxy::ProxyConfig;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

mod backends;
mod raw_http;
mod scripted_worker;

pub use crate::inprocess::{http, start_proxy, wait_until_within};
pub use backends::*;
pub use raw_http::*;
pub use scripted_worker::*;

/// The secret every test proxy uses.
pub const SECRET: &str = "test-secret";
/// Bound on any single wait in a test.
pub const WAIT: Duration = Duration::from_secs(10);

/// A proxy configuration with short timers, suitable for tests.
pub fn test_config() -> ProxyConfig {
    let mut config = ProxyConfig::with_secret(SECRET);
    config.heartbeat_interval = Duration::from_millis(200);
    config.heartbeat_timeout = Duration::from_secs(5);
    config.register_timeout = Duration::from_secs(2);
    config.drain_timeout = Duration::from_secs(5);
    config
}

/// [`test_config`] with the default provider's queue timeout set to `queue_timeout`, for tests
/// that wait for a request nobody serves to give up.
pub fn config_with_queue_timeout(queue_timeout: Duration) -> ProxyConfig {
    let mut config = test_config();
    config.providers[0].limits.queue_timeout = queue_timeout;
    config
}

/// POSTs JSON `body` to `url` + `path`; returns status, headers and body text.
pub async fn post(base: &str, path: &str, body: &Value) -> (StatusCode, HeaderMap, String) {
    post_raw(base, path, body.to_string(), &[]).await
}

/// POSTs raw `body` with extra headers.
pub async fn post_raw(
    base: &str,
    path: &str,
    body: String,
    headers: &[(&str, &str)],
) -> (StatusCode, HeaderMap, String) {
    let mut request = http()
        .post(format!("{base}{path}"))
        .header("content-type", "application/json")
        .body(body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = tokio::time::timeout(WAIT, request.send())
        .await
        .expect("response in time")
        .expect("request sent");
    let status = response.status();
    let headers = response.headers().clone();
    let text = tokio::time::timeout(WAIT, response.text())
        .await
        .expect("body in time")
        .expect("body");
    (status, headers, text)
}

/// GETs `url` + `path` as JSON.
/// `GET /metrics` of `base` (open on loopback without a token), as text.
pub async fn metrics_text(base: &str) -> String {
    http()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("its body")
}

pub async fn get_json(base: &str, path: &str, headers: &[(&str, &str)]) -> (StatusCode, Value) {
    let mut request = http().get(format!("{base}{path}"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("request sent");
    let status = response.status();
    let body = response.text().await.expect("body");
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// Waits until `condition` holds; fails the test, naming `what`, after [`WAIT`].
pub async fn wait_until(what: &str, condition: impl FnMut() -> bool) {
    wait_until_within(WAIT, what, condition).await;
}

/// Serves a mock backend's `app` on `addr` (port 0 for any free port) until the task is aborted.
pub async fn serve_app(app: Router, addr: SocketAddr) -> (SocketAddr, JoinHandle<()>) {
    let listener = TcpListener::bind(addr).await.expect("bind backend");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.expect("backend serves");
    });
    (addr, task)
}

/// An address on 127.0.0.1 where nothing listens (a backend that is down).
pub async fn dead_addr() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    addr
}

/// Runs [`post`] in the background (for requests that wait on a worker).
pub fn spawn_post(
    base: &str,
    path: &str,
    body: Value,
) -> JoinHandle<(StatusCode, HeaderMap, String)> {
    let (base, path) = (base.to_string(), path.to_string());
    tokio::spawn(async move { post(&base, &path, &body).await })
}

/// Awaits a background [`spawn_post`] within [`WAIT`].
pub async fn answer_of(
    task: JoinHandle<(StatusCode, HeaderMap, String)>,
) -> (StatusCode, HeaderMap, String) {
    tokio::time::timeout(WAIT, task)
        .await
        .expect("answer in time")
        .expect("client task")
}
