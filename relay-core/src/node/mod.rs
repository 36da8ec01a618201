//! A node: the relay as one process runs it — a proxy (with the dashboard and its API) and/or a
//! worker, switched on and off live. `modelrelay` and the desktop app both run one.
//!
//! The HTTP listener always runs, so the dashboard is reachable whatever the roles are; with the
//! proxy role off, client and worker routes answer 503 and the node only runs its worker.

pub mod api;
pub mod guarded;
pub mod join_code;
pub mod settings;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;

use crate::app::{self, AppError};
use crate::cli::{ProxyArgs, WorkerArgs};
use crate::config::{self, FileConfig};
use crate::dialect::ApiError;
use crate::discovery::{self, DiscoveredBackend, DiscoveryOptions};
use crate::lan;
use crate::proxy::aliases::LiveAliases;
use crate::proxy::control::{AdminAccess, AdminToken, OwnWorker, SharedNodeInfo, TokenOrigin};
use crate::proxy::hub::Hub;
use crate::proxy::{self, RunningProxy};
use crate::worker::report::{ConnectionState, WorkerReport};
use crate::worker::{self, Backends};

pub use crate::proxy::control::{OwnWorkerState as WorkerState, Roles};

/// How often the node looks at the hub for workers joining and leaving.
const WATCH_PERIOD: Duration = Duration::from_millis(500);
/// How often local backends are looked for, while someone listens for node events.
const BACKEND_SCAN_PERIOD: Duration = Duration::from_secs(30);

/// How to start a node.
#[derive(Debug, Clone, Default)]
pub struct NodeOptions {
    /// The config file settings are read from and saved to; the OS config directory's
    /// `modelrelay/config.toml` when `None`.
    pub config_path: Option<PathBuf>,
    /// Proxy flags (they win over the file).
    pub proxy_args: ProxyArgs,
    /// Worker flags (they win over the file).
    pub worker_args: WorkerArgs,
    /// Roles to run, overriding the file's `[roles]` (e.g. `modelrelay serve`).
    pub roles: Option<Roles>,
    /// Where the worker keeps its model servers' pid files; the data directory when `None`.
    pub data_dir: Option<PathBuf>,
}

/// What the tray shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeState {
    /// The roles on.
    pub roles: Roles,
    /// The node's own worker.
    pub worker: WorkerState,
    /// Workers connected to this node's proxy.
    pub workers_connected: usize,
    /// Something that needs the user, if anything does.
    pub error: Option<String>,
}

/// What the desktop notifies about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeEvent {
    /// A worker joined this node's proxy.
    WorkerJoined {
        /// Its name.
        name: String,
        /// Where it connects from.
        host: String,
    },
    /// A worker left this node's proxy.
    WorkerLeft {
        /// Its name.
        name: String,
    },
    /// A model server appeared on this machine.
    BackendFound {
        /// Its URL.
        url: String,
        /// What it is (llama-server, Ollama, ...).
        label: String,
    },
    /// A model server on this machine went away.
    BackendLost {
        /// Its URL.
        url: String,
    },
    /// Something needs the user.
    Error {
        /// What, and what to do.
        message: String,
    },
}

/// Why a node operation failed.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// Invalid settings; nothing was saved.
    #[error("{0}")]
    Invalid(String),
    /// The config file could not be read or written.
    #[error("config file {path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The node could not apply the settings.
    #[error(transparent)]
    App(#[from] AppError),
    /// The change needs the admin token, and the request did not carry it; nothing was saved.
    #[error("{}", .0.message)]
    Forbidden(ApiError),
}

/// Who asks for a settings change.
pub enum Caller<'a> {
    /// Code of the program embedding the node (the desktop app's tray): trusted.
    Owner,
    /// A control-API request: its guarded changes ([`guarded`]) need the admin token in
    /// these headers.
    Request(&'a axum::http::HeaderMap),
}

/// A running node; cheap to clone.
#[derive(Clone)]
pub struct Node {
    inner: Arc<Inner>,
}

struct RunningWorker {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    watcher: JoinHandle<()>,
    report: Arc<WorkerReport>,
}

struct Inner {
    config_path: PathBuf,
    proxy_args: ProxyArgs,
    worker_args: WorkerArgs,
    data_dir: Option<PathBuf>,
    addr: SocketAddr,
    /// The certificate's fingerprint when the proxy serves TLS (then the node's URL is https).
    fingerprint: Option<crate::tls::Fingerprint>,
    secret: String,
    provider: String,
    admin_token: Option<String>,
    access: AdminAccess,
    hub: Arc<Hub>,
    info: SharedNodeInfo,
    aliases: Arc<LiveAliases>,
    proxy: Mutex<Option<RunningProxy>>,
    roles: Mutex<Roles>,
    /// Role changes and settings saves one at a time.
    apply: tokio::sync::Mutex<()>,
    worker: Mutex<Option<RunningWorker>>,
    state: watch::Sender<NodeState>,
    events: broadcast::Sender<NodeEvent>,
    restart_required: Mutex<Vec<String>>,
    announcement: Mutex<Option<lan::Announcement>>,
    background: Mutex<Vec<JoinHandle<()>>>,
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl Node {
    /// Binds, starts the proxy (dashboard, API and client routes) and the worker if its role is
    /// on.
    pub async fn start(options: NodeOptions) -> Result<Node, AppError> {
        let config_path = options
            .config_path
            .clone()
            .or_else(config::default_config_path)
            .unwrap_or_else(|| PathBuf::from("modelrelay.toml"));
        let file = load(&config_path)?;
        let roles = options.roles.unwrap_or(Roles {
            proxy: file.roles.proxy.unwrap_or(true),
            worker: file.roles.worker.unwrap_or(true),
        });
        let (address, explicit) = config::listen_address(&options.proxy_args, &file);
        let listener = app::bind(&address, explicit).await?;
        let addr = listener.local_addr().map_err(|e| AppError::Listen {
            address: address.clone(),
            reason: e.to_string(),
        })?;
        let secret = app::proxy_secret(options.proxy_args.worker_secret.as_ref(), &file)?;
        let mut proxy_config = config::proxy_config(&options.proxy_args, &file, secret.clone())?;
        let tls_setting = config::tls_setting(&options.proxy_args, &file)?;
        proxy_config.tls = crate::tls::ServerTls::for_setting(
            &tls_setting,
            &options.data_dir.clone().unwrap_or_else(app::data_dir),
            &crate::tls::server::self_signed_names(&lan::host_name(), addr.ip()),
        )?;
        let fingerprint = proxy_config.tls.as_ref().map(|tls| tls.fingerprint());
        // Every node has a token: on loopback it guards only the changes that run programs or
        // send secrets elsewhere, beyond loopback (or when configured) every control route.
        if proxy_config.admin_token.is_none() {
            let dir = options.data_dir.clone().unwrap_or_else(app::data_dir);
            proxy_config.admin_token = Some(AdminToken(app::stored_admin_token(&dir)?));
            proxy_config.admin_token_origin = TokenOrigin::Stored(app::admin_token_path(&dir));
        }
        let admin_token = proxy_config.admin_token.as_ref().map(|t| t.0.clone());
        let access = AdminAccess::new(
            proxy_config.admin_token.clone(),
            proxy_config.admin_token_origin.clone(),
            addr.ip().is_loopback(),
        );
        let provider = proxy_config.providers[0].name.clone();
        let slot = api::NodeSlot::default();
        let running = proxy::start_with(
            proxy_config,
            listener,
            api::routes(slot.clone(), access.clone()),
        )
        .map_err(|e| AppError::Listen {
            address,
            reason: e.to_string(),
        })?;
        let node = Node {
            inner: Arc::new(Inner {
                config_path,
                proxy_args: options.proxy_args,
                worker_args: options.worker_args,
                data_dir: options.data_dir,
                addr,
                fingerprint,
                secret,
                provider,
                admin_token,
                access,
                hub: running.hub.clone(),
                info: running.node.clone(),
                aliases: running.aliases.clone(),
                proxy: Mutex::new(Some(running)),
                roles: Mutex::new(roles),
                apply: tokio::sync::Mutex::new(()),
                worker: Mutex::new(None),
                state: watch::Sender::new(NodeState {
                    roles,
                    worker: WorkerState::Off,
                    workers_connected: 0,
                    error: None,
                }),
                events: broadcast::channel(64).0,
                restart_required: Mutex::new(Vec::new()),
                announcement: Mutex::new(None),
                background: Mutex::new(Vec::new()),
            }),
        };
        slot.set(&node);
        tracing::info!(addr = %addr, proxy = roles.proxy, worker = roles.worker, "node listening");
        node.apply_roles(roles, &file)?;
        node.spawn_watchers();
        Ok(node)
    }

    /// The base URL of this node (dashboard, API and, with the proxy role, clients).
    pub fn url(&self) -> String {
        let scheme = if self.inner.fingerprint.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.inner.addr)
    }

    /// The SHA-256 fingerprint of the certificate the proxy serves, when it serves TLS.
    pub fn fingerprint(&self) -> Option<crate::tls::Fingerprint> {
        self.inner.fingerprint
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// The secret workers joining this node's proxy present.
    pub fn secret(&self) -> &str {
        &self.inner.secret
    }

    /// The provider workers join by default.
    pub fn provider(&self) -> &str {
        &self.inner.provider
    }

    /// The control API's token (configured, or generated and stored in the data directory).
    pub fn admin_token(&self) -> Option<String> {
        self.inner.admin_token.clone()
    }

    /// Where the admin token came from.
    pub fn admin_token_origin(&self) -> TokenOrigin {
        self.inner.access.token_origin().clone()
    }

    /// The config file settings are saved to.
    pub fn config_path(&self) -> &std::path::Path {
        &self.inner.config_path
    }

    /// The roles running now.
    pub fn roles(&self) -> Roles {
        *locked(&self.inner.roles)
    }

    /// The tray's view, and its changes.
    pub fn state(&self) -> watch::Receiver<NodeState> {
        self.inner.state.subscribe()
    }

    /// Events to notify about.
    pub fn events(&self) -> broadcast::Receiver<NodeEvent> {
        self.inner.events.subscribe()
    }

    /// The proxy's routing state.
    pub fn hub(&self) -> &Arc<Hub> {
        &self.inner.hub
    }

    /// The own worker's report (connection, model lifecycle), while the worker role is on.
    pub fn worker_report(&self) -> Option<Arc<WorkerReport>> {
        locked(&self.inner.worker)
            .as_ref()
            .map(|w| w.report.clone())
    }

    /// Saved settings that take effect only after a restart.
    pub fn restart_required(&self) -> Vec<String> {
        locked(&self.inner.restart_required).clone()
    }

    /// Turns roles on or off now and saves them to the config file.
    pub async fn set_roles(&self, roles: Roles) -> Result<(), NodeError> {
        let patch = serde_json::json!({"roles": {"proxy": roles.proxy, "worker": roles.worker}});
        self.save_settings(&patch, Caller::Owner).await.map(|_| ())
    }

    /// Refuses `caller`'s change from `old` to `new` when it touches a guarded setting and the
    /// caller has no admin token.
    fn authorize(&self, caller: &Caller<'_>, old: &str, new: &str) -> Result<(), NodeError> {
        let Caller::Request(headers) = caller else {
            return Ok(());
        };
        let fields = guarded::changed(old, new);
        if fields.is_empty() {
            return Ok(());
        }
        let what = format!(
            "Changing {} (it decides which programs this node runs or where it sends secrets)",
            fields.join(", ")
        );
        self.inner
            .access
            .elevated(headers, &what)
            .map_err(NodeError::Forbidden)
    }

    /// Applies a settings patch (see [`settings::patch`]): validates, saves, and applies what
    /// can be applied live.
    pub async fn save_settings(
        &self,
        patch: &serde_json::Value,
        caller: Caller<'_>,
    ) -> Result<settings::Changes, NodeError> {
        let _one_at_a_time = self.inner.apply.lock().await;
        let path = &self.inner.config_path;
        let text = settings::read(path).map_err(|source| NodeError::File {
            path: path.clone(),
            source,
        })?;
        let (new_text, changes) = settings::patch(&text, patch).map_err(NodeError::Invalid)?;
        self.authorize(&caller, &text, &new_text)?;
        self.write_and_apply(&new_text, changes).await
    }

    /// Replaces the whole config file with `text` (validated first) and applies it.
    /// Secrets shown as [`settings::REDACTED`] keep their saved values.
    pub async fn save_config_text(
        &self,
        text: &str,
        caller: Caller<'_>,
    ) -> Result<settings::Changes, NodeError> {
        let _one_at_a_time = self.inner.apply.lock().await;
        let path = &self.inner.config_path;
        let old = settings::read(path).map_err(|source| NodeError::File {
            path: path.clone(),
            source,
        })?;
        let text = settings::restore_secrets(text, &old).map_err(NodeError::Invalid)?;
        settings::validate(&text).map_err(NodeError::Invalid)?;
        self.authorize(&caller, &old, &text)?;
        let changes = settings::diff(&old, &text);
        self.write_and_apply(&text, changes).await
    }

    async fn write_and_apply(
        &self,
        text: &str,
        changes: settings::Changes,
    ) -> Result<settings::Changes, NodeError> {
        let path = &self.inner.config_path;
        if !changes.fields.is_empty() {
            settings::write(path, text).map_err(|source| NodeError::File {
                path: path.clone(),
                source,
            })?;
            tracing::info!(path = %path.display(), changed = ?changes.fields, "settings saved");
        }
        let file = settings::validate(text).map_err(NodeError::Invalid)?;
        if changes.touches_any(settings::LIVE_PROXY_FIELDS) {
            // Resolved as at start (flags and environment over the file), then applied.
            let config =
                config::proxy_config(&self.inner.proxy_args, &file, self.inner.secret.clone())
                    .map_err(|e| NodeError::Invalid(e.to_string()))?;
            self.inner.aliases.replace(config.aliases);
            for provider in config.providers {
                self.inner.hub.set_limits(&provider.name, provider.limits);
            }
            tracing::info!("model aliases and queue limits applied");
        }
        {
            let mut pending = locked(&self.inner.restart_required);
            for field in changes.needing_restart() {
                if !pending.contains(&field) {
                    pending.push(field);
                }
            }
        }
        // A role the file leaves unset stays as it runs (it may come from the command line).
        let running = self.roles();
        let roles = Roles {
            proxy: file.roles.proxy.unwrap_or(running.proxy),
            worker: file.roles.worker.unwrap_or(running.worker),
        };
        if changes.touches("worker") && roles.worker && self.roles().worker {
            // New connection or backend settings: a fresh worker picks them up.
            self.stop_worker().await;
        }
        self.apply_roles(roles, &file)?;
        Ok(changes)
    }

    fn apply_roles(&self, roles: Roles, file: &FileConfig) -> Result<(), AppError> {
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

    fn start_worker(&self, file: &FileConfig) -> Result<(), AppError> {
        let own_url = self.url();
        let mut args = self.inner.worker_args.clone();
        let proxy_url = args
            .proxy_url
            .clone()
            .or_else(|| file.worker.proxy_url.clone())
            .unwrap_or_else(|| own_url.clone());
        let joins_self = same_proxy(&proxy_url, &own_url);
        let secret = if joins_self {
            self.inner.secret.clone()
        } else {
            file.worker
                .worker_secret
                .clone()
                .or_else(|| self.inner.proxy_args.worker_secret.clone())
                .ok_or(AppError::MissingSecret)?
        };
        args.proxy_url = Some(proxy_url.clone());
        let mut config = config::worker_config(
            &args,
            &self.inner.proxy_args,
            file,
            secret,
            Some(self.discovery_options()),
        )?;
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
        let report = config.report.clone();
        let (stop, stopped) = watch::channel(false);
        tracing::info!(proxy = %proxy_url, name = %config.name, "starting the worker role");
        let name = config.name.clone();
        let task = tokio::spawn(worker::run(config, stopped));
        let watcher = self.spawn_worker_watcher(report.clone(), proxy_url, name);
        *locked(&self.inner.worker) = Some(RunningWorker {
            stop,
            task,
            watcher,
            report,
        });
        Ok(())
    }

    async fn stop_worker(&self) {
        let worker = locked(&self.inner.worker).take();
        if let Some(worker) = worker {
            stop_and_wait(worker).await;
        }
        self.publish();
    }

    /// Local backend discovery as this node does it: the well-known ports, or
    /// `MODELRELAY_DISCOVERY_PORTS` (a comma-separated list), never this node's own port.
    pub fn discovery_options(&self) -> DiscoveryOptions {
        let mut options = DiscoveryOptions::default();
        if let Some(ports) = std::env::var("MODELRELAY_DISCOVERY_PORTS")
            .ok()
            .map(|v| parse_ports(&v))
        {
            options.ports = ports;
        }
        options.exclude_ports.push(self.inner.addr.port());
        options
    }

    /// Local backends and LAN proxies, looked for at the same time.
    pub async fn discover(&self) -> (Vec<DiscoveredBackend>, Vec<lan::LanProxy>) {
        let options = self.discovery_options();
        let own = self.url();
        let (backends, mut proxies) = tokio::join!(
            discovery::discover(&options),
            lan::browse(Duration::from_millis(1500))
        );
        proxies.retain(|p| !same_proxy(&p.url, &own));
        (backends, proxies)
    }

    fn spawn_worker_watcher(
        &self,
        report: Arc<WorkerReport>,
        proxy_url: String,
        name: String,
    ) -> JoinHandle<()> {
        let node = self.clone();
        let mut changes = report.subscribe();
        let mut managers = report.subscribe_lifecycle();
        tokio::spawn(async move {
            loop {
                let status = changes.borrow_and_update().clone();
                let manager = managers.borrow_and_update().clone();
                // Subscribed before reading, so a change in between wakes the next wait.
                let mut model_changes = manager.as_ref().map(|m| m.changes());
                let lifecycle = manager.map(|m| m.status()).unwrap_or_default();
                node.inner.info.send_modify(|info| {
                    info.worker = OwnWorker {
                        state: match status.state {
                            ConnectionState::Connecting => WorkerState::Connecting,
                            ConnectionState::Connected => WorkerState::Connected,
                            ConnectionState::Disconnected => WorkerState::Disconnected,
                        },
                        proxy_url: Some(proxy_url.clone()),
                        name: Some(name.clone()),
                        last_error: status.last_error.clone(),
                    };
                    info.lifecycle = lifecycle;
                });
                node.publish();
                let models_changed = async {
                    let changed = match &mut model_changes {
                        Some(changes) => changes.changed().await.is_ok(),
                        None => false,
                    };
                    if !changed {
                        // No manager, or one that is gone: only `managers` can tell more.
                        std::future::pending::<()>().await;
                    }
                };
                tokio::select! {
                    changed = changes.changed() => if changed.is_err() { return },
                    changed = managers.changed() => if changed.is_err() { return },
                    () = models_changed => {}
                }
            }
        })
    }

    /// Recomputes the dashboard's node info and the tray state from the roles and the worker.
    fn publish(&self) {
        let roles = self.roles();
        let has_worker = locked(&self.inner.worker).is_some();
        self.inner.info.send_modify(|info| {
            info.roles = roles;
            if !has_worker {
                info.worker = OwnWorker {
                    state: WorkerState::Off,
                    proxy_url: None,
                    name: None,
                    last_error: None,
                };
                info.lifecycle.clear();
            }
        });
        let info = self.inner.info.borrow().clone();
        let workers_connected = self.inner.hub.counts().0;
        let error = match info.worker.state {
            WorkerState::Disconnected => info
                .worker
                .last_error
                .clone()
                .map(|e| format!("worker cannot reach its proxy: {e}")),
            _ => None,
        };
        self.inner.state.send_if_modified(|state| {
            let next = NodeState {
                roles,
                worker: info.worker.state,
                workers_connected,
                error,
            };
            let changed = *state != next;
            if changed {
                if let (Some(message), true) = (&next.error, next.error != state.error) {
                    let _ = self.inner.events.send(NodeEvent::Error {
                        message: message.clone(),
                    });
                }
                *state = next;
            }
            changed
        });
    }

    fn update_announcement(&self, proxy_on: bool) {
        let mut announcement = locked(&self.inner.announcement);
        // Only a proxy others can reach is worth announcing.
        let wanted = proxy_on && !self.inner.addr.ip().is_loopback();
        match (wanted, announcement.is_some()) {
            (true, false) => {
                match lan::announce(
                    &lan::host_name(),
                    self.inner.addr.port(),
                    &self.inner.provider,
                    self.inner.fingerprint,
                ) {
                    Ok(handle) => *announcement = Some(handle),
                    Err(error) => {
                        tracing::warn!("cannot announce this proxy on the LAN: {error}")
                    }
                }
            }
            (false, true) => {
                if let Some(handle) = announcement.take() {
                    drop(handle);
                }
            }
            _ => {}
        }
    }

    /// Watches the hub for workers joining and leaving, and (while anyone listens for events)
    /// this machine for model servers appearing and going.
    fn spawn_watchers(&self) {
        let node = self.clone();
        let workers = tokio::spawn(async move {
            let mut known: Vec<(String, String)> = Vec::new();
            let mut version = u64::MAX;
            let mut tick = tokio::time::interval(WATCH_PERIOD);
            loop {
                tick.tick().await;
                let now = node.inner.hub.telemetry().version();
                if now == version {
                    continue;
                }
                version = now;
                let current: Vec<(String, String)> = node
                    .inner
                    .hub
                    .workers()
                    .into_iter()
                    .map(|w| (w.id, w.name))
                    .collect();
                for (id, name) in &current {
                    if !known.iter().any(|(k, _)| k == id) {
                        let host = node
                            .inner
                            .hub
                            .telemetry()
                            .worker(id)
                            .map(|r| r.host)
                            .unwrap_or_default();
                        let _ = node.inner.events.send(NodeEvent::WorkerJoined {
                            name: name.clone(),
                            host,
                        });
                    }
                }
                for (id, name) in &known {
                    if !current.iter().any(|(c, _)| c == id) {
                        let _ = node
                            .inner
                            .events
                            .send(NodeEvent::WorkerLeft { name: name.clone() });
                    }
                }
                known = current;
                node.publish();
            }
        });
        let node = self.clone();
        let backends = tokio::spawn(async move {
            let mut known: Option<Vec<DiscoveredBackend>> = None;
            let mut tick = tokio::time::interval(BACKEND_SCAN_PERIOD);
            loop {
                tick.tick().await;
                if node.inner.events.receiver_count() == 0 {
                    continue;
                }
                let found = discovery::discover(&node.discovery_options()).await;
                if let Some(before) = &known {
                    for backend in &found {
                        if !before.iter().any(|b| b.url == backend.url) {
                            let _ = node.inner.events.send(NodeEvent::BackendFound {
                                url: backend.url.clone(),
                                label: backend.kind.label().to_string(),
                            });
                        }
                    }
                    for backend in before {
                        if !found.iter().any(|b| b.url == backend.url) {
                            let _ = node.inner.events.send(NodeEvent::BackendLost {
                                url: backend.url.clone(),
                            });
                        }
                    }
                }
                known = Some(found);
            }
        });
        locked(&self.inner.background).extend([workers, backends]);
    }

    /// Stops the worker (it drains), then the proxy (it drains too).
    pub async fn shutdown(&self) {
        for task in locked(&self.inner.background).drain(..) {
            task.abort();
        }
        if let Some(announcement) = locked(&self.inner.announcement).take() {
            announcement.stop();
        }
        self.stop_worker().await;
        let proxy = locked(&self.inner.proxy).take();
        if let Some(proxy) = proxy {
            proxy.shutdown().await;
        }
    }
}

fn stop_in_background(worker: RunningWorker) {
    tokio::spawn(stop_and_wait(worker));
}

async fn stop_and_wait(worker: RunningWorker) {
    let _ = worker.stop.send(true);
    let _ = worker.task.await;
    worker.watcher.abort();
}

/// Loads the node's config file; a missing one is empty.
fn load(path: &std::path::Path) -> Result<FileConfig, AppError> {
    if path.exists() {
        Ok(config::load_file(Some(path))?)
    } else {
        Ok(FileConfig::default())
    }
}

/// Whether two proxy URLs name the same server (trailing slashes and `localhost` aside).
fn same_proxy(a: &str, b: &str) -> bool {
    let norm = |u: &str| {
        u.trim()
            .trim_end_matches('/')
            .replace("://localhost", "://127.0.0.1")
    };
    norm(a) == norm(b)
}

fn parse_ports(value: &str) -> Vec<u16> {
    value
        .split(',')
        .filter_map(|p| p.trim().parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_proxy_ignores_trailing_slashes_and_localhost() {
        assert!(same_proxy(
            "http://localhost:8080/",
            "http://127.0.0.1:8080"
        ));
        assert!(!same_proxy("http://10.0.0.2:8080", "http://127.0.0.1:8080"));
    }

    #[test]
    fn discovery_ports_parse_from_a_comma_list() {
        assert_eq!(parse_ports("1234, 8000,x,"), vec![1234, 8000]);
    }
}
