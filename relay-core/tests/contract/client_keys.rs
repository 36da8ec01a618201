//! Issue 14 §1–§2: the published `/admin` API, client API keys (required or not, limits, stored
//! hashed) and usage that lasts, against a proxy with a real worker and backend.

use std::time::Duration;

use relay_core::proxy::access::admin::{AdminToken, TokenOrigin};
use relay_core::proxy::ProxyConfig;
use relay_core::store::DatabaseSetting;
use serde_json::{json, Value};

use crate::support::*;
use relay_core::proxy::RunningProxy;

const ADMIN: &str = "admin-token-for-tests";
const MODEL: &str = "m";

fn with_admin(mut config: ProxyConfig) -> ProxyConfig {
    config.admin_token = Some(AdminToken(ADMIN.into()));
    config.admin_token_origin = TokenOrigin::Configured;
    config
}

/// A proxy with `config`, a real worker and a mock backend serving [`MODEL`] and `small`.
async fn relay(config: ProxyConfig) -> (RunningProxy, MockBackend, RunningWorker) {
    let proxy = start_proxy(config).await;
    let backend = MockBackend::start(&[MODEL, "small"]).await;
    let worker = RunningWorker::start(&proxy, &backend.url(), None, 4);
    wait_until("the worker registers", || proxy.hub.models().len() == 2).await;
    (proxy, backend, worker)
}

async fn admin(
    proxy: &RunningProxy,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    admin_as(proxy, method, path, body, Some(ADMIN)).await
}

async fn admin_as(
    proxy: &RunningProxy,
    method: &str,
    path: &str,
    body: Option<Value>,
    token: Option<&str>,
) -> (u16, Value) {
    let url = format!("{}{path}", proxy.url());
    let mut request = match method {
        "POST" => http().post(url),
        "DELETE" => http().delete(url),
        _ => http().get(url),
    };
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    let response = request.send().await.expect("admin request");
    let status = response.status().as_u16();
    let text = response.text().await.expect("body");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn create_key(proxy: &RunningProxy, body: Value) -> (String, String) {
    let (status, made) = admin(proxy, "POST", "/admin/keys", Some(body)).await;
    assert_eq!(status, 201, "{made}");
    (
        made["id"].as_str().expect("id").to_string(),
        made["key"].as_str().expect("the secret").to_string(),
    )
}

fn chat(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hi"}]})
}

async fn chat_with(proxy: &RunningProxy, model: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let (status, _, text) = post_raw(
        &proxy.url(),
        "/v1/chat/completions",
        chat(model).to_string(),
        headers,
    )
    .await;
    (
        status.as_u16(),
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

#[tokio::test]
async fn every_admin_route_answers_403_without_a_configured_token_or_with_a_wrong_one() {
    let routes = [
        ("GET", "/admin/workers"),
        ("GET", "/admin/stats"),
        ("GET", "/admin/keys"),
        ("POST", "/admin/keys"),
        ("DELETE", "/admin/keys/key_0000000000000000"),
        ("GET", "/admin/usage"),
    ];
    let unconfigured = start_proxy(test_config()).await;
    for (method, path) in routes {
        let (status, body) = admin_as(
            &unconfigured,
            method,
            path,
            Some(json!({"name": "x"})),
            Some("guess"),
        )
        .await;
        assert_eq!(status, 403, "{method} {path}: {body}");
        assert!(body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("MODELRELAY_ADMIN_TOKEN"));
    }
    let proxy = start_proxy(with_admin(test_config())).await;
    for (method, path) in routes {
        let (status, _) = admin_as(&proxy, method, path, Some(json!({"name": "x"})), None).await;
        assert_eq!(status, 403, "{method} {path} without a token");
    }
    let (status, wrong) = admin_as(&proxy, "GET", "/admin/keys", None, Some("wrong")).await;
    assert_eq!(status, 403);
    assert_eq!(wrong["error"]["code"], "wrong_admin_token");
    let (status, workers) = admin(&proxy, "GET", "/admin/workers", None).await;
    assert_eq!(status, 200);
    assert!(workers["workers"].is_array());
    let (status, stats) = admin(&proxy, "GET", "/admin/stats", None).await;
    assert_eq!(status, 200);
    assert_eq!(stats["queue_depth"], json!({"local": 0}));
    assert_eq!(stats["queue_depth_total"], 0);
    unconfigured.shutdown().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn the_admin_api_answers_in_the_published_relays_shapes() {
    // Scripts written for the published ModelRelay's /admin API read these names and types.
    let (proxy, _backend, worker) = relay(with_admin(test_config())).await;
    let (_, workers) = admin(&proxy, "GET", "/admin/workers", None).await;
    let entry = &workers["workers"][0];
    for (field, is_right_type) in [
        ("worker_id", entry["worker_id"].is_string()),
        ("provider", entry["provider"].is_string()),
        ("worker_name", entry["worker_name"].is_string()),
        ("models", entry["models"].is_array()),
        ("max_concurrent", entry["max_concurrent"].is_u64()),
        ("reported_load", entry["reported_load"].is_u64()),
        ("in_flight_count", entry["in_flight_count"].is_u64()),
        ("is_draining", entry["is_draining"].is_boolean()),
    ] {
        assert!(is_right_type, "{field}: {entry}");
    }
    assert_eq!(entry["is_draining"], false);
    let (_, stats) = admin(&proxy, "GET", "/admin/stats", None).await;
    assert_eq!(stats["active_workers"], 1, "{stats}");
    assert!(
        stats["queue_depth"].is_object(),
        "a map, provider → depth: {stats}"
    );
    assert_eq!(stats["queue_depth"]["local"], 0);

    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let (status, made) = admin(
        &proxy,
        "POST",
        "/admin/keys",
        Some(json!({"name": "script"})),
    )
    .await;
    assert_eq!(status, 201, "{made}");
    let secret = made["secret"].as_str().expect("the secret, as `secret`");
    assert!(secret.starts_with("mr-"));
    assert!(made["id"].is_string() && made["prefix"].is_string());
    let created = made["created_at"].as_u64().expect("epoch seconds");
    assert!(created >= before && created < before + 60, "{made}");
    assert_eq!(made["last_used_at"], Value::Null);
    assert_eq!(made["revoked"], false);
    let (_, list) = admin(&proxy, "GET", "/admin/keys", None).await;
    let listed = &list["keys"][0];
    assert_eq!(listed["id"], made["id"]);
    assert_eq!(listed["created_at"], created);
    assert_eq!(listed["revoked"], false);
    assert!(listed.get("secret").is_none() && listed.get("key").is_none());
    // The dashboard's own routes keep dates as text.
    let bearer = format!("Bearer {ADMIN}");
    let (_, dashboard) = get_json(&proxy.url(), "/api/keys", &[("authorization", &bearer)]).await;
    assert!(dashboard["keys"][0]["created_at"].is_string());
    worker.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn repeated_wrong_admin_tokens_lock_the_address_out_even_with_the_right_one() {
    let config = with_admin(test_config());
    let allowed = config.auth_failures.max_failures;
    let proxy = start_proxy(config).await;
    for _ in 0..allowed {
        let (status, _) = admin_as(&proxy, "GET", "/admin/stats", None, Some("wrong")).await;
        assert_eq!(status, 403);
    }
    let (status, body) = admin(&proxy, "GET", "/admin/stats", None).await;
    assert_eq!(status, 403);
    assert_eq!(body["error"]["code"], "admin_locked_out");
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_key_s_secret_is_shown_once_and_the_list_has_metadata_only() {
    let proxy = start_proxy(with_admin(test_config())).await;
    let (status, made) = admin(
        &proxy,
        "POST",
        "/admin/keys",
        Some(json!({"name": "production-app"})),
    )
    .await;
    assert_eq!(status, 201, "{made}");
    let secret = made["key"].as_str().unwrap();
    assert!(secret.starts_with("mr-"), "{secret}");
    assert_eq!(made["name"], "production-app");
    assert_eq!(made["prefix"].as_str().unwrap(), &secret[..8]);
    let (status, list) = admin(&proxy, "GET", "/admin/keys", None).await;
    assert_eq!(status, 200);
    assert_eq!(list["keys"][0]["id"], made["id"]);
    assert!(list["keys"][0].get("key").is_none());
    assert!(
        !list.to_string().contains(&secret[8..]),
        "no secret in the list"
    );
    let id = made["id"].as_str().unwrap();
    let (status, revoked) = admin(&proxy, "DELETE", &format!("/admin/keys/{id}"), None).await;
    assert_eq!((status, revoked["revoked"].as_bool()), (200, Some(true)));
    let (_, list) = admin(&proxy, "GET", "/admin/keys", None).await;
    assert!(list["keys"][0]["revoked_at"].is_u64(), "{list}");
    assert_eq!(list["keys"][0]["revoked"], true);
    let (status, missing) = admin(&proxy, "DELETE", "/admin/keys/key_nope", None).await;
    assert_eq!(status, 404, "{missing}");
    for bad in [
        json!({}),
        json!({"name": ""}),
        json!({"name": "a", "max_concurrent": 0}),
        json!({"name": "a", "color": "red"}),
        json!("text"),
    ] {
        let (status, error) = admin(&proxy, "POST", "/admin/keys", Some(bad.clone())).await;
        assert_eq!(status, 400, "{bad}: {error}");
        assert!(error["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
    }
    proxy.shutdown().await;
}

#[tokio::test]
async fn with_required_keys_a_request_needs_a_valid_key_in_either_header_and_is_refused_in_its_dialect(
) {
    let mut config = with_admin(test_config());
    config.require_api_keys = true;
    let (proxy, _backend, worker) = relay(config).await;
    let (status, refused) = chat_with(&proxy, MODEL, &[]).await;
    assert_eq!(status, 401);
    assert_eq!(refused["error"]["code"], "missing_api_key");
    let messages =
        json!({"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]});
    let (status, _, text) = post_raw(
        &proxy.url(),
        "/v1/messages",
        messages.to_string(),
        &[("x-api-key", "mr-wrong")],
    )
    .await;
    assert_eq!(status, 401);
    let anthropic: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(anthropic["type"], "error", "the Anthropic shape: {text}");
    assert_eq!(anthropic["error"]["type"], "authentication_error");
    let (status, models) = get_json(&proxy.url(), "/v1/models", &[]).await;
    assert_eq!(status, 401, "{models}");

    let (id, secret) = create_key(&proxy, json!({"name": "sdk"})).await;
    let bearer = format!("Bearer {secret}");
    let (status, answer) = chat_with(&proxy, MODEL, &[("authorization", &bearer)]).await;
    assert_eq!(status, 200, "{answer}");
    let (status, _, text) = post_raw(
        &proxy.url(),
        "/v1/messages",
        messages.to_string(),
        &[("x-api-key", &secret)],
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let (status, _) = get_json(&proxy.url(), "/v1/models", &[("authorization", &bearer)]).await;
    assert_eq!(status, 200);

    admin(&proxy, "DELETE", &format!("/admin/keys/{id}"), None).await;
    let (status, refused) = chat_with(&proxy, MODEL, &[("authorization", &bearer)]).await;
    assert_eq!(status, 401);
    assert_eq!(refused["error"]["code"], "invalid_api_key");
    let (_, stats) = admin(&proxy, "GET", "/admin/stats", None).await;
    assert_eq!(stats["client_auth_failures"], 4);
    worker.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn without_required_keys_anyone_is_served_and_a_relay_key_still_counts_and_is_never_passed_on(
) {
    let mut config = with_admin(test_config());
    config.providers[0].forward_client_auth = true;
    let proxy = start_proxy(config).await;
    let backend = MockBackend::start(&[MODEL, "small"]).await;
    let mut worker_config =
        relay_core::worker::WorkerConfig::new(&proxy.url(), SECRET, &backend.url());
    worker_config.forward_client_auth = true;
    let worker = RunningWorker::start_with(worker_config);
    wait_until("the worker registers", || proxy.hub.models().len() == 2).await;
    let (status, _) = chat_with(&proxy, MODEL, &[]).await;
    assert_eq!(status, 200, "keys are off by default, as published");
    let (status, _) = chat_with(
        &proxy,
        MODEL,
        &[("authorization", "Bearer sk-someone-elses")],
    )
    .await;
    assert_eq!(status, 200, "a credential that is not ours is not refused");
    let (_, secret) = create_key(&proxy, json!({"name": "limited", "models": ["small"]})).await;
    let bearer = format!("Bearer {secret}");
    let (status, refused) = chat_with(&proxy, MODEL, &[("authorization", &bearer)]).await;
    assert_eq!(status, 403, "the key's allow-list applies: {refused}");
    assert_eq!(refused["error"]["code"], "model_not_allowed");
    let (status, _) = chat_with(&proxy, "small", &[("authorization", &bearer)]).await;
    assert_eq!(status, 200);
    let seen = backend.seen();
    let forwarded: Vec<Option<&str>> = seen
        .iter()
        .map(|r| r.headers.get("authorization").and_then(|v| v.to_str().ok()))
        .collect();
    assert_eq!(
        forwarded,
        [None, Some("Bearer sk-someone-elses"), None],
        "a client's own credential goes on (forward_client_auth), the relay's key never"
    );
    worker.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_key_s_concurrency_cap_and_requests_per_minute_answer_429_with_retry_after() {
    let (proxy, _backend, worker) = relay(with_admin(test_config())).await;
    let (_, one_at_a_time) = create_key(&proxy, json!({"name": "one", "max_concurrent": 1})).await;
    let bearer = format!("Bearer {one_at_a_time}");
    let slow = json!({"model": MODEL, "messages": [], "mock": {"delay_ms": 1500}}).to_string();
    let running = tokio::spawn({
        let (url, bearer) = (proxy.url(), bearer.clone());
        async move {
            post_raw(
                &url,
                "/v1/chat/completions",
                slow,
                &[("authorization", &bearer)],
            )
            .await
        }
    });
    wait_until("the slow request runs", || {
        proxy.hub.tracked_requests() == 1
    })
    .await;
    let (status, headers, text) = post_raw(
        &proxy.url(),
        "/v1/chat/completions",
        chat(MODEL).to_string(),
        &[("authorization", &bearer)],
    )
    .await;
    assert_eq!(status, 429, "{text}");
    assert!(text.contains("key_concurrency_limit"));
    assert!(headers.contains_key("retry-after"));
    assert_eq!(running.await.unwrap().0, 200);
    let (status, _) = chat_with(&proxy, MODEL, &[("authorization", &bearer)]).await;
    assert_eq!(status, 200, "the finished request freed its place");

    let (_, two_a_minute) =
        create_key(&proxy, json!({"name": "two", "requests_per_minute": 2})).await;
    let bearer = format!("Bearer {two_a_minute}");
    for _ in 0..2 {
        assert_eq!(
            chat_with(&proxy, MODEL, &[("authorization", &bearer)])
                .await
                .0,
            200
        );
    }
    let messages = json!({"model": MODEL, "max_tokens": 8, "messages": []}).to_string();
    let (status, headers, text) = post_raw(
        &proxy.url(),
        "/v1/messages",
        messages,
        &[("x-api-key", &two_a_minute)],
    )
    .await;
    assert_eq!(status, 429);
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["error"]["type"],
        "rate_limit_error",
        "{text}"
    );
    let wait: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=30).contains(&wait), "{wait}");
    worker.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn keys_are_stored_hashed_and_usage_outlives_a_restart() {
    let dir = std::env::temp_dir().join(format!("relay-keys-usage-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let file = dir.join("modelrelay.db");
    let config = || {
        let mut config = with_admin(test_config());
        config.database = DatabaseSetting::Sqlite(file.clone());
        config
    };
    let (proxy, _backend, worker) = relay(config()).await;
    let (id, secret) = create_key(&proxy, json!({"name": "open-webui"})).await;
    let bearer = format!("Bearer {secret}");
    for _ in 0..3 {
        assert_eq!(
            chat_with(&proxy, MODEL, &[("authorization", &bearer)])
                .await
                .0,
            200
        );
    }
    assert_eq!(chat_with(&proxy, "small", &[]).await.0, 200);
    let failing = json!({"model": MODEL, "messages": [], "mock": {"status": 500}}).to_string();
    post_raw(
        &proxy.url(),
        "/v1/chat/completions",
        failing,
        &[("authorization", &bearer)],
    )
    .await;
    worker.stop().await;
    proxy.shutdown().await;

    let stored = std::fs::read(&file).unwrap();
    let contains = |needle: &[u8]| stored.windows(needle.len()).any(|w| w == needle);
    assert!(
        !contains(secret.as_bytes()),
        "the secret is not in the database file"
    );
    assert!(
        !contains(&secret.as_bytes()[8..]),
        "not even its hidden part"
    );

    let again = start_proxy(config()).await;
    let (status, usage) = admin(&again, "GET", "/admin/usage?group_by=key", None).await;
    assert_eq!(status, 200, "{usage}");
    let rows = usage["rows"].as_array().unwrap();
    let row = |group: &str| {
        rows.iter()
            .find(|r| r["group"] == group)
            .cloned()
            .unwrap_or(Value::Null)
    };
    assert_eq!(row(&id)["requests"], 4, "{usage}");
    assert_eq!(row(&id)["errors"], 1);
    assert_eq!(row(&id)["name"], "open-webui");
    assert_eq!(
        row(&id)["output_tokens"],
        9,
        "3 answers of 3 tokens; the failed one none"
    );
    assert_eq!(row("anonymous")["requests"], 1);
    assert_eq!(usage["totals"]["requests"], 5);
    assert!(row(&id)["avg_duration_ms"].as_f64().is_some());
    let (_, by_model) = admin(
        &again,
        "GET",
        &format!("/admin/usage?group_by=model&key={id}"),
        None,
    )
    .await;
    let models: Vec<&str> = by_model["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["group"].as_str().unwrap())
        .collect();
    assert_eq!(models, [MODEL]);
    let response = http()
        .get(format!(
            "{}/admin/usage?group_by=model&format=csv",
            again.url()
        ))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.headers()["content-type"],
        "text/csv; charset=utf-8"
    );
    let csv = response.text().await.unwrap();
    assert!(
        csv.starts_with("model,name,requests,errors,input_tokens,output_tokens"),
        "{csv}"
    );
    assert!(csv.contains(&format!("\r\n{MODEL},,4,1,")), "{csv}");
    // The key still works after the restart: it was kept too.
    let (_, keys) = admin(&again, "GET", "/admin/keys", None).await;
    assert_eq!(keys["keys"][0]["id"], id.as_str());
    assert!(keys["keys"][0]["last_used_at"].is_u64(), "{keys}");
    for bad in [
        "group_by=week",
        "since=yesterday",
        "since=2026-02-01&until=2026-01-01",
        "format=xml",
        "colour=red",
    ] {
        let (status, error) = admin(&again, "GET", &format!("/admin/usage?{bad}"), None).await;
        assert_eq!(status, 400, "{bad}: {error}");
    }
    again.shutdown().await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn the_dashboard_api_shares_the_key_and_usage_handlers() {
    // On loopback without a configured token the control API is open, /admin is not.
    let proxy = start_proxy(test_config()).await;
    let (status, _, made) = post(&proxy.url(), "/api/keys", &json!({"name": "ui"})).await;
    assert_eq!(status, 201, "{made}");
    let (status, list) = get_json(&proxy.url(), "/api/keys", &[]).await;
    assert_eq!(status, 200);
    assert_eq!(list["keys"][0]["name"], "ui");
    let (status, usage) = get_json(&proxy.url(), "/api/usage?group_by=day", &[]).await;
    assert_eq!(
        (status.as_u16(), usage["group_by"].as_str()),
        (200, Some("day"))
    );
    let (status, _) = get_json(&proxy.url(), "/admin/keys", &[]).await;
    assert_eq!(status, 403);
    let (_, status_json) = get_json(&proxy.url(), "/api/status", &[]).await;
    assert_eq!(status_json["node"]["require_api_keys"], false);
    tokio::time::sleep(Duration::from_millis(1)).await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn making_listing_or_revoking_a_key_from_this_machine_needs_a_sign_in() {
    // Loopback, the token generated for the dashboard (not configured): a local user without
    // it must not mint a way past the key requirement, nor see or revoke the keys.
    let mut config = test_config();
    config.admin_token = Some(AdminToken("generated-token-0123456789".into()));
    config.admin_token_origin = TokenOrigin::Stored(std::env::temp_dir().join("admin-token"));
    config.require_api_keys = true;
    let proxy = start_proxy(config).await;
    let (status, _, refused) = post(&proxy.url(), "/api/keys", &json!({"name": "mine"})).await;
    assert_eq!(status, 401, "{refused}");
    assert!(refused.contains("modelrelay dashboard"), "{refused}");
    let (status, _, made) = post_raw(
        &proxy.url(),
        "/api/keys",
        json!({"name": "mine"}).to_string(),
        &[("authorization", "Bearer generated-token-0123456789")],
    )
    .await;
    assert_eq!(status, 201, "{made}");
    let id = serde_json::from_str::<Value>(&made).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let revoke = http()
        .delete(format!("{}/api/keys/{id}", proxy.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(revoke.status(), 401, "revoking too");
    let (status, _) = get_json(&proxy.url(), "/api/keys", &[]).await;
    assert_eq!(status, 401, "and listing");
    let (status, list) = get_json(
        &proxy.url(),
        "/api/keys",
        &[("authorization", "Bearer generated-token-0123456789")],
    )
    .await;
    assert_eq!(
        (status.as_u16(), list["keys"].as_array().map(Vec::len)),
        (200, Some(1)),
        "the key is still there"
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_key_limited_to_some_models_lists_only_those_and_admin_answers_are_never_cached() {
    let (proxy, _backend, worker) = relay(with_admin(test_config())).await;
    let (_, secret) = create_key(&proxy, json!({"name": "small-only", "models": ["small"]})).await;
    let bearer = format!("Bearer {secret}");
    let (status, listed) =
        get_json(&proxy.url(), "/v1/models", &[("authorization", &bearer)]).await;
    assert_eq!(status, 200);
    let ids: Vec<&str> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["small"]);
    let (status, _) = get_json(
        &proxy.url(),
        &format!("/v1/models/{MODEL}"),
        &[("authorization", &bearer)],
    )
    .await;
    assert_eq!(
        status, 404,
        "a model the key may not use is not there for it"
    );
    let (_, everyone) = get_json(&proxy.url(), "/v1/models", &[]).await;
    assert_eq!(everyone["data"].as_array().map(Vec::len), Some(2));
    let response = http()
        .get(format!("{}/admin/keys", proxy.url()))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["cache-control"], "no-store");
    worker.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn metrics_count_requests_under_the_client_key_s_id_and_key_refusals_as_client_auth_failures()
{
    let mut config = with_admin(test_config());
    config.require_api_keys = true;
    let (proxy, _backend, worker) = relay(config).await;
    let (id, secret) = create_key(&proxy, json!({"name": "metered"})).await;
    assert_eq!(
        chat_with(
            &proxy,
            MODEL,
            &[("authorization", &format!("Bearer {secret}"))]
        )
        .await
        .0,
        200
    );
    assert_eq!(
        chat_with(&proxy, MODEL, &[("authorization", "Bearer mr-nope")])
            .await
            .0,
        401
    );
    let response = http()
        .get(format!("{}/metrics", proxy.url()))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    let counted = text.lines().any(|line| {
        line.starts_with("modelrelay_requests_total{")
            && line.contains(&format!("key=\"{id}\""))
            && line.contains("status=\"200\"")
            && line.ends_with(" 1")
    });
    assert!(counted, "the key's request, under its id: {text}");
    assert!(!text.contains(&secret[3..]), "never the secret");
    assert!(
        text.contains("modelrelay_auth_failures_total{kind=\"client\"} 1"),
        "{text}"
    );
    worker.stop().await;
    proxy.shutdown().await;
}
