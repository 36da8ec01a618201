//! Starts that fail: a server that never gets ready, one that exits at once, and the breaker
//! that stops trying after repeated failures.

use std::time::{Duration, Instant};

use relay_core::lifecycle::{LifecycleError, ModelState};

use crate::support::*;

#[tokio::test]
async fn a_server_that_never_gets_ready_times_out_with_its_command_and_output() {
    bounded(async {
        let dir = TempDir::new("timeout");
        let log = dir.join("starts.log");
        let text = format!(
            "[worker.lifecycle]\nmodel_port_base = 24400\n{}",
            fake_entry("slow", &log, "--ready-after-ms 600000", "")
        );
        let mut config = quick(config(&text));
        config.startup_timeout = Duration::from_millis(800);
        let harness = Harness::new(dir, config, std::slice::from_ref(&log));
        let started = Instant::now();
        let error = harness.manager.acquire("slow", None).await.unwrap_err();
        let waited = started.elapsed();
        assert!(
            matches!(error, LifecycleError::StartupTimeout { .. }),
            "{error:?}"
        );
        assert!(waited >= Duration::from_millis(800) && waited < Duration::from_secs(5));
        let message = error.to_string();
        assert!(message.contains("model \"slow\""), "{message}");
        assert!(
            message.contains("fake-llama-server"),
            "the command: {message}"
        );
        assert!(
            message.contains("loading model slow"),
            "its output: {message}"
        );
        let pid = starts(&log)[0];
        assert!(gone_within(pid, Duration::from_secs(3)).await, "stopped");
        let status = &harness.manager.status()[0];
        assert_eq!(status.state, ModelState::Stopped);
        assert!(status
            .last_error
            .as_deref()
            .unwrap()
            .contains("not ready within"));
        harness.finish().await;
    })
    .await;
}

#[tokio::test]
async fn repeated_start_failures_open_the_breaker_which_answers_at_once() {
    bounded(async {
        let dir = TempDir::new("breaker");
        let log = dir.join("starts.log");
        let text = format!(
            "[worker.lifecycle]\nmodel_port_base = 24500\nbreaker_max_failures = 2\nbreaker_backoff_secs = 600\n{}",
            fake_entry("broken", &log, "--fail-start", "")
        );
        let harness = Harness::new(dir, quick(config(&text)), std::slice::from_ref(&log));
        let manager = &harness.manager;
        for attempt in 1..=2 {
            let error = manager.acquire("broken", None).await.unwrap_err();
            let message = error.to_string();
            assert!(
                matches!(error, LifecycleError::StartFailed { .. }),
                "{error:?}"
            );
            assert!(message.contains("exit code 1"), "{message}");
            assert!(message.contains("out of memory"), "its stderr: {message}");
            assert_eq!(starts(&log).len(), attempt);
        }
        let started = Instant::now();
        let error = manager.acquire("broken", None).await.unwrap_err();
        assert!(started.elapsed() < Duration::from_millis(200), "immediate");
        assert!(matches!(error, LifecycleError::BreakerOpen { .. }), "{error:?}");
        assert_eq!(error.status_code(), 503);
        let message = error.to_string();
        assert!(message.contains("marked failed"), "{message}");
        assert!(message.contains("out of memory"), "the last error: {message}");
        assert_eq!(starts(&log).len(), 2, "no doomed third start");
        let status = &manager.status()[0];
        assert_eq!(status.state, ModelState::Failed);
        assert!(status.retry_in_secs.unwrap() > 500);

        // A person asking for a load gets one more try.
        let error = manager.load("broken").await.unwrap_err();
        assert!(matches!(error, LifecycleError::StartFailed { .. }));
        assert_eq!(starts(&log).len(), 3);
        harness.finish().await;
    })
    .await;
}

#[tokio::test]
async fn a_missing_binary_is_a_start_failure_naming_the_path() {
    bounded(async {
        let dir = TempDir::new("missing");
        let text = "[worker.lifecycle]\nmodel_port_base = 24550\n[worker.model_map.ghost]\nllama_server = \"/nonexistent/llama-server\"\nmodel_file = \"/m.gguf\"\n";
        let harness = Harness::new(dir, quick(config(text)), &[]);
        let error = harness.manager.acquire("ghost", None).await.unwrap_err();
        let message = error.to_string();
        assert!(message.contains("/nonexistent/llama-server"), "{message}");
        assert!(message.contains("no such file"), "{message}");
        harness.finish().await;
    })
    .await;
}
