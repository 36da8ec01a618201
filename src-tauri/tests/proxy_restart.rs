//! What the desktop app shows when the proxy its worker joined is restarted the ordinary way
//! (SIGTERM, the tray's Quit, an upgrade): two real relay-core nodes, a proxy and a worker-only
//! node like a GPU box's tray app; the proxy shuts down gracefully and a new one starts on the
//! same address. The box's tray shows a short outage that heals by itself, never "drained"
//! waiting for a click. Its own test binary: it sets MODELRELAY_DATA_DIR for the process.

mod common;

use std::time::{Duration, Instant};

use relay_core::node::{Node, NodeOptions, NodeState, Roles, WorkerState};
use relay_core::settings::Overrides;
use relay_desktop::tray_state::TrayIconKind;

use common::{isolated_nodes, tray_until};

/// Whether the box's worker is `wanted` now; a box shown drained fails the test (a proxy
/// restart must never leave it waiting for a click).
fn worker_is(wanted: WorkerState) -> impl Fn(&NodeState) -> bool {
    move |state| {
        assert_ne!(
            state.worker,
            WorkerState::Drained,
            "a proxy restart must not leave the box drained"
        );
        state.worker == wanted
    }
}

/// A node with the proxy role only, listening on `listen`.
async fn proxy_node(config: &std::path::Path, listen: String) -> Node {
    std::fs::write(config, "").unwrap();
    Node::start(NodeOptions {
        config_path: Some(config.to_path_buf()),
        overrides: Overrides {
            listen: Some(listen),
            ..Default::default()
        },
        roles: Some(Roles {
            proxy: true,
            worker: false,
        }),
        ..Default::default()
    })
    .await
    .expect("the proxy node starts")
}

#[test]
fn the_tray_shows_a_proxy_restart_as_a_short_outage_that_heals_by_itself() {
    let (dir, runtime) = isolated_nodes("restart");
    runtime.block_on(async {
        let proxy = proxy_node(&dir.join("proxy.toml"), "127.0.0.1:0".into()).await;
        let addr = proxy.addr();
        let worker_config = dir.join("worker.toml");
        std::fs::write(&worker_config, "").unwrap();
        let gpu_box = Node::start(NodeOptions {
            config_path: Some(worker_config),
            overrides: Overrides {
                listen: Some("127.0.0.1:0".into()),
                proxy_url: Some(proxy.url()),
                worker_secret: Some(proxy.secret().to_string()),
                worker_name: Some("gpu-box".into()),
                ..Default::default()
            },
            roles: Some(Roles {
                proxy: false,
                worker: true,
            }),
            ..Default::default()
        })
        .await
        .expect("the worker node starts");
        let box_url = gpu_box.url();
        let mut box_states = gpu_box.state();
        tray_until(
            &mut box_states,
            &box_url,
            "the worker connected",
            worker_is(WorkerState::Connected),
        )
        .await;

        // The proxy stops gracefully (it tells its workers it stops, and drains them).
        proxy.shutdown().await;
        let lost = tray_until(
            &mut box_states,
            &box_url,
            "the outage",
            worker_is(WorkerState::Disconnected),
        )
        .await;
        assert_eq!(lost.icon, TrayIconKind::Error, "{lost:?}");
        assert!(lost.status_line.contains("the proxy stopped"), "{lost:?}");

        // The same proxy starts again on its address (same data directory, same secret): the
        // box is back within seconds, with nothing done on it.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let proxy = proxy_node(&dir.join("proxy.toml"), addr.to_string()).await;
        let listening = Instant::now();
        let back = tray_until(
            &mut box_states,
            &box_url,
            "the recovery",
            worker_is(WorkerState::Connected),
        )
        .await;
        assert!(
            listening.elapsed() < Duration::from_secs(5),
            "back {:?} after the proxy listened again",
            listening.elapsed()
        );
        assert_eq!(back.icon, TrayIconKind::Worker);
        assert_eq!(back.status_line, "worker connected");

        gpu_box.shutdown().await;
        proxy.shutdown().await;
    });
    let _ = std::fs::remove_dir_all(&dir);
}
