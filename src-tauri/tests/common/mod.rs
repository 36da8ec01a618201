#![allow(dead_code)] // Each test binary uses its own part of this.
//! What every test binary that runs real relay-core nodes needs: a data directory of its own
//! (set for the whole process, which is why each such test is a binary of its own) and a
//! multi-thread runtime for the nodes' tasks.

use std::path::PathBuf;
use std::time::Duration;

use relay_core::node::NodeState;
use relay_desktop::tray_state::{view, TrayView};
use tokio::sync::watch;

/// How long any step may take: reconnect backoff and heartbeat timeouts included.
pub const BOUND: Duration = Duration::from_secs(30);

/// A fresh temporary directory named after `name`, with `MODELRELAY_DATA_DIR` pointing into it
/// (the worker secret is generated there, not in the developer's data directory), and a
/// runtime. The caller removes the directory when done.
pub fn isolated_nodes(name: &str) -> (PathBuf, tokio::runtime::Runtime) {
    let dir = std::env::temp_dir().join(format!("relay-desktop-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::env::set_var("MODELRELAY_DATA_DIR", dir.join("data"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    (dir, runtime)
}

/// Waits until the node's state shows `wanted`; returns the tray view of that state.
pub async fn tray_until(
    states: &mut watch::Receiver<NodeState>,
    url: &str,
    what: &str,
    wanted: impl Fn(&NodeState) -> bool,
) -> TrayView {
    let found = tokio::time::timeout(BOUND, async {
        loop {
            {
                let state = states.borrow_and_update();
                if wanted(&state) {
                    return view(&state, url);
                }
            }
            states.changed().await.expect("node alive");
        }
    })
    .await;
    found.unwrap_or_else(|_| {
        panic!(
            "the tray never showed {what}; last: {:?}",
            view(&states.borrow(), url)
        )
    })
}
