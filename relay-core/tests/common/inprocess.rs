//! Helpers shared by the test binaries that run the relay in-process (`contract`,
//! `model_lifecycle`, `realstack`): a proxy on 127.0.0.1:0, an HTTP client, and polling with a
//! bound. One copy, included by each binary with `#[path]`.

#![allow(dead_code)]

use std::time::Duration;

use relay_core::proxy::{self, ProxyConfig, RunningProxy};
use tokio::net::TcpListener;
use tokio::time::Instant;

/// Starts a proxy with `config` on 127.0.0.1:0.
pub async fn start_proxy(config: ProxyConfig) -> RunningProxy {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
    proxy::start(config, listener).await.expect("start proxy")
}

/// An HTTP client as a client of the relay would use one: no system proxy (tests talk to
/// loopback), and a bound on every request so a test that goes wrong fails instead of hanging.
pub fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client")
}

/// Polls `check` every 10 ms until it holds; false after `bound`.
pub async fn eventually(bound: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + bound;
    while !check() {
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}

/// Waits until `condition` holds; fails the test, naming `what`, after `bound`.
pub async fn wait_until_within(bound: Duration, what: &str, condition: impl FnMut() -> bool) {
    assert!(
        eventually(bound, condition).await,
        "timed out waiting until {what}"
    );
}
