//! Every box's hardware, live (issue 17): the worker samples its box (a fake `nvidia-smi` on the
//! sampler's PATH stands for the GPU driver) and its `pong`s carry the report as an optional
//! field, which the proxy bounds, keeps with a short history and shows in `/api/status` and
//! `/metrics`. Interop both ways: a published worker's plain pong leaves the box unknown, and
//! our pong reads as the published proxy's message (unknown fields skipped).

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;

use axum::extract::ws::{Message as WsMessage, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::response::Response;
use axum::{routing, Router};
use relay_core::hardware::SamplerSettings;
use relay_core::protocol::{ServerToWorker, MAX_REPORTED_GPUS, MAX_REPORT_NAME_BYTES};
use relay_core::worker::WorkerConfig;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::support::*;

const MODEL: &str = "llama3-8b";

/// A directory with an executable `nvidia-smi` printing `csv` (the recorded answer of a box
/// with two GPUs), removed on drop.
struct FakeTools(PathBuf);

impl FakeTools {
    fn nvidia(csv: &str) -> FakeTools {
        let dir = std::env::temp_dir().join(format!(
            "modelrelay-fake-smi-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("nvidia-smi");
        std::fs::write(&script, format!("#!/bin/sh\ncat <<'EOF'\n{csv}EOF\n")).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        FakeTools(dir)
    }

    /// Sampling every 200 ms, the fake tools first on the PATH (the system's directories after
    /// them, for the `cat` in the script).
    fn sampler(&self) -> SamplerSettings {
        SamplerSettings {
            interval: Duration::from_millis(200),
            search_path: Some(format!("{}:/usr/bin:/bin", self.0.display()).into()),
        }
    }
}

impl Drop for FakeTools {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const TWO_GPUS: &str = include_str!("../fixtures/hardware/nvidia-smi-2gpu.csv");

/// Polls `/api/status` until `condition` holds for its first worker; returns that worker.
async fn status_worker_when(base: &str, what: &str, condition: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (_, status) = get_json(base, "/api/status", &[]).await;
        let worker = &status["workers"][0];
        if condition(worker) {
            return worker.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}: {status}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_worker_with_a_gpu_tool_reports_cpu_memory_and_each_gpu_to_the_dashboard_and_metrics() {
    let proxy = start_proxy(test_config()).await;
    let backend = MockBackend::start(&[MODEL]).await;
    let tools = FakeTools::nvidia(TWO_GPUS);
    let mut config = WorkerConfig::new(&proxy.url(), SECRET, &backend.url());
    config.name = "gpu-box".into();
    config.hardware = Some(tools.sampler());
    let worker = RunningWorker::start_with(config);

    let seen = status_worker_when(&proxy.url(), "the worker's GPUs show", |w| {
        w["hardware"]["gpus"]
            .as_array()
            .is_some_and(|g| g.len() == 2)
            && w["hardware_history"]["unix_ms"]
                .as_array()
                .is_some_and(|p| !p.is_empty())
    })
    .await;
    let hardware = &seen["hardware"];
    assert_eq!(hardware["gpus"][0]["name"], "NVIDIA GeForce RTX 4090");
    assert_eq!(hardware["gpus"][0]["vram_used_mb"], 18211);
    assert_eq!(hardware["gpus"][0]["vram_total_mb"], 24564);
    assert_eq!(hardware["gpus"][0]["utilization_percent"], 97);
    assert_eq!(hardware["gpus"][0]["temperature_c"], 71);
    assert_eq!(hardware["gpus"][1]["name"], "NVIDIA RTX A6000");
    // This box's own CPU and memory, from the operating system.
    assert!(
        hardware["cpu_percent"].as_u64().is_some_and(|p| p <= 100),
        "{hardware}"
    );
    assert!(
        hardware["memory_total_mb"].as_u64().is_some_and(|m| m > 0),
        "{hardware}"
    );
    // (18211 + 3) of (24564 + 49140) MiB.
    assert_eq!(seen["hardware_history"]["vram_percent"][0], 24);
    assert_eq!(seen["model_states"], Value::Null, "no model map, no states");

    let metrics = metrics_text(&proxy.url()).await;
    let total = 24564u64 * 1024 * 1024;
    assert!(
        metrics.contains(&format!("modelrelay_worker_gpu_vram_total_bytes{{provider=\"local\",worker=\"gpu-box\",gpu=\"0\",gpu_name=\"NVIDIA GeForce RTX 4090\"}} {total}")),
        "{metrics}"
    );
    assert!(metrics.contains("modelrelay_worker_gpu_temperature_celsius{provider=\"local\",worker=\"gpu-box\",gpu=\"1\",gpu_name=\"NVIDIA RTX A6000\"} 34"));
    assert!(metrics
        .contains("modelrelay_worker_memory_total_bytes{provider=\"local\",worker=\"gpu-box\"}"));
    worker.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_box_without_gpu_tools_reports_cpu_and_memory_and_no_gpus() {
    let proxy = start_proxy(test_config()).await;
    let backend = MockBackend::start(&[MODEL]).await;
    let empty = std::env::temp_dir().join(format!("modelrelay-no-tools-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let mut config = WorkerConfig::new(&proxy.url(), SECRET, &backend.url());
    config.hardware = Some(SamplerSettings {
        interval: Duration::from_millis(200),
        search_path: Some(empty.clone().into_os_string()),
    });
    let worker = RunningWorker::start_with(config);
    let seen = status_worker_when(&proxy.url(), "the worker's box shows", |w| {
        w["hardware"]["memory_total_mb"].is_u64()
    })
    .await;
    assert_eq!(seen["hardware"].get("gpus"), None, "{seen}");
    assert_eq!(seen["hardware_history"]["vram_percent"][0], Value::Null);
    worker.stop().await;
    proxy.shutdown().await;
    let _ = std::fs::remove_dir(empty);
}

#[tokio::test]
async fn a_published_worker_s_plain_pong_leaves_its_box_unknown() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "published", &[MODEL], 1).await;
    // Pings answered with the seeds' pong for a while.
    let _ = worker.recv_within(Duration::from_millis(600)).await;
    let (_, status) = get_json(&proxy.url(), "/api/status", &[]).await;
    let seen = &status["workers"][0];
    assert_eq!(seen["name"], "published");
    assert_eq!(seen["hardware"], Value::Null);
    assert_eq!(seen["model_states"], Value::Null);
    assert_eq!(seen["hardware_history"]["unix_ms"], json!([]));
}

/// Answers the next ping with `pong` (a JSON object without `type`, which is added).
async fn answer_next_ping(worker: &mut ScriptedWorker, mut pong: Value) {
    loop {
        if let ServerToWorker::Ping(ping) = worker.recv_any().await {
            pong["type"] = json!("pong");
            pong["timestamp_unix_ms"] = json!(ping.timestamp_unix_ms);
            worker.send_text(&pong.to_string()).await;
            return;
        }
    }
}

#[tokio::test]
async fn a_malformed_report_is_dropped_without_losing_the_pong_and_a_huge_one_is_cut() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "hostile", &[MODEL], 4).await;
    let id = proxy.hub.workers()[0].id.clone();

    // Wrong shapes: the reports are dropped, the load in the same pong still counts.
    let malformed = [
        json!("lots"),
        json!({"gpus": 7}),
        json!({"gpus": [[1, 2]]}),
        json!({"cpu_percent": -1}),
        json!([1, 2]),
    ];
    // The last one carries load 3: once it counts, every one before it was read.
    for (i, hardware) in malformed.iter().enumerate() {
        let load = if i + 1 == malformed.len() { 3 } else { 2 };
        answer_next_ping(
            &mut worker,
            json!({"current_load": load, "hardware": hardware, "model_states": {"x": 1}}),
        )
        .await;
    }
    wait_until("the pong's load counts", || {
        proxy.hub.workers()[0].external_load == 3
    })
    .await;
    let record = proxy.hub.telemetry().worker(&id).unwrap();
    assert_eq!(record.reported.hardware, None);
    assert_eq!(record.reported.model_states, None);

    // Oversized: a thousand GPUs with 4 KB names, a thousand models (8 MB in all).
    let long = "é".repeat(2_000);
    let gpus: Vec<Value> = (0..1000)
        .map(|i| json!({"name": long, "vram_used_mb": i, "vram_total_mb": 1000, "utilization_percent": 4000}))
        .collect();
    let states: Vec<Value> = (0..1000)
        .map(|i| json!({"model": format!("{long}{i}"), "state": long}))
        .collect();
    answer_next_ping(
        &mut worker,
        json!({"current_load": 0, "hardware": {"cpu_percent": 900, "gpus": gpus, "future_field": [1]}, "model_states": states}),
    )
    .await;
    wait_until("the cut report arrives", || {
        proxy
            .hub
            .telemetry()
            .worker(&id)
            .unwrap()
            .reported
            .hardware
            .is_some()
    })
    .await;
    let record = proxy.hub.telemetry().worker(&id).unwrap();
    let hardware = record.reported.hardware.unwrap();
    assert_eq!(hardware.cpu_percent, Some(100));
    assert_eq!(hardware.gpus.len(), MAX_REPORTED_GPUS);
    assert!(hardware
        .gpus
        .iter()
        .all(|g| g.name.len() <= MAX_REPORT_NAME_BYTES && g.utilization_percent == Some(100)));
    let states = record.reported.model_states.unwrap();
    assert_eq!(states.len(), relay_core::protocol::MAX_REPORTED_MODELS);
    assert!(states
        .iter()
        .all(|s| s.model.len() <= MAX_REPORT_NAME_BYTES && s.state.len() <= MAX_REPORT_NAME_BYTES));
    // Still a live, healthy connection.
    answer_next_ping(&mut worker, json!({"current_load": 1})).await;
    wait_until("the next pong counts", || {
        proxy.hub.workers()[0].external_load == 1
    })
    .await;
}

/// The pong as the published proxy reads it: the seeds' fields, serde's defaults (unknown
/// fields skipped, as the seed's parser does).
#[derive(Debug, serde::Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum PublishedWorkerMessage {
    Pong {
        current_load: u32,
        #[serde(default)]
        timestamp_unix_ms: Option<u64>,
    },
    Register {
        worker_name: String,
    },
}

#[tokio::test]
async fn our_pong_with_the_box_reads_as_the_published_proxy_s_pong() {
    async fn connect(
        State(tx): State<mpsc::UnboundedSender<WebSocket>>,
        upgrade: WebSocketUpgrade,
    ) -> Response {
        upgrade.on_upgrade(move |socket| async move {
            let _ = tx.send(socket);
        })
    }
    let (tx, mut sockets) = mpsc::unbounded_channel();
    let app = Router::new()
        .route("/v1/worker/connect", routing::get(connect))
        .with_state(tx);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let backend = MockBackend::start(&[MODEL]).await;
    let tools = FakeTools::nvidia(TWO_GPUS);
    let mut config = WorkerConfig::new(&url, SECRET, &backend.url());
    config.hardware = Some(tools.sampler());
    let worker = RunningWorker::start_with(config);
    let mut socket = tokio::time::timeout(WAIT, sockets.recv())
        .await
        .unwrap()
        .unwrap();
    let frame = next_text(&mut socket).await;
    match serde_json::from_str(&frame).unwrap() {
        PublishedWorkerMessage::Register { worker_name } => assert!(!worker_name.is_empty()),
        other => panic!("expected register, got {other:?}"),
    }
    let ack = json!({"type": "register_ack", "worker_id": "w-1", "models": [MODEL]});
    socket
        .send(WsMessage::Text(ack.to_string().into()))
        .await
        .unwrap();
    // Ping until a pong carries the GPUs (the first sample may still be under way).
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let ping = json!({"type": "ping", "timestamp_unix_ms": 42});
        socket
            .send(WsMessage::Text(ping.to_string().into()))
            .await
            .unwrap();
        let text = next_text(&mut socket).await;
        let parsed: Value = serde_json::from_str(&text).unwrap();
        match serde_json::from_str::<PublishedWorkerMessage>(&text).unwrap() {
            PublishedWorkerMessage::Pong {
                current_load,
                timestamp_unix_ms,
            } => {
                assert_eq!((current_load, timestamp_unix_ms), (0, Some(42)));
            }
            other => panic!("expected a pong, got {other:?}"),
        }
        if parsed["hardware"]["gpus"]
            .as_array()
            .is_some_and(|g| g.len() == 2)
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no pong carried the GPUs: {text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    worker.kill();
}

async fn next_text(socket: &mut WebSocket) -> String {
    loop {
        match tokio::time::timeout(WAIT, socket.recv()).await {
            Ok(Some(Ok(WsMessage::Text(text)))) => return text.to_string(),
            Ok(Some(Ok(_))) => continue,
            other => panic!("no frame from the worker: {other:?}"),
        }
    }
}
