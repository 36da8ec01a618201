//! Issue 14 §2: two proxies behind one load balancer, sharing a real PostgreSQL server
//! (`DATABASE_URL`): a key made on one works on the other, a revocation reaches the other within
//! its refresh, and usage from both adds up in one place.

use std::time::{Duration, Instant};

use relay_core::proxy::access::admin::{AdminToken, TokenOrigin};
use relay_core::proxy::RunningProxy;
use relay_core::store::DatabaseSetting;
use serde_json::{json, Value};

use crate::postgres_server::TempPostgres;
use crate::support::*;

const ADMIN: &str = "shared-admin-token-0123";

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

#[tokio::test]
async fn a_response_stored_on_one_proxy_is_continued_read_and_deleted_on_another() {
    const MODEL: &str = "chat-model";
    let pg = TempPostgres::start()
        .unwrap_or_else(|why| panic!("a PostgreSQL server for this test: {why}"));
    let backend = ChatOnlyBackend::start(&[MODEL]).await;
    let open = |url: &str| {
        let mut config = test_config();
        config.database = DatabaseSetting::Postgres(url.to_string());
        config
    };
    let a = start_proxy(open(&pg.url)).await;
    let b = start_proxy(open(&pg.url)).await;
    let worker_a = RunningWorker::start(&a, &backend.url(), None, 4);
    let worker_b = RunningWorker::start(&b, &backend.url(), None, 4);
    wait_until("both workers register", || {
        a.hub.models().len() == 1 && b.hub.models().len() == 1
    })
    .await;

    let (status, _, text) = post(
        &a.url(),
        "/v1/responses",
        &json!({"model": MODEL, "input": "My name is Ada."}),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let first: Value = serde_json::from_str(&text).unwrap();
    let id = first["id"].as_str().expect("an id").to_string();
    // The copy is written behind the answer: B finds it once it is there.
    let started = Instant::now();
    let continued = loop {
        let body = json!({"model": MODEL, "previous_response_id": id, "input": "What is my name?"});
        let (status, _, text) = post(&b.url(), "/v1/responses", &body).await;
        if status == 200 {
            break serde_json::from_str::<Value>(&text).unwrap();
        }
        assert_eq!(status, 404, "{text}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "B never found {id}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(continued["previous_response_id"], id.as_str());
    let sent = backend
        .seen()
        .last()
        .cloned()
        .expect("B's worker asked the backend");
    let texts = sent.body["messages"].to_string();
    assert!(
        texts.contains("My name is Ada."),
        "the history from A reached B's backend: {texts}"
    );
    assert!(
        texts.contains("reply to: My name is Ada."),
        "A's answer too: {texts}"
    );

    let (status, fetched) = get_json(&b.url(), &format!("/v1/responses/{id}"), &[]).await;
    assert_eq!(status, 200);
    assert_eq!(fetched["id"], id.as_str());
    let (status, items) = get_json(
        &b.url(),
        &format!("/v1/responses/{id}/input_items?order=asc"),
        &[],
    )
    .await;
    assert_eq!(status, 200, "{items}");
    assert_eq!(items["data"].as_array().map(Vec::len), Some(1), "{items}");
    let deleted = http()
        .delete(format!("{}/v1/responses/{id}", b.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 200);
    let (status, _) = get_json(&b.url(), &format!("/v1/responses/{id}"), &[]).await;
    assert_eq!(status, 404);
    worker_a.stop().await;
    worker_b.stop().await;
    a.shutdown().await;
    b.shutdown().await;
}
