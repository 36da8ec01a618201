//! Issue 17 §4: priority and fair turns. Under contention one client's flood does not starve
//! another, interactive work overtakes queued batch work, and batch work still completes; the
//! priority comes from the key and the `x-modelrelay-priority` header. A real proxy, a scripted
//! worker of one slot, real HTTP clients.

use std::time::Duration;

use relay_core::proxy::access::admin::{AdminToken, TokenOrigin};
use relay_core::proxy::dispatch::scheduler::BATCH_AGEING_TURNS;
use relay_core::proxy::{ProxyConfig, RunningProxy};
use serde_json::{json, Value};
use tokio::task::JoinHandle;

use crate::support::*;

/// JSON bodies and answers without reqwest's `json` feature.
trait JsonBody {
    fn json_body(self, body: &Value) -> Self;
}

impl JsonBody for reqwest::RequestBuilder {
    fn json_body(self, body: &Value) -> Self {
        self.header("content-type", "application/json")
            .body(body.to_string())
    }
}

async fn json_of(response: reqwest::Response) -> Value {
    let text = response.text().await.expect("body");
    serde_json::from_str(&text).unwrap_or(Value::String(text))
}

const ADMIN: &str = "admin-token-for-fair-turns";
const MODEL: &str = "m";

/// A proxy whose queue holds a flood, with the admin API open to the test.
async fn proxy() -> RunningProxy {
    let mut config: ProxyConfig = test_config();
    config.admin_token = Some(AdminToken(ADMIN.into()));
    config.admin_token_origin = TokenOrigin::Configured;
    config.providers[0].limits.max_queue_len = 2_000;
    config.providers[0].limits.queue_timeout = Duration::from_secs(60);
    start_proxy(config).await
}

/// Makes a client key with `extra` settings; returns its secret.
async fn key(proxy: &RunningProxy, name: &str, extra: Value) -> String {
    let mut body = json!({"name": name});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let response = http()
        .post(format!("{}/admin/keys", proxy.url()))
        .bearer_auth(ADMIN)
        .json_body(&body)
        .send()
        .await
        .expect("admin request");
    assert_eq!(response.status().as_u16(), 201);
    let made = json_of(response).await;
    made["key"].as_str().expect("the secret").to_string()
}

/// A chat request whose prompt is `tag`, so the worker can tell who sent it.
fn spawn_chat(
    proxy: &RunningProxy,
    tag: &str,
    key: Option<&str>,
    priority: Option<&str>,
) -> JoinHandle<(u16, String)> {
    let mut request = http()
        .post(format!("{}/v1/chat/completions", proxy.url()))
        .json_body(&json!({"model": MODEL, "messages": [{"role": "user", "content": tag}]}));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    if let Some(priority) = priority {
        request = request.header("x-modelrelay-priority", priority);
    }
    tokio::spawn(async move {
        let response = request.send().await.expect("answered");
        let status = response.status().as_u16();
        (status, response.text().await.unwrap_or_default())
    })
}

fn queued(proxy: &RunningProxy) -> usize {
    proxy.hub.queue_depths().iter().map(|(_, n)| n).sum()
}

/// The prompt of a dispatched request (its tag).
fn tag_of(request: &relay_core::protocol::RequestMessage) -> String {
    let body: Value = serde_json::from_str(&request.body).expect("json body");
    body["messages"][0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Answers the request the worker runs and returns the tag of the one it gets next.
async fn finish_and_take_next(
    worker: &mut ScriptedWorker,
    running: &relay_core::protocol::RequestMessage,
) -> relay_core::protocol::RequestMessage {
    worker
        .complete(&running.request_id, r#"{"choices":[]}"#)
        .await;
    worker.next_request().await
}

#[tokio::test]
async fn one_keys_flood_of_a_thousand_requests_delays_another_keys_request_by_one_slot_turn() {
    let proxy = proxy().await;
    let flood_key = key(&proxy, "flood", json!({})).await;
    let other_key = key(&proxy, "other", json!({})).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "one-slot", &[MODEL], 1).await;
    let flood: Vec<_> = (0..1000)
        .map(|i| spawn_chat(&proxy, &format!("flood-{i}"), Some(&flood_key), None))
        .collect();
    let mut running = worker.next_request().await;
    assert!(tag_of(&running).starts_with("flood-"));
    wait_until_within(Duration::from_secs(30), "the flood queues", || {
        queued(&proxy) == 999
    })
    .await;
    let other = spawn_chat(&proxy, "other", Some(&other_key), None);
    wait_until("the other key's request queues", || queued(&proxy) == 1000).await;
    // The flood's running request ends: that is the one turn the other key waits.
    running = finish_and_take_next(&mut worker, &running).await;
    assert_eq!(
        tag_of(&running),
        "other",
        "the next slot turn is the other key's"
    );
    running = finish_and_take_next(&mut worker, &running).await;
    assert!(
        tag_of(&running).starts_with("flood-"),
        "then the flood resumes"
    );
    let (status, _) = tokio::time::timeout(WAIT, other)
        .await
        .expect("answered in time")
        .expect("client task");
    assert_eq!(status, 200);
    // One of the flood's requests was answered, one runs, the rest still wait.
    let answered = flood.iter().filter(|task| task.is_finished()).count();
    assert!(
        answered <= 1,
        "{answered} flood answers reached their clients already"
    );
    assert_eq!(queued(&proxy), 998);
    for task in flood {
        task.abort();
    }
    // Its clients are gone: the worker need not finish the flood before the proxy stops.
    worker.crash();
    proxy.shutdown().await;
}

#[tokio::test]
async fn an_interactive_request_overtakes_a_batch_keys_queued_work_which_still_completes() {
    let proxy = proxy().await;
    let agent = key(&proxy, "agent", json!({"priority": "batch"})).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "one-slot", &[MODEL], 1).await;
    let batch: Vec<_> = (0..4)
        .map(|i| spawn_chat(&proxy, &format!("batch-{i}"), Some(&agent), None))
        .collect();
    let mut running = worker.next_request().await;
    wait_until("the batch work queues", || queued(&proxy) == 3).await;
    // The agent's key is batch: asking for interactive does not raise it.
    let raised = spawn_chat(
        &proxy,
        "agent-asks-interactive",
        Some(&agent),
        Some("interactive"),
    );
    wait_until("it queues", || queued(&proxy) == 4).await;
    let person = spawn_chat(&proxy, "person", None, None);
    wait_until("the person's request queues", || queued(&proxy) == 5).await;
    running = finish_and_take_next(&mut worker, &running).await;
    assert_eq!(
        tag_of(&running),
        "person",
        "interactive goes before queued batch work"
    );
    let mut order = Vec::new();
    for _ in 0..4 {
        running = finish_and_take_next(&mut worker, &running).await;
        order.push(tag_of(&running));
    }
    worker
        .complete(&running.request_id, r#"{"choices":[]}"#)
        .await;
    // The agent's requests, in the order they arrived (the first four raced each other).
    assert!(
        order[..3].iter().all(|t| t.starts_with("batch-")),
        "every batch request ran: {order:?}"
    );
    assert_eq!(order[3], "agent-asks-interactive", "{order:?}");
    for task in batch.into_iter().chain([raised, person]) {
        let (status, body) = tokio::time::timeout(WAIT, task)
            .await
            .expect("answered in time")
            .expect("client task");
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(queued(&proxy), 0);
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_batch_request_gets_a_slot_after_the_ageing_bound_while_interactive_work_keeps_coming() {
    let proxy = proxy().await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "one-slot", &[MODEL], 1).await;
    let first = spawn_chat(&proxy, "first", None, None);
    let mut running = worker.next_request().await;
    let batch = spawn_chat(&proxy, "batch", None, Some("batch"));
    wait_until("the batch request queues", || queued(&proxy) == 1).await;
    let interactive_count = BATCH_AGEING_TURNS as usize + 4;
    let mut interactive = Vec::new();
    for i in 0..interactive_count {
        interactive.push(spawn_chat(&proxy, &format!("person-{i}"), None, None));
        wait_until("it queues", || queued(&proxy) == i + 2).await;
    }
    let mut order = Vec::new();
    for _ in 0..=interactive_count {
        running = finish_and_take_next(&mut worker, &running).await;
        order.push(tag_of(&running));
    }
    worker
        .complete(&running.request_id, r#"{"choices":[]}"#)
        .await;
    let position = order.iter().position(|t| t == "batch").expect("batch ran");
    assert_eq!(
        position, BATCH_AGEING_TURNS as usize,
        "interactive work took {BATCH_AGEING_TURNS} turns, then batch got one: {order:?}"
    );
    for task in interactive.into_iter().chain([first, batch]) {
        let (status, _) = tokio::time::timeout(WAIT, task)
            .await
            .expect("answered in time")
            .expect("client task");
        assert_eq!(status, 200);
    }
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_bad_priority_header_is_refused_with_a_400_in_the_routes_dialect() {
    let proxy = proxy().await;
    let openai = http()
        .post(format!("{}/v1/chat/completions", proxy.url()))
        .header("x-modelrelay-priority", "urgent")
        .json_body(&json!({"model": MODEL, "messages": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(openai.status().as_u16(), 400);
    let body = json_of(openai).await;
    assert_eq!(body["error"]["code"], "invalid_priority");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("must be `interactive` or `batch`, got \"urgent\""));
    let anthropic = http()
        .post(format!("{}/v1/messages", proxy.url()))
        .header("x-modelrelay-priority", "x".repeat(4000))
        .json_body(&json!({"model": MODEL, "max_tokens": 1, "messages": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(anthropic.status().as_u16(), 400);
    let body = json_of(anthropic).await;
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("a value of 4000 bytes"), "{message}");
    let twice = http()
        .post(format!("{}/v1/chat/completions", proxy.url()))
        .header("x-modelrelay-priority", "batch")
        .header("x-modelrelay-priority", "batch")
        .json_body(&json!({"model": MODEL, "messages": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(twice.status().as_u16(), 400);
    assert_eq!(queued(&proxy), 0, "nothing refused was queued");
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_keys_priority_is_set_when_it_is_made_and_shown_by_the_admin_api() {
    let proxy = proxy().await;
    let admin = |body: Value| {
        http()
            .post(format!("{}/admin/keys", proxy.url()))
            .bearer_auth(ADMIN)
            .json_body(&body)
            .send()
    };
    let made = admin(json!({"name": "agent", "priority": "batch"}))
        .await
        .unwrap();
    assert_eq!(made.status().as_u16(), 201);
    assert_eq!(json_of(made).await["priority"], "batch");
    let made = admin(json!({"name": "chat"})).await.unwrap();
    assert_eq!(json_of(made).await["priority"], "interactive");
    for bad in [json!("urgent"), json!(2), json!(null), json!(["batch"])] {
        let refused = admin(json!({"name": "x", "priority": bad})).await.unwrap();
        assert_eq!(refused.status().as_u16(), 400, "{bad}");
        let body = json_of(refused).await;
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("priority"),
            "{body}"
        );
    }
    let listed = json_of(
        http()
            .get(format!("{}/admin/keys", proxy.url()))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap(),
    )
    .await;
    let mut priorities: Vec<&str> = listed["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["priority"].as_str().unwrap())
        .collect();
    priorities.sort_unstable();
    assert_eq!(priorities, ["batch", "interactive"]);
    proxy.shutdown().await;
}

/// A client that connects from `ip` (any 127.x.y.z address is this machine on Linux).
fn client_from(ip: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .local_address(Some(ip.parse().expect("ip")))
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client")
}

#[tokio::test]
async fn requests_without_a_key_take_turns_per_client_address() {
    let proxy = proxy().await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "one-slot", &[MODEL], 1).await;
    let send = |client: reqwest::Client, tag: String| {
        let request = client
            .post(format!("{}/v1/chat/completions", proxy.url()))
            .json_body(&json!({"model": MODEL, "messages": [{"role": "user", "content": tag}]}));
        tokio::spawn(async move { request.send().await.expect("answered").status().as_u16() })
    };
    let busy = client_from("127.0.0.1");
    let tasks: Vec<_> = (0..5)
        .map(|i| send(busy.clone(), format!("busy-{i}")))
        .collect();
    let mut running = worker.next_request().await;
    wait_until("the busy machine's requests queue", || queued(&proxy) == 4).await;
    let other = send(client_from("127.0.0.2"), "other-machine".into());
    wait_until("the other machine's request queues", || queued(&proxy) == 5).await;
    running = finish_and_take_next(&mut worker, &running).await;
    assert_eq!(tag_of(&running), "other-machine");
    for _ in 0..4 {
        running = finish_and_take_next(&mut worker, &running).await;
        assert!(tag_of(&running).starts_with("busy-"));
    }
    worker
        .complete(&running.request_id, r#"{"choices":[]}"#)
        .await;
    for task in tasks.into_iter().chain([other]) {
        let status = tokio::time::timeout(WAIT, task)
            .await
            .expect("answered in time")
            .expect("client task");
        assert_eq!(status, 200);
    }
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_key_of_weight_three_gets_three_slot_turns_for_each_of_a_weight_one_key() {
    let proxy = proxy().await;
    let team = key(&proxy, "team", json!({"weight": 3})).await;
    let solo = key(&proxy, "solo", json!({})).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "one-slot", &[MODEL], 1).await;
    let blocker = spawn_chat(&proxy, "blocker", None, None);
    let mut running = worker.next_request().await;
    let mut clients = vec![blocker];
    for i in 0..12 {
        clients.push(spawn_chat(&proxy, &format!("team-{i}"), Some(&team), None));
        clients.push(spawn_chat(&proxy, &format!("solo-{i}"), Some(&solo), None));
    }
    wait_until("both keys' work queues", || queued(&proxy) == 24).await;
    let mut served = Vec::new();
    for _ in 0..16 {
        running = finish_and_take_next(&mut worker, &running).await;
        served.push(tag_of(&running));
    }
    let team_turns = served.iter().filter(|t| t.starts_with("team-")).count();
    assert_eq!(team_turns, 12, "3 turns to 1: {served:?}");
    // The weight shares turns; each key's own requests keep their order.
    let team_order: Vec<&String> = served.iter().filter(|t| t.starts_with("team-")).collect();
    let expected: Vec<String> = (0..12).map(|i| format!("team-{i}")).collect();
    assert_eq!(team_order, expected.iter().collect::<Vec<_>>());
    for client in clients {
        client.abort();
    }
    worker.crash();
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_weight_outside_one_to_sixteen_is_refused_and_a_keys_weight_is_shown() {
    let proxy = proxy().await;
    for bad in [json!(0), json!(17), json!(-1), json!("3"), json!(1.5)] {
        let refused = http()
            .post(format!("{}/admin/keys", proxy.url()))
            .bearer_auth(ADMIN)
            .json_body(&json!({"name": "x", "weight": bad}))
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status().as_u16(), 400, "{bad}");
        let body = json_of(refused).await;
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("weight"),
            "{body}"
        );
    }
    key(&proxy, "team", json!({"weight": 16})).await;
    let listed = json_of(
        http()
            .get(format!("{}/admin/keys", proxy.url()))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(listed["keys"][0]["weight"], 16, "{listed}");
    proxy.shutdown().await;
}
