//! Upstream providers (issue 3, cloud mode): HTTP APIs the proxy calls itself for models no
//! worker serves, or when a model's queue is full. Mock backends stand in for the cloud.

use relay_core::proxy::serving::upstream::{UpstreamConfig, UpstreamKind};
use relay_core::proxy::{ProxyConfig, RunningProxy};
use serde_json::{json, Value};

use crate::support::*;

const LOCAL: &str = "local-model";
const UPSTREAM_KEY: &str = "sk-upstream-key";

fn upstream(name: &str, kind: UpstreamKind, base_url: &str, models: &[&str]) -> UpstreamConfig {
    UpstreamConfig {
        name: name.to_string(),
        kind,
        base_url: base_url.to_string(),
        api_key: Some(UPSTREAM_KEY.to_string()),
        models: models.iter().map(|m| m.to_string()).collect(),
    }
}

fn parse(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

async fn proxy_with(upstreams: Vec<UpstreamConfig>, fallback: Option<&str>) -> RunningProxy {
    let mut config: ProxyConfig = test_config();
    config.upstreams = upstreams;
    config.fallback_upstream = fallback.map(str::to_string);
    start_proxy(config).await
}

/// A proxy whose one upstream is the OpenAI-compatible `cloud` at `base_url`, with no fallback.
async fn proxy_with_cloud(base_url: &str, models: &[&str]) -> RunningProxy {
    proxy_with(
        vec![upstream("cloud", UpstreamKind::OpenAi, base_url, models)],
        None,
    )
    .await
}

#[tokio::test]
async fn an_openai_compatible_upstream_serves_its_models_with_its_own_key() {
    let cloud = ChatOnlyBackend::start(&[]).await;
    let proxy = proxy_with_cloud(&cloud.url(), &["gpt-*"]).await;
    let body = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]});
    let (status, _, text) = post_raw(
        &proxy.url(),
        "/v1/chat/completions",
        body.to_string(),
        &[("authorization", "Bearer client-key")],
    )
    .await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        parse(&text)["choices"][0]["message"]["content"],
        "reply to: hi"
    );
    let seen = cloud.seen();
    assert_eq!(
        seen[0].headers["authorization"],
        format!("Bearer {UPSTREAM_KEY}"),
        "the upstream's key replaces the client's"
    );
    // Not an upstream model and no fallback: it waits for a worker to announce it.
    let client = spawn_post(
        &proxy.url(),
        "/v1/chat/completions",
        json!({"model": "llama", "messages": []}),
    );
    wait_until("llama waits in the queue", || proxy.hub.counts().1 == 1).await;
    client.abort();
    wait_until("it left with its client", || {
        proxy.hub.tracked_requests() == 0
    })
    .await;
    assert_eq!(cloud.seen().len(), 1, "the upstream never saw it");
    proxy.shutdown().await;
}

#[tokio::test]
async fn anthropic_clients_reach_an_openai_compatible_upstream_through_the_adapter() {
    let cloud = ChatOnlyBackend::start(&[]).await;
    let proxy = proxy_with_cloud(&cloud.url(), &["gpt-4o"]).await;
    let body = json!({"model": "gpt-4o", "max_tokens": 16, "stream": true,
                      "messages": [{"role": "user", "content": "hi"}]});
    let (status, headers, text) = post_raw(
        &proxy.url(),
        "/v1/messages?beta=true",
        body.to_string(),
        &[
            ("x-api-key", "client-key"),
            ("anthropic-version", "2023-06-01"),
        ],
    )
    .await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(headers["content-type"], "text/event-stream");
    assert_eq!(
        headers["x-accel-buffering"], "no",
        "upstream streams are not buffered by reverse proxies either"
    );
    assert!(text.starts_with("event: message_start"), "{text}");
    assert!(text.contains("event: message_stop"), "{text}");
    assert_eq!(
        cloud.paths(),
        ["/v1/messages?beta=true", "/v1/chat/completions"]
    );
    for request in cloud.seen() {
        assert_eq!(
            request.headers["authorization"],
            format!("Bearer {UPSTREAM_KEY}")
        );
        assert!(
            request.headers.get("x-api-key").is_none(),
            "the client's key never travels upstream"
        );
    }
    proxy.shutdown().await;
}

#[tokio::test]
async fn an_anthropic_upstream_gets_messages_with_its_key_and_refuses_other_routes() {
    // The mock answers /v1/messages with whatever it answers; what matters is what it was sent.
    let cloud = MockBackend::start(&[]).await;
    let proxy = proxy_with(
        vec![upstream(
            "claude",
            UpstreamKind::Anthropic,
            &cloud.url(),
            &["claude-*"],
        )],
        None,
    )
    .await;
    let body = json!({"model": "claude-opus-5-5", "max_tokens": 16,
                      "messages": [{"role": "user", "content": "hi"}]});
    let (status, _, text) = post_raw(
        &proxy.url(),
        "/v1/messages?beta=true",
        body.to_string(),
        &[("authorization", "Bearer client-key")],
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let seen = cloud.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].path, "/v1/messages?beta=true",
        "passed through, no probe"
    );
    assert_eq!(seen[0].headers["x-api-key"], UPSTREAM_KEY);
    assert_eq!(seen[0].headers["anthropic-version"], "2023-06-01");
    assert!(seen[0].headers.get("authorization").is_none());
    let (status, _, text) = post(
        &proxy.url(),
        "/v1/embeddings",
        &json!({"model": "claude-opus-5-5", "input": "x"}),
    )
    .await;
    assert_eq!(status, 400, "Anthropic has no embeddings: {text}");
    assert_eq!(parse(&text)["error"]["code"], "unsupported_route");
    proxy.shutdown().await;
}

#[tokio::test]
async fn models_no_worker_serves_fall_back_to_the_named_upstream() {
    let cloud = ChatOnlyBackend::start(&[]).await;
    let local = ChatOnlyBackend::start(&[LOCAL]).await;
    let proxy = proxy_with(
        vec![upstream("cloud", UpstreamKind::OpenAi, &cloud.url(), &[])],
        Some("cloud"),
    )
    .await;
    let worker = RunningWorker::start(&proxy, &local.url(), None, 4);
    wait_until("the worker registers", || proxy.hub.models().len() == 1).await;
    for model in [LOCAL, "anything-else"] {
        let body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
        let (status, _, text) = post(&proxy.url(), "/v1/chat/completions", &body).await;
        assert_eq!(status, 200, "{model}: {text}");
    }
    assert_eq!(local.chat_bodies().len(), 1, "workers come first");
    assert_eq!(cloud.chat_bodies()[0]["model"], "anything-else");
    worker.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_full_queue_falls_back_to_the_named_upstream() {
    let cloud = ChatOnlyBackend::start(&[]).await;
    let local = ControlledBackend::start(&[LOCAL]).await;
    let mut config = test_config();
    config.providers[0].limits.max_queue_len = 1;
    config.upstreams = vec![upstream("cloud", UpstreamKind::OpenAi, &cloud.url(), &[])];
    config.fallback_upstream = Some("cloud".to_string());
    let proxy = start_proxy(config).await;
    let worker = RunningWorker::start(&proxy, &local.url(), None, 1);
    wait_until("the worker registers", || proxy.hub.models().len() == 1).await;
    // The worker's only slot is taken by a request its backend never answers.
    let hanging = spawn_post(
        &proxy.url(),
        "/v1/chat/completions",
        json!({"model": LOCAL, "messages": [], "mock": {"hang": true}}),
    );
    wait_until("the local backend is busy", || local.started() == 1).await;
    // And the queue's one place by another.
    let queued = spawn_post(
        &proxy.url(),
        "/v1/chat/completions",
        json!({"model": LOCAL, "messages": [], "mock": {"hang": true}}),
    );
    wait_until("the queue is full", || proxy.hub.counts().1 == 1).await;
    let body = json!({"model": LOCAL, "messages": [{"role": "user", "content": "hi"}]});
    let (status, _, text) = post(&proxy.url(), "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(cloud.chat_bodies().len(), 1, "the overflow went upstream");
    queued.abort();
    hanging.abort();
    wait_until("the cancelled request is released", || {
        proxy.hub.tracked_requests() == 0
    })
    .await;
    worker.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn anthropic_and_responses_clients_reach_an_openai_compatible_upstream_unstreamed() {
    let cloud = ChatOnlyBackend::start(&[]).await;
    let proxy = proxy_with_cloud(&cloud.url(), &["gpt-*"]).await;
    let messages = json!({"model": "gpt-4o", "max_tokens": 16,
                          "messages": [{"role": "user", "content": "hi"}]});
    let (status, _, text) = post(&proxy.url(), "/v1/messages", &messages).await;
    assert_eq!(status, 200, "{text}");
    let answer = parse(&text);
    assert_eq!(answer["type"], "message");
    assert_eq!(answer["content"][0]["text"], "reply to: hi");
    let responses = json!({"model": "gpt-4o", "input": "hello"});
    let (status, _, text) = post(&proxy.url(), "/v1/responses", &responses).await;
    assert_eq!(status, 200, "{text}");
    let answer = parse(&text);
    assert_eq!(answer["object"], "response");
    assert_eq!(answer["output"][0]["content"][0]["text"], "reply to: hello");
    // Each route was probed once, then served through chat completions.
    let chat = cloud.chat_bodies();
    assert_eq!(chat.len(), 2);
    assert_eq!(chat[0]["messages"][0]["content"], "hi");
    assert_eq!(chat[1]["messages"][0]["content"], "hello");
    proxy.shutdown().await;
}

#[tokio::test]
async fn an_openai_compatible_upstreams_pattern_models_are_listed_from_its_own_list() {
    let cloud = ChatOnlyBackend::start(&["gpt-4o", "gpt-4o-mini", "llama-3"]).await;
    let proxy = proxy_with_cloud(&cloud.url(), &["gpt-*"]).await;
    let (status, list) = get_json(&proxy.url(), "/v1/models", &[]).await;
    assert_eq!(status, 200);
    let ids: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["gpt-4o", "gpt-4o-mini"]);
    assert_eq!(list["data"][0]["owned_by"], "cloud");
    proxy.shutdown().await;
}

#[tokio::test]
async fn an_upstream_that_is_down_is_a_502_in_the_clients_dialect() {
    let dead = dead_addr().await;
    let proxy = proxy_with_cloud(&format!("http://{dead}"), &["gpt-*"]).await;
    let body = json!({"model": "gpt-4o", "max_tokens": 8, "messages": []});
    let (status, _, text) = post(&proxy.url(), "/v1/messages", &body).await;
    assert_eq!(status, 502, "{text}");
    assert_eq!(parse(&text)["type"], "error");
    assert!(!text.contains(UPSTREAM_KEY));
    proxy.shutdown().await;
}

#[tokio::test]
async fn requests_served_upstream_count_on_the_dashboard_like_a_workers() {
    let cloud = ChatOnlyBackend::start(&[]).await;
    let proxy = proxy_with_cloud(&cloud.url(), &["gpt-*"]).await;
    let unary = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]});
    let (status, _, text) = post(&proxy.url(), "/v1/chat/completions", &unary).await;
    assert_eq!(status, 200, "{text}");
    let streamed =
        json!({"model": "gpt-4o", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let (status, _, text) = post(&proxy.url(), "/v1/chat/completions", &streamed).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("[DONE]"), "{text}");
    // Counted when each answer has been handed over entirely.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let totals = loop {
        let (code, body) = get_json(&proxy.url(), "/api/status", &[]).await;
        assert_eq!(code, 200);
        if body["totals"]["requests"] == 2 || std::time::Instant::now() > deadline {
            break body["totals"].clone();
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(totals["requests"], 2, "{totals}");
    assert_eq!(totals["errors"], 0, "{totals}");
    assert!(
        totals["tokens"].as_u64().unwrap() >= CHAT_ONLY_USAGE.1,
        "the upstream's tokens count too: {totals}"
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn an_upstream_request_ends_at_its_deadline_or_when_its_client_leaves_and_the_upstream_sees_it(
) {
    let cloud = ControlledBackend::start(&[]).await;
    let mut config: ProxyConfig = test_config();
    config.upstreams = vec![upstream(
        "cloud",
        UpstreamKind::OpenAi,
        &cloud.url(),
        &["gpt-*"],
    )];
    config.providers[0].limits.request_timeout = std::time::Duration::from_millis(800);
    let proxy = start_proxy(config).await;
    let hang = json!({"model": "gpt-4o", "messages": [], "mock": {"hang": true}});

    // The request deadline applies as it does to a worker's request: a 504 in dialect, and the
    // upstream's connection is closed.
    let (status, _, text) = post(&proxy.url(), "/v1/chat/completions", &hang).await;
    assert_eq!(status, 504, "{text}");
    assert_eq!(parse(&text)["error"]["code"], "request_timeout", "{text}");
    wait_until("the upstream saw the timeout", || cloud.dropped() == 1).await;

    // A client that leaves cancels the upstream call.
    let base = proxy.url();
    let client = tokio::spawn(async move { post(&base, "/v1/chat/completions", &hang).await });
    wait_until("the upstream got the request", || cloud.started() == 2).await;
    client.abort();
    wait_until("the upstream saw the client leave", || cloud.dropped() == 2).await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn an_upstream_that_redirects_is_not_followed_and_its_key_goes_nowhere_else() {
    // Where a followed redirect would land: it must see nothing, least of all the key.
    let elsewhere = ChatOnlyBackend::start(&[]).await;
    let target = format!("{}/v1/messages", elsewhere.url());
    let app = axum::Router::new().fallback(move || {
        let target = target.clone();
        async move {
            (
                axum::http::StatusCode::TEMPORARY_REDIRECT,
                [(axum::http::header::LOCATION, target)],
            )
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let redirecting = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let proxy = proxy_with(
        vec![upstream(
            "claude",
            UpstreamKind::Anthropic,
            &redirecting,
            &["claude-*"],
        )],
        None,
    )
    .await;
    let (status, headers, text) = post_raw(
        &proxy.url(),
        "/v1/messages",
        json!({"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
            .to_string(),
        &[],
    )
    .await;
    assert_eq!(
        status, 502,
        "a redirect is a bad answer, not passed on: {text}"
    );
    assert!(text.contains("does not follow"), "{text}");
    assert!(headers.get("location").is_none(), "{headers:?}");
    assert!(elsewhere.seen().is_empty(), "the redirect was followed");
    proxy.shutdown().await;
}
