//! TEMPORARY stand-in for relay_core::node (planned shape) until it lands.
#![allow(dead_code, missing_docs)]
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use tokio::sync::{broadcast, watch};

#[derive(Default, Debug, Clone)]
pub struct NodeOptions {
    pub config_path: Option<PathBuf>,
    pub listen: Option<String>,
    pub roles: Option<Roles>,
}
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Roles {
    pub proxy: bool,
    pub worker: bool,
}
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkerState {
    Off,
    Connecting,
    Connected,
    Disconnected,
}
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeState {
    pub roles: Roles,
    pub worker: WorkerState,
    pub workers_connected: usize,
    pub error: Option<String>,
}
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeEvent {
    WorkerJoined { name: String, host: String },
    WorkerLeft { name: String },
    BackendFound { url: String, label: String },
    BackendLost { url: String },
    Error { message: String },
}
#[derive(Debug)]
pub struct NodeError;
impl std::fmt::Display for NodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("node error")
    }
}
#[derive(Clone)]
pub struct Node { state: std::sync::Arc<watch::Sender<NodeState>>, events: broadcast::Sender<NodeEvent>, url: String, proxy: std::sync::Arc<tokio::sync::Mutex<Option<relay_core::proxy::RunningProxy>>> }
impl Node {
    pub async fn start(o: NodeOptions) -> Result<Node, relay_core::app::AppError> {
        use relay_core::{app, config};
        let file = config::load_file(o.config_path.as_deref())?;
        let args = relay_core::cli::ProxyArgs { listen: o.listen.clone(), ..Default::default() };
        let (address, explicit) = config::listen_address(&args, &file);
        let listener = app::bind(&address, explicit).await?;
        let secret = app::stored_secret(true)?.unwrap_or_default();
        let cfg = config::proxy_config(&args, &file, secret)?;
        let proxy = relay_core::proxy::start(cfg, listener).map_err(|e| app::AppError::Listen { address, reason: e.to_string() })?;
        let url = proxy.url();
        let state = watch::channel(NodeState { roles: Roles { proxy: true, worker: false }, worker: WorkerState::Off, workers_connected: 0, error: None }).0;
        Ok(Node { state: std::sync::Arc::new(state), events: broadcast::channel(64).0, url, proxy: std::sync::Arc::new(tokio::sync::Mutex::new(Some(proxy))) })
    }
    pub fn url(&self) -> String { self.url.clone() }
    pub fn admin_token(&self) -> Option<String> { None }
    pub fn state(&self) -> watch::Receiver<NodeState> { self.state.subscribe() }
    pub fn events(&self) -> broadcast::Receiver<NodeEvent> { self.events.subscribe() }
    pub fn roles(&self) -> Roles { self.state.borrow().roles }
    pub async fn set_roles(&self, r: Roles) -> Result<(), NodeError> { self.state.send_modify(|s| s.roles = r); let _ = self.events.send(NodeEvent::WorkerJoined { name: "stub".into(), host: "h".into() }); Ok(()) }
    pub async fn shutdown(&self) { if let Some(p) = self.proxy.lock().await.take() { p.shutdown().await; } }
}
