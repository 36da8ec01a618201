//! Sleeping boxes (issue 17 §3): a worker that says it goes to sleep (`going_to_sleep`), or
//! that sleeps when idle and leaves, keeps its models listed as asleep; a request for them waits
//! in the queue while a Wake-on-LAN magic packet goes out, and is served when the box
//! reconnects, or gets 504 naming the box at the queue timeout.
//!
//! The "box" is real sockets: a UDP socket on 127.0.0.1 (the proxy's `wake_target`) that
//! waits for a valid magic packet for its MAC, and then connects a worker (the scripted one, or
//! the real worker daemon in front of a mock backend).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};
use relay_core::protocol::{ModelsUpdateMessage, RegisterMessage, WorkerToServer};
use relay_core::proxy::{ProxyConfig, RunningProxy};
use relay_core::wake::MacAddress;
use relay_core::worker::WorkerConfig;
use serde_json::{json, Value};
use tokio::net::UdpSocket;

use crate::support::*;

const MODEL: &str = "llama3-70b";
const MAC: &str = "02:1b:2c:3d:4e:5f";

fn chat(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hi"}]})
}

/// A box's network card: a UDP socket on loopback that the proxy's packets go to.
struct FakeCard {
    socket: UdpSocket,
    mac: MacAddress,
}

impl FakeCard {
    async fn new() -> FakeCard {
        FakeCard {
            socket: UdpSocket::bind("127.0.0.1:0").await.expect("bind udp"),
            mac: MAC.parse().expect("mac"),
        }
    }

    fn addr(&self) -> SocketAddr {
        self.socket.local_addr().expect("addr")
    }

    /// Waits up to `within` for a datagram; true if it is a magic packet for this card.
    /// `None` when nothing arrived.
    async fn packet_within(&self, within: Duration) -> Option<bool> {
        let mut buf = [0u8; 1024];
        match tokio::time::timeout(within, self.socket.recv_from(&mut buf)).await {
            Ok(Ok((len, _))) => Some(self.mac.is_magic_packet(&buf[..len])),
            _ => None,
        }
    }

    /// Waits until a valid magic packet for this card arrives (other datagrams are ignored).
    async fn woken(&self) {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.packet_within(left).await {
                Some(true) => return,
                Some(false) => continue,
                None => panic!("no magic packet for {} within {WAIT:?}", self.mac),
            }
        }
    }
}

fn config_waking(card: &FakeCard, queue_timeout: Duration) -> ProxyConfig {
    let mut config = config_with_queue_timeout(queue_timeout);
    config.wake_target = card.addr();
    config
}

fn register(name: &str, models: &[&str], mac: Option<&str>, sleeps: bool) -> RegisterMessage {
    let mut message = register_message(name, models, 1, Some("1"), Some(0));
    message.mac_address = mac.map(str::to_string);
    message.sleeps_when_idle = sleeps.then_some(true);
    message
}

/// A scripted worker for box `name` that announces it goes to sleep and closes.
async fn box_goes_to_sleep(proxy: &RunningProxy, name: &str, models: &[&str]) {
    box_with_card_goes_to_sleep(proxy, name, models, Some(MAC)).await;
}

async fn box_with_card_goes_to_sleep(
    proxy: &RunningProxy,
    name: &str,
    models: &[&str],
    mac: Option<&str>,
) {
    let mut worker = ScriptedWorker::connect(proxy.addr).await;
    worker
        .register_message(register(name, models, mac, false))
        .await;
    worker
        .send(&WorkerToServer::ModelsUpdate(ModelsUpdateMessage {
            warm_ups: None,
            sides_first: None,
            models: Vec::new(),
            current_load: 0,
            going_to_sleep: Some(true),
            context_windows: None,
            model_states: None,
        }))
        .await;
    worker.crash();
    wait_until("the box is remembered as asleep", || {
        proxy.hub.sleepers().iter().any(|s| s.name == name)
    })
    .await;
}

/// A request for MODEL wakes the sleeping box gpu-2 (its card gets the packet), whose worker
/// then joins and answers it.
async fn a_request_wakes_gpu_2_and_is_answered(proxy: &RunningProxy, card: &FakeCard) {
    let client = spawn_post(&proxy.url(), "/v1/chat/completions", chat(MODEL));
    card.woken().await;
    assert_eq!(wake_causes(proxy).await, ["nothing_awake"]);
    let mut worker = ScriptedWorker::connect(proxy.addr).await;
    worker
        .register_message(register("gpu-2", &[MODEL], Some(MAC), false))
        .await;
    let request = worker.next_request().await;
    worker.complete(&request.request_id, r#"{"ok":true}"#).await;
    let (status, _, body) = answer_of(client).await;
    assert_eq!(status, 200, "{body}");
}

async fn status_sleepers(proxy: &RunningProxy) -> Vec<Value> {
    let (code, status) = get_json(&proxy.url(), "/api/status", &[]).await;
    assert_eq!(code, 200, "{status}");
    status["sleepers"].as_array().expect("sleepers").clone()
}

/// Why each box being woken is woken, as `/api/status` says it.
async fn wake_causes(proxy: &RunningProxy) -> Vec<String> {
    status_sleepers(proxy)
        .await
        .iter()
        .filter_map(|s| s["wake_cause"].as_str().map(str::to_string))
        .collect()
}

async fn listed_models(proxy: &RunningProxy) -> Vec<String> {
    let (code, list) = get_json(&proxy.url(), "/v1/models", &[]).await;
    assert_eq!(code, 200, "{list}");
    list["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|m| m["id"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test]
async fn a_box_that_says_it_goes_to_sleep_keeps_its_models_listed_as_asleep() {
    let proxy = start_proxy(test_config()).await;
    box_goes_to_sleep(&proxy, "gpu-2", &[MODEL, "qwen-7b"]).await;
    assert_eq!(proxy.hub.counts().0, 0, "no worker is connected");
    let models = listed_models(&proxy).await;
    assert!(models.contains(&MODEL.to_string()), "{models:?}");
    assert!(models.contains(&"qwen-7b".to_string()), "{models:?}");
    let (code, model) = get_json(&proxy.url(), &format!("/v1/models/{MODEL}"), &[]).await;
    assert_eq!(code, 200, "{model}");
    let sleepers = status_sleepers(&proxy).await;
    assert_eq!(sleepers.len(), 1, "{sleepers:?}");
    assert_eq!(sleepers[0]["name"], "gpu-2");
    assert_eq!(sleepers[0]["state"], "asleep");
    assert_eq!(sleepers[0]["mac_address"], MAC);
    assert_eq!(sleepers[0]["models"], json!([MODEL, "qwen-7b"]));
    assert!(sleepers[0]["since_unix_ms"].as_u64().unwrap() > 0);
    assert!(sleepers[0]["waking_since_unix_ms"].is_null());
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_request_for_a_sleeping_box_sends_a_magic_packet_waits_and_is_served_when_it_reconnects()
{
    let card = FakeCard::new().await;
    let proxy = start_proxy(config_waking(&card, Duration::from_secs(10))).await;
    box_goes_to_sleep(&proxy, "gpu-2", &[MODEL]).await;

    let client = spawn_post(&proxy.url(), "/v1/chat/completions", chat(MODEL));
    card.woken().await;
    let sleepers = status_sleepers(&proxy).await;
    assert_eq!(sleepers[0]["state"], "waking", "{sleepers:?}");
    assert!(sleepers[0]["waking_since_unix_ms"].as_u64().unwrap() > 0);
    assert_eq!(sleepers[0]["wake_packets"], 1);
    assert!(!client.is_finished(), "the request waits for the box");

    // The box resumes and its worker reconnects under the same name.
    let mut worker = ScriptedWorker::connect(proxy.addr).await;
    worker
        .register_message(register("gpu-2", &[MODEL], Some(MAC), false))
        .await;
    let request = worker.next_request().await;
    assert_eq!(request.model, MODEL);
    worker.complete(&request.request_id, r#"{"ok":true}"#).await;
    let (status, _, body) = answer_of(client).await;
    assert_eq!(status, 200, "{body}");
    assert!(status_sleepers(&proxy).await.is_empty(), "the box is awake");
    proxy.shutdown().await;
}

#[tokio::test]
async fn the_real_worker_of_a_box_that_sleeps_when_idle_is_woken_by_a_request_and_answers_it() {
    let card = FakeCard::new().await;
    let proxy = start_proxy(config_waking(&card, Duration::from_secs(10))).await;
    let backend = MockBackend::start(&[MODEL]).await;
    let box_config = || {
        let mut config = WorkerConfig::new(&proxy.url(), SECRET, &backend.url());
        config.name = "sleepy-box".to_string();
        config.models = Some(vec![MODEL.to_string()]);
        config.mac_address = Some(MAC.parse().unwrap());
        config.sleeps_when_idle = true;
        config
    };
    let worker = RunningWorker::start_with(box_config());
    wait_until("the box's worker registers", || proxy.hub.counts().0 == 1).await;
    // The machine suspends: its worker vanishes without a word.
    worker.kill();
    wait_until("the box is asleep", || !proxy.hub.sleepers().is_empty()).await;
    assert!(listed_models(&proxy).await.contains(&MODEL.to_string()));

    let client = spawn_post(&proxy.url(), "/v1/chat/completions", chat(MODEL));
    card.woken().await;
    let worker = RunningWorker::start_with(box_config());
    let (status, _, body) = answer_of(client).await;
    assert_eq!(status, 200, "{body}");
    assert!(proxy.hub.sleepers().is_empty(), "the box is awake");
    worker.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_box_that_does_not_wake_gets_the_request_a_504_naming_it_at_the_queue_timeout() {
    let card = FakeCard::new().await;
    let proxy = start_proxy(config_waking(&card, Duration::from_millis(600))).await;
    box_goes_to_sleep(&proxy, "gpu-2", &[MODEL]).await;
    let started = Instant::now();
    let (status, _, body) = post(&proxy.url(), "/v1/chat/completions", &chat(MODEL)).await;
    assert_eq!(status, 504, "{body}");
    assert!(started.elapsed() >= Duration::from_millis(550));
    let error: Value = serde_json::from_str(&body).expect("json error");
    let message = error["error"]["message"].as_str().expect("message");
    assert!(message.contains("\"gpu-2\""), "{message}");
    assert!(message.contains("did not wake"), "{message}");
    assert_eq!(error["error"]["code"], "queue_timeout");
    assert_eq!(card.packet_within(Duration::from_secs(1)).await, Some(true));
    let sleepers = status_sleepers(&proxy).await;
    assert_eq!(
        sleepers[0]["state"], "asleep",
        "the attempt ended: {sleepers:?}"
    );
    // Anthropic clients get it in their dialect.
    let (status, _, body) = post_raw(
        &proxy.url(),
        "/v1/messages",
        json!({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
            .to_string(),
        &[("anthropic-version", "2023-06-01")],
    )
    .await;
    assert_eq!(status, 504, "{body}");
    let error: Value = serde_json::from_str(&body).expect("json error");
    assert_eq!(error["type"], "error");
    assert!(error["error"]["message"]
        .as_str()
        .unwrap()
        .contains("did not wake"));
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_flood_of_requests_for_a_sleeping_box_sends_one_magic_packet_per_retry_interval() {
    let card = FakeCard::new().await;
    let mut config = config_waking(&card, Duration::from_millis(1500));
    config.sleepers.retry = Duration::from_secs(60);
    let proxy = start_proxy(config).await;
    box_goes_to_sleep(&proxy, "gpu-2", &[MODEL]).await;
    let clients: Vec<_> = (0..40)
        .map(|_| spawn_post(&proxy.url(), "/v1/chat/completions", chat(MODEL)))
        .collect();
    let mut packets = 0;
    while let Some(valid) = card.packet_within(Duration::from_millis(2500)).await {
        assert!(valid, "only magic packets for the box");
        packets += 1;
    }
    assert_eq!(packets, 1, "one packet for 40 requests");
    for client in clients {
        assert_eq!(answer_of(client).await.0, 504);
    }
    // The attempt ended with those requests: the next request starts a new one, with a packet.
    let _ = post(&proxy.url(), "/v1/chat/completions", &chat(MODEL)).await;
    assert_eq!(
        card.packet_within(Duration::from_millis(200)).await,
        Some(true)
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn malformed_mac_addresses_are_ignored_with_a_register_warning() {
    let proxy = start_proxy(test_config()).await;
    let huge = "a".repeat(100_000);
    for (i, mac) in [
        json!("zz:zz:zz:zz:zz:zz"),
        json!("02:1b:2c:3d:4e"),
        json!("ff:ff:ff:ff:ff:ff"),
        json!("00:00:00:00:00:00"),
        json!(huge),
        json!(12345),
        json!({"mac": MAC}),
        json!(["02", "1b"]),
    ]
    .into_iter()
    .enumerate()
    {
        let mut worker = ScriptedWorker::connect(proxy.addr).await;
        let register = json!({
            "type": "register", "worker_name": format!("odd-{i}"), "models": [MODEL],
            "max_concurrent": 1, "mac_address": mac, "sleeps_when_idle": "yes please",
        });
        worker.send_text(&register.to_string()).await;
        let ack = match worker.recv().await {
            relay_core::protocol::ServerToWorker::RegisterAck(ack) => ack,
            other => panic!("expected register_ack, got {other:?}"),
        };
        assert_eq!(ack.models, [MODEL], "registered anyway");
        let warning = ack
            .warnings
            .iter()
            .find(|w| w.contains("mac_address ignored"))
            .unwrap_or_else(|| panic!("a warning for {i}: {:?}", ack.warnings));
        assert!(warning.len() < 400, "the input is not echoed: {warning}");
        // Not a boolean: it does not sleep when idle, so leaving is just leaving.
        worker.crash();
    }
    wait_until("the workers are gone", || proxy.hub.counts().0 == 0).await;
    assert!(proxy.hub.sleepers().is_empty());
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_box_without_a_mac_sleeps_but_no_packet_goes_out_and_the_504_still_names_it() {
    let card = FakeCard::new().await;
    let proxy = start_proxy(config_waking(&card, Duration::from_millis(400))).await;
    let mut worker = ScriptedWorker::connect(proxy.addr).await;
    worker
        .register_message(register("no-card", &[MODEL], None, true))
        .await;
    worker.crash();
    wait_until("the box is asleep", || !proxy.hub.sleepers().is_empty()).await;
    let (status, _, body) = post(&proxy.url(), "/v1/chat/completions", &chat(MODEL)).await;
    assert_eq!(status, 504, "{body}");
    assert!(body.contains("no-card"), "{body}");
    assert_eq!(card.packet_within(Duration::from_millis(300)).await, None);
    assert!(status_sleepers(&proxy).await[0]["mac_address"].is_null());
    proxy.shutdown().await;
}

#[tokio::test]
async fn only_a_sleep_counts_a_plain_worker_leaving_or_one_drained_by_an_admin_is_not_asleep() {
    let proxy = start_proxy(test_config()).await;
    // A worker that never said it sleeps: leaving is leaving.
    let mut plain = ScriptedWorker::connect(proxy.addr).await;
    plain
        .register_message(register("plain", &["a"], Some(MAC), false))
        .await;
    plain.crash();
    // One that sleeps when idle, but shut down (empty models_update first, as on SIGTERM).
    let mut stopped = ScriptedWorker::connect(proxy.addr).await;
    stopped
        .register_message(register("stopped", &["b"], Some(MAC), true))
        .await;
    stopped
        .send(&WorkerToServer::ModelsUpdate(ModelsUpdateMessage {
            warm_ups: None,
            sides_first: None,
            models: Vec::new(),
            current_load: 0,
            going_to_sleep: None,
            context_windows: None,
            model_states: None,
        }))
        .await;
    wait_until("the update is applied", || {
        !proxy.hub.models().iter().any(|(m, _)| m == "b")
    })
    .await;
    stopped.crash();
    // One drained by an admin.
    let mut drained = ScriptedWorker::connect(proxy.addr).await;
    let ack = drained
        .register_message(register("drained", &["c"], Some("02:00:00:00:00:03"), true))
        .await;
    assert!(proxy.hub.drain_worker(&ack.worker_id));
    drained.closed().await;
    wait_until("every worker is gone", || proxy.hub.counts().0 == 0).await;
    assert!(
        proxy.hub.sleepers().is_empty(),
        "{:?}",
        proxy.hub.sleepers()
    );
    assert!(listed_models(&proxy).await.is_empty());
    proxy.shutdown().await;
}

#[tokio::test]
async fn sleeping_boxes_are_bounded_and_forgotten_after_the_configured_time() {
    let mut config = test_config();
    config.sleepers.max_boxes = 3;
    config.sleepers.remember = Duration::from_millis(1500);
    let proxy = start_proxy(config).await;
    for i in 0..6 {
        let mut worker = ScriptedWorker::connect(proxy.addr).await;
        let mac = format!("02:00:00:00:00:{i:02x}");
        worker
            .register_message(register(
                &format!("box-{i}"),
                &[&format!("m-{i}")],
                Some(&mac),
                true,
            ))
            .await;
        worker.crash();
        wait_until("the box is asleep", || {
            proxy
                .hub
                .sleepers()
                .iter()
                .any(|s| s.name == format!("box-{i}"))
        })
        .await;
    }
    let names: Vec<String> = proxy.hub.sleepers().into_iter().map(|s| s.name).collect();
    assert_eq!(names, ["box-3", "box-4", "box-5"], "the oldest made room");
    assert_eq!(listed_models(&proxy).await, ["m-3", "m-4", "m-5"]);
    wait_until("they are forgotten", || proxy.hub.sleepers().is_empty()).await;
    assert!(listed_models(&proxy).await.is_empty());
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_box_on_a_lan_the_proxy_cannot_reach_is_woken_through_a_worker_on_that_lan() {
    // The proxy's own packets go to a network that is not the box's (a proxy on a VPS): the
    // box's card hears only what a worker on its LAN sends. All connections come from
    // 127.0.0.1, which is how boxes behind one router look to a proxy elsewhere.
    let elsewhere = FakeCard::new().await;
    let card = FakeCard::new().await;
    let proxy = start_proxy(config_waking(&elsewhere, Duration::from_secs(10))).await;
    let backend = MockBackend::start(&["small-model"]).await;
    let mut neighbour = WorkerConfig::new(&proxy.url(), SECRET, &backend.url());
    neighbour.name = "always-on".to_string();
    neighbour.models = Some(vec!["small-model".to_string()]);
    neighbour.wake_target = card.addr();
    let neighbour = RunningWorker::start_with(neighbour);
    wait_until("the neighbour registers", || proxy.hub.counts().0 == 1).await;
    box_goes_to_sleep(&proxy, "gpu-2", &[MODEL]).await;

    a_request_wakes_gpu_2_and_is_answered(&proxy, &card).await;
    neighbour.stop().await;
    proxy.shutdown().await;
}

/// Day two (issue 28): a proxy restarted while a box sleeps (an upgrade, a reboot) still lists
/// its models and wakes it for a request; a box that woke meanwhile is not remembered.
#[tokio::test]
async fn sleeping_boxes_are_remembered_across_a_proxy_restart_and_still_woken() {
    let dir = std::env::temp_dir().join(format!("relay-sleepers-{}", std::process::id()));
    let card = FakeCard::new().await;
    let config = || {
        let mut config = config_waking(&card, Duration::from_secs(10));
        config.database = relay_core::store::DatabaseSetting::Sqlite(dir.join("relay.db"));
        config
    };
    let first = start_proxy(config()).await;
    box_goes_to_sleep(&first, "gpu-2", &[MODEL]).await;
    box_with_card_goes_to_sleep(&first, "gpu-3", &["qwen-7b"], None).await;
    // gpu-3 wakes before the restart: forgotten.
    let mut awake = ScriptedWorker::connect(first.addr).await;
    awake
        .register_message(register("gpu-3", &["qwen-7b"], None, false))
        .await;
    wait_until("gpu-3 is awake", || first.hub.sleepers().len() == 1).await;
    let since = status_sleepers(&first).await[0]["since_unix_ms"].clone();
    awake.crash();
    first.shutdown().await;

    let second = start_proxy(config()).await;
    let sleepers = status_sleepers(&second).await;
    assert_eq!(sleepers.len(), 1, "{sleepers:?}");
    assert_eq!(sleepers[0]["name"], "gpu-2");
    assert_eq!(sleepers[0]["mac_address"], MAC);
    assert_eq!(
        sleepers[0]["since_unix_ms"], since,
        "asleep since before the restart"
    );
    assert!(listed_models(&second).await.contains(&MODEL.to_string()));

    a_request_wakes_gpu_2_and_is_answered(&second, &card).await;
    second.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The box gpu-fast connects, answers the request `client` sent (at 10,000 prompt tok/s), and
/// `then_sleeps`: announces it goes to sleep and closes.
async fn fast_box_answers(
    proxy: &RunningProxy,
    client: tokio::task::JoinHandle<(StatusCode, HeaderMap, String)>,
    then_sleeps: bool,
) {
    let mut fast = ScriptedWorker::connect(proxy.addr).await;
    fast.register_message(register("gpu-fast", &[MODEL], Some(MAC), false))
        .await;
    let request = fast.next_request().await;
    fast.complete_timed(&request.request_id, 10_000.0).await;
    let (status, _, body) = answer_of(client).await;
    assert_eq!(status, 200, "{body}");
    if then_sleeps {
        fast.send(&WorkerToServer::ModelsUpdate(ModelsUpdateMessage {
            warm_ups: None,
            sides_first: None,
            models: Vec::new(),
            current_load: 0,
            going_to_sleep: Some(true),
            context_windows: None,
            model_states: None,
        }))
        .await;
        fast.crash();
        wait_until("gpu-fast is asleep", || {
            proxy.hub.sleepers().iter().any(|s| s.name == "gpu-fast")
        })
        .await;
    }
}

/// A fleet measured as the proxy measures one: gpu-fast (10,000 prompt tok/s) answered a
/// request, went to sleep, was woken by a request (nothing else served the model: the usual
/// rule), came back 300 ms after the packet and went to sleep again; gpu-slow (100 tok/s)
/// answered one request and stays connected. Returned: the proxy and gpu-slow.
async fn measured_fleet(card: &FakeCard) -> (RunningProxy, ScriptedWorker) {
    let mut config = config_waking(card, Duration::from_secs(30));
    config.cost_routing = true;
    let proxy = start_proxy(config).await;
    let client = spawn_post(&proxy.url(), "/v1/chat/completions", chat(MODEL));
    fast_box_answers(&proxy, client, true).await;
    let client = spawn_post(&proxy.url(), "/v1/chat/completions", chat(MODEL));
    card.woken().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    fast_box_answers(&proxy, client, true).await;

    let mut slow = ScriptedWorker::connect(proxy.addr).await;
    slow.register_message(register("gpu-slow", &[MODEL], None, false))
        .await;
    let client = spawn_post(&proxy.url(), "/v1/chat/completions", chat(MODEL));
    let request = slow.next_request().await;
    slow.complete_timed(&request.request_id, 100.0).await;
    assert_eq!(answer_of(client).await.0, 200);
    (proxy, slow)
}

/// A chat request with a prompt of about 10,000 tokens (the proxy counts 4 bytes a token):
/// 100 s on gpu-slow, about 1.3 s on gpu-fast counting its wake.
fn long_chat() -> Value {
    json!({"model": MODEL, "messages": [{"role": "user", "content": "word ".repeat(8_000)}]})
}

#[tokio::test]
async fn with_cost_routing_a_long_prompt_wakes_a_faster_sleeping_box_and_waits_for_it() {
    let card = FakeCard::new().await;
    let (proxy, mut slow) = measured_fleet(&card).await;

    // A short prompt is sooner on the awake slow box than a wake: it goes there, no packet.
    let client = spawn_post(&proxy.url(), "/v1/chat/completions", chat(MODEL));
    let request = slow.next_request().await;
    slow.complete_timed(&request.request_id, 100.0).await;
    assert_eq!(answer_of(client).await.0, 200);
    assert_eq!(card.packet_within(Duration::from_millis(200)).await, None);

    // A long one wakes gpu-fast and waits for it, though gpu-slow is free.
    let client = spawn_post(&proxy.url(), "/v1/chat/completions", long_chat());
    card.woken().await;
    assert_eq!(wake_causes(&proxy).await, ["first_token_sooner"]);
    slow.assert_nothing_for(
        Duration::from_millis(500),
        "the long prompt waits for gpu-fast",
    )
    .await;
    fast_box_answers(&proxy, client, false).await;
    let metrics = metrics_text(&proxy.url()).await;
    assert!(
        metrics.contains("modelrelay_placements_total{reason=\"waking\"} 2"),
        "the usual wake and this one: {metrics}"
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_faster_box_that_does_not_wake_leaves_the_long_prompt_to_the_awake_one_not_to_a_504() {
    let card = FakeCard::new().await;
    let (proxy, mut slow) = measured_fleet(&card).await;
    let started = Instant::now();
    let client = spawn_post(&proxy.url(), "/v1/chat/completions", long_chat());
    card.woken().await;
    // gpu-fast never comes back: after twice its wake time and 5 s, gpu-slow takes the request.
    let request = slow.next_request().await;
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(5) && waited < Duration::from_secs(15),
        "{waited:?}"
    );
    slow.complete_timed(&request.request_id, 100.0).await;
    let (status, _, body) = answer_of(client).await;
    assert_eq!(status, 200, "{body}");
    proxy.shutdown().await;
}

/// Issue 29: a full house wakes the sleeping box for its queue. Requests queued behind a busy
/// gpu-slow (a slot frees every 0.1 s, as measured) are each served sooner there than by a
/// wake; once those queued have waited, together, as long as gpu-fast takes to wake, the next
/// one wakes it, and gpu-fast takes one of them as it comes.
#[tokio::test]
async fn with_cost_routing_a_queue_that_has_waited_as_long_as_a_wake_wakes_the_sleeping_box() {
    let card = FakeCard::new().await;
    let (proxy, mut slow) = measured_fleet(&card).await;
    let url = proxy.url();
    let held = spawn_post(&url, "/v1/chat/completions", chat(MODEL));
    let held_request = slow.next_request().await;
    let oldest = spawn_post(&url, "/v1/chat/completions", chat(MODEL));
    wait_until("the second request queues", || proxy.hub.counts().1 == 1).await;
    assert_eq!(
        card.packet_within(Duration::from_millis(200)).await,
        None,
        "one queued request is served sooner by gpu-slow than by a wake"
    );
    // gpu-fast came back about 0.3 s after its packet; the oldest has now waited 2 s.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let newest = spawn_post(&url, "/v1/chat/completions", chat(MODEL));
    card.woken().await;
    assert_eq!(
        wake_causes(&proxy).await,
        ["queue_waited"],
        "the dashboard says why"
    );
    let mut fast = ScriptedWorker::connect(proxy.addr).await;
    fast.register_message(register("gpu-fast", &[MODEL], Some(MAC), false))
        .await;
    let request = fast.next_request().await;
    fast.complete_timed(&request.request_id, 10_000.0).await;
    // gpu-slow frees its slot and serves the other.
    slow.complete_timed(&held_request.request_id, 100.0).await;
    let request = slow.next_request().await;
    slow.complete_timed(&request.request_id, 100.0).await;
    for client in [held, oldest, newest] {
        let (status, _, body) = answer_of(client).await;
        assert_eq!(status, 200, "{body}");
    }
    let metrics = metrics_text(&url).await;
    for counted in [
        "modelrelay_wake_attempts_total{cause=\"nothing_awake\"} 1",
        "modelrelay_wake_attempts_total{cause=\"queue_waited\"} 1",
        "modelrelay_wake_attempts_total{cause=\"slot_wait\"} 0",
    ] {
        assert!(metrics.contains(counted), "{counted}: {metrics}");
    }
    proxy.shutdown().await;
}
