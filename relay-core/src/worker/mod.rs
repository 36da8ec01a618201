//! The worker daemon: connects out to a proxy, registers its models, forwards requests to local
//! backends, and reconnects with exponential backoff when the connection ends.

pub mod catalog;
pub mod clocked;
pub mod follow;
pub mod managed;
pub mod report;
pub mod resting;
pub mod session;
pub mod slot_pins;
pub mod warm_up;
pub mod wire;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio::sync::watch;

use crate::backend::http::{HttpClient, LocalClient};
use crate::backend::{Backend, BackendRequest, Capabilities, NativeOverrides, Speaks};
use crate::discovery::DiscoveryOptions;
use crate::hardware::{Latest, Sampler, SamplerSettings};
use crate::lifecycle::{LifecycleConfig, LifecycleManager};
use crate::protocol::{RequestMessage, BRIDGE_PROTOCOL_VERSION};
use crate::settings::{defaults, WorkerSettings};
use report::{ConnectionState, WorkerReport};
use session::SessionEnd;
use slot_pins::{SlotLease, SlotPins};

/// Where a worker's backends come from.
#[derive(Debug, Clone)]
pub enum Backends {
    /// These base URLs (`BACKEND_URL`).
    Fixed(Vec<String>),
    /// Whatever discovery finds on this machine, looked for again at each model refresh.
    Discover(DiscoveryOptions),
}

/// Everything a worker needs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The proxy's base URL (`http://` or `https://`).
    pub proxy_url: String,
    /// The proxy's certificate fingerprint: with one, the worker connects over `wss://` and
    /// trusts that certificate only (no CA, no host name check); without, `https://` proxies are
    /// checked against the public CAs and `http://` ones are plain.
    pub proxy_fingerprint: Option<crate::fingerprint::Fingerprint>,
    /// The provider's worker secret.
    pub secret: String,
    /// The provider to join.
    pub provider: String,
    /// This worker's name.
    pub name: String,
    /// Backends to forward to.
    pub backends: Backends,
    /// Models to advertise; `None` asks the backends.
    pub models: Option<Vec<String>>,
    /// Requests run at once; more are refused with a retryable error.
    pub max_concurrent: u32,
    /// Whether clients' `Authorization` and `x-api-key` reach the backends.
    pub forward_client_auth: bool,
    /// Backend routes forwarded besides the inference routes (the owner's `extra_routes`).
    pub extra_routes: Vec<String>,
    /// Sent in `register`; `None` sends none (legacy).
    pub protocol_version: Option<String>,
    /// How often the backends' model lists are re-read.
    pub model_refresh_interval: Duration,
    /// How often backends that unload models by themselves are asked which they have unloaded
    /// ([`resting`]).
    pub unload_poll_interval: Duration,
    /// On shutdown, in-flight requests get this long to finish.
    pub drain_timeout: Duration,
    /// Hearing nothing from the proxy this long ends the connection (then it reconnects).
    pub proxy_silence_timeout: Duration,
    /// First reconnect delay.
    pub reconnect_min: Duration,
    /// Longest reconnect delay.
    pub reconnect_max: Duration,
    /// The model map and lifecycle settings: models this worker starts on demand. `None`
    /// without a model map.
    pub lifecycle: Option<LifecycleConfig>,
    /// Where the worker keeps state; the model servers' pid files go to `lifecycle/pids/`.
    pub data_dir: PathBuf,
    /// Whether backends serve `/v1/messages` and `/v1/responses` themselves; unset routes are
    /// probed (see [`Capabilities`]).
    pub native_routes: NativeOverrides,
    /// How the box's CPU, memory and GPUs are sampled for the proxy's dashboard and the VRAM
    /// check before a model starts; `None` samples nothing.
    pub hardware: Option<SamplerSettings>,
    /// This box's network card, announced so the proxy can wake it (Wake-on-LAN).
    pub mac_address: Option<crate::wake::MacAddress>,
    /// The box suspends itself when idle: announced, so the proxy takes its leaving for sleep.
    pub sleeps_when_idle: bool,
    /// Keep each conversation in one llama-server slot ([`slot_pins`]).
    pub slot_hints: bool,
    /// The context window reported for models whose backend does not say its own.
    pub context_window: Option<u32>,
    /// Where the Wake-on-LAN packets go that the proxy asks this worker to send for sleeping
    /// boxes on its LAN.
    pub wake_target: std::net::SocketAddr,
}

impl WorkerConfig {
    /// A worker joining `proxy_url` with `secret`, forwarding to `backend_url`, asking the backend
    /// for its models; every other setting at its default.
    pub fn new(proxy_url: &str, secret: &str, backend_url: &str) -> Self {
        WorkerConfig {
            proxy_url: proxy_url.to_string(),
            proxy_fingerprint: None,
            secret: secret.to_string(),
            provider: defaults::PROVIDER.to_string(),
            name: defaults::WORKER_NAME.to_string(),
            backends: Backends::Fixed(vec![backend_url.to_string()]),
            models: None,
            max_concurrent: defaults::MAX_CONCURRENCY,
            forward_client_auth: false,
            extra_routes: Vec::new(),
            protocol_version: Some(BRIDGE_PROTOCOL_VERSION.to_string()),
            model_refresh_interval: defaults::MODEL_REFRESH,
            unload_poll_interval: resting::POLL_EVERY,
            drain_timeout: defaults::DRAIN_TIMEOUT,
            proxy_silence_timeout: defaults::PROXY_SILENCE_TIMEOUT,
            reconnect_min: defaults::RECONNECT_MIN,
            reconnect_max: defaults::RECONNECT_MAX,
            lifecycle: None,
            data_dir: crate::paths::data_dir(),
            native_routes: NativeOverrides::default(),
            hardware: Some(SamplerSettings::default()),
            mac_address: None,
            sleeps_when_idle: false,
            context_window: None,
            slot_hints: defaults::SLOT_HINTS,
            wake_target: crate::wake::DEFAULT_WAKE_TARGET
                .parse()
                .expect("the default wake target parses"),
        }
    }

    /// The worker `settings` describe, joining `proxy_url` with `secret`. Backends are the
    /// configured ones; without any, `discover` when given (a node's zero-configuration worker),
    /// else none for a worker with a model map (it starts its own servers), else
    /// [`defaults::BACKEND_URL`].
    pub fn from_settings(
        settings: WorkerSettings,
        proxy_url: String,
        secret: String,
        discover: Option<DiscoveryOptions>,
    ) -> Self {
        let backends = match (settings.backend_urls, discover) {
            (Some(urls), _) => Backends::Fixed(urls),
            (None, Some(mut options)) => {
                options.confirmed = settings.confirmed_backends;
                Backends::Discover(options)
            }
            (None, None) if settings.lifecycle.is_some() => Backends::Fixed(Vec::new()),
            (None, None) => Backends::Fixed(vec![defaults::BACKEND_URL.to_string()]),
        };
        WorkerConfig {
            proxy_url,
            proxy_fingerprint: settings.proxy_fingerprint,
            secret,
            provider: settings.provider,
            name: settings.name,
            backends,
            models: settings.models,
            max_concurrent: settings.max_concurrent,
            forward_client_auth: settings.forward_client_auth,
            extra_routes: settings.extra_routes,
            protocol_version: settings.protocol_version,
            model_refresh_interval: settings.model_refresh_interval,
            unload_poll_interval: resting::POLL_EVERY,
            drain_timeout: settings.drain_timeout,
            proxy_silence_timeout: settings.proxy_silence_timeout,
            reconnect_min: defaults::RECONNECT_MIN,
            reconnect_max: defaults::RECONNECT_MAX,
            lifecycle: settings.lifecycle,
            data_dir: crate::paths::data_dir(),
            native_routes: settings.native_routes,
            hardware: Some(SamplerSettings::default()),
            mac_address: settings.mac_address.or_else(crate::wake::local_mac),
            sleeps_when_idle: settings.sleeps_when_idle,
            context_window: settings.context_window,
            slot_hints: settings.slot_hints,
            wake_target: settings.wake_target,
        }
    }
}

/// Runs the worker until `shutdown` turns true; then it stops taking work, finishes what is in
/// flight (up to the drain timeout), stops the model servers it started and returns. It also
/// returns, without reconnecting, once its proxy drained it (`graceful_shutdown`): the report's
/// state is then [`ConnectionState::Drained`].
/// Its connection state and lifecycle manager go to `report`, for its embedder.
pub async fn run(
    config: WorkerConfig,
    report: Arc<WorkerReport>,
    mut shutdown: watch::Receiver<bool>,
) {
    let access = BackendAccess::new(&config);
    // For the worker's whole life, across reconnects; asks nothing until a catalog names a
    // backend to watch.
    let polling =
        (access.resting).start_polling(access.client.clone(), config.unload_poll_interval);
    // One manager for the worker's whole life: a reconnect to the proxy must not restart models.
    let lifecycle = start_lifecycle(&config).await;
    report.set_lifecycle(lifecycle.clone());
    // Off the request path: a task of its own, stopped when `sampler` drops at the end.
    let sampler = config.hardware.clone().map(Sampler::start);
    let hardware = sampler.as_ref().map(Sampler::latest);
    report.set_hardware(hardware.clone());
    if let (Some(manager), Some(latest)) = (&lifecycle, &hardware) {
        manager.set_free_vram(crate::hardware::free_vram_source(latest.clone()));
    }
    let sleep = tokio::sync::Notify::new();
    let running = Running {
        config: &config,
        proxy_url: &config.proxy_url,
        access: &access,
        report: &report,
        lifecycle: lifecycle.as_ref(),
        hardware: hardware.as_ref(),
        sleep: &sleep,
    };
    tokio::select! {
        _ = serve_until_shutdown(running, &mut shutdown) => {}
        _ = sleep_signals(&sleep) => {}
    }
    report.set_lifecycle(None);
    report.set_hardware(None);
    drop(sampler);
    drop(polling);
    if let Some(manager) = lifecycle {
        // The servers run in process groups of their own: nothing else would stop them.
        tracing::info!("stopping model servers");
        manager.shutdown().await;
        tracing::info!("model servers stopped");
    }
}

/// The lifecycle manager for the model map, after killing the servers a previous run of this
/// worker left behind. `None` without a model map, or when its data directory is unusable (then
/// the mapped models are not advertised, and the log says why).
async fn start_lifecycle(config: &WorkerConfig) -> Option<LifecycleManager> {
    let lifecycle = config.lifecycle.clone()?;
    let dir = config.data_dir.join("lifecycle");
    let manager = match LifecycleManager::new(lifecycle, &dir) {
        Ok(manager) => manager,
        Err(error) => {
            tracing::error!(
                dir = %dir.display(),
                "cannot use the lifecycle data directory: {error}; the model map is not served"
            );
            return None;
        }
    };
    // Before serving, so the survivors' ports are free again; the manager logs what it killed.
    let report = manager.cleanup_orphans().await;
    if report.stale > 0 {
        tracing::info!(
            stale = report.stale,
            "removed pid files of processes already gone"
        );
    }
    tracing::info!(models = ?manager.models(), "model map: these models start on demand");
    Some(manager)
}

/// How long a worker that said it is going to sleep waits before reconnecting. Tokio's clock
/// stops while the machine is suspended, so after a real suspend the pause ends only after the
/// resume; a suspend that was cancelled costs this much absence.
pub const SLEEP_PAUSE: Duration = Duration::from_secs(20);

/// Turns `SIGUSR1` into "the box is about to suspend" (a systemd-sleep hook or any script sends
/// it: see the README). Never returns; elsewhere than Unix, waits forever.
async fn sleep_signals(sleep: &tokio::sync::Notify) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut signals) = signal(SignalKind::user_defined1()) {
            while signals.recv().await.is_some() {
                tracing::info!("SIGUSR1: the box is going to sleep");
                sleep.notify_one();
            }
        }
    }
    std::future::pending::<()>().await
}

/// After the proxy said it stops (a restart, an upgrade, a reboot), reconnect attempts are at
/// most this far apart, so the worker is back within seconds of the proxy listening again...
pub const PROXY_RESTART_RETRY_MAX: Duration = Duration::from_secs(2);
/// ... for this long; a proxy away longer is waited for with the usual backoff.
pub const PROXY_RESTART_WINDOW: Duration = Duration::from_secs(600);

/// Connects, serves and reconnects until shutdown.
async fn serve_until_shutdown(running: Running<'_>, shutdown: &mut watch::Receiver<bool>) {
    let (config, report) = (running.config, running.report);
    let mut delay = config.reconnect_min;
    // Until when the proxy is expected back from a restart it announced.
    let mut restart_expected_until: Option<tokio::time::Instant> = None;
    let mut proxy_url = config.proxy_url.clone();
    // Since when the proxy has not been reached, and when the LAN was last searched for it.
    let mut away_since: Option<tokio::time::Instant> = None;
    let mut searched: Option<tokio::time::Instant> = None;
    loop {
        if *shutdown.borrow() {
            return;
        }
        let moved = tokio::select! {
            moved = search_if_due(config, &proxy_url, away_since, &mut searched) => moved,
            _ = shutdown.changed() => return,
        };
        if let Some(url) = moved {
            tracing::warn!(from = %proxy_url, to = %url, "the proxy moved: following its certificate to its new address");
            proxy_url = url;
            delay = config.reconnect_min;
        }
        report.set_proxy_url(&proxy_url);
        report.set_state(ConnectionState::Connecting, None);
        let attempt = Running {
            proxy_url: &proxy_url,
            ..running
        };
        let ended = session::serve(attempt, shutdown).await;
        let now = tokio::time::Instant::now();
        away_since = match &ended {
            SessionEnd::Disconnected {
                registered: true, ..
            }
            | SessionEnd::ProxyStopped { .. } => Some(now),
            SessionEnd::Disconnected { .. } => away_since.or(Some(now)),
            _ => None,
        };
        match ended {
            SessionEnd::Shutdown => return,
            SessionEnd::Asleep => {
                report.set_state(
                    ConnectionState::Disconnected,
                    Some("asleep: the proxy was told this box went to sleep".to_string()),
                );
                delay = config.reconnect_min;
                tokio::select! {
                    _ = tokio::time::sleep(SLEEP_PAUSE) => {}
                    _ = shutdown.changed() => return,
                }
            }
            SessionEnd::DrainedByProxy { reason } => {
                let why = if reason.is_empty() {
                    "drained by the proxy".to_string()
                } else {
                    format!("drained by the proxy: {reason}")
                };
                tracing::info!("{why}; not reconnecting");
                report.set_state(ConnectionState::Drained, Some(why));
                return;
            }
            SessionEnd::ProxyStopped { reason } => {
                let why = if reason.is_empty() {
                    "the proxy stopped".to_string()
                } else {
                    format!("the proxy stopped ({reason})")
                };
                tracing::info!("{why}; reconnecting when it is back");
                report.set_state(
                    ConnectionState::Disconnected,
                    Some(format!("{why}; reconnecting when it is back")),
                );
                delay = config.reconnect_min.min(PROXY_RESTART_RETRY_MAX);
                restart_expected_until = Some(tokio::time::Instant::now() + PROXY_RESTART_WINDOW);
                // Spread out: every worker of the house heard the same message at once.
                let jitter = Duration::from_millis(rand::rng().random_range(0..=500));
                tokio::select! {
                    _ = tokio::time::sleep(delay + jitter) => {}
                    _ = shutdown.changed() => return,
                }
            }
            SessionEnd::Disconnected {
                registered,
                reason,
                waited_out,
            } => {
                report.set_state(ConnectionState::Disconnected, Some(reason.clone()));
                if registered {
                    delay = config.reconnect_min;
                    restart_expected_until = None;
                }
                if waited_out {
                    // The attempt was the wait (see `SessionEnd::Disconnected::waited_out`).
                    tracing::warn!("disconnected from proxy: {reason}; trying again now");
                    continue;
                }
                let jitter = Duration::from_millis(rand::rng().random_range(0..=500));
                let wait = delay + jitter;
                tracing::warn!(
                    "disconnected from proxy: {reason}; reconnecting in {:.1}s",
                    wait.as_secs_f64()
                );
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = shutdown.changed() => return,
                }
                let most = match restart_expected_until {
                    Some(until) if tokio::time::Instant::now() < until => {
                        config.reconnect_max.min(PROXY_RESTART_RETRY_MAX)
                    }
                    _ => config.reconnect_max,
                };
                delay = (delay * 2).min(most);
            }
        }
    }
}

/// With a pinned certificate, once the proxy has been away for [`follow::SEARCH_AFTER`] (and at
/// most every [`follow::SEARCH_EVERY`]), looks for it on the LAN: its new address, if it moved.
async fn search_if_due(
    config: &WorkerConfig,
    current: &str,
    away_since: Option<tokio::time::Instant>,
    searched: &mut Option<tokio::time::Instant>,
) -> Option<String> {
    let pin = config.proxy_fingerprint?;
    if away_since?.elapsed() < follow::SEARCH_AFTER
        || searched.is_some_and(|at| at.elapsed() < follow::SEARCH_EVERY)
    {
        return None;
    }
    *searched = Some(tokio::time::Instant::now());
    tracing::info!(proxy = %current, "the proxy has been unreachable for a while: looking for its certificate on the LAN");
    follow::moved_proxy(pin, current).await
}

/// What a running worker's connections share.
#[derive(Clone, Copy)]
pub struct Running<'a> {
    /// Its configuration.
    pub config: &'a WorkerConfig,
    /// The proxy's address now: the configured one, or where it was found after it moved.
    pub proxy_url: &'a str,
    /// Its way to its backends.
    pub access: &'a BackendAccess,
    /// Where it reports its state.
    pub report: &'a WorkerReport,
    /// The model map's manager, if it has one.
    pub lifecycle: Option<&'a LifecycleManager>,
    /// The box's latest hardware sample, when it is sampled.
    pub hardware: Option<&'a Latest>,
    /// Notified when the box is about to suspend.
    pub sleep: &'a tokio::sync::Notify,
}

/// How this worker reaches its backends: one HTTP client, and one table of the routes they
/// serve natively (configured where the settings say, probed otherwise; a probe result lasts
/// one model refresh, so a swapped server is probed again).
#[derive(Debug, Clone)]
pub struct BackendAccess {
    /// The HTTP client for what the worker asks its backends itself (model lists, slots).
    pub client: reqwest::Client,
    /// The client requests are forwarded with (its own for plain-HTTP backends,
    /// [`crate::backend::http`]).
    pub forwarding: LocalClient,
    /// What this worker learned of its backends' routes.
    pub capabilities: Capabilities,
    /// Which llama-server slot each conversation is kept in.
    pub slot_pins: SlotPins,
    /// The context windows its backends said.
    pub windows: catalog::ContextWindowCache,
    /// Its llama-servers' warm-ups ([`warm_up`]).
    pub warm_ups: warm_up::WarmUps,
    /// The models its backends unloaded by themselves ([`resting`]).
    pub resting: resting::Resting,
}

impl BackendAccess {
    fn new(config: &WorkerConfig) -> Self {
        let fixed = match &config.backends {
            Backends::Fixed(urls) => urls.as_slice(),
            Backends::Discover(_) => &[],
        };
        BackendAccess {
            client: backend_client(),
            forwarding: LocalClient::new(
                (config.max_concurrent as usize).min(MAX_IDLE_BACKEND_CONNECTIONS),
                BACKEND_IDLE_REUSE,
            ),
            capabilities: Capabilities::new(
                fixed,
                config.native_routes,
                config.model_refresh_interval,
            ),
            slot_pins: SlotPins::new(config.slot_hints),
            windows: catalog::ContextWindowCache::default(),
            warm_ups: warm_up::WarmUps::default(),
            resting: resting::Resting::default(),
        }
    }

    /// The backend request for `request` to the backend at `base_url`: with the slot hint of
    /// its conversation when that backend is a llama.cpp server ([`slot_pins`]), and then the
    /// lease on the slot, which the request's task holds until it ends. A conversation's turn
    /// may first wait (seconds at most) for its own slot to be free of a side request.
    pub async fn request_for(
        &self,
        base_url: &str,
        request: RequestMessage,
    ) -> (BackendRequest, Option<SlotLease>) {
        let conversation = request.conversation_key();
        let side = request.side_request == Some(true);
        let mut forwarded = wire::backend_request(request);
        let pinned = self
            .slot_pins
            .pin(
                &self.client,
                base_url,
                conversation,
                side,
                &forwarded.path,
                &forwarded.body,
            )
            .await;
        let lease = pinned.map(|(hinted, lease)| {
            match hinted {
                Some(hinted) => forwarded.body = hinted,
                None => forwarded.slot = Some(lease.slot()),
            }
            lease
        });
        (forwarded, lease)
    }

    /// The backend at `base_url`, an OpenAI-compatible server.
    pub fn backend(&self, base_url: &str) -> Backend {
        Backend {
            base_url: base_url.to_string(),
            speaks: Speaks::OpenAi,
            client: HttpClient::Local {
                local: self.forwarding.clone(),
                general: self.client.clone(),
            },
            capabilities: self.capabilities.clone(),
        }
    }
}

/// Idle backend connections kept per backend at most, whatever the concurrency: one per request
/// slot (fewer would mean a new TCP connection per request under full load), but after a burst
/// of thousands of streams not thousands of idle sockets.
const MAX_IDLE_BACKEND_CONNECTIONS: usize = 256;

/// How long an idle backend connection may be reused: under the shortest keep-alive common
/// backends allow. llama-server (cpp-httplib) and vLLM (uvicorn) close a connection idle for 5 s;
/// a request sent on it just as the backend closes it fails before reaching the backend
/// ("connection closed before message completed"). The client's idle clock starts after the
/// backend's (when the answer has been read), so a second's margin keeps the worker from ever
/// picking a connection the backend is about to close for idleness; reconnecting to a local
/// backend costs well under a millisecond. (A close for any other reason is sent once more,
/// [`crate::backend`]'s `forward::send`.)
const BACKEND_IDLE_REUSE: Duration = Duration::from_secs(4);

/// The HTTP client for what the worker asks its backends itself (and for forwarding to `https`
/// ones): no overall timeout (generations can be long), a short connect timeout, and no system
/// proxy (backends are local).
fn backend_client() -> reqwest::Client {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .pool_max_idle_per_host(4)
        .pool_idle_timeout(BACKEND_IDLE_REUSE)
        .no_proxy()
        // A model server answers where it is asked; a redirect would carry clients' requests
        // (and their keys, with forward_client_auth) to wherever it points.
        .redirect(reqwest::redirect::Policy::none())
        .tcp_nodelay(true)
        .build()
        .expect("a client with these options always builds")
}

/// The worker endpoint URL for `proxy_url`: `http`→`ws`, `https`→`wss`; with a `pinned`
/// certificate always `wss` (a fingerprint only means something over TLS, and a join code or a
/// hand-typed `http://` URL with one must not quietly connect in the clear).
pub fn connect_url(proxy_url: &str, provider: &str, pinned: bool) -> Result<String, String> {
    let trimmed = proxy_url.trim().trim_end_matches('/');
    let (tls, host) = if let Some(rest) = trimmed.strip_prefix("https://") {
        (true, rest)
    } else if let Some(rest) = trimmed.strip_prefix("http://") {
        (false, rest)
    } else if let Some(rest) = trimmed.strip_prefix("wss://") {
        (true, rest)
    } else if let Some(rest) = trimmed.strip_prefix("ws://") {
        (false, rest)
    } else {
        return Err(format!(
            "PROXY_URL {proxy_url:?} must start with http:// or https://"
        ));
    };
    let scheme = if tls || pinned { "wss" } else { "ws" };
    Ok(format!(
        "{scheme}://{host}/v1/worker/connect?provider={provider}"
    ))
}

/// The worker WebSocket (or a TLS failure, or the proxy's refusal).
pub type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens the worker WebSocket `request` (a `ws://` or `wss://` URL from [`connect_url`]). With a
/// `pin` the TLS handshake trusts only the certificate with that fingerprint; without, `wss://`
/// checks the public CAs as any HTTPS client does.
pub async fn dial(
    request: tokio_tungstenite::tungstenite::handshake::client::Request,
    pin: Option<crate::fingerprint::Fingerprint>,
    config: Option<tokio_tungstenite::tungstenite::protocol::WebSocketConfig>,
) -> Result<Socket, tokio_tungstenite::tungstenite::Error> {
    let connector =
        pin.map(|pin| tokio_tungstenite::Connector::Rustls(crate::tls::pinned::client_config(pin)));
    // Nagle off: the worker sends small chunks that must leave at once.
    tokio_tungstenite::connect_async_tls_with_config(request, config, true, connector)
        .await
        .map(|(socket, _)| socket)
}

/// What to tell the user when [`dial`] failed because the proxy's certificate is not the pinned
/// one: both fingerprints, and what to do. `None` for any other failure.
pub fn pin_mismatch_message(
    proxy_url: &str,
    error: &tokio_tungstenite::tungstenite::Error,
) -> Option<String> {
    let tokio_tungstenite::tungstenite::Error::Io(io) = error else {
        return None;
    };
    let mismatch = crate::tls::pinned::mismatch_in(io)?;
    Some(format!(
        "the proxy at {proxy_url} presented certificate {}, but this worker is pinned to {}: ask the proxy's owner for a new join code (its certificate changed, or this is not the proxy you meant)",
        mismatch.presented, mismatch.pinned
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::{parse_file, Overrides};

    fn settings(text: &str) -> WorkerSettings {
        WorkerSettings::resolve(&parse_file(text).unwrap(), &Overrides::default()).unwrap()
    }

    fn backends_of(text: &str, discover: Option<DiscoveryOptions>) -> Backends {
        WorkerConfig::from_settings(settings(text), "http://p:1".into(), "s".into(), discover)
            .backends
    }

    #[test]
    fn backends_are_the_configured_ones_else_discovered_else_none_with_a_model_map_else_the_default(
    ) {
        let configured = backends_of(
            "[worker]\nbackend_url = \"http://b:1\"\n",
            Some(DiscoveryOptions::default()),
        );
        assert!(matches!(configured, Backends::Fixed(ref urls) if urls == &["http://b:1"]));
        let discovered = backends_of("", Some(DiscoveryOptions::default()));
        assert!(matches!(discovered, Backends::Discover(_)));
        let mapped = backends_of("[worker.model_map.m]\nstart_script = \"s\"\n", None);
        assert!(matches!(mapped, Backends::Fixed(ref urls) if urls.is_empty()));
        let default = backends_of("", None);
        assert!(matches!(default, Backends::Fixed(ref urls) if urls == &[defaults::BACKEND_URL]));
    }

    #[tokio::test]
    async fn a_backend_connection_is_reused_while_fresh_and_never_once_idle_near_a_five_second_keep_alive(
    ) {
        use std::sync::atomic::Ordering;
        const { assert!(BACKEND_IDLE_REUSE.as_millis() < 5_000) };
        let (url, accepted) = crate::backend::testing::counting_backend(0).await;
        let client = HttpClient::Local {
            local: LocalClient::new(4, BACKEND_IDLE_REUSE),
            general: backend_client(),
        };
        let get = || async {
            let url = reqwest::Url::parse(&format!("{url}/v1/chat/completions")).unwrap();
            let body = bytes::Bytes::from_static(b"{}");
            let response = client.post(url, &Default::default(), body).await.unwrap();
            assert!(response.status().is_success());
            response.text(1024).await.unwrap();
        };
        get().await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        get().await;
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "a connection idle for 200 ms is reused"
        );
        tokio::time::sleep(BACKEND_IDLE_REUSE + Duration::from_millis(300)).await;
        get().await;
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            2,
            "a connection idle past the reuse limit is not sent on: the backend may be closing it"
        );
    }

    #[test]
    fn proxy_url_scheme_maps_to_websocket_scheme() {
        assert_eq!(
            connect_url("http://proxy:8080/", "local", false).unwrap(),
            "ws://proxy:8080/v1/worker/connect?provider=local"
        );
        assert_eq!(
            connect_url("https://relay.example.com", "lab", false).unwrap(),
            "wss://relay.example.com/v1/worker/connect?provider=lab"
        );
        assert!(connect_url("proxy:8080", "local", false)
            .unwrap_err()
            .contains("http://"));
    }

    #[test]
    fn a_pinned_certificate_always_means_wss() {
        for url in [
            "http://10.0.0.2:8080",
            "https://10.0.0.2:8080",
            "ws://10.0.0.2:8080",
        ] {
            assert_eq!(
                connect_url(url, "local", true).unwrap(),
                "wss://10.0.0.2:8080/v1/worker/connect?provider=local",
                "{url}"
            );
        }
    }
}
