//! Settings, layered: built-in defaults < TOML config file < environment < command-line flags.
//!
//! The flags and environment variables (see [`crate::cli`]) keep the names of the seeds and the
//! published ModelRelay binaries, so existing scripts and unit files keep working. The file uses
//! the same names in snake case, grouped under `[proxy]` and `[worker]`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::cli::{ProxyArgs, WorkerArgs};
use crate::discovery::DiscoveryOptions;
use crate::lifecycle::config::{LifecycleFile, ModelFile};
use crate::lifecycle::{LifecycleConfig, LifecycleSection};
use crate::protocol::BRIDGE_PROTOCOL_VERSION;
use crate::proxy::scheduler::ProviderLimits;
use crate::proxy::{ProviderConfig, ProxyConfig};
use crate::tls::TlsSetting;
use crate::worker::{Backends, WorkerConfig};

/// The default listen address: loopback, on llama-server's usual port.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// The default backend of a worker: vLLM's and many servers' port.
pub const DEFAULT_BACKEND_URL: &str = "http://127.0.0.1:8000";
/// The default proxy a worker joins.
pub const DEFAULT_PROXY_URL: &str = "http://127.0.0.1:8080";

/// The config file, as written by people. Every field is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// `trace`, `debug`, `info`, `warn` or `error`.
    pub log_level: Option<String>,
    /// Proxy settings.
    #[serde(default)]
    pub proxy: ProxyFile,
    /// Worker settings.
    #[serde(default)]
    pub worker: WorkerFile,
    /// Which roles the node runs (the dashboard's and the tray's switches).
    #[serde(default)]
    pub roles: RolesFile,
}

/// `[roles]` in the config file: what `modelrelay` (with no subcommand) and the desktop app run.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolesFile {
    /// Serve clients and accept workers [default: true].
    pub proxy: Option<bool>,
    /// Run a worker [default: true].
    pub worker: Option<bool>,
}

/// `[proxy]` in the config file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyFile {
    /// The control API's admin token (`MODELRELAY_ADMIN_TOKEN`).
    pub admin_token: Option<String>,
    /// `LISTEN_ADDR`.
    pub listen: Option<String>,
    /// `WORKER_SECRET` of the default provider.
    pub worker_secret: Option<String>,
    /// `PROVIDER_NAME`: the default provider's name.
    pub provider: Option<String>,
    /// `MAX_QUEUE_LEN`.
    pub max_queue_len: Option<usize>,
    /// `QUEUE_TIMEOUT_SECS`.
    pub queue_timeout_secs: Option<u64>,
    /// `REQUEST_TIMEOUT_SECS`.
    pub request_timeout_secs: Option<u64>,
    /// `MAX_BODY_BYTES`.
    pub max_body_bytes: Option<usize>,
    /// `MAX_CONNECTIONS`.
    pub max_connections: Option<usize>,
    /// Seconds a client has to send a request's head (and an idle keep-alive connection to
    /// start its next one).
    pub header_read_timeout_secs: Option<u64>,
    /// `MAX_STREAM_BYTES`.
    pub max_stream_bytes: Option<u64>,
    /// `HEARTBEAT_INTERVAL_SECS`.
    pub heartbeat_interval_secs: Option<u64>,
    /// `HEARTBEAT_TIMEOUT_SECS`.
    pub heartbeat_timeout_secs: Option<u64>,
    /// `DRAIN_TIMEOUT_SECS`.
    pub drain_timeout_secs: Option<u64>,
    /// Seconds a cancelled request keeps its worker slot waiting for the worker to confirm.
    pub cancel_grace_secs: Option<u64>,
    /// Models per worker accepted at registration.
    pub max_models_per_worker: Option<usize>,
    /// Models routed to the default provider even while no worker serves them.
    #[serde(default)]
    pub models: Vec<String>,
    /// More virtual providers, each with its own secret, queue and timeouts.
    #[serde(default)]
    pub providers: Vec<ProviderFile>,
    /// Seconds a stored OpenAI Responses answer can be continued or fetched (0 turns the store
    /// off).
    pub responses_store_ttl_secs: Option<u64>,
    /// Most Responses answers kept at once; the oldest are evicted.
    pub responses_store_max_entries: Option<usize>,
    /// Most bytes the Responses store holds; the oldest answers are evicted.
    pub responses_store_max_bytes: Option<usize>,
    /// `[proxy.aliases]`: client-facing model names or glob patterns (`"claude-*"`) mapped to
    /// served models.
    #[serde(default)]
    pub aliases: BTreeMap<String, String>,
    /// The model for requests naming a model nobody serves (and no alias matches).
    pub default_model: Option<String>,
    /// `FORWARD_CLIENT_AUTH`: pass clients' credentials on to the default provider's workers.
    pub forward_client_auth: Option<bool>,
    /// `MODELRELAY_ALLOWED_HOSTS`: host names besides this machine's that requests may carry.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// `MODELRELAY_CORS_ORIGINS`: web origins allowed to call `/v1` from a browser.
    #[serde(default)]
    pub cors_origins: Vec<String>,
    /// `[[proxy.upstreams]]`: HTTP APIs the proxy calls itself for models no worker serves.
    #[serde(default)]
    pub upstreams: Vec<UpstreamFile>,
    /// The upstream that takes models nobody serves and requests whose queue is full.
    pub fallback_upstream: Option<String>,
    /// `MODELRELAY_TLS`: `self-signed` (generated once, kept in the data directory) or `off`.
    pub tls: Option<crate::cli::TlsMode>,
    /// `TLS_CERT`: a PEM certificate to serve HTTPS with.
    pub tls_cert: Option<PathBuf>,
    /// `TLS_KEY`: the PEM private key of `tls_cert`.
    pub tls_key: Option<PathBuf>,
}

/// `[[proxy.upstreams]]` in the config file. Not `Debug`: it may hold an API key.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamFile {
    /// Its name.
    pub name: String,
    /// `openai` (default; any OpenAI-compatible API) or `anthropic`.
    #[serde(default)]
    pub kind: crate::proxy::upstream::UpstreamKind,
    /// Base URL, without `/v1` (`https://api.openai.com`).
    pub base_url: String,
    /// The API key itself; prefer `api_key_env`.
    pub api_key: Option<String>,
    /// The environment variable holding the API key.
    pub api_key_env: Option<String>,
    /// Models it serves: exact names or glob patterns.
    #[serde(default)]
    pub models: Vec<String>,
}

impl std::fmt::Debug for UpstreamFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamFile")
            .field("name", &self.name)
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("api_key_env", &self.api_key_env)
            .finish_non_exhaustive()
    }
}

/// `[[proxy.providers]]` in the config file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderFile {
    /// Name workers join with.
    pub name: String,
    /// Its workers' secret.
    pub worker_secret: String,
    /// Defaults to the proxy-wide value.
    pub max_queue_len: Option<usize>,
    /// Defaults to the proxy-wide value.
    pub queue_timeout_secs: Option<u64>,
    /// Defaults to the proxy-wide value.
    pub request_timeout_secs: Option<u64>,
    /// A disabled provider refuses workers and requests.
    pub enabled: Option<bool>,
    /// Pass clients' `Authorization` and `x-api-key` on to this provider's workers.
    pub forward_client_auth: Option<bool>,
    /// Models routed here even while no worker serves them.
    #[serde(default)]
    pub models: Vec<String>,
}

/// `[worker]` in the config file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerFile {
    /// `PROXY_URL`.
    pub proxy_url: Option<String>,
    /// `PROXY_FINGERPRINT`: the proxy's certificate, pinned.
    pub proxy_fingerprint: Option<crate::tls::Fingerprint>,
    /// `FORWARD_CLIENT_AUTH`: pass clients' credentials on to the backends.
    pub forward_client_auth: Option<bool>,
    /// `WORKER_SECRET`.
    pub worker_secret: Option<String>,
    /// `WORKER_NAME`.
    pub worker_name: Option<String>,
    /// `BACKEND_URL`: one URL, or several separated by commas.
    pub backend_url: Option<String>,
    /// `MODELS`: a list; `["*"]` asks the backend.
    pub models: Option<Vec<String>>,
    /// `MAX_CONCURRENCY`.
    pub max_concurrency: Option<u32>,
    /// `PROVIDER_NAME` to join.
    pub provider: Option<String>,
    /// `PROTOCOL_VERSION` announced in `register`.
    pub protocol_version: Option<String>,
    /// Seconds between re-reads of the backends' model lists.
    pub model_refresh_secs: Option<u64>,
    /// `DRAIN_TIMEOUT_SECS` on SIGTERM.
    pub drain_timeout_secs: Option<u64>,
    /// Whether backends serve `/v1/messages` themselves; unset probes each backend.
    pub native_messages: Option<bool>,
    /// Whether backends serve `/v1/responses` themselves; unset probes each backend.
    pub native_responses: Option<bool>,
    /// `[worker.lifecycle]`: box-wide model lifecycle settings (used with a model map).
    #[serde(default)]
    pub lifecycle: LifecycleFile,
    /// `[worker.model_map.NAME]`: models this worker starts on demand.
    #[serde(default)]
    pub model_map: BTreeMap<String, ModelFile>,
}

/// Errors in configuration, each naming the setting and what to do.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML for these settings.
    #[error("invalid config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's explanation (line, column, field).
        message: String,
    },
    /// A value is out of range or inconsistent.
    #[error("{0}")]
    Invalid(String),
}

/// Loads `path`, or the default file in the OS config directory when it exists.
pub fn load_file(path: Option<&Path>) -> Result<FileConfig, ConfigError> {
    let path = match path {
        Some(path) => path.to_path_buf(),
        None => match default_config_path().filter(|p| p.exists()) {
            Some(path) => path,
            None => return Ok(FileConfig::default()),
        },
    };
    let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
        path: path.clone(),
        source,
    })?;
    parse_file(&text).map_err(|message| ConfigError::Parse { path, message })
}

/// Parses config file text.
pub fn parse_file(text: &str) -> Result<FileConfig, String> {
    toml::from_str(text).map_err(|e| e.to_string())
}

/// `<OS config dir>/modelrelay/config.toml`, e.g. `~/.config/modelrelay/config.toml` on Linux.
pub fn default_config_path() -> Option<PathBuf> {
    directories::ProjectDirs::from("", "", "modelrelay").map(|d| d.config_dir().join("config.toml"))
}

fn secs(value: Option<u64>, default: u64) -> Duration {
    Duration::from_secs(value.unwrap_or(default))
}

/// The proxy's listen address, and whether it was chosen explicitly (an explicit address that is
/// taken is an error; the default moves to the next free port).
pub fn listen_address(args: &ProxyArgs, file: &FileConfig) -> (String, bool) {
    match args.listen.clone().or_else(|| file.proxy.listen.clone()) {
        Some(listen) => (listen, true),
        None => (DEFAULT_LISTEN.to_string(), false),
    }
}

/// The proxy configuration from flags/env over the file over defaults, with `secret` for the
/// default provider.
pub fn proxy_config(
    args: &ProxyArgs,
    file: &FileConfig,
    secret: String,
) -> Result<ProxyConfig, ConfigError> {
    let p = &file.proxy;
    let mut config = ProxyConfig::with_secret(secret);
    let max_queue_len = args.max_queue_len.or(p.max_queue_len).unwrap_or(100);
    let queue_timeout = secs(args.queue_timeout.or(p.queue_timeout_secs), 30);
    let request_timeout = secs(args.request_timeout.or(p.request_timeout_secs), 300);
    if queue_timeout.is_zero() || request_timeout.is_zero() {
        return Err(ConfigError::Invalid(
            "QUEUE_TIMEOUT_SECS and REQUEST_TIMEOUT_SECS must be at least 1".to_string(),
        ));
    }
    config.allowed_hosts = args
        .allowed_hosts
        .clone()
        .unwrap_or_else(|| p.allowed_hosts.clone());
    config.cors_origins = args
        .cors_origins
        .clone()
        .unwrap_or_else(|| p.cors_origins.clone());
    config.providers[0].forward_client_auth = args
        .forward_client_auth
        .or(p.forward_client_auth)
        .unwrap_or(false);
    let max_models = p.max_models_per_worker.unwrap_or(256);
    let default_provider = &mut config.providers[0];
    default_provider.name = args
        .provider
        .clone()
        .or_else(|| p.provider.clone())
        .unwrap_or_else(|| "local".to_string());
    default_provider.limits = ProviderLimits {
        max_queue_len,
        queue_timeout,
        request_timeout,
        max_models_per_worker: max_models,
        enabled: true,
        models: p.models.clone(),
    };
    for extra in &p.providers {
        if extra.name.trim().is_empty() || extra.worker_secret.is_empty() {
            return Err(ConfigError::Invalid(
                "every [[proxy.providers]] entry needs a name and a worker_secret".to_string(),
            ));
        }
        if config
            .providers
            .iter()
            .any(|existing| existing.name == extra.name)
        {
            return Err(ConfigError::Invalid(format!(
                "provider {:?} is configured twice",
                extra.name
            )));
        }
        config.providers.push(ProviderConfig {
            name: extra.name.clone(),
            secret: extra.worker_secret.clone(),
            forward_client_auth: extra.forward_client_auth.unwrap_or(false),
            limits: ProviderLimits {
                max_queue_len: extra.max_queue_len.unwrap_or(max_queue_len),
                queue_timeout: extra
                    .queue_timeout_secs
                    .map(Duration::from_secs)
                    .unwrap_or(queue_timeout),
                request_timeout: extra
                    .request_timeout_secs
                    .map(Duration::from_secs)
                    .unwrap_or(request_timeout),
                max_models_per_worker: max_models,
                enabled: extra.enabled.unwrap_or(true),
                models: extra.models.clone(),
            },
        });
    }
    if let Some(max) = args.max_connections.or(p.max_connections) {
        if max == 0 {
            return Err(ConfigError::Invalid(
                "MAX_CONNECTIONS must be at least 1".to_string(),
            ));
        }
        config.connections.max_connections = max;
    }
    if let Some(secs) = p.header_read_timeout_secs {
        if secs == 0 {
            return Err(ConfigError::Invalid(
                "[proxy] header_read_timeout_secs must be at least 1".to_string(),
            ));
        }
        config.connections.header_read_timeout = Duration::from_secs(secs);
    }
    if let Some(bytes) = args.max_body_bytes.or(p.max_body_bytes) {
        config.max_body_bytes = bytes;
    }
    if let Some(bytes) = p.max_stream_bytes {
        config.max_stream_bytes = bytes;
    }
    config.heartbeat_interval = secs(args.heartbeat_interval.or(p.heartbeat_interval_secs), 15);
    config.heartbeat_timeout = secs(args.heartbeat_timeout.or(p.heartbeat_timeout_secs), 45);
    if config.heartbeat_interval.is_zero() || config.heartbeat_timeout < config.heartbeat_interval {
        return Err(ConfigError::Invalid(
            "HEARTBEAT_INTERVAL_SECS must be at least 1 and HEARTBEAT_TIMEOUT_SECS at least the interval"
                .to_string(),
        ));
    }
    config.drain_timeout = secs(args.drain_timeout.or(p.drain_timeout_secs), 30);
    config.cancel_grace = secs(p.cancel_grace_secs, 5);
    responses_store_limits(p, &mut config.responses_store);
    if let Some((name, _)) = p
        .aliases
        .iter()
        .find(|(_, target)| target.trim().is_empty())
    {
        return Err(ConfigError::Invalid(format!(
            "[proxy.aliases] {name:?} maps to an empty model name"
        )));
    }
    config.aliases =
        crate::proxy::aliases::ModelAliases::new(p.aliases.clone(), p.default_model.clone());
    config.upstreams = upstreams(p)?;
    config.fallback_upstream = p.fallback_upstream.clone();
    config.admin_token = args
        .admin_token
        .clone()
        .or_else(|| p.admin_token.clone())
        .filter(|t| !t.trim().is_empty())
        .map(crate::proxy::control::AdminToken);
    Ok(config)
}

/// `[[proxy.upstreams]]`, checked: unique names, http(s) base URLs, keys found, and a
/// `fallback_upstream` that names one of them.
fn upstreams(p: &ProxyFile) -> Result<Vec<crate::proxy::upstream::UpstreamConfig>, ConfigError> {
    let mut list: Vec<crate::proxy::upstream::UpstreamConfig> = Vec::new();
    for u in &p.upstreams {
        let invalid =
            |why: String| ConfigError::Invalid(format!("[[proxy.upstreams]] {:?}: {why}", u.name));
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
        list.push(crate::proxy::upstream::UpstreamConfig {
            name: u.name.clone(),
            kind: u.kind,
            base_url,
            api_key,
            models: u.models.clone(),
        });
    }
    if let Some(fallback) = &p.fallback_upstream {
        if !list.iter().any(|u| &u.name == fallback) {
            return Err(ConfigError::Invalid(format!(
                "fallback_upstream {fallback:?} names no [[proxy.upstreams]] entry"
            )));
        }
    }
    Ok(list)
}

/// Whether and how the proxy serves TLS: flags and environment decide when they say anything,
/// else the file, else plain HTTP. Within one layer, a self-signed certificate and certificate
/// files exclude each other, and a certificate needs its key.
pub fn tls_setting(args: &ProxyArgs, file: &FileConfig) -> Result<TlsSetting, ConfigError> {
    let from_args = tls_layer(
        args.tls,
        args.tls_cert.as_ref(),
        args.tls_key.as_ref(),
        "--tls/MODELRELAY_TLS",
        "--tls-cert/TLS_CERT",
        "--tls-key/TLS_KEY",
    )?;
    if let Some(setting) = from_args {
        return Ok(setting);
    }
    let p = &file.proxy;
    let from_file = tls_layer(
        p.tls,
        p.tls_cert.as_ref(),
        p.tls_key.as_ref(),
        "[proxy] tls",
        "[proxy] tls_cert",
        "[proxy] tls_key",
    )?;
    Ok(from_file.unwrap_or(TlsSetting::Off))
}

/// One layer's TLS settings; `None` when it sets none of them.
fn tls_layer(
    mode: Option<crate::cli::TlsMode>,
    cert: Option<&PathBuf>,
    key: Option<&PathBuf>,
    mode_name: &str,
    cert_name: &str,
    key_name: &str,
) -> Result<Option<TlsSetting>, ConfigError> {
    use crate::cli::TlsMode;
    match (mode, cert, key) {
        (None, None, None) => Ok(None),
        (Some(mode), None, None) => Ok(Some(match mode {
            TlsMode::SelfSigned => TlsSetting::SelfSigned,
            TlsMode::Off => TlsSetting::Off,
        })),
        (Some(_), _, _) => Err(ConfigError::Invalid(format!(
            "{mode_name} and {cert_name}/{key_name} both given: use either a generated certificate (self-signed) or your own files, not both"
        ))),
        (None, Some(cert), Some(key)) => Ok(Some(TlsSetting::Files {
            cert: cert.clone(),
            key: key.clone(),
        })),
        (None, Some(_), None) => Err(ConfigError::Invalid(format!(
            "{cert_name} is set but {key_name} is not: give the certificate's private key too"
        ))),
        (None, None, Some(_)) => Err(ConfigError::Invalid(format!(
            "{key_name} is set but {cert_name} is not: give the certificate too"
        ))),
    }
}

/// `[proxy] responses_store_*` over the store's defaults.
fn responses_store_limits(p: &ProxyFile, limits: &mut crate::proxy::responses_store::StoreLimits) {
    if let Some(ttl) = p.responses_store_ttl_secs {
        limits.ttl = Duration::from_secs(ttl);
    }
    if let Some(entries) = p.responses_store_max_entries {
        limits.max_entries = entries;
    }
    if let Some(bytes) = p.responses_store_max_bytes {
        limits.max_bytes = bytes;
    }
}

/// Splits a `MODELS` value: comma-separated names; `*` (or nothing) means "ask the backend".
pub fn parse_models(value: &str) -> Option<Vec<String>> {
    let models: Vec<String> = value
        .split(',')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .map(str::to_string)
        .collect();
    if models.is_empty() || models.iter().any(|m| m == "*") {
        None
    } else {
        Some(models)
    }
}

/// The worker configuration from flags/env over the file over defaults. `discover` is used when
/// no backend URL is configured anywhere (zero-config mode); otherwise `BACKEND_URL` or its
/// default.
pub fn worker_config(
    args: &WorkerArgs,
    proxy_args: &ProxyArgs,
    file: &FileConfig,
    secret: String,
    discover: Option<DiscoveryOptions>,
) -> Result<WorkerConfig, ConfigError> {
    let w = &file.worker;
    let proxy_url = args
        .proxy_url
        .clone()
        .or_else(|| w.proxy_url.clone())
        .unwrap_or_else(|| DEFAULT_PROXY_URL.to_string());
    let lifecycle = lifecycle_config(w)?;
    let backend = args.backend_url.clone().or_else(|| w.backend_url.clone());
    let backends = match (backend, discover) {
        (Some(urls), _) => Backends::Fixed(
            urls.split(',')
                .map(|u| u.trim().trim_end_matches('/').to_string())
                .filter(|u| !u.is_empty())
                .collect(),
        ),
        (None, Some(options)) => Backends::Discover(options),
        // A worker with a model map starts its own servers: no default backend to warn about.
        (None, None) if lifecycle.is_some() => Backends::Fixed(Vec::new()),
        (None, None) => Backends::Fixed(vec![DEFAULT_BACKEND_URL.to_string()]),
    };
    let models = match (&args.models, &w.models) {
        (Some(value), _) => parse_models(value),
        (None, Some(list)) => parse_models(&list.join(",")),
        (None, None) => None,
    };
    let max_concurrent = args.max_concurrency.or(w.max_concurrency).unwrap_or(4);
    if max_concurrent == 0 {
        return Err(ConfigError::Invalid(
            "MAX_CONCURRENCY must be at least 1".to_string(),
        ));
    }
    let protocol_version = args
        .protocol_version
        .clone()
        .or_else(|| w.protocol_version.clone())
        .unwrap_or_else(|| BRIDGE_PROTOCOL_VERSION.to_string());
    Ok(WorkerConfig {
        proxy_url,
        proxy_fingerprint: args.proxy_fingerprint.or(w.proxy_fingerprint),
        secret,
        provider: proxy_args
            .provider
            .clone()
            .or_else(|| w.provider.clone())
            .unwrap_or_else(|| "local".to_string()),
        name: args
            .worker_name
            .clone()
            .or_else(|| w.worker_name.clone())
            .unwrap_or_else(default_worker_name),
        backends,
        models,
        max_concurrent,
        forward_client_auth: proxy_args
            .forward_client_auth
            .or(w.forward_client_auth)
            .unwrap_or(false),
        protocol_version: (!protocol_version.is_empty() && protocol_version != "none")
            .then_some(protocol_version),
        model_refresh_interval: secs(w.model_refresh_secs, 30),
        drain_timeout: secs(args.worker_drain_timeout.or(w.drain_timeout_secs), 30),
        reconnect_min: Duration::from_secs(1),
        reconnect_max: Duration::from_secs(30),
        lifecycle,
        data_dir: crate::paths::data_dir(),
        native_routes: crate::backend::NativeOverrides {
            messages: w.native_messages,
            responses: w.native_responses,
        },
        report: std::sync::Arc::default(),
    })
}

/// The worker's model lifecycle: `None` without a model map (`[worker.lifecycle]` alone
/// changes nothing).
fn lifecycle_config(w: &WorkerFile) -> Result<Option<LifecycleConfig>, ConfigError> {
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

/// This machine's host name, the natural worker name.
pub fn default_worker_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "worker".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_star_or_empty_means_ask_the_backend() {
        assert_eq!(parse_models("*"), None);
        assert_eq!(parse_models(""), None);
        assert_eq!(
            parse_models(" a, b ,,c"),
            Some(vec!["a".into(), "b".into(), "c".into()])
        );
    }

    #[test]
    fn file_values_apply_and_flags_override_them() {
        let file = parse_file(
            r#"
            log_level = "debug"
            [proxy]
            listen = "0.0.0.0:9000"
            max_queue_len = 7
            queue_timeout_secs = 12
            [[proxy.providers]]
            name = "lab"
            worker_secret = "lab-secret"
            enabled = false
            [worker]
            proxy_url = "https://relay.example.com"
            models = ["a", "b"]
            max_concurrency = 2
            "#,
        )
        .unwrap();
        let mut args = ProxyArgs::default();
        let config = proxy_config(&args, &file, "s".into()).unwrap();
        assert_eq!(config.providers[0].limits.max_queue_len, 7);
        assert_eq!(
            config.providers[0].limits.queue_timeout,
            Duration::from_secs(12)
        );
        assert_eq!(config.providers[1].name, "lab");
        assert!(!config.providers[1].limits.enabled);
        assert_eq!(
            config.providers[1].limits.max_queue_len, 7,
            "inherits the proxy-wide value"
        );
        args.max_queue_len = Some(3);
        assert_eq!(
            proxy_config(&args, &file, "s".into()).unwrap().providers[0]
                .limits
                .max_queue_len,
            3
        );
        assert_eq!(
            listen_address(&ProxyArgs::default(), &file),
            ("0.0.0.0:9000".to_string(), true)
        );
        let worker = worker_config(
            &WorkerArgs::default(),
            &ProxyArgs::default(),
            &file,
            "s".into(),
            None,
        )
        .unwrap();
        assert_eq!(worker.proxy_url, "https://relay.example.com");
        assert_eq!(worker.models, Some(vec!["a".to_string(), "b".to_string()]));
        assert_eq!(worker.max_concurrent, 2);
        assert_eq!(
            worker.protocol_version.as_deref(),
            Some(BRIDGE_PROTOCOL_VERSION)
        );
    }

    #[test]
    fn defaults_match_the_documented_ones() {
        let file = FileConfig::default();
        let config = proxy_config(&ProxyArgs::default(), &file, "s".into()).unwrap();
        let limits = &config.providers[0].limits;
        assert_eq!(config.providers[0].name, "local");
        assert_eq!(limits.max_queue_len, 100);
        assert_eq!(limits.queue_timeout, Duration::from_secs(30));
        assert_eq!(limits.request_timeout, Duration::from_secs(300));
        assert_eq!(config.heartbeat_interval, Duration::from_secs(15));
        assert_eq!(config.heartbeat_timeout, Duration::from_secs(45));
        assert_eq!(
            listen_address(&ProxyArgs::default(), &file),
            (DEFAULT_LISTEN.to_string(), false)
        );
        let worker = worker_config(
            &WorkerArgs::default(),
            &ProxyArgs::default(),
            &file,
            "s".into(),
            None,
        )
        .unwrap();
        assert_eq!(worker.proxy_url, DEFAULT_PROXY_URL);
        assert!(
            matches!(worker.backends, Backends::Fixed(ref urls) if urls == &[DEFAULT_BACKEND_URL.to_string()])
        );
    }

    #[test]
    fn unknown_keys_and_bad_values_are_reported_with_their_location() {
        let error = parse_file("[proxy]\nlisten_addr = \"x\"\n").unwrap_err();
        assert!(error.contains("listen_addr"), "{error}");
        let error = parse_file("[proxy]\nmax_queue_len = \"many\"\n").unwrap_err();
        assert!(error.contains("max_queue_len"), "{error}");
    }

    #[test]
    fn inconsistent_values_are_rejected_with_the_setting_named() {
        let args = ProxyArgs {
            queue_timeout: Some(0),
            ..ProxyArgs::default()
        };
        let error = proxy_config(&args, &FileConfig::default(), "s".into()).unwrap_err();
        assert!(error.to_string().contains("QUEUE_TIMEOUT_SECS"));
        let file =
            parse_file("[[proxy.providers]]\nname = \"local\"\nworker_secret = \"x\"\n").unwrap();
        let error = proxy_config(&ProxyArgs::default(), &file, "s".into()).unwrap_err();
        assert!(error.to_string().contains("twice"));
    }

    fn worker_of(text: &str) -> Result<WorkerConfig, ConfigError> {
        let file = parse_file(text).map_err(ConfigError::Invalid)?;
        worker_config(
            &WorkerArgs::default(),
            &ProxyArgs::default(),
            &file,
            "s".into(),
            None,
        )
    }

    #[test]
    fn a_worker_model_map_resolves_to_a_lifecycle_config_without_a_default_backend() {
        let worker = worker_of(
            r#"
            [worker.lifecycle]
            max_loaded_models = 2
            session_restart = true
            [worker.model_map."qwen2.5:7b"]
            llama_server = "/opt/llama-server"
            model_file = "/models/q.gguf"
            idle_timeout_secs = 60
            "#,
        )
        .unwrap();
        let lifecycle = worker
            .lifecycle
            .expect("a model map gives a lifecycle config");
        assert_eq!(lifecycle.model_names(), ["qwen2.5:7b"]);
        assert_eq!(lifecycle.max_loaded_models, Some(2));
        assert!(lifecycle.session_restart);
        assert!(matches!(worker.backends, Backends::Fixed(ref urls) if urls.is_empty()));

        let without_map = worker_of("[worker.lifecycle]\nmax_loaded_models = 2\n").unwrap();
        assert!(
            without_map.lifecycle.is_none(),
            "no model map, no lifecycle"
        );
        let with_backend = worker_of(
            "[worker]\nbackend_url = \"http://b:1\"\n[worker.model_map.m]\nstart_script = \"s\"\n",
        )
        .unwrap();
        assert!(
            matches!(with_backend.backends, Backends::Fixed(ref urls) if urls == &["http://b:1".to_string()])
        );
    }

    #[test]
    fn an_invalid_model_map_is_rejected_with_the_entry_named() {
        let error = worker_of("[worker.model_map.m]\nllama_server = \"x\"\n").unwrap_err();
        assert!(error.to_string().contains("needs a model_file"), "{error}");
        let error =
            worker_of("[worker.model_map.m]\nstart_script = \"s\"\nbogus = 1\n").unwrap_err();
        assert!(error.to_string().contains("bogus"), "{error}");
    }

    #[test]
    fn responses_store_bounds_come_from_the_proxy_section() {
        let defaults = proxy_config(&ProxyArgs::default(), &FileConfig::default(), "s".into())
            .unwrap()
            .responses_store;
        assert_eq!(defaults.ttl, Duration::from_secs(3600));
        assert_eq!((defaults.max_entries, defaults.max_bytes), (1000, 64 << 20));
        let file = parse_file(
            "[proxy]\nresponses_store_ttl_secs = 60\nresponses_store_max_entries = 5\nresponses_store_max_bytes = 1024\n",
        )
        .unwrap();
        let limits = proxy_config(&ProxyArgs::default(), &file, "s".into())
            .unwrap()
            .responses_store;
        assert_eq!(limits.ttl, Duration::from_secs(60));
        assert_eq!((limits.max_entries, limits.max_bytes), (5, 1024));
    }

    #[test]
    fn native_route_overrides_come_from_the_worker_section() {
        let file = parse_file("[worker]\nnative_messages = false\n").unwrap();
        let worker = worker_config(
            &WorkerArgs::default(),
            &ProxyArgs::default(),
            &file,
            "s".into(),
            None,
        )
        .unwrap();
        assert_eq!(worker.native_routes.messages, Some(false));
        assert_eq!(worker.native_routes.responses, None, "absent means probe");
    }

    #[test]
    fn model_aliases_and_the_default_model_come_from_the_proxy_section() {
        let file = parse_file(
            "[proxy]\ndefault_model = \"qwen\"\n[proxy.aliases]\n\"claude-*\" = \"coder\"\n",
        )
        .unwrap();
        let aliases = proxy_config(&ProxyArgs::default(), &file, "s".into())
            .unwrap()
            .aliases;
        assert_eq!(aliases.resolve("claude-opus-5-5", |_| false), Some("coder"));
        assert_eq!(aliases.resolve("gpt-4o", |_| false), Some("qwen"));
        let empty = parse_file("[proxy.aliases]\nx = \"\"\n").unwrap();
        let error = proxy_config(&ProxyArgs::default(), &empty, "s".into()).unwrap_err();
        assert!(error.to_string().contains("empty model name"), "{error}");
    }

    #[test]
    fn tls_comes_from_flags_over_the_file_and_conflicts_are_named() {
        let none = FileConfig::default();
        assert_eq!(
            tls_setting(&ProxyArgs::default(), &none).unwrap(),
            TlsSetting::Off
        );
        let file = parse_file("[proxy]\ntls = \"self-signed\"\n").unwrap();
        assert_eq!(
            tls_setting(&ProxyArgs::default(), &file).unwrap(),
            TlsSetting::SelfSigned
        );
        let files = ProxyArgs {
            tls_cert: Some("c.pem".into()),
            tls_key: Some("k.pem".into()),
            ..ProxyArgs::default()
        };
        assert_eq!(
            tls_setting(&files, &file).unwrap(),
            TlsSetting::Files {
                cert: "c.pem".into(),
                key: "k.pem".into()
            },
            "flags win over the file"
        );
        let off = ProxyArgs {
            tls: Some(crate::cli::TlsMode::Off),
            ..ProxyArgs::default()
        };
        assert_eq!(tls_setting(&off, &file).unwrap(), TlsSetting::Off);
        let both = ProxyArgs {
            tls: Some(crate::cli::TlsMode::SelfSigned),
            ..files.clone()
        };
        let error = tls_setting(&both, &none).unwrap_err().to_string();
        assert!(error.contains("not both"), "{error}");
        let cert_only = ProxyArgs {
            tls_cert: Some("c.pem".into()),
            ..ProxyArgs::default()
        };
        let error = tls_setting(&cert_only, &none).unwrap_err().to_string();
        assert!(error.contains("TLS_KEY"), "{error}");
        let key_only = parse_file("[proxy]\ntls_key = \"k.pem\"\n").unwrap();
        let error = tls_setting(&ProxyArgs::default(), &key_only)
            .unwrap_err()
            .to_string();
        assert!(error.contains("[proxy] tls_cert"), "{error}");
        assert!(parse_file("[proxy]\ntls = \"maybe\"\n")
            .unwrap_err()
            .contains("self-signed"));
    }

    #[test]
    fn the_worker_pin_comes_from_the_file_or_the_flag() {
        let fingerprint = crate::tls::Fingerprint::of_der(b"cert");
        let file = parse_file(&format!(
            "[worker]\nproxy_fingerprint = \"{fingerprint}\"\n"
        ))
        .unwrap();
        let worker = worker_config(
            &WorkerArgs::default(),
            &ProxyArgs::default(),
            &file,
            "s".into(),
            None,
        )
        .unwrap();
        assert_eq!(worker.proxy_fingerprint, Some(fingerprint));
        let other = crate::tls::Fingerprint::of_der(b"other");
        let args = WorkerArgs {
            proxy_fingerprint: Some(other),
            ..WorkerArgs::default()
        };
        let worker = worker_config(&args, &ProxyArgs::default(), &file, "s".into(), None).unwrap();
        assert_eq!(worker.proxy_fingerprint, Some(other));
        let error = parse_file("[worker]\nproxy_fingerprint = \"abc\"\n").unwrap_err();
        assert!(error.contains("64 hex digits"), "{error}");
    }

    #[test]
    fn upstreams_are_read_checked_and_their_keys_found() {
        std::env::set_var("MODELRELAY_TEST_UPSTREAM_KEY", "sk-from-env");
        let file = parse_file(
            r#"
            [proxy]
            fallback_upstream = "claude"
            [[proxy.upstreams]]
            name = "openai"
            base_url = "https://api.openai.com/"
            api_key_env = "MODELRELAY_TEST_UPSTREAM_KEY"
            models = ["gpt-*"]
            [[proxy.upstreams]]
            name = "claude"
            kind = "anthropic"
            base_url = "https://api.anthropic.com"
            api_key = "sk-ant-inline"
            "#,
        )
        .unwrap();
        let config = proxy_config(&ProxyArgs::default(), &file, "s".into()).unwrap();
        assert_eq!(config.upstreams.len(), 2);
        assert_eq!(config.upstreams[0].base_url, "https://api.openai.com");
        assert_eq!(config.upstreams[0].api_key.as_deref(), Some("sk-from-env"));
        assert_eq!(
            config.upstreams[1].kind,
            crate::proxy::upstream::UpstreamKind::Anthropic
        );
        assert_eq!(config.fallback_upstream.as_deref(), Some("claude"));
        assert!(
            !format!("{config:?} {file:?}").contains("sk-"),
            "keys are redacted"
        );

        let bad = [
            ("[proxy]\nfallback_upstream = \"x\"\n", "names no"),
            (
                "[[proxy.upstreams]]\nname = \"a\"\nbase_url = \"api.x.com\"\n",
                "must start with http",
            ),
            (
                "[[proxy.upstreams]]\nname = \"a\"\nbase_url = \"http://x\"\napi_key_env = \"MODELRELAY_TEST_UNSET_VAR\"\n",
                "not set",
            ),
            (
                "[[proxy.upstreams]]\nname = \"a\"\nbase_url = \"http://x\"\n[[proxy.upstreams]]\nname = \"a\"\nbase_url = \"http://y\"\n",
                "a name of its own",
            ),
        ];
        for (text, expected) in bad {
            let file = parse_file(text).unwrap();
            let error = proxy_config(&ProxyArgs::default(), &file, "s".into()).unwrap_err();
            assert!(error.to_string().contains(expected), "{text}: {error}");
        }
    }
}
