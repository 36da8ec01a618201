//! Issue 14 §2: two proxies behind one load balancer, sharing a real PostgreSQL server
//! (`DATABASE_URL`): a key made on one works on the other, a revocation reaches the other within
//! its refresh, and usage from both adds up in one place.

use std::time::{Duration, Instant};

use relay_core::proxy::control::{AdminToken, TokenOrigin};
use relay_core::proxy::RunningProxy;
use relay_core::store::DatabaseSetting;
use serde_json::{json, Value};

use crate::postgres_server::TempPostgres;
use crate::support::*;

const ADMIN: &str = "shared-admin-token";

async fn proxy_on(url: &str) -> RunningProxy {
    let mut config = test_config();
    config.admin_token = Some(AdminToken(ADMIN.into()));
    config.admin_token_origin = TokenOrigin::Configured;
    config.require_api_keys = true;
    config.database = DatabaseSetting::Postgres(url.to_string());
    start_proxy(config).await
}

async fn admin_json(
    proxy: &RunningProxy,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> Value {
    let mut request = http()
        .request(method, format!("{}{path}", proxy.url()))
        .bearer_auth(ADMIN);
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    let response = request.send().await.expect("admin request");
    assert!(
        response.status().is_success(),
        "{path}: {}",
        response.status()
    );
    serde_json::from_str(&response.text().await.expect("body")).expect("JSON")
}

async fn chat(proxy: &RunningProxy, secret: &str) -> u16 {
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let (status, _, _) = post_raw(
        &proxy.url(),
        "/v1/chat/completions",
        body.to_string(),
        &[("authorization", &format!("Bearer {secret}"))],
    )
    .await;
    status.as_u16()
}

#[tokio::test]
async fn two_proxies_on_one_postgres_share_keys_revocations_and_usage() {
    let pg = TempPostgres::start()
        .unwrap_or_else(|why| panic!("a PostgreSQL server for this test: {why}"));
    let backend = MockBackend::start(&["m"]).await;
    let a = proxy_on(&pg.url).await;
    let b = proxy_on(&pg.url).await;
    let worker_a = RunningWorker::start(&a, &backend.url(), None, 4);
    let worker_b = RunningWorker::start(&b, &backend.url(), None, 4);
    wait_until("both workers register", || {
        a.hub.models().len() == 1 && b.hub.models().len() == 1
    })
    .await;

    let made = admin_json(
        &a,
        reqwest::Method::POST,
        "/admin/keys",
        Some(json!({"name": "shared"})),
    )
    .await;
    let (id, secret) = (made["id"].as_str().unwrap(), made["key"].as_str().unwrap());
    assert_eq!(
        chat(&b, secret).await,
        200,
        "a key made on A works on B at once"
    );
    assert_eq!(chat(&a, secret).await, 200);
    assert_eq!(chat(&b, secret).await, 200);
    let listed = admin_json(&b, reqwest::Method::GET, "/admin/keys", None).await;
    assert_eq!(listed["keys"][0]["id"], id);

    // Usage from both proxies, in one place.
    let started = Instant::now();
    let requests = loop {
        let usage = admin_json(&a, reqwest::Method::GET, "/admin/usage?group_by=key", None).await;
        let requests = usage["totals"]["requests"].as_u64().unwrap_or(0);
        if requests == 3 || started.elapsed() > Duration::from_secs(10) {
            break requests;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(requests, 3, "A's usage counts B's requests too");

    admin_json(
        &a,
        reqwest::Method::DELETE,
        &format!("/admin/keys/{id}"),
        None,
    )
    .await;
    assert_eq!(
        chat(&a, secret).await,
        401,
        "revoked where it was revoked at once"
    );
    let started = Instant::now();
    while chat(&b, secret).await != 401 {
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "B learns of the revocation within its 5 s refresh"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "revocation reached the other proxy in {:?}",
        started.elapsed()
    );
    worker_a.stop().await;
    worker_b.stop().await;
    a.shutdown().await;
    b.shutdown().await;
    // A proxy started later on the same database finds everything.
    let c = proxy_on(&pg.url).await;
    let usage = admin_json(&c, reqwest::Method::GET, "/admin/usage?group_by=key", None).await;
    assert_eq!(usage["rows"][0]["group"], id);
    assert_eq!(usage["rows"][0]["name"], "shared");
    c.shutdown().await;
}

#[tokio::test]
async fn a_proxy_whose_database_url_cannot_be_reached_does_not_start_and_says_why() {
    let mut config = test_config();
    config.database = DatabaseSetting::Postgres(format!(
        "postgres://relay:hunter2@{}/relay",
        dead_addr().await
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let error = match relay_core::proxy::start(config, listener).await {
        Ok(_) => panic!("started without its database"),
        Err(error) => error.to_string(),
    };
    assert!(error.contains("cannot connect to PostgreSQL"), "{error}");
    assert!(
        !error.contains("hunter2"),
        "the password is not shown: {error}"
    );
}
