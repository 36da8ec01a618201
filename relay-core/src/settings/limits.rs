//! Plain values the runtime configurations are made of, with their defaults: a provider's queue
//! and timeouts, the Responses store's bounds, connection limits, which routes backends serve,
//! the roles a node runs and how it serves TLS.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::defaults;
use super::file::UpstreamKind;

/// Per-provider limits.
#[derive(Debug, Clone)]
pub struct ProviderLimits {
    /// Queued requests beyond this are refused with 429; 0 is no limit (the published relay's
    /// reading, which its runbook uses).
    pub max_queue_len: usize,
    /// How long a request may wait in the queue.
    pub queue_timeout: Duration,
    /// The whole lifetime of a request, fixed when it arrives.
    pub request_timeout: Duration,
    /// Models accepted from one worker; the rest are dropped with a warning.
    pub max_models_per_worker: usize,
    /// A disabled provider refuses workers and requests.
    pub enabled: bool,
    /// Models routed to this provider even while no worker serves them (they queue).
    pub models: Vec<String>,
}

impl Default for ProviderLimits {
    fn default() -> Self {
        ProviderLimits {
            max_queue_len: defaults::MAX_QUEUE_LEN,
            queue_timeout: defaults::QUEUE_TIMEOUT,
            request_timeout: defaults::REQUEST_TIMEOUT,
            max_models_per_worker: defaults::MAX_MODELS_PER_WORKER,
            enabled: true,
            models: Vec::new(),
        }
    }
}

/// How the proxy keeps and wakes sleeping boxes (see `proxy/sleepers.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SleeperLimits {
    /// A box asleep longer than this is forgotten (its models are no longer listed).
    pub remember: Duration,
    /// Most boxes remembered at once (0: sleeping boxes are not remembered).
    pub max_boxes: usize,
    /// At most one Wake-on-LAN packet per box per this interval.
    pub retry: Duration,
}

impl Default for SleeperLimits {
    fn default() -> Self {
        SleeperLimits {
            remember: defaults::SLEEPERS_REMEMBERED,
            max_boxes: defaults::MAX_SLEEPERS,
            retry: defaults::WAKE_RETRY,
        }
    }
}

/// Bounds of the Responses store behind `previous_response_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreLimits {
    /// How long a stored response can be continued or fetched.
    pub ttl: Duration,
    /// Most responses kept at once.
    pub max_entries: usize,
    /// Most bytes kept at once (approximate: the texts, images and JSON held).
    pub max_bytes: usize,
}

impl Default for StoreLimits {
    fn default() -> Self {
        StoreLimits {
            ttl: defaults::RESPONSES_STORE_TTL,
            max_entries: defaults::RESPONSES_STORE_MAX_ENTRIES,
            max_bytes: defaults::RESPONSES_STORE_MAX_BYTES,
        }
    }
}

impl StoreLimits {
    /// Whether anything can be stored at all.
    pub fn enabled(&self) -> bool {
        !self.ttl.is_zero() && self.max_entries > 0 && self.max_bytes > 0
    }
}

/// Limits on the proxy's connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Open connections (clients and workers) beyond which new ones are refused with a 503.
    pub max_connections: usize,
    /// Time a client has to send a request's head (and an idle keep-alive connection to start
    /// its next one).
    pub header_read_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: defaults::MAX_CONNECTIONS,
            header_read_timeout: defaults::HEADER_READ_TIMEOUT,
        }
    }
}

/// `[worker] native_messages` and `native_responses`: `Some` settles whether backends serve the
/// route themselves, `None` probes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NativeOverrides {
    /// Whether backends serve `/v1/messages` (and `/v1/messages/count_tokens`).
    pub messages: Option<bool>,
    /// Whether backends serve `/v1/responses`.
    pub responses: Option<bool>,
}

/// Which parts of the relay a node runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct Roles {
    /// Serves clients and accepts workers.
    pub proxy: bool,
    /// Runs a worker that joins a proxy (this node's own or another).
    pub worker: bool,
}

impl Default for Roles {
    fn default() -> Self {
        Roles {
            proxy: true,
            worker: true,
        }
    }
}

/// Whether and how the proxy serves TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsSetting {
    /// Plain HTTP.
    Off,
    /// A certificate chain and its private key, PEM files the user provides.
    Files {
        /// The certificate (chain), leaf first.
        cert: PathBuf,
        /// The private key (PKCS#8, PKCS#1 or SEC1).
        key: PathBuf,
    },
    /// A certificate this node generates once and stores in its data directory.
    SelfSigned,
}

/// One virtual provider: a pool of workers sharing a secret, a queue and timeouts.
#[derive(Clone)]
pub struct ProviderConfig {
    /// The name workers join with (`?provider=NAME`).
    pub name: String,
    /// The secret its workers present.
    pub secret: String,
    /// Queue and timeout limits.
    pub limits: ProviderLimits,
    /// Whether its workers get clients' `Authorization` and `x-api-key` (off by default: anyone
    /// with the worker secret could otherwise collect users' keys).
    pub forward_client_auth: bool,
}

impl std::fmt::Debug for ProviderConfig {
    // Written by hand so the secret can never reach a log through `{:?}`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderConfig")
            .field("name", &self.name)
            .field("secret", &"<redacted>")
            .field("limits", &self.limits)
            .finish()
    }
}

/// One upstream provider (`[[proxy.upstreams]]`).
#[derive(Clone, PartialEq, Eq)]
pub struct UpstreamConfig {
    /// Its name, for `fallback_upstream` and the logs.
    pub name: String,
    /// The API it speaks.
    pub kind: UpstreamKind,
    /// The base URL the routes are appended to (`https://api.openai.com`, without `/v1`).
    pub base_url: String,
    /// Sent as `Authorization: Bearer` (OpenAI) or `x-api-key` (Anthropic).
    pub api_key: Option<String>,
    /// Models it serves: exact names or glob patterns (`gpt-*`).
    pub models: Vec<String>,
}

impl fmt::Debug for UpstreamConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpstreamConfig")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("models", &self.models)
            .finish()
    }
}
