//! What a running worker tells whoever embeds it (the node's dashboard, the desktop tray): its
//! connection to the proxy and its model lifecycle manager.

use serde::Serialize;
use tokio::sync::watch;

use crate::hardware::Latest;
use crate::lifecycle::{LifecycleManager, ModelState};
use crate::protocol::{HardwareReport, ModelStateReport};
use crate::worker::resting::Resting;

/// Where the worker's connection to its proxy stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ConnectionState {
    /// Connecting or registering.
    Connecting,
    /// Registered and serving.
    Connected,
    /// The last attempt failed or the connection dropped; retrying with backoff.
    Disconnected,
    /// The proxy drained this worker (`graceful_shutdown`): its requests finished and it does
    /// not reconnect by itself (a headless worker exits; the dashboard offers to rejoin).
    Drained,
}

/// The connection state with the reason of the last failure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConnectionStatus {
    /// The state.
    pub state: ConnectionState,
    /// Why the last connection failed or ended, if it did.
    pub last_error: Option<String>,
    /// The proxy address in use: the configured one, or where the proxy was found after it
    /// moved (`follow`); none before the first attempt.
    pub proxy_url: Option<String>,
}

/// Shared between a running worker and its embedder.
pub struct WorkerReport {
    connection: watch::Sender<ConnectionStatus>,
    lifecycle: watch::Sender<Option<LifecycleManager>>,
    hardware: watch::Sender<Option<Latest>>,
}

impl std::fmt::Debug for WorkerReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerReport")
            .field("connection", &*self.connection.borrow())
            .finish_non_exhaustive()
    }
}

impl Default for WorkerReport {
    fn default() -> Self {
        WorkerReport {
            connection: watch::Sender::new(ConnectionStatus {
                state: ConnectionState::Connecting,
                last_error: None,
                proxy_url: None,
            }),
            lifecycle: watch::Sender::new(None),
            hardware: watch::Sender::new(None),
        }
    }
}

impl WorkerReport {
    /// The connection status now.
    pub fn connection(&self) -> ConnectionStatus {
        self.connection.borrow().clone()
    }

    /// Changes of the connection status.
    pub fn subscribe(&self) -> watch::Receiver<ConnectionStatus> {
        self.connection.subscribe()
    }

    /// The worker's model lifecycle manager, when it has a model map.
    pub fn lifecycle(&self) -> Option<LifecycleManager> {
        self.lifecycle.borrow().clone()
    }

    /// Changes when the worker gets or drops its lifecycle manager (it creates one at start
    /// when it has a model map, and drops it when it stops).
    pub fn subscribe_lifecycle(&self) -> watch::Receiver<Option<LifecycleManager>> {
        self.lifecycle.subscribe()
    }

    pub(crate) fn set_state(&self, state: ConnectionState, error: Option<String>) {
        self.connection.send_if_modified(|status| {
            let changed = status.state != state || (error.is_some() && status.last_error != error);
            status.state = state;
            if error.is_some() {
                status.last_error = error;
            }
            changed
        });
    }

    pub(crate) fn set_proxy_url(&self, url: &str) {
        self.connection.send_if_modified(|status| {
            let changed = status.proxy_url.as_deref() != Some(url);
            status.proxy_url = Some(url.to_string());
            changed
        });
    }

    /// The box's CPU, memory and GPUs at the worker's last sample, while it runs.
    pub fn hardware(&self) -> Option<HardwareReport> {
        let latest = self.hardware.borrow().clone()?;
        let sample = latest.borrow().clone()?;
        Some(sample.report.clone())
    }

    /// Changes when the worker starts or stops sampling; the value is the samples' feed.
    pub fn subscribe_hardware(&self) -> watch::Receiver<Option<Latest>> {
        self.hardware.subscribe()
    }

    pub(crate) fn set_hardware(&self, latest: Option<Latest>) {
        self.hardware.send_replace(latest);
    }

    pub(crate) fn set_lifecycle(&self, manager: Option<LifecycleManager>) {
        self.lifecycle.send_replace(manager);
    }
}

/// The states for a pong: the model map's, and then those of the models that backends it does
/// not manage unloaded by themselves ([`Resting`]); `None` when it knows of neither.
pub fn model_states(
    manager: Option<&LifecycleManager>,
    resting: &Resting,
) -> Option<Vec<ModelStateReport>> {
    let mapped = manager.map(mapped_states);
    let unmanaged = resting.states();
    if unmanaged.is_empty() {
        return mapped;
    }
    Some(mapped.into_iter().flatten().chain(unmanaged).collect())
}

/// The model map's states as the proxy's dashboard shows them: `loaded`, `starting`, `idle`
/// (not running), `stopping`, `failed`.
pub fn mapped_states(manager: &LifecycleManager) -> Vec<ModelStateReport> {
    manager
        .status()
        .into_iter()
        .map(|status| ModelStateReport {
            model: status.name,
            state: match status.state {
                ModelState::Ready => "loaded",
                ModelState::Starting => "starting",
                ModelState::Stopped => "idle",
                ModelState::Stopping => "stopping",
                ModelState::Failed => "failed",
            }
            .to_string(),
            load_ms: status.last_load_ms,
        })
        .collect()
}
