//! Lazy start, one start for concurrent requests, status, pinned ports, manual load and unload.

use std::time::Duration;

use futures_util::future::join_all;
use relay_core::lifecycle::{LifecycleError, ModelState};

use crate::support::*;

#[tokio::test]
async fn a_model_starts_on_first_acquire_and_concurrent_acquires_share_that_start() {
    bounded(async {
        let dir = TempDir::new("lazy");
        let log = dir.join("starts.log");
        let text = format!(
            "[worker.lifecycle]\nmodel_port_base = 24100\n{}",
            fake_entry("alpha", &log, "--ready-after-ms 400", "ctx_size = 2048")
        );
        let harness = Harness::new(dir, quick(config(&text)), std::slice::from_ref(&log));
        let manager = &harness.manager;
        assert_eq!(manager.models(), vec!["alpha"]);
        let before = &manager.status()[0];
        assert_eq!(before.state, ModelState::Stopped);
        assert!(starts(&log).is_empty(), "nothing starts before a request");

        let leases = join_all((0..8).map(|_| manager.acquire("alpha", None))).await;
        let leases: Vec<_> = leases.into_iter().map(|l| l.expect("lease")).collect();
        assert_eq!(starts(&log).len(), 1, "eight waiting requests, one start");
        let port = leases[0].port();
        assert!(port >= 24100);
        assert!(leases.iter().all(|l| l.port() == port));
        assert_eq!(leases[0].base_url(), format!("http://127.0.0.1:{port}"));

        let answer = chat(leases[0].base_url()).await.expect("chat");
        assert_eq!(answer, format!("pid {}", starts(&log)[0]));
        let status = &manager.status()[0];
        assert_eq!(status.state, ModelState::Ready);
        assert_eq!(status.in_flight, 8);
        assert_eq!(status.port, Some(port));
        assert_eq!(status.pid, Some(starts(&log)[0]));
        assert_eq!(status.restarts, 0);
        assert!(status.last_used_unix_ms.is_some());
        drop(leases);
        assert_eq!(manager.status()[0].in_flight, 0);
        assert!(manager.is_ready("alpha"));

        let unknown = manager.acquire("nope", None).await.unwrap_err();
        assert_eq!(unknown, LifecycleError::UnknownModel("nope".into()));
        assert_eq!(unknown.status_code(), 404);
        harness.finish().await;
    })
    .await;
}

#[tokio::test]
async fn a_pinned_port_is_used_and_a_taken_one_is_a_clear_error() {
    bounded(async {
        let dir = TempDir::new("pinned");
        let log = dir.join("starts.log");
        let pinned = free_port_near(24250);
        let blocker = std::net::TcpListener::bind(("127.0.0.1", free_port_near(24280))).unwrap();
        let taken = blocker.local_addr().unwrap().port();
        let text = format!(
            "[worker.lifecycle]\nmodel_port_base = 24200\nmax_loaded_models = 2\n{}{}",
            fake_entry("pinned", &log, "", &format!("port = {pinned}")),
            fake_entry("blocked", &log, "", &format!("port = {taken}")),
        );
        let harness = Harness::new(dir, quick(config(&text)), std::slice::from_ref(&log));
        let lease = harness.manager.acquire("pinned", None).await.unwrap();
        assert_eq!(lease.port(), pinned);
        chat(lease.base_url())
            .await
            .expect("served on the pinned port");
        drop(lease);
        let error = harness.manager.acquire("blocked", None).await.unwrap_err();
        assert!(
            error.to_string().contains(&format!("pinned port {taken}")),
            "{error}"
        );
        assert!(error.to_string().contains("\"blocked\""), "{error}");
        drop(blocker);
        harness.finish().await;
    })
    .await;
}

#[tokio::test]
async fn load_and_unload_by_hand() {
    bounded(async {
        let dir = TempDir::new("manual");
        let log = dir.join("starts.log");
        let text = format!(
            "[worker.lifecycle]\nmodel_port_base = 24300\n{}",
            fake_entry("m", &log, "--ready-after-ms 100", "")
        );
        let harness = Harness::new(dir, quick(config(&text)), std::slice::from_ref(&log));
        harness.manager.load("m").await.unwrap();
        let pid = starts(&log)[0];
        assert_eq!(harness.manager.status()[0].state, ModelState::Ready);
        assert!(alive(pid));
        // How long the load took is kept (the server answers after 100 ms): the proxy's cost
        // routing charges it to a request sent here while the model is unloaded.
        let load_ms = harness.manager.status()[0].last_load_ms.expect("timed");
        assert!((100..10_000).contains(&load_ms), "{load_ms} ms");
        harness.manager.unload("m").await.unwrap();
        assert_eq!(harness.manager.status()[0].state, ModelState::Stopped);
        assert_eq!(harness.manager.status()[0].last_load_ms, Some(load_ms));
        assert!(gone_within(pid, Duration::from_secs(2)).await);
        assert!(
            harness.manager.unload("m").await.is_ok(),
            "unloading a stopped model"
        );
        assert!(harness.manager.load("zzz").await.is_err());
        harness.finish().await;
    })
    .await;
}

#[tokio::test]
async fn a_request_that_gives_up_waiting_does_not_abandon_the_start() {
    bounded(async {
        let dir = TempDir::new("abandon");
        let log = dir.join("starts.log");
        let text = format!(
            "[worker.lifecycle]\nmodel_port_base = 24350\n{}",
            fake_entry("m", &log, "--ready-after-ms 400", "")
        );
        let harness = Harness::new(dir, quick(config(&text)), std::slice::from_ref(&log));
        let impatient = tokio::spawn({
            let manager = harness.manager.clone();
            async move { manager.acquire("m", None).await.map(drop) }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        impatient.abort();
        assert_eq!(harness.manager.status()[0].state, ModelState::Starting);
        let lease = harness.manager.acquire("m", None).await.unwrap();
        assert_eq!(
            starts(&log).len(),
            1,
            "the second request joined the first start"
        );
        drop(lease);
        harness.finish().await;
    })
    .await;
}
