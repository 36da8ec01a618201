//! Conversation affinity (issue 17): a conversation's next turn goes to the worker that served
//! it last, while that worker has a free slot; a saturated or departed home yields, and the
//! worker that took the turn becomes the new home. Counted in `/metrics`.

use serde_json::{json, Value};

use crate::support::*;

fn config(affinity: bool) -> relay_core::proxy::ProxyConfig {
    let mut config = test_config();
    config.affinity = affinity;
    config.metrics_public = true;
    config
}

/// Turns of a conversation whose first user message is `topic`.
fn conversation(topic: &str, turns: usize) -> Value {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a long and shared system prompt."}),
        json!({"role": "user", "content": topic}),
    ];
    for turn in 1..turns {
        messages.push(json!({"role": "assistant", "content": format!("answer {turn}")}));
        messages.push(json!({"role": "user", "content": format!("follow-up {turn}")}));
    }
    json!({"model": "m", "messages": messages})
}

fn send(proxy: &str, body: Value, headers: &[(&str, &str)]) -> tokio::task::JoinHandle<u16> {
    let base = proxy.to_string();
    let headers: Vec<(String, String)> = headers
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    tokio::spawn(async move {
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        post_raw(&base, "/v1/chat/completions", body.to_string(), &headers)
            .await
            .0
            .as_u16()
    })
}

/// Sends one turn, answers it on whichever worker got it, and returns that worker (0 or 1).
async fn turn(
    proxy: &str,
    workers: &mut [ScriptedWorker; 2],
    body: Value,
    headers: &[(&str, &str)],
) -> usize {
    let task = send(proxy, body, headers);
    let [a, b] = workers;
    let (index, request) = next_request_on_either(a, b).await;
    workers[index].complete(&request.request_id, "{}").await;
    assert_eq!(task.await.expect("client"), 200);
    index
}

async fn two_workers(proxy: std::net::SocketAddr, slots: u32) -> [ScriptedWorker; 2] {
    let (a, _) = ScriptedWorker::join(proxy, "a", &["m"], slots).await;
    let (b, _) = ScriptedWorker::join(proxy, "b", &["m"], slots).await;
    [a, b]
}

/// `modelrelay_affinity_placements_total` by outcome.
async fn placements(proxy: &str) -> (u64, u64, u64) {
    let text = http()
        .get(format!("{proxy}/metrics"))
        .send()
        .await
        .expect("scrape")
        .text()
        .await
        .expect("body");
    let count = |outcome: &str| {
        let prefix = format!("modelrelay_affinity_placements_total{{outcome=\"{outcome}\"}} ");
        text.lines()
            .find_map(|line| line.strip_prefix(prefix.as_str()))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {outcome} count in {text}"))
    };
    (count("hit"), count("miss"), count("new"))
}

#[tokio::test]
async fn every_later_turn_of_a_conversation_goes_to_the_worker_that_served_its_first() {
    let proxy = start_proxy(config(true)).await;
    let mut workers = two_workers(proxy.addr, 4).await;
    let url = proxy.url();
    let home = turn(&url, &mut workers, conversation("plan a trip", 1), &[]).await;
    let other = turn(&url, &mut workers, conversation("write a poem", 1), &[]).await;
    // Both idle: least-loaded alone would alternate between them.
    assert_ne!(
        home, other,
        "the second conversation went to the idle worker"
    );
    for turns in 2..6 {
        let went = turn(&url, &mut workers, conversation("plan a trip", turns), &[]).await;
        assert_eq!(went, home, "turn {turns}");
        let went = turn(&url, &mut workers, conversation("write a poem", turns), &[]).await;
        assert_eq!(went, other, "turn {turns}");
    }
    assert_eq!(placements(&url).await, (8, 0, 2));
}

#[tokio::test]
async fn an_explicit_session_id_pins_requests_whose_prompts_differ() {
    let proxy = start_proxy(config(true)).await;
    let mut workers = two_workers(proxy.addr, 4).await;
    let url = proxy.url();
    // (Claude Code's own header names a session of several conversations, each keyed apart
    // where its billing line is missing: see `slot_hints`.)
    let session = [("x-session-id", "9b1c-session")];
    let home = turn(&url, &mut workers, conversation("first", 1), &session).await;
    for topic in ["second", "third", "fourth", "fifth"] {
        let went = turn(&url, &mut workers, conversation(topic, 1), &session).await;
        assert_eq!(went, home, "{topic}");
    }
    let mut keyed = conversation("other", 1);
    keyed["prompt_cache_key"] = json!("conv-1");
    let cache_home = turn(&url, &mut workers, keyed.clone(), &[]).await;
    for topic in ["x", "y", "z"] {
        keyed["messages"][1]["content"] = json!(topic);
        assert_eq!(
            turn(&url, &mut workers, keyed.clone(), &[]).await,
            cache_home
        );
    }
    assert_eq!(placements(&url).await, (7, 0, 2));
}

#[tokio::test]
async fn a_saturated_home_yields_and_the_worker_that_took_the_turn_becomes_the_home() {
    let proxy = start_proxy(config(true)).await;
    let [mut a, mut b] = two_workers(proxy.addr, 1).await;
    let url = proxy.url();
    // Turn 1 still runs on its home, holding its only slot, when turn 2 arrives.
    let first = send(&url, conversation("busy", 1), &[]);
    let (home, running) = next_request_on_either(&mut a, &mut b).await;
    let second = send(&url, conversation("busy", 2), &[]);
    let mut workers = [a, b];
    let moved = {
        let [a, b] = &mut workers;
        let (moved, request) = next_request_on_either(a, b).await;
        assert_ne!(moved, home, "turn 2 did not wait for the busy home");
        workers[moved].complete(&request.request_id, "{}").await;
        moved
    };
    workers[home].complete(&running.request_id, "{}").await;
    assert_eq!(first.await.expect("client"), 200);
    assert_eq!(second.await.expect("client"), 200);
    for turns in 3..6 {
        let went = turn(&url, &mut workers, conversation("busy", turns), &[]).await;
        assert_eq!(went, moved, "turn {turns} stays on the new home");
    }
    assert_eq!(placements(&url).await, (3, 1, 1));
}

/// Claude Code's title for the conversation of `session`, placed on its `home` worker (of
/// one slot each): a stranger's conversation holds the other worker's only slot while the
/// title comes, then its answer ends. The title's request, held, and its client.
async fn title_on_home(
    url: &str,
    workers: &mut [ScriptedWorker; 2],
    home: usize,
    session: &[(&str, &str)],
) -> (
    relay_core::protocol::RequestMessage,
    tokio::task::JoinHandle<u16>,
) {
    let title = json!({"model": "claude-haiku-4-5",
        "messages": [{"role": "user", "content": "Write a five-word title for: coding"}]});
    let other = 1 - home;
    let stranger = send(url, conversation("stranger", 1), &[]);
    let held = workers[other].next_request().await;
    let titled = send(url, title, session);
    let title = workers[home].next_request().await;
    workers[other].complete(&held.request_id, "{}").await;
    assert_eq!(stranger.await.expect("client"), 200);
    (title, titled)
}

#[tokio::test]
async fn a_turn_whose_home_a_title_fills_waits_for_the_title_and_moves_only_when_the_wait_runs_out()
{
    let mut config = config(true);
    config.aliases = relay_core::proxy::serving::aliases::ModelAliases::new(
        [("claude-*".to_string(), "m".to_string())],
        None,
    );
    let proxy = start_proxy(config).await;
    let mut workers = two_workers(proxy.addr, 1).await;
    let url = proxy.url();
    let session = [("x-session-id", "coding")];
    let home = turn(&url, &mut workers, conversation("coding", 1), &session).await;
    let other = 1 - home;
    let (title_request, titled) = title_on_home(&url, &mut workers, home, &session).await;
    // The next turn finds its home full with the title and the other worker free: it waits.
    let second = send(&url, conversation("coding", 2), &session);
    workers[other]
        .assert_nothing_for(
            std::time::Duration::from_millis(600),
            "the turn waits for its home",
        )
        .await;
    workers[home]
        .complete(&title_request.request_id, "{}")
        .await;
    assert_eq!(titled.await.expect("client"), 200);
    let went_home = workers[home].next_request().await;
    workers[home].complete(&went_home.request_id, "{}").await;
    assert_eq!(second.await.expect("client"), 200);
    assert_eq!(placements(&url).await.1, 0, "no turn left its home");

    // A title that outlasts the wait (5 s): the turn moves, as any turn of a full home does.
    let (title_request, titled) = title_on_home(&url, &mut workers, home, &session).await;
    let asked = std::time::Instant::now();
    let third = send(&url, conversation("coding", 3), &session);
    let moved = workers[other].next_request().await;
    assert!(
        asked.elapsed() >= std::time::Duration::from_secs(4),
        "it moved only after its wait ({:?})",
        asked.elapsed()
    );
    workers[other].complete(&moved.request_id, "{}").await;
    assert_eq!(third.await.expect("client"), 200);
    workers[home]
        .complete(&title_request.request_id, "{}")
        .await;
    assert_eq!(titled.await.expect("client"), 200);
}

#[tokio::test]
async fn a_home_that_left_yields_to_a_worker_still_connected() {
    let proxy = start_proxy(config(true)).await;
    let mut workers = two_workers(proxy.addr, 2).await;
    let url = proxy.url();
    let home = turn(&url, &mut workers, conversation("leaving", 1), &[]).await;
    let [a, b] = workers;
    let (gone, mut stays) = if home == 0 { (a, b) } else { (b, a) };
    gone.crash();
    wait_until("the proxy saw the worker go", || {
        proxy.hub.workers().len() == 1
    })
    .await;
    let task = send(&url, conversation("leaving", 2), &[]);
    let request = stays.next_request().await;
    stays.complete(&request.request_id, "{}").await;
    assert_eq!(task.await.expect("client"), 200);
    assert_eq!(placements(&url).await, (0, 1, 1));
}

#[tokio::test]
async fn with_affinity_off_turns_are_spread_by_load_and_nothing_is_counted() {
    let proxy = start_proxy(config(false)).await;
    let mut workers = two_workers(proxy.addr, 4).await;
    let url = proxy.url();
    let mut seen = [0; 2];
    for turns in 1..7 {
        seen[turn(&url, &mut workers, conversation("spread", turns), &[]).await] += 1;
    }
    assert_eq!(seen, [3, 3], "idle workers take turns");
    assert_eq!(placements(&url).await, (0, 0, 0));
}
