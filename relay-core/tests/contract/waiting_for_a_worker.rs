//! A request for a model no connected worker serves (walkthrough §7, "No Workers Available"):
//! while its provider exists it waits in the queue, not a 404; it is dispatched the moment a
//! worker registers with the model or announces it in `models_update`, and gets 504 naming the
//! model at the queue timeout. It counts in `/health`'s `queue_depth`, shares the queue bound
//! (so random model names cannot grow the proxy), and a cancelled one frees its slot at once.

use std::time::{Duration, Instant};

use relay_core::protocol::{ModelsUpdateMessage, WorkerToServer};
use serde_json::{json, Value};

use crate::support::*;

const MODEL: &str = "llama3-8b";

fn chat(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hi"}]})
}

async fn health_queue_depth(base: &str) -> u64 {
    let (status, health) = get_json(base, "/health", &[]).await;
    assert_eq!(status, 200, "{health}");
    health["queue_depth"].as_u64().expect("queue_depth")
}

#[tokio::test]
async fn a_model_no_worker_serves_is_queued_not_404_and_dispatched_when_a_worker_registers_with_it()
{
    let proxy = start_proxy(test_config()).await;
    let client = spawn_post(&proxy.url(), "/v1/chat/completions", chat(MODEL));
    wait_until("the request waits in the queue", || {
        proxy.hub.counts().1 == 1
    })
    .await;
    assert_eq!(health_queue_depth(&proxy.url()).await, 1);
    assert!(!client.is_finished(), "no answer while no worker serves it");

    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "rebooted-box", &[MODEL], 1).await;
    let request = worker.next_request().await;
    assert_eq!(request.model, MODEL);
    worker.complete(&request.request_id, r#"{"ok":true}"#).await;
    let (status, _, body) = answer_of(client).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(health_queue_depth(&proxy.url()).await, 0);
    assert_eq!(proxy.hub.tracked_requests(), 0);
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_queued_request_is_dispatched_when_a_connected_worker_announces_its_model_in_models_update(
) {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "w", &["other"], 2).await;
    let client = spawn_post(&proxy.url(), "/v1/chat/completions", chat("just-loaded"));
    wait_until("the request waits in the queue", || {
        proxy.hub.counts().1 == 1
    })
    .await;
    worker
        .assert_nothing_for(Duration::from_millis(200), "w does not serve just-loaded")
        .await;
    worker
        .send(&WorkerToServer::ModelsUpdate(ModelsUpdateMessage {
            warm_ups: None,
            sides_first: None,
            models: vec!["other".into(), "just-loaded".into()],
            current_load: 0,
            going_to_sleep: None,
            context_windows: None,
            model_states: None,
        }))
        .await;
    let request = worker.next_request().await;
    assert_eq!(request.model, "just-loaded");
    worker.complete(&request.request_id, r#"{"ok":true}"#).await;
    assert_eq!(answer_of(client).await.0, 200);
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_model_no_worker_serves_gets_504_at_the_queue_timeout_with_a_message_naming_it() {
    let queue_timeout = Duration::from_millis(400);
    let proxy = start_proxy(config_with_queue_timeout(queue_timeout)).await;
    let (_worker, _) = ScriptedWorker::join(proxy.addr, "w", &["other"], 1).await;
    let started = Instant::now();
    let (status, _, body) = post(&proxy.url(), "/v1/chat/completions", &chat(MODEL)).await;
    assert_eq!(status, 504, "{body}");
    assert!(
        started.elapsed() >= queue_timeout,
        "{:?}",
        started.elapsed()
    );
    let error: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(error["error"]["code"], "queue_timeout");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("queue timeout: no worker available within deadline"),
        "{message}"
    );
    assert!(
        message.contains(&format!("no connected worker serves model {MODEL}")),
        "{message}"
    );
    assert_eq!(proxy.hub.tracked_requests(), 0);
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_cancelled_request_waiting_for_an_unserved_model_frees_its_queue_slot_at_once() {
    let mut config = test_config();
    config.providers[0].limits.max_queue_len = 1;
    let proxy = start_proxy(config).await;
    let client = RawHttpClient::post(proxy.addr, "/v1/chat/completions", &chat(MODEL)).await;
    wait_until("the request waits", || proxy.hub.counts().1 == 1).await;
    let (status, _, body) = post(&proxy.url(), "/v1/chat/completions", &chat("another")).await;
    assert_eq!(status, 429, "the one slot is taken: {body}");

    client.disconnect();
    wait_until_within(Duration::from_secs(1), "the slot is free at once", || {
        proxy.hub.counts().1 == 0
    })
    .await;
    assert_eq!(health_queue_depth(&proxy.url()).await, 0);
    assert_eq!(proxy.hub.tracked_requests(), 0);
    let next = spawn_post(&proxy.url(), "/v1/chat/completions", chat("another"));
    wait_until("the next request takes the slot", || {
        proxy.hub.counts().1 == 1
    })
    .await;
    next.abort();
    proxy.shutdown().await;
}

#[tokio::test]
async fn random_model_names_from_a_hostile_client_are_bounded_by_max_queue_len() {
    let mut config = test_config();
    config.providers[0].limits.max_queue_len = 4;
    let proxy = start_proxy(config).await;
    let mut waiting = Vec::new();
    let mut refused = 0;
    for i in 0..40 {
        let name = format!("random-{i}-{}", "x".repeat(200));
        let client = RawHttpClient::post(proxy.addr, "/v1/chat/completions", &chat(&name)).await;
        if i < 4 {
            wait_until("it waits", || proxy.hub.counts().1 == i + 1).await;
            waiting.push(client);
        } else {
            let mut client = client;
            let answer = client.read_until("\r\n\r\n").await;
            assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
            refused += 1;
        }
    }
    assert_eq!(refused, 36);
    assert_eq!(proxy.hub.counts().1, 4, "never beyond max_queue_len");
    assert_eq!(proxy.hub.tracked_requests(), 4);
    for client in waiting {
        client.disconnect();
    }
    wait_until("every waiting request left", || {
        proxy.hub.tracked_requests() == 0
    })
    .await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_requeued_request_keeps_its_original_queue_deadline() {
    let queue_timeout = Duration::from_millis(1500);
    let proxy = start_proxy(config_with_queue_timeout(queue_timeout)).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "box", &[MODEL], 1).await;
    let submitted = Instant::now();
    let client = spawn_post(&proxy.url(), "/v1/chat/completions", chat(MODEL));
    let _request = worker.next_request().await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    // The box reboots: its request goes back to the queue, where nobody serves the model now.
    worker.crash();
    let (status, _, body) = answer_of(client).await;
    let elapsed = submitted.elapsed();
    assert_eq!(status, 504, "{body}");
    assert!(body.contains(MODEL), "{body}");
    assert!(
        elapsed < queue_timeout + Duration::from_millis(700),
        "the requeued request gave up at the queue deadline it got on arrival, not a fresh \
         one: {elapsed:?}"
    );
    assert_eq!(proxy.hub.tracked_requests(), 0);
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_request_waiting_through_a_worker_reboot_is_served_when_it_is_back() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "box", &[MODEL], 1).await;
    let client = spawn_post(&proxy.url(), "/v1/chat/completions", chat(MODEL));
    let _request = worker.next_request().await;
    worker.crash();
    wait_until("the request waits again", || proxy.hub.counts().1 == 1).await;
    // Asked meanwhile: queued too, not refused.
    let later = spawn_post(&proxy.url(), "/v1/chat/completions", chat(MODEL));
    wait_until("both wait", || proxy.hub.counts().1 == 2).await;
    let (mut back, _) = ScriptedWorker::join(proxy.addr, "box", &[MODEL], 2).await;
    for _ in 0..2 {
        let request = back.next_request().await;
        back.complete(&request.request_id, r#"{"ok":true}"#).await;
    }
    assert_eq!(answer_of(client).await.0, 200);
    assert_eq!(answer_of(later).await.0, 200);
    proxy.shutdown().await;
}
