//! Slot hints (issue 17): a worker in front of llama-server keeps each conversation in one of
//! the server's slots (`id_slot`, `cache_prompt`), learned from the server's `GET /props`; every
//! other backend, route or request without a conversation gets the body exactly as sent.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::{get, post as post_route};
use axum::Json;
use relay_core::proxy::RunningProxy;
use relay_core::worker::WorkerConfig;
use serde_json::{json, Value};

use crate::support::*;

const MODEL: &str = "slotted";

/// A chat body with this in it is answered after [`SLOW_ANSWER`] (a title on a busy box).
const SLOW: &str = "(answered slowly)";
const SLOW_ANSWER: Duration = Duration::from_millis(1500);

/// A server that answers like llama-server (`Server: llama.cpp`, `/props` with its slots, and
/// Anthropic's `/v1/messages` natively) and keeps every chat body it gets, and every Messages
/// body apart.
struct LlamaLike {
    url: String,
    bodies: Arc<Mutex<Vec<Value>>>,
    messages: Arc<Mutex<Vec<Value>>>,
    props_asked: Arc<Mutex<usize>>,
}

/// How a [`LlamaLike`] answers `POST /completion` (the worker's probe): not at all (404), as a
/// server that keeps each slot's prompt, as one with a unified KV cache (a new task clears the
/// idle slots: their prompts went to host memory), or busy (503, every time).
#[derive(Clone, Copy, PartialEq)]
enum Kv {
    NoCompletion,
    PerSlot,
    Unified,
    Busy,
}

/// A `/completion` answer as llama-server gives it: the tokens (here, words) of `prompt` found
/// in `slot`'s cache and those evaluated.
fn complete_in_slot(slots: &Mutex<Vec<String>>, kv: Kv, body: &Value) -> Value {
    let prompt = body["prompt"].as_str().unwrap_or_default().to_string();
    let slot = body["id_slot"].as_u64().unwrap_or(0) as usize;
    let mut slots = slots.lock().unwrap();
    if kv == Kv::Unified {
        slots.iter_mut().for_each(String::clear);
    }
    let held = slots.get(slot).cloned().unwrap_or_default();
    let cached = prompt
        .split_whitespace()
        .zip(held.split_whitespace())
        .take_while(|(a, b)| a == b)
        .count();
    let words = prompt.split_whitespace().count();
    if let Some(kept) = slots.get_mut(slot) {
        *kept = prompt;
    }
    json!({"content": "x", "timings": {"cache_n": cached, "prompt_n": words - cached}})
}

impl LlamaLike {
    async fn start(slots: u32, server: &'static str) -> LlamaLike {
        LlamaLike::start_with(slots, server, Kv::NoCompletion).await
    }

    async fn start_with(slots: u32, server: &'static str, kv: Kv) -> LlamaLike {
        let cache = Arc::new(Mutex::new(vec![String::new(); slots as usize]));
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let props_asked = Arc::new(Mutex::new(0));
        let messages = Arc::new(Mutex::new(Vec::new()));
        let (seen, asked, native) = (bodies.clone(), props_asked.clone(), messages.clone());
        let app = axum::Router::new()
            .route(
                "/v1/models",
                get(|| async {
                    Json(json!({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "llamacpp"}]}))
                }),
            )
            .route(
                "/props",
                get(move || {
                    *asked.lock().unwrap() += 1;
                    async move { Json(json!({"total_slots": slots, "model_path": "/m/tiny.gguf"})) }
                }),
            )
            .route(
                "/v1/chat/completions",
                post_route(move |body: Bytes| {
                    seen.lock()
                        .unwrap()
                        .push(serde_json::from_slice(&body).unwrap_or(Value::Null));
                    let slow = String::from_utf8_lossy(&body).contains(SLOW);
                    async move {
                        if slow {
                            tokio::time::sleep(SLOW_ANSWER).await;
                        }
                        Json(json!({"id": "c", "object": "chat.completion", "model": MODEL,
                            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}))
                    }
                }),
            )
            .route(
                "/v1/messages",
                post_route(move |body: Bytes| {
                    native
                        .lock()
                        .unwrap()
                        .push(serde_json::from_slice(&body).unwrap_or(Value::Null));
                    async move {
                        Json(json!({"id": "m", "type": "message", "role": "assistant",
                            "model": MODEL, "content": [{"type": "text", "text": "ok"}],
                            "stop_reason": "end_turn", "stop_sequence": null,
                            "usage": {"input_tokens": 10, "output_tokens": 1}}))
                    }
                }),
            )
            .route(
                "/completion",
                post_route(move |body: Bytes| {
                    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    let answer = match kv {
                        Kv::NoCompletion => axum::http::StatusCode::NOT_FOUND.into_response(),
                        Kv::Busy => axum::http::StatusCode::SERVICE_UNAVAILABLE.into_response(),
                        Kv::PerSlot | Kv::Unified => {
                            Json(complete_in_slot(&cache, kv, &body)).into_response()
                        }
                    };
                    async move { answer }
                }),
            )
            .layer(axum::middleware::map_response(
                move |mut response: axum::response::Response| async move {
                    response
                        .headers_mut()
                        .insert(header::SERVER, header::HeaderValue::from_static(server));
                    response
                },
            ));
        let (addr, _task) = serve_app(app, "127.0.0.1:0".parse().unwrap()).await;
        LlamaLike {
            url: format!("http://{addr}"),
            bodies,
            messages,
            props_asked,
        }
    }

    fn bodies(&self) -> Vec<Value> {
        self.bodies.lock().unwrap().clone()
    }

    fn props_asked(&self) -> usize {
        *self.props_asked.lock().unwrap()
    }
}

fn turn(conversation: &str, turn: usize) -> Value {
    let mut messages = vec![
        json!({"role": "system", "content": "A long system prompt every conversation shares."}),
        json!({"role": "user", "content": format!("{conversation}: first question")}),
    ];
    for n in 1..turn {
        messages.push(json!({"role": "assistant", "content": format!("answer {n}")}));
        messages.push(json!({"role": "user", "content": format!("follow-up {n}")}));
    }
    json!({"model": MODEL, "messages": messages})
}

async fn send(proxy: &str, body: &Value, session: &str) {
    let (status, _, text) = post_raw(
        proxy,
        "/v1/chat/completions",
        body.to_string(),
        &[("x-session-id", session)],
    )
    .await;
    assert_eq!(status, 200, "{text}");
}

/// Sends `body` to `/v1/messages` as Claude Code does, in session `session`: the answer, 200.
async fn send_as_claude_code(proxy: &RunningProxy, body: &Value, session: &str) -> String {
    let (status, _, text) = post_raw(
        &proxy.url(),
        "/v1/messages?beta=true",
        body.to_string(),
        &[
            ("x-claude-code-session-id", session),
            ("anthropic-version", "2023-06-01"),
        ],
    )
    .await;
    assert_eq!(status, 200, "{text}");
    text
}

/// A proxy and a real worker in front of `backend`.
async fn relay(backend: &str, affinity: bool, slot_hints: bool) -> (RunningProxy, RunningWorker) {
    let mut proxy_config = test_config();
    proxy_config.affinity = affinity;
    relay_with(backend, proxy_config, slot_hints).await
}

/// A proxy of `proxy_config` and a real worker in front of `backend`.
async fn relay_with(
    backend: &str,
    proxy_config: relay_core::proxy::ProxyConfig,
    slot_hints: bool,
) -> (RunningProxy, RunningWorker) {
    let proxy = start_proxy(proxy_config).await;
    let mut config = WorkerConfig::new(&proxy.url(), SECRET, backend);
    config.max_concurrent = 4;
    config.slot_hints = slot_hints;
    config.model_refresh_interval = Duration::from_secs(600);
    let worker = RunningWorker::start_with(config);
    wait_until("the worker registers", || !proxy.hub.models().is_empty()).await;
    (proxy, worker)
}

/// Sends a first request, which makes the worker ask `backend` about its slots and wait for the
/// answer: a title (Claude Code's small model), a side request, so that it leaves no
/// conversation's home behind. The number of bodies the backend has seen by then.
async fn warm_up(proxy: &RunningProxy, backend: &LlamaLike) -> usize {
    let title = json!({"model": "claude-haiku-4-5", "messages": [
        {"role": "system", "content": "Write a title."},
        {"role": "user", "content": "warm-up"}]});
    send(&proxy.url(), &title, "warm-up").await;
    backend.bodies().len()
}

/// A llama-server look-alike with `slots` slots behind a proxy that serves Claude Code's models
/// (`claude-*`) with its model, and a worker with slot hints, warmed up ([`warm_up`]).
async fn claude_code_relay(slots: u32) -> (LlamaLike, RunningProxy, RunningWorker, usize) {
    let backend = LlamaLike::start(slots, "llama.cpp").await;
    let mut proxy_config = test_config();
    proxy_config.aliases = relay_core::proxy::serving::aliases::ModelAliases::new(
        [("claude-*".to_string(), MODEL.to_string())],
        None,
    );
    let (proxy, worker) = relay_with(&backend.url, proxy_config, true).await;
    let first_hinted = warm_up(&proxy, &backend).await;
    (backend, proxy, worker, first_hinted)
}

/// The slots of the requests sent as `name`, in order.
fn slots_named(slots: &[(&str, u64)], name: &str) -> Vec<u64> {
    slots
        .iter()
        .filter(|(sent, _)| *sent == name)
        .map(|(_, slot)| *slot)
        .collect()
}

/// The slot each body the backend got from the `first_hinted` on was pinned to (with
/// `cache_prompt`), by the name it was sent under: `sent`, in order.
fn hinted_slots<'a>(
    backend: &LlamaLike,
    first_hinted: usize,
    sent: &[(&'a str, Value)],
) -> Vec<(&'a str, u64)> {
    let seen = backend.bodies()[first_hinted..].to_vec();
    assert_eq!(seen.len(), sent.len(), "{seen:?}");
    sent.iter()
        .zip(seen)
        .map(|((name, _), seen)| {
            let (_, slot, cache) = split_hint(seen);
            assert_eq!(cache, Some(true), "{name}");
            (*name, slot.expect("a slot hint"))
        })
        .collect()
}

/// The body without the hint, and the hint.
fn split_hint(mut body: Value) -> (Value, Option<u64>, Option<bool>) {
    let object = body.as_object_mut().expect("an object");
    let slot = object.remove("id_slot").and_then(|v| v.as_u64());
    let cache = object.remove("cache_prompt").and_then(|v| v.as_bool());
    (body, slot, cache)
}

#[tokio::test]
async fn each_conversation_keeps_one_llama_server_slot_turn_after_turn() {
    let backend = LlamaLike::start(2, "llama.cpp").await;
    let (proxy, worker) = relay(&backend.url, true, true).await;
    let first_hinted = warm_up(&proxy, &backend).await;

    let mut sent = Vec::new();
    for n in 1..=3 {
        for conversation in ["alpha", "beta"] {
            let body = turn(conversation, n);
            send(&proxy.url(), &body, conversation).await;
            sent.push((conversation, body));
        }
    }
    let seen = backend.bodies()[first_hinted..].to_vec();
    assert_eq!(seen.len(), sent.len());
    let mut slot_of = std::collections::HashMap::new();
    for ((conversation, sent), seen) in sent.iter().zip(seen) {
        let (body, slot, cache) = split_hint(seen);
        assert_eq!(&body, sent, "the client's body, plus only the hint");
        assert_eq!(cache, Some(true));
        let slot = slot.expect("a slot hint");
        assert!(slot < 2, "a slot the server has");
        let kept = *slot_of.entry(*conversation).or_insert(slot);
        assert_eq!(slot, kept, "{conversation} stays in its slot");
    }
    assert_ne!(slot_of["alpha"], slot_of["beta"], "one slot each");
    // Once for its slots and once, by the model refresh, for its context window: not per
    // request.
    assert_eq!(
        backend.props_asked(),
        2,
        "asked twice in all, not per request"
    );
    worker.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_backend_that_is_not_llama_cpp_or_hints_turned_off_get_the_body_as_sent() {
    // (server, proxy affinity, worker slot hints)
    for (server, affinity, hints) in [
        ("uvicorn", true, true),
        ("llama.cpp", false, true),
        ("llama.cpp", true, false),
    ] {
        let backend = LlamaLike::start(2, server).await;
        let (proxy, worker) = relay(&backend.url, affinity, hints).await;
        let mut sent = Vec::new();
        for n in 1..=3 {
            let body = turn("gamma", n);
            send(&proxy.url(), &body, "gamma").await;
            sent.push(body);
            // Time for a background question about slots to have been answered.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(
            backend.bodies(),
            sent,
            "{server}, affinity {affinity}, hints {hints}"
        );
        worker.stop().await;
        proxy.shutdown().await;
    }
}

#[tokio::test]
async fn a_llama_server_with_a_unified_kv_cache_gets_no_slot_hints_one_that_keeps_slots_does() {
    // A server too busy to answer the probe gets none until it has answered (asked again later).
    for (kv, hinted) in [(Kv::Unified, false), (Kv::PerSlot, true), (Kv::Busy, false)] {
        let backend = LlamaLike::start_with(4, "llama.cpp", kv).await;
        let (proxy, worker) = relay(&backend.url, true, true).await;
        // The first request asks for the slots, and the worker then asks the server (three
        // completions pinned to slots 0, 1, 0) whether it keeps a pinned slot's prompt.
        send(&proxy.url(), &turn("warm-up", 1), "warm-up").await;
        wait_until("the worker asked for the slots", || {
            backend.props_asked() >= 1
        })
        .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before = backend.bodies().len();
        let body = turn("delta", 2);
        send(&proxy.url(), &body, "delta").await;
        let (sent, slot, _) = split_hint(backend.bodies()[before].clone());
        assert_eq!(sent, body);
        assert_eq!(slot.is_some(), hinted, "unified: no hint; per slot: a hint");
        worker.stop().await;
        proxy.shutdown().await;
    }
}

#[tokio::test]
async fn claude_codes_messages_are_pinned_by_translating_them_to_chat_completions_which_carry_the_hint(
) {
    // llama-server drops `id_slot` from `/v1/messages`: left there, Claude Code's turns and
    // titles land wherever its own similarity rule puts them. Pinned, they are translated.
    let (backend, proxy, worker, first_hinted) = claude_code_relay(3).await;
    // As Claude Code sends them: its billing line first.
    let anthropic = |model: &str, system: &str, user: String| {
        json!({"model": model, "max_tokens": 16, "system": [
                {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.330; cc_entrypoint=cli;"},
                {"type": "text", "text": system}],
            "messages": [{"role": "user", "content": user}]})
    };
    let mut sent = Vec::new();
    for n in 1..=2 {
        for session in ["alpha", "beta"] {
            let body = anthropic(
                "claude-sonnet-4-5",
                "A long shared system prompt.",
                format!("{session}: question {n}"),
            );
            sent.push((session, body));
        }
        let title = anthropic(
            "claude-haiku-4-5",
            "Write a five-word title.",
            format!("alpha: question {n}"),
        );
        sent.push(("title", title));
    }
    for (name, body) in &sent {
        let session = if *name == "title" { "alpha" } else { name };
        let text = send_as_claude_code(&proxy, body, session).await;
        let answer: Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(answer["type"], "message", "an Anthropic answer: {answer}");
    }
    assert!(
        backend.messages.lock().unwrap().is_empty(),
        "none went to /v1/messages, where the hint would be lost"
    );
    for seen in &backend.bodies()[first_hinted..] {
        assert_eq!(seen["messages"][0]["role"], "system", "translated: {seen}");
    }
    let slots = hinted_slots(&backend, first_hinted, &sent);
    let slot_of = |name: &str| slots_named(&slots, name);
    let (alpha, beta, titles) = (slot_of("alpha"), slot_of("beta"), slot_of("title"));
    assert!(alpha.iter().all(|s| *s == alpha[0]), "{slots:?}");
    assert!(beta.iter().all(|s| *s == beta[0]), "{slots:?}");
    assert_ne!(alpha[0], beta[0]);
    assert_eq!(titles, vec![3 - alpha[0] - beta[0]; 2], "{slots:?}");
    worker.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_llama_servers_first_request_waits_for_its_slots_to_be_known_and_is_pinned_too() {
    // Nothing asked the server yet (no warm-up: this one answers no `/completion`). Sent before
    // the answer, Claude Code's first turn went to `/v1/messages` as it came, into the slot
    // llama-server picked, and the probe that followed could take that slot.
    let backend = LlamaLike::start(3, "llama.cpp").await;
    let mut proxy_config = test_config();
    proxy_config.aliases = relay_core::proxy::serving::aliases::ModelAliases::new(
        [("claude-*".to_string(), MODEL.to_string())],
        None,
    );
    let (proxy, worker) = relay_with(&backend.url, proxy_config, true).await;
    let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 16, "system": "Be brief.",
        "messages": [{"role": "user", "content": "hello"}]});
    send_as_claude_code(&proxy, &body, "alpha").await;
    assert!(
        backend.messages.lock().unwrap().is_empty(),
        "not sent as it came"
    );
    let seen = backend.bodies();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let (_, slot, cache) = split_hint(seen[0].clone());
    assert!(slot.is_some() && cache == Some(true), "{seen:?}");
    worker.stop().await;
    proxy.shutdown().await;
}

/// Sends `sent` as the requests of one Claude Code session, in order; the slot each was
/// pinned to, by name.
async fn one_session<'a>(
    backend: &LlamaLike,
    proxy: &RunningProxy,
    first_hinted: usize,
    sent: &[(&'a str, Value)],
) -> Vec<(&'a str, u64)> {
    for (_, body) in sent {
        send_as_claude_code(proxy, body, "alpha").await;
    }
    hinted_slots(backend, first_hinted, sent)
}

/// A Claude Code request on `model`: its billing line (where it sends one), the system prompt
/// `prompt`, and `turns` turns of the conversation `task` opened.
fn claude_code_turn(
    model: &str,
    billing_line: Option<&str>,
    prompt: &str,
    task: &str,
    turns: usize,
) -> Value {
    let mut messages = vec![json!({"role": "user", "content": task})];
    for n in 1..turns {
        messages.push(json!({"role": "assistant", "content": format!("step {n}")}));
        messages.push(json!({"role": "user", "content": format!("result {n}")}));
    }
    let mut system = vec![json!({"type": "text", "text": prompt})];
    if let Some(line) = billing_line {
        system.insert(0, json!({"type": "text", "text": line}));
    }
    json!({"model": model, "max_tokens": 16, "messages": messages, "system": system})
}

#[tokio::test]
async fn a_claude_code_subagent_keeps_a_slot_of_its_own_and_leaves_its_conversations_alone() {
    // Claude Code's Task tool runs a subagent: a conversation of its own under the main
    // conversation's session id, on the main model (or the small one, its Explore agent). Its
    // billing line says `cc_is_subagent=true`. Keyed by the session alone, its turns took the
    // main conversation's slot, whose next turn evaluated its whole prompt again.
    let (backend, proxy, worker, first_hinted) = claude_code_relay(4).await;
    let request = |model: &str, subagent: bool, prompt: &str, task: &str, turns: usize| {
        let marker = if subagent {
            " cc_is_subagent=true;"
        } else {
            ""
        };
        let line =
            format!("x-anthropic-billing-header: cc_version=2.1.330; cc_entrypoint=cli;{marker}");
        claude_code_turn(model, Some(&line), prompt, task, turns)
    };
    let main = |turns| {
        request(
            "claude-sonnet-4-5",
            false,
            "You are Claude Code.",
            "fix it",
            turns,
        )
    };
    let tests = |turns| {
        request(
            "claude-sonnet-4-5",
            true,
            "You are an agent.",
            "run the tests",
            turns,
        )
    };
    let explore = |turns| {
        request(
            "claude-haiku-4-5",
            true,
            "You explore.",
            "find the docs",
            turns,
        )
    };
    // A title is a side request: it takes the slot kept for no conversation, which a subagent
    // taken for one would share with it.
    let title = request("claude-haiku-4-5", false, "Write a title.", "fix it", 1);
    let sent = [
        ("main", main(1)),
        ("tests", tests(1)),
        ("tests", tests(2)),
        ("explore", explore(1)),
        ("title", title),
        ("explore", explore(2)),
        ("main", main(2)),
        ("tests", tests(3)),
        ("main", main(3)),
    ];
    let slots = one_session(&backend, &proxy, first_hinted, &sent).await;
    let slot_of = |name: &str| slots_named(&slots, name);
    let (main, tests, explore) = (slot_of("main"), slot_of("tests"), slot_of("explore"));
    for turns in [&main, &tests, &explore] {
        assert!(turns.iter().all(|s| *s == turns[0]), "{slots:?}");
    }
    assert_ne!(tests[0], main[0], "{slots:?}");
    assert_ne!(explore[0], main[0], "{slots:?}");
    assert_ne!(explore[0], tests[0], "{slots:?}");
    assert_ne!(slot_of("title"), explore[..1], "{slots:?}");
    worker.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn without_its_billing_line_a_claude_code_subagent_still_keeps_a_slot_of_its_own() {
    // `CLAUDE_CODE_ATTRIBUTION_HEADER=0` (which guides for local models recommend) leaves the
    // billing line out, and with it the subagent marker: each conversation of the session is
    // then keyed by its own prompt too.
    let (backend, proxy, worker, first_hinted) = claude_code_relay(4).await;
    let request = |model: &str, prompt: &str, task: &str, turns: usize| {
        claude_code_turn(model, None, prompt, task, turns)
    };
    let main = |turns| request("claude-sonnet-4-5", "You are Claude Code.", "fix it", turns);
    let tests = |turns| {
        request(
            "claude-sonnet-4-5",
            "You are an agent.",
            "run the tests",
            turns,
        )
    };
    let title = request("claude-haiku-4-5", "Write a title.", "fix it", 1);
    let sent = [
        ("main", main(1)),
        ("tests", tests(1)),
        ("title", title),
        ("tests", tests(2)),
        ("main", main(2)),
        ("tests", tests(3)),
        ("main", main(3)),
    ];
    let slots = one_session(&backend, &proxy, first_hinted, &sent).await;
    let slot_of = |name: &str| slots_named(&slots, name);
    let (main, tests, title) = (slot_of("main"), slot_of("tests"), slot_of("title"));
    for turns in [&main, &tests] {
        assert!(turns.iter().all(|s| *s == turns[0]), "{slots:?}");
    }
    assert_ne!(tests[0], main[0], "{slots:?}");
    assert!(title[0] != main[0] && title[0] != tests[0], "{slots:?}");
    worker.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn side_requests_take_the_slot_kept_for_no_conversation_and_leave_the_conversations_slots_alone(
) {
    // Three slots, two conversations. Claude Code's titles (its small model, the
    // conversation's session) go to the third slot, one after another: pinned as conversations
    // of their own, the second title found every slot kept for one conversation and took the
    // slot idle longest — a conversation's, whose next turn evaluated its history again.
    let (backend, proxy, worker, first_hinted) = claude_code_relay(3).await;

    let title = |n: usize| {
        json!({"model": "claude-haiku-4-5", "messages": [
            {"role": "system", "content": "Write a five-word title for the conversation."},
            {"role": "user", "content": format!("alpha: question {n}")}]})
    };
    let mut sent = Vec::new();
    for n in 1..=2 {
        for conversation in ["alpha", "beta"] {
            sent.push((conversation, turn(conversation, n)));
        }
    }
    for n in 1..=3 {
        sent.push(("title", title(n)));
    }
    for conversation in ["alpha", "beta"] {
        sent.push((conversation, turn(conversation, 3)));
    }
    sent.push(("gamma", turn("gamma", 1)));
    for (conversation, body) in &sent {
        let session = if *conversation == "title" {
            "alpha"
        } else {
            conversation
        };
        send(&proxy.url(), body, session).await;
    }
    let slots = hinted_slots(&backend, first_hinted, &sent);
    let slot_of = |name: &str| slots_named(&slots, name);
    let (alpha, beta, titles) = (slot_of("alpha"), slot_of("beta"), slot_of("title"));
    assert!(
        alpha.iter().all(|s| *s == alpha[0]),
        "alpha keeps its slot: {slots:?}"
    );
    assert!(
        beta.iter().all(|s| *s == beta[0]),
        "beta keeps its slot: {slots:?}"
    );
    assert_ne!(alpha[0], beta[0]);
    let free = 3 - alpha[0] - beta[0];
    assert_eq!(
        titles,
        vec![free; 3],
        "every title in the third slot: {slots:?}"
    );
    assert_eq!(
        slot_of("gamma"),
        vec![free],
        "a new conversation still finds the third slot kept for none: {slots:?}"
    );
    worker.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_turn_whose_slot_a_title_holds_waits_for_it_instead_of_taking_another_conversations_slot()
{
    // Two slots, two conversations: a title of the second conversation, sent while both are
    // between turns, takes the lowest slot (the one llama-server evaluates first) — the second
    // conversation's, since new conversations take slot 0 last. Its next turn came while the
    // title was still answered, and (before the wait) took the other conversation's slot: with
    // a system prompt both share, llama-server kept that slot's prefix and both conversations
    // evaluated their histories again.
    let (backend, proxy, worker, first_hinted) = claude_code_relay(2).await;
    send(&proxy.url(), &turn("alpha", 1), "alpha").await;
    send(&proxy.url(), &turn("beta", 1), "beta").await;

    let title = json!({"model": "claude-haiku-4-5", "messages": [
        {"role": "system", "content": format!("Write a five-word title. {SLOW}")},
        {"role": "user", "content": "beta: first question"}]});
    let url = proxy.url();
    let titled = tokio::spawn(async move { send(&url, &title, "beta").await });
    wait_until("the title reached the server", || {
        backend.bodies().len() == first_hinted + 3
    })
    .await;
    let asked = std::time::Instant::now();
    send(&proxy.url(), &turn("beta", 2), "beta").await;
    let waited = asked.elapsed();
    send(&proxy.url(), &turn("alpha", 2), "alpha").await;
    titled.await.expect("the title was answered");

    let slots: Vec<u64> = backend.bodies()[first_hinted..]
        .iter()
        .map(|body| split_hint(body.clone()).1.expect("a slot hint"))
        .collect();
    let [alpha, beta, title, beta_again, alpha_again] = slots[..] else {
        panic!("five requests, each with a hint: {slots:?}");
    };
    assert_eq!(
        (alpha, beta),
        (1, 0),
        "new conversations take slot 0 last: {slots:?}"
    );
    assert_eq!(title, beta, "the title took the lowest slot: {slots:?}");
    assert_eq!(beta_again, beta, "beta waited for its own slot: {slots:?}");
    assert_eq!(alpha_again, alpha, "alpha's slot was left alone: {slots:?}");
    assert!(
        waited >= SLOW_ANSWER / 4,
        "beta's turn went after the title was answered ({waited:?})"
    );
    worker.stop().await;
    proxy.shutdown().await;
}
