//! What the desktop app shows when the proxy its worker joined goes away and comes back: two
//! real relay-core nodes (a proxy, and a worker-only node like a GPU box's tray app) joined
//! through a TCP link this test cuts and restores, the way a crashed proxy or a lost network
//! looks to the worker. Its own test binary: it sets MODELRELAY_DATA_DIR for the process.

mod common;

use std::net::SocketAddr;

use relay_core::node::{Node, NodeOptions, Roles, WorkerState};
use relay_core::settings::Overrides;
use relay_desktop::tray_state::TrayIconKind;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use common::{isolated_nodes, tray_until};

/// A TCP link from `listen` to `target` that the test can cut (every connection dropped, the
/// port closed) and restore on the same port.
struct Link {
    addr: SocketAddr,
    target: SocketAddr,
    tasks: JoinSet<()>,
}

impl Link {
    async fn open(target: SocketAddr) -> Link {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind link");
        let addr = listener.local_addr().expect("address");
        let mut link = Link {
            addr,
            target,
            tasks: JoinSet::new(),
        };
        link.serve(listener);
        link
    }

    fn serve(&mut self, listener: TcpListener) {
        let target = self.target;
        self.tasks.spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((mut inbound, _)) = listener.accept().await {
                connections.spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
    }

    /// Drops every connection and closes the port: the worker's socket breaks at once.
    async fn cut(&mut self) {
        self.tasks.shutdown().await;
    }

    async fn restore(&mut self) {
        let listener = TcpListener::bind(self.addr).await.expect("rebind link");
        self.serve(listener);
    }
}

#[test]
fn the_tray_shows_the_proxys_outage_and_the_recovery() {
    let (dir, runtime) = isolated_nodes("outage");
    runtime.block_on(async {
        let config = |name: &str| {
            let path = dir.join(name);
            std::fs::write(&path, "").unwrap();
            Some(path)
        };
        let proxy = Node::start(NodeOptions {
            config_path: config("proxy.toml"),
            overrides: Overrides {
                listen: Some("127.0.0.1:0".into()),
                heartbeat_interval_secs: Some(1),
                heartbeat_timeout_secs: Some(3),
                ..Default::default()
            },
            roles: Some(Roles {
                proxy: true,
                worker: false,
            }),
            ..Default::default()
        })
        .await
        .expect("the proxy node starts");
        let mut link = Link::open(proxy.addr()).await;
        let gpu_box = Node::start(NodeOptions {
            config_path: config("worker.toml"),
            overrides: Overrides {
                listen: Some("127.0.0.1:0".into()),
                proxy_url: Some(format!("http://{}", link.addr)),
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
        let (proxy_url, box_url) = (proxy.url(), gpu_box.url());
        let (mut proxy_states, mut box_states) = (proxy.state(), gpu_box.state());

        let joined = tray_until(&mut box_states, &box_url, "the worker connected", |s| {
            s.worker == WorkerState::Connected
        })
        .await;
        assert_eq!(joined.icon, TrayIconKind::Worker);
        assert_eq!(joined.status_line, "worker connected");
        let serving = tray_until(&mut proxy_states, &proxy_url, "one worker", |s| {
            s.workers_connected == 1
        })
        .await;
        assert!(serving.status_line.ends_with("· 1 worker"), "{serving:?}");

        // The outage: the box's tray says so, and the proxy's counts the worker gone.
        link.cut().await;
        let lost = tray_until(&mut box_states, &box_url, "the outage", |s| {
            s.worker == WorkerState::Disconnected
        })
        .await;
        assert_eq!(
            lost.icon,
            TrayIconKind::Error,
            "red: the box serves nothing now"
        );
        assert!(
            lost.status_line.contains("cannot reach its proxy"),
            "{lost:?}"
        );
        let alone = tray_until(&mut proxy_states, &proxy_url, "no worker", |s| {
            s.workers_connected == 0
        })
        .await;
        assert!(alone.status_line.ends_with("· 0 workers"), "{alone:?}");

        // The recovery, with nothing done on the box.
        link.restore().await;
        let back = tray_until(&mut box_states, &box_url, "the recovery", |s| {
            s.worker == WorkerState::Connected
        })
        .await;
        assert_eq!(back.icon, TrayIconKind::Worker);
        assert_eq!(back.status_line, "worker connected");
        tray_until(&mut proxy_states, &proxy_url, "the worker back", |s| {
            s.workers_connected == 1
        })
        .await;

        gpu_box.shutdown().await;
        proxy.shutdown().await;
    });
    let _ = std::fs::remove_dir_all(&dir);
}
