//! The model map as the dashboard sees and drives it: `GET /api/lifecycle` and the manual
//! load / unload actions of a node whose worker has a model map.

use std::time::Duration;

use relay_core::node::{Node, NodeOptions, Roles};
use relay_core::settings::Overrides;
use serde_json::Value;

use crate::support::*;

/// `method url` from `node`'s owner (with its admin token: a request from this machine is not a
/// login).
fn call(
    node: &Node,
    method: reqwest::Method,
    url: String,
) -> impl std::future::Future<Output = (u16, Value)> + Send + 'static {
    let token = node.admin_token().expect("every node has a token");
    async move {
        let response = reqwest::Client::new()
            .request(method, url)
            .bearer_auth(token)
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .expect("response");
        let status = response.status().as_u16();
        let text = response.text().await.expect("body");
        (status, serde_json::from_str(&text).expect("json"))
    }
}

/// A node (proxy + worker) whose worker maps model "a" to a fake llama-server logging to `log`,
/// on ports from `port_base` (distinct per test: the tests run in parallel).
async fn start_mapped_node(dir: &TempDir, log: &std::path::Path, port_base: u16) -> Node {
    let text = format!(
        "[worker.lifecycle]\nmodel_port_base = {port_base}\n{}",
        fake_entry("a", log, "", "")
    );
    let config_path = dir.join("config.toml");
    std::fs::write(&config_path, text).expect("config");
    Node::start(NodeOptions {
        config_path: Some(config_path),
        overrides: Overrides {
            listen: Some("127.0.0.1:0".to_string()),
            worker_secret: Some("dashboard-secret".to_string()),
            worker_name: Some("mapped".to_string()),
            ..Overrides::default()
        },
        roles: Some(Roles::default()),
        data_dir: Some(dir.join("data")),
        ..NodeOptions::default()
    })
    .await
    .expect("node starts")
}

/// Reads the `/api/events` feed until a status event's own-worker model "a" is in `state`.
async fn feed_until_model_state(
    feed: &mut (impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    buffer: &mut String,
    state: &str,
) -> Value {
    loop {
        while let Some(end) = buffer.find("\n\n") {
            let event: String = buffer.drain(..end + 2).collect();
            let Some(data) = event.lines().find_map(|l| l.strip_prefix("data:")) else {
                continue;
            };
            let status: Value = serde_json::from_str(data.trim()).expect("status json");
            let model = &status["node"]["lifecycle"][0];
            if model["name"] == "a" && model["state"] == state {
                return model.clone();
            }
        }
        let chunk = futures_util::StreamExt::next(feed)
            .await
            .expect("the feed stays open")
            .expect("feed chunk");
        buffer.push_str(&String::from_utf8_lossy(&chunk));
    }
}

#[tokio::test]
async fn the_dashboard_shows_mapped_models_and_loads_and_unloads_them_by_hand() {
    bounded(async {
        let dir = TempDir::new("dashboard");
        let log = dir.join("a.log");
        let node = start_mapped_node(&dir, &log, 27000).await;
        let base = node.url();
        let models = loop {
            let (code, body) =
                call(&node, reqwest::Method::GET, format!("{base}/api/lifecycle")).await;
            assert_eq!(code, 200, "{body}");
            if !body["models"].as_array().unwrap().is_empty() {
                break body["models"].clone();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(models[0]["name"], "a");
        assert_eq!(models[0]["state"], "stopped");
        assert!(starts(&log).is_empty(), "listed, not started");

        let (code, loaded) = call(
            &node,
            reqwest::Method::POST,
            format!("{base}/api/lifecycle/a/load"),
        )
        .await;
        assert_eq!(code, 200, "{loaded}");
        assert_eq!(loaded["model"]["state"], "ready");
        let pid = loaded["model"]["pid"].as_u64().expect("a pid") as u32;
        assert!(alive(pid));
        assert_eq!(starts(&log), [pid]);

        let (code, unloaded) = call(
            &node,
            reqwest::Method::POST,
            format!("{base}/api/lifecycle/a/unload"),
        )
        .await;
        assert_eq!(code, 200, "{unloaded}");
        assert_eq!(unloaded["model"]["state"], "stopped");
        assert!(
            gone_within(pid, Duration::from_secs(5)).await,
            "its process is gone"
        );

        let (code, _) = call(
            &node,
            reqwest::Method::POST,
            format!("{base}/api/lifecycle/a/reboot"),
        )
        .await;
        assert_eq!(code, 404);
        node.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn the_status_feed_pushes_every_lifecycle_change_of_the_own_worker() {
    bounded(async {
        let dir = TempDir::new("dashboard-feed");
        let log = dir.join("a.log");
        let node = start_mapped_node(&dir, &log, 27150).await;
        let base = node.url();
        let response = reqwest::Client::new()
            .get(format!("{base}/api/events"))
            .send()
            .await
            .expect("feed");
        let mut feed = response.bytes_stream();
        let mut buffer = String::new();
        let listed = feed_until_model_state(&mut feed, &mut buffer, "stopped").await;
        assert_eq!(listed["pid"], Value::Null);

        // Loaded by hand: the feed shows it ready with its process, without anyone polling.
        let loading = tokio::spawn(call(
            &node,
            reqwest::Method::POST,
            format!("{base}/api/lifecycle/a/load"),
        ));
        let ready = feed_until_model_state(&mut feed, &mut buffer, "ready").await;
        let pid = ready["pid"].as_u64().expect("a pid") as u32;
        assert_eq!(starts(&log), [pid]);
        assert_eq!(loading.await.expect("load").0, 200);

        let unloading = tokio::spawn(call(
            &node,
            reqwest::Method::POST,
            format!("{base}/api/lifecycle/a/unload"),
        ));
        let stopped = feed_until_model_state(&mut feed, &mut buffer, "stopped").await;
        assert_eq!(stopped["pid"], Value::Null);
        assert_eq!(unloading.await.expect("unload").0, 200);
        drop(feed);
        node.shutdown().await;
    })
    .await;
}
