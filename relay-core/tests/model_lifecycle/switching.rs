//! Idle unload and switching: the least recently used idle model makes room, a busy one never
//! does, and a model that does not fit waits for room (bounded).

use std::time::{Duration, Instant};

use relay_core::lifecycle::{LifecycleError, ModelState, ModelStatus};

use crate::support::*;

fn state_of(status: &[ModelStatus], name: &str) -> ModelState {
    status.iter().find(|s| s.name == name).unwrap().state
}

#[tokio::test]
async fn an_idle_model_stops_after_its_timeout_but_not_while_in_use() {
    bounded(async {
        let dir = TempDir::new("idle");
        let log = dir.join("starts.log");
        let text = format!(
            "[worker.lifecycle]\nmodel_port_base = 24800\n{}",
            fake_entry("m", &log, "", "")
        );
        let mut config = quick(config(&text));
        let idle = Duration::from_millis(500);
        config.models.get_mut("m").unwrap().idle_timeout = Some(idle);
        let harness = Harness::new(dir, config, std::slice::from_ref(&log));
        let manager = &harness.manager;

        let lease = manager.acquire("m", None).await.unwrap();
        tokio::time::sleep(idle * 2).await;
        assert_eq!(manager.status()[0].state, ModelState::Ready, "in use");
        let released = Instant::now();
        drop(lease);
        assert!(
            eventually(Duration::from_secs(5), || manager.status()[0].state
                == ModelState::Stopped)
            .await
        );
        let after = released.elapsed();
        assert!(after >= idle, "stopped after {after:?}, before the timeout");
        assert!(
            after < idle + Duration::from_secs(3),
            "stopped late: {after:?}"
        );
        assert!(gone_within(starts(&log)[0], Duration::from_secs(2)).await);

        // The next request starts it again.
        let lease = manager.acquire("m", None).await.unwrap();
        assert_eq!(starts(&log).len(), 2);
        assert_eq!(manager.status()[0].restarts, 1);
        drop(lease);
        harness.finish().await;
    })
    .await;
}

#[tokio::test]
async fn the_least_recently_used_idle_model_is_evicted_never_a_busy_one() {
    bounded(async {
        let dir = TempDir::new("lru");
        let logs = [dir.join("a.log"), dir.join("b.log"), dir.join("c.log")];
        let text = format!(
            "[worker.lifecycle]\nmodel_port_base = 24600\nmax_loaded_models = 2\n{}{}{}",
            fake_entry("a", &logs[0], "", ""),
            fake_entry("b", &logs[1], "", ""),
            fake_entry("c", &logs[2], "", ""),
        );
        let harness = Harness::new(dir, quick(config(&text)), &logs);
        let manager = &harness.manager;
        // a is the least recently used but busy; b is idle.
        let busy_a = manager.acquire("a", None).await.unwrap();
        let b = manager.acquire("b", None).await.unwrap();
        drop(b);
        let c = manager.acquire("c", None).await.unwrap();
        let status = manager.status();
        assert_eq!(state_of(&status, "a"), ModelState::Ready, "busy: kept");
        assert_eq!(state_of(&status, "b"), ModelState::Stopped, "idle: evicted");
        assert_eq!(state_of(&status, "c"), ModelState::Ready);
        assert!(gone_within(starts(&logs[1])[0], Duration::from_secs(2)).await);
        chat(busy_a.base_url()).await.expect("a still serves");

        // Both idle, and c used again after a was released: a is the least recently used.
        drop(c);
        drop(busy_a);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let c_again = manager.acquire("c", None).await.unwrap();
        drop(c_again);
        let b = manager.acquire("b", None).await.unwrap();
        let status = manager.status();
        assert_eq!(state_of(&status, "a"), ModelState::Stopped);
        assert_eq!(state_of(&status, "c"), ModelState::Ready);
        assert_eq!(state_of(&status, "b"), ModelState::Ready);
        drop(b);
        harness.finish().await;
    })
    .await;
}

#[tokio::test]
async fn a_model_waits_for_a_busy_one_to_finish_and_gives_up_after_the_timeout() {
    bounded(async {
        let dir = TempDir::new("room");
        let logs = [dir.join("a.log"), dir.join("b.log")];
        let text = format!(
            "[worker.lifecycle]\nmodel_port_base = 24700\n{}{}",
            fake_entry("a", &logs[0], "", ""),
            fake_entry("b", &logs[1], "", ""),
        );
        let mut config = quick(config(&text));
        config.startup_timeout = Duration::from_secs(1);
        let harness = Harness::new(dir, config, &logs);
        let manager = harness.manager.clone();

        // One model at a time (the default): b cannot start while a serves a request.
        let a = manager.acquire("a", None).await.unwrap();
        let started = Instant::now();
        let error = manager.acquire("b", None).await.unwrap_err();
        assert!(started.elapsed() >= Duration::from_secs(1));
        assert!(
            matches!(&error, LifecycleError::NoRoom { blocked_by, .. } if blocked_by == &["a"]),
            "{error:?}"
        );
        assert!(starts(&logs[1]).is_empty());

        // When a's request ends while b waits, a is switched out and b starts.
        let waiting = tokio::spawn({
            let manager = manager.clone();
            async move { manager.acquire("b", None).await.map(|l| l.port()) }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!waiting.is_finished());
        drop(a);
        let port = waiting.await.unwrap().expect("b starts once a is idle");
        assert!(port >= 24700);
        let status = manager.status();
        assert_eq!(state_of(&status, "a"), ModelState::Stopped);
        assert_eq!(state_of(&status, "b"), ModelState::Ready);
        assert!(
            !alive(starts(&logs[0])[0]),
            "a's process is gone before b starts"
        );
        harness.finish().await;
    })
    .await;
}
