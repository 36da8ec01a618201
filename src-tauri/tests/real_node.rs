//! The tray and notification mapping against a real relay-core node (no GUI): what the app
//! shows when the node starts, when the worker role is switched on from the tray, and which
//! notification that produces. Its own test binary: it sets MODELRELAY_DATA_DIR for the process.

mod common;

use std::time::Duration;

use common::isolated_nodes;

use relay_core::node::{Node, NodeEvent, NodeOptions, Roles, WorkerState};
use relay_core::settings::Overrides;
use relay_desktop::notifications::message_for;
use relay_desktop::tray_state::{port_of, view, TrayIconKind};

#[test]
fn tray_follows_a_real_node() {
    let (dir, runtime) = isolated_nodes("node");
    let config = dir.join("config.toml");
    std::fs::write(&config, "").unwrap();
    runtime.block_on(async {
        let node = Node::start(NodeOptions {
            config_path: Some(config.clone()),
            overrides: Overrides {
                listen: Some("127.0.0.1:0".into()),
                ..Default::default()
            },
            roles: Some(Roles {
                proxy: true,
                worker: false,
            }),
            ..Default::default()
        })
        .await
        .expect("node starts");
        let url = node.url();
        let port = port_of(&url).expect("node URL has a port");

        let first = view(&node.state().borrow(), &url);
        assert_eq!(first.icon, TrayIconKind::Proxy);
        assert_eq!(first.status_line, format!("Proxy on :{port} · 0 workers"));
        assert!(first.proxy_checked && !first.worker_checked);

        // What the tray's "Join as worker" does.
        let mut events = node.events();
        let mut states = node.state();
        node.set_roles(Roles {
            proxy: true,
            worker: true,
        })
        .await
        .expect("roles applied");
        let connected = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                {
                    let state = states.borrow_and_update();
                    if state.worker == WorkerState::Connected && state.workers_connected == 1 {
                        return state.clone();
                    }
                }
                states.changed().await.expect("node alive");
            }
        })
        .await
        .expect("own worker connects within 30 s");
        let shown = view(&connected, &url);
        assert_eq!(shown.icon, TrayIconKind::Worker);
        assert_eq!(
            shown.status_line,
            format!("Proxy on :{port} · 1 worker · worker connected")
        );

        let joined = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match events.recv().await {
                    Ok(event @ NodeEvent::WorkerJoined { .. }) => return event,
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(e) => panic!("events closed: {e}"),
                }
            }
        })
        .await
        .expect("a WorkerJoined event");
        assert_eq!(message_for(&joined).summary, "Worker joined");

        // The role is saved where relay-core reads it on the next start.
        let saved = std::fs::read_to_string(&config).unwrap();
        assert!(saved.contains("worker = true"), "{saved}");

        node.shutdown().await;
    });
    let _ = std::fs::remove_dir_all(&dir);
}
