//! Light in-process workers for `workers1k`: each registers, answers pings with pongs, and
//! answers every request at once with a small completion — the cheapest peer the protocol allows,
//! so the figures show what the proxy itself costs per connected worker.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use relay_core::protocol::{
    PongMessage, RegisterMessage, ResponseCompleteMessage, ServerToWorker, WorkerToServer,
};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

use crate::procs::SECRET;

const ANSWER: &str = "{\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"hello\"},\"finish_reason\":\"stop\"}]}";

/// Connects `count` fake workers to the proxy on `port`; they run until their handles are aborted.
pub async fn connect(port: u16, count: usize) -> Vec<JoinHandle<()>> {
    let mut workers = Vec::with_capacity(count);
    for i in 0..count {
        workers.push(tokio::spawn(run(port, format!("fake-{i}"))));
        // Stay under the accept backlog.
        if i % 200 == 199 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    workers
}

async fn run(port: u16, name: String) {
    let mut request = format!("ws://127.0.0.1:{port}/v1/worker/connect?provider=local")
        .into_client_request()
        .expect("request");
    request
        .headers_mut()
        .insert("x-worker-secret", SECRET.parse().expect("header"));
    let Ok((mut socket, _)) = tokio_tungstenite::connect_async(request).await else {
        eprintln!("fake worker {name} could not connect");
        return;
    };
    let register = WorkerToServer::Register(RegisterMessage {
        warm_ups: None,
        sides_first: None,
        worker_name: name,
        models: vec!["bench".to_string()],
        max_concurrent: 4,
        protocol_version: Some("1".to_string()),
        current_load: Some(0),
        mac_address: None,
        sleeps_when_idle: None,
        context_windows: None,
    });
    if socket
        .send(Message::Text(register.to_json().into()))
        .await
        .is_err()
    {
        return;
    }
    while let Some(Ok(frame)) = socket.next().await {
        let Message::Text(text) = frame else { continue };
        let reply = match serde_json::from_str::<ServerToWorker>(&text) {
            Ok(ServerToWorker::Ping(ping)) => WorkerToServer::Pong(PongMessage {
                current_load: 0,
                timestamp_unix_ms: ping.timestamp_unix_ms,
                hardware: None,
                model_states: None,
            }),
            Ok(ServerToWorker::Request(request)) => {
                WorkerToServer::ResponseComplete(ResponseCompleteMessage {
                    request_id: request.request_id,
                    status_code: 200,
                    headers: [("content-type".to_string(), "application/json".to_string())].into(),
                    body: Some(ANSWER.to_string()),
                    token_counts: None,
                    timings: None,
                })
            }
            _ => continue,
        };
        if socket
            .send(Message::Text(reply.to_json().into()))
            .await
            .is_err()
        {
            return;
        }
    }
}
