//! The config file as people write it: every field optional, unknown keys refused (a typo is an
//! error, not a silently ignored setting). The flags and environment variables keep the names of
//! the seeds and the published ModelRelay binaries; the file uses the same names in snake case,
//! grouped under `[proxy]` and `[worker]`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use crate::fingerprint::Fingerprint;
use crate::lifecycle::config::{LifecycleFile, ModelFile};

/// `--tls` / `MODELRELAY_TLS` / `[proxy] tls`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum TlsMode {
    /// A certificate generated once and stored in the data directory.
    SelfSigned,
    /// Plain HTTP.
    Off,
}

/// The API an upstream speaks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum UpstreamKind {
    /// OpenAI's API, or a compatible one (Groq, DeepSeek, OpenRouter, vLLM, ...): chat
    /// completions always; `/v1/messages` and `/v1/responses` are probed and translated.
    #[default]
    #[serde(rename = "openai")]
    OpenAi,
    /// Anthropic's API: `/v1/messages` and `/v1/messages/count_tokens` natively; OpenAI Chat
    /// Completions and Responses requests are translated to Messages.
    #[serde(rename = "anthropic")]
    Anthropic,
}

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
    /// Worker connections accepted at once.
    pub max_workers: Option<usize>,
    /// Seconds a client has to send a request's body.
    pub body_read_timeout_secs: Option<u64>,
    /// Request body bytes held at once (being read, queued or on a worker).
    pub max_request_bytes_in_flight: Option<usize>,
    /// Seconds a client has to send a request's head (and an idle keep-alive connection to
    /// start its next one).
    pub header_read_timeout_secs: Option<u64>,
    /// `MAX_STREAM_BYTES`.
    pub max_stream_bytes: Option<u64>,
    /// Stream bytes that may wait for a slow client, per request.
    pub max_buffered_stream_bytes: Option<usize>,
    /// `HEARTBEAT_INTERVAL_SECS`.
    pub heartbeat_interval_secs: Option<u64>,
    /// `HEARTBEAT_TIMEOUT_SECS`.
    pub heartbeat_timeout_secs: Option<u64>,
    /// `DRAIN_TIMEOUT_SECS`.
    pub drain_timeout_secs: Option<u64>,
    /// No longer used: a cancel frees the worker's slot at once (the seeds' architecture). Still
    /// read, so config files that set it keep loading.
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
    /// `MODELRELAY_REQUIRE_API_KEYS`: inference requests need a client API key.
    pub require_api_keys: Option<bool>,
    /// `MODELRELAY_AFFINITY`: a conversation's next turn prefers the worker that served it last.
    pub affinity: Option<bool>,
    /// `MODELRELAY_COST_ROUTING`: measured speeds may send a request to a faster box than the
    /// usual rules pick.
    pub cost_routing: Option<bool>,
    /// `DATABASE_URL`: keep keys and usage in this PostgreSQL database instead of the SQLite
    /// file in the data directory.
    pub database_url: Option<String>,
    /// `MODELRELAY_ALLOWED_HOSTS`: host names besides this machine's that requests may carry.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// `MODELRELAY_CORS_ORIGINS`: web origins allowed to call `/v1` from a browser.
    #[serde(default)]
    pub cors_origins: Vec<String>,
    /// `MODELRELAY_METRICS_PUBLIC`: `/metrics` without the admin token.
    pub metrics_public: Option<bool>,
    /// `[[proxy.upstreams]]`: HTTP APIs the proxy calls itself for models no worker serves.
    #[serde(default)]
    pub upstreams: Vec<UpstreamFile>,
    /// The upstream that takes models nobody serves and requests whose queue is full.
    pub fallback_upstream: Option<String>,
    /// `MODELRELAY_TLS`: `self-signed` (generated once, kept in the data directory) or `off`.
    pub tls: Option<TlsMode>,
    /// `TLS_CERT`: a PEM certificate to serve HTTPS with.
    pub tls_cert: Option<PathBuf>,
    /// `TLS_KEY`: the PEM private key of `tls_cert`.
    pub tls_key: Option<PathBuf>,
    /// `MODELRELAY_WAKE_TARGET`: where Wake-on-LAN packets go (`IP:PORT`, usually the LAN's
    /// broadcast address on port 9).
    pub wake_target: Option<String>,
    /// `MODELRELAY_SLEEPERS_REMEMBERED_SECS`: how long a sleeping box is remembered.
    pub sleepers_remembered_secs: Option<u64>,
    /// Sleeping boxes remembered at once (0 forgets boxes as soon as they leave).
    pub max_sleepers: Option<usize>,
    /// Seconds between two Wake-on-LAN packets to the same box.
    pub wake_retry_secs: Option<u64>,
}

/// `[[proxy.upstreams]]` in the config file. Not `Debug`: it may hold an API key.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamFile {
    /// Its name.
    pub name: String,
    /// `openai` (default; any OpenAI-compatible API) or `anthropic`.
    #[serde(default)]
    pub kind: UpstreamKind,
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
    pub proxy_fingerprint: Option<Fingerprint>,
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
    /// Backend routes forwarded besides the inference routes (e.g. `["/api/generate"]`): only
    /// the box's owner adds them, here in the file.
    pub extra_routes: Option<Vec<String>>,
    /// Model servers found on this machine that another user runs, which the box's owner
    /// confirmed on the dashboard: discovery uses them like the owner's own.
    pub confirmed_backends: Option<Vec<String>>,
    /// `PROVIDER_NAME` to join.
    pub provider: Option<String>,
    /// `PROTOCOL_VERSION` announced in `register`.
    pub protocol_version: Option<String>,
    /// Seconds between re-reads of the backends' model lists.
    pub model_refresh_secs: Option<u64>,
    /// `DRAIN_TIMEOUT_SECS` on SIGTERM.
    pub drain_timeout_secs: Option<u64>,
    /// `PROXY_SILENCE_TIMEOUT_SECS`: reconnect after hearing nothing from the proxy this long.
    pub proxy_silence_timeout_secs: Option<u64>,
    /// `MODELRELAY_SLEEPS_WHEN_IDLE`: this box suspends when idle; the proxy keeps its models
    /// listed as asleep when it leaves, and wakes it with Wake-on-LAN.
    pub sleeps_when_idle: Option<bool>,
    /// `MODELRELAY_SLOT_HINTS`: keep each conversation in one llama-server slot (`id_slot`).
    pub slot_hints: Option<bool>,
    /// Tokens one request may hold, for backends that do not say (Ollama keeps it per request):
    /// reported to the proxy, which routes long prompts by it.
    pub context_window: Option<u32>,
    /// `MODELRELAY_MAC_ADDRESS`: the network card the proxy wakes (found by itself on Linux).
    pub mac_address: Option<String>,
    /// `MODELRELAY_WAKE_TARGET`: where this worker sends the Wake-on-LAN packets the proxy asks
    /// it to relay to sleeping boxes on its LAN (IP:PORT, the LAN's broadcast address).
    pub wake_target: Option<String>,
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
