//! Session-aware restart: a new session id restarts the model (clearing its KV cache), after
//! the other session's requests in flight are done; the same or no session id keeps it.

use std::time::Duration;

use crate::support::*;

#[tokio::test]
async fn a_new_session_restarts_the_model_once_it_is_idle() {
    bounded(async {
        let dir = TempDir::new("session");
        let log = dir.join("starts.log");
        let text = format!(
            "[worker.lifecycle]\nmodel_port_base = 24900\nsession_restart = true\n{}",
            fake_entry("m", &log, "", "")
        );
        let harness = Harness::new(dir, quick(config(&text)), std::slice::from_ref(&log));
        let manager = harness.manager.clone();
        let headers = [("Session-Id", "project-a"), ("content-type", "x")];
        let session_a = manager.config().session_id(headers);
        assert_eq!(session_a.as_deref(), Some("project-a"));

        let first = manager.acquire("m", session_a.as_deref()).await.unwrap();
        let first_answer = chat(first.base_url()).await.unwrap();
        drop(first);
        let same = manager.acquire("m", Some("project-a")).await.unwrap();
        let none = manager.acquire("m", None).await.unwrap();
        assert_eq!(chat(same.base_url()).await.unwrap(), first_answer);
        assert_eq!(starts(&log).len(), 1, "same or no session: no restart");

        // Session b arrives while a's requests run: it waits for them, then restarts.
        let waiting = tokio::spawn({
            let manager = manager.clone();
            async move {
                let lease = manager.acquire("m", Some("project-b")).await?;
                Ok::<_, relay_core::lifecycle::LifecycleError>(
                    chat(lease.base_url()).await.unwrap(),
                )
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiting.is_finished(), "waits for session a's requests");
        assert_eq!(
            chat(none.base_url()).await.unwrap(),
            first_answer,
            "a's still served"
        );
        drop(same);
        drop(none);
        let second_answer = waiting.await.unwrap().expect("b gets the restarted model");
        assert_ne!(second_answer, first_answer, "a new process");
        assert_eq!(starts(&log).len(), 2);
        assert!(!alive(starts(&log)[0]));
        assert_eq!(manager.status()[0].restarts, 1);
        harness.finish().await;
    })
    .await;
}

#[tokio::test]
async fn without_session_restart_a_new_session_keeps_the_model() {
    bounded(async {
        let dir = TempDir::new("nosession");
        let log = dir.join("starts.log");
        let text = format!(
            "[worker.lifecycle]\nmodel_port_base = 25000\n{}",
            fake_entry("m", &log, "", "")
        );
        let harness = Harness::new(dir, quick(config(&text)), std::slice::from_ref(&log));
        drop(harness.manager.acquire("m", Some("a")).await.unwrap());
        drop(harness.manager.acquire("m", Some("b")).await.unwrap());
        assert_eq!(starts(&log).len(), 1);
        harness.finish().await;
    })
    .await;
}
