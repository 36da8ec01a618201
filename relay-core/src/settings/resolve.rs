//! Defaults < file < overrides, resolved into plain values and checked: each error names the
//! setting and what to do. The proxy and the worker build their runtime configurations from
//! these (`ProxyConfig::new`, `WorkerConfig::new`) with what only they know (the secret a
//! node generated, the backends it discovered).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::file::{FileConfig, ProxyFile, TlsMode, WorkerFile};
use super::limits::{
    ConnectionLimits, NativeOverrides, ProviderConfig, ProviderLimits, SleeperLimits, StoreLimits,
    TlsSetting, UpstreamConfig,
};
use super::overrides::Overrides;
use super::{defaults, ConfigError};
use crate::fingerprint::Fingerprint;
use crate::lifecycle::{LifecycleConfig, LifecycleSection};
use crate::protocol::BRIDGE_PROTOCOL_VERSION;
use crate::wake::MacAddress;

/// The proxy's settings, resolved.
#[derive(Debug, Clone)]
pub struct ProxySettings {
    /// Where to listen.
    pub listen: String,
    /// Whether `listen` was chosen (a taken address is then an error; the default moves on to
    /// the next free port).
    pub listen_explicit: bool,
    /// The configured worker secret of the default provider; `None` uses the stored one.
    pub worker_secret: Option<String>,
    /// The default provider's name.
    pub provider: String,
    /// The default provider's limits.
    pub limits: ProviderLimits,
    /// Whether the default provider's workers get clients' credentials.
    pub forward_client_auth: bool,
    /// `[[proxy.providers]]`, checked.
    pub extra_providers: Vec<ProviderConfig>,
    /// Largest accepted request body.
    pub max_body_bytes: usize,
    /// Open connections and the request-head deadline.
    pub connections: ConnectionLimits,
    /// Worker connections accepted at once.
    pub max_workers: usize,
    /// Time a client has to send a request's body.
    pub body_read_timeout: Duration,
    /// Request body bytes held at once.
    pub max_request_bytes_in_flight: usize,
    /// Largest streamed answer.
    pub max_stream_bytes: u64,
    /// Stream bytes that may wait for a slow client, per request.
    pub max_buffered_stream_bytes: usize,
    /// Ping period.
    pub heartbeat_interval: Duration,
    /// A worker silent this long is closed.
    pub heartbeat_timeout: Duration,
    /// In-flight requests get this long on shutdown.
    pub drain_timeout: Duration,
    /// Bounds of the Responses store.
    pub responses_store: StoreLimits,
    /// `[proxy.aliases]`.
    pub aliases: BTreeMap<String, String>,
    /// `default_model`.
    pub default_model: Option<String>,
    /// `[[proxy.upstreams]]`, checked, with their keys found.
    pub upstreams: Vec<UpstreamConfig>,
    /// The upstream taking what nobody serves and what a full queue refuses.
    pub fallback_upstream: Option<String>,
    /// The configured admin token; `None` uses the stored one.
    pub admin_token: Option<String>,
    /// Inference requests need a client API key.
    pub require_api_keys: bool,
    /// A conversation's next turn prefers the worker that served it last.
    pub affinity: bool,
    /// Measured speeds may send a request to a faster box than the usual rules pick.
    pub cost_routing: bool,
    /// A PostgreSQL URL for keys and usage; `None` for the SQLite file in the data directory.
    pub database_url: Option<String>,
    /// Host names besides this machine's own that requests may carry.
    pub allowed_hosts: Vec<String>,
    /// Web origins allowed to call `/v1` from a browser.
    pub cors_origins: Vec<String>,
    /// `/metrics` without the admin token.
    pub metrics_public: bool,
    /// Whether and how to serve TLS.
    pub tls: TlsSetting,
    /// How sleeping boxes are remembered and woken.
    pub sleepers: SleeperLimits,
    /// Where Wake-on-LAN packets go.
    pub wake_target: SocketAddr,
}

/// A worker's settings, resolved.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    /// The proxy to join; `None` when not configured (a node's worker joins its own proxy, a
    /// lone worker [`defaults::PROXY_URL`]).
    pub proxy_url: Option<String>,
    /// The proxy's certificate, pinned.
    pub proxy_fingerprint: Option<Fingerprint>,
    /// The secret to present, when configured.
    pub worker_secret: Option<String>,
    /// The provider to join.
    pub provider: String,
    /// The worker's name.
    pub name: String,
    /// Configured backend URLs; `None` when none are (then discovery, or the default).
    pub backend_urls: Option<Vec<String>>,
    /// Models to advertise; `None` asks the backends.
    pub models: Option<Vec<String>>,
    /// Requests run at once.
    pub max_concurrent: u32,
    /// Whether clients' credentials reach the backends.
    pub forward_client_auth: bool,
    /// Backend routes forwarded besides the inference routes (`extra_routes`).
    pub extra_routes: Vec<String>,
    /// Other users' local model servers the owner confirmed (`confirmed_backends`).
    pub confirmed_backends: Vec<String>,
    /// Sent in `register`; `None` sends none.
    pub protocol_version: Option<String>,
    /// How often the backends' model lists are re-read.
    pub model_refresh_interval: Duration,
    /// In-flight requests get this long on shutdown.
    pub drain_timeout: Duration,
    /// Silence from the proxy after which the connection is taken for dead.
    pub proxy_silence_timeout: Duration,
    /// The model map; `None` without one.
    pub lifecycle: Option<LifecycleConfig>,
    /// Which routes backends serve natively, where configured.
    pub native_routes: NativeOverrides,
    /// The box suspends when idle (announced in `register`).
    pub sleeps_when_idle: bool,
    /// Conversations are kept in one llama-server slot each (`id_slot`).
    pub slot_hints: bool,
    /// The context window of backends that do not say theirs (`context_window`).
    pub context_window: Option<u32>,
    /// The card to wake, when configured (else found at start on Linux).
    pub mac_address: Option<MacAddress>,
    /// Where it sends the Wake-on-LAN packets the proxy asks it to relay.
    pub wake_target: SocketAddr,
}

fn secs(value: Option<u64>, default: Duration) -> Duration {
    value.map(Duration::from_secs).unwrap_or(default)
}

fn invalid(message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid(message.into())
}

/// The configured admin token, if any, when it is long enough not to be guessed: it opens the
/// control API, `/admin` and `/metrics` from anywhere the relay is reachable.
fn admin_token(configured: Option<&String>) -> Result<Option<String>, ConfigError> {
    let Some(token) = configured.filter(|t| !t.trim().is_empty()) else {
        return Ok(None);
    };
    let length = token.trim().chars().count();
    if length < defaults::ADMIN_TOKEN_MIN_CHARS {
        return Err(invalid(format!(
            "the admin token (MODELRELAY_ADMIN_TOKEN, --admin-token, --admin-token-file or \
             admin_token) is {length} characters; use at least {} so it cannot be guessed, \
             e.g. the output of `openssl rand -hex 16`",
            defaults::ADMIN_TOKEN_MIN_CHARS
        )));
    }
    Ok(Some(token.clone()))
}

impl ProxySettings {
    /// The proxy's settings from `overrides` over `file` over the defaults.
    pub fn resolve(file: &FileConfig, overrides: &Overrides) -> Result<Self, ConfigError> {
        let p = &file.proxy;
        let o = overrides;
        let limits = ProviderLimits {
            max_queue_len: o
                .max_queue_len
                .or(p.max_queue_len)
                .unwrap_or(defaults::MAX_QUEUE_LEN),
            queue_timeout: secs(
                o.queue_timeout_secs.or(p.queue_timeout_secs),
                defaults::QUEUE_TIMEOUT,
            ),
            request_timeout: secs(
                o.request_timeout_secs.or(p.request_timeout_secs),
                defaults::REQUEST_TIMEOUT,
            ),
            max_models_per_worker: p
                .max_models_per_worker
                .unwrap_or(defaults::MAX_MODELS_PER_WORKER),
            enabled: true,
            models: p.models.clone(),
        };
        if limits.queue_timeout.is_zero() || limits.request_timeout.is_zero() {
            return Err(invalid(
                "QUEUE_TIMEOUT_SECS and REQUEST_TIMEOUT_SECS must be at least 1",
            ));
        }
        let provider = o
            .provider
            .clone()
            .or_else(|| p.provider.clone())
            .unwrap_or_else(|| defaults::PROVIDER.to_string());
        let extra_providers = extra_providers(p, &provider, &limits)?;
        let heartbeat_interval = secs(
            o.heartbeat_interval_secs.or(p.heartbeat_interval_secs),
            defaults::HEARTBEAT_INTERVAL,
        );
        let heartbeat_timeout = secs(
            o.heartbeat_timeout_secs.or(p.heartbeat_timeout_secs),
            defaults::HEARTBEAT_TIMEOUT,
        );
        if heartbeat_interval.is_zero() || heartbeat_timeout < heartbeat_interval {
            return Err(invalid(
                "HEARTBEAT_INTERVAL_SECS must be at least 1 and HEARTBEAT_TIMEOUT_SECS at least the interval",
            ));
        }
        if let Some((name, _)) = p.aliases.iter().find(|(_, to)| to.trim().is_empty()) {
            return Err(invalid(format!(
                "[proxy.aliases] {name:?} maps to an empty model name"
            )));
        }
        let (listen, listen_explicit) = match o.listen.clone().or_else(|| p.listen.clone()) {
            Some(listen) => (listen, true),
            None => (defaults::LISTEN.to_string(), false),
        };
        let max_body_bytes = o
            .max_body_bytes
            .or(p.max_body_bytes)
            .unwrap_or(defaults::MAX_BODY_BYTES);
        let max_request_bytes_in_flight = p
            .max_request_bytes_in_flight
            .unwrap_or(defaults::MAX_REQUEST_BYTES_IN_FLIGHT);
        // Below one body of the largest size, such a request could never be admitted.
        if max_request_bytes_in_flight < max_body_bytes {
            return Err(invalid(format!(
                "[proxy] max_request_bytes_in_flight ({max_request_bytes_in_flight}) must be at \
                 least MAX_BODY_BYTES ({max_body_bytes})"
            )));
        }
        let max_buffered_stream_bytes = p
            .max_buffered_stream_bytes
            .unwrap_or(defaults::MAX_BUFFERED_STREAM_BYTES);
        if max_buffered_stream_bytes < 64 * 1024 {
            return Err(invalid(
                "[proxy] max_buffered_stream_bytes must be at least 65536: a smaller bound ends \
                 streams whose client reads at a normal pace",
            ));
        }
        Ok(ProxySettings {
            listen,
            listen_explicit,
            worker_secret: o.worker_secret.clone().or_else(|| p.worker_secret.clone()),
            provider,
            limits,
            forward_client_auth: o
                .forward_client_auth
                .or(p.forward_client_auth)
                .unwrap_or(false),
            extra_providers,
            max_body_bytes,
            connections: connections(p, o)?,
            max_workers: match p.max_workers {
                Some(0) => return Err(invalid("[proxy] max_workers must be at least 1")),
                Some(max) => max,
                None => defaults::MAX_WORKERS,
            },
            max_stream_bytes: p.max_stream_bytes.unwrap_or(defaults::MAX_STREAM_BYTES),
            max_buffered_stream_bytes,
            body_read_timeout: match p.body_read_timeout_secs {
                Some(0) => {
                    return Err(invalid("[proxy] body_read_timeout_secs must be at least 1"))
                }
                secs_given => secs(secs_given, defaults::BODY_READ_TIMEOUT),
            },
            max_request_bytes_in_flight,
            heartbeat_interval,
            heartbeat_timeout,
            drain_timeout: secs(
                o.drain_timeout_secs.or(p.drain_timeout_secs),
                defaults::DRAIN_TIMEOUT,
            ),
            responses_store: responses_store(p),
            aliases: p.aliases.clone(),
            default_model: p.default_model.clone(),
            upstreams: upstreams(p)?,
            fallback_upstream: p.fallback_upstream.clone(),
            admin_token: admin_token(o.admin_token.as_ref().or(p.admin_token.as_ref()))?,
            require_api_keys: o.require_api_keys.or(p.require_api_keys).unwrap_or(false),
            affinity: o.affinity.or(p.affinity).unwrap_or(defaults::AFFINITY),
            cost_routing: o
                .cost_routing
                .or(p.cost_routing)
                .unwrap_or(defaults::COST_ROUTING),
            database_url: database_url(o.database_url.as_ref().or(p.database_url.as_ref()))?,
            allowed_hosts: o
                .allowed_hosts
                .clone()
                .unwrap_or_else(|| p.allowed_hosts.clone()),
            cors_origins: o
                .cors_origins
                .clone()
                .unwrap_or_else(|| p.cors_origins.clone()),
            metrics_public: o
                .metrics_public
                .or(p.metrics_public)
                .unwrap_or(defaults::METRICS_PUBLIC),
            tls: tls(p, o)?,
            sleepers: sleepers(p, o)?,
            wake_target: wake_target("proxy", p.wake_target.as_deref(), o)?,
        })
    }
}

/// `[proxy] sleepers_remembered_secs`, `max_sleepers`, `wake_retry_secs` over the defaults.
fn sleepers(p: &ProxyFile, o: &Overrides) -> Result<SleeperLimits, ConfigError> {
    let defaults = SleeperLimits::default();
    let retry = secs(p.wake_retry_secs, defaults.retry);
    if retry.is_zero() {
        return Err(invalid(
            "[proxy] wake_retry_secs must be at least 1: a flood of requests would send a packet each",
        ));
    }
    Ok(SleeperLimits {
        remember: secs(
            o.sleepers_remembered_secs.or(p.sleepers_remembered_secs),
            defaults.remember,
        ),
        max_boxes: p.max_sleepers.unwrap_or(defaults.max_boxes),
        retry,
    })
}

/// `MODELRELAY_WAKE_TARGET`: an `IP:PORT` (no host names: the packet goes out when a request
/// waits, not after a DNS lookup).
/// The same variable serves both roles: it names where this machine's packets go.
fn wake_target(
    section: &str,
    file: Option<&str>,
    o: &Overrides,
) -> Result<SocketAddr, ConfigError> {
    let text = o
        .wake_target
        .as_deref()
        .or(file)
        .unwrap_or(crate::wake::DEFAULT_WAKE_TARGET);
    text.trim().parse().map_err(|_| {
        invalid(format!(
            "MODELRELAY_WAKE_TARGET/[{section}] wake_target {text:?} must be IP:PORT, e.g. \
             192.168.1.255:9 (the broadcast address of the sleeping boxes' network)"
        ))
    })
}

/// `DATABASE_URL` checked: a PostgreSQL URL, or nothing (blank counts as nothing).
fn database_url(url: Option<&String>) -> Result<Option<String>, ConfigError> {
    let Some(url) = url.map(|u| u.trim()).filter(|u| !u.is_empty()) else {
        return Ok(None);
    };
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok(Some(url.to_string()));
    }
    Err(ConfigError::Invalid(format!(
        "DATABASE_URL must be a PostgreSQL URL (postgres://user:password@host:5432/database); \
         leave it unset to keep keys and usage in the SQLite file of the data directory (got {:?})",
        url.split("://").next().unwrap_or_default()
    )))
}

/// `[[proxy.providers]]`: each needs a name of its own and a secret; unset limits are the
/// default provider's.
fn extra_providers(
    p: &ProxyFile,
    default_name: &str,
    limits: &ProviderLimits,
) -> Result<Vec<ProviderConfig>, ConfigError> {
    let mut providers: Vec<ProviderConfig> = Vec::new();
    for extra in &p.providers {
        if extra.name.trim().is_empty() || extra.worker_secret.is_empty() {
            return Err(invalid(
                "every [[proxy.providers]] entry needs a name and a worker_secret",
            ));
        }
        if extra.name == default_name || providers.iter().any(|known| known.name == extra.name) {
            return Err(invalid(format!(
                "provider {:?} is configured twice",
                extra.name
            )));
        }
        providers.push(ProviderConfig {
            name: extra.name.clone(),
            secret: extra.worker_secret.clone(),
            forward_client_auth: extra.forward_client_auth.unwrap_or(false),
            limits: ProviderLimits {
                max_queue_len: extra.max_queue_len.unwrap_or(limits.max_queue_len),
                queue_timeout: secs(extra.queue_timeout_secs, limits.queue_timeout),
                request_timeout: secs(extra.request_timeout_secs, limits.request_timeout),
                max_models_per_worker: limits.max_models_per_worker,
                enabled: extra.enabled.unwrap_or(true),
                models: extra.models.clone(),
            },
        });
    }
    Ok(providers)
}

/// `MAX_CONNECTIONS` and `[proxy] header_read_timeout_secs`, at least 1 each.
fn connections(p: &ProxyFile, o: &Overrides) -> Result<ConnectionLimits, ConfigError> {
    let mut limits = ConnectionLimits::default();
    if let Some(max) = o.max_connections.or(p.max_connections) {
        if max == 0 {
            return Err(invalid("MAX_CONNECTIONS must be at least 1"));
        }
        limits.max_connections = max;
    }
    if let Some(secs) = p.header_read_timeout_secs {
        if secs == 0 {
            return Err(invalid(
                "[proxy] header_read_timeout_secs must be at least 1",
            ));
        }
        limits.header_read_timeout = Duration::from_secs(secs);
    }
    Ok(limits)
}

/// `[proxy] responses_store_*` over the store's defaults.
fn responses_store(p: &ProxyFile) -> StoreLimits {
    let defaults = StoreLimits::default();
    StoreLimits {
        ttl: secs(p.responses_store_ttl_secs, defaults.ttl),
        max_entries: p
            .responses_store_max_entries
            .unwrap_or(defaults.max_entries),
        max_bytes: p.responses_store_max_bytes.unwrap_or(defaults.max_bytes),
    }
}

/// `[[proxy.upstreams]]`, checked: unique names, http(s) base URLs, keys found, and a
/// `fallback_upstream` that names one of them.
fn upstreams(p: &ProxyFile) -> Result<Vec<UpstreamConfig>, ConfigError> {
    let mut list: Vec<UpstreamConfig> = Vec::new();
    for u in &p.upstreams {
        let invalid = |why: String| invalid(format!("[[proxy.upstreams]] {:?}: {why}", u.name));
        if u.name.trim().is_empty() || list.iter().any(|known| known.name == u.name) {
            return Err(invalid("needs a name of its own".to_string()));
        }
        let base_url = u.base_url.trim().trim_end_matches('/').to_string();
        if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
            return Err(invalid(format!(
                "base_url {base_url:?} must start with http:// or https://"
            )));
        }
        let api_key = match (&u.api_key, &u.api_key_env) {
            (Some(key), _) => Some(key.clone()),
            (None, Some(var)) => Some(
                std::env::var(var)
                    .map_err(|_| invalid(format!("api_key_env names {var}, which is not set")))?,
            ),
            (None, None) => None,
        };
        list.push(UpstreamConfig {
            name: u.name.clone(),
            kind: u.kind,
            base_url,
            api_key,
            models: u.models.clone(),
        });
    }
    if let Some(fallback) = &p.fallback_upstream {
        if !list.iter().any(|u| &u.name == fallback) {
            return Err(invalid(format!(
                "fallback_upstream {fallback:?} names no [[proxy.upstreams]] entry"
            )));
        }
    }
    Ok(list)
}

/// Whether and how the proxy serves TLS: the overrides decide when they say anything, else the
/// file, else plain HTTP. Within one layer, a self-signed certificate and certificate files
/// exclude each other, and a certificate needs its key.
fn tls(p: &ProxyFile, o: &Overrides) -> Result<TlsSetting, ConfigError> {
    let from_overrides = tls_layer(
        o.tls,
        o.tls_cert.as_ref(),
        o.tls_key.as_ref(),
        [
            "--tls/MODELRELAY_TLS",
            "--tls-cert/TLS_CERT",
            "--tls-key/TLS_KEY",
        ],
    )?;
    if let Some(setting) = from_overrides {
        return Ok(setting);
    }
    let from_file = tls_layer(
        p.tls,
        p.tls_cert.as_ref(),
        p.tls_key.as_ref(),
        ["[proxy] tls", "[proxy] tls_cert", "[proxy] tls_key"],
    )?;
    Ok(from_file.unwrap_or(TlsSetting::Off))
}

/// One layer's TLS settings; `None` when it sets none of them. `names` are the mode's, the
/// certificate's and the key's, for errors.
fn tls_layer(
    mode: Option<TlsMode>,
    cert: Option<&PathBuf>,
    key: Option<&PathBuf>,
    names: [&str; 3],
) -> Result<Option<TlsSetting>, ConfigError> {
    let [mode_name, cert_name, key_name] = names;
    match (mode, cert, key) {
        (None, None, None) => Ok(None),
        (Some(mode), None, None) => Ok(Some(match mode {
            TlsMode::SelfSigned => TlsSetting::SelfSigned,
            TlsMode::Off => TlsSetting::Off,
        })),
        (Some(_), _, _) => Err(invalid(format!(
            "{mode_name} and {cert_name}/{key_name} both given: use either a generated certificate (self-signed) or your own files, not both"
        ))),
        (None, Some(cert), Some(key)) => Ok(Some(TlsSetting::Files {
            cert: cert.clone(),
            key: key.clone(),
        })),
        (None, Some(_), None) => Err(invalid(format!(
            "{cert_name} is set but {key_name} is not: give the certificate's private key too"
        ))),
        (None, None, Some(_)) => Err(invalid(format!(
            "{key_name} is set but {cert_name} is not: give the certificate too"
        ))),
    }
}

impl WorkerSettings {
    /// A worker's settings from `overrides` over `file` over the defaults.
    pub fn resolve(file: &FileConfig, overrides: &Overrides) -> Result<Self, ConfigError> {
        let w = &file.worker;
        let o = overrides;
        let max_concurrent = o
            .max_concurrency
            .or(w.max_concurrency)
            .unwrap_or(defaults::MAX_CONCURRENCY);
        if max_concurrent == 0 {
            return Err(invalid("MAX_CONCURRENCY must be at least 1"));
        }
        let protocol_version = o
            .protocol_version
            .clone()
            .or_else(|| w.protocol_version.clone())
            .unwrap_or_else(|| BRIDGE_PROTOCOL_VERSION.to_string());
        let models = match (&o.models, &w.models) {
            (Some(value), _) => super::parse_models(value),
            (None, Some(list)) => super::parse_models(&list.join(",")),
            (None, None) => None,
        };
        Ok(WorkerSettings {
            proxy_url: o.proxy_url.clone().or_else(|| w.proxy_url.clone()),
            proxy_fingerprint: o.proxy_fingerprint.or(w.proxy_fingerprint),
            worker_secret: o.worker_secret.clone().or_else(|| w.worker_secret.clone()),
            provider: o
                .provider
                .clone()
                .or_else(|| w.provider.clone())
                .unwrap_or_else(|| defaults::PROVIDER.to_string()),
            name: o
                .worker_name
                .clone()
                .or_else(|| w.worker_name.clone())
                .unwrap_or_else(super::default_worker_name),
            backend_urls: o
                .backend_url
                .clone()
                .or_else(|| w.backend_url.clone())
                .map(|urls| {
                    urls.split(',')
                        .map(|u| u.trim().trim_end_matches('/').to_string())
                        .filter(|u| !u.is_empty())
                        .collect()
                }),
            models,
            max_concurrent,
            forward_client_auth: o
                .forward_client_auth
                .or(w.forward_client_auth)
                .unwrap_or(false),
            extra_routes: w.extra_routes.clone().unwrap_or_default(),
            confirmed_backends: w.confirmed_backends.clone().unwrap_or_default(),
            protocol_version: (!protocol_version.is_empty() && protocol_version != "none")
                .then_some(protocol_version),
            model_refresh_interval: secs(w.model_refresh_secs, defaults::MODEL_REFRESH),
            drain_timeout: secs(
                o.worker_drain_timeout_secs.or(w.drain_timeout_secs),
                defaults::DRAIN_TIMEOUT,
            ),
            proxy_silence_timeout: match o
                .proxy_silence_timeout_secs
                .or(w.proxy_silence_timeout_secs)
            {
                Some(0) => return Err(invalid("PROXY_SILENCE_TIMEOUT_SECS must be at least 1")),
                given => secs(given, defaults::PROXY_SILENCE_TIMEOUT),
            },
            lifecycle: lifecycle(w)?,
            native_routes: NativeOverrides {
                messages: w.native_messages,
                responses: w.native_responses,
            },
            sleeps_when_idle: o.sleeps_when_idle.or(w.sleeps_when_idle).unwrap_or(false),
            context_window: w.context_window.filter(|tokens| *tokens > 0),
            slot_hints: o
                .slot_hints
                .or(w.slot_hints)
                .unwrap_or(defaults::SLOT_HINTS),
            mac_address: match o.mac_address.as_deref().or(w.mac_address.as_deref()) {
                None => None,
                Some(text) => Some(text.trim().parse::<MacAddress>().map_err(|error| {
                    invalid(format!(
                        "MODELRELAY_MAC_ADDRESS/[worker] mac_address: {error}"
                    ))
                })?),
            },
            wake_target: wake_target("worker", w.wake_target.as_deref(), o)?,
        })
    }
}

/// The worker's model lifecycle: `None` without a model map (`[worker.lifecycle]` alone
/// changes nothing).
fn lifecycle(w: &WorkerFile) -> Result<Option<LifecycleConfig>, ConfigError> {
    if w.model_map.is_empty() {
        return Ok(None);
    }
    let section = LifecycleSection {
        lifecycle: w.lifecycle.clone(),
        model_map: w.model_map.clone(),
    };
    LifecycleConfig::resolve(&section)
        .map(Some)
        .map_err(ConfigError::Invalid)
}
