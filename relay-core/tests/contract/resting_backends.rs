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
        let unloaded = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicUsize::new(0));
        let (asleep, wake, count) = (unloaded.clone(), unloaded.clone(), answered.clone());
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
                post_route(move || {
                    let (wake, count) = (wake.clone(), count.clone());
                    async move {
                        if wake.load(Ordering::SeqCst) {
                            tokio::time::sleep(LOAD).await;
                            wake.store(false, Ordering::SeqCst);
                        }
                        count.fetch_add(1, Ordering::SeqCst);
                        let prompt = 500;
                        axum::Json(json!({
                            "id": "chatcmpl-1", "object": "chat.completion", "model": MODEL,
                            "choices": [{"index": 0, "finish_reason": "stop",
                                         "message": {"role": "assistant", "content": "hi"}}],
                            "usage": {"prompt_tokens": prompt, "completion_tokens": 4},
                            "timings": {"cache_n": 0, "prompt_n": prompt,
                                        "prompt_ms": f64::from(prompt) * 1000.0 / prompt_tps,
                                        "predicted_n": 4, "predicted_ms": 10.0}
                        }))
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
                    let running: Vec<Value> = if asleep.load(Ordering::SeqCst) {
                        Vec::new()
                    } else {
                        vec![json!({"name": MODEL, "model": MODEL, "size_vram": 1})]
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
        }
    }

    fn unload(&self, unloaded: bool) {
        self.unloaded.store(unloaded, Ordering::SeqCst);
    }

    fn answered(&self) -> usize {
        self.answered.load(Ordering::SeqCst)
    }
}

/// A real worker named `name` in front of `backend`, asking it what it unloaded ten times a
/// second.
fn worker(proxy: &RunningProxy, name: &str, backend: &Resting) -> RunningWorker {
    let mut config = WorkerConfig::new(&proxy.url(), SECRET, &backend.url);
    config.name = name.to_string();
    config.max_concurrent = 2;
    config.model_refresh_interval = Duration::from_millis(300);
    config.unload_poll_interval = Duration::from_millis(100);
    RunningWorker::start_with(config)
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

fn chat(conversation: &str) -> Value {
    // About 500 prompt tokens, as the proxy estimates them.
    let text = format!("{conversation} {}", "word ".repeat(400));
    json!({"model": MODEL, "messages": [{"role": "user", "content": text}]})
}

async fn ask(proxy: &RunningProxy, conversation: &str) {
    let (status, _, body) = post(&proxy.url(), "/v1/chat/completions", &chat(conversation)).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn a_backend_that_unloads_its_model_by_itself_is_reported_and_its_measured_load_weighed() {
    for dialect in [Dialect::LlamaServer, Dialect::LlamaRouter, Dialect::Ollama] {
        unloads_and_is_weighed(dialect).await;
    }
}

async fn unloads_and_is_weighed(dialect: Dialect) {
    let proxy = start_proxy(test_config()).await;
    // box-a evaluates 10,000 prompt tokens a second, box-b 1,000.
    let (fast, slow) = (
        Resting::start(dialect, 10_000.0).await,
        Resting::start(dialect, 1_000.0).await,
    );
    let box_a = worker(&proxy, "box-a", &fast);
    assert_eq!(shown(&proxy, "box-a", "loaded").await, None, "{dialect:?}");
    ask(&proxy, "first").await;
    // The backend frees its model: the dashboard says so within a look and a heartbeat.
    fast.unload(true);
    assert_eq!(
        shown(&proxy, "box-a", "unloaded").await,
        None,
        "{dialect:?}"
    );
    // The request that finds it unloaded waits for the load, and measures it: its time less the
    // prompt and answer its timings report.
    ask(&proxy, "second").await;
    let load = shown(&proxy, "box-a", "loaded").await.expect("a load time");
    assert!((1_100..5_000).contains(&load), "{dialect:?}: {load} ms");

    // box-b joins; both answer once at the same time (each measured), box-a loaded.
    let box_b = worker(&proxy, "box-b", &slow);
    wait_until("box-b registers", || proxy.hub.models().len() == 1).await;
    shown(&proxy, "box-b", "loaded").await;
    let both: Vec<_> = ["third", "fourth"]
        .iter()
        .map(|c| spawn_post(&proxy.url(), "/v1/chat/completions", chat(c)))
        .collect();
    for client in both {
        assert_eq!(answer_of(client).await.0, 200);
    }
    wait_until("each box answered", || slow.answered() >= 1).await;

    // box-a unloads again: a new conversation waits 1.2 s for the load there and 0.05 s for
    // its prompt, against 0.5 s on box-b. box-b takes it.
    fast.unload(true);
    assert_eq!(shown(&proxy, "box-a", "unloaded").await, Some(load));
    let (on_fast, on_slow) = (fast.answered(), slow.answered());
    ask(&proxy, "fifth").await;
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
    ask(&proxy, "sixth").await;
    assert_eq!(fast.answered(), on_fast + 1, "{dialect:?}");
    box_a.stop().await;
    box_b.stop().await;
    proxy.shutdown().await;
}
