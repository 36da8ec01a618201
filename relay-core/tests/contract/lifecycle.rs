//! Worker and proxy lifecycle (contract: "Heartbeat, load reporting, and stale-worker cleanup",
//! "Graceful shutdown and drain semantics", model refresh, and the `/health` and `/v1/models`
//! compatibility endpoints).

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use relay_core::protocol::{ModelsUpdateMessage, PongMessage, ServerToWorker, WorkerToServer};
use relay_core::proxy::dispatch::scheduler::ProviderLimits;
use serde_json::{json, Value};
use tokio::net::TcpListener;

use crate::support::*;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[tokio::test]
async fn proxy_sends_json_ping_heartbeats_with_a_timestamp() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "w", &["m"], 1).await;
    for _ in 0..2 {
        match worker.recv_any().await {
            ServerToWorker::Ping(ping) => {
                let sent = ping.timestamp_unix_ms.expect("ping carries its timestamp");
                assert!(
                    sent.abs_diff(now_ms()) < 60_000,
                    "timestamp is the sender's clock in ms: {sent}"
                );
                worker
                    .send(&WorkerToServer::Pong(PongMessage {
                        current_load: 0,
                        timestamp_unix_ms: Some(sent),
                        hardware: None,
                        model_states: None,
                    }))
                    .await;
            }
            other => panic!("expected ping, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn worker_answering_pings_stays_connected_past_the_heartbeat_timeout() {
    let mut config = test_config();
    config.heartbeat_timeout = Duration::from_millis(600);
    let proxy = start_proxy(config).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "w", &["m"], 1).await;
    let until = tokio::time::Instant::now() + Duration::from_millis(1500);
    let mut pings = 0;
    while tokio::time::Instant::now() < until {
        if let Ok(message) = tokio::time::timeout_at(until, worker.recv_any()).await {
            let ServerToWorker::Ping(ping) = message else {
                panic!("expected only pings, got {message:?}");
            };
            pings += 1;
            worker
                .send(&WorkerToServer::Pong(PongMessage {
                    current_load: 0,
                    timestamp_unix_ms: ping.timestamp_unix_ms,
                    hardware: None,
                    model_states: None,
                }))
                .await;
        }
    }
    assert!(pings >= 3, "pinged regularly: {pings}");
    assert_eq!(proxy.hub.counts().0, 1, "a live worker is kept");
    let task = spawn_post(&proxy.url(), "/v1/chat/completions", json!({"model": "m"}));
    let request = worker.next_request().await;
    worker.complete(&request.request_id, "{}").await;
    assert_eq!(answer_of(task).await.0, 200);
}

#[tokio::test]
async fn silent_worker_is_closed_for_heartbeat_timeout_and_its_request_is_requeued() {
    let mut config = test_config();
    config.heartbeat_timeout = Duration::from_millis(600);
    let proxy = start_proxy(config).await;
    let (mut silent, _) = ScriptedWorker::join(proxy.addr, "silent", &["m"], 1).await;
    let task = spawn_post(
        &proxy.url(),
        "/v1/chat/completions",
        json!({"model": "m", "n": 1}),
    );
    let request = silent.next_request().await;
    let (mut healthy, _) = ScriptedWorker::join(proxy.addr, "healthy", &["m"], 1).await;

    // `silent` stops reading and answering; `healthy` keeps answering pings while it waits.
    let again = healthy.next_request().await;
    assert_eq!(
        again.request_id, request.request_id,
        "the in-flight request is requeued"
    );
    healthy
        .complete(&again.request_id, r#"{"by":"healthy"}"#)
        .await;
    let (status, _, body) = answer_of(task).await;
    assert_eq!(status, 200);
    assert_eq!(body, r#"{"by":"healthy"}"#);

    let reason = silent.closed().await;
    assert_eq!(reason, "worker heartbeat timed out");
    wait_until("only the healthy worker remains", || {
        proxy.hub.counts().0 == 1
    })
    .await;
}

#[tokio::test]
async fn models_refresh_reaches_the_worker_and_its_models_update_is_applied() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "w", &["m"], 1).await;
    proxy.hub.refresh_models("test");
    match worker.recv().await {
        ServerToWorker::ModelsRefresh(refresh) => {
            assert_eq!(refresh.reason.as_deref(), Some("test"))
        }
        other => panic!("expected models_refresh, got {other:?}"),
    }
    worker
        .send(&WorkerToServer::ModelsUpdate(ModelsUpdateMessage {
            warm_ups: None,
            sides_first: None,
            models: vec!["m".to_string(), "m2".to_string()],
            current_load: 0,
            going_to_sleep: None,
            context_windows: None,
            model_states: None,
        }))
        .await;
    wait_until("the refreshed list is routed", || {
        proxy.hub.models().len() == 2
    })
    .await;
    let task = spawn_post(&proxy.url(), "/v1/chat/completions", json!({"model": "m2"}));
    let request = worker.next_request().await;
    assert_eq!(request.model, "m2");
    worker.complete(&request.request_id, "{}").await;
    assert_eq!(answer_of(task).await.0, 200);
}

#[tokio::test]
async fn graceful_shutdown_drains_in_flight_work_fails_queued_work_and_returns() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "w", &["m"], 1).await;
    let in_flight = spawn_post(
        &proxy.url(),
        "/v1/chat/completions",
        json!({"model": "m", "n": 1}),
    );
    let running = worker.next_request().await;
    let queued = spawn_post(
        &proxy.url(),
        "/v1/chat/completions",
        json!({"model": "m", "n": 2}),
    );
    wait_until("the second request is queued", || proxy.hub.counts().1 == 1).await;

    let url = proxy.url();
    let shutdown = tokio::spawn(proxy.shutdown());
    match worker.recv().await {
        ServerToWorker::GracefulShutdown(message) => assert!(
            message.drain_timeout_secs.is_some() || message.reason.is_some(),
            "graceful_shutdown says why or how long: {message:?}"
        ),
        other => panic!("expected graceful_shutdown, got {other:?}"),
    }

    let (status, _, body) = answer_of(queued).await;
    assert_eq!(
        status, 503,
        "queued work fails as service unavailable: {body}"
    );

    // New work is refused: 503, or no connection at all once the listener is closed.
    let fresh = tokio::time::timeout(
        Duration::from_secs(3),
        http()
            .post(format!("{url}/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(json!({"model": "m"}).to_string())
            .send(),
    )
    .await
    .expect("a new request is refused promptly, not queued");
    if let Ok(response) = fresh {
        assert_eq!(response.status(), 503, "new work during drain");
    }

    // The request already running finishes normally.
    worker
        .complete(&running.request_id, r#"{"finished":true}"#)
        .await;
    let (status, _, body) = answer_of(in_flight).await;
    assert_eq!(status, 200);
    assert_eq!(body, r#"{"finished":true}"#);

    let _reason = worker.closed().await;
    tokio::time::timeout(WAIT, shutdown)
        .await
        .expect("shutdown returns once drained")
        .expect("shutdown task");
}

#[tokio::test]
async fn draining_proxy_refuses_new_requests_and_new_workers_with_503() {
    // Serve the router directly so the listener stays open while the hub drains.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let relay_core::proxy::Built { app, hub, .. } =
        relay_core::proxy::router(test_config(), addr, |_| axum::Router::new())
            .await
            .expect("router");
    let server = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    });
    let base = format!("http://{addr}");
    let (mut worker, _) = ScriptedWorker::join(addr, "w", &["m"], 1).await;

    hub.begin_shutdown("maintenance");
    match worker.recv().await {
        ServerToWorker::GracefulShutdown(message) => {
            assert_eq!(message.reason.as_deref(), Some("maintenance"))
        }
        other => panic!("expected graceful_shutdown, got {other:?}"),
    }

    let (status, _, body) = post(&base, "/v1/chat/completions", &json!({"model": "m"})).await;
    assert_eq!(status, 503, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert!(body["error"]["message"].is_string(), "OpenAI shape: {body}");
    let (status, _, body) = post(
        &base,
        "/v1/messages",
        &json!({"model": "m", "max_tokens": 8, "messages": []}),
    )
    .await;
    assert_eq!(status, 503, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["type"], "error", "Anthropic shape: {body}");

    let refused = try_connect(addr, "local", Some(SECRET), None).await;
    assert_eq!(
        refused.err(),
        Some(reqwest::StatusCode::SERVICE_UNAVAILABLE),
        "no new workers join a draining proxy"
    );
    // An idle draining worker is let go.
    let _reason = worker.closed().await;
    wait_until("the worker is gone", || hub.counts().0 == 0).await;
    server.abort();
}

#[tokio::test]
async fn health_reports_status_version_workers_queue_depth_and_uptime() {
    let mut config = test_config();
    config.providers[0].limits = ProviderLimits {
        models: vec!["queued-model".to_string()],
        ..ProviderLimits::default()
    };
    let proxy = start_proxy(config).await;
    let (status, health) = get_json(&proxy.url(), "/health", &[]).await;
    assert_eq!(status, 200);
    assert_eq!(health["status"], "ok");
    assert!(
        health["version"].as_str().is_some_and(|v| !v.is_empty()),
        "{health}"
    );
    assert_eq!(health["workers_connected"], 0);
    assert_eq!(health["queue_depth"], 0);
    assert!(
        health["uptime_secs"].as_f64().is_some_and(|u| u >= 0.0),
        "{health}"
    );

    let (_worker, _) = ScriptedWorker::join(proxy.addr, "w", &["m"], 1).await;
    let _waiting = spawn_post(
        &proxy.url(),
        "/v1/chat/completions",
        json!({"model": "queued-model"}),
    );
    wait_until("the request is queued", || proxy.hub.counts().1 == 1).await;
    let (_, health) = get_json(&proxy.url(), "/health", &[]).await;
    assert_eq!(health["workers_connected"], 1, "{health}");
    assert_eq!(health["queue_depth"], 1, "{health}");
}

#[tokio::test]
async fn models_endpoint_lists_worker_models_in_the_openai_list_shape() {
    let proxy = start_proxy(test_config()).await;
    let (_a, _) = ScriptedWorker::join(proxy.addr, "a", &["llama3-8b", "qwen2.5-7b"], 1).await;
    let (_b, _) = ScriptedWorker::join(proxy.addr, "b", &["llama3-8b", "mistral-7b"], 1).await;
    let (status, list) = get_json(&proxy.url(), "/v1/models", &[]).await;
    assert_eq!(status, 200);
    assert_eq!(list["object"], "list", "{list}");
    let data = list["data"].as_array().expect("data array");
    let mut ids: Vec<&str> = data.iter().map(|m| m["id"].as_str().unwrap()).collect();
    ids.sort();
    assert_eq!(
        ids,
        vec!["llama3-8b", "mistral-7b", "qwen2.5-7b"],
        "each model once"
    );
    for model in data {
        assert_eq!(model["object"], "model", "{model}");
        assert!(model["owned_by"].is_string(), "{model}");
        assert!(model["created"].is_number(), "{model}");
    }
}

#[tokio::test]
async fn models_endpoint_answers_in_the_anthropic_shape_with_anthropic_version_header() {
    let proxy = start_proxy(test_config()).await;
    let (_a, _) = ScriptedWorker::join(proxy.addr, "a", &["claude-local", "llama3-8b"], 1).await;
    let (status, list) = get_json(
        &proxy.url(),
        "/v1/models",
        &[("anthropic-version", "2023-06-01"), ("x-api-key", "k")],
    )
    .await;
    assert_eq!(status, 200);
    let data = list["data"].as_array().expect("data array");
    let ids: Vec<&str> = data.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), 2, "{list}");
    assert!(
        ids.contains(&"claude-local") && ids.contains(&"llama3-8b"),
        "{list}"
    );
    for model in data {
        assert_eq!(model["type"], "model", "{model}");
        assert!(model["display_name"].is_string(), "{model}");
        assert!(model["created_at"].is_string(), "{model}");
    }
    assert_eq!(list["has_more"], false, "{list}");
    assert_eq!(list["first_id"], ids[0], "{list}");
    assert_eq!(list["last_id"], ids[1], "{list}");
    assert!(
        list.get("object").is_none(),
        "not the OpenAI list shape: {list}"
    );
}

#[tokio::test]
async fn disconnected_worker_leaves_health_and_models() {
    let proxy = start_proxy(test_config()).await;
    let (worker, _) = ScriptedWorker::join(proxy.addr, "w", &["only-here"], 1).await;
    let (_, health) = get_json(&proxy.url(), "/health", &[]).await;
    assert_eq!(health["workers_connected"], 1);
    worker.crash();
    wait_until("the worker is dropped", || proxy.hub.counts().0 == 0).await;
    let (_, health) = get_json(&proxy.url(), "/health", &[]).await;
    assert_eq!(health["workers_connected"], 0);
    let (_, list) = get_json(&proxy.url(), "/v1/models", &[]).await;
    assert_eq!(list["data"], json!([]), "its models are gone: {list}");
}

#[tokio::test]
async fn single_model_endpoint_answers_a_served_model_and_404s_others_in_the_dialect() {
    let proxy = start_proxy(test_config()).await;
    let (_a, _) = ScriptedWorker::join(proxy.addr, "a", &["meta-llama/Llama-3-8B"], 1).await;
    let (status, model) = get_json(&proxy.url(), "/v1/models/meta-llama/Llama-3-8B", &[]).await;
    assert_eq!(status, 200);
    assert_eq!(
        model["id"], "meta-llama/Llama-3-8B",
        "ids with slashes work: {model}"
    );
    assert_eq!(model["object"], "model");
    let (status, model) = get_json(
        &proxy.url(),
        "/v1/models/meta-llama/Llama-3-8B",
        &[("anthropic-version", "2023-06-01")],
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(model["type"], "model", "{model}");
    let (status, error) = get_json(&proxy.url(), "/v1/models/nope", &[]).await;
    assert_eq!(status, 404);
    assert_eq!(error["error"]["code"], "model_not_found", "{error}");
    let (status, error) = get_json(
        &proxy.url(),
        "/v1/models/nope",
        &[("anthropic-version", "2023-06-01")],
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(error["error"]["type"], "not_found_error", "{error}");
}
