//! What the environment and the command line say, as plain values: the top layer of the
//! settings. The command line (`cli.rs`) fills it from its flags, which read the environment
//! variables of the seeds and the published binaries; the desktop app passes its own.

use std::path::PathBuf;

use super::file::TlsMode;
use crate::fingerprint::Fingerprint;

/// Settings given by flags or environment variables; `None` leaves the layer below in charge.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `LISTEN_ADDR`.
    pub listen: Option<String>,
    /// `WORKER_SECRET` (or the contents of `WORKER_SECRET_FILE`): the proxy's secret, and the one
    /// a worker presents.
    pub worker_secret: Option<String>,
    /// `MODELRELAY_ADMIN_TOKEN`.
    pub admin_token: Option<String>,
    /// `FORWARD_CLIENT_AUTH`, for the proxy's default provider and for a worker.
    pub forward_client_auth: Option<bool>,
    /// `MODELRELAY_REQUIRE_API_KEYS`.
    pub require_api_keys: Option<bool>,
    /// `MODELRELAY_AFFINITY`.
    pub affinity: Option<bool>,
    /// `MODELRELAY_COST_ROUTING`.
    pub cost_routing: Option<bool>,
    /// `DATABASE_URL`.
    pub database_url: Option<String>,
    /// `MODELRELAY_ALLOWED_HOSTS`.
    pub allowed_hosts: Option<Vec<String>>,
    /// `MODELRELAY_CORS_ORIGINS`.
    pub cors_origins: Option<Vec<String>>,
    /// `MODELRELAY_METRICS_PUBLIC`.
    pub metrics_public: Option<bool>,
    /// `TLS_CERT`.
    pub tls_cert: Option<PathBuf>,
    /// `TLS_KEY`.
    pub tls_key: Option<PathBuf>,
    /// `MODELRELAY_TLS`.
    pub tls: Option<TlsMode>,
    /// `PROVIDER_NAME`: the proxy's default provider, and the one a worker joins.
    pub provider: Option<String>,
    /// `MAX_QUEUE_LEN`.
    pub max_queue_len: Option<usize>,
    /// `QUEUE_TIMEOUT_SECS`.
    pub queue_timeout_secs: Option<u64>,
    /// `REQUEST_TIMEOUT_SECS`.
    pub request_timeout_secs: Option<u64>,
    /// `MAX_CONNECTIONS`.
    pub max_connections: Option<usize>,
    /// `MAX_BODY_BYTES`.
    pub max_body_bytes: Option<usize>,
    /// `HEARTBEAT_INTERVAL_SECS`.
    pub heartbeat_interval_secs: Option<u64>,
    /// `HEARTBEAT_TIMEOUT_SECS`.
    pub heartbeat_timeout_secs: Option<u64>,
    /// `DRAIN_TIMEOUT_SECS` (the proxy's).
    pub drain_timeout_secs: Option<u64>,
    /// `PROXY_URL`.
    pub proxy_url: Option<String>,
    /// `PROXY_FINGERPRINT`.
    pub proxy_fingerprint: Option<Fingerprint>,
    /// `WORKER_NAME`.
    pub worker_name: Option<String>,
    /// `BACKEND_URL`: one URL, or several separated by commas.
    pub backend_url: Option<String>,
    /// `MODELS`: comma-separated; `*` asks the backend.
    pub models: Option<String>,
    /// `MAX_CONCURRENCY`.
    pub max_concurrency: Option<u32>,
    /// `PROTOCOL_VERSION`; `none` sends none.
    pub protocol_version: Option<String>,
    /// `WORKER_DRAIN_TIMEOUT_SECS`.
    pub worker_drain_timeout_secs: Option<u64>,
    /// `PROXY_SILENCE_TIMEOUT_SECS`.
    pub proxy_silence_timeout_secs: Option<u64>,
    /// `MODELRELAY_WAKE_TARGET`.
    pub wake_target: Option<String>,
    /// `MODELRELAY_SLEEPERS_REMEMBERED_SECS`.
    pub sleepers_remembered_secs: Option<u64>,
    /// `MODELRELAY_SLEEPS_WHEN_IDLE`.
    pub sleeps_when_idle: Option<bool>,
    /// `MODELRELAY_SLOT_HINTS`.
    pub slot_hints: Option<bool>,
    /// `MODELRELAY_MAC_ADDRESS`.
    pub mac_address: Option<String>,
}
