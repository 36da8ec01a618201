//! A node: the relay as one process runs it — a proxy (with the dashboard and its API) and/or a
//! worker, switched on and off live. `modelrelay` and the desktop app both run one.
//!
//! The HTTP listener always runs, so the dashboard is reachable whatever the roles are; with the
//! proxy role off, client and worker routes answer 503 and the node only runs its worker.

pub mod api;
pub mod guarded;
pub mod join_code;
mod saving;
pub mod start_on_login;
mod watchers;
mod worker_role;

pub use saving::Caller;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;

use crate::dialect::ApiError;
use crate::lan;
use crate::proxy::access::admin::{AdminAccess, AdminToken, TokenOrigin};
use crate::proxy::dispatch::hub::Hub;
use crate::proxy::observation::control::SharedNodeInfo;
use crate::proxy::serving::aliases::LiveAliases;
use crate::proxy::{self, RunningProxy};
use crate::settings::{self, FileConfig, Overrides, ProxySettings};
use crate::worker::report::WorkerReport;
use worker_role::RunningWorker;

pub use crate::proxy::observation::control::{OwnWorkerState as WorkerState, Roles};

/// How to start a node.
#[derive(Debug, Clone, Default)]
pub struct NodeOptions {
    /// The config file settings are read from and saved to; the OS config directory's
    /// `modelrelay/config.toml` when `None`.
    pub config_path: Option<PathBuf>,
    /// Flags and environment (they win over the file).
    pub overrides: Overrides,
    /// Roles to run, overriding the file's `[roles]` (e.g. `modelrelay serve`).
    pub roles: Option<Roles>,
    /// Where the worker keeps its model servers' pid files; the data directory when `None`.
    pub data_dir: Option<PathBuf>,
    /// The embedding program's start-on-login entry, served to the dashboard (the desktop
    /// app's); `None` elsewhere.
    pub start_on_login: Option<start_on_login::StartOnLogin>,
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
    /// This box's CPU, memory and GPUs, while the node's worker samples them.
    pub hardware: Option<crate::protocol::HardwareReport>,
    /// The model Claude Code's conversation goes to on this node's proxy, when one would answer.
    pub claude_code_model: Option<String>,
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
    /// The settings are not valid (they were read or saved).
    #[error(transparent)]
    Config(#[from] crate::settings::ConfigError),
    /// The listen address could not be used.
    #[error(transparent)]
    Listen(#[from] crate::listen::ListenError),
    /// A secret could not be stored or read.
    #[error(transparent)]
    Secret(#[from] crate::paths::SecretError),
    /// The proxy's TLS certificate could not be loaded or generated.
    #[error(transparent)]
    Tls(#[from] crate::tls::server::TlsError),
    /// The proxy could not start on its listener (its database, most likely).
    #[error("the proxy could not start: {reason}")]
    ProxyStart {
        /// Why, and what to do.
        reason: String,
    },
    /// The worker role has no secret to present.
    #[error("no worker secret: pass --worker-secret (or set WORKER_SECRET) to the secret the proxy printed when it started")]
    MissingSecret,
    /// The change needs the admin token, and the request did not carry it; nothing was saved.
    #[error("{}", .0.message)]
    Forbidden(ApiError),
}

/// A running node; cheap to clone.
#[derive(Clone)]
pub struct Node {
    inner: Arc<Inner>,
}

struct Inner {
    config_path: PathBuf,
    overrides: Overrides,
    data_dir: Option<PathBuf>,
    addr: SocketAddr,
    /// The certificate's fingerprint when the proxy serves TLS (then the node's URL is https).
    fingerprint: Option<crate::fingerprint::Fingerprint>,
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
    start_on_login: Option<start_on_login::StartOnLogin>,
}

/// The data directory a node was given, or the default one.
fn options_data_dir(given: &Option<PathBuf>) -> PathBuf {
    given.clone().unwrap_or_else(crate::paths::data_dir)
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl Node {
    /// Binds, starts the proxy (dashboard, API and client routes) and the worker if its role is
    /// on.
    pub async fn start(options: NodeOptions) -> Result<Node, NodeError> {
        let config_path = options
            .config_path
            .clone()
            .or_else(settings::default_config_path)
            .unwrap_or_else(|| PathBuf::from("modelrelay.toml"));
        let file = load(&config_path)?;
        let roles = options.roles.unwrap_or(Roles {
            proxy: file.roles.proxy.unwrap_or(true),
            worker: file.roles.worker.unwrap_or(true),
        });
        let proxy_settings = ProxySettings::resolve(&file, &options.overrides)?;
        let address = proxy_settings.listen.clone();
        let listener = crate::listen::bind(&address, proxy_settings.listen_explicit).await?;
        let addr = listener
            .local_addr()
            .map_err(|e| crate::listen::ListenError {
                address: address.clone(),
                reason: e.to_string(),
            })?;
        let secret = crate::paths::proxy_secret(proxy_settings.worker_secret.as_ref())?;
        let tls_setting = proxy_settings.tls.clone();
        let mut proxy_config = proxy::ProxyConfig::from_settings(proxy_settings, secret.clone());
        proxy_config.tls = crate::tls::ServerTls::for_setting(
            &tls_setting,
            &options
                .data_dir
                .clone()
                .unwrap_or_else(crate::paths::data_dir),
            &crate::tls::server::self_signed_names(&lan::host_name(), addr.ip()),
        )?;
        let fingerprint = proxy_config.tls.as_ref().map(|tls| tls.fingerprint());
        // The SQLite file of keys and usage lives in this node's data directory too.
        if let (crate::store::DatabaseSetting::Sqlite(_), Some(dir)) =
            (&proxy_config.database, &options.data_dir)
        {
            proxy_config.database =
                crate::store::DatabaseSetting::Sqlite(crate::paths::database_path(dir));
        }
        // Every node has a token: on loopback it guards only the changes that run programs or
        // send secrets elsewhere, beyond loopback (or when configured) every control route.
        if proxy_config.admin_token.is_none() {
            let dir = options
                .data_dir
                .clone()
                .unwrap_or_else(crate::paths::data_dir);
            proxy_config.admin_token = Some(AdminToken(crate::paths::admin_token(&dir)?));
            proxy_config.admin_token_origin =
                TokenOrigin::Stored(crate::paths::admin_token_path(&dir));
        }
        let admin_token = proxy_config.admin_token.as_ref().map(|t| t.0.clone());
        let provider = proxy_config.providers[0].name.clone();
        let slot = api::NodeSlot::default();
        let running = proxy::start_with(proxy_config, listener, |access| {
            api::routes(slot.clone(), access.clone())
        })
        .await
        .map_err(|e| NodeError::ProxyStart {
            reason: e.to_string(),
        })?;
        // The proxy's own rule: one token check, one failure count for every control route.
        let access: AdminAccess = running.admin.clone();
        let node = Node {
            inner: Arc::new(Inner {
                config_path,
                overrides: options.overrides,
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
                    hardware: None,
                    claude_code_model: None,
                }),
                events: broadcast::channel(64).0,
                restart_required: Mutex::new(Vec::new()),
                announcement: Mutex::new(None),
                background: Mutex::new(Vec::new()),
                start_on_login: options.start_on_login.clone(),
            }),
        };
        slot.set(&node);
        crate::open_dashboard::remember_url(
            &options_data_dir(&node.inner.data_dir),
            &node.local_url(),
        );
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

    /// The URL a browser on this machine opens the dashboard at: [`Node::url`], with a
    /// wildcard listen address replaced by loopback (browsers refuse `0.0.0.0`).
    pub fn local_url(&self) -> String {
        let mut addr = self.inner.addr;
        if addr.ip().is_unspecified() {
            addr.set_ip(match addr.ip() {
                std::net::IpAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                std::net::IpAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        let scheme = if self.inner.fingerprint.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{addr}")
    }

    /// A new one-time link that signs a browser on this machine in to the dashboard, valid for
    /// `lifetime` (the start-up banner's, the tray's *Open dashboard*); `None` without an admin
    /// token.
    pub fn login_link(&self, lifetime: std::time::Duration) -> Option<String> {
        let sessions = self.inner.access.sessions()?;
        Some(format!(
            "{}{}",
            self.local_url(),
            crate::proxy::access::sign_in::link_path(sessions, lifetime)
        ))
    }

    /// The URLs other machines can join this node's proxy at, best first (never a wildcard
    /// address): what the join code, the Setup page and the start-up banner name.
    pub fn join_urls(&self) -> Vec<String> {
        crate::lan::reachable_urls(self.inner.addr, self.inner.fingerprint.is_some())
    }

    /// The SHA-256 fingerprint of the certificate the proxy serves, when it serves TLS.
    pub fn fingerprint(&self) -> Option<crate::fingerprint::Fingerprint> {
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

/// Loads the node's config file; a missing one is empty.
fn load(path: &std::path::Path) -> Result<FileConfig, NodeError> {
    if path.exists() {
        Ok(settings::load_file(Some(path))?)
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
}
