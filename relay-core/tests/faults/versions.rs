//! Day two (issue 28): mixed versions. A house upgrades one box at a time, so a worker of the
//! previous release serves under this proxy, and this worker under the previous proxy, streams
//! and all. What a restart does across versions is what each side's release says: the previous
//! worker knows no `"reconnect": true`, so it exits when this proxy stops (the seeds' meaning of
//! `graceful_shutdown`; a supervisor restarts it), while this release's worker comes back; under
//! the previous proxy, whose `graceful_shutdown` does not say it will be back, this worker takes
//! it as the seeds do, a drain, and exits.
//!
//! The previous release is the commit before issue 28 changed how the two part
//! (`scripts/previous-release.sh` builds it once into `~/.cache`; `MODELRELAY_PREVIOUS_BIN`
//! names another). Without it the scenario says so and is skipped.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};

use super::binary::{unused_port, Running, TempDir};
use super::scenarios::send_all;
use super::support::MockBackend;
use super::*;

/// The previous release's binary, if it was built.
fn previous_release() -> Option<PathBuf> {
    let path = std::env::var_os("MODELRELAY_PREVIOUS_BIN")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|home| {
                PathBuf::from(home).join(".cache/modelrelay-previous/a55551d/modelrelay")
            })
        })?;
    path.is_file().then_some(path)
}

/// Unary answers and streams, mixed.
fn traffic() -> Vec<Value> {
    (0..24)
        .map(|i| {
            if i % 3 == 0 {
                json!({"model": "m", "stream": true, "messages": [],
                       "mock": {"chunks": 10, "chunk_delay_ms": 20}})
            } else {
                json!({"model": "m", "messages": [], "mock": {"delay_ms": 20}})
            }
        })
        .collect()
}

/// Sends [`traffic`] and checks every request was answered whole.
async fn all_answered(url: &str, tally: &mut Tally, what: &str) {
    let outcomes = send_all(url, traffic()).await;
    assert!(
        outcomes.iter().all(|o| *o == Outcome::Answered),
        "{what}: {outcomes:?}"
    );
    tally.outcomes.extend(outcomes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_previous_release_worker_under_this_proxy_and_this_worker_under_the_previous_proxy() {
    let Some(previous) = previous_release() else {
        println!(
            "faults mixed versions: skipped: no previous release built (run \
             scripts/previous-release.sh, or set MODELRELAY_PREVIOUS_BIN)"
        );
        return;
    };
    let backend = MockBackend::start(&["m"]).await;
    let mut tally = Tally::default();

    // This proxy; the previous release's worker alone serves it, then beside this worker.
    let data = TempDir::new("faults-versions-new-proxy");
    let port = unused_port();
    let (mut proxy, url) = start_proxy(&data, port, &[ROOMY_QUEUE]);
    let old_command = worker_command(&data, "previous", &url, &backend.url(), &[]);
    let mut old_worker = Running::spawn(with_program(&old_command, &previous));
    wait_for_workers(&url, 1).await;
    all_answered(&url, &mut tally, "the previous worker under this proxy").await;
    let mut new_worker = start_worker(&data, "this", &url, &backend.url(), &[]);
    wait_for_workers(&url, 2).await;
    all_answered(&url, &mut tally, "both workers under this proxy").await;

    // This proxy restarts: its worker comes back; the previous one exits, as its release does.
    assert!(proxy.terminate().success(), "{}", proxy.output());
    let old_exit = old_worker.wait_exit(Duration::from_secs(30));
    assert!(
        old_exit.success(),
        "the previous worker exits cleanly: {old_exit}\n{}",
        old_worker.output()
    );
    let (_proxy, again) = start_proxy(&data, port, &[ROOMY_QUEUE]);
    let back = wait_for_workers_within(&again, 1, Duration::from_secs(5)).await;
    all_answered(&again, &mut tally, "this worker after the restart").await;
    assert!(
        new_worker.child.try_wait().expect("try_wait").is_none(),
        "this worker is still running"
    );

    // The previous proxy, and this worker under it.
    let old_data = TempDir::new("faults-versions-old-proxy");
    let listen = format!("127.0.0.1:{}", unused_port());
    let (mut old_proxy, old_url) = spawn_proxy(with_program(
        &proxy_command(&old_data, &listen, &[ROOMY_QUEUE]),
        &previous,
    ));
    let info = [("LOG_LEVEL", "info")];
    let mut under_old = start_worker(&old_data, "this", &old_url, &backend.url(), &info);
    wait_for_workers(&old_url, 1).await;
    all_answered(&old_url, &mut tally, "this worker under the previous proxy").await;
    // The previous proxy's shutdown is a drain to this worker, as the seeds say.
    assert!(old_proxy.terminate().success(), "{}", old_proxy.output());
    let exit = under_old.wait_exit(Duration::from_secs(30));
    assert!(exit.success(), "{exit}\n{}", under_old.output());
    assert!(
        under_old.output().contains("drained by the proxy"),
        "{}",
        under_old.output()
    );
    println!(
        "faults mixed versions (this {} and the previous {}): the previous worker \
         under this proxy and this worker under the previous proxy answered everything; on \
         this proxy's restart its own worker was back {:.1} s after it listened, the previous \
         worker exited 0; the previous proxy's shutdown drained this worker (exit 0)",
        env!("CARGO_PKG_VERSION"),
        previous.display(),
        back.as_secs_f64()
    );
    new_worker.terminate();
    tally.report("mixed_versions", 0);
}
