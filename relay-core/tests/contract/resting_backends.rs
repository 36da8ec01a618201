//! Backends the relay does not manage that unload their model by themselves (issue 29's "a box
//! that has the model unloaded"): a llama-server started with `--sleep-idle-seconds` says
//! `is_sleeping` in `GET /props`; one in router mode says each model's `status` in
//! `GET /v1/models`; Ollama lists its loaded models in `GET /api/ps`. The real
//! worker watches them, measures the load on the request that wakes the model, and reports
//! both in its pongs; the proxy's cost routing then weighs the load against a slower box.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::header;
use axum::routing::{get, post as post_route};
use relay_core::proxy::RunningProxy;
use relay_core::worker::WorkerConfig;
use serde_json::{json, Value};

use crate::support::*;

const MODEL: &str = "resting-model";

/// How long the mock takes to load its model when a request finds it unloaded.
const LOAD: Duration = Duration::from_millis(1200);

/// A backend that unloads its model by itself, as `dialect` says it; its prompt speed (in its
/// answers' `timings`), whether its model is unloaded now, and the requests it answered.
struct Resting {
    url: String,
    unloaded: Arc<AtomicBool>,
    answered: Arc<AtomicUsize>,
    /// Requests saying [`HOLD`] wait for a permit here before they are answered.
    held: Arc<tokio::sync::Semaphore>,
    /// Requests saying [`HOLD`] that arrived.
    holding: Arc<AtomicUsize>,
}

/// A request whose text says this is answered only once the test lets it ([`Resting::release`]).
const HOLD: &str = "[hold]";

/// Prompt tokens in each answer's usage.
const PROMPT: u32 = 500;

/// An answer to a chat completion of [`PROMPT`] tokens at `prompt_tps`: llama-server says how
/// long it took in `timings`; Ollama says nothing of time, and streams (the worker then times
/// it by the clock), its first event after the prompt's evaluation.
async fn answer(dialect: Dialect, prompt_tps: f64) -> axum::response::Response {
    use axum::response::IntoResponse;
    let prompt_ms = f64::from(PROMPT) * 1000.0 / prompt_tps;
    let usage = json!({"prompt_tokens": PROMPT, "completion_tokens": 16});
    if let Dialect::Ollama = dialect {
        tokio::time::sleep(Duration::from_secs_f64(prompt_ms / 1000.0)).await;
        let chunk = |delta: Value, usage: Value| {
            json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": MODEL,
                   "choices": [{"index": 0, "delta": delta, "finish_reason": null}],
                   "usage": usage})
        };
        let (first, last) = (
            chunk(json!({"role": "assistant", "content": "hi"}), Value::Null),
            chunk(json!({}), usage),
        );
        let text = format!("data: {first}\n\ndata: {last}\n\ndata: [DONE]\n\n");
        return ([(header::CONTENT_TYPE, "text/event-stream")], text).into_response();
    }
    axum::Json(json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": MODEL,
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "hi"}}],
        "usage": usage,
        "timings": {"cache_n": 0, "prompt_n": PROMPT, "prompt_ms": prompt_ms,
                    "predicted_n": 16, "predicted_ms": 40.0}
    }))
    .into_response()
}

#[derive(Clone, Copy, Debug)]
enum Dialect {
    /// `GET /props` signed `llama.cpp`, with `is_sleeping`.
    LlamaServer,
    /// `GET /v1/models` signed `llama.cpp`, with each model's `status`.
    LlamaRouter,
    /// `GET /api/ps` listing the loaded models.
    Ollama,
}

impl Resting {
    async fn start(dialect: Dialect, prompt_tps: f64) -> Resting {
        Resting::start_loading(dialect, prompt_tps, LOAD).await
    }

    /// [`Resting::start`], loading its model in `load`.
    async fn start_loading(dialect: Dialect, prompt_tps: f64, load: Duration) -> Resting {
        let unloaded = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicUsize::new(0));
        let (asleep, wake, count) = (unloaded.clone(), unloaded.clone(), answered.clone());
        let held = Arc::new(tokio::sync::Semaphore::new(0));
        let holding = Arc::new(AtomicUsize::new(0));
        let (gate, arrived) = (held.clone(), holding.clone());
        let listed = unloaded.clone();
        let mut app = axum::Router::new()
            .route(
                "/v1/models",
                get(move || {
                    let mut model = json!({"id": MODEL});
                    if let Dialect::LlamaRouter = dialect {
                        let status = if listed.load(Ordering::SeqCst) {
                            "unloaded"
                        } else {
                            "loaded"
                        };
                        model["status"] = json!({"value": status, "args": []});
                    }
                    async move {
                        (
                            [(header::SERVER, "llama.cpp")],
                            axum::Json(json!({"object": "list", "data": [model]})),
                        )
                    }
                }),
            )
            .route(
                "/v1/chat/completions",
                post_route(move |body: String| {
                    let (wake, count) = (wake.clone(), count.clone());
                    let (gate, arrived) = (gate.clone(), arrived.clone());
                    async move {
                        if body.contains(HOLD) {
                            arrived.fetch_add(1, Ordering::SeqCst);
                            gate.acquire().await.expect("open").forget();
                        }
                        if wake.load(Ordering::SeqCst) {
                            tokio::time::sleep(load).await;
                            wake.store(false, Ordering::SeqCst);
                        }
                        count.fetch_add(1, Ordering::SeqCst);
                        answer(dialect, prompt_tps).await
                    }
                }),
            );
        app = match dialect {
            Dialect::LlamaRouter => app,
            Dialect::LlamaServer => app.route(
                "/props",
                get(move || {
                    let sleeping = asleep.load(Ordering::SeqCst);
                    async move {
                        (
                            [(header::SERVER, "llama.cpp")],
                            axum::Json(json!({"default_generation_settings": {"n_ctx": 8192},
                                              "is_sleeping": sleeping})),
                        )
                    }
                }),
            ),
            Dialect::Ollama => app.route(
                "/api/ps",
                get(move || {
                    // Its keep-alive always just over: the worker asks again within a second.
                    let running: Vec<Value> = if asleep.load(Ordering::SeqCst) {
                        Vec::new()
                    } else {
                        vec![json!({"name": MODEL, "model": MODEL, "size_vram": 1,
                                    "expires_at": "2020-01-01T00:00:00Z"})]
                    };
                    async move { axum::Json(json!({ "models": running })) }
                }),
            ),
        };
        let (addr, _task) = serve_app(app, "127.0.0.1:0".parse().unwrap()).await;
        Resting {
            url: format!("http://{addr}"),
            unloaded,
            answered,
            held,
            holding,
        }
    }

    fn unload(&self, unloaded: bool) {
        self.unloaded.store(unloaded, Ordering::SeqCst);
    }

    fn answered(&self) -> usize {
        self.answered.load(Ordering::SeqCst)
    }

    /// Lets one request saying [`HOLD`] be answered.
    fn release(&self) {
        self.held.add_permits(1);
    }
}

/// A real worker named `name` in front of `backend`, asking it what it unloaded twenty times
/// a second (an Ollama with nothing running: every 3 s).
fn worker(proxy: &RunningProxy, name: &str, backend: &Resting) -> RunningWorker {
    RunningWorker::start_with(worker_config(proxy, name, backend))
}

/// The configuration of [`worker`].
fn worker_config(proxy: &RunningProxy, name: &str, backend: &Resting) -> WorkerConfig {
    let mut config = WorkerConfig::new(&proxy.url(), SECRET, &backend.url);
    config.name = name.to_string();
    config.max_concurrent = 2;
    config.model_refresh_interval = Duration::from_millis(300);
    config.unload_poll_interval = Duration::from_millis(50);
    config
}

/// Waits until the dashboard shows `worker`'s model in `state`; returns the load time it says.
async fn shown(proxy: &RunningProxy, worker: &str, state: &str) -> Option<u64> {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let (_, status) = get_json(&proxy.url(), "/api/status", &[]).await;
        let seen = status["workers"]
            .as_array()
            .and_then(|all| all.iter().find(|w| w["name"] == worker))
            .map(|w| w["model_states"].clone())
            .unwrap_or(Value::Null);
        if seen[0]["model"] == MODEL && seen[0]["state"] == state {
            return seen[0]["load_ms"].as_u64();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{worker}'s model never shown {state}: {seen}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A new conversation of about [`PROMPT`] tokens, as the proxy estimates them; streamed to
/// Ollama, whose answers are timed by the clock only when streamed.
fn chat(dialect: Dialect, conversation: &str) -> Value {
    let text = format!("{conversation} {}", "word ".repeat(400));
    let stream = matches!(dialect, Dialect::Ollama);
    json!({"model": MODEL, "stream": stream, "messages": [{"role": "user", "content": text}]})
}

/// The second turn of [`chat`]'s `conversation`.
fn second_turn(dialect: Dialect, conversation: &str) -> Value {
    let mut chat = chat(dialect, conversation);
    let messages = chat["messages"].as_array_mut().unwrap();
    messages.push(json!({"role": "assistant", "content": "hi"}));
    messages.push(json!({"role": "user", "content": "and then?"}));
    chat
}

async fn ask(proxy: &RunningProxy, dialect: Dialect, conversation: &str) {
    let chat = chat(dialect, conversation);
    let (status, _, body) = post(&proxy.url(), "/v1/chat/completions", &chat).await;
    assert_eq!(status, 200, "{body}");
}

/// box-a's `backend`, loaded, answers once, then frees its model: the dashboard says so. The
/// request that finds it unloaded waits for the load, and measures it: its time less the prompt
/// and answer its timings report (or, from Ollama, its time to the first event less the prompt
/// at the speed measured before). Returns the load's milliseconds as shown.
async fn unloads_and_is_timed_loading(
    proxy: &RunningProxy,
    dialect: Dialect,
    backend: &Resting,
) -> u64 {
    ask(proxy, dialect, "first").await;
    backend.unload(true);
    assert_eq!(shown(proxy, "box-a", "unloaded").await, None, "{dialect:?}");
    ask(proxy, dialect, "second").await;
    let load = shown(proxy, "box-a", "loaded").await.expect("a load time");
    assert!((1_100..5_000).contains(&load), "{dialect:?}: {load} ms");
    load
}

#[tokio::test]
async fn a_backend_that_unloads_its_model_by_itself_is_reported_and_its_measured_load_weighed() {
    for dialect in [Dialect::LlamaServer, Dialect::LlamaRouter, Dialect::Ollama] {
        unloads_and_is_weighed(dialect).await;
    }
}

async fn unloads_and_is_weighed(dialect: Dialect) {
    // The proxy pings once a minute: every state below reaches it in a `models_update` the
    // worker sends as soon as it learns of it, not in a pong.
    let mut config = test_config();
    config.heartbeat_interval = Duration::from_secs(60);
    config.heartbeat_timeout = Duration::from_secs(120);
    let proxy = start_proxy(config).await;
    // box-a evaluates 10,000 prompt tokens a second, box-b 1,000.
    let (fast, slow) = (
        Resting::start(dialect, 10_000.0).await,
        Resting::start(dialect, 1_000.0).await,
    );
    // box-b answers once alone, then leaves: the proxy keeps its speed by its name.
    let box_b = worker(&proxy, "box-b", &slow);
    shown(&proxy, "box-b", "loaded").await;
    ask(&proxy, dialect, "zeroth").await;
    box_b.stop().await;
    wait_until("box-b left", || proxy.hub.models().is_empty()).await;

    let box_a = worker(&proxy, "box-a", &fast);
    assert_eq!(shown(&proxy, "box-a", "loaded").await, None, "{dialect:?}");
    let load = unloads_and_is_timed_loading(&proxy, dialect, &fast).await;
    let box_b = worker(&proxy, "box-b", &slow);
    shown(&proxy, "box-b", "loaded").await;

    // box-a unloads again: the second turn of the conversation it holds waits there 1.2 s for
    // the load and 0.05 s for its whole prompt (the cache went with the model), against 0.5 s
    // on box-b. box-b takes it, though it is not the conversation's home.
    fast.unload(true);
    assert_eq!(shown(&proxy, "box-a", "unloaded").await, Some(load));
    let (on_fast, on_slow) = (fast.answered(), slow.answered());
    let turn = second_turn(dialect, "second");
    let (status, _, body) = post(&proxy.url(), "/v1/chat/completions", &turn).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (fast.answered(), slow.answered()),
        (on_fast, on_slow + 1),
        "{dialect:?}: the slower box, whose model is loaded"
    );
    let metrics = metrics_text(&proxy.url()).await;
    assert!(
        metrics.contains("modelrelay_placements_total{reason=\"faster_box\"} 1"),
        "{metrics}"
    );
    // Loaded again (another client woke it): the fast box is sooner.
    fast.unload(false);
    shown(&proxy, "box-a", "loaded").await;
    ask(&proxy, dialect, "sixth").await;
    assert_eq!(fast.answered(), on_fast + 1, "{dialect:?}");
    box_a.stop().await;
    box_b.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_backend_serving_models_the_owner_named_is_watched_too() {
    // `--models` advertises the named models without waiting for any backend: whether their
    // backend unloads them by itself is read in the background, and they are watched as any.
    for dialect in [Dialect::LlamaServer, Dialect::Ollama] {
        let proxy = start_proxy(test_config()).await;
        let backend = Resting::start(dialect, 10_000.0).await;
        let mut config = worker_config(&proxy, "box-a", &backend);
        config.models = Some(vec![MODEL.to_string()]);
        let box_a = RunningWorker::start_with(config);
        shown(&proxy, "box-a", "loaded").await;
        unloads_and_is_timed_loading(&proxy, dialect, &backend).await;
        box_a.stop().await;
        proxy.shutdown().await;
    }
}

/// How long box-b's model takes to load in the test of a request waiting for a full box: long
/// enough that the request waits for box-a (it gives up after half of what waiting could save,
/// about 2 s) well past the moment box-a frees a slot.
const SLOW_LOAD: Duration = Duration::from_secs(4);

#[tokio::test]
async fn a_request_waits_for_a_full_box_whose_model_is_loaded_rather_than_load_it_on_a_slower_one()
{
    let dialect = Dialect::LlamaServer;
    let proxy = start_proxy(test_config()).await;
    let (fast, slow) = (
        Resting::start(dialect, 10_000.0).await,
        Resting::start_loading(dialect, 1_000.0, SLOW_LOAD).await,
    );
    // box-b is measured, unloads, is timed loading (4 s) and unloads again.
    let box_b = worker(&proxy, "box-b", &slow);
    shown(&proxy, "box-b", "loaded").await;
    ask(&proxy, dialect, "zeroth").await;
    slow.unload(true);
    shown(&proxy, "box-b", "unloaded").await;
    ask(&proxy, dialect, "first").await;
    shown(&proxy, "box-b", "loaded").await.expect("a load time");
    slow.unload(true);
    shown(&proxy, "box-b", "unloaded").await;
    // box-a is measured, then both its slots are taken by answers held back.
    let box_a = worker(&proxy, "box-a", &fast);
    shown(&proxy, "box-a", "loaded").await;
    ask(&proxy, dialect, "second").await;
    assert_eq!(
        fast.answered(),
        1,
        "box-b must load: box-a takes the new conversation"
    );
    let held: Vec<_> = ["third", "fourth"]
        .into_iter()
        .map(|conversation| {
            let (url, chat) = (
                proxy.url(),
                chat(dialect, &format!("{HOLD} {conversation}")),
            );
            tokio::spawn(async move { post(&url, "/v1/chat/completions", &chat).await.0 })
        })
        .collect();
    wait_until("box-a holds two answers", || {
        fast.holding.load(Ordering::SeqCst) == 2
    })
    .await;
    let faster_box = |metrics: &str| {
        let line = "modelrelay_placements_total{reason=\"faster_box\"} ";
        let count = metrics.lines().find_map(|l| l.strip_prefix(line));
        count.map_or(0, |n| n.trim().parse::<u64>().expect("a count"))
    };
    let before = faster_box(&metrics_text(&proxy.url()).await);

    // A new conversation: box-b has a free slot, but must load the model (4 s and the whole
    // prompt); box-a frees a slot in a moment, as measured. It waits for box-a.
    let (url, fifth) = (proxy.url(), chat(dialect, "fifth"));
    let fifth = tokio::spawn(async move { post(&url, "/v1/chat/completions", &fifth).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!fifth.is_finished());
    fast.release();
    let (status, _, body) = fifth.await.expect("answered");
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (fast.answered(), slow.answered()),
        (3, 2),
        "box-a answered a held request and the fifth; box-b loaded nothing"
    );
    assert!(shown(&proxy, "box-b", "unloaded").await.is_some());
    let after = faster_box(&metrics_text(&proxy.url()).await);
    assert_eq!(after, before + 1, "the wait counts as a faster box");
    fast.release();
    for request in held {
        assert_eq!(request.await.expect("answered"), 200);
    }
    box_a.stop().await;
    box_b.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn an_ollama_is_asked_again_only_when_its_model_is_due_to_unload() {
    // Ollama logs every request it gets: asked every tick, its log would fill with the worker's
    // questions. A model kept loaded for ever is due in centuries: asked every 60 ticks.
    let asked = Arc::new(AtomicUsize::new(0));
    let count = asked.clone();
    let app = axum::Router::new()
        .route(
            "/v1/models",
            get(|| async { axum::Json(json!({"object": "list", "data": [{"id": MODEL}]})) }),
        )
        .route(
            "/api/ps",
            get(move || {
                count.fetch_add(1, Ordering::SeqCst);
                async {
                    axum::Json(json!({"models": [{"name": MODEL, "model": MODEL,
                                                  "expires_at": "2318-01-01T00:00:00Z"}]}))
                }
            }),
        );
    let (addr, _task) = serve_app(app, "127.0.0.1:0".parse().unwrap()).await;
    let backend = Resting {
        url: format!("http://{addr}"),
        unloaded: Arc::default(),
        answered: Arc::default(),
        held: Arc::new(tokio::sync::Semaphore::new(0)),
        holding: Arc::default(),
    };
    let proxy = start_proxy(test_config()).await;
    let box_a = worker(&proxy, "box-a", &backend);
    shown(&proxy, "box-a", "loaded").await;
    // Shown once it was asked (the catalog's own look at its windows aside).
    let before = asked.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let during = asked.load(Ordering::SeqCst) - before;
    assert!(during <= 1, "asked {during} times in 2 s at a 50 ms tick");
    box_a.stop().await;
    proxy.shutdown().await;
}
