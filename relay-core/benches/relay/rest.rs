//! `rest`: what the relay costs while nothing happens, which is almost all of a home box's life.
//! Every process a box runs idle is started, left to settle, then watched over one window at
//! the same time (they are idle, so they do not compete): CPU per minute and wake-ups per second.
//!
//! A wake-up is a context switch of any of the process's threads (read as the idle guard
//! `tests/idle.rs` reads them, `tests/common/rest.rs`): each is a thread put to sleep and woken
//! again (or preempted), which is what keeps a CPU out of its deep idle states. The desktop
//! app's rows (tray only, dashboard open) come from `scripts/desktop-footprint.sh`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::procs::{
    modelrelay_binary, port_after, start_backend, start_proxy, start_worker, wait_for_workers,
    ChildProcess, SECRET,
};
use crate::report::Row;
use crate::rest_meter::Reading;
use crate::{fake_workers, load};

/// Time to connect, register and take the first samples before the window opens.
const SETTLE: Duration = Duration::from_secs(5);
/// A node at rest uses less than this share of a core (issue 24's target)...
const NODE_MAX_CORE_SHARE: f64 = 0.005;
/// ... and wakes up less often than this.
const NODE_MAX_WAKEUPS: f64 = 20.0;

/// One process watched at rest, with the figures its rows carry.
struct Subject {
    cpu_figure: &'static str,
    wakeup_figure: &'static str,
    /// Whether issue 24's node targets apply (a node is what a box runs at login).
    node: bool,
}

const NODE: Subject = Subject {
    cpu_figure: "node, both roles, own worker on an idle backend: CPU per minute (ms)",
    wakeup_figure: "node, both roles: wake-ups per second",
    node: true,
};
const WORKER_NODE: Subject = Subject {
    cpu_figure: "node, worker role only, joined to a proxy: CPU per minute (ms)",
    wakeup_figure: "node, worker role only: wake-ups per second",
    node: true,
};
const PROXY_ONE: Subject = Subject {
    cpu_figure: "`modelrelay serve`, one worker: CPU per minute (ms)",
    wakeup_figure: "`modelrelay serve`, one worker: wake-ups per second",
    node: false,
};
const WORKER: Subject = Subject {
    cpu_figure: "`modelrelay worker`, idle backend: CPU per minute (ms)",
    wakeup_figure: "`modelrelay worker`, idle backend: wake-ups per second",
    node: false,
};
const PROXY_HUNDRED: Subject = Subject {
    cpu_figure: "`modelrelay serve`, 100 idle workers: CPU per minute (ms)",
    wakeup_figure: "`modelrelay serve`, 100 idle workers: wake-ups per second",
    node: false,
};

/// A data directory of this run's own, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(label: &str) -> Scratch {
        let path = std::env::temp_dir().join(format!(
            "modelrelay-bench-rest-{}-{label}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create a scratch directory");
        Scratch(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `modelrelay` as a node (no subcommand), with a data directory and a config directory of its
/// own (no user config file), serving model `bench` from the backend on `backend_port`.
fn node_command(scratch: &Scratch, backend_port: u16) -> Command {
    let mut command = Command::new(modelrelay_binary());
    command
        .args(["--listen", "127.0.0.1:0", "--models", "bench"])
        .args(["--backend-url", &format!("http://127.0.0.1:{backend_port}")])
        .env("LOG_LEVEL", "warn")
        .env("MODELRELAY_DATA_DIR", scratch.path())
        .env("XDG_CONFIG_HOME", scratch.path().join("config-home"));
    command
}

/// The rows: each idle process's CPU per minute and wake-ups per second over `window`.
pub async fn rows(window: Duration) -> Vec<Row> {
    let (backend, backend_port) = start_backend();

    // A node with both roles, as the tray and a zero-configuration `modelrelay` run it.
    let node_dir = Scratch::new("node");
    let node = ChildProcess::start(
        node_command(&node_dir, backend_port),
        Some("serving at http://"),
    );
    let node_port = port_after(&node.announced, "http://127.0.0.1:");
    wait_for_workers(&load::client(1), node_port, 1).await;

    // A proxy with a headless worker, and a worker-only node joined to the same proxy.
    let (proxy, proxy_port) = start_proxy(&[]);
    let worker = start_worker(proxy_port, backend_port, 4);
    let worker_node_dir = Scratch::new("worker-node");
    let config = worker_node_dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[roles]\nproxy = false\nworker = true\n\n[worker]\n\
             proxy_url = \"http://127.0.0.1:{proxy_port}\"\nworker_secret = \"{SECRET}\"\n\
             worker_name = \"bench-worker-node\"\n"
        ),
    )
    .expect("write the worker node's config");
    let mut command = node_command(&worker_node_dir, backend_port);
    command.arg("--config").arg(&config);
    let worker_node = ChildProcess::start(command, None);
    wait_for_workers(&load::client(1), proxy_port, 2).await;

    // A proxy with 100 light workers (in this bench process, so only the proxy is measured).
    let (crowded, crowded_port) = start_proxy(&[]);
    let fakes = fake_workers::connect(crowded_port, 100).await;
    wait_for_workers(&load::client(1), crowded_port, 100).await;

    tokio::time::sleep(SETTLE).await;
    let watched: [(&Subject, &ChildProcess); 5] = [
        (&NODE, &node),
        (&WORKER_NODE, &worker_node),
        (&PROXY_ONE, &proxy),
        (&WORKER, &worker),
        (&PROXY_HUNDRED, &crowded),
    ];
    let read = |process: &ChildProcess| Reading::of(process.pid()).expect("process running");
    let before: Vec<Reading> = watched.iter().map(|(_, p)| read(p)).collect();
    tokio::time::sleep(window).await;
    let mut rows = Vec::new();
    for ((subject, process), before) in watched.iter().zip(&before) {
        let rest = read(process).since(before);
        let (core_share, wakeups) = (rest.core_share(), rest.wakeups_per_sec());
        eprintln!(
            "rest: {}: {:.3}% of a core, {wakeups:.1} wake-ups/s",
            subject.cpu_figure,
            core_share * 100.0
        );
        rows.push(Row {
            scenario: "rest",
            figure: subject.cpu_figure,
            direct: None,
            relay: core_share * 60_000.0,
            target: if subject.node {
                "< 300 ms (0.5% of a core)".to_string()
            } else {
                "–".to_string()
            },
            met: subject.node.then_some(core_share < NODE_MAX_CORE_SHARE),
        });
        rows.push(Row {
            scenario: "rest",
            figure: subject.wakeup_figure,
            direct: None,
            relay: wakeups,
            target: if subject.node {
                format!("< {NODE_MAX_WAKEUPS:.0}")
            } else {
                "–".to_string()
            },
            met: subject.node.then_some(wakeups < NODE_MAX_WAKEUPS),
        });
    }
    for fake in fakes {
        fake.abort();
    }
    drop(backend);
    rows
}
