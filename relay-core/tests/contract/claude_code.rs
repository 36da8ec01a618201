//! Claude Code with nothing but the URL (issue "Nothing but the URL"): its requests for Claude
//! names nobody serves go to a model the relay chooses — the largest for the conversation, the
//! smallest for `claude-haiku-*` side requests — at once, never after a queue timeout; an
//! alias, `default_model` or a served Claude name wins; other names keep the seeds' queueing.

use std::time::{Duration, Instant};

use relay_core::proxy::serving::aliases::ModelAliases;
use serde_json::{json, Value};

use crate::support::*;

const BIG: &str = "qwen2.5-coder-7b";
const SMALL: &str = "llama3.2:1b";

/// Claude Code's headers (see `shared/research/clients.md`).
const CLAUDE_CODE_HEADERS: &[(&str, &str)] = &[
    ("anthropic-version", "2023-06-01"),
    ("anthropic-beta", "claude-code-20250219"),
    ("x-api-key", "sk-ant-client"),
    ("x-app", "cli"),
];

fn ask(model: &str) -> Value {
    json!({"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]})
}

/// Claude Code's request for `model` to `path`: its status and body.
async fn as_claude_code(
    proxy: &relay_core::proxy::RunningProxy,
    path: &str,
    model: &str,
) -> (u16, String) {
    let (status, _, text) = post_raw(
        &proxy.url(),
        path,
        ask(model).to_string(),
        CLAUDE_CODE_HEADERS,
    )
    .await;
    (status.as_u16(), text)
}

/// A proxy with `config`, and a worker serving `models` from a chat-only backend.
async fn fleet(
    config: relay_core::proxy::ProxyConfig,
    models: &[&str],
) -> (
    relay_core::proxy::RunningProxy,
    ChatOnlyBackend,
    RunningWorker,
) {
    let proxy = start_proxy(config).await;
    let backend = ChatOnlyBackend::start(models).await;
    let worker = RunningWorker::start(&proxy, &backend.url(), None, 4);
    let want = models.len();
    wait_until("the worker registers its models", || {
        proxy.hub.models().len() == want
    })
    .await;
    (proxy, backend, worker)
}

#[tokio::test]
async fn claude_code_with_nothing_but_the_url_gets_the_largest_model_and_haiku_the_smallest() {
    let (proxy, backend, worker) = fleet(test_config(), &[BIG, SMALL]).await;
    for (claude, served) in [
        ("claude-opus-5-5", BIG),
        ("claude-sonnet-4-5-20250929", BIG),
        ("claude-haiku-4-5-20251001", SMALL),
    ] {
        let started = Instant::now();
        let (status, text) = as_claude_code(&proxy, "/v1/messages?beta=true", claude).await;
        assert_eq!(status, 200, "{claude}: {text}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{claude} waited {:?}",
            started.elapsed()
        );
        let seen = backend.chat_bodies();
        assert_eq!(seen.last().unwrap()["model"], served, "{claude}");
    }
    // The dashboard says where Claude Code's requests go.
    let (_, status) = get_json(&proxy.url(), "/api/status", &[]).await;
    assert_eq!(
        status["node"]["claude_code"],
        json!({"model": BIG, "small_model": SMALL}),
        "{status}"
    );
    worker.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn an_alias_a_default_model_or_a_served_claude_name_wins_over_the_choice() {
    let mut config = test_config();
    config.aliases = ModelAliases::new([("claude-haiku-*".to_string(), BIG.to_string())], None);
    let (proxy, backend, worker) = fleet(config, &[BIG, SMALL, "claude-opus-5-5"]).await;
    for (claude, served) in [
        // The user's pick (the dashboard saves it as an alias).
        ("claude-haiku-4-5", BIG),
        // A worker serving the Claude name itself.
        ("claude-opus-5-5", "claude-opus-5-5"),
        // Nobody serves it, no alias names it: the choice (the largest model).
        ("claude-sonnet-4-5", BIG),
    ] {
        let (status, text) = as_claude_code(&proxy, "/v1/messages", claude).await;
        assert_eq!(status, 200, "{claude}: {text}");
        assert_eq!(
            backend.chat_bodies().last().unwrap()["model"],
            served,
            "{claude}"
        );
    }
    worker.stop().await;
    proxy.shutdown().await;

    let mut config = test_config();
    config.aliases = ModelAliases::new([], Some(SMALL.to_string()));
    let (proxy, backend, worker) = fleet(config, &[BIG, SMALL]).await;
    let (status, text) = as_claude_code(&proxy, "/v1/messages", "claude-opus-5-5").await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        backend.chat_bodies()[0]["model"],
        SMALL,
        "default_model wins"
    );
    worker.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn other_names_nobody_serves_still_queue_for_a_worker_to_bring_them() {
    let (proxy, backend, worker) = fleet(
        config_with_queue_timeout(Duration::from_millis(300)),
        &[BIG],
    )
    .await;
    let (status, _, text) = post(
        &proxy.url(),
        "/v1/chat/completions",
        &json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(status, 504, "{text}");
    // The wait is readable: what is served, and how to map the name.
    let error: Value = serde_json::from_str(&text).unwrap();
    let message = error["error"]["message"].as_str().unwrap();
    for part in ["gpt-4o-mini", BIG, "alias", "default_model"] {
        assert!(message.contains(part), "{part}: {message}");
    }
    // In the client's dialect.
    let (status, text) = as_claude_code(&proxy, "/v1/messages", "gpt-4o-mini").await;
    assert_eq!(status, 504, "{text}");
    let error: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(error["type"], "error", "{text}");
    assert!(error["error"]["message"].as_str().unwrap().contains(BIG));
    assert!(backend.chat_bodies().is_empty());
    worker.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn with_no_chat_model_served_a_claude_request_queues_as_before() {
    let proxy = start_proxy(config_with_queue_timeout(Duration::from_millis(300))).await;
    let (status, text) = as_claude_code(&proxy, "/v1/messages", "claude-opus-5-5").await;
    assert_eq!(status, 504, "{text}");
    let (_, status) = get_json(&proxy.url(), "/api/status", &[]).await;
    assert_eq!(
        status["node"]["claude_code"],
        json!({"model": null, "small_model": null})
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn side_requests_keep_out_of_the_slot_of_their_conversation() {
    // Claude Code sends its titles and summaries to claude-haiku-* with the main
    // conversation's session id; keyed by the session they would take its slot (and evict
    // its prompt from the cache). Here both names go to one model, on one worker.
    let mut config = test_config();
    config.aliases = ModelAliases::new([("claude-*".to_string(), "m".to_string())], None);
    let proxy = start_proxy(config).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "w", &["m"], 4).await;
    let session = [("x-claude-code-session-id", "5e55-10n")];
    let mut keys = Vec::new();
    for (model, text) in [
        ("claude-opus-5-5", "let us write a parser"),
        (
            "claude-haiku-4-5",
            "Write a 5-word title for: let us write a parser",
        ),
        ("claude-opus-5-5", "now add tests"),
    ] {
        // As Claude Code sends them: its billing line first.
        let billing = "x-anthropic-billing-header: cc_version=2.1.330; cc_entrypoint=cli;";
        let body = json!({"model": model, "max_tokens": 8,
                          "system": [{"type": "text", "text": billing}],
                          "messages": [{"role": "user", "content": text}]});
        let url = proxy.url();
        let client = tokio::spawn(async move {
            post_raw(&url, "/v1/messages", body.to_string(), &session).await
        });
        let request = worker.next_request().await;
        keys.push(request.conversation.clone().expect("an affinity key"));
        let side = model.contains("haiku").then_some(true);
        assert_eq!(
            request.side_request, side,
            "{model}: marked a side request or not"
        );
        worker
            .complete(&request.request_id, r#"{"type":"message","content":[]}"#)
            .await;
        let _ = client.await;
    }
    assert_eq!(
        keys[0], keys[2],
        "the conversation keeps its key (its session)"
    );
    assert_ne!(keys[1], keys[0], "the side request has its own");
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_side_request_goes_where_no_conversation_is_kept_and_becomes_nobodys_home() {
    // Two boxes of two slots. A conversation takes one box; its title goes to the other, whose
    // slots hold no conversation; and the next conversation still goes where none is kept, as
    // if the title had not been there. (Placed as a conversation of its own, each title
    // counted as one: the next conversation then shared a box with the first while the
    // other box held none.)
    let mut config = test_config();
    config.aliases = ModelAliases::new([("claude-*".to_string(), "m".to_string())], None);
    let proxy = start_proxy(config).await;
    let (mut a, _) = ScriptedWorker::join(proxy.addr, "a", &["m"], 2).await;
    let (mut b, _) = ScriptedWorker::join(proxy.addr, "b", &["m"], 2).await;
    let mut placed = Vec::new();
    for (session, model, text) in [
        ("5e55-1", "claude-opus-5-5", "let us write a parser"),
        (
            "5e55-1",
            "claude-haiku-4-5",
            "Write a 5-word title for: let us write a parser",
        ),
        ("5e55-2", "claude-opus-5-5", "plan a trip to the coast"),
    ] {
        // As Claude Code sends them: its billing line first.
        let billing = "x-anthropic-billing-header: cc_version=2.1.330; cc_entrypoint=cli;";
        let body = json!({"model": model, "max_tokens": 8,
                          "system": [{"type": "text", "text": billing}],
                          "messages": [{"role": "user", "content": text}]});
        let url = proxy.url();
        let client = tokio::spawn(async move {
            let session = [("x-claude-code-session-id", session)];
            post_raw(&url, "/v1/messages", body.to_string(), &session).await
        });
        let (on, request) = next_request_on_either(&mut a, &mut b).await;
        placed.push((on, request.side_request));
        let worker = if on == 0 { &mut a } else { &mut b };
        worker
            .complete(&request.request_id, r#"{"type":"message","content":[]}"#)
            .await;
        let (status, _, text) = client.await.unwrap();
        assert_eq!(status, 200, "{text}");
    }
    assert_eq!(
        placed[1].1,
        Some(true),
        "the title is marked a side request"
    );
    assert_eq!((placed[0].1, placed[2].1), (None, None));
    assert_ne!(
        placed[1].0, placed[0].0,
        "the title goes to the box that keeps no conversation"
    );
    assert_ne!(
        placed[2].0, placed[0].0,
        "the second conversation goes where none is kept: the title is nobody's home"
    );
    let metrics = metrics_text(&proxy.url()).await;
    for line in [
        "modelrelay_placements_total{reason=\"side_request\"} 1",
        "modelrelay_placements_total{reason=\"new_conversation\"} 2",
    ] {
        assert!(metrics.contains(line), "{line}\n{metrics}");
    }
    proxy.shutdown().await;
}
