//! Worker authentication and registration (contract: "Worker auth and registration",
//! "Capability advertisement", and the invariant that a worker never gains models beyond the ack).

use std::time::Duration;

use relay_core::proxy::access::credentials::FailureLimits;
use relay_core::proxy::dispatch::scheduler::ProviderLimits;
use relay_core::proxy::{ProviderConfig, ProxyConfig};
use serde_json::{json, Value};

use crate::support::*;

/// A WebSocket handshake on the worker endpoint sent as a plain HTTP request, to read the body
/// of a refusal.
async fn connect_refusal(
    base: &str,
    query: &str,
    secret_header: Option<&str>,
) -> (reqwest::StatusCode, reqwest::header::HeaderMap, Value) {
    let mut request = http()
        .get(format!("{base}/v1/worker/connect?{query}"))
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==");
    if let Some(secret) = secret_header {
        request = request.header("x-worker-secret", secret);
    }
    let response = request.send().await.expect("request sent");
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.text().await.expect("body");
    let json =
        serde_json::from_str(&body).unwrap_or_else(|_| panic!("refusal body is JSON: {body:?}"));
    (status, headers, json)
}

fn assert_openai_error(body: &Value) {
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "OpenAI error shape has error.message: {body}"
    );
    assert!(
        body["error"]["type"].is_string(),
        "OpenAI error shape has error.type: {body}"
    );
    assert!(
        body["error"].get("code").is_some(),
        "OpenAI error shape has error.code: {body}"
    );
}

fn config_with_limits(limits: ProviderLimits) -> ProxyConfig {
    let mut config = test_config();
    config.providers[0].limits = limits;
    config
}

/// Connects with the right secret and registers a hand-built message; returns the ack or the
/// close reason when the proxy refuses the registration.
async fn register_outcome(
    proxy: &relay_core::proxy::RunningProxy,
    register: relay_core::protocol::RegisterMessage,
) -> Result<relay_core::protocol::RegisterAck, String> {
    let mut worker = ScriptedWorker::connect(proxy.addr).await;
    worker
        .send(&relay_core::protocol::WorkerToServer::Register(register))
        .await;
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::Message;
    loop {
        let frame = tokio::time::timeout(WAIT, worker.socket.next())
            .await
            .expect("an answer to register in time");
        match frame {
            Some(Ok(Message::Text(text))) => {
                match serde_json::from_str::<relay_core::protocol::ServerToWorker>(&text)
                    .expect("valid server message")
                {
                    relay_core::protocol::ServerToWorker::RegisterAck(ack) => return Ok(ack),
                    relay_core::protocol::ServerToWorker::Ping(_) => continue,
                    other => panic!("expected register_ack or close, got {other:?}"),
                }
            }
            Some(Ok(Message::Close(frame))) => {
                return Err(frame.map(|f| f.reason.to_string()).unwrap_or_default())
            }
            Some(Ok(_)) => continue,
            Some(Err(_)) | None => return Err(String::new()),
        }
    }
}

#[tokio::test]
async fn worker_secret_in_x_worker_secret_header_is_accepted() {
    let proxy = start_proxy(test_config()).await;
    let mut worker = try_connect(proxy.addr, "local", Some(SECRET), None)
        .await
        .expect("the header secret is accepted");
    let ack = worker.register("gpu-box-1", &["llama3-8b"], 4).await;
    assert!(!ack.worker_id.is_empty(), "the ack carries a worker id");
    assert_eq!(ack.models, vec!["llama3-8b"]);
    wait_until("the worker is counted", || proxy.hub.counts().0 == 1).await;
}

#[tokio::test]
async fn worker_secret_in_query_string_is_accepted_for_backward_compatibility() {
    let proxy = start_proxy(test_config()).await;
    let mut worker = try_connect(proxy.addr, "local", None, Some(SECRET))
        .await
        .expect("the query-string secret is accepted");
    let ack = worker.register("legacy-box", &["llama3-8b"], 1).await;
    assert_eq!(ack.models, vec!["llama3-8b"]);
    wait_until("the worker is counted", || proxy.hub.counts().0 == 1).await;
}

#[tokio::test]
async fn a_worker_sending_its_secret_in_the_header_and_the_url_is_refused() {
    // The URL form is for workers older than the header: one that sends the header has no
    // reason to put the secret where access logs keep it.
    let proxy = start_proxy(test_config()).await;
    let refused = try_connect(proxy.addr, "local", Some(SECRET), Some(SECRET)).await;
    assert_eq!(refused.err(), Some(reqwest::StatusCode::BAD_REQUEST));
    assert_eq!(proxy.hub.counts().0, 0, "no worker joined");
}

#[tokio::test]
async fn wrong_worker_secret_is_refused_with_401_in_openai_error_shape() {
    let proxy = start_proxy(test_config()).await;
    let refused = try_connect(proxy.addr, "local", Some("not-the-secret"), None).await;
    assert_eq!(refused.err(), Some(reqwest::StatusCode::UNAUTHORIZED));
    let refused = try_connect(proxy.addr, "local", None, Some("not-the-secret")).await;
    assert_eq!(refused.err(), Some(reqwest::StatusCode::UNAUTHORIZED));
    let (status, _, body) =
        connect_refusal(&proxy.url(), "provider=local", Some("not-the-secret")).await;
    assert_eq!(status, 401);
    assert_openai_error(&body);
    assert_eq!(proxy.hub.counts().0, 0, "no worker joined");
}

#[tokio::test]
async fn missing_worker_secret_is_refused_with_401_in_openai_error_shape() {
    let proxy = start_proxy(test_config()).await;
    let refused = try_connect(proxy.addr, "local", None, None).await;
    assert_eq!(refused.err(), Some(reqwest::StatusCode::UNAUTHORIZED));
    let (status, _, body) = connect_refusal(&proxy.url(), "provider=local", None).await;
    assert_eq!(status, 401);
    assert_openai_error(&body);
    assert_eq!(proxy.hub.counts().0, 0, "no worker joined");
}

#[tokio::test]
async fn unknown_provider_is_refused() {
    let proxy = start_proxy(test_config()).await;
    let refused = try_connect(proxy.addr, "no-such-provider", Some(SECRET), None).await;
    let status = refused.err().expect("an unknown provider is refused");
    assert!(status.is_client_error(), "refused with a 4xx, got {status}");
    let (status, _, body) =
        connect_refusal(&proxy.url(), "provider=no-such-provider", Some(SECRET)).await;
    assert!(status.is_client_error(), "refused with a 4xx, got {status}");
    assert_openai_error(&body);
    assert_eq!(proxy.hub.counts().0, 0, "no worker joined");
}

#[tokio::test]
async fn disabled_provider_is_refused_even_with_its_secret() {
    let mut config = test_config();
    config.providers.push(ProviderConfig {
        name: "paused".to_string(),
        secret: "paused-secret".to_string(),
        forward_client_auth: false,
        limits: ProviderLimits {
            enabled: false,
            ..ProviderLimits::default()
        },
    });
    let proxy = start_proxy(config).await;
    let refused = try_connect(proxy.addr, "paused", Some("paused-secret"), None).await;
    let status = refused.err().expect("a disabled provider is refused");
    assert!(
        status.is_client_error() || status.is_server_error(),
        "refused with an error status, got {status}"
    );
    let (_, _, body) =
        connect_refusal(&proxy.url(), "provider=paused", Some("paused-secret")).await;
    assert_openai_error(&body);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Provider is currently disabled"),
        "stable client message for a disabled provider: {body}"
    );
    // The enabled provider next to it still accepts workers.
    let (_worker, ack) = ScriptedWorker::join(proxy.addr, "ok", &["m"], 1).await;
    assert_eq!(ack.models, vec!["m"]);
    assert_eq!(proxy.hub.counts().0, 1);
}

#[tokio::test]
async fn repeated_failed_auth_from_one_ip_is_rate_limited_with_429_and_retry_after() {
    let mut config = test_config();
    config.auth_failures = FailureLimits {
        max_failures: 2,
        window: Duration::from_secs(30),
        max_tracked: 100,
        ..FailureLimits::default()
    };
    let proxy = start_proxy(config).await;
    for attempt in 0..2 {
        let refused = try_connect(proxy.addr, "local", Some("wrong"), None).await;
        assert_eq!(
            refused.err(),
            Some(reqwest::StatusCode::UNAUTHORIZED),
            "attempt {attempt} is an ordinary auth failure"
        );
    }
    let (status, headers, body) =
        connect_refusal(&proxy.url(), "provider=local", Some("wrong")).await;
    assert_eq!(status, 429, "over the limit: {body}");
    let retry_after: u64 = headers
        .get("retry-after")
        .expect("Retry-After header")
        .to_str()
        .unwrap()
        .parse()
        .expect("Retry-After in seconds");
    assert!(
        (1..=30).contains(&retry_after),
        "retry after {retry_after}s"
    );
    assert_openai_error(&body);
    // While blocked, even the right secret is turned away from this IP.
    let refused = try_connect(proxy.addr, "local", Some(SECRET), None).await;
    assert_eq!(refused.err(), Some(reqwest::StatusCode::TOO_MANY_REQUESTS));
    assert_eq!(proxy.hub.counts().0, 0);
}

#[tokio::test]
async fn failed_auth_rate_limit_expires_after_its_window() {
    let mut config = test_config();
    config.auth_failures = FailureLimits {
        max_failures: 1,
        window: Duration::from_millis(400),
        max_tracked: 100,
        ..FailureLimits::default()
    };
    let proxy = start_proxy(config).await;
    let refused = try_connect(proxy.addr, "local", Some("wrong"), None).await;
    assert_eq!(refused.err(), Some(reqwest::StatusCode::UNAUTHORIZED));
    let refused = try_connect(proxy.addr, "local", Some(SECRET), None).await;
    assert_eq!(refused.err(), Some(reqwest::StatusCode::TOO_MANY_REQUESTS));
    tokio::time::sleep(Duration::from_millis(600)).await;
    let mut worker = try_connect(proxy.addr, "local", Some(SECRET), None)
        .await
        .expect("the block expired with its window");
    let ack = worker.register("w", &["m"], 1).await;
    assert_eq!(ack.models, vec!["m"]);
}

#[tokio::test]
async fn register_ack_trims_drops_empty_and_deduplicates_models_keeping_first_seen_order() {
    let proxy = start_proxy(test_config()).await;
    let mut worker = ScriptedWorker::connect(proxy.addr).await;
    let ack = worker
        .register_message(register_message(
            "w",
            &[
                "  zeta ", "", "alpha", "zeta", "   ", "beta\t", "alpha", "gamma",
            ],
            2,
            Some("1"),
            Some(0),
        ))
        .await;
    assert_eq!(ack.models, vec!["zeta", "alpha", "beta", "gamma"]);
    assert!(
        !ack.warnings.is_empty(),
        "what sanitization changed is surfaced in register_ack: {ack:?}"
    );
    let workers = proxy.hub.workers();
    assert_eq!(workers.len(), 1);
    assert_eq!(workers[0].models, ack.models, "routing uses the acked list");
}

#[tokio::test]
async fn register_ack_caps_models_at_the_provider_limit_with_warnings() {
    let proxy = start_proxy(config_with_limits(ProviderLimits {
        max_models_per_worker: 3,
        ..ProviderLimits::default()
    }))
    .await;
    let mut worker = ScriptedWorker::connect(proxy.addr).await;
    let ack = worker
        .register_message(register_message(
            "w",
            &["m1", "m2", "m2", "m3", "m4", "m5"],
            2,
            Some("1"),
            Some(0),
        ))
        .await;
    assert_eq!(ack.models, vec!["m1", "m2", "m3"]);
    assert!(
        !ack.warnings.is_empty(),
        "truncation is surfaced as a warning in register_ack: {ack:?}"
    );
}

#[tokio::test]
async fn register_without_protocol_version_is_accepted_as_legacy() {
    let proxy = start_proxy(test_config()).await;
    let ack = register_outcome(&proxy, register_message("legacy", &["m"], 1, None, None))
        .await
        .expect("a legacy worker is tolerated");
    assert_eq!(ack.models, vec!["m"]);
    wait_until("the worker is counted", || proxy.hub.counts().0 == 1).await;
}

#[tokio::test]
async fn register_with_seed_protocol_version_1_is_accepted() {
    let proxy = start_proxy(test_config()).await;
    let ack = register_outcome(&proxy, register_message("w", &["m"], 1, Some("1"), Some(0)))
        .await
        .expect("protocol version 1 is accepted");
    assert_eq!(ack.models, vec!["m"]);
}

#[tokio::test]
async fn register_with_bridge_protocol_version_is_accepted() {
    let proxy = start_proxy(test_config()).await;
    let ack = register_outcome(
        &proxy,
        register_message("w", &["m"], 1, Some("2026-04-bridge-v1"), Some(0)),
    )
    .await
    .expect("the published worker's protocol version is accepted");
    assert_eq!(ack.models, vec!["m"]);
}

#[tokio::test]
async fn mismatched_protocol_version_is_closed_with_a_protocol_error() {
    let proxy = start_proxy(config_with_queue_timeout(Duration::from_millis(200))).await;
    let reason = register_outcome(
        &proxy,
        register_message("future", &["m"], 1, Some("2099-01-galaxy-v9"), Some(0)),
    )
    .await
    .expect_err("a mismatched protocol version is not acked");
    assert!(
        reason.to_lowercase().contains("protocol"),
        "the close reason names the protocol problem: {reason:?}"
    );
    assert_eq!(proxy.hub.counts().0, 0, "the worker did not join");
    let (status, _, _) = post(
        &proxy.url(),
        "/v1/chat/completions",
        &json!({"model": "m", "messages": []}),
    )
    .await;
    assert_eq!(
        status, 504,
        "its models are not routed: they wait and time out"
    );
}

#[tokio::test]
async fn first_message_other_than_register_closes_the_connection() {
    let proxy = start_proxy(test_config()).await;
    let mut worker = ScriptedWorker::connect(proxy.addr).await;
    worker
        .send_text(r#"{"type":"pong","current_load":0}"#)
        .await;
    let _reason = worker.closed().await;
    assert_eq!(proxy.hub.counts().0, 0, "the worker did not join");
    // A frame after the close goes nowhere: still nobody registered.
    assert!(proxy.hub.workers().is_empty());
}

#[tokio::test]
async fn worker_is_never_routed_models_beyond_its_register_ack() {
    let proxy = start_proxy(config_with_limits(ProviderLimits {
        max_models_per_worker: 2,
        queue_timeout: Duration::from_millis(200),
        ..ProviderLimits::default()
    }))
    .await;
    let (mut worker, ack) = ScriptedWorker::join(proxy.addr, "w", &["a", "b", "c"], 4).await;
    assert_eq!(ack.models, vec!["a", "b"]);

    let (status, models) = get_json(&proxy.url(), "/v1/models", &[]).await;
    assert_eq!(status, 200);
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["a", "b"], "/v1/models lists only acked models");

    let (status, _, body) = post(
        &proxy.url(),
        "/v1/chat/completions",
        &json!({"model": "c", "messages": []}),
    )
    .await;
    assert_eq!(
        status, 504,
        "a model dropped at registration is not routed: {body}"
    );
    worker
        .assert_nothing_for(
            Duration::from_millis(200),
            "model c must not reach the worker",
        )
        .await;

    // Acked models are routed.
    let task = spawn_post(&proxy.url(), "/v1/chat/completions", json!({"model": "b"}));
    let request = worker.next_request().await;
    assert_eq!(request.model, "b");
    worker.complete(&request.request_id, r#"{"ok":true}"#).await;
    assert_eq!(answer_of(task).await.0, 200);
}

#[tokio::test]
async fn models_update_is_sanitized_like_registration() {
    let proxy = start_proxy(config_with_limits(ProviderLimits {
        max_models_per_worker: 2,
        queue_timeout: Duration::from_millis(200),
        ..ProviderLimits::default()
    }))
    .await;
    let (mut worker, _ack) = ScriptedWorker::join(proxy.addr, "w", &["a"], 4).await;
    worker
        .send(&relay_core::protocol::WorkerToServer::ModelsUpdate(
            relay_core::protocol::ModelsUpdateMessage {
                warm_ups: None,
                sides_first: None,
                models: vec![" b ".into(), "".into(), "b".into(), "c".into(), "d".into()],
                current_load: 0,
                going_to_sleep: None,
                context_windows: None,
                model_states: None,
            },
        ))
        .await;
    wait_until("the update is applied", || {
        proxy.hub.workers()[0].models == vec!["b".to_string(), "c".to_string()]
    })
    .await;
    let (status, _, _) = post(
        &proxy.url(),
        "/v1/chat/completions",
        &json!({"model": "d", "messages": []}),
    )
    .await;
    assert_eq!(status, 504, "a model beyond the cap is not routed");
    worker
        .assert_nothing_for(
            Duration::from_millis(200),
            "model d must not reach the worker",
        )
        .await;
}

#[tokio::test]
async fn beyond_max_workers_a_joining_worker_gets_503_and_joins_once_a_slot_frees() {
    let mut config = test_config();
    config.max_workers = 2;
    let proxy = start_proxy(config).await;
    let (first, _) = ScriptedWorker::join(proxy.addr, "a", &["m"], 1).await;
    let (_second, _) = ScriptedWorker::join(proxy.addr, "b", &["m"], 1).await;
    let refused = try_connect(proxy.addr, "local", Some(SECRET), None).await;
    assert_eq!(
        refused.err(),
        Some(axum::http::StatusCode::SERVICE_UNAVAILABLE)
    );
    first.crash();
    wait_until("the first worker is gone", || proxy.hub.counts().0 == 1).await;
    let deadline = std::time::Instant::now() + WAIT;
    let third = loop {
        match try_connect(proxy.addr, "local", Some(SECRET), None).await {
            Ok(worker) => break worker,
            Err(status) => {
                assert_eq!(status, axum::http::StatusCode::SERVICE_UNAVAILABLE);
                assert!(std::time::Instant::now() < deadline, "no slot freed");
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
    };
    drop(third);
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_plain_http_request_to_the_worker_endpoint_gets_426_before_any_authentication() {
    let mut config = test_config();
    config.auth_failures = FailureLimits {
        max_failures: 1,
        ..FailureLimits::default()
    };
    let proxy = start_proxy(config).await;
    let url = format!("{}/v1/worker/connect", proxy.url());
    // No secret, a wrong one, the right one: a request that is not a handshake learns what the
    // endpoint is, whatever it carries.
    for secret in [None, Some("wrong"), Some(SECRET)] {
        let mut request = http().get(&url);
        if let Some(secret) = secret {
            request = request.header("x-worker-secret", secret);
        }
        let response = request.send().await.expect("request sent");
        assert_eq!(response.status(), 426, "secret {secret:?}");
        assert_eq!(response.headers()["upgrade"], "websocket");
        let body: Value =
            serde_json::from_str(&response.text().await.expect("body")).expect("JSON body");
        assert_openai_error(&body);
        assert_eq!(body["error"]["code"], "websocket_required");
    }
    // A handshake missing its key is malformed: 400, still before authentication.
    let response = http()
        .get(&url)
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .send()
        .await
        .expect("request sent");
    assert_eq!(response.status(), 400);
    // None of these counted as a failed login (one failure would lock this address out).
    let mut worker = try_connect(proxy.addr, "local", Some(SECRET), None)
        .await
        .expect("not rate-limited by plain requests");
    let ack = worker.register("w", &["m"], 1).await;
    assert_eq!(ack.models, vec!["m"]);
}

#[tokio::test]
async fn three_failed_worker_logins_lock_the_address_out_even_with_the_right_secret_until_the_lockout_ends(
) {
    let defaults = FailureLimits::default();
    assert_eq!(defaults.max_failures, 3, "a short burst of 3");
    assert!(
        defaults.window <= Duration::from_secs(10),
        "a short lockout: {:?}",
        defaults.window
    );
    let mut config = test_config();
    // The default burst size, with a lockout short enough to wait for here.
    config.auth_failures = FailureLimits {
        window: Duration::from_millis(600),
        ..defaults
    };
    let proxy = start_proxy(config).await;
    for attempt in 0..3 {
        let refused = try_connect(proxy.addr, "local", Some("wrong"), None).await;
        assert_eq!(
            refused.err(),
            Some(reqwest::StatusCode::UNAUTHORIZED),
            "attempt {attempt}"
        );
    }
    let (status, headers, body) =
        connect_refusal(&proxy.url(), "provider=local", Some(SECRET)).await;
    assert_eq!(status, 429, "locked out even with the right secret: {body}");
    assert!(headers.contains_key("retry-after"));
    assert_openai_error(&body);
    assert_eq!(proxy.hub.counts().0, 0);
    tokio::time::sleep(Duration::from_millis(800)).await;
    let mut worker = try_connect(proxy.addr, "local", Some(SECRET), None)
        .await
        .expect("the lockout ended by itself");
    let ack = worker.register("w", &["m"], 1).await;
    assert_eq!(ack.models, vec!["m"]);
}

#[tokio::test]
async fn register_ack_warns_about_a_blank_name_no_models_zero_max_concurrent_and_a_duplicate_name()
{
    let proxy = start_proxy(test_config()).await;
    let (_first, ack) = ScriptedWorker::join(proxy.addr, "gpu-box", &["m"], 1).await;
    assert!(ack.warnings.is_empty(), "{:?}", ack.warnings);

    let mut blank = ScriptedWorker::connect(proxy.addr).await;
    let ack = blank
        .register_message(register_message("   ", &[], 0, Some("1"), Some(0)))
        .await;
    let warnings = ack.warnings.join("\n");
    assert!(warnings.contains("name is blank"), "{warnings}");
    assert!(warnings.contains("no usable model"), "{warnings}");
    assert!(warnings.contains("max_concurrent 0"), "{warnings}");

    let mut twin = ScriptedWorker::connect(proxy.addr).await;
    let ack = twin
        .register_message(register_message("gpu-box", &["m"], 1, Some("1"), Some(0)))
        .await;
    assert!(
        ack.warnings
            .iter()
            .any(|w| w.contains("also named \"gpu-box\"")),
        "{:?}",
        ack.warnings
    );
    // Warnings do not refuse: all three are connected.
    wait_until("all three are counted", || proxy.hub.counts().0 == 3).await;
}
