//! The model map as the dashboard sees and drives it: `GET /api/lifecycle` and the manual
//! load / unload actions of a node whose worker has a model map.

use std::time::Duration;

use relay_core::cli::{ProxyArgs, WorkerArgs};
use relay_core::node::{Node, NodeOptions, Roles};
use serde_json::Value;

use crate::support::*;

async fn call(method: reqwest::Method, url: String) -> (u16, Value) {
    let response = reqwest::Client::new()
        .request(method, url)
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .expect("response");
    let status = response.status().as_u16();
    let text = response.text().await.expect("body");
    (status, serde_json::from_str(&text).expect("json"))
}

#[tokio::test]
async fn the_dashboard_shows_mapped_models_and_loads_and_unloads_them_by_hand() {
    bounded(async {
        let dir = TempDir::new("dashboard");
        let log = dir.join("a.log");
        let text = format!(
            "[worker.lifecycle]\nmodel_port_base = 27000\n{}",
            fake_entry("a", &log, "", "")
        );
        let config_path = dir.join("config.toml");
        std::fs::write(&config_path, text).expect("config");
        let node = Node::start(NodeOptions {
            config_path: Some(config_path),
            proxy_args: ProxyArgs {
                listen: Some("127.0.0.1:0".to_string()),
                worker_secret: Some("dashboard-secret".to_string()),
                ..ProxyArgs::default()
            },
            worker_args: WorkerArgs {
                worker_name: Some("mapped".to_string()),
                ..WorkerArgs::default()
            },
            roles: Some(Roles::default()),
            data_dir: Some(dir.join("data")),
        })
        .await
        .expect("node starts");
        let base = node.url();
        let models = loop {
            let (code, body) = call(reqwest::Method::GET, format!("{base}/api/lifecycle")).await;
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
            reqwest::Method::POST,
            format!("{base}/api/lifecycle/a/reboot"),
        )
        .await;
        assert_eq!(code, 404);
        node.shutdown().await;
    })
    .await;
}
