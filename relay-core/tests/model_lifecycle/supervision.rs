//! Supervision: a crash fails the leases of that process and feeds the breaker, the next
//! request restarts it; stopping kills the whole process group (a start script's children too),
//! with SIGKILL for a server that ignores SIGTERM; shutdown stops everything.

use std::path::Path;
use std::time::{Duration, Instant};

use relay_core::lifecycle::{LifecycleError, ModelState};

use crate::support::*;

#[tokio::test]
async fn a_crash_fails_its_leases_and_the_next_acquire_restarts_it() {
    bounded(async {
        let dir = TempDir::new("crash");
        let log = dir.join("starts.log");
        let text = format!(
            "[worker.lifecycle]\nmodel_port_base = 25100\nbreaker_max_failures = 2\n{}",
            fake_entry("m", &log, "", "")
        );
        let harness = Harness::new(dir, quick(config(&text)), std::slice::from_ref(&log));
        let manager = &harness.manager;
        let mut lease = manager.acquire("m", None).await.unwrap();
        assert!(lease.check().is_ok());
        let crashed = http()
            .post(format!("{}/v1/chat/completions", lease.base_url()))
            .header("x-fake-crash", "1")
            .body("{}")
            .send()
            .await;
        assert!(crashed.is_err(), "the request in flight fails");
        let error = tokio::time::timeout(Duration::from_secs(5), lease.ended())
            .await
            .expect("the lease learns of the crash");
        assert!(matches!(error, LifecycleError::Crashed { .. }), "{error:?}");
        let message = error.to_string();
        assert!(
            message.contains("model \"m\" crashed (exit code 3)"),
            "{message}"
        );
        assert!(
            message.contains("listening on 127.0.0.1"),
            "its output: {message}"
        );
        assert_eq!(lease.check(), Err(error));
        let status = &manager.status()[0];
        assert_eq!(status.state, ModelState::Stopped);
        assert_eq!(status.crashes, 1);
        assert_eq!(
            status.in_flight, 0,
            "the dead process's requests no longer count"
        );
        drop(lease);

        let lease = manager.acquire("m", None).await.expect("restarted");
        let pids = starts(&log);
        assert_eq!(pids.len(), 2);
        assert_eq!(
            chat(lease.base_url()).await.unwrap(),
            format!("pid {}", pids[1])
        );

        // A second crash within the window opens the breaker.
        let _ = http()
            .get(format!("{}/crash", lease.base_url()))
            .send()
            .await;
        assert!(
            eventually(Duration::from_secs(5), || manager.status()[0].state
                == ModelState::Failed)
            .await
        );
        drop(lease);
        let error = manager.acquire("m", None).await.unwrap_err();
        assert!(
            matches!(error, LifecycleError::BreakerOpen { .. }),
            "{error:?}"
        );
        assert!(error.to_string().contains("crashed"), "{error}");
        harness.finish().await;
    })
    .await;
}

fn write_script(path: &Path, body: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[tokio::test]
async fn a_start_script_gets_llama_port_and_its_children_die_with_it() {
    bounded(async {
        let dir = TempDir::new("script");
        let log = dir.join("starts.log");
        let script = dir.join("start.sh");
        // Not `exec`: the server is the script's child, so only a group kill reaches it.
        write_script(
            &script,
            &format!(
                "{:?} --log {:?} &\nwait",
                fake_server().display().to_string(),
                log.display().to_string()
            ),
        );
        let text = format!(
            "[worker.lifecycle]\nmodel_port_base = 25200\n[worker.model_map.s]\nstart_script = {:?}\n",
            script.display().to_string()
        );
        let harness = Harness::new(dir, quick(config(&text)), std::slice::from_ref(&log));
        let lease = harness.manager.acquire("s", None).await.unwrap();
        let server = starts(&log)[0];
        assert_eq!(chat(lease.base_url()).await.unwrap(), format!("pid {server}"));
        let leader = harness.manager.status()[0].pid.unwrap();
        assert_ne!(leader, server, "the script leads the group");
        drop(lease);
        harness.manager.unload("s").await.unwrap();
        assert!(gone_within(server, Duration::from_secs(3)).await, "the script's child died");
        assert!(!alive(leader));
        harness.finish().await;
    })
    .await;
}

#[tokio::test]
async fn a_server_ignoring_sigterm_is_killed_after_the_grace() {
    bounded(async {
        let dir = TempDir::new("stubborn");
        let log = dir.join("starts.log");
        let script = dir.join("start.sh");
        // An ignored signal stays ignored across exec.
        write_script(
            &script,
            &format!(
                "trap '' TERM\nexec {:?} --log {:?}",
                fake_server().display().to_string(),
                log.display().to_string()
            ),
        );
        let text = format!(
            "[worker.lifecycle]\nmodel_port_base = 25300\n[worker.model_map.s]\nstart_script = {:?}\n",
            script.display().to_string()
        );
        let mut config = quick(config(&text));
        config.stop_grace = Duration::from_millis(500);
        let harness = Harness::new(dir, config, std::slice::from_ref(&log));
        drop(harness.manager.acquire("s", None).await.unwrap());
        let pid = starts(&log)[0];
        let started = Instant::now();
        harness.manager.unload("s").await.unwrap();
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(500), "SIGTERM was ignored: {took:?}");
        assert!(took < Duration::from_secs(4), "SIGKILL came late: {took:?}");
        assert!(gone_within(pid, Duration::from_secs(1)).await);
        harness.finish().await;
    })
    .await;
}

#[tokio::test]
async fn shutdown_stops_every_model_fails_its_leases_and_refuses_new_ones() {
    bounded(async {
        let dir = TempDir::new("shutdown");
        let logs = [dir.join("a.log"), dir.join("b.log")];
        let text = format!(
            "[worker.lifecycle]\nmodel_port_base = 25400\nmax_loaded_models = 2\n{}{}",
            fake_entry("a", &logs[0], "", ""),
            fake_entry("b", &logs[1], "", ""),
        );
        let harness = Harness::new(dir, quick(config(&text)), &logs);
        let manager = harness.manager.clone();
        let mut a = manager.acquire("a", None).await.unwrap();
        drop(manager.acquire("b", None).await.unwrap());
        manager.shutdown().await;
        let error = a.ended().await;
        assert!(matches!(error, LifecycleError::Stopped { .. }), "{error:?}");
        assert!(error.to_string().contains("shutting down"), "{error}");
        for log in &logs {
            assert!(!alive(starts(log)[0]));
        }
        assert!(manager
            .status()
            .iter()
            .all(|s| s.state == ModelState::Stopped));
        assert_eq!(
            manager.acquire("a", None).await.unwrap_err(),
            LifecycleError::ShuttingDown
        );
        drop(a);
        harness.finish().await;
    })
    .await;
}
