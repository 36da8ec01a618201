//! The model map served end to end: client → real proxy → real worker → model servers the
//! worker starts on demand (the fake llama-server), unloads when idle, switches, restarts after
//! a crash or a session change, stops on shutdown, and cleans up after a killed worker.

use std::time::Duration;

use serde_json::json;

use crate::relay::*;
use crate::support::*;

/// Two fake models `a` and `b` with `lifecycle` settings and per-model `extra` lines.
fn two_models(dir: &TempDir, lifecycle: &str, extra: &str) -> (String, [std::path::PathBuf; 2]) {
    let logs = [dir.join("a.log"), dir.join("b.log")];
    let text = format!(
        "[worker.lifecycle]\n{lifecycle}\n{}{}",
        fake_entry("a", &logs[0], "", extra),
        fake_entry("b", &logs[1], "", extra),
    );
    (text, logs)
}

#[tokio::test]
async fn mapped_models_start_on_their_first_request_through_the_relay() {
    bounded(async {
        let dir = TempDir::new("e2e-lazy");
        let (text, logs) = two_models(&dir, "model_port_base = 26000\nmax_loaded_models = 2", "");
        let relay = Relay::start(dir, quick(config(&text)), &logs).await;
        relay.wait_for_models(&["a", "b"]).await;
        assert!(
            starts(&logs[0]).is_empty() && starts(&logs[1]).is_empty(),
            "advertised, not started"
        );

        let first = chat_ok(&relay.url, "a").await.pid();
        assert_eq!(starts(&logs[0]), [first], "the first request started a");
        assert!(
            starts(&logs[1]).is_empty(),
            "b waits for its own first request"
        );
        let b = chat_ok(&relay.url, "b").await.pid();
        assert_eq!(starts(&logs[1]), [b]);
        assert_eq!(
            chat_ok(&relay.url, "a").await.pid(),
            first,
            "a is still loaded"
        );
        assert!(alive(first) && alive(b));
        relay.finish().await;
    })
    .await;
}

#[tokio::test]
async fn concurrent_first_requests_share_one_start() {
    bounded(async {
        let dir = TempDir::new("e2e-shared-start");
        let log = dir.join("m.log");
        let text = format!(
            "[worker.lifecycle]\nmodel_port_base = 26050\n{}",
            fake_entry("m", &log, "--ready-after-ms 500", "")
        );
        let relay = Relay::start(dir, quick(config(&text)), std::slice::from_ref(&log)).await;
        relay.wait_for_models(&["m"]).await;
        let requests = (0..3).map(|_| chat_ok(&relay.url, "m"));
        let pids: Vec<u32> = futures_util::future::join_all(requests)
            .await
            .iter()
            .map(Answer::pid)
            .collect();
        assert_eq!(starts(&log).len(), 1, "one start for all waiting requests");
        assert!(pids.iter().all(|p| *p == pids[0]));
        relay.finish().await;
    })
    .await;
}

#[tokio::test]
async fn an_idle_model_is_unloaded_and_its_next_request_starts_it_again() {
    bounded(async {
        let dir = TempDir::new("e2e-idle");
        let log = dir.join("m.log");
        let text = format!(
            "[worker.lifecycle]\nmodel_port_base = 26100\n{}",
            fake_entry("m", &log, "", "idle_timeout_secs = 1")
        );
        let relay = Relay::start(dir, quick(config(&text)), std::slice::from_ref(&log)).await;
        relay.wait_for_models(&["m"]).await;
        let first = chat_ok(&relay.url, "m").await.pid();
        assert!(
            gone_within(first, Duration::from_secs(6)).await,
            "stopped after a second idle"
        );
        relay.wait_for_models(&["m"]).await;
        let second = chat_ok(&relay.url, "m").await.pid();
        assert_ne!(second, first, "a new process");
        assert_eq!(starts(&log), [first, second]);
        relay.finish().await;
    })
    .await;
}

#[tokio::test]
async fn with_one_model_slot_requests_switch_between_two_models() {
    bounded(async {
        let dir = TempDir::new("e2e-switch");
        let (text, logs) = two_models(&dir, "model_port_base = 26200\nmax_loaded_models = 1", "");
        let relay = Relay::start(dir, quick(config(&text)), &logs).await;
        relay.wait_for_models(&["a", "b"]).await;
        let a1 = chat_ok(&relay.url, "a").await.pid();
        let b1 = chat_ok(&relay.url, "b").await.pid();
        assert!(!alive(a1), "a was stopped to make room for b");
        let a2 = chat_ok(&relay.url, "a").await.pid();
        assert_ne!(a2, a1);
        assert!(!alive(b1), "b was stopped to make room for a");
        assert_eq!(starts(&logs[0]), [a1, a2]);
        relay.finish().await;
    })
    .await;
}

#[tokio::test]
async fn a_crash_before_any_output_is_retried_then_fails_and_the_next_request_restarts_the_model() {
    bounded(async {
        let dir = TempDir::new("e2e-crash");
        let log = dir.join("m.log");
        // The breaker is off here so the request's own requeue cap is what ends it.
        let text = format!(
            "[worker.lifecycle]\nmodel_port_base = 26300\nbreaker_max_failures = 0\n{}",
            fake_entry("m", &log, "", "")
        );
        let relay = Relay::start(dir, quick(config(&text)), std::slice::from_ref(&log)).await;
        relay.wait_for_models(&["m"]).await;
        let first = chat_ok(&relay.url, "m").await.pid();
        // This request crashes the model every time: the proxy retries it (each retry restarts
        // the model) up to its requeue cap, then answers 503.
        let crash = json!({"fake_delay_ms": 200, "fake_crash": true});
        let failed = chat_via(&relay.url, "/v1/chat/completions", "m", crash, &[]).await;
        assert_eq!(failed.status, 503, "{}", failed.body);
        assert_eq!(
            failed.json()["error"]["code"],
            "requeue_exhausted",
            "{}",
            failed.body
        );
        assert!(!alive(first));
        let second = chat_ok(&relay.url, "m").await.pid();
        assert_ne!(second, first, "restarted by the next request");
        relay.finish().await;
    })
    .await;
}

#[tokio::test]
async fn a_crash_mid_stream_ends_the_stream_with_an_error_event_naming_the_crash() {
    bounded(async {
        let dir = TempDir::new("e2e-crash-stream");
        let log = dir.join("m.log");
        let text = format!(
            "[worker.lifecycle]\nmodel_port_base = 26350\n{}",
            fake_entry("m", &log, "", "")
        );
        let relay = Relay::start(dir, quick(config(&text)), std::slice::from_ref(&log)).await;
        relay.wait_for_models(&["m"]).await;
        let crash = json!({"stream": true, "fake_crash_mid_stream": true});
        let answer = chat_via(&relay.url, "/v1/chat/completions", "m", crash, &[]).await;
        assert_eq!(
            answer.status, 200,
            "the stream had started: {}",
            answer.body
        );
        let body = &answer.body;
        assert!(
            body.starts_with("data: "),
            "the first event came through: {body}"
        );
        assert!(body.contains("\"content\":\"pid \""), "{body}");
        assert!(
            body.contains("model \\\"m\\\" crashed (exit code 3)"),
            "an error event naming the crash: {body}"
        );
        assert!(!body.contains("[DONE]"), "{body}");
        let first = starts(&log)[0];
        assert_ne!(chat_ok(&relay.url, "m").await.pid(), first, "restarted");
        relay.finish().await;
    })
    .await;
}

#[tokio::test]
async fn a_new_session_id_restarts_the_model_when_session_restart_is_on() {
    bounded(async {
        let dir = TempDir::new("e2e-session");
        let log = dir.join("m.log");
        let text = format!(
            "[worker.lifecycle]\nmodel_port_base = 26400\nsession_restart = true\n{}",
            fake_entry("m", &log, "", "")
        );
        let relay = Relay::start(dir, quick(config(&text)), std::slice::from_ref(&log)).await;
        relay.wait_for_models(&["m"]).await;
        let ask = |headers: &'static [(&'static str, &'static str)]| {
            let url = relay.url.clone();
            async move {
                let answer = chat_via(&url, "/v1/chat/completions", "m", json!({}), headers).await;
                assert_eq!(answer.status, 200, "{}", answer.body);
                answer.pid()
            }
        };
        let a = ask(&[("session-id", "project-a")]).await;
        assert_eq!(ask(&[("session-id", "project-a")]).await, a, "same session");
        assert_eq!(ask(&[]).await, a, "no session id keeps the model");
        let b = ask(&[("x-session-affinity", "project-b")]).await;
        assert_ne!(
            b, a,
            "the proxy forwarded the session header and the model restarted"
        );
        assert!(!alive(a));
        assert_eq!(starts(&log), [a, b]);
        relay.finish().await;
    })
    .await;
}

#[tokio::test]
async fn stopping_the_worker_stops_every_model_process() {
    bounded(async {
        let dir = TempDir::new("e2e-stop");
        let (text, logs) = two_models(&dir, "model_port_base = 26500\nmax_loaded_models = 2", "");
        let mut relay = Relay::start(dir, quick(config(&text)), &logs).await;
        relay.wait_for_models(&["a", "b"]).await;
        let a = chat_ok(&relay.url, "a").await.pid();
        let b = chat_ok(&relay.url, "b").await.pid();
        let mut recorded = relay.recorded_pids();
        recorded.sort_unstable();
        let mut expected = vec![a, b];
        expected.sort_unstable();
        assert_eq!(recorded, expected, "both recorded in pid files");
        relay.stop_worker().await;
        assert!(
            !alive(a) && !alive(b),
            "no model process outlives the worker"
        );
        assert!(pids_in(&relay.pid_dir()).is_empty());
        relay.finish().await;
    })
    .await;
}

#[tokio::test]
async fn a_new_worker_kills_the_model_servers_a_killed_worker_left_behind() {
    bounded(async {
        let dir = TempDir::new("e2e-orphans");
        let log = dir.join("m.log");
        let text = format!(
            "[worker.lifecycle]\nmodel_port_base = 26600\nstop_grace_secs = 2\n{}",
            fake_entry("m", &log, "", "")
        );
        let config_file = dir.join("config.toml");
        std::fs::write(&config_file, &text).unwrap();
        let data = dir.join("data");
        let proxy = start_proxy().await;
        let doomed = WorkerProcess::start(&proxy, &config_file, &data, &dir.join("worker.log"));
        // The new worker starts only after the old one is killed.
        let mut relay = Relay::idle(proxy, dir, std::slice::from_ref(&log));
        relay.wait_for_models(&["m"]).await;
        let survivor = chat_ok(&relay.url, "m").await.pid();
        assert_eq!(relay.recorded_pids(), [survivor]);
        doomed.kill().await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            alive(survivor),
            "SIGKILL to the worker left its model server running"
        );

        let config = worker_config(relay.proxy(), quick(config(&text)), &data);
        relay.start_worker(config);
        assert!(
            gone_within(survivor, Duration::from_secs(10)).await,
            "the new worker killed the orphan"
        );
        relay.wait_for_models(&["m"]).await;
        let fresh = chat_ok(&relay.url, "m").await.pid();
        assert_ne!(fresh, survivor);
        relay.finish().await;
    })
    .await;
}

#[tokio::test]
async fn a_streaming_request_waiting_for_a_start_gets_loading_comments() {
    bounded(async {
        let dir = TempDir::new("e2e-keepalive");
        let log = dir.join("m.log");
        let text = format!(
            "[worker.lifecycle]\nmodel_port_base = 26700\n{}",
            fake_entry("m", &log, "--ready-after-ms 2700", "")
        );
        let relay = Relay::start(dir, quick(config(&text)), std::slice::from_ref(&log)).await;
        relay.wait_for_models(&["m"]).await;
        let answer = chat_via(
            &relay.url,
            "/v1/chat/completions",
            "m",
            json!({"stream": true}),
            &[],
        )
        .await;
        assert_eq!(answer.status, 200);
        let body = &answer.body;
        assert!(body.starts_with(": loading model m\n\n"), "{body}");
        let pid = starts(&log)[0];
        assert!(body.contains(&format!("\"content\":\"{pid}\"")), "{body}");
        assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");

        // Once loaded, a stream starts with the model's own events.
        let warm = chat_via(
            &relay.url,
            "/v1/chat/completions",
            "m",
            json!({"stream": true}),
            &[],
        )
        .await;
        assert!(warm.body.starts_with("data: "), "{}", warm.body);
        relay.finish().await;
    })
    .await;
}

#[tokio::test]
async fn a_model_that_fails_to_start_gets_a_short_error_in_the_endpoints_dialect() {
    bounded(async {
        let dir = TempDir::new("e2e-fail-start");
        let log = dir.join("m.log");
        let text = format!(
            "[worker.lifecycle]\nmodel_port_base = 26800\nbreaker_max_failures = 2\n{}",
            fake_entry("m", &log, "--fail-start", "")
        );
        let relay = Relay::start(dir, quick(config(&text)), std::slice::from_ref(&log)).await;
        relay.wait_for_models(&["m"]).await;
        let openai = chat_via(&relay.url, "/v1/chat/completions", "m", json!({}), &[]).await;
        assert_eq!(openai.status, 502, "{}", openai.body);
        let error = &openai.json()["error"];
        assert_eq!(error["code"], "model_start_failed");
        let message = error["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with("model \"m\" failed to start"),
            "{message}"
        );
        assert!(
            !message.contains("out of memory"),
            "the output stays in the log: {message}"
        );

        let anthropic = chat_via(
            &relay.url,
            "/v1/messages",
            "m",
            json!({}),
            &[("anthropic-version", "2023-06-01")],
        )
        .await;
        assert_eq!(anthropic.status, 502, "{}", anthropic.body);
        assert_eq!(anthropic.json()["type"], "error", "{}", anthropic.body);

        let refused = chat_via(&relay.url, "/v1/chat/completions", "m", json!({}), &[]).await;
        assert_eq!(refused.status, 503, "the breaker is open: {}", refused.body);
        assert_eq!(refused.json()["error"]["code"], "model_failed");
        assert!(refused.headers.contains_key("retry-after"));
        assert_eq!(starts(&log).len(), 2, "no third doomed start");
        relay.finish().await;
    })
    .await;
}

/// A fake server started by the test as a plain backend (not by any worker); killed on drop.
struct PlainBackend(std::process::Child);

impl PlainBackend {
    fn start(port: u16, alias: &str) -> Self {
        use std::os::unix::process::CommandExt;
        let child = std::process::Command::new(fake_server())
            .args(["--port", &port.to_string(), "--alias", alias])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap();
        PlainBackend(child)
    }
}

impl Drop for PlainBackend {
    fn drop(&mut self) {
        relay_core::lifecycle::os::kill_group(self.0.id());
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn mapped_models_take_precedence_over_backend_models_of_the_same_name() {
    bounded(async {
        let dir = TempDir::new("e2e-precedence");
        let log = dir.join("x.log");
        let (x_port, z_port) = (free_port_near(26950), free_port_near(26970));
        let backend_x = PlainBackend::start(x_port, "x");
        let backend_z = PlainBackend::start(z_port, "z");
        let text = format!(
            "[worker.lifecycle]\nmodel_port_base = 26900\n{}",
            fake_entry("x", &log, "", "")
        );
        let proxy = start_proxy().await;
        let mut config = worker_config(&proxy, quick(config(&text)), &dir.join("data"));
        config.backends = relay_core::worker::Backends::Fixed(vec![
            format!("http://127.0.0.1:{x_port}"),
            format!("http://127.0.0.1:{z_port}"),
        ]);
        let relay = Relay::start_with(proxy, dir, config, std::slice::from_ref(&log)).await;
        relay.wait_for_models(&["x", "z"]).await;
        assert_eq!(
            chat_ok(&relay.url, "z").await.pid(),
            backend_z.0.id(),
            "z from its backend"
        );
        let x = chat_ok(&relay.url, "x").await.pid();
        assert_ne!(x, backend_x.0.id(), "x from the model map, not the backend");
        assert_eq!(starts(&log), [x]);
        relay.finish().await;
    })
    .await;
}
