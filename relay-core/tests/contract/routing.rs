//! Routing on unequal boxes (issue 29): each box's speed is measured from what its backend
//! reports (llama-server's `timings`), carried by the real worker to the proxy, shown on the
//! dashboard; every placement says why it went where it did, on the dashboard and in
//! `/metrics`.

use std::time::Duration;

use axum::routing::{get, post as post_route};
use relay_core::protocol::{ModelStateReport, PongMessage, WorkerToServer};
use relay_core::proxy::RunningProxy;
use serde_json::{json, Value};

use crate::support::*;

const MODEL: &str = "timed-model";

/// A backend that answers like llama-server: a body with `timings` (2,000 prompt tokens in
/// 1 s, 50 generated in 1 s, 500 from its cache), or a stream whose last event carries them.
/// It serves chat completions alone: Anthropic requests reach it translated.
async fn timed_backend() -> String {
    serving(
        "/v1/chat/completions",
        post_route(|body: axum::body::Bytes| async move {
            use axum::response::IntoResponse;
            let usage = json!({"prompt_tokens": 2500, "completion_tokens": 50});
            let timings = json!({"cache_n": 500, "prompt_n": 2000, "prompt_ms": 1000.0,
                                     "predicted_n": 50, "predicted_ms": 1000.0});
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            if body["stream"] == true {
                let first = json!({"id": "chatcmpl-1", "object": "chat.completion.chunk",
                        "model": MODEL, "choices": [{"index": 0,
                        "delta": {"role": "assistant", "content": "hi"}, "finish_reason": null}]});
                let last = json!({"id": "chatcmpl-1", "object": "chat.completion.chunk",
                        "model": MODEL, "choices": [{"index": 0, "delta": {},
                        "finish_reason": "stop"}], "usage": usage, "timings": timings});
                let text = format!("data: {first}\n\ndata: {last}\n\ndata: [DONE]\n\n");
                return ([("content-type", "text/event-stream")], text).into_response();
            }
            axum::Json(json!({
                "id": "chatcmpl-1", "object": "chat.completion", "model": MODEL,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "hi"}}],
                "usage": usage, "timings": timings
            }))
            .into_response()
        }),
    )
    .await
}

/// A proxy and a real worker (two requests at once) in front of `backend`, registered.
async fn relayed(backend: &str) -> (RunningProxy, RunningWorker) {
    let proxy = start_proxy(test_config()).await;
    let worker = RunningWorker::start(&proxy, backend, None, 2);
    wait_until("the worker registers", || proxy.hub.models().len() == 1).await;
    (proxy, worker)
}

/// A backend listing [`MODEL`] and answering `path` with `handler`: its base URL.
async fn serving(path: &str, handler: axum::routing::MethodRouter) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new()
        .route(
            "/v1/models",
            get(|| async { axum::Json(json!({"object": "list", "data": [{"id": MODEL}]})) }),
        )
        .route(path, handler);
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

#[tokio::test]
async fn a_workers_timings_teach_the_proxy_its_speed_and_each_placement_says_why() {
    let backend = timed_backend().await;
    let (proxy, worker) = relayed(&backend).await;
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "hello"}]});
    let (status, _, text) = post(&proxy.url(), "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{text}");
    let answer: Value = serde_json::from_str(&text).unwrap();
    assert!(
        answer["timings"].is_object(),
        "the client gets the body as sent: {answer}"
    );

    let (code, status) = get_json(&proxy.url(), "/api/status", &[]).await;
    assert_eq!(code, 200);
    let speed = &status["workers"][0]["speeds"][MODEL];
    assert_eq!(speed["prompt_tps"], 2000.0, "{status}");
    assert_eq!(speed["generation_tps"], 50.0, "{status}");

    let metrics = metrics_text(&proxy.url()).await;
    assert!(
        metrics.contains("modelrelay_placements_total{reason=\"new_conversation\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("modelrelay_placements_total{reason=\"faster_box\"} 0"));
    worker.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn an_anthropic_request_translated_for_the_backend_teaches_the_proxy_its_speed_too() {
    // Claude Code's turns reach a llama-server translated (pinned to a slot, or a server
    // without `/v1/messages`): its timings come in the backend's own answer, which the client's
    // dialect does not carry.
    for stream in [true, false] {
        let backend = timed_backend().await;
        let (proxy, worker) = relayed(&backend).await;
        let body = json!({"model": MODEL, "max_tokens": 64, "stream": stream,
            "messages": [{"role": "user", "content": "hello"}]});
        let (status, _, text) = post(&proxy.url(), "/v1/messages", &body).await;
        assert_eq!(status, 200, "{text}");
        assert!(text.contains("\"hi\""), "translated: {text}");
        assert_eq!(prompt_speed(&proxy).await, Some(2000.0), "stream {stream}");
        worker.stop().await;
        proxy.shutdown().await;
    }
}

/// A backend that says no `timings` (as Ollama, vLLM and LM Studio): a stream whose first
/// event comes 300 ms after the request and 20 more 10 ms apart, then usage (1,500 prompt
/// tokens, 21 generated). By the clock: 5,000 prompt tokens a second at most, 100 generated.
async fn untimed_backend() -> String {
    use axum::response::IntoResponse;
    let chunk = |delta: Value, usage: Value| {
        let mut event = json!({"id": "c", "object": "chat.completion.chunk", "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "finish_reason": null}]});
        if !usage.is_null() {
            event["usage"] = usage;
        }
        axum::body::Bytes::from(format!("data: {event}\n\n"))
    };
    serving(
        "/v1/chat/completions",
        post_route(move || async move {
            let events = futures_util::stream::unfold(0u32, move |i| async move {
                let event = match i {
                    0 => {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        chunk(json!({"role": "assistant", "content": "t"}), Value::Null)
                    }
                    1..=20 => {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        chunk(json!({"content": "t"}), Value::Null)
                    }
                    21 => chunk(
                        json!({}),
                        json!({"prompt_tokens": 1500, "completion_tokens": 21}),
                    ),
                    22 => axum::body::Bytes::from("data: [DONE]\n\n"),
                    _ => return None,
                };
                Some((Ok::<_, std::convert::Infallible>(event), i + 1))
            });
            (
                [("content-type", "text/event-stream")],
                axum::body::Body::from_stream(events),
            )
                .into_response()
        }),
    )
    .await
}

#[tokio::test]
async fn a_backend_without_timings_is_timed_by_the_clock_when_its_request_ran_alone() {
    let streamed = json!({"model": MODEL, "stream": true,
        "messages": [{"role": "user", "content": "hello"}]});
    // Alone: 1,500 tokens in a little over 0.3 s, 20 more in a little over 0.2 s.
    let backend = untimed_backend().await;
    let (proxy, worker) = relayed(&backend).await;
    let (status, _, text) = post(&proxy.url(), "/v1/chat/completions", &streamed).await;
    assert_eq!(status, 200, "{text}");
    let (_, status) = get_json(&proxy.url(), "/api/status", &[]).await;
    let speed = &status["workers"][0]["speeds"][MODEL];
    let prompt = speed["prompt_tps"].as_f64().expect("a prompt speed");
    let generation = speed["generation_tps"]
        .as_f64()
        .expect("a generation speed");
    assert!((2500.0..=5000.0).contains(&prompt), "{speed}");
    assert!((40.0..=100.0).contains(&generation), "{speed}");
    worker.stop().await;
    proxy.shutdown().await;
    // Two at once: each one's first token waited for the other's prompt too, so neither says.
    let backend = untimed_backend().await;
    let (proxy, worker) = relayed(&backend).await;
    let url = proxy.url();
    let (a, b) = tokio::join!(
        post(&url, "/v1/chat/completions", &streamed),
        post(&url, "/v1/chat/completions", &streamed)
    );
    assert_eq!((a.0.as_u16(), b.0.as_u16()), (200, 200));
    assert_eq!(prompt_speed(&proxy).await, None);
    worker.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_stream_that_opens_before_its_first_token_is_not_timed_by_the_clock() {
    // An Anthropic stream opens with `message_start`, which a server may send before it
    // evaluates the prompt: 1,500 tokens "before" it would read as an instant prompt.
    use axum::response::IntoResponse;
    let event = |data: Value| axum::body::Bytes::from(format!("data: {data}\n\n"));
    let backend = serving(
        "/v1/messages",
        post_route(move || async move {
            let events = futures_util::stream::unfold(0u32, move |i| async move {
                let data = match i {
                    0 => json!({"type": "message_start", "message": {"id": "m", "type": "message",
                        "role": "assistant", "model": MODEL, "content": [],
                        "usage": {"input_tokens": 1500, "output_tokens": 0}}}),
                    1 => {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        json!({"type": "content_block_start", "index": 0,
                            "content_block": {"type": "text", "text": ""}})
                    }
                    2..=21 => json!({"type": "content_block_delta", "index": 0,
                        "delta": {"type": "text_delta", "text": "t"}}),
                    22 => json!({"type": "content_block_stop", "index": 0}),
                    23 => json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                        "usage": {"output_tokens": 21}}),
                    24 => json!({"type": "message_stop"}),
                    _ => return None,
                };
                Some((Ok::<_, std::convert::Infallible>(event(data)), i + 1))
            });
            (
                [("content-type", "text/event-stream")],
                axum::body::Body::from_stream(events),
            )
                .into_response()
        }),
    )
    .await;
    let (proxy, worker) = relayed(&backend).await;
    let body = json!({"model": MODEL, "max_tokens": 64, "stream": true,
        "messages": [{"role": "user", "content": "hello"}]});
    let (status, _, text) = post(&proxy.url(), "/v1/messages", &body).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("message_stop"), "passed through: {text}");
    assert_eq!(prompt_speed(&proxy).await, None);
    worker.stop().await;
    proxy.shutdown().await;
}

/// A chat request of a conversation of its own, with a prompt of about `tokens` tokens (the
/// proxy counts 4 bytes a token).
fn chat_of(conversation: &str, tokens: usize) -> Value {
    let text = format!("{conversation} {}", "word ".repeat(tokens * 4 / 5));
    json!({"model": MODEL, "messages": [{"role": "user", "content": text}]})
}

#[tokio::test]
async fn with_cost_routing_a_box_whose_model_is_unloaded_pays_its_reported_load_time() {
    // Cost routing is on by default: nothing to configure.
    let proxy = start_proxy(test_config()).await;
    let mut boxes = Vec::new();
    for name in ["box-a", "box-b"] {
        let mut worker = ScriptedWorker::connect(proxy.addr).await;
        worker
            .register_message(register_message(name, &[MODEL], 4, Some("1"), Some(0)))
            .await;
        boxes.push(worker);
    }
    // Both measured at 2,000 prompt tokens a second (a new conversation on each).
    for conversation in ["first", "second"] {
        let body = chat_of(conversation, 200);
        let client = spawn_post(&proxy.url(), "/v1/chat/completions", body);
        let (a, b) = boxes.split_at_mut(1);
        let (on, request) = next_request_on_either(&mut a[0], &mut b[0]).await;
        boxes[on].complete_timed(&request.request_id, 2_000.0).await;
        assert_eq!(answer_of(client).await.0, 200);
    }
    // box-a's model map has unloaded the model; loading it took 20 s last time (its pong says).
    let states = vec![ModelStateReport {
        model: MODEL.to_string(),
        state: "idle".to_string(),
        load_ms: Some(20_000),
    }];
    boxes[0]
        .send(&WorkerToServer::Pong(PongMessage {
            current_load: 0,
            timestamp_unix_ms: None,
            hardware: None,
            model_states: Some(states),
        }))
        .await;
    // The pong's states reach the scheduler and then the status page, in that order.
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let (_, status) = get_json(&proxy.url(), "/api/status", &[]).await;
        let reported = status["workers"].as_array().is_some_and(|workers| {
            workers
                .iter()
                .any(|w| w["model_states"][0]["state"] == "idle")
        });
        if reported {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no model states: {status}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // A new conversation of 2,000 tokens: 1 s on either box, 21 s on box-a: box-b takes it,
    // though the usual rule (equal boxes, the lowest id) picks box-a.
    let client = spawn_post(
        &proxy.url(),
        "/v1/chat/completions",
        chat_of("third", 2_000),
    );
    let (a, b) = boxes.split_at_mut(1);
    let (on, request) = next_request_on_either(&mut a[0], &mut b[0]).await;
    assert_eq!(on, 1, "box-b, whose model is loaded");
    // The dashboard says why, with the estimates weighed: about a second here against the
    // 20 s load and the prompt on box-a.
    let (_, status) = get_json(&proxy.url(), "/api/status", &[]).await;
    let placed = &status["in_flight"][0];
    assert_eq!(placed["reason"], "faster_box", "{status}");
    let weighed = &placed["weighed"];
    assert_eq!(weighed["kept"], false, "{weighed}");
    assert_eq!(weighed["other"], "box-a", "{weighed}");
    let (here, there) = (
        weighed["first_token_s"].as_f64().expect("seconds"),
        weighed["other_s"].as_f64().expect("seconds"),
    );
    assert!(here < 2.0 && there > 20.0, "{weighed}");
    assert_eq!(weighed["answer_s"], 0.0, "{weighed}");
    // And counts it among the placements since start, as /metrics does.
    assert_eq!(status["placements"]["cost_routing"], true, "{status}");
    let counted = |reason: &str| {
        status["placements"]["by_reason"]
            .as_array()
            .and_then(|all| all.iter().find(|p| p["reason"] == reason))
            .map(|p| p["count"].clone())
    };
    assert_eq!(counted("faster_box"), Some(json!(1)), "{status}");
    assert_eq!(counted("new_conversation"), Some(json!(2)), "{status}");
    boxes[on].complete_timed(&request.request_id, 2_000.0).await;
    assert_eq!(answer_of(client).await.0, 200);
    let metrics = metrics_text(&proxy.url()).await;
    assert!(
        metrics.contains("modelrelay_placements_total{reason=\"faster_box\"} 1"),
        "{metrics}"
    );
    proxy.shutdown().await;
}

/// Day two for cost routing: what was measured of each box is kept in the proxy's store, so a
/// proxy killed outright or stopped gracefully routes by it before any box answers again (at a
/// home's load a slow box may answer nothing for minutes, and an unmeasured box cannot be
/// compared with the others).
#[tokio::test]
async fn a_restarted_proxy_knows_each_boxs_speed_before_the_box_answers_again() {
    let dir = std::env::temp_dir().join(format!("relay-speeds-{}", std::process::id()));
    let file = dir.join("relay.db");
    let config = || {
        let mut config = test_config();
        config.database = relay_core::store::DatabaseSetting::Sqlite(file.clone());
        config
    };
    let first = start_proxy(config()).await;
    let gpu = answers_timed(&first, None, 2000.0).await;
    // Written at once: a proxy killed now (this one is left running, its box gone) keeps it.
    let db = relay_core::store::Database::open(&relay_core::store::DatabaseSetting::Sqlite(
        file.clone(),
    ))
    .await
    .unwrap();
    let stored = tokio::time::timeout(WAIT, async {
        loop {
            let boxes = relay_core::store::box_speeds::load(&db).await.unwrap();
            if let Some(gpu_a) = boxes.into_iter().find(|b| b.name == "gpu-a") {
                return gpu_a;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the first measurement is stored at once");
    assert_eq!(stored.speeds[MODEL].prompt_tps, Some(2000.0));
    gpu.crash();

    let second = start_proxy(config()).await;
    let mut gpu = ScriptedWorker::connect(second.addr).await;
    gpu.register("gpu-a", &[MODEL], 2).await;
    assert_eq!(
        prompt_speed(&second).await,
        Some(2000.0),
        "known before any answer"
    );
    // Two more answers, at 1,000 tokens/s: 1,700 then 1,490 (a moving average). The second
    // comes within the store's write interval: only the graceful stop writes it.
    let gpu = answers_timed(&second, Some(gpu), 1000.0).await;
    let gpu = answers_timed(&second, Some(gpu), 1000.0).await;
    gpu.crash();
    second.shutdown().await;

    let third = start_proxy(config()).await;
    let mut gpu = ScriptedWorker::connect(third.addr).await;
    gpu.register("gpu-a", &[MODEL], 2).await;
    assert_eq!(prompt_speed(&third).await, Some(1490.0));
    gpu.crash();
    third.shutdown().await;
    first.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Box "gpu-a" (`worker`, or a new one registered on `proxy`) answers one request with the
/// timings of 1,000 prompt tokens at `prompt_tps`.
async fn answers_timed(
    proxy: &RunningProxy,
    worker: Option<ScriptedWorker>,
    prompt_tps: f64,
) -> ScriptedWorker {
    let mut gpu = match worker {
        Some(worker) => worker,
        None => {
            ScriptedWorker::join(proxy.addr, "gpu-a", &[MODEL], 2)
                .await
                .0
        }
    };
    let url = proxy.url();
    let client =
        tokio::spawn(async move { post(&url, "/v1/chat/completions", &chat_of("c", 10)).await });
    let request = gpu.next_request().await;
    gpu.complete_timed(&request.request_id, prompt_tps).await;
    let (status, _, body) = client.await.unwrap();
    assert_eq!(status, 200, "{body}");
    gpu
}

/// The prompt speed the dashboard shows for the proxy's one worker.
async fn prompt_speed(proxy: &RunningProxy) -> Option<f64> {
    let (code, status) = get_json(&proxy.url(), "/api/status", &[]).await;
    assert_eq!(code, 200);
    status["workers"][0]["speeds"][MODEL]["prompt_tps"].as_f64()
}

/// A llama-server (`/props` signed `llama.cpp`, 4 slots) serving `models`, whose `/completion`
/// answers as if it evaluated 1,000 prompt tokens in 0.4 s and generated 16 in 0.2 s — and a
/// one-token completion (the worker's slot probe) as if it took the whole prompt from its slot's
/// cache when the server `keeps_pins`, none of it otherwise; its base URL and every
/// `/completion` body it got.
async fn warmable_llama_server(
    models: &'static [&'static str],
    keeps_pins: bool,
) -> (String, std::sync::Arc<std::sync::Mutex<Vec<Value>>>) {
    use axum::http::header;
    let completions = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = completions.clone();
    let app = axum::Router::new()
        .route(
            "/v1/models",
            get(move || async move {
                let data: Vec<Value> = models.iter().map(|id| json!({"id": id})).collect();
                axum::Json(json!({"object": "list", "data": data}))
            }),
        )
        .route(
            "/props",
            get(|| async {
                axum::Json(json!({"total_slots": 4,
                    "default_generation_settings": {"n_ctx": 8192}}))
            }),
        )
        .route(
            "/completion",
            post_route(move |body: axum::body::Bytes| {
                let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let probe = body["n_predict"] == 1;
                seen.lock().unwrap().push(body);
                async move {
                    if probe {
                        // Answered well after the warm-up's own catalog refresh has gone out:
                        // the verdict must travel on its own.
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        let cached = if keeps_pins { 100 } else { 0 };
                        return axum::Json(json!({"content": "x", "timings": {
                            "cache_n": cached, "prompt_n": 100 - cached, "prompt_ms": 4.0,
                            "predicted_n": 1, "predicted_ms": 1.0}}));
                    }
                    axum::Json(json!({"content": "x".repeat(16), "timings": {
                        "cache_n": 0, "prompt_n": 1000, "prompt_ms": 400.0,
                        "predicted_n": 16, "predicted_ms": 200.0}}))
                }
            }),
        )
        .layer(axum::middleware::map_response(
            |mut response: axum::response::Response| async move {
                response.headers_mut().insert(
                    header::SERVER,
                    header::HeaderValue::from_static("llama.cpp"),
                );
                response
            },
        ));
    let (addr, _task) = serve_app(app, "127.0.0.1:0".parse().unwrap()).await;
    (format!("http://{addr}"), completions)
}

#[tokio::test]
async fn a_llama_server_is_warmed_up_when_its_worker_starts_so_the_proxy_knows_its_speed_before_any_request(
) {
    // The models as the backend lists them, and as the owner names them (`--models`).
    for named in [None, Some(&[MODEL][..])] {
        warmed_up_once(named).await;
    }
}

async fn warmed_up_once(named: Option<&[&str]>) {
    let (backend, completions) = warmable_llama_server(&[MODEL], false).await;
    let proxy = start_proxy(test_config()).await;
    let worker = RunningWorker::start(&proxy, &backend, named, 2);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while prompt_speed(&proxy).await != Some(2500.0) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the warm-up's speed never reached the proxy (models named: {named:?})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_, status) = get_json(&proxy.url(), "/api/status", &[]).await;
    let speed = &status["workers"][0]["speeds"][MODEL];
    assert_eq!(speed["generation_tps"], 80.0, "{status}");
    assert!(
        speed["typical_output"].is_null(),
        "a warm-up's answer is nobody's: {status}"
    );
    // Several catalog refreshes later (every 300 ms here), still the one warm-up (beside the
    // slot probe's one-token completions, which follow it).
    tokio::time::sleep(Duration::from_millis(900)).await;
    let bodies: Vec<Value> = completions
        .lock()
        .unwrap()
        .iter()
        .filter(|body| body["n_predict"] != 1)
        .cloned()
        .collect();
    assert_eq!(bodies.len(), 1, "one warm-up per server: {bodies:?}");
    let body = &bodies[0];
    assert_eq!(body["n_predict"], 16);
    assert_eq!(body["ignore_eos"], true);
    assert_eq!(body["cache_prompt"], false);
    assert_eq!(
        body["id_slot"], 3,
        "the last slot, away from the probe's 0 and 1"
    );
    let words = body["prompt"].as_str().unwrap().split_whitespace().count();
    assert!(
        (700..=800).contains(&words),
        "about a thousand tokens: {words} words"
    );
    let metrics = metrics_text(&proxy.url()).await;
    assert!(
        !metrics.contains("modelrelay_placements_total{reason=\"new_conversation\"} 1"),
        "no request was routed: {metrics}"
    );
    worker.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_worker_says_its_llama_server_evaluates_side_requests_first_once_its_slots_are_probed_after_the_warm_up(
) {
    for keeps_pins in [true, false] {
        let (backend, completions) = warmable_llama_server(&[MODEL], keeps_pins).await;
        let proxy = start_proxy(test_config()).await;
        // No periodic catalog refresh comes within the test: the worker tells the proxy
        // because the probe answered, not because it happened to read its catalog again.
        let mut config = relay_core::worker::WorkerConfig::new(&proxy.url(), SECRET, &backend);
        config.max_concurrent = 2;
        config.model_refresh_interval = Duration::from_secs(600);
        let worker = RunningWorker::start_with(config);
        // Before any request: the slot probe runs once the warm-up is done, and the worker
        // tells the proxy what it found.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let probed = completions
                .lock()
                .unwrap()
                .iter()
                .filter(|body| body["n_predict"] == 1)
                .count();
            let (_, status) = get_json(&proxy.url(), "/api/status", &[]).await;
            let sides_first = status["workers"][0]["speeds"][MODEL]["sides_first"].as_bool();
            if probed == 3 && sides_first == Some(keeps_pins) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "keeps pins {keeps_pins}: {probed} probe completions, {status}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let bodies = completions.lock().unwrap().clone();
        assert_eq!(
            bodies[0]["n_predict"], 16,
            "the warm-up first, alone: the probe's prompts beside it would slow it: {bodies:?}"
        );
        // A server that clears pinned slots gets no hints: its side requests go wherever
        // llama-server puts them, and nothing says they go first.
        worker.stop().await;
        proxy.shutdown().await;
    }
}

#[tokio::test]
async fn a_llama_server_serving_several_models_is_not_warmed_up() {
    // Its router mode loads a model on request: a warm-up could start one nobody asked for.
    let (backend, completions) = warmable_llama_server(&[MODEL, "another-model"], false).await;
    let proxy = start_proxy(test_config()).await;
    let worker = RunningWorker::start(&proxy, &backend, None, 2);
    wait_until("the worker registers", || proxy.hub.models().len() == 2).await;
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(completions.lock().unwrap().is_empty());
    assert_eq!(prompt_speed(&proxy).await, None);
    worker.stop().await;
    proxy.shutdown().await;
}
