//! The worker role: started with the settings of the moment, watched for the dashboard, stopped
//! (drained) when the role goes off or its settings change.

use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{locked, same_proxy, Node, NodeError, Roles, WorkerState};
use crate::proxy::observation::control::OwnWorker;
use crate::settings::{FileConfig, WorkerSettings};
use crate::worker::report::{ConnectionState, WorkerReport};
use crate::worker::{self, Backends, WorkerConfig};

/// The worker role while it runs.
pub(super) struct RunningWorker {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    watcher: JoinHandle<()>,
    pub(super) report: Arc<WorkerReport>,
}

impl Node {
    pub(super) fn apply_roles(&self, roles: Roles, file: &FileConfig) -> Result<(), NodeError> {
        *locked(&self.inner.roles) = roles;
        self.inner.hub.set_serving(roles.proxy);
        self.update_announcement(roles.proxy);
        if roles.worker {
            if locked(&self.inner.worker).is_none() {
                self.start_worker(file)?;
            }
        } else if let Some(worker) = locked(&self.inner.worker).take() {
            stop_in_background(worker);
        }
        self.publish();
        Ok(())
    }

    pub(super) fn start_worker(&self, file: &FileConfig) -> Result<(), NodeError> {
        let own_url = self.url();
        let settings = WorkerSettings::resolve(file, &self.inner.overrides)?;
        let proxy_url = settings
            .proxy_url
            .clone()
            .unwrap_or_else(|| own_url.clone());
        let joins_self = same_proxy(&proxy_url, &own_url);
        let secret = if joins_self {
            self.inner.secret.clone()
        } else {
            settings
                .worker_secret
                .clone()
                .ok_or(NodeError::MissingSecret)?
        };
        let mut config = WorkerConfig::from_settings(
            settings,
            proxy_url.clone(),
            secret,
            Some(self.discovery_options()),
        );
        if let Some(dir) = &self.inner.data_dir {
            config.data_dir = dir.clone();
        }
        if joins_self && self.inner.fingerprint.is_some() {
            // Its own certificate: no CA vouches for a generated one, the pin does.
            config.proxy_fingerprint = self.inner.fingerprint;
        }
        if let Backends::Discover(options) = &mut config.backends {
            options.exclude_ports.push(self.inner.addr.port());
        }
        let report = Arc::new(WorkerReport::default());
        let (stop, stopped) = watch::channel(false);
        tracing::info!(proxy = %proxy_url, name = %config.name, "starting the worker role");
        let name = config.name.clone();
        let task = tokio::spawn(worker::run(config, report.clone(), stopped));
        let watcher = self.spawn_worker_watcher(report.clone(), proxy_url, name);
        *locked(&self.inner.worker) = Some(RunningWorker {
            stop,
            task,
            watcher,
            report,
        });
        Ok(())
    }

    /// Starts a fresh worker with the settings saved now, after its proxy drained the last one
    /// (the dashboard's one-click rejoin). False when the worker role is off.
    pub async fn rejoin_worker(&self) -> Result<bool, NodeError> {
        let _one_at_a_time = self.inner.apply.lock().await;
        if !self.roles().worker {
            return Ok(false);
        }
        self.stop_worker().await;
        let file = super::load(&self.inner.config_path)?;
        self.start_worker(&file)?;
        self.publish();
        tracing::info!("worker role rejoining its proxy");
        Ok(true)
    }

    pub(super) async fn stop_worker(&self) {
        let worker = locked(&self.inner.worker).take();
        if let Some(worker) = worker {
            stop_and_wait(worker).await;
        }
        self.publish();
    }

    pub(super) fn spawn_worker_watcher(
        &self,
        report: Arc<WorkerReport>,
        proxy_url: String,
        name: String,
    ) -> JoinHandle<()> {
        let node = self.clone();
        let mut changes = report.subscribe();
        let mut managers = report.subscribe_lifecycle();
        let mut samplers = report.subscribe_hardware();
        tokio::spawn(async move {
            // The feeds below live across passes on purpose: a watch receiver remembers the last
            // value it saw, and a copy of a long-lived receiver that never reads (the sampler's
            // own) would find every past sample new and wake this loop at once, every time — a
            // busy loop that cost a whole core at idle (issue 24).
            let mut manager = managers.borrow_and_update().clone();
            let mut model_changes = manager.as_ref().map(|m| m.changes());
            let mut samples = seen(samplers.borrow_and_update().clone());
            loop {
                let status = changes.borrow_and_update().clone();
                let lifecycle = manager.as_ref().map(|m| m.status()).unwrap_or_default();
                let hardware = report.hardware();
                node.inner.info.send_modify(|info| {
                    info.worker = OwnWorker {
                        state: match status.state {
                            ConnectionState::Connecting => WorkerState::Connecting,
                            ConnectionState::Connected => WorkerState::Connected,
                            ConnectionState::Disconnected => WorkerState::Disconnected,
                            ConnectionState::Drained => WorkerState::Drained,
                        },
                        // Where it connects now: the proxy may have moved since it joined.
                        proxy_url: Some(
                            status
                                .proxy_url
                                .clone()
                                .unwrap_or_else(|| proxy_url.clone()),
                        ),
                        name: Some(name.clone()),
                        last_error: status.last_error.clone(),
                        hardware,
                    };
                    info.lifecycle = lifecycle;
                });
                node.publish();
                tokio::select! {
                    changed = changes.changed() => if changed.is_err() { return },
                    changed = managers.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        manager = managers.borrow_and_update().clone();
                        // Subscribed before the next read of its status, so no change is missed.
                        model_changes = manager.as_ref().map(|m| m.changes());
                    }
                    changed = samplers.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        samples = seen(samplers.borrow_and_update().clone());
                    }
                    // Each model state change, and each hardware sample (for the tray's tooltip).
                    () = next_value(&mut model_changes) => {}
                    () = next_value(&mut samples) => {}
                }
            }
        })
    }
}

/// A feed whose present value counts as seen: the pass that takes it shows that value already.
fn seen<T>(feed: Option<watch::Receiver<T>>) -> Option<watch::Receiver<T>> {
    feed.map(|mut feed| {
        feed.borrow_and_update();
        feed
    })
}

/// Resolves when `feed` has a value this receiver has not seen; never, without a feed or once
/// its sender is gone (the feed's owner then changes `managers` or `samplers` too).
async fn next_value<T>(feed: &mut Option<watch::Receiver<T>>) {
    if let Some(feed) = feed {
        if feed.changed().await.is_ok() {
            return;
        }
    }
    std::future::pending::<()>().await
}

pub(super) fn stop_in_background(worker: RunningWorker) {
    tokio::spawn(stop_and_wait(worker));
}

pub(super) async fn stop_and_wait(worker: RunningWorker) {
    let _ = worker.stop.send(true);
    let _ = worker.task.await;
    worker.watcher.abort();
}
