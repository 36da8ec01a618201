//! Routing, selection, queueing, dispatch envelopes, pass-through, worker errors, requeue and
//! timeouts (contract: "Model advertisement and worker selection", "Queueing", "Request dispatch
//! over WebSocket", "Non-streaming response pass-through", "Worker disconnect during active
//! request", "Timeout behavior", "Queue-full ... error surfaces").

use std::time::{Duration, Instant};

use relay_core::protocol::{
    CancelReason, ErrorMessage, ModelsUpdateMessage, PongMessage, WorkerToServer,
};
use relay_core::proxy::dispatch::scheduler::{ProviderLimits, MAX_REQUEUE_COUNT};
use relay_core::proxy::ProxyConfig;
use serde_json::{json, Value};

use crate::support::*;

fn config_with_limits(limits: ProviderLimits) -> ProxyConfig {
    let mut config = test_config();
    config.providers[0].limits = limits;
    config
}

fn chat(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hi"}]})
}

fn parse(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|_| panic!("JSON body: {body:?}"))
}

fn assert_openai_error(body: &str) -> Value {
    let body = parse(body);
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "OpenAI error shape has error.message: {body}"
    );
    assert!(body["error"]["type"].is_string(), "error.type: {body}");
    assert!(body["error"].get("code").is_some(), "error.code: {body}");
    body
}

fn assert_anthropic_error(body: &str) -> Value {
    let body = parse(body);
    assert_eq!(body["type"], "error", "Anthropic error shape: {body}");
    assert!(body["error"]["type"].is_string(), "error.type: {body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "error.message: {body}"
    );
    body
}

const QUIET: Duration = Duration::from_millis(300);

#[tokio::test]
async fn requests_are_routed_only_to_workers_advertising_the_exact_model() {
    let proxy = start_proxy(config_with_queue_timeout(Duration::from_millis(200))).await;
    let (mut llama, _) = ScriptedWorker::join(proxy.addr, "llama", &["llama3-8b"], 4).await;
    let (mut qwen, _) = ScriptedWorker::join(proxy.addr, "qwen", &["qwen2.5-7b"], 4).await;

    for _ in 0..3 {
        let task = spawn_post(&proxy.url(), "/v1/chat/completions", chat("qwen2.5-7b"));
        let request = qwen.next_request().await;
        assert_eq!(request.model, "qwen2.5-7b");
        qwen.complete(&request.request_id, r#"{"from":"qwen"}"#)
            .await;
        assert_eq!(answer_of(task).await.2, r#"{"from":"qwen"}"#);
    }
    llama
        .assert_nothing_for(QUIET, "the llama worker does not serve qwen")
        .await;

    // No prefix, case or substring matching: a near miss waits for a worker that serves
    // exactly that name, and times out.
    for near_miss in ["llama3", "LLAMA3-8B", "llama3-8b:latest", "qwen2.5-7b "] {
        let (status, _, body) = post(&proxy.url(), "/v1/chat/completions", &chat(near_miss)).await;
        assert_eq!(
            status, 504,
            "{near_miss:?} is not an advertised model: {body}"
        );
    }
    llama.assert_nothing_for(QUIET, "no near-miss routed").await;
    qwen.assert_nothing_for(QUIET, "no near-miss routed").await;
}

#[tokio::test]
async fn least_loaded_worker_is_chosen_first() {
    let proxy = start_proxy(test_config()).await;
    // `busy` already runs two requests of its own (current_load 2 of 4).
    let mut busy = ScriptedWorker::connect(proxy.addr).await;
    busy.register_message(register_message("busy", &["m"], 4, Some("1"), Some(2)))
        .await;
    let (mut idle, _) = ScriptedWorker::join(proxy.addr, "idle", &["m"], 4).await;

    let first = spawn_post(&proxy.url(), "/v1/chat/completions", chat("m"));
    let r1 = idle.next_request().await;
    let second = spawn_post(&proxy.url(), "/v1/chat/completions", chat("m"));
    let r2 = idle.next_request().await;
    busy.assert_nothing_for(
        QUIET,
        "the busier worker is not chosen while another has less load",
    )
    .await;
    assert_ne!(r1.request_id, r2.request_id);
    idle.complete(&r1.request_id, "{}").await;
    idle.complete(&r2.request_id, "{}").await;
    assert_eq!(answer_of(first).await.0, 200);
    assert_eq!(answer_of(second).await.0, 200);
}

#[tokio::test]
async fn equally_loaded_workers_take_turns_round_robin() {
    let mut config = test_config();
    // The same prompt six times is one conversation, which affinity keeps on one worker.
    config.affinity = false;
    let proxy = start_proxy(config).await;
    let (mut a, _) = ScriptedWorker::join(proxy.addr, "a", &["m"], 4).await;
    let (mut b, _) = ScriptedWorker::join(proxy.addr, "b", &["m"], 4).await;
    let mut chosen = Vec::new();
    for i in 0..6 {
        let task = spawn_post(&proxy.url(), "/v1/chat/completions", chat("m"));
        let (which, request) = next_request_on_either(&mut a, &mut b).await;
        let worker = if which == 0 { &mut a } else { &mut b };
        worker
            .complete(&request.request_id, &format!(r#"{{"i":{i}}}"#))
            .await;
        assert_eq!(answer_of(task).await.0, 200);
        chosen.push(which);
    }
    assert_eq!(chosen.iter().filter(|w| **w == 0).count(), 3, "{chosen:?}");
    for pair in chosen.windows(2) {
        assert_ne!(pair[0], pair[1], "idle workers alternate: {chosen:?}");
    }
}

#[tokio::test]
async fn capacity_is_reserved_so_a_full_worker_gets_no_second_request_until_it_finishes() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "w", &["m"], 1).await;
    let first = spawn_post(&proxy.url(), "/v1/chat/completions", chat("m"));
    let second = spawn_post(&proxy.url(), "/v1/chat/completions", chat("m"));
    let r1 = worker.next_request().await;
    wait_until("the other request is queued", || proxy.hub.counts().1 == 1).await;
    worker
        .assert_nothing_for(QUIET, "max_concurrent 1: no second request while one runs")
        .await;

    worker.complete(&r1.request_id, r#"{"n":1}"#).await;
    let completed_at = Instant::now();
    let r2 = worker.next_request().await;
    assert!(
        completed_at.elapsed() < Duration::from_secs(1),
        "the queued request is dispatched as soon as the slot frees, took {:?}",
        completed_at.elapsed()
    );
    assert_ne!(r1.request_id, r2.request_id);
    worker.complete(&r2.request_id, r#"{"n":2}"#).await;
    let mut bodies = vec![answer_of(first).await.2, answer_of(second).await.2];
    bodies.sort();
    assert_eq!(bodies, vec![r#"{"n":1}"#, r#"{"n":2}"#]);
    assert_eq!(proxy.hub.counts().1, 0);
}

#[tokio::test]
async fn queued_requests_are_dispatched_first_in_first_out() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "w", &["m"], 1).await;
    let first = spawn_post(
        &proxy.url(),
        "/v1/chat/completions",
        json!({"model": "m", "seq": 0}),
    );
    let mut current = worker.next_request().await;
    let mut waiting = Vec::new();
    for seq in 1..=4 {
        waiting.push(spawn_post(
            &proxy.url(),
            "/v1/chat/completions",
            json!({"model": "m", "seq": seq}),
        ));
        wait_until("the request is queued", || proxy.hub.counts().1 == seq).await;
    }
    for seq in 1..=4 {
        worker.complete(&current.request_id, "{}").await;
        current = worker.next_request().await;
        assert_eq!(
            parse(&current.body)["seq"],
            seq,
            "queued requests leave in arrival order"
        );
    }
    worker.complete(&current.request_id, "{}").await;
    assert_eq!(answer_of(first).await.0, 200);
    for task in waiting {
        assert_eq!(answer_of(task).await.0, 200);
    }
}

#[tokio::test]
async fn queued_request_for_another_model_does_not_block_compatible_work() {
    // `other` is a provider model without a worker: its requests queue.
    let proxy = start_proxy(config_with_limits(ProviderLimits {
        models: vec!["other".to_string()],
        ..ProviderLimits::default()
    }))
    .await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "w", &["m"], 1).await;
    let first = spawn_post(&proxy.url(), "/v1/chat/completions", chat("m"));
    let r1 = worker.next_request().await;
    let _incompatible = spawn_post(&proxy.url(), "/v1/chat/completions", chat("other"));
    wait_until("the incompatible request is queued", || {
        proxy.hub.counts().1 == 1
    })
    .await;
    let compatible = spawn_post(&proxy.url(), "/v1/chat/completions", chat("m"));
    wait_until("the compatible request is queued", || {
        proxy.hub.counts().1 == 2
    })
    .await;
    worker.complete(&r1.request_id, "{}").await;
    let r2 = worker.next_request().await;
    assert_eq!(
        r2.model, "m",
        "the worker gets the oldest request it can serve"
    );
    worker.complete(&r2.request_id, r#"{"second":true}"#).await;
    assert_eq!(answer_of(first).await.0, 200);
    assert_eq!(answer_of(compatible).await.2, r#"{"second":true}"#);
    worker
        .assert_nothing_for(QUIET, "the request for another model is never sent here")
        .await;
    assert_eq!(proxy.hub.counts().1, 1, "it is still queued");
}

#[tokio::test]
async fn full_queue_answers_429_with_retry_after() {
    let proxy = start_proxy(config_with_limits(ProviderLimits {
        max_queue_len: 2,
        models: vec!["m".to_string()],
        ..ProviderLimits::default()
    }))
    .await;
    let _a = spawn_post(&proxy.url(), "/v1/chat/completions", chat("m"));
    let _b = spawn_post(&proxy.url(), "/v1/chat/completions", chat("m"));
    wait_until("two requests are queued", || proxy.hub.counts().1 == 2).await;

    let (status, headers, body) = post(&proxy.url(), "/v1/chat/completions", &chat("m")).await;
    assert_eq!(status, 429, "{body}");
    assert!(headers.contains_key("retry-after"), "Retry-After is sent");
    assert_openai_error(&body);

    let (status, headers, body) = post(
        &proxy.url(),
        "/v1/messages",
        &json!({"model": "m", "max_tokens": 8, "messages": []}),
    )
    .await;
    assert_eq!(status, 429, "{body}");
    assert!(headers.contains_key("retry-after"), "Retry-After is sent");
    assert_anthropic_error(&body);
    assert_eq!(
        proxy.hub.counts().1,
        2,
        "the queue never grows past its bound"
    );
}

#[tokio::test]
async fn queue_timeout_answers_504_and_sends_no_cancel_to_any_worker() {
    let proxy = start_proxy(config_with_limits(ProviderLimits {
        queue_timeout: Duration::from_millis(400),
        ..ProviderLimits::default()
    }))
    .await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "w", &["m"], 1).await;
    let first = spawn_post(&proxy.url(), "/v1/chat/completions", chat("m"));
    let r1 = worker.next_request().await;

    let started = Instant::now();
    let (status, _, body) = post(&proxy.url(), "/v1/chat/completions", &chat("m")).await;
    assert_eq!(status, 504, "{body}");
    assert_openai_error(&body);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "answered at the queue timeout, took {:?}",
        started.elapsed()
    );
    worker
        .assert_nothing_for(
            QUIET,
            "a request that never left the queue is not cancelled",
        )
        .await;
    assert_eq!(
        proxy.hub.counts().1,
        0,
        "the expired request left the queue"
    );

    worker.complete(&r1.request_id, "{}").await;
    assert_eq!(answer_of(first).await.0, 200);
    worker
        .assert_nothing_for(QUIET, "the timed-out request is not dispatched later")
        .await;
    wait_until("nothing is tracked", || proxy.hub.tracked_requests() == 0).await;
}

#[tokio::test]
async fn a_model_name_no_worker_could_advertise_answers_404_in_the_openai_shape_on_openai_routes() {
    let proxy = start_proxy(test_config()).await;
    let (_worker, _) = ScriptedWorker::join(proxy.addr, "w", &["llama3-8b"], 1).await;
    let (status, _, body) = post(
        &proxy.url(),
        "/v1/chat/completions",
        &chat("no-such\tmodel"),
    )
    .await;
    assert_eq!(status, 404);
    let body = assert_openai_error(&body);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no-such\\tmodel"),
        "the message names the model: {body}"
    );
    assert_eq!(proxy.hub.tracked_requests(), 0);
}

#[tokio::test]
async fn a_model_name_no_worker_could_advertise_answers_404_in_the_anthropic_shape_on_messages() {
    let proxy = start_proxy(test_config()).await;
    let (status, _, body) = post(
        &proxy.url(),
        "/v1/messages",
        &json!({"model": "claude\nnope", "max_tokens": 16, "messages": []}),
    )
    .await;
    assert_eq!(status, 404);
    let body = assert_anthropic_error(&body);
    assert_eq!(body["error"]["type"], "not_found_error");
}

#[tokio::test]
async fn dispatched_request_carries_id_model_raw_body_path_and_streaming_flag() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "w", &["llama3-8b"], 4).await;
    // Odd spacing, key order and escapes must survive untouched.
    let raw = "{ \"zeta\": [1, 2.50, {\"k\": \"\\u00e9\"}],\n  \"model\":\"llama3-8b\", \"stream\": false, \"messages\":[] }";
    let base = proxy.url();
    let task =
        tokio::spawn(
            async move { post_raw(&base, "/v1/chat/completions", raw.to_string(), &[]).await },
        );
    let request = worker.next_request().await;
    assert!(!request.request_id.is_empty(), "a request id is assigned");
    assert_eq!(request.model, "llama3-8b");
    assert_eq!(
        request.body, raw,
        "the body is the client's raw JSON string"
    );
    assert_eq!(request.endpoint_path, "/v1/chat/completions");
    assert!(!request.is_streaming);
    worker.complete(&request.request_id, "{}").await;
    assert_eq!(answer_of(task).await.0, 200);

    // Anthropic path with a query string, streaming.
    let task = spawn_post(
        &proxy.url(),
        "/v1/messages?beta=true",
        json!({"model": "llama3-8b", "stream": true, "max_tokens": 8, "messages": []}),
    );
    let second = worker.next_request().await;
    assert_ne!(second.request_id, request.request_id, "ids are unique");
    assert_eq!(
        second.endpoint_path, "/v1/messages?beta=true",
        "query string kept"
    );
    assert!(second.is_streaming);
    worker
        .chunk(&second.request_id, "event: message_stop\ndata: {}\n\n")
        .await;
    worker.finish_stream(&second.request_id).await;
    assert_eq!(answer_of(task).await.0, 200);
}

/// The headers a worker receives for a client request carrying the usual compatibility
/// headers, credentials and transport noise, from a proxy whose provider opts in to passing
/// credentials on or not.
async fn headers_a_worker_receives(forward_client_auth: bool) -> Vec<(String, String)> {
    let mut config = test_config();
    config.providers[0].forward_client_auth = forward_client_auth;
    let proxy = start_proxy(config).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "w", &["m"], 4).await;
    let base = proxy.url();
    let task = tokio::spawn(async move {
        post_raw(
            &base,
            "/v1/messages",
            json!({"model": "m", "max_tokens": 8, "messages": []}).to_string(),
            &[
                ("authorization", "Bearer sk-client"),
                ("openai-organization", "org-123"),
                ("x-api-key", "sk-ant-client"),
                ("anthropic-version", "2023-06-01"),
                ("anthropic-beta", "tools-2024-04-04"),
                ("user-agent", "contract-tests/1.0"),
                ("x-some-tracing-header", "abc"),
            ],
        )
        .await
    });
    let request = worker.next_request().await;
    worker.complete(&request.request_id, "{}").await;
    assert_eq!(answer_of(task).await.0, 200);
    request.headers.into_iter().collect()
}

fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    expected
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

#[tokio::test]
async fn dispatched_request_forwards_only_compatibility_headers_and_keeps_credentials_back() {
    // The seeds list authorization and x-api-key among the forwarded headers; issue 12 (safe by
    // default) overrides that: anyone with the worker secret would otherwise collect users' keys.
    assert_eq!(
        headers_a_worker_receives(false).await,
        pairs(&[
            ("anthropic-beta", "tools-2024-04-04"),
            ("anthropic-version", "2023-06-01"),
            ("content-type", "application/json"),
            ("openai-organization", "org-123"),
        ]),
        "only the compatibility headers are forwarded, without credentials"
    );
}

#[tokio::test]
async fn a_provider_that_opts_in_gets_the_clients_credentials_too() {
    assert_eq!(
        headers_a_worker_receives(true).await,
        pairs(&[
            ("anthropic-beta", "tools-2024-04-04"),
            ("anthropic-version", "2023-06-01"),
            ("authorization", "Bearer sk-client"),
            ("content-type", "application/json"),
            ("openai-organization", "org-123"),
            ("x-api-key", "sk-ant-client"),
        ])
    );
}

#[tokio::test]
async fn worker_4xx_answer_passes_through_with_status_headers_and_body() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "w", &["m"], 4).await;
    let task = spawn_post(&proxy.url(), "/v1/chat/completions", chat("m"));
    let request = worker.next_request().await;
    let upstream = r#"{"error":{"message":"context length exceeded","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;
    worker
        .complete_with(
            &request.request_id,
            422,
            &[
                ("content-type", "application/json; charset=utf-8"),
                ("x-upstream-request-id", "up-42"),
            ],
            upstream,
        )
        .await;
    let (status, headers, body) = answer_of(task).await;
    assert_eq!(status, 422);
    assert_eq!(headers["content-type"], "application/json; charset=utf-8");
    assert_eq!(headers["x-upstream-request-id"], "up-42");
    assert_eq!(body, upstream, "the backend's error body is not flattened");
}

#[tokio::test]
async fn worker_5xx_answer_passes_through_with_status_headers_and_body() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "w", &["m"], 4).await;
    let task = spawn_post(&proxy.url(), "/v1/chat/completions", chat("m"));
    let request = worker.next_request().await;
    worker
        .complete_with(
            &request.request_id,
            503,
            &[("content-type", "text/plain"), ("retry-after", "7")],
            "backend overloaded, try later",
        )
        .await;
    let (status, headers, body) = answer_of(task).await;
    assert_eq!(status, 503);
    assert_eq!(headers["content-type"], "text/plain");
    assert_eq!(headers["retry-after"], "7");
    assert_eq!(body, "backend overloaded, try later");
}

#[tokio::test]
async fn models_update_adds_a_model_at_once_and_dispatches_queued_work() {
    let proxy = start_proxy(config_with_limits(ProviderLimits {
        models: vec!["new-model".to_string()],
        ..ProviderLimits::default()
    }))
    .await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "w", &["old-model"], 2).await;
    let task = spawn_post(&proxy.url(), "/v1/chat/completions", chat("new-model"));
    wait_until("the request is queued", || proxy.hub.counts().1 == 1).await;
    worker
        .assert_nothing_for(QUIET, "not routed before the worker advertises it")
        .await;

    worker
        .send(&WorkerToServer::ModelsUpdate(ModelsUpdateMessage {
            warm_ups: None,
            sides_first: None,
            models: vec!["old-model".to_string(), "new-model".to_string()],
            current_load: 0,
            going_to_sleep: None,
            context_windows: None,
            model_states: None,
        }))
        .await;
    let request = worker.next_request().await;
    assert_eq!(request.model, "new-model");
    worker
        .complete(&request.request_id, r#"{"new":true}"#)
        .await;
    assert_eq!(answer_of(task).await.2, r#"{"new":true}"#);
    let models: Vec<String> = proxy.hub.models().into_iter().map(|(m, _)| m).collect();
    assert_eq!(models, vec!["new-model", "old-model"]);
}

#[tokio::test]
async fn models_update_removing_a_model_stops_routing_it_at_once() {
    let proxy = start_proxy(config_with_limits(ProviderLimits {
        queue_timeout: Duration::from_millis(300),
        ..ProviderLimits::default()
    }))
    .await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "w", &["a", "b"], 2).await;
    worker
        .send(&WorkerToServer::ModelsUpdate(ModelsUpdateMessage {
            warm_ups: None,
            sides_first: None,
            models: vec!["b".to_string()],
            current_load: 0,
            going_to_sleep: None,
            context_windows: None,
            model_states: None,
        }))
        .await;
    wait_until("the update is applied", || {
        proxy.hub.workers()[0].models == vec!["b".to_string()]
    })
    .await;
    let (status, _, body) = post(&proxy.url(), "/v1/chat/completions", &chat("a")).await;
    assert_eq!(status, 504, "the removed model is not served: {body}");
    worker
        .assert_nothing_for(QUIET, "a removed model is never dispatched to the worker")
        .await;
}

#[tokio::test]
async fn pong_reporting_lower_load_dispatches_queued_work() {
    let proxy = start_proxy(test_config()).await;
    let mut worker = ScriptedWorker::connect(proxy.addr).await;
    // The worker comes back already running two requests of its own: full.
    worker
        .register_message(register_message("w", &["m"], 2, Some("1"), Some(2)))
        .await;
    let task = spawn_post(&proxy.url(), "/v1/chat/completions", chat("m"));
    wait_until("the request is queued", || proxy.hub.counts().1 == 1).await;
    worker
        .assert_nothing_for(QUIET, "a worker at its reported load gets nothing")
        .await;

    worker
        .send(&WorkerToServer::Pong(PongMessage {
            current_load: 0,
            timestamp_unix_ms: None,
            hardware: None,
            model_states: None,
        }))
        .await;
    let request = worker
        .next_message_quietly(WAIT)
        .await
        .expect("the pong frees capacity");
    let relay_core::protocol::ServerToWorker::Request(request) = request else {
        panic!("expected the queued request, got {request:?}");
    };
    worker.complete(&request.request_id, "{}").await;
    assert_eq!(answer_of(task).await.0, 200);
}

#[tokio::test]
async fn worker_error_for_a_request_answers_502_in_openai_shape_and_the_worker_keeps_serving() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "w", &["m"], 1).await;
    let task = spawn_post(&proxy.url(), "/v1/chat/completions", chat("m"));
    let request = worker.next_request().await;
    worker
        .fail(Some(&request.request_id), "backend refused the connection")
        .await;
    let (status, _, body) = answer_of(task).await;
    assert_eq!(status, 502);
    assert_openai_error(&body);

    let task = spawn_post(&proxy.url(), "/v1/chat/completions", chat("m"));
    let next = worker.next_request().await;
    worker
        .complete(&next.request_id, r#"{"still":"here"}"#)
        .await;
    assert_eq!(answer_of(task).await.2, r#"{"still":"here"}"#);
    assert_eq!(proxy.hub.counts().0, 1);
}

#[tokio::test]
async fn worker_error_for_a_request_answers_502_in_anthropic_shape_on_messages() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "w", &["m"], 1).await;
    let task = spawn_post(
        &proxy.url(),
        "/v1/messages",
        json!({"model": "m", "max_tokens": 8, "messages": []}),
    );
    let request = worker.next_request().await;
    worker
        .fail(Some(&request.request_id), "backend refused the connection")
        .await;
    let (status, _, body) = answer_of(task).await;
    assert_eq!(status, 502);
    assert_anthropic_error(&body);

    let task = spawn_post(
        &proxy.url(),
        "/v1/messages",
        json!({"model": "m", "max_tokens": 8, "messages": []}),
    );
    let next = worker.next_request().await;
    worker
        .complete(&next.request_id, r#"{"type":"message"}"#)
        .await;
    assert_eq!(answer_of(task).await.0, 200);
}

#[tokio::test]
async fn worker_error_without_request_id_is_only_logged() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "w", &["m"], 1).await;
    let task = spawn_post(&proxy.url(), "/v1/chat/completions", chat("m"));
    let request = worker.next_request().await;
    worker.fail(None, "model list refresh failed").await;
    worker
        .assert_nothing_for(
            QUIET,
            "a worker-level error closes nothing and cancels nothing",
        )
        .await;
    assert!(!task.is_finished(), "the running request is unaffected");
    worker.complete(&request.request_id, r#"{"fine":1}"#).await;
    assert_eq!(answer_of(task).await.2, r#"{"fine":1}"#);
    assert_eq!(proxy.hub.counts().0, 1, "the worker stays connected");
}

#[tokio::test]
async fn request_is_requeued_to_another_worker_when_its_worker_dies() {
    let proxy = start_proxy(test_config()).await;
    let (mut first, _) = ScriptedWorker::join(proxy.addr, "first", &["m"], 1).await;
    let task = spawn_post(
        &proxy.url(),
        "/v1/chat/completions",
        json!({"model": "m", "n": 7}),
    );
    let original = first.next_request().await;
    let (mut second, _) = ScriptedWorker::join(proxy.addr, "second", &["m"], 1).await;
    first.crash();

    let again = second.next_request().await;
    assert_eq!(
        again.request_id, original.request_id,
        "the same request, requeued"
    );
    assert_eq!(again.body, original.body);
    second
        .complete(&again.request_id, r#"{"served_by":"second"}"#)
        .await;
    let (status, _, body) = answer_of(task).await;
    assert_eq!(status, 200);
    assert_eq!(body, r#"{"served_by":"second"}"#);
    wait_until("nothing is tracked", || proxy.hub.tracked_requests() == 0).await;
}

#[tokio::test]
async fn requeue_is_capped_at_three_then_the_client_gets_503() {
    let proxy = start_proxy(test_config()).await;
    let task = {
        let (mut worker, _) = ScriptedWorker::join(proxy.addr, "w0", &["m"], 1).await;
        let task = spawn_post(&proxy.url(), "/v1/chat/completions", chat("m"));
        let request = worker.next_request().await;
        worker.crash();
        (task, request.request_id)
    };
    let (task, id) = task;
    // Three requeues: each new worker receives the same request and dies with it.
    for attempt in 1..=3 {
        let (mut worker, _) =
            ScriptedWorker::join(proxy.addr, &format!("w{attempt}"), &["m"], 1).await;
        let request = worker.next_request().await;
        assert_eq!(
            request.request_id, id,
            "requeue {attempt} delivers the same request"
        );
        worker.crash();
    }
    let (status, _, body) = answer_of(task).await;
    assert_eq!(status, 503, "requeue exhausted: {body}");
    let body = assert_openai_error(&body);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .to_lowercase()
            .contains("requeue"),
        "the message says requeue attempts ran out: {body}"
    );
    let (mut late, _) = ScriptedWorker::join(proxy.addr, "late", &["m"], 1).await;
    late.assert_nothing_for(QUIET, "an exhausted request is not dispatched again")
        .await;
    wait_until("nothing is tracked", || proxy.hub.tracked_requests() == 0).await;
}

/// A worker that refuses a request as beyond its `max_concurrent` (`worker_busy`: its own count
/// ran ahead of the proxy's) is counted full until it reports its load; the refusal does not
/// use up the request's requeues, however often it happens, and the request is answered.
#[tokio::test]
async fn a_workers_busy_refusals_requeue_without_using_up_the_request() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "w0", &["m"], 2).await;
    let task = spawn_post(&proxy.url(), "/v1/chat/completions", chat("m"));
    for _ in 0..(MAX_REQUEUE_COUNT + 2) {
        let request = worker.next_request().await;
        worker
            .send(&WorkerToServer::Error(ErrorMessage {
                request_id: Some(request.request_id.clone()),
                code: "worker_busy".to_string(),
                message: "this worker already runs its 2 requests (max_concurrent)".to_string(),
            }))
            .await;
        worker
            .assert_nothing_for(QUIET, "not sent back to a worker that said it is full")
            .await;
        // Its load report says a slot is free again.
        worker
            .send(&WorkerToServer::Pong(PongMessage {
                current_load: 1,
                timestamp_unix_ms: None,
                hardware: None,
                model_states: None,
            }))
            .await;
    }
    let request = worker.next_request().await;
    worker.complete(&request.request_id, r#"{"ok":true}"#).await;
    let (status, _, body) = answer_of(task).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn requeue_keeps_the_original_request_deadline() {
    let proxy = start_proxy(config_with_limits(ProviderLimits {
        request_timeout: Duration::from_millis(2000),
        queue_timeout: Duration::from_secs(8),
        ..ProviderLimits::default()
    }))
    .await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "w", &["m"], 1).await;
    let submitted = Instant::now();
    let task = spawn_post(&proxy.url(), "/v1/chat/completions", chat("m"));
    let _request = worker.next_request().await;
    tokio::time::sleep(Duration::from_millis(1400)).await;
    worker.crash();
    // No other worker: the request waits in the queue, but only until its original deadline.
    let (status, _, body) = answer_of(task).await;
    let elapsed = submitted.elapsed();
    assert_eq!(status, 504, "{body}");
    assert!(
        elapsed < Duration::from_millis(3000),
        "the requeued request ends at its original 2 s deadline, not a fresh one: {elapsed:?}"
    );
}

#[tokio::test]
async fn request_timeout_in_flight_cancels_with_reason_timeout_and_answers_504() {
    let proxy = start_proxy(config_with_limits(ProviderLimits {
        request_timeout: Duration::from_millis(600),
        ..ProviderLimits::default()
    }))
    .await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "w", &["m"], 1).await;
    let task = spawn_post(&proxy.url(), "/v1/chat/completions", chat("m"));
    let request = worker.next_request().await;
    let cancel = worker.next_cancel().await;
    assert_eq!(cancel.request_id, request.request_id);
    assert_eq!(cancel.reason, CancelReason::Timeout);
    let (status, _, body) = answer_of(task).await;
    assert_eq!(status, 504);
    assert_openai_error(&body);
    // The worker confirms; its slot is free again.
    worker.fail(Some(&request.request_id), "cancelled").await;
    let task = spawn_post(&proxy.url(), "/v1/chat/completions", chat("m"));
    let next = worker.next_request().await;
    worker.complete(&next.request_id, "{}").await;
    assert_eq!(answer_of(task).await.0, 200);
}

#[tokio::test]
async fn requeued_request_keeps_its_place_ahead_of_later_arrivals() {
    let proxy = start_proxy(test_config()).await;
    let (mut first, _) = ScriptedWorker::join(proxy.addr, "first", &["m"], 1).await;
    let older = spawn_post(
        &proxy.url(),
        "/v1/chat/completions",
        json!({"model": "m", "seq": "older"}),
    );
    let original = first.next_request().await;
    let newer = spawn_post(
        &proxy.url(),
        "/v1/chat/completions",
        json!({"model": "m", "seq": "newer"}),
    );
    wait_until("the newer request is queued", || proxy.hub.counts().1 == 1).await;
    first.crash();
    wait_until("both wait in the queue", || proxy.hub.counts().1 == 2).await;

    let (mut second, _) = ScriptedWorker::join(proxy.addr, "second", &["m"], 1).await;
    let next = second.next_request().await;
    assert_eq!(
        next.request_id, original.request_id,
        "the requeued request is still the oldest"
    );
    second
        .complete(&next.request_id, r#"{"seq":"older"}"#)
        .await;
    let after = second.next_request().await;
    assert_eq!(parse(&after.body)["seq"], "newer");
    second
        .complete(&after.request_id, r#"{"seq":"newer"}"#)
        .await;
    assert_eq!(answer_of(older).await.2, r#"{"seq":"older"}"#);
    assert_eq!(answer_of(newer).await.2, r#"{"seq":"newer"}"#);
}

#[tokio::test]
async fn retryable_worker_error_before_any_byte_requeues_the_request() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "gpu", &["m"], 1).await;
    let client = spawn_post(&proxy.url(), "/v1/chat/completions", json!({"model": "m"}));
    let first = worker.next_request().await;
    worker
        .send(&WorkerToServer::Error(relay_core::protocol::ErrorMessage {
            request_id: Some(first.request_id.clone()),
            code: "model_crashed".to_string(),
            message: "model m crashed (exit code 3)".to_string(),
        }))
        .await;
    let again = worker.next_request().await;
    assert_eq!(
        again.request_id, first.request_id,
        "the same request, sent again"
    );
    worker.complete(&again.request_id, r#"{"ok":true}"#).await;
    let (status, _, body) = answer_of(client).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, r#"{"ok":true}"#);
    wait_until("nothing is tracked", || proxy.hub.tracked_requests() == 0).await;
}

#[tokio::test]
async fn retryable_worker_error_after_the_first_chunk_ends_the_stream_with_an_error_event() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "gpu", &["m"], 1).await;
    let client = spawn_post(
        &proxy.url(),
        "/v1/chat/completions",
        json!({"model": "m", "stream": true}),
    );
    let request = worker.next_request().await;
    worker
        .chunk(&request.request_id, "data: {\"choices\":[]}\n\n")
        .await;
    worker
        .send(&WorkerToServer::Error(relay_core::protocol::ErrorMessage {
            request_id: Some(request.request_id.clone()),
            code: "model_crashed".to_string(),
            message: "model m crashed".to_string(),
        }))
        .await;
    let (status, _, body) = answer_of(client).await;
    assert_eq!(status, 200);
    let events = sse_data(&body);
    assert_eq!(events.len(), 2, "{body}");
    let error: Value = serde_json::from_str(&events[1]).expect("error event");
    assert_eq!(error["error"]["code"], "worker_error", "{body}");
    worker
        .assert_nothing_for(
            Duration::from_millis(300),
            "a stream that already sent bytes is never sent again",
        )
        .await;
}
