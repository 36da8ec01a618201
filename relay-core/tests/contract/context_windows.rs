//! Context windows are known and respected (issue "Nothing but the URL"): a worker learns its
//! backend's window (llama-server's `/props`, vLLM's `max_model_len`, Ollama's `/api/ps` and
//! `/api/show`, or `context_window` in its settings) and reports it (an extension field of
//! `register` and `models_update`); the proxy sends a long prompt to a worker whose window holds
//! it, and refuses one far beyond every window at once, in the shape Claude Code compacts on.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use axum::http::header;
use axum::routing::get;
use axum::{Json, Router};
use relay_core::protocol::{RegisterMessage, ServerToWorker, WorkerToServer};
use serde_json::{json, Value};

use crate::support::*;

/// A scripted worker serving `m` whose window for it is `window` (unknown with `None`).
async fn worker_with_window(
    proxy: &relay_core::proxy::RunningProxy,
    name: &str,
    window: Option<u32>,
) -> ScriptedWorker {
    worker_with_window_and_slots(proxy, name, window, 4).await
}

/// [`worker_with_window`] with `slots` requests at once.
async fn worker_with_window_and_slots(
    proxy: &relay_core::proxy::RunningProxy,
    name: &str,
    window: Option<u32>,
    slots: u32,
) -> ScriptedWorker {
    let mut worker = ScriptedWorker::connect(proxy.addr).await;
    worker
        .send(&WorkerToServer::Register(RegisterMessage {
            warm_ups: None,
            sides_first: None,
            worker_name: name.to_string(),
            models: vec!["m".to_string()],
            max_concurrent: slots,
            protocol_version: Some("1".to_string()),
            current_load: Some(0),
            mac_address: None,
            sleeps_when_idle: None,
            context_windows: window.map(|tokens| BTreeMap::from([("m".to_string(), tokens)])),
        }))
        .await;
    match worker.recv().await {
        ServerToWorker::RegisterAck(_) => worker,
        other => panic!("expected register_ack, got {other:?}"),
    }
}

/// `GET /v1/models` listing `model`, the start of every mock backend here.
fn listing(model: &'static str) -> Router {
    Router::new().route(
        "/v1/models",
        get(move || async move {
            Json(json!({"object": "list", "data": [{"id": model, "object": "model"}]}))
        }),
    )
}

/// A proxy and a real worker in front of `backend` (which lists one model); the backend's
/// task, to abort at the end.
async fn real_worker_for(
    backend: Router,
) -> (
    relay_core::proxy::RunningProxy,
    RunningWorker,
    tokio::task::JoinHandle<()>,
) {
    let (addr, task) = serve_app(backend, "127.0.0.1:0".parse().unwrap()).await;
    let proxy = start_proxy(test_config()).await;
    let worker = RunningWorker::start(&proxy, &format!("http://{addr}"), None, 2);
    wait_until("the worker registers", || proxy.hub.models().len() == 1).await;
    (proxy, worker, task)
}

/// A chat request whose body is about `tokens` × 4 bytes.
fn prompt_of(tokens: usize) -> Value {
    json!({"model": "m", "max_tokens": 8,
           "messages": [{"role": "user", "content": "x".repeat(tokens * 4)}]})
}

#[tokio::test]
async fn a_long_prompt_goes_to_the_worker_whose_window_holds_it() {
    let proxy = start_proxy(test_config()).await;
    let mut small = worker_with_window(&proxy, "small", Some(1_000)).await;
    let mut large = worker_with_window(&proxy, "large", Some(8_000)).await;
    wait_until("both workers joined", || proxy.hub.counts().0 == 2).await;
    for _ in 0..3 {
        let client = spawn_post(&proxy.url(), "/v1/chat/completions", prompt_of(3_000));
        let request = large.next_request().await;
        large.complete(&request.request_id, r#"{"ok":true}"#).await;
        assert_eq!(answer_of(client).await.0, 200);
    }
    // Short prompts go to either.
    let client = spawn_post(&proxy.url(), "/v1/chat/completions", prompt_of(10));
    let (which, request) = next_request_on_either(&mut small, &mut large).await;
    if which == 0 {
        small.complete(&request.request_id, r#"{"ok":true}"#).await;
    } else {
        large.complete(&request.request_id, r#"{"ok":true}"#).await;
    }
    assert_eq!(answer_of(client).await.0, 200);
    // The dashboard shows each worker's window.
    let (_, status) = get_json(&proxy.url(), "/api/status", &[]).await;
    let windows: Vec<Value> = status["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["context_windows"]["m"].clone())
        .collect();
    assert_eq!(windows, [json!(1_000), json!(8_000)], "{status}");
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_prompt_far_beyond_every_window_is_refused_at_once_in_claude_codes_shape() {
    let proxy = start_proxy(test_config()).await;
    let _small = worker_with_window(&proxy, "small", Some(1_000)).await;
    let _large = worker_with_window(&proxy, "large", Some(8_000)).await;
    wait_until("both workers joined", || proxy.hub.counts().0 == 2).await;
    let started = Instant::now();
    let (status, _, text) = post_raw(
        &proxy.url(),
        "/v1/messages",
        prompt_of(20_000).to_string(),
        &[("anthropic-version", "2023-06-01")],
    )
    .await;
    let took = started.elapsed();
    assert_eq!(status, 400, "{text}");
    assert!(took < Duration::from_millis(50), "refused after {took:?}");
    let error: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "invalid_request_error");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("prompt is too long: ") && message.contains("> 8000 maximum"),
        "{message}"
    );
    let (status, _, text) = post(&proxy.url(), "/v1/chat/completions", &prompt_of(20_000)).await;
    assert_eq!(status, 400);
    let error: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(error["error"]["code"], "context_length_exceeded", "{text}");
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_worker_whose_window_is_unknown_takes_what_no_known_window_holds() {
    let proxy = start_proxy(test_config()).await;
    let _small = worker_with_window(&proxy, "small", Some(1_000)).await;
    let mut unknown = worker_with_window(&proxy, "unknown", None).await;
    wait_until("both workers joined", || proxy.hub.counts().0 == 2).await;
    let client = spawn_post(&proxy.url(), "/v1/chat/completions", prompt_of(20_000));
    let request = unknown.next_request().await;
    unknown
        .complete(&request.request_id, r#"{"ok":true}"#)
        .await;
    assert_eq!(
        answer_of(client).await.0,
        200,
        "not refused: a window is unknown"
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn the_real_worker_learns_windows_from_llama_server_vllm_and_ollama() {
    // One backend like llama-server (/props, Server: llama.cpp), one like vLLM (max_model_len).
    let llama = listing("llama-model").route(
        "/props",
        get(|| async {
            (
                [(header::SERVER, "llama.cpp")],
                Json(json!({"default_generation_settings": {"n_ctx": 4096}, "total_slots": 1})),
            )
        }),
    );
    let vllm = Router::new().route(
        "/v1/models",
        get(|| async {
            Json(json!({"object": "list", "data": [
                {"id": "vllm-model", "object": "model", "owned_by": "vllm", "max_model_len": 32768}]}))
        }),
    );
    // One like Ollama: a loaded model in /api/ps, the others described by POST /api/show (a
    // `num_ctx` parameter, or only the architecture's maximum).
    let ollama = Router::new()
        .route(
            "/v1/models",
            get(|| async {
                Json(json!({"object": "list", "data": [
                    {"id": "loaded:7b", "object": "model", "owned_by": "library"},
                    {"id": "tuned:3b", "object": "model", "owned_by": "library"},
                    {"id": "plain:1b", "object": "model", "owned_by": "library"}]}))
            }),
        )
        .route(
            "/api/ps",
            get(|| async {
                Json(
                    json!({"models": [{"name": "loaded:7b", "model": "loaded:7b",
                    "context_length": 8192, "size_vram": 1}]}),
                )
            }),
        )
        .route(
            "/api/show",
            axum::routing::post(|Json(asked): Json<Value>| async move {
                match asked["model"].as_str() {
                    Some("tuned:3b") => Json(json!({
                        "parameters": "stop \"<|im_end|>\"\nnum_ctx 16384\ntemperature 0.7",
                        "model_info": {"qwen2.context_length": 32768}})),
                    Some("plain:1b") => Json(json!({
                        "parameters": "temperature 1",
                        "model_info": {"general.architecture": "llama",
                                       "llama.context_length": 131072}})),
                    _ => Json(json!({"error": "loaded models are read from /api/ps"})),
                }
            }),
        );
    let (llama_addr, llama_task) = serve_app(llama, "127.0.0.1:0".parse().unwrap()).await;
    let (vllm_addr, vllm_task) = serve_app(vllm, "127.0.0.1:0".parse().unwrap()).await;
    let (ollama_addr, ollama_task) = serve_app(ollama, "127.0.0.1:0".parse().unwrap()).await;
    let proxy = start_proxy(test_config()).await;
    let mut config = relay_core::worker::WorkerConfig::new(
        &proxy.url(),
        SECRET,
        &format!("http://{llama_addr}"),
    );
    config.backends = relay_core::worker::Backends::Fixed(vec![
        format!("http://{llama_addr}"),
        format!("http://{vllm_addr}"),
        format!("http://{ollama_addr}"),
    ]);
    let worker = RunningWorker::start_with(config);
    wait_until("the worker registers all five models", || {
        proxy.hub.models().len() == 5
    })
    .await;
    let (_, status) = get_json(&proxy.url(), "/api/status", &[]).await;
    assert_eq!(
        status["workers"][0]["context_windows"],
        json!({"llama-model": 4096, "vllm-model": 32768,
               "loaded:7b": 8192, "tuned:3b": 16384, "plain:1b": 131072}),
        "{status}"
    );
    worker.stop().await;
    proxy.shutdown().await;
    llama_task.abort();
    vllm_task.abort();
    ollama_task.abort();
}

#[tokio::test]
async fn a_backends_own_context_refusal_reaches_the_client_in_claude_codes_words() {
    // llama-server's own refusal, for a prompt between the window and what the proxy refuses
    // by itself: its tokenizer has the last word.
    let refusal = r#"{"error":{"code":400,"message":"request (9412 tokens) exceeds the available context size (8192 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":9412,"n_ctx":8192}}"#;
    let refuse = move || async move {
        (
            axum::http::StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, "application/json")],
            refusal,
        )
    };
    let in_claude_codes_words = |text: &str| {
        let error: Value = serde_json::from_str(text).unwrap();
        assert_eq!(error["type"], "error", "{text}");
        assert_eq!(error["error"]["type"], "invalid_request_error", "{text}");
        assert_eq!(
            error["error"]["message"],
            "prompt is too long: 9412 tokens > 8192 maximum"
        );
    };
    // A chat-only backend: Anthropic Messages are translated, Chat Completions pass through.
    let chat_only = listing("m").route("/v1/chat/completions", axum::routing::post(refuse));
    // A backend with its own /v1/messages (llama-server's): probed, then passed through.
    let native = listing("m")
        .route("/v1/chat/completions", axum::routing::post(refuse))
        .route("/v1/messages", axum::routing::post(refuse));
    for (backend, messages_asked) in [(chat_only, 1), (native, 2)] {
        let (proxy, worker, task) = real_worker_for(backend).await;
        for _ in 0..messages_asked {
            let (status, _, text) = post_raw(
                &proxy.url(),
                "/v1/messages",
                prompt_of(10).to_string(),
                &[("anthropic-version", "2023-06-01")],
            )
            .await;
            assert_eq!(status, 400, "{text}");
            in_claude_codes_words(&text);
        }
        let (status, _, text) = post(&proxy.url(), "/v1/chat/completions", &prompt_of(10)).await;
        assert_eq!(status, 400);
        let error: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(error["error"]["code"], "context_length_exceeded", "{text}");
        worker.stop().await;
        proxy.shutdown().await;
        task.abort();
    }
}

#[tokio::test]
async fn a_queued_long_prompt_waits_for_a_window_that_holds_it_while_short_ones_pass() {
    let proxy = start_proxy(test_config()).await;
    let mut small = worker_with_window_and_slots(&proxy, "small", Some(1_000), 1).await;
    let mut large = worker_with_window_and_slots(&proxy, "large", Some(8_000), 1).await;
    wait_until("both workers joined", || proxy.hub.counts().0 == 2).await;
    // Both busy: a long prompt on the large worker (the only one holding it), a short one on
    // the small worker.
    let first_long = spawn_post(&proxy.url(), "/v1/chat/completions", prompt_of(3_000));
    let on_large = large.next_request().await;
    let first_short = spawn_post(&proxy.url(), "/v1/chat/completions", prompt_of(10));
    let on_small = small.next_request().await;
    // Another long prompt queues first, a short one behind it.
    let long = spawn_post(&proxy.url(), "/v1/chat/completions", prompt_of(3_000));
    wait_until("the long prompt waits", || proxy.hub.counts().1 == 1).await;
    let short = spawn_post(&proxy.url(), "/v1/chat/completions", prompt_of(20));
    wait_until("both wait", || proxy.hub.counts().1 == 2).await;
    // The small worker frees up: it takes the short prompt, not the long one ahead of it.
    small.complete(&on_small.request_id, r#"{"ok":true}"#).await;
    assert_eq!(answer_of(first_short).await.0, 200);
    let next = small.next_request().await;
    assert!(
        next.body.len() < 1_000,
        "the small worker got the short prompt"
    );
    small.complete(&next.request_id, r#"{"ok":true}"#).await;
    assert_eq!(answer_of(short).await.0, 200);
    assert_eq!(proxy.hub.counts().1, 1, "the long prompt still waits");
    // The large one frees up: the long prompt goes there.
    large.complete(&on_large.request_id, r#"{"ok":true}"#).await;
    assert_eq!(answer_of(first_long).await.0, 200);
    let next = large.next_request().await;
    assert!(
        next.body.len() > 10_000,
        "the large worker got the long prompt"
    );
    large.complete(&next.request_id, r#"{"ok":true}"#).await;
    assert_eq!(answer_of(long).await.0, 200);
    proxy.shutdown().await;
}

#[tokio::test]
async fn count_tokens_counts_with_the_backends_own_tokenizer_where_it_has_one() {
    // vLLM has no /v1/messages/count_tokens but tokenizes chat messages at /tokenize.
    let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Value>::new()));
    let seen = asked.clone();
    let backend = listing("m").route(
        "/tokenize",
        axum::routing::post(move |Json(body): Json<Value>| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(body);
                Json(json!({"count": 42, "max_model_len": 8192, "tokens": []}))
            }
        }),
    );
    assert_eq!(
        count_tokens_through(backend, "hi").await,
        json!({"input_tokens": 42})
    );
    let asked = asked.lock().unwrap().clone();
    assert_eq!(asked[0]["model"], "m");
    assert_eq!(asked[0]["add_generation_prompt"], true);
    assert_eq!(
        asked[0]["messages"][0]["role"], "system",
        "the system prompt is counted"
    );
    assert_eq!(
        asked[0]["tools"][0]["function"]["name"], "t",
        "and the tools"
    );
}

/// `count_tokens` for a short Claude-Code-like request (a system prompt, one tool, `text` from
/// the user), through a real worker to `backend`; the answer, after a 200.
async fn count_tokens_through(backend: Router, text: &str) -> Value {
    let (proxy, worker, task) = real_worker_for(backend).await;
    let count = json!({"model": "m", "system": "be brief",
                       "messages": [{"role": "user", "content": text}],
                       "tools": [{"name": "t", "description": "d", "input_schema": {"type": "object"}}]});
    let (status, _, answer) = post_raw(
        &proxy.url(),
        "/v1/messages/count_tokens",
        count.to_string(),
        &[("anthropic-version", "2023-06-01")],
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    worker.stop().await;
    proxy.shutdown().await;
    task.abort();
    serde_json::from_str(&answer).unwrap()
}

#[tokio::test]
async fn count_tokens_renders_the_chat_with_llama_servers_template_and_counts_that_text() {
    // llama-server: /tokenize takes text (messages get `{"tokens": []}`), /apply-template
    // renders a chat with the model's template (generation prompt included).
    let backend = listing("m")
        .route(
            "/tokenize",
            axum::routing::post(|Json(body): Json<Value>| async move {
                let words = body["content"].as_str().map_or(0, |t| t.split(' ').count());
                Json(json!({"tokens": vec![7; words]}))
            }),
        )
        .route(
            "/apply-template",
            axum::routing::post(|Json(body): Json<Value>| async move {
                let mut prompt = String::new();
                for message in body["messages"].as_array().unwrap() {
                    prompt.push_str(&format!(
                        "<{}> {} ",
                        message["role"].as_str().unwrap(),
                        message["content"].as_str().unwrap()
                    ));
                }
                let tools = body["tools"].as_array().map_or(0, Vec::len);
                prompt.push_str(&format!("tools {tools} <assistant>"));
                Json(json!({ "prompt": prompt }))
            }),
        );
    // "<system> be brief <user> hi there tools 1 <assistant>": 9 words.
    assert_eq!(
        count_tokens_through(backend, "hi there").await,
        json!({"input_tokens": 9})
    );
}
