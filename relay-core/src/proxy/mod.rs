//! The central proxy: client routes, the worker WebSocket endpoint, queueing and dispatch.
//!
//! [`start`] binds nothing itself: it serves on a listener the caller bound, so tests use
//! `127.0.0.1:0` and the command can pick the next free port. [`RunningProxy::shutdown`] drains.

pub mod access;
pub mod dispatch;
pub mod edge;
pub mod observation;
pub mod serving;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch, Semaphore};
use tokio::task::JoinHandle;

use crate::settings::{defaults, ProxySettings};
use crate::store::usage::{UsageLog, UsageRetention};
use crate::store::{Database, DatabaseSetting, KeyStore};
use access::admin::{AdminAccess, AdminToken, TokenOrigin};
use access::client_keys::KeyLimits;
use access::credentials::{FailureLimiter, FailureLimits};
use dispatch::hub::{Hub, HubSettings};
use dispatch::scheduler::{ProviderLimits, Scheduler};
use dispatch::speed_store::MeasuredBoxes;
use dispatch::worker_socket::SocketSettings;
use observation::control::{NodeInfo, SharedNodeInfo};
use serving::aliases::{LiveAliases, ModelAliases};
use serving::responses_shared::SharedResponses;
use serving::responses_store::{ResponsesStore, StoreLimits};
use serving::upstream::{UpstreamConfig, Upstreams};

pub use crate::settings::ProviderConfig;

/// Everything the proxy needs to run.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// Providers in priority order; the first is the default for workers that name none.
    pub providers: Vec<ProviderConfig>,
    /// Largest accepted request body (413 beyond).
    pub max_body_bytes: usize,
    /// Open connections and the request-head deadline (see `serve.rs`).
    pub connections: edge::serve::ConnectionLimits,
    /// Largest streamed answer before it is ended with an SSE error.
    pub max_stream_bytes: u64,
    /// Stream bytes that may wait for a slow client, per request (then the stream ends).
    pub max_buffered_stream_bytes: usize,
    /// Worker connections accepted at once (503 beyond).
    pub max_workers: usize,
    /// Time a client has to send a request's body (408 beyond).
    pub body_read_timeout: Duration,
    /// Request body bytes held at once, being read, queued or on a worker (503 beyond).
    pub max_request_bytes_in_flight: usize,
    /// `/api/events` feeds open at once (503 beyond).
    pub max_event_subscribers: usize,
    /// Largest WebSocket message accepted from a worker.
    pub max_ws_message_bytes: usize,
    /// Largest frame a worker accepts: a request whose `request` frame would be larger is
    /// refused here (413) instead of costing the worker its connection.
    pub worker_frame_limit: usize,
    /// Ping period.
    pub heartbeat_interval: Duration,
    /// A worker silent this long is closed.
    pub heartbeat_timeout: Duration,
    /// A write to a worker that does not complete within this closes it (it stopped reading).
    pub worker_write_timeout: Duration,
    /// A new connection must `register` within this.
    pub register_timeout: Duration,
    /// On shutdown, in-flight requests get this long to finish.
    pub drain_timeout: Duration,
    /// Limits on failed worker authentication per IP.
    pub auth_failures: FailureLimits,
    /// Bounds of the Responses store behind `previous_response_id`.
    pub responses_store: StoreLimits,
    /// Client-facing model names mapped to served models.
    pub aliases: ModelAliases,
    /// HTTP APIs the proxy calls itself for models no worker serves.
    pub upstreams: Vec<UpstreamConfig>,
    /// The upstream that takes models nobody serves and requests whose queue is full.
    pub fallback_upstream: Option<String>,
    /// The token the control API requires (see `docs/admin-api.md`).
    pub admin_token: Option<AdminToken>,
    /// Where `admin_token` came from: configured (it then guards every control route, even on
    /// loopback) or generated and stored in a file (named in the errors that ask for it).
    pub admin_token_origin: TokenOrigin,
    /// Host names besides this machine's own that requests may carry (`allowed_hosts`).
    pub allowed_hosts: Vec<String>,
    /// Web origins allowed to call `/v1` cross-origin (`cors_origins`).
    pub cors_origins: Vec<String>,
    /// `/metrics` without the admin token even where the control API needs it
    /// (`metrics_public`).
    pub metrics_public: bool,
    /// The certificate to serve HTTPS with; plain HTTP when `None`.
    pub tls: Option<crate::tls::ServerTls>,
    /// Inference requests need a client API key (`require_api_keys`).
    pub require_api_keys: bool,
    /// A conversation's next turn prefers the worker that served it last (`affinity`).
    pub affinity: bool,
    /// Measured speeds may override the usual choice (`cost_routing`).
    pub cost_routing: bool,
    /// Where client API keys and usage are kept.
    pub database: DatabaseSetting,
    /// How much usage is kept.
    pub usage_retention: UsageRetention,
    /// How long and how many sleeping boxes are remembered, and how often one is sent a packet.
    pub sleepers: crate::settings::SleeperLimits,
    /// Where Wake-on-LAN packets go (`wake_target`): the broadcast address of the boxes' LAN.
    pub wake_target: SocketAddr,
}

impl ProxyConfig {
    /// Defaults with one provider `local` using `secret`.
    pub fn with_secret(secret: impl Into<String>) -> Self {
        ProxyConfig {
            providers: vec![ProviderConfig {
                name: defaults::PROVIDER.to_string(),
                secret: secret.into(),
                limits: ProviderLimits::default(),
                forward_client_auth: false,
            }],
            max_body_bytes: defaults::MAX_BODY_BYTES,
            connections: edge::serve::ConnectionLimits::default(),
            max_stream_bytes: defaults::MAX_STREAM_BYTES,
            max_buffered_stream_bytes: defaults::MAX_BUFFERED_STREAM_BYTES,
            max_workers: defaults::MAX_WORKERS,
            body_read_timeout: defaults::BODY_READ_TIMEOUT,
            max_request_bytes_in_flight: defaults::MAX_REQUEST_BYTES_IN_FLIGHT,
            max_event_subscribers: defaults::MAX_EVENT_SUBSCRIBERS,
            max_ws_message_bytes: crate::protocol::MAX_FRAME_BYTES,
            worker_frame_limit: crate::protocol::MAX_FRAME_BYTES,
            heartbeat_interval: defaults::HEARTBEAT_INTERVAL,
            heartbeat_timeout: defaults::HEARTBEAT_TIMEOUT,
            worker_write_timeout: defaults::HEARTBEAT_TIMEOUT,
            register_timeout: Duration::from_secs(10),
            drain_timeout: defaults::DRAIN_TIMEOUT,
            auth_failures: FailureLimits::default(),
            responses_store: StoreLimits::default(),
            aliases: ModelAliases::default(),
            upstreams: Vec::new(),
            fallback_upstream: None,
            admin_token: None,
            admin_token_origin: TokenOrigin::Configured,
            allowed_hosts: Vec::new(),
            cors_origins: Vec::new(),
            metrics_public: defaults::METRICS_PUBLIC,
            tls: None,
            require_api_keys: false,
            affinity: defaults::AFFINITY,
            cost_routing: defaults::COST_ROUTING,
            database: DatabaseSetting::Memory,
            usage_retention: UsageRetention::default(),
            sleepers: crate::settings::SleeperLimits::default(),
            wake_target: crate::wake::DEFAULT_WAKE_TARGET
                .parse()
                .expect("the default wake target parses"),
        }
    }

    /// The proxy `settings` describe, its default provider using `secret`. TLS is the caller's
    /// to load (`settings.tls` says what), as is a stored admin token when none is configured.
    pub fn from_settings(settings: ProxySettings, secret: String) -> Self {
        let default_provider = ProviderConfig {
            name: settings.provider,
            secret,
            limits: settings.limits,
            forward_client_auth: settings.forward_client_auth,
        };
        ProxyConfig {
            providers: std::iter::once(default_provider)
                .chain(settings.extra_providers)
                .collect(),
            max_body_bytes: settings.max_body_bytes,
            connections: settings.connections,
            max_workers: settings.max_workers,
            body_read_timeout: settings.body_read_timeout,
            max_request_bytes_in_flight: settings.max_request_bytes_in_flight,
            max_stream_bytes: settings.max_stream_bytes,
            max_buffered_stream_bytes: settings.max_buffered_stream_bytes,
            heartbeat_interval: settings.heartbeat_interval,
            heartbeat_timeout: settings.heartbeat_timeout,
            // A worker that cannot take a frame for as long as it may stay silent is gone.
            worker_write_timeout: settings.heartbeat_timeout,
            drain_timeout: settings.drain_timeout,
            responses_store: settings.responses_store,
            aliases: ModelAliases::new(settings.aliases, settings.default_model),
            upstreams: settings.upstreams,
            fallback_upstream: settings.fallback_upstream,
            admin_token: settings.admin_token.map(AdminToken),
            allowed_hosts: settings.allowed_hosts,
            cors_origins: settings.cors_origins,
            require_api_keys: settings.require_api_keys,
            affinity: settings.affinity,
            cost_routing: settings.cost_routing,
            database: match settings.database_url {
                Some(url) => DatabaseSetting::Postgres(url),
                None => {
                    DatabaseSetting::Sqlite(crate::paths::database_path(&crate::paths::data_dir()))
                }
            },
            metrics_public: settings.metrics_public,
            sleepers: settings.sleepers,
            wake_target: settings.wake_target,
            ..ProxyConfig::with_secret(String::new())
        }
    }
}

/// State shared by every route, behind one `Arc`: axum hands every handler and middleware its
/// own clone of the router state, and a clone of the struct itself (some twenty `Arc`s) cost
/// 2.7% of the proxy's CPU per request in the round-2 profile (BENCHMARKS.md).
pub type AppState = Arc<ProxyState>;

/// What [`AppState`] points at.
pub struct ProxyState {
    /// Routing state.
    pub hub: Arc<Hub>,
    /// Configuration.
    pub config: Arc<ProxyConfig>,
    /// Failed credential checks of every kind (worker secrets, admin tokens, client keys).
    pub limiter: Arc<FailureLimiter>,
    /// Per-connection worker settings.
    pub socket_settings: SocketSettings,
    /// Finished OpenAI Responses, for `previous_response_id` and `GET /v1/responses/{id}`.
    pub responses: Arc<ResponsesStore>,
    /// Their copy in a database other proxies share (PostgreSQL only).
    pub shared_responses: Option<SharedResponses>,
    /// Upstream providers.
    pub upstreams: Arc<Upstreams>,
    /// What the embedding node reports about itself, for the dashboard.
    pub node: SharedNodeInfo,
    /// Turns true when the proxy starts shutting down, so long-lived streams that are not
    /// requests (the dashboard's live feed) end instead of holding up the graceful stop.
    pub closing: Arc<watch::Sender<bool>>,
    /// `[proxy.aliases]` and `default_model` as they apply now (settings change them live).
    pub aliases: Arc<LiveAliases>,
    /// Where model names go now (aliases, Claude Code's names).
    pub names: serving::claude_code::NameRoutes,
    /// Who may use the control API.
    pub admin: AdminAccess,
    /// One permit per worker connection ([`ProxyConfig::max_workers`]).
    pub worker_slots: Arc<Semaphore>,
    /// One permit per open `/api/events` feed ([`ProxyConfig::max_event_subscribers`]).
    pub event_slots: Arc<Semaphore>,
    /// One permit per request body byte held ([`ProxyConfig::max_request_bytes_in_flight`]).
    pub request_bytes: Arc<Semaphore>,
    /// Client API keys.
    pub keys: Arc<KeyStore>,
    /// What each key has used of its limits.
    pub key_limits: Arc<KeyLimits>,
    /// Where finished requests are accounted.
    pub usage: UsageLog,
}

/// A proxy serving in the background.
pub struct RunningProxy {
    /// Where it listens.
    pub addr: SocketAddr,
    scheme: &'static str,
    /// Its routing state.
    pub hub: Arc<Hub>,
    /// What the dashboard shows about the node; the embedding node keeps it current.
    pub node: SharedNodeInfo,
    closing: Arc<watch::Sender<bool>>,
    /// The model aliases in force: replace them to change `[proxy.aliases]` live.
    pub aliases: Arc<LiveAliases>,
    /// Where model names go now (the tray's "Claude Code uses" line).
    pub names: serving::claude_code::NameRoutes,
    usage: UsageLog,
    measured: MeasuredBoxes,
    /// Who may use the control API (and `/metrics`).
    pub admin: AdminAccess,
    drain_timeout: Duration,
    stop: oneshot::Sender<()>,
    task: JoinHandle<std::io::Result<()>>,
}

/// A proxy's router with the state the embedder keeps.
pub struct Built {
    /// Every route: client, worker, control API and UI.
    pub app: axum::Router,
    /// Its routing state.
    pub hub: Arc<Hub>,
    /// Node information shown on the dashboard.
    pub node: SharedNodeInfo,
    /// Set to true on shutdown: ends the dashboard's live feeds.
    pub closing: Arc<watch::Sender<bool>>,
    /// The model aliases in force, replaceable while the proxy runs.
    pub aliases: Arc<LiveAliases>,
    /// Where model names go now.
    pub names: serving::claude_code::NameRoutes,
    /// Where finished requests are accounted (flushed on shutdown).
    pub usage: UsageLog,
    /// What was measured of each box, kept in the store (flushed on shutdown).
    pub measured: MeasuredBoxes,
    /// Who may use the control API (and `/metrics`).
    pub admin: AdminAccess,
}

/// Opens the database `config` names (creating and migrating it), its keys and its usage log.
async fn open_store(
    config: &ProxyConfig,
) -> std::io::Result<(Arc<KeyStore>, UsageLog, Option<SharedResponses>, Database)> {
    let failed = |e: crate::store::DbError| {
        std::io::Error::other(format!(
            "the proxy's database ({}): {e}",
            config.database.describe()
        ))
    };
    let db = match Database::open(&config.database).await {
        Ok(db) => db,
        Err(error) => open_unwritable(config, error).await?,
    };
    let keys = KeyStore::open(db.clone()).await.map_err(failed)?;
    let shared_responses = SharedResponses::for_database(
        &db,
        config.responses_store.ttl,
        config.responses_store.max_entries,
    );
    let usage = UsageLog::start(db.clone(), Some(Arc::clone(&keys)), config.usage_retention);
    tracing::info!(database = %config.database.describe(), "keys and usage kept in");
    Ok((keys, usage, shared_responses, db))
}

/// The database when it cannot be opened for writing (`error`): a SQLite file that can still be
/// read is used read-only (its keys keep guarding the relay); with none, a relay that requires
/// client keys refuses to start (fail closed: no key could be checked), and one that does not
/// serves with an empty store in memory. Either way the dashboard and the log say so.
async fn open_unwritable(
    config: &ProxyConfig,
    error: crate::store::DbError,
) -> std::io::Result<Database> {
    let from_a_newer_release = error.0.contains("newer than this ModelRelay knows");
    let (DatabaseSetting::Sqlite(path), false) = (&config.database, from_a_newer_release) else {
        return Err(std::io::Error::other(format!(
            "the proxy's database ({}): {error}",
            config.database.describe()
        )));
    };
    // SQLite says "unable to open database file" whatever the cause: the directory says more.
    let cause = path
        .parent()
        .and_then(cannot_write_in)
        .map_or_else(|| error.0.clone(), |e| e.to_string());
    let why = format!(
        "{} ({}: {cause})",
        crate::store::health::explain(&cause),
        path.display()
    );
    let read = match Database::open_read_only(path, why.clone()).await {
        Ok(db) => db.check_schema_is_current().await.map(|()| db),
        Err(unreadable) => Err(unreadable),
    };
    match read {
        Ok(db) => Ok(db),
        Err(unreadable) if config.require_api_keys => Err(std::io::Error::other(format!(
            "client API keys are required, but the proxy cannot read its key store {}: {error}; \
             reading it failed too ({unreadable}). Not starting, so that no request goes \
             unchecked: make the data directory readable and writable (or free space on its \
             disk), or set --data-dir to one that is",
            path.display()
        ))),
        Err(unreadable) => {
            let why = format!(
                "{why}; it could not be read either ({unreadable}), so keys and usage are kept \
                 in memory until the relay restarts"
            );
            Database::stand_in(why)
                .await
                .map_err(|e| std::io::Error::other(e.to_string()))
        }
    }
}

/// Why nothing can be written in `dir` (read-only, full, not permitted), if so: found by
/// writing a small file there and removing it.
fn cannot_write_in(dir: &std::path::Path) -> Option<std::io::Error> {
    let probe = dir.join(format!(".modelrelay-write-probe-{}", std::process::id()));
    let written = std::fs::write(&probe, b"probe");
    let _ = std::fs::remove_file(&probe);
    written.err()
}

/// Builds the router for `config` serving at `addr`, with `extra` routes (the node's settings
/// and setup API) merged in; opens the proxy's database first. `extra` is given the proxy's
/// access rule, so the node's routes guard with the same one (and their token refusals count in
/// the same `/metrics` counter).
pub async fn router(
    config: ProxyConfig,
    addr: SocketAddr,
    extra: impl FnOnce(&AdminAccess) -> axum::Router,
) -> std::io::Result<Built> {
    let (keys, usage, shared_responses, db) = open_store(&config).await?;
    let mut scheduler = Scheduler::new(
        config
            .providers
            .iter()
            .map(|p| (p.name.clone(), p.limits.clone()))
            .collect(),
    );
    scheduler.set_cost_routing(config.cost_routing);
    let hub = Hub::new(
        scheduler,
        HubSettings {
            drain_timeout: config.drain_timeout,
            client_auth_providers: config
                .providers
                .iter()
                .filter(|p| p.forward_client_auth)
                .map(|p| p.name.clone())
                .collect(),
            sleepers: config.sleepers,
            wake_target: config.wake_target,
        },
    );
    dispatch::sleeper_store::restore_and_keep(&hub, db.clone()).await;
    let measured = dispatch::speed_store::restore_and_keep(&hub, db).await;
    // One limiter for every credential check: worker secrets, admin tokens, client keys.
    let limiter = Arc::new(FailureLimiter::new(config.auth_failures.clone()));
    let admin = AdminAccess::new(
        config.admin_token.clone(),
        config.admin_token_origin.clone(),
        addr.ip().is_loopback(),
    )
    .with_sessions(addr.port(), config.tls.is_some())
    .with_limiter(Arc::clone(&limiter));
    let site = edge::guard::SiteGuard::new(
        addr.ip().is_loopback(),
        &edge::guard::SiteGuard::machine_names(),
        &config.allowed_hosts,
        &config.cors_origins,
    );
    let mut info = NodeInfo::proxy_only(addr);
    if config.tls.is_some() {
        info.url = format!("https://{addr}");
    }
    let node: SharedNodeInfo = Arc::new(watch::Sender::new(info));
    let closing = Arc::new(watch::Sender::new(false));
    let aliases = Arc::new(LiveAliases::new(config.aliases.clone()));
    let worker_slots = Arc::new(Semaphore::new(config.max_workers));
    let event_slots = Arc::new(Semaphore::new(config.max_event_subscribers));
    let request_bytes = Arc::new(Semaphore::new(
        config
            .max_request_bytes_in_flight
            .min(Semaphore::MAX_PERMITS),
    ));
    let upstreams = Arc::new(Upstreams::new(
        config.upstreams.clone(),
        config.fallback_upstream.as_deref(),
        config.providers[0].limits.request_timeout,
        config.max_stream_bytes,
    ));
    let names =
        serving::claude_code::NameRoutes::new(hub.clone(), aliases.clone(), upstreams.clone());
    let state: AppState = Arc::new(ProxyState {
        hub: hub.clone(),
        limiter: Arc::clone(&limiter),
        socket_settings: SocketSettings {
            heartbeat_interval: config.heartbeat_interval,
            heartbeat_timeout: config.heartbeat_timeout,
            register_timeout: config.register_timeout,
            max_stream_bytes: config.max_stream_bytes,
            max_buffered_stream_bytes: config.max_buffered_stream_bytes,
            write_timeout: config.worker_write_timeout,
        },
        responses: Arc::new(ResponsesStore::new(config.responses_store)),
        shared_responses,
        upstreams: Arc::clone(&upstreams),
        config: Arc::new(config),
        node: node.clone(),
        closing: closing.clone(),
        aliases: aliases.clone(),
        names: names.clone(),
        admin: admin.clone(),
        worker_slots,
        event_slots,
        request_bytes,
        keys,
        key_limits: Arc::new(KeyLimits::default()),
        usage: usage.clone(),
    });
    hub.telemetry().account_usage_in(usage.clone());
    let extra = extra(&admin);
    let app = serving::routes::client_routes()
        .route_layer(axum::middleware::from_fn_with_state(
            access::client_keys::KeyGate {
                keys: Arc::clone(&state.keys),
                required: state.config.require_api_keys,
                telemetry: Arc::clone(state.hub.telemetry()),
                limiter: Arc::clone(&state.limiter),
            },
            access::client_keys::identify,
        ))
        .merge(serving::routes::routes())
        .merge(access::worker_connect::routes())
        .merge(observation::pages::routes())
        .merge(observation::admin::admin_routes(state.clone()))
        .merge(observation::control::routes(admin.clone()))
        .merge(access::sign_in::open_routes())
        .with_state(state)
        .merge(extra)
        .layer(site);
    Ok(Built {
        app,
        hub,
        node,
        closing,
        aliases,
        names,
        usage,
        measured,
        admin,
    })
}

/// Serves the proxy on `listener` until [`RunningProxy::shutdown`].
pub async fn start(config: ProxyConfig, listener: TcpListener) -> std::io::Result<RunningProxy> {
    start_with(config, listener, |_| axum::Router::new()).await
}

/// [`start`] with `extra` routes merged in (see [`router`]).
pub async fn start_with(
    config: ProxyConfig,
    listener: TcpListener,
    extra: impl FnOnce(&AdminAccess) -> axum::Router,
) -> std::io::Result<RunningProxy> {
    let addr = listener.local_addr()?;
    let drain_timeout = config.drain_timeout;
    let tls = config.tls.as_ref().map(|tls| tls.acceptor().clone());
    let connections = config.connections;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let Built {
        app,
        hub,
        node,
        closing,
        aliases,
        names,
        usage,
        measured,
        admin,
    } = router(config, addr, extra).await?;
    observation::control::spawn_sampler(&hub);
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(edge::serve::serve(listener, app, tls, connections, async {
        let _ = stopped.await;
    }));
    Ok(RunningProxy {
        addr,
        scheme,
        hub,
        node,
        closing,
        aliases,
        names,
        usage,
        measured,
        admin,
        drain_timeout,
        stop,
        task,
    })
}

impl RunningProxy {
    /// The base URL clients use.
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    /// Graceful drain: refuse new work, tell workers `graceful_shutdown`, let in-flight requests
    /// finish up to the drain timeout, then close every worker and stop serving.
    pub async fn shutdown(self) {
        let in_flight = self.hub.begin_shutdown("proxy shutting down");
        tracing::info!(in_flight, drain_timeout = ?self.drain_timeout, "draining in-flight requests");
        self.closing.send_replace(true);
        let _ = self.stop.send(());
        let deadline = tokio::time::Instant::now() + self.drain_timeout;
        // Shutdown is rare and not on any request's path; a light poll keeps the hub simple.
        while self.hub.in_flight() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let left = self.hub.in_flight();
        if left > 0 {
            tracing::warn!(left, "drain timeout: ending requests still in flight");
        }
        self.hub.close_all_workers("proxy shutting down");
        // What the last requests used is stored before the process may exit.
        self.usage.flush().await;
        // And what was measured of the boxes since the last write (the workers closed above
        // are remembered by then).
        self.measured.flush().await;
        let mut task = self.task;
        if tokio::time::timeout(Duration::from_secs(5), &mut task)
            .await
            .is_err()
        {
            task.abort();
        }
        tracing::info!("proxy stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_never_shows_worker_secrets() {
        let config = ProxyConfig::with_secret("very-secret-value");
        let shown = format!("{config:?}");
        assert!(!shown.contains("very-secret-value"), "{shown}");
        assert!(shown.contains("<redacted>"));
    }
}
