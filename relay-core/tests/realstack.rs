//! The model lifecycle end to end with a REAL llama-server and a tiny real model (27 MB, random
//! weights), through a real proxy and the real worker: lazy start, requests through the relay,
//! idle unload, switching between two models, orphan cleanup after the worker is SIGKILLed.
//!
//! The server and the model are built once by `scripts/real-clients.sh` (see
//! `common/realstack.rs`); without them every test here prints why it is skipped and passes.

#[path = "common/inprocess.rs"]
mod inprocess;
#[path = "common/realstack.rs"]
mod realstack;
#[path = "model_lifecycle/relay.rs"]
mod relay;
#[path = "model_lifecycle/support.rs"]
mod support;

use std::time::Duration;

use realstack::Stack;
use relay::*;
use serde_json::{json, Value};
use support::{alive, config, gone_within, TempDir};

/// Bound on each test: a real server takes a second or two to start; a busy box more.
const BOUND: Duration = Duration::from_secs(180);

impl Stack {
    /// A model-map entry running the tiny model as `name` (small context, short answers, one
    /// slot and one thread: light on a shared box).
    fn entry(&self, name: &str, extra: &str) -> String {
        format!(
            "[worker.model_map.{name:?}]\nllama_server = {:?}\nmodel_file = {:?}\nctx_size = 2048\nargs = [\"-n\", \"16\", \"-t\", \"1\", \"-np\", \"1\", \"--no-webui\"]\n{extra}\n",
            self.llama_server.display().to_string(),
            self.model.display().to_string(),
        )
    }
}

async fn bounded<F: std::future::Future<Output = ()>>(body: F) {
    tokio::time::timeout(BOUND, body)
        .await
        .expect("the test exceeded its time bound");
}

/// The lifecycle settings every test shares, with the model port range `base`.
fn lifecycle(base: u16, max_loaded: usize) -> String {
    format!(
        "[worker.lifecycle]\nmodel_port_base = {base}\nmax_loaded_models = {max_loaded}\nstartup_timeout_secs = 120\nstop_grace_secs = 5\n"
    )
}

/// The model server running `model` now, by the worker's pid files.
fn pid_of(relay: &mut Relay, model: &str) -> Option<u32> {
    relay.recorded_pids();
    records(&relay.pid_dir())
        .into_iter()
        .find(|(_, m)| m == model)
        .map(|(pid, _)| pid)
}

/// (pid, model) of each pid file in `dir`.
fn records(dir: &std::path::Path) -> Vec<(u32, String)> {
    pids_in(dir)
        .into_iter()
        .filter_map(|pid| {
            let text = std::fs::read_to_string(dir.join(format!("{pid}.json"))).ok()?;
            let record: Value = serde_json::from_str(&text).ok()?;
            Some((pid, record["model"].as_str()?.to_string()))
        })
        .collect()
}

/// A chat completion through the relay that a real model answered.
async fn ask(url: &str, model: &str) -> Answer {
    let answer = chat_ok(url, model).await;
    let body = answer.json();
    assert!(
        body["choices"][0]["message"]["content"].is_string(),
        "{}",
        answer.body
    );
    assert!(
        body["usage"]["prompt_tokens"].as_u64().unwrap_or(0) > 0,
        "{}",
        answer.body
    );
    answer
}

#[tokio::test]
async fn real_llama_server_starts_on_the_first_request_and_answers_through_the_relay() {
    let Some(stack) = realstack::stack(
        "real_llama_server_starts_on_the_first_request_and_answers_through_the_relay",
        false,
    ) else {
        return;
    };
    bounded(async {
        let dir = TempDir::new("real-lazy");
        let text = format!("{}{}", lifecycle(27000, 1), stack.entry("tiny-a", ""));
        let mut relay = Relay::start(dir, config(&text), &[]).await;
        relay.wait_for_models(&["tiny-a"]).await;
        assert_eq!(
            pid_of(&mut relay, "tiny-a"),
            None,
            "advertised, not started"
        );
        ask(&relay.url, "tiny-a").await;
        let pid = pid_of(&mut relay, "tiny-a").expect("started by the request");
        assert!(alive(pid));
        let stream = chat_via(
            &relay.url,
            "/v1/chat/completions",
            "tiny-a",
            json!({"stream": true}),
            &[],
        )
        .await;
        assert_eq!(stream.status, 200, "{}", stream.body);
        assert!(stream.body.starts_with("data: "), "{}", stream.body);
        assert!(stream.body.contains("data: [DONE]"), "{}", stream.body);
        assert_eq!(pid_of(&mut relay, "tiny-a"), Some(pid), "the same server");
        relay.finish().await;
        assert!(!alive(pid));
    })
    .await;
}

#[tokio::test]
async fn real_llama_server_is_unloaded_when_idle_and_started_again() {
    let Some(stack) = realstack::stack(
        "real_llama_server_is_unloaded_when_idle_and_started_again",
        false,
    ) else {
        return;
    };
    bounded(async {
        let dir = TempDir::new("real-idle");
        let text = format!(
            "{}{}",
            lifecycle(27100, 1),
            stack.entry("tiny-a", "idle_timeout_secs = 2")
        );
        let mut relay = Relay::start(dir, config(&text), &[]).await;
        relay.wait_for_models(&["tiny-a"]).await;
        ask(&relay.url, "tiny-a").await;
        let first = pid_of(&mut relay, "tiny-a").expect("started");
        assert!(
            gone_within(first, Duration::from_secs(20)).await,
            "unloaded after idling"
        );
        // The pid file goes once the worker has reaped the exit, a moment after the process.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while pid_of(&mut relay, "tiny-a").is_some() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(
            pid_of(&mut relay, "tiny-a"),
            None,
            "its pid file is removed"
        );
        ask(&relay.url, "tiny-a").await;
        let second = pid_of(&mut relay, "tiny-a").expect("started again");
        assert_ne!(second, first);
        relay.finish().await;
    })
    .await;
}

#[tokio::test]
async fn real_models_switch_when_only_one_fits() {
    let Some(stack) = realstack::stack("real_models_switch_when_only_one_fits", false) else {
        return;
    };
    bounded(async {
        let dir = TempDir::new("real-switch");
        // Two aliases of the one tiny model: two models as far as the worker is concerned.
        let text = format!(
            "{}{}{}",
            lifecycle(27200, 1),
            stack.entry("tiny-a", ""),
            stack.entry("tiny-b", "")
        );
        let mut relay = Relay::start(dir, config(&text), &[]).await;
        relay.wait_for_models(&["tiny-a", "tiny-b"]).await;
        ask(&relay.url, "tiny-a").await;
        let a = pid_of(&mut relay, "tiny-a").expect("a started");
        ask(&relay.url, "tiny-b").await;
        let b = pid_of(&mut relay, "tiny-b").expect("b started");
        assert!(!alive(a), "a was stopped to make room for b");
        ask(&relay.url, "tiny-a").await;
        assert!(!alive(b), "b was stopped to make room for a");
        assert_ne!(pid_of(&mut relay, "tiny-a"), Some(a));
        relay.finish().await;
    })
    .await;
}

#[tokio::test]
async fn a_real_llama_server_orphaned_by_a_sigkilled_worker_is_killed_by_the_next_worker() {
    let Some(stack) = realstack::stack(
        "a_real_llama_server_orphaned_by_a_sigkilled_worker_is_killed_by_the_next_worker",
        false,
    ) else {
        return;
    };
    bounded(async {
        let dir = TempDir::new("real-orphans");
        let text = format!("{}{}", lifecycle(27300, 1), stack.entry("tiny-a", ""));
        let config_file = dir.join("config.toml");
        std::fs::write(&config_file, &text).unwrap();
        let data = dir.join("data");
        let proxy = start_proxy().await;
        let doomed = WorkerProcess::start(&proxy, &config_file, &data, &dir.join("worker.log"));
        let mut relay = Relay::idle(proxy, dir, &[]);
        relay.wait_for_models(&["tiny-a"]).await;
        ask(&relay.url, "tiny-a").await;
        let survivor = pid_of(&mut relay, "tiny-a").expect("started by the doomed worker");
        doomed.kill().await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            alive(survivor),
            "SIGKILL to the worker left llama-server running"
        );

        relay.start_worker(worker_config(relay.proxy(), config(&text), &data));
        assert!(
            gone_within(survivor, Duration::from_secs(15)).await,
            "the next worker killed the orphan"
        );
        relay.wait_for_models(&["tiny-a"]).await;
        ask(&relay.url, "tiny-a").await;
        assert_ne!(pid_of(&mut relay, "tiny-a"), Some(survivor));
        relay.finish().await;
    })
    .await;
}
