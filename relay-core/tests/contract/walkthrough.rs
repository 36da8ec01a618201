//! The protocol walkthrough's scenarios (seed 001), end to end: client → proxy → real worker →
//! mock backend, plus a scripted worker where the wire messages themselves are the point, and a
//! seeds-only fake proxy in front of the real worker.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::ws::{Message as WsMessage, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing;
use axum::Router;
use futures_util::StreamExt;
use relay_core::protocol::{ModelsUpdateMessage, PongMessage, ServerToWorker, WorkerToServer};
use relay_core::worker::WorkerConfig;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;

use crate::support::*;

const MODEL: &str = "llama3-8b";

fn parse(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("expected a JSON body ({e}): {body}"))
}

fn object_keys(value: &Value) -> BTreeSet<String> {
    value
        .as_object()
        .unwrap_or_else(|| panic!("expected a JSON object: {value}"))
        .keys()
        .cloned()
        .collect()
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// Posts `body` in the background and returns the pending answer.
fn spawn_post(
    base: String,
    body: Value,
) -> JoinHandle<(axum::http::StatusCode, HeaderMap, String)> {
    tokio::spawn(async move { post(&base, "/v1/chat/completions", &body).await })
}

/// The routable model names.
fn routable(proxy: &relay_core::proxy::RunningProxy) -> Vec<String> {
    proxy.hub.models().into_iter().map(|(m, _)| m).collect()
}

/// The next non-ping frame a scripted worker receives, as raw JSON (to check field names).
async fn next_raw(worker: &mut ScriptedWorker) -> Value {
    loop {
        let frame = tokio::time::timeout(WAIT, worker.socket.next())
            .await
            .expect("message in time")
            .expect("socket open")
            .expect("frame");
        if let Message::Text(text) = frame {
            let value: Value = serde_json::from_str(&text).expect("JSON frame");
            if value["type"] != "ping" {
                return value;
            }
        }
    }
}

/// Asserts an OpenAI-dialect error body with this code.
fn assert_openai_error(body: &str, code: &str) -> Value {
    let value = parse(body);
    assert_eq!(
        object_keys(&value["error"]),
        names(&["message", "type", "code"]),
        "{body}"
    );
    assert_eq!(value["error"]["code"], code, "{body}");
    value
}

// 1. Worker registration and heartbeat

#[tokio::test]
async fn registered_worker_models_appear_in_v1_models_and_pongs_keep_it_connected_past_many_pings()
{
    let mut config = test_config();
    config.heartbeat_interval = Duration::from_millis(100);
    config.heartbeat_timeout = Duration::from_millis(600);
    let proxy = start_proxy(config).await;
    let backend = MockBackend::start(&["llama3-8b", "codellama-13b"]).await;
    let worker = RunningWorker::start(&proxy, &backend.url(), None, 4);
    wait_until("the worker registers", || proxy.hub.counts().0 == 1).await;

    let (status, models) = get_json(&proxy.url(), "/v1/models", &[]).await;
    assert_eq!(status, 200);
    assert_eq!(models["object"], "list");
    let data = models["data"].as_array().expect("data array");
    let ids: Vec<&str> = data.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["codellama-13b", "llama3-8b"]);
    for model in data {
        assert_eq!(model["object"], "model");
        assert_eq!(model["owned_by"], "local");
    }
    let joined = proxy.hub.workers();
    assert_eq!(joined[0].name, "test-worker");
    assert_eq!(joined[0].max_concurrent, 4);

    // Fifteen ping intervals, over twice the heartbeat timeout: only pongs keep it alive.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let later = proxy.hub.workers();
    assert_eq!(later.len(), 1, "the worker is still connected");
    assert_eq!(
        later[0].id, joined[0].id,
        "same connection: never dropped and re-registered"
    );
    let (status, _, body) = post(
        &proxy.url(),
        "/v1/chat/completions",
        &json!({"model": MODEL}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    worker.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn worker_that_misses_heartbeats_is_closed_as_timed_out_and_its_request_is_requeued() {
    let mut config = test_config();
    config.heartbeat_interval = Duration::from_millis(100);
    config.heartbeat_timeout = Duration::from_millis(400);
    let proxy = start_proxy(config).await;
    let (mut silent, _) = ScriptedWorker::join(proxy.addr, "silent", &[MODEL], 1).await;
    let client = spawn_post(proxy.url(), json!({"model": MODEL, "messages": []}));
    silent.next_request_silently().await;

    let backend = MockBackend::start(&[MODEL]).await;
    let worker = RunningWorker::start(&proxy, &backend.url(), None, 4);
    assert_eq!(silent.closed().await, "worker heartbeat timed out");

    let (status, _, body) = client.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        parse(&body)["choices"][0]["message"]["content"],
        "hello from mock"
    );
    assert_eq!(backend.seen().len(), 1);
    wait_until("nothing is tracked", || proxy.hub.tracked_requests() == 0).await;
    worker.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn pong_current_load_is_the_load_the_proxy_routes_by() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "gpu-box-1", &[MODEL], 2).await;
    let ping = match worker.recv_any().await {
        ServerToWorker::Ping(ping) => ping,
        other => panic!("expected ping, got {other:?}"),
    };
    assert!(
        ping.timestamp_unix_ms.is_some(),
        "the proxy's ping carries timestamp_unix_ms"
    );
    worker
        .send(&WorkerToServer::Pong(PongMessage {
            current_load: 2,
            timestamp_unix_ms: ping.timestamp_unix_ms,
            hardware: None,
            model_states: None,
        }))
        .await;
    wait_until("the proxy records the reported load", || {
        proxy.hub.workers()[0].external_load == 2
    })
    .await;

    let client = spawn_post(proxy.url(), json!({"model": MODEL}));
    wait_until(
        "the request queues: the worker reported itself full",
        || proxy.hub.counts().1 == 1,
    )
    .await;
    // `next_request` answers the next ping with load 0, which frees both slots.
    let request = worker.next_request().await;
    worker.complete(&request.request_id, r#"{"ok":true}"#).await;
    let (status, _, body) = client.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(body, r#"{"ok":true}"#);
    proxy.shutdown().await;
}

// 2. Normal request (non-streaming)

#[tokio::test]
async fn normal_non_streaming_request_passes_status_headers_and_body_through() {
    let proxy = start_proxy(test_config()).await;
    let backend = MockBackend::start(&["llama3-8b"]).await;
    let worker = RunningWorker::start(&proxy, &backend.url(), None, 4);
    wait_until("the worker registers", || proxy.hub.counts().0 == 1).await;
    let sent = json!({"model": "llama3-8b", "stream": false, "messages": [{"role": "user", "content": "Hello!"}]});
    let (status, headers, body) = post_raw(
        &proxy.url(),
        "/v1/chat/completions",
        sent.to_string(),
        &[
            ("authorization", "Bearer sk-client"),
            ("user-agent", "contract-test/1.0"),
        ],
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-mock-backend"], "1");
    assert_eq!(headers["content-type"], "application/json");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["choices"][0]["message"]["content"], "hello from mock");
    assert_eq!(body["usage"]["total_tokens"], 8);

    let seen = backend.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/v1/chat/completions");
    assert_eq!(seen[0].body, sent, "the body reaches the backend untouched");
    assert!(
        seen[0].headers.get("authorization").is_none(),
        "clients' credentials stay with the relay by default (issue 12)"
    );
    assert_ne!(
        seen[0]
            .headers
            .get("user-agent")
            .and_then(|v| v.to_str().ok()),
        Some("contract-test/1.0"),
        "transport headers are not part of the worker envelope"
    );
    assert_eq!(proxy.hub.tracked_requests(), 0);
    worker.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn non_streaming_request_travels_as_the_seed_request_message_and_response_complete_comes_back(
) {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, ack) = ScriptedWorker::join(proxy.addr, "gpu-box-1", &[MODEL], 4).await;
    assert!(ack.worker_id.starts_with("w-"), "{}", ack.worker_id);
    assert_eq!(ack.models, [MODEL]);

    let sent = r#"{"model":"llama3-8b", "stream": false,  "messages":[{"role":"user","content":"Hello!"}]}"#;
    let base = proxy.url();
    let client = tokio::spawn(async move {
        post_raw(
            &base,
            "/v1/chat/completions",
            sent.to_string(),
            &[
                ("authorization", "Bearer sk-client"),
                ("openai-organization", "org-1"),
                ("user-agent", "contract-test/1.0"),
            ],
        )
        .await
    });
    let request = next_raw(&mut worker).await;
    // The seed's fields, and one optional extension a published worker ignores: the
    // conversation (the affinity key as 16 hex digits) for llama-server slot hints.
    assert_eq!(
        object_keys(&request),
        names(&[
            "type",
            "request_id",
            "model",
            "endpoint_path",
            "is_streaming",
            "body",
            "headers",
            "conversation"
        ])
    );
    let conversation = request["conversation"].as_str().unwrap();
    assert!(
        conversation.len() == 16 && conversation.bytes().all(|b| b.is_ascii_hexdigit()),
        "{conversation}"
    );
    assert_eq!(request["type"], "request");
    assert_eq!(request["model"], MODEL);
    assert_eq!(request["endpoint_path"], "/v1/chat/completions");
    assert_eq!(request["is_streaming"], false);
    assert_eq!(request["body"], sent, "the raw body, byte for byte");
    let headers = &request["headers"];
    // The seeds forward authorization; issue 12 keeps clients' credentials from workers unless
    // their provider opts in.
    assert!(headers.get("authorization").is_none(), "{headers}");
    assert_eq!(headers["openai-organization"], "org-1");
    assert_eq!(headers["content-type"], "application/json");
    assert!(headers.get("user-agent").is_none(), "{headers}");
    let request_id = request["request_id"].as_str().unwrap().to_string();

    let answer = r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"Hi!"}}]}"#;
    worker
        .send_text(
            &json!({
                "type": "response_complete",
                "request_id": request_id,
                "status_code": 200,
                "headers": {"content-type": "application/json", "x-backend": "llama-server"},
                "body": answer,
                "token_counts": {"prompt_tokens": 42, "completion_tokens": 128, "total_tokens": 170}
            })
            .to_string(),
        )
        .await;
    let (status, headers, body) = client.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(body, answer);
    assert_eq!(headers["x-backend"], "llama-server");
    wait_until("nothing is tracked", || proxy.hub.tracked_requests() == 0).await;
    proxy.shutdown().await;
}

// 3. Streaming request

#[tokio::test]
async fn streaming_request_forwards_every_chunk_in_order_and_terminates() {
    let proxy = start_proxy(test_config()).await;
    let backend = MockBackend::start(&["llama3-8b"]).await;
    let worker = RunningWorker::start(&proxy, &backend.url(), None, 4);
    wait_until("the worker registers", || proxy.hub.counts().0 == 1).await;
    let (status, headers, body) = post(
        &proxy.url(),
        "/v1/chat/completions",
        &json!({"model": "llama3-8b", "stream": true, "stream_options": {"include_usage": true},
                "mock": {"chunks": 20}}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "text/event-stream");
    assert_eq!(headers["x-accel-buffering"], "no");
    let data = sse_data(&body);
    assert_eq!(
        data.len(),
        22,
        "20 content chunks, the usage chunk the client asked for and [DONE]: {body}"
    );
    for (i, payload) in data.iter().take(20).enumerate() {
        assert!(
            payload.contains(&format!("tok{i} ")),
            "chunk {i} in order: {payload}"
        );
    }
    assert_eq!(data.last().unwrap(), "[DONE]");
    assert_eq!(backend.seen()[0].body["stream"], true);
    wait_until("nothing is tracked", || proxy.hub.tracked_requests() == 0).await;
    worker.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn streaming_chunks_reach_the_client_byte_for_byte_without_reframing() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "gpu-box-1", &[MODEL], 4).await;
    let client = spawn_post(proxy.url(), json!({"model": MODEL, "stream": true}));
    let request = worker.next_request().await;
    assert!(request.is_streaming);
    let chunks = [
        "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n",
        ": keep-alive comment\n\n",
        "event: custom\ndata: {\"choices\":[{\"delta\":{\"content\":\"lo\"}}]}\n\n",
        "data: [DONE]\n\n",
    ];
    for chunk in chunks {
        worker.chunk(&request.request_id, chunk).await;
    }
    worker
        .send_text(
            &json!({
                "type": "response_complete",
                "request_id": request.request_id,
                "status_code": 200,
                "token_counts": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}
            })
            .to_string(),
        )
        .await;
    let (status, headers, body) = client.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "text/event-stream");
    assert_eq!(body, chunks.concat());
    wait_until("nothing is tracked", || proxy.hub.tracked_requests() == 0).await;
    proxy.shutdown().await;
}

// 4. Client cancellation

#[tokio::test]
async fn client_disconnect_mid_stream_cancels_the_backend_request_and_frees_the_request() {
    let proxy = start_proxy(test_config()).await;
    let backend = MockBackend::start(&[MODEL]).await;
    let worker = RunningWorker::start(&proxy, &backend.url(), None, 1);
    wait_until("the worker registers", || proxy.hub.counts().0 == 1).await;

    let mut response = http()
        .post(format!("{}/v1/chat/completions", proxy.url()))
        .header("content-type", "application/json")
        .body(json!({"model": MODEL, "stream": true, "mock": {"hang": true}}).to_string())
        .send()
        .await
        .expect("response");
    assert_eq!(response.status(), 200);
    let first = tokio::time::timeout(WAIT, response.chunk())
        .await
        .expect("first chunk in time")
        .expect("chunk")
        .expect("a chunk before the hang");
    assert!(String::from_utf8_lossy(&first).contains("tok0"));
    assert_eq!(proxy.hub.tracked_requests(), 1);
    drop(response);

    wait_until("the backend sees its connection closed", || {
        backend.aborted_streams() == 1
    })
    .await;
    wait_until("the proxy tracks no request", || {
        proxy.hub.tracked_requests() == 0
    })
    .await;
    assert_eq!(proxy.hub.counts().0, 1, "the worker stays connected");
    // Its only slot is free again.
    let (status, _, body) = post(
        &proxy.url(),
        "/v1/chat/completions",
        &json!({"model": MODEL}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    worker.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn client_disconnect_sends_cancel_with_reason_client_disconnect_to_the_worker() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "gpu-box-1", &[MODEL], 1).await;
    let mut response = http()
        .post(format!("{}/v1/chat/completions", proxy.url()))
        .header("content-type", "application/json")
        .body(json!({"model": MODEL, "stream": true}).to_string())
        .send();
    // Drive the client until the worker has the request, then answer one chunk.
    let request = tokio::select! {
        request = worker.next_request() => request,
        _ = &mut response => panic!("the client got an answer before the worker did anything"),
    };
    worker
        .chunk(&request.request_id, "data: {\"choices\":[]}\n\n")
        .await;
    let mut response = response.await.expect("response");
    response.chunk().await.expect("chunk").expect("first chunk");
    drop(response);

    let cancel = next_raw(&mut worker).await;
    assert_eq!(
        cancel,
        json!({"type": "cancel", "request_id": request.request_id, "reason": "client_disconnect"})
    );
    // Late chunks after the cancel are dropped; the slot frees after the cancel grace even
    // though this worker never confirms.
    worker
        .chunk(&request.request_id, "data: {\"late\":true}\n\n")
        .await;
    wait_until("the proxy tracks no request", || {
        proxy.hub.tracked_requests() == 0
    })
    .await;
    let client = spawn_post(proxy.url(), json!({"model": MODEL}));
    let next = worker.next_request().await;
    assert_ne!(next.request_id, request.request_id);
    worker.complete(&next.request_id, "{}").await;
    assert_eq!(client.await.unwrap().0, 200);
    proxy.shutdown().await;
}

#[tokio::test]
async fn client_leaving_while_queued_removes_the_request_and_sends_no_cancel() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "gpu-box-1", &[MODEL], 1).await;
    let held_client = spawn_post(proxy.url(), json!({"model": MODEL}));
    let held = worker.next_request().await;
    let queued_client = spawn_post(proxy.url(), json!({"model": MODEL}));
    wait_until("the second request queues", || proxy.hub.counts().1 == 1).await;
    queued_client.abort();
    wait_until("the queue empties", || proxy.hub.counts().1 == 0).await;
    assert_eq!(proxy.hub.tracked_requests(), 1);
    worker
        .assert_nothing_for(
            Duration::from_millis(300),
            "no cancel for a request that never reached a worker",
        )
        .await;
    worker.complete(&held.request_id, "{}").await;
    assert_eq!(held_client.await.unwrap().0, 200);
    worker
        .assert_nothing_for(
            Duration::from_millis(300),
            "the abandoned request is never dispatched",
        )
        .await;
    assert_eq!(proxy.hub.tracked_requests(), 0);
    proxy.shutdown().await;
}

// 5. Worker disconnect mid-request → requeue

#[tokio::test]
async fn worker_crashing_before_answering_requeues_the_request_to_the_next_worker() {
    let proxy = start_proxy(test_config()).await;
    let (mut doomed, _) = ScriptedWorker::join(proxy.addr, "doomed", &[MODEL], 1).await;
    let client = spawn_post(proxy.url(), json!({"model": MODEL, "messages": []}));
    doomed.next_request().await;
    doomed.crash();

    let backend = MockBackend::start(&[MODEL]).await;
    let worker = RunningWorker::start(&proxy, &backend.url(), None, 4);
    let (status, _, body) = client.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        parse(&body)["choices"][0]["message"]["content"],
        "hello from mock"
    );
    assert_eq!(backend.seen().len(), 1);
    wait_until("nothing is tracked", || proxy.hub.tracked_requests() == 0).await;
    worker.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn real_worker_killed_mid_request_has_its_request_finished_by_another_real_worker() {
    let proxy = start_proxy(test_config()).await;
    let stuck = ControlledBackend::start(&[MODEL]).await;
    let first = RunningWorker::start(&proxy, &stuck.url(), None, 4);
    wait_until("the first worker registers", || proxy.hub.counts().0 == 1).await;
    // The stuck backend never answers; the mock backend ignores `hang` for non-streaming calls.
    let client = spawn_post(proxy.url(), json!({"model": MODEL, "mock": {"hang": true}}));
    wait_until("the request reaches the first backend", || {
        stuck.started() == 1
    })
    .await;

    let backend = MockBackend::start(&[MODEL]).await;
    let second = RunningWorker::start(&proxy, &backend.url(), None, 4);
    wait_until("the second worker registers", || proxy.hub.counts().0 == 2).await;
    first.kill();

    let (status, _, body) = client.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        parse(&body)["choices"][0]["message"]["content"],
        "hello from mock"
    );
    assert_eq!(backend.seen().len(), 1);
    wait_until("the killed worker is gone", || proxy.hub.counts().0 == 1).await;
    wait_until("nothing is tracked", || proxy.hub.tracked_requests() == 0).await;
    second.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn request_whose_workers_die_four_times_fails_503_requeue_exhausted() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "w0", &[MODEL], 1).await;
    let client = spawn_post(proxy.url(), json!({"model": MODEL}));
    let mut ids = Vec::new();
    for attempt in 1..=4 {
        let request = worker.next_request().await;
        ids.push(request.request_id);
        worker.crash();
        if attempt == 4 {
            break;
        }
        worker = ScriptedWorker::join(proxy.addr, &format!("w{attempt}"), &[MODEL], 1)
            .await
            .0;
    }
    assert!(
        ids.iter().all(|id| *id == ids[0]),
        "a requeued request keeps its id: {ids:?}"
    );
    let (status, _, body) = client.await.unwrap();
    assert_eq!(status, 503, "{body}");
    let error = assert_openai_error(&body, "requeue_exhausted");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("requeue attempts exhausted"),
        "{body}"
    );
    wait_until("nothing is tracked", || proxy.hub.tracked_requests() == 0).await;
    proxy.shutdown().await;
}

// 6. Queue full

#[tokio::test]
async fn request_beyond_max_queue_len_is_refused_429_queue_full_and_earlier_ones_complete() {
    let mut config = test_config();
    config.providers[0].limits.max_queue_len = 1;
    let proxy = start_proxy(config).await;
    let backend = MockBackend::start(&[MODEL]).await;
    let worker = RunningWorker::start(&proxy, &backend.url(), None, 1);
    wait_until("the worker registers", || proxy.hub.counts().0 == 1).await;

    let running = spawn_post(
        proxy.url(),
        json!({"model": MODEL, "mock": {"delay_ms": 800}}),
    );
    wait_until("the first request runs", || backend.seen().len() == 1).await;
    let queued = spawn_post(proxy.url(), json!({"model": MODEL}));
    wait_until("the second request queues", || proxy.hub.counts().1 == 1).await;

    let (status, headers, body) = post(
        &proxy.url(),
        "/v1/chat/completions",
        &json!({"model": MODEL}),
    )
    .await;
    assert_eq!(status, 429, "{body}");
    let error = assert_openai_error(&body, "queue_full");
    assert_eq!(error["error"]["type"], "rate_limit_error");
    assert!(error["error"]["message"]
        .as_str()
        .unwrap()
        .contains("queue full"));
    let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(retry >= 1);

    let (status, _, body) = post(&proxy.url(), "/v1/messages", &json!({"model": MODEL})).await;
    assert_eq!(status, 429, "{body}");
    let error = parse(&body);
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "rate_limit_error");

    assert_eq!(running.await.unwrap().0, 200);
    assert_eq!(queued.await.unwrap().0, 200);
    assert_eq!(
        backend.seen().len(),
        2,
        "refused requests never reach a backend"
    );
    wait_until("nothing is tracked", || proxy.hub.tracked_requests() == 0).await;
    worker.stop().await;
    proxy.shutdown().await;
}

// 7. No workers available

#[tokio::test]
async fn no_workers_a_request_queues_at_the_provider_and_is_dispatched_when_one_registers() {
    let proxy = start_proxy(test_config()).await;
    let client = spawn_post(proxy.url(), json!({"model": "llama3-8b"}));
    wait_until("the request is queued, not refused", || {
        proxy.hub.counts().1 == 1
    })
    .await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "gpu-box-1", &["llama3-8b"], 4).await;
    let request = worker.next_request().await;
    assert_eq!(request.model, "llama3-8b");
    worker.complete(&request.request_id, r#"{"ok":true}"#).await;
    let (status, _, body) = client.await.unwrap();
    assert_eq!(status, 200, "{body}");
    proxy.shutdown().await;
}

#[tokio::test]
async fn model_no_provider_can_take_is_404_no_provider_for_model() {
    // Every model name a worker could advertise has a provider (the default one); a name no
    // worker could ever advertise has none.
    let proxy = start_proxy(test_config()).await;
    let long = "l".repeat(300);
    let (status, _, body) = post(
        &proxy.url(),
        "/v1/chat/completions",
        &json!({"model": long}),
    )
    .await;
    assert_eq!(status, 404, "{body}");
    let error = assert_openai_error(&body, "model_not_found");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no provider for model"),
        "{body}"
    );
    let (status, _, body) = post(
        &proxy.url(),
        "/v1/messages",
        &json!({"model": "mistral\u{0}7b"}),
    )
    .await;
    assert_eq!(status, 404, "{body}");
    let error = parse(&body);
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "not_found_error");
    assert_eq!(proxy.hub.tracked_requests(), 0);
    proxy.shutdown().await;
}

#[tokio::test]
async fn configured_model_without_workers_queues_then_times_out_504() {
    let mut config = test_config();
    config.providers[0].limits.models = vec![MODEL.to_string()];
    config.providers[0].limits.queue_timeout = Duration::from_millis(400);
    let proxy = start_proxy(config).await;
    let started = Instant::now();
    let client = spawn_post(proxy.url(), json!({"model": MODEL}));
    wait_until("the request is queued, not refused", || {
        proxy.hub.counts().1 == 1
    })
    .await;
    let (status, _, body) = client.await.unwrap();
    assert_eq!(status, 504, "{body}");
    assert!(started.elapsed() >= Duration::from_millis(400));
    let error = assert_openai_error(&body, "queue_timeout");
    assert_eq!(error["error"]["type"], "timeout_error");
    assert!(error["error"]["message"]
        .as_str()
        .unwrap()
        .contains("queue timeout: no worker available within deadline"));
    assert_eq!(proxy.hub.counts().1, 0);
    assert_eq!(proxy.hub.tracked_requests(), 0);
    proxy.shutdown().await;
}

#[tokio::test]
async fn configured_model_request_waits_in_the_queue_until_a_worker_joins() {
    let mut config = test_config();
    config.providers[0].limits.models = vec![MODEL.to_string()];
    let proxy = start_proxy(config).await;
    let client = spawn_post(proxy.url(), json!({"model": MODEL}));
    wait_until("the request is queued", || proxy.hub.counts().1 == 1).await;
    let backend = MockBackend::start(&[MODEL]).await;
    let worker = RunningWorker::start(&proxy, &backend.url(), None, 4);
    let (status, _, body) = client.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(backend.seen().len(), 1);
    worker.stop().await;
    proxy.shutdown().await;
}

// 8. Graceful shutdown / drain

#[tokio::test]
async fn stopped_worker_finishes_its_request_then_disconnects_and_gets_no_new_work() {
    let proxy = start_proxy(test_config()).await;
    let draining_backend = MockBackend::start(&[MODEL]).await;
    let draining = RunningWorker::start(&proxy, &draining_backend.url(), None, 4);
    wait_until("the worker registers", || proxy.hub.counts().0 == 1).await;

    let slow = spawn_post(
        proxy.url(),
        json!({"model": MODEL, "mock": {"delay_ms": 1000}}),
    );
    wait_until("the slow request reaches the backend", || {
        draining_backend.seen().len() == 1
    })
    .await;
    let stopping = tokio::spawn(draining.stop());
    wait_until("the draining worker stops advertising models", || {
        routable(&proxy).is_empty()
    })
    .await;
    assert_eq!(
        proxy.hub.counts().0,
        1,
        "still connected while its request runs"
    );
    let during = spawn_post(proxy.url(), json!({"model": MODEL}));
    wait_until(
        "the request sent during the drain waits in the queue",
        || proxy.hub.counts().1 == 1,
    )
    .await;

    let (status, _, body) = slow.await.unwrap();
    assert_eq!(status, 200, "the in-flight request completes: {body}");
    assert_eq!(
        parse(&body)["choices"][0]["message"]["content"],
        "hello from mock"
    );
    stopping.await.unwrap();
    wait_until("the drained worker disconnects", || {
        proxy.hub.counts().0 == 0
    })
    .await;
    assert_eq!(proxy.hub.counts().1, 1, "the new request is still queued");

    let next_backend = MockBackend::start(&[MODEL]).await;
    let next = RunningWorker::start(&proxy, &next_backend.url(), None, 4);
    let (status, _, body) = during.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        draining_backend.seen().len(),
        1,
        "nothing new went to the draining worker"
    );
    assert_eq!(next_backend.seen().len(), 1);
    next.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn proxy_shutdown_lets_the_real_workers_request_finish_then_closes_it() {
    let proxy = start_proxy(test_config()).await;
    let hub = proxy.hub.clone();
    let url = proxy.url();
    let backend = MockBackend::start(&[MODEL]).await;
    let worker = RunningWorker::start(&proxy, &backend.url(), None, 4);
    wait_until("the worker registers", || hub.counts().0 == 1).await;

    let slow = spawn_post(
        url.clone(),
        json!({"model": MODEL, "mock": {"delay_ms": 800}}),
    );
    wait_until("the slow request reaches the backend", || {
        backend.seen().len() == 1
    })
    .await;
    let shutdown = tokio::spawn(proxy.shutdown());
    wait_until("the worker is draining", || {
        hub.workers().iter().all(|w| w.draining)
    })
    .await;
    // A request arriving during the drain is refused (503) or finds the listener closed.
    let late = http()
        .post(format!("{url}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(json!({"model": MODEL}).to_string())
        .send()
        .await;
    if let Ok(late) = late {
        assert_eq!(late.status(), 503);
        let body = late.text().await.unwrap();
        assert_openai_error(&body, "shutting_down");
    }

    let (status, _, body) = slow.await.unwrap();
    assert_eq!(status, 200, "{body}");
    tokio::time::timeout(WAIT, shutdown)
        .await
        .expect("shutdown finishes in time")
        .unwrap();
    wait_until("the worker was closed", || hub.counts().0 == 0).await;
    assert_eq!(hub.tracked_requests(), 0);
    assert_eq!(backend.seen().len(), 1);
    assert!(
        http().get(format!("{url}/health")).send().await.is_err(),
        "the proxy no longer serves"
    );
    worker.stop().await;
}

#[tokio::test]
async fn proxy_drain_sends_graceful_shutdown_and_closes_the_worker_after_its_last_response() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "gpu-box-1", &[MODEL], 4).await;
    let client = spawn_post(proxy.url(), json!({"model": MODEL}));
    let request = worker.next_request().await;
    let shutdown = tokio::spawn(proxy.shutdown());

    let message = next_raw(&mut worker).await;
    assert_eq!(message["type"], "graceful_shutdown");
    assert_eq!(message["drain_timeout_secs"], 5);
    assert!(message["reason"].is_string(), "{message}");

    worker
        .complete(&request.request_id, r#"{"done":true}"#)
        .await;
    assert_eq!(worker.closed().await, "worker drained");
    let (status, _, body) = client.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(body, r#"{"done":true}"#);
    tokio::time::timeout(WAIT, shutdown)
        .await
        .expect("shutdown finishes in time")
        .unwrap();
}

// 9. Dynamic model update

#[tokio::test]
async fn backend_model_changes_reach_routing_through_the_workers_periodic_refresh() {
    let proxy = start_proxy(test_config()).await;
    let backend = ControlledBackend::start(&[MODEL]).await;
    let worker = RunningWorker::start(&proxy, &backend.url(), None, 4);
    wait_until("the worker registers its backend's models", || {
        routable(&proxy) == [MODEL]
    })
    .await;
    let id = proxy.hub.workers()[0].id.clone();

    backend.set_models(&[MODEL, "codellama-13b"]);
    wait_until("the new model becomes routable", || {
        routable(&proxy) == ["codellama-13b", MODEL]
    })
    .await;
    let (status, _, body) = post(
        &proxy.url(),
        "/v1/chat/completions",
        &json!({"model": "codellama-13b"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(parse(&body)["model"], "codellama-13b");

    backend.set_models(&["codellama-13b"]);
    wait_until("the removed model is no longer listed", || {
        routable(&proxy) == ["codellama-13b"]
    })
    .await;
    let (_, models) = get_json(&proxy.url(), "/v1/models", &[]).await;
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["codellama-13b"]);
    assert_eq!(
        proxy.hub.workers()[0].id,
        id,
        "updated in place, not by reconnecting"
    );
    worker.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn models_refresh_from_the_proxy_makes_the_real_worker_resend_its_model_list() {
    let proxy = start_proxy(test_config()).await;
    let backend = ControlledBackend::start(&[MODEL]).await;
    let mut config = WorkerConfig::new(&proxy.url(), SECRET, &backend.url());
    config.model_refresh_interval = Duration::from_secs(600);
    let worker = RunningWorker::start_with(config);
    wait_until("the worker registers", || routable(&proxy) == [MODEL]).await;

    backend.set_models(&[MODEL, "codellama-13b"]);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        routable(&proxy),
        [MODEL],
        "without a refresh the worker does not re-read its backend"
    );
    proxy.hub.refresh_models("periodic");
    wait_until("the refreshed list reaches the proxy", || {
        routable(&proxy) == ["codellama-13b", MODEL]
    })
    .await;
    worker.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn models_refresh_and_models_update_follow_the_seed_wire_trace() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "gpu-box-1", &[MODEL], 4).await;
    proxy.hub.refresh_models("periodic");
    assert_eq!(
        next_raw(&mut worker).await,
        json!({"type": "models_refresh", "reason": "periodic"})
    );
    worker
        .send(&WorkerToServer::ModelsUpdate(ModelsUpdateMessage {
            warm_ups: None,
            sides_first: None,
            models: vec![MODEL.to_string(), "codellama-13b".to_string()],
            current_load: 1,
            going_to_sleep: None,
            context_windows: None,
            model_states: None,
        }))
        .await;
    wait_until("the proxy routes the updated list", || {
        routable(&proxy) == ["codellama-13b", MODEL]
    })
    .await;
    assert_eq!(proxy.hub.workers()[0].external_load, 1);

    let client = spawn_post(proxy.url(), json!({"model": "codellama-13b"}));
    let request = worker.next_request().await;
    assert_eq!(request.model, "codellama-13b");
    worker.complete(&request.request_id, "{}").await;
    assert_eq!(client.await.unwrap().0, 200);
    proxy.shutdown().await;
}

// 10. Queue timeout

#[tokio::test]
async fn queue_timeout_answers_504_and_no_cancel_reaches_the_busy_worker() {
    let mut config = test_config();
    config.providers[0].limits.queue_timeout = Duration::from_millis(400);
    let proxy = start_proxy(config).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "gpu-box-1", &[MODEL], 1).await;
    let first = spawn_post(proxy.url(), json!({"model": MODEL}));
    let held = worker.next_request().await;

    let started = Instant::now();
    let (status, _, body) = post(
        &proxy.url(),
        "/v1/chat/completions",
        &json!({"model": MODEL}),
    )
    .await;
    assert_eq!(status, 504, "{body}");
    assert!(started.elapsed() >= Duration::from_millis(400));
    let error = assert_openai_error(&body, "queue_timeout");
    assert!(error["error"]["message"]
        .as_str()
        .unwrap()
        .contains("queue timeout: no worker available within deadline"));
    worker
        .assert_nothing_for(
            Duration::from_millis(300),
            "no cancel: the request never reached a worker",
        )
        .await;

    worker.complete(&held.request_id, "{}").await;
    assert_eq!(first.await.unwrap().0, 200);
    worker
        .assert_nothing_for(
            Duration::from_millis(300),
            "the expired request is not dispatched when the slot frees",
        )
        .await;
    assert_eq!(proxy.hub.tracked_requests(), 0);
    proxy.shutdown().await;
}

// 11. Request timeout (in-flight)

#[tokio::test]
async fn request_timeout_in_flight_sends_cancel_timeout_to_the_worker_and_504_to_the_client() {
    let mut config = test_config();
    config.providers[0].limits.request_timeout = Duration::from_millis(600);
    let proxy = start_proxy(config).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "gpu-box-1", &[MODEL], 1).await;
    let started = Instant::now();
    let client = spawn_post(proxy.url(), json!({"model": MODEL}));
    let request = worker.next_request().await;

    let cancel = next_raw(&mut worker).await;
    assert_eq!(
        cancel,
        json!({"type": "cancel", "request_id": request.request_id, "reason": "timeout"})
    );
    let (status, _, body) = client.await.unwrap();
    assert_eq!(status, 504, "{body}");
    assert!(started.elapsed() >= Duration::from_millis(600));
    let error = assert_openai_error(&body, "request_timeout");
    assert_eq!(error["error"]["type"], "timeout_error");
    assert!(error["error"]["message"]
        .as_str()
        .unwrap()
        .contains("request timeout"));
    wait_until("nothing is tracked", || proxy.hub.tracked_requests() == 0).await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn request_timeout_makes_the_real_worker_abort_its_backend_request() {
    let mut config = test_config();
    config.providers[0].limits.request_timeout = Duration::from_millis(700);
    let proxy = start_proxy(config).await;
    let backend = ControlledBackend::start(&[MODEL]).await;
    let worker = RunningWorker::start(&proxy, &backend.url(), None, 1);
    wait_until("the worker registers", || proxy.hub.counts().0 == 1).await;

    let (status, _, body) = post(
        &proxy.url(),
        "/v1/chat/completions",
        &json!({"model": MODEL, "mock": {"hang": true}}),
    )
    .await;
    assert_eq!(status, 504, "{body}");
    assert_openai_error(&body, "request_timeout");
    wait_until("the backend sees its connection closed", || {
        backend.dropped() == 1
    })
    .await;
    wait_until("nothing is tracked", || proxy.hub.tracked_requests() == 0).await;
    // The worker's only slot is free and it is still connected.
    let (status, _, body) = post(
        &proxy.url(),
        "/v1/chat/completions",
        &json!({"model": MODEL}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(backend.answered(), [MODEL]);
    worker.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn request_timeout_mid_stream_ends_the_stream_with_an_error_event_and_aborts_the_backend() {
    let mut config = test_config();
    config.providers[0].limits.request_timeout = Duration::from_millis(700);
    let proxy = start_proxy(config).await;
    let backend = MockBackend::start(&[MODEL]).await;
    let worker = RunningWorker::start(&proxy, &backend.url(), None, 1);
    wait_until("the worker registers", || proxy.hub.counts().0 == 1).await;

    let (status, _, body) = post(
        &proxy.url(),
        "/v1/chat/completions",
        &json!({"model": MODEL, "stream": true, "mock": {"hang": true}}),
    )
    .await;
    assert_eq!(status, 200, "headers were already sent");
    let data = sse_data(&body);
    assert!(data[0].contains("tok0"), "{body}");
    let last = parse(data.last().unwrap());
    assert_eq!(last["error"]["code"], "request_timeout", "{body}");
    wait_until("the backend sees its connection closed", || {
        backend.aborted_streams() == 1
    })
    .await;
    wait_until("nothing is tracked", || proxy.hub.tracked_requests() == 0).await;
    worker.stop().await;
    proxy.shutdown().await;
}

// Backend failures

#[tokio::test]
async fn backend_that_is_down_yields_502_in_the_endpoint_dialect_and_the_worker_stays_connected() {
    let proxy = start_proxy(test_config()).await;
    let dead = dead_addr().await;
    let worker = RunningWorker::start(&proxy, &format!("http://{dead}"), Some(&[MODEL]), 4);
    wait_until("the worker registers", || proxy.hub.counts().0 == 1).await;
    let id = proxy.hub.workers()[0].id.clone();

    let (status, _, body) = post(
        &proxy.url(),
        "/v1/chat/completions",
        &json!({"model": MODEL}),
    )
    .await;
    assert_eq!(status, 502, "{body}");
    let error = assert_openai_error(&body, "backend_unavailable");
    assert_eq!(error["error"]["type"], "api_error");

    let (status, _, body) = post(
        &proxy.url(),
        "/v1/messages",
        &json!({"model": MODEL, "max_tokens": 16, "messages": []}),
    )
    .await;
    assert_eq!(status, 502, "{body}");
    let error = parse(&body);
    assert_eq!(error["type"], "error", "{body}");
    assert_eq!(
        object_keys(&error["error"]),
        names(&["type", "message"]),
        "{body}"
    );
    assert_eq!(error["error"]["type"], "api_error");

    assert_eq!(proxy.hub.workers()[0].id, id, "the worker stayed connected");
    assert_eq!(proxy.hub.tracked_requests(), 0);
    let backend = MockBackend::start_at(dead, &[MODEL]).await;
    let (status, _, body) = post(
        &proxy.url(),
        "/v1/chat/completions",
        &json!({"model": MODEL}),
    )
    .await;
    assert_eq!(
        status, 200,
        "the same worker serves once its backend is up: {body}"
    );
    assert_eq!(backend.seen().len(), 1);
    worker.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn backend_4xx_and_5xx_pass_through_with_status_headers_and_body() {
    let proxy = start_proxy(test_config()).await;
    let backend = MockBackend::start(&[MODEL]).await;
    let worker = RunningWorker::start(&proxy, &backend.url(), None, 4);
    wait_until("the worker registers", || proxy.hub.counts().0 == 1).await;
    let expected = json!({"error": {"message": "mock backend error", "type": "invalid_request_error", "code": "mock"}});
    let cases = [
        ("/v1/chat/completions", 400, false),
        ("/v1/chat/completions", 404, false),
        ("/v1/chat/completions", 429, false),
        ("/v1/chat/completions", 500, false),
        ("/v1/chat/completions", 503, true),
        ("/v1/messages", 529, true),
        ("/v1/embeddings", 422, false),
    ];
    for (path, code, stream) in cases {
        let (status, headers, body) = post(
            &proxy.url(),
            path,
            &json!({"model": MODEL, "stream": stream, "mock": {"status": code}}),
        )
        .await;
        assert_eq!(status.as_u16(), code, "{path} {body}");
        assert_eq!(headers["x-mock-backend"], "error", "{path} {code}");
        assert_eq!(headers["content-type"], "application/json");
        assert_eq!(parse(&body), expected, "{path} {code}: body preserved");
    }
    assert_eq!(proxy.hub.tracked_requests(), 0);
    worker.stop().await;
    proxy.shutdown().await;
}

// The real worker joins a proxy written only from the seeds.

struct SeedConnection {
    query: HashMap<String, String>,
    headers: HeaderMap,
    socket: WebSocket,
}

/// A minimal proxy that knows only the seeds' wire traces: it hands each worker connection to the
/// test, which drives it frame by frame.
struct SeedProxy {
    addr: SocketAddr,
    connections: mpsc::UnboundedReceiver<SeedConnection>,
    task: JoinHandle<()>,
}

impl SeedProxy {
    async fn start() -> SeedProxy {
        let (tx, connections) = mpsc::unbounded_channel();
        let app = Router::new()
            .route("/v1/worker/connect", routing::get(seed_connect))
            .with_state(tx);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("serve");
        });
        SeedProxy {
            addr,
            connections,
            task,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    async fn accept(&mut self) -> SeedConnection {
        tokio::time::timeout(WAIT, self.connections.recv())
            .await
            .expect("the worker connects in time")
            .expect("connection")
    }
}

impl Drop for SeedProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn seed_connect(
    State(tx): State<mpsc::UnboundedSender<SeedConnection>>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    upgrade: WebSocketUpgrade,
) -> Response {
    upgrade.on_upgrade(move |socket| async move {
        let _ = tx.send(SeedConnection {
            query,
            headers,
            socket,
        });
    })
}

impl SeedConnection {
    async fn send(&mut self, value: Value) {
        self.socket
            .send(WsMessage::Text(value.to_string().into()))
            .await
            .expect("send to worker");
    }

    /// The next JSON frame from the worker; `None` once it closes the connection.
    async fn recv(&mut self) -> Option<Value> {
        loop {
            let frame = tokio::time::timeout(WAIT, self.socket.recv())
                .await
                .expect("a frame from the worker in time");
            match frame {
                Some(Ok(WsMessage::Text(text))) => {
                    return Some(serde_json::from_str(&text).expect("worker frames are JSON"))
                }
                Some(Ok(WsMessage::Close(_))) | None | Some(Err(_)) => return None,
                Some(Ok(_)) => continue,
            }
        }
    }

    async fn expect(&mut self) -> Value {
        self.recv()
            .await
            .expect("the worker keeps the connection open")
    }

    /// Accepts the registration as the seed proxy does and returns the register message.
    async fn register(&mut self) -> Value {
        let register = self.expect().await;
        self.send(json!({
            "type": "register_ack",
            "worker_id": "w-a1b2c3",
            "models": [MODEL],
            "protocol_version": "1"
        }))
        .await;
        register
    }
}

fn seed_worker(proxy: &SeedProxy, backend: &str) -> RunningWorker {
    let mut config = WorkerConfig::new(&proxy.url(), "seed-secret", backend);
    config.name = "gpu-box-1".to_string();
    config.max_concurrent = 2;
    config.model_refresh_interval = Duration::from_secs(600);
    config.reconnect_min = Duration::from_millis(100);
    config.reconnect_max = Duration::from_millis(200);
    RunningWorker::start_with(config)
}

fn seed_request(id: &str, body: Value) -> Value {
    json!({
        "type": "request",
        "request_id": id,
        "model": MODEL,
        "endpoint_path": "/v1/chat/completions",
        "is_streaming": body["stream"] == true,
        "body": body.to_string(),
        "headers": {"content-type": "application/json", "authorization": "Bearer sk-client"}
    })
}

#[tokio::test]
async fn real_worker_registers_with_a_seeds_only_proxy_and_answers_requests_and_pings_per_the_seeds(
) {
    let mut proxy = SeedProxy::start().await;
    let backend = MockBackend::start(&[MODEL]).await;
    let worker = seed_worker(&proxy, &backend.url());
    let mut conn = proxy.accept().await;
    assert_eq!(
        conn.query.get("provider").map(String::as_str),
        Some("local")
    );
    let secret = conn
        .headers
        .get("x-worker-secret")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| conn.query.get("worker_secret").cloned());
    assert_eq!(secret.as_deref(), Some("seed-secret"));

    let register = conn.register().await;
    assert_eq!(
        object_keys(&register),
        names(&[
            "type",
            "worker_name",
            "models",
            "max_concurrent",
            "protocol_version",
            "current_load"
        ])
    );
    assert_eq!(
        register,
        json!({
            "type": "register",
            "worker_name": "gpu-box-1",
            "models": [MODEL],
            "max_concurrent": 2,
            "protocol_version": "2026-04-bridge-v1",
            "current_load": 0
        })
    );

    // Non-streaming: one response_complete with status, headers, body and token counts.
    conn.send(seed_request(
        "r-001",
        json!({"model": MODEL, "stream": false, "messages": [{"role": "user", "content": "Hello!"}]}),
    ))
    .await;
    let complete = conn.expect().await;
    assert_eq!(complete["type"], "response_complete", "{complete}");
    assert!(
        object_keys(&complete).is_subset(&names(&[
            "type",
            "request_id",
            "status_code",
            "headers",
            "body",
            "token_counts"
        ])),
        "{complete}"
    );
    assert_eq!(complete["request_id"], "r-001");
    assert_eq!(complete["status_code"], 200);
    assert_eq!(complete["headers"]["content-type"], "application/json");
    let body = parse(complete["body"].as_str().expect("body is a string"));
    assert_eq!(body["choices"][0]["message"]["content"], "hello from mock");
    assert_eq!(
        complete["token_counts"],
        json!({"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8})
    );
    // A seeds-only proxy sends the client's credentials; our worker keeps them from its
    // backend unless it opts in (`forward_client_auth`).
    assert!(
        backend.seen()[0].headers.get("authorization").is_none(),
        "{:?}",
        backend.seen()[0].headers
    );

    // Heartbeat: the pong echoes the timestamp and reports the load.
    conn.send(json!({"type": "ping", "timestamp_unix_ms": 1_767_225_600_000u64}))
        .await;
    // Beyond the seeds' fields only the documented optional extensions (the box's report,
    // issue 17), which a seeds-only proxy skips.
    let mut pong = conn.expect().await;
    let fields = pong.as_object_mut().expect("an object");
    fields.retain(|key, _| key != "hardware" && key != "model_states");
    assert_eq!(
        pong,
        json!({"type": "pong", "current_load": 0, "timestamp_unix_ms": 1_767_225_600_000u64})
    );

    // Streaming: response_chunks carrying the SSE text, then response_complete.
    conn.send(seed_request(
        "r-002",
        json!({"model": MODEL, "stream": true, "mock": {"chunks": 2}}),
    ))
    .await;
    let mut streamed = String::new();
    let complete = loop {
        let message = conn.expect().await;
        match message["type"].as_str() {
            Some("response_chunk") => {
                assert_eq!(
                    object_keys(&message),
                    names(&["type", "request_id", "chunk"])
                );
                assert_eq!(message["request_id"], "r-002");
                let chunk = message["chunk"].as_str().unwrap();
                assert!(chunk.ends_with("\n\n"), "whole SSE events: {chunk:?}");
                streamed.push_str(chunk);
            }
            Some("response_complete") => break message,
            _ => panic!("unexpected message during a stream: {message}"),
        }
    };
    let data = sse_data(&streamed);
    // The client did not ask for usage (no stream_options.include_usage): the worker asked the
    // backend for it, reports it in token_counts below, and keeps it out of the stream.
    assert_eq!(data.len(), 3, "two chunks, [DONE]: {streamed}");
    assert!(data[0].contains("tok0") && data[1].contains("tok1"));
    assert_eq!(data[2], "[DONE]");
    assert_eq!(complete["request_id"], "r-002");
    assert_eq!(complete["status_code"], 200);
    assert!(complete.get("body").is_none(), "{complete}");
    assert_eq!(
        complete["token_counts"],
        json!({"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7})
    );
    worker.stop().await;
}

#[tokio::test]
async fn real_worker_aborts_the_backend_when_a_seeds_only_proxy_sends_cancel() {
    let mut proxy = SeedProxy::start().await;
    let backend = MockBackend::start(&[MODEL]).await;
    let worker = seed_worker(&proxy, &backend.url());
    let mut conn = proxy.accept().await;
    conn.register().await;
    conn.send(seed_request(
        "r-002",
        json!({"model": MODEL, "stream": true, "mock": {"hang": true}}),
    ))
    .await;
    let first = conn.expect().await;
    assert_eq!(first["type"], "response_chunk", "{first}");
    conn.send(json!({"type": "cancel", "request_id": "r-002", "reason": "client_disconnect"}))
        .await;
    wait_until("the backend sees its connection closed", || {
        backend.aborted_streams() == 1
    })
    .await;
    // Whatever the worker says about r-002 now, it is not a successful completion.
    conn.send(json!({"type": "ping", "timestamp_unix_ms": 1u64}))
        .await;
    loop {
        let message = conn.expect().await;
        if message["type"] == "pong" {
            assert_eq!(message["current_load"], 0, "the cancelled request is gone");
            break;
        }
        assert_ne!(message["type"], "response_complete", "{message}");
        assert_ne!(message["type"], "response_chunk", "{message}");
    }
    worker.stop().await;
}

#[tokio::test]
async fn real_worker_answers_models_refresh_with_models_update() {
    let mut proxy = SeedProxy::start().await;
    let backend = MockBackend::start(&[MODEL]).await;
    let worker = seed_worker(&proxy, &backend.url());
    let mut conn = proxy.accept().await;
    conn.register().await;
    conn.send(json!({"type": "models_refresh", "reason": "periodic"}))
        .await;
    let update = tokio::time::timeout(Duration::from_secs(3), conn.recv())
        .await
        .expect("models_update in answer to models_refresh within 3 s (nothing was sent)")
        .expect("the worker keeps the connection open");
    assert_eq!(
        update,
        json!({"type": "models_update", "models": [MODEL], "current_load": 0}),
        "the seeds show models_update as the response to models_refresh"
    );
    worker.stop().await;
}

/// A seeds-only proxy with our worker registered and running one slow request (`r-001`).
async fn worker_running_a_request() -> (SeedProxy, MockBackend, RunningWorker, SeedConnection) {
    let mut proxy = SeedProxy::start().await;
    let backend = MockBackend::start(&[MODEL]).await;
    let worker = seed_worker(&proxy, &backend.url());
    let mut conn = proxy.accept().await;
    conn.register().await;
    conn.send(seed_request(
        "r-001",
        json!({"model": MODEL, "mock": {"delay_ms": 400}}),
    ))
    .await;
    wait_until("the request reaches the backend", || {
        backend.seen().len() == 1
    })
    .await;
    (proxy, backend, worker, conn)
}

#[tokio::test]
async fn real_worker_drains_on_graceful_shutdown_from_a_seeds_only_proxy() {
    let (_proxy, _backend, worker, mut conn) = worker_running_a_request().await;
    conn.send(
        json!({"type": "graceful_shutdown", "reason": "maintenance", "drain_timeout_secs": 30}),
    )
    .await;
    let complete = conn.expect().await;
    assert_eq!(complete["type"], "response_complete", "{complete}");
    assert_eq!(complete["request_id"], "r-001");
    assert_eq!(complete["status_code"], 200);
    assert_eq!(
        conn.recv().await,
        None,
        "a drained worker closes the connection"
    );
    worker.stop().await;
}

#[tokio::test]
async fn real_worker_reconnects_after_a_graceful_shutdown_that_says_the_proxy_stops() {
    // Our extension (`reconnect`, which published workers ignore): the proxy itself stops, so
    // the worker finishes what it holds, closes, and comes back when a proxy listens again.
    let (mut proxy, _backend, worker, mut conn) = worker_running_a_request().await;
    conn.send(json!({
        "type": "graceful_shutdown",
        "reason": "proxy shutting down",
        "drain_timeout_secs": 30,
        "reconnect": true
    }))
    .await;
    let complete = conn.expect().await;
    assert_eq!(complete["type"], "response_complete", "{complete}");
    assert_eq!(complete["request_id"], "r-001");
    assert_eq!(
        conn.recv().await,
        None,
        "the worker closes once its work is done"
    );
    let mut again = proxy.accept().await;
    again.register().await;
    worker.stop().await;
}

#[tokio::test]
async fn a_worker_that_hears_nothing_from_its_proxy_reconnects_and_a_quiet_proxy_that_answers_pings_keeps_it(
) {
    let mut proxy = SeedProxy::start().await;
    let backend = MockBackend::start(&[MODEL]).await;
    let mut config = WorkerConfig::new(&proxy.url(), "seed-secret", &backend.url());
    config.proxy_silence_timeout = Duration::from_secs(1);
    config.reconnect_min = Duration::from_millis(100);
    config.reconnect_max = Duration::from_millis(200);
    let worker = RunningWorker::start_with(config);

    // A proxy that stays silent and reads nothing (so answers no ping), as a partition looks
    // from the worker's side: the worker gives up on it and connects again.
    let mut silent = proxy.accept().await;
    silent.register().await;
    let started = std::time::Instant::now();
    let mut quiet = proxy.accept().await;
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "reconnected after {took:?}"
    );
    drop(silent);

    // A proxy that sends nothing either, but reads (so answers the worker's pings): healthy.
    quiet.register().await;
    let reader = tokio::spawn(async move { while quiet.socket.recv().await.is_some() {} });
    let third = tokio::time::timeout(Duration::from_secs(4), proxy.accept()).await;
    assert!(
        third.is_err(),
        "the worker stays on a quiet proxy that answers pings"
    );
    reader.abort();
    worker.stop().await;
}
