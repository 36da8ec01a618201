//! Finding local LLM backends and telling them apart.
//!
//! ModelRelay's zero-config promise is "start it and it serves whatever you
//! already run". For that we need to know which ports on this machine carry an
//! LLM server, what kind of server it is (the kinds differ in quirks the rest of
//! the relay cares about, and users want to see a familiar name in
//! `modelrelay discover`), and which models it serves. The same model listing
//! is what a worker re-fetches to keep its advertised models current.
//!
//! Fingerprints, strongest evidence first (sources in brackets):
//!
//! * `Server: llamafile/<version>` header or `owned_by: "llamafile"` in
//!   `/v1/models` → llamafile [llamafile `llamafile/server/client.cpp`,
//!   `llamafile/server/v1_models.cpp`]. Older llamafiles embed llama.cpp's own
//!   server and are indistinguishable from it, so they are reported as
//!   llama-server.
//! * `Server: llama.cpp` header (set on *every* response, even 404s and the
//!   503s sent while the model is still loading) or `owned_by: "llamacpp"` →
//!   llama-server [llama.cpp `tools/server`, `set_default_headers` and the
//!   `/v1/models` handler].
//! * `owned_by: "vllm"` (the default of vLLM's `ModelCard`) → vLLM
//!   [vllm `entrypoints/openai/protocol.py`]. vLLM's `GET /version` answers
//!   `{"version": …}`, but so do countless unrelated web apps, so it is not
//!   used as evidence.
//! * `GET /` answering `Ollama is running` → Ollama [ollama `server/routes.go`];
//!   failing that, `GET /api/version` (`{"version": …}`) together with
//!   `GET /api/tags` (`{"models": [{"name": …}]}`) on a server *without* an
//!   OpenAI listing [docs.ollama.com API reference]. The second rule must not
//!   apply to servers that also list models OpenAI-style, because llama.cpp and
//!   koboldcpp emulate `/api/tags` for Ollama clients.
//! * `owned_by: "organization_owner"` (what LM Studio puts on every model), or
//!   a list-shaped answer from LM Studio's own `GET /api/v0/models` → LM Studio
//!   [lmstudio.ai REST API v0 and OpenAI-compat docs]. Port 1234 alone is not
//!   evidence: other servers get moved there.
//! * Anything else with an OpenAI list (`{"object": "list", "data": [{"id": …}]}`)
//!   at `/v1/models` → OpenAI-compatible (koboldcpp, SGLang, TabbyAPI, Jan, …).
//! * A ModelRelay proxy (its `GET /health` JSON carries `workers_connected`) is
//!   never reported, even though it lists models: serving it from a relay would
//!   make the relay forward requests to itself.

use std::borrow::Cow;
use std::collections::HashSet;
use std::time::Duration;

use futures_util::future::join_all;
use serde_json::Value;

pub mod owner;
mod reply;
mod rest;
mod windows;

pub use owner::Owner;
pub use rest::{unloaded_models, Look, Unloads};
pub use windows::{fetch_context_windows, llama_cpp_props, ContextWindows};

use reply::*;

/// What kind of server answered.
///
/// Reported so users recognise what was found, and so callers can apply
/// per-server knowledge (e.g. Ollama's native model names) where it matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(test, derive(ts_rs::TS))]
pub enum BackendKind {
    /// llama.cpp's `llama-server` (also older llamafiles, which embed it).
    LlamaServer,
    /// Ollama.
    Ollama,
    /// vLLM's OpenAI-compatible server.
    Vllm,
    /// LM Studio's local server.
    LmStudio,
    /// Mozilla's llamafile with its own server (0.9 and later).
    Llamafile,
    /// Something that speaks the OpenAI model-listing API but that we could not
    /// pin down further; still perfectly usable as a backend.
    #[serde(rename = "openai_compatible")]
    OpenAiCompatible,
}

impl BackendKind {
    /// The name users know the server by, for `modelrelay discover` output and
    /// the desktop app.
    pub fn label(&self) -> &'static str {
        match self {
            BackendKind::LlamaServer => "llama-server",
            BackendKind::Ollama => "Ollama",
            BackendKind::Vllm => "vLLM",
            BackendKind::LmStudio => "LM Studio",
            BackendKind::Llamafile => "llamafile",
            BackendKind::OpenAiCompatible => "OpenAI-compatible",
        }
    }
}

/// A backend found on a port: enough to start serving it without further
/// questions.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct DiscoveredBackend {
    /// What kind of server it is.
    pub kind: BackendKind,
    /// Base URL without a trailing slash (e.g. `http://127.0.0.1:11434`), the
    /// form the worker joins API paths onto.
    pub url: String,
    /// Models it serves, de-duplicated, in the server's order. May be empty: a
    /// llama-server still loading its model is worth reporting, and its list
    /// can be fetched later with [`fetch_models`].
    pub models: Vec<String>,
    /// Who listens on its port ([`owner`]).
    pub owner: Owner,
    /// The box's owner confirmed it on the dashboard (`[worker] confirmed_backends`).
    pub confirmed: bool,
}

impl DiscoveredBackend {
    /// Whether a worker may send it requests: a server of the user running the relay, or one
    /// the owner confirmed. Anything else — another user's server on a well-known port — is
    /// shown on the dashboard but never sent a prompt.
    pub fn usable(&self) -> bool {
        self.owner == Owner::ThisUser || self.confirmed
    }
}

/// Where and how patiently to look.
#[derive(Debug, Clone)]
pub struct DiscoveryOptions {
    /// Host to probe; `127.0.0.1` by default because discovery is about this
    /// machine (and probing other hosts' ports uninvited is rude).
    pub host: String,
    /// Ports to probe; [`WELL_KNOWN_PORTS`] by default.
    pub ports: Vec<u16>,
    /// Upper bound for each port's whole probe. Local servers answer in
    /// milliseconds, so a short bound keeps `discover` snappy even when a port
    /// is held by something that never answers.
    pub timeout: Duration,
    /// Ports never to probe, e.g. the relay's own listening port.
    pub exclude_ports: Vec<u16>,
    /// Base URLs the box's owner confirmed although another user (or nobody known) listens
    /// there (`[worker] confirmed_backends`).
    pub confirmed: Vec<String>,
}

impl Default for DiscoveryOptions {
    fn default() -> Self {
        DiscoveryOptions {
            host: "127.0.0.1".to_owned(),
            ports: WELL_KNOWN_PORTS.to_vec(),
            timeout: Duration::from_millis(800),
            exclude_ports: Vec::new(),
            confirmed: Vec::new(),
        }
    }
}

/// Default ports of the local LLM servers people actually run.
///
/// Every port is probed concurrently, so the list costs little time, but each
/// entry must earn its place: a port no LLM server defaults to only produces
/// noise in other programs' logs. Deliberately left out: 7860, Gradio's port,
/// which serves web UIs (text-generation-webui's included), not an API.
pub const WELL_KNOWN_PORTS: &[u16] = &[
    1234,  // LM Studio
    1337,  // Jan's local API server
    5000,  // text-generation-webui's OpenAI API (--api-port), TabbyAPI
    5001,  // koboldcpp
    8000,  // vLLM (`vllm serve`)
    8001,  // the usual second vLLM, or vLLM moved off a busy 8000
    8080,  // llama-server and llamafile
    8081,  // llama-server instances 2-4: one server per model on consecutive
    8082,  // ports is a common llama.cpp setup
    8083,  //
    11434, // Ollama
    30000, // SGLang
];

/// Why a model list could not be fetched. Every message names the URL that
/// failed, because the person reading it usually has several backends.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// The base URL cannot be requested at all (typo, missing scheme); no
    /// point retrying.
    #[error("invalid backend URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Nothing accepted the connection: the backend is not running (or not on
    /// that port). Kept apart from other failures so callers can say "start
    /// your backend" rather than "your backend is broken".
    #[error("cannot connect to {url}: {reason}")]
    Connect {
        /// The URL requested.
        url: String,
        /// The operating system's reason, e.g. "Connection refused".
        reason: String,
    },
    /// The backend did not answer in time; it may be overloaded or hung.
    #[error("{url} did not answer in time")]
    Timeout {
        /// The URL requested.
        url: String,
    },
    /// The connection was made but the HTTP exchange failed (reset, not HTTP,
    /// body cut short).
    #[error("request to {url} failed: {reason}")]
    Request {
        /// The URL requested.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// The backend answered with an error status, e.g. 401 when it wants an
    /// API key or 404 when it has no such endpoint.
    #[error("{url} answered HTTP {}{}", status_text(.status), detail_suffix(.detail))]
    Status {
        /// The URL requested.
        url: String,
        /// The HTTP status code.
        status: u16,
        /// The start of the error body when it is readable text (often the
        /// backend's own explanation); empty otherwise.
        detail: String,
    },
    /// The backend answered 200 but not with a model list we can read.
    #[error("{url} did not return a model list: {reason}")]
    BadBody {
        /// The URL requested.
        url: String,
        /// What is wrong with the body.
        reason: String,
    },
    /// Neither the OpenAI nor the Ollama listing worked; both reasons are kept
    /// because either may be the one the user needs to fix.
    #[error("no model list at {base_url}: {openai}; {ollama}")]
    NoModelList {
        /// The backend's base URL.
        base_url: String,
        /// Why `GET /v1/models` failed.
        openai: Box<DiscoveryError>,
        /// Why `GET /api/tags` failed.
        ollama: Box<DiscoveryError>,
    },
}

fn status_text(status: &u16) -> String {
    match reqwest::StatusCode::from_u16(*status) {
        Ok(code) => code.to_string(),
        Err(_) => status.to_string(),
    }
}

fn detail_suffix(detail: &str) -> String {
    if detail.is_empty() {
        String::new()
    } else {
        format!(": {detail}")
    }
}

/// Probe every port concurrently (each probe bounded by `opts.timeout`
/// overall), return what answered, sorted by port.
///
/// Never fails: a port that is closed, slow, or held by something that is not
/// an LLM server is simply not in the result, because discovery is a best-effort
/// survey, not a health check.
pub async fn discover(opts: &DiscoveryOptions) -> Vec<DiscoveredBackend> {
    // Our own client, not the caller's: probes need short timeouts, must not be
    // sent through an HTTP proxy from the environment (that would probe the
    // proxy's machine, not ours), and must not follow redirects (a redirect to
    // somewhere else says nothing about this port).
    let client = match reqwest::Client::builder()
        .timeout(opts.timeout)
        .connect_timeout(opts.timeout)
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
    {
        Ok(client) => client,
        Err(err) => {
            tracing::warn!(error = %err, "cannot build an HTTP client for discovery");
            return Vec::new();
        }
    };

    let host = url_host(&opts.host);
    let mut seen = HashSet::new();
    let ports: Vec<u16> = opts
        .ports
        .iter()
        .copied()
        .filter(|port| *port != 0 && !opts.exclude_ports.contains(port) && seen.insert(*port))
        .collect();

    let probes = ports.into_iter().map(|port| {
        let client = &client;
        let url = format!("http://{host}:{port}");
        async move {
            // The client's timeout bounds each request; this bounds the whole
            // probe, which may make a second round of requests.
            let found = tokio::time::timeout(opts.timeout, probe(client, &url))
                .await
                .unwrap_or_else(|_| {
                    tracing::debug!(%url, "probe timed out");
                    None
                });
            (port, found)
        }
    });

    let local = matches!(
        opts.host.trim_matches(|c| c == '[' || c == ']'),
        "127.0.0.1" | "localhost" | "::1"
    );
    let mut found: Vec<(u16, DiscoveredBackend)> = join_all(probes)
        .await
        .into_iter()
        .filter_map(|(port, backend)| backend.map(|b| (port, b)))
        .map(|(port, mut backend)| {
            backend.owner = if local {
                owner::owner_of_port(port)
            } else {
                Owner::Unknown
            };
            backend.confirmed = opts
                .confirmed
                .iter()
                .any(|url| url.trim_end_matches('/') == backend.url);
            (port, backend)
        })
        .collect();
    found.sort_by_key(|(port, _)| *port);
    found.into_iter().map(|(_, backend)| backend).collect()
}

/// Probe one base URL; `None` if nothing LLM-like answers.
///
/// Makes at most two rounds of concurrent GETs: `/health`, `/v1/models` and
/// `/` first, which settle most servers; only a server not yet recognised is
/// asked about `/api/v0/models`, `/api/version` and `/api/tags`, so recognised
/// backends see few stray 404s in their logs. The time bound is the client's
/// (and the caller's): [`discover`] supplies both.
pub async fn probe(client: &reqwest::Client, base_url: &str) -> Option<DiscoveredBackend> {
    let base = normalize_base_url(base_url);
    let (health_url, listing_url, root_url) = (
        format!("{base}/health"),
        format!("{base}/v1/models"),
        format!("{base}/"),
    );
    let (health, listing, root) = tokio::join!(
        get(client, &health_url),
        get(client, &listing_url),
        get(client, &root_url),
    );
    let answers: Vec<&Reply> = [&health, &listing, &root]
        .into_iter()
        .filter_map(|r| r.as_ref().ok())
        .collect();
    if answers.is_empty() {
        if let Err(err) = &listing {
            tracing::trace!(url = %base, error = %err, "nothing answers");
        }
        return None;
    }
    if health.as_ref().is_ok_and(is_relay_proxy) {
        tracing::debug!(url = %base, "skipping a ModelRelay proxy");
        return None;
    }

    let server_headers: Vec<String> = answers
        .iter()
        .filter_map(|a| a.server.as_deref())
        .map(str::to_ascii_lowercase)
        .collect();
    let server_says = |needle: &str| server_headers.iter().any(|s| s.contains(needle));
    let list = listing.as_ref().ok().and_then(Reply::openai_list);
    let owned_by = |owner: &str| {
        list.as_ref()
            .is_some_and(|l| l.owners.iter().any(|o| o.eq_ignore_ascii_case(owner)))
    };
    let says_ollama = root
        .as_ref()
        .is_ok_and(|a| a.status.is_success() && a.text().contains("Ollama is running"));

    let kind = if server_says("llamafile") || owned_by("llamafile") {
        Some(BackendKind::Llamafile)
    } else if server_says("llama.cpp") || owned_by("llamacpp") {
        Some(BackendKind::LlamaServer)
    } else if owned_by("vllm") {
        Some(BackendKind::Vllm)
    } else if says_ollama {
        Some(BackendKind::Ollama)
    } else if owned_by("organization_owner") {
        Some(BackendKind::LmStudio)
    } else {
        None
    };
    let listed = list.map(|l| l.ids);

    if let Some(kind) = kind {
        let models = match listed {
            Some(ids) => ids,
            // Ollama before its OpenAI layer, or with no models (it then sends
            // `"data": null`), still has its native listing.
            None if kind == BackendKind::Ollama => get(client, &format!("{base}/api/tags"))
                .await
                .ok()
                .and_then(|a| a.ollama_tags())
                .unwrap_or_default(),
            None => Vec::new(),
        };
        return Some(found(kind, base, models));
    }

    let (v0_url, version_url, tags_url) = (
        format!("{base}/api/v0/models"),
        format!("{base}/api/version"),
        format!("{base}/api/tags"),
    );
    let (v0, version, tags) = tokio::join!(
        get(client, &v0_url),
        get(client, &version_url),
        get(client, &tags_url),
    );
    // Only LM Studio serves `/api/v0/models`; this catches it when its OpenAI
    // listing is empty and so carries no `owned_by`.
    if let Some(v0) = v0.ok().as_ref().and_then(Reply::openai_list) {
        return Some(found(BackendKind::LmStudio, base, listed.unwrap_or(v0.ids)));
    }
    if let Some(ids) = listed {
        return Some(found(BackendKind::OpenAiCompatible, base, ids));
    }
    let has_version = version
        .ok()
        .and_then(|a| a.json_ok())
        .is_some_and(|v| v.get("version").is_some_and(Value::is_string));
    if has_version {
        if let Some(names) = tags.ok().and_then(|a| a.ollama_tags()) {
            return Some(found(BackendKind::Ollama, base, names));
        }
    }
    tracing::trace!(url = %base, "answers, but not like an LLM server");
    None
}

/// The model names a backend serves: OpenAI `GET /v1/models` (`data[].id`),
/// falling back to Ollama's `GET /api/tags` (`models[].name`). Errors say what
/// went wrong (connection refused, HTTP status, unparseable body) and name the
/// URL.
///
/// The OpenAI listing comes first because every supported backend has it and
/// its names are the ones the backend accepts in OpenAI-style requests; the
/// Ollama listing covers Ollama versions without the OpenAI layer. The time
/// bound is the client's.
pub async fn fetch_models(
    client: &reqwest::Client,
    base_url: &str,
) -> Result<Vec<String>, DiscoveryError> {
    let base = normalize_base_url(base_url);
    check_base_url(&base)?;
    let openai_url = format!("{base}/v1/models");
    // A transport failure would repeat on the fallback (same host and port), so
    // only an HTTP-level failure is worth a second request.
    let answer = get(client, &openai_url).await?;
    let openai_err = match answer.openai_list_or_error(&openai_url) {
        Ok(list) => return Ok(list.ids),
        Err(err) => err,
    };

    let tags_url = format!("{base}/api/tags");
    let ollama_err = match get(client, &tags_url).await {
        Ok(answer) => match answer.ollama_tags_or_error(&tags_url) {
            Ok(names) => return Ok(names),
            Err(err) => err,
        },
        Err(err) => err,
    };
    Err(DiscoveryError::NoModelList {
        base_url: base,
        openai: Box::new(openai_err),
        ollama: Box::new(ollama_err),
    })
}

/// Most slots (`-np`) a llama-server answer is believed to have; a `/props` claiming more is
/// not taken for llama.cpp's.
pub const MAX_SLOTS: u32 = 256;

/// How many slots a llama.cpp server keeps (`-np`): `total_slots` of its `GET /props`, on an
/// answer that also carries its `Server: llama.cpp` header. `None` for every other server, and
/// for anything that does not look like llama.cpp's answer (a worker then sends no slot
/// hints, which those servers would not understand). The time bound is the caller's.
pub async fn fetch_slots(client: &reqwest::Client, base_url: &str) -> Option<u32> {
    let base = normalize_base_url(base_url);
    check_base_url(&base).ok()?;
    let answer = get(client, &format!("{base}/props")).await.ok()?;
    if !answer.signed_by_llama_cpp() {
        return None;
    }
    slots_of_props(&answer.json_ok()?)
}

/// `total_slots` of a llama-server `/props` answer, when it is a sane slot count.
pub(crate) fn slots_of_props(props: &Value) -> Option<u32> {
    let slots = props.get("total_slots")?.as_u64()?;
    (1..=u64::from(MAX_SLOTS))
        .contains(&slots)
        .then_some(slots as u32)
}

/// Model ids and their `owned_by` values from an OpenAI listing; the owners are
/// where servers sign their name.
struct ModelList {
    ids: Vec<String>,
    owners: Vec<String>,
}

fn parse_openai_list(value: &Value) -> Result<ModelList, String> {
    let object = value
        .as_object()
        .ok_or("expected a JSON object with a `data` array")?;
    let is_list = object.get("object").and_then(Value::as_str) == Some("list");
    let data: &[Value] = match object.get("data") {
        Some(Value::Array(items)) => items,
        // Ollama's OpenAI layer says `"data": null` when it has no models.
        Some(Value::Null) if is_list => &[],
        _ => return Err("expected an OpenAI model list with a `data` array".to_owned()),
    };
    // `{"data": []}` alone is too common a JSON shape to count as a model
    // list; real servers also say `"object": "list"`.
    if data.is_empty() && !is_list {
        return Err("expected an OpenAI model list (`\"object\": \"list\"`)".to_owned());
    }
    let mut ids = Vec::new();
    let mut owners = Vec::new();
    for item in data {
        if let Some(id) = item.get("id").and_then(Value::as_str) {
            ids.push(id.to_owned());
        }
        if let Some(owner) = item.get("owned_by").and_then(Value::as_str) {
            owners.push(owner.to_owned());
        }
    }
    let ids = dedup_names(ids);
    if ids.is_empty() && !data.is_empty() {
        return Err("no entry of `data` has a string `id`".to_owned());
    }
    Ok(ModelList { ids, owners })
}

fn parse_ollama_tags(value: &Value) -> Result<Vec<String>, String> {
    let models: &[Value] = match value.get("models") {
        Some(Value::Array(items)) => items,
        Some(Value::Null) => &[],
        _ => return Err("expected an Ollama model list with a `models` array".to_owned()),
    };
    let names: Vec<String> = models
        .iter()
        .filter_map(|m| {
            m.get("name")
                .or_else(|| m.get("model"))
                .and_then(Value::as_str)
        })
        .map(str::to_owned)
        .collect();
    let names = dedup_names(names);
    if names.is_empty() && !models.is_empty() {
        return Err("no entry of `models` has a string `name`".to_owned());
    }
    Ok(names)
}

/// Drops blank and repeated names, keeping the server's order: a server that
/// lists a model twice (aliases, several quantisations under one id) must not
/// make the relay advertise it twice.
fn dedup_names(names: Vec<String>) -> Vec<String> {
    let mut seen = HashSet::new();
    names
        .into_iter()
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty() && seen.insert(name.clone()))
        .collect()
}

fn is_relay_proxy(health: &Reply) -> bool {
    health
        .json()
        .is_ok_and(|v| contains_key(&v, "workers_connected"))
}

/// Looks at every level: the proxy's health document may nest its counters.
/// serde_json's recursion limit bounds the depth.
fn contains_key(value: &Value, key: &str) -> bool {
    match value {
        Value::Object(map) => map.contains_key(key) || map.values().any(|v| contains_key(v, key)),
        Value::Array(items) => items.iter().any(|v| contains_key(v, key)),
        _ => false,
    }
}

fn found(kind: BackendKind, url: String, models: Vec<String>) -> DiscoveredBackend {
    tracing::debug!(%url, kind = kind.label(), models = models.len(), "found a backend");
    DiscoveredBackend {
        kind,
        url,
        models,
        // Settled by `discover`, which knows the port; a lone probe vouches for nobody.
        owner: Owner::Unknown,
        confirmed: false,
    }
}

/// Rejects a base URL before any request, so the error quotes what the user
/// configured rather than the endpoint URL derived from it.
fn check_base_url(base: &str) -> Result<(), DiscoveryError> {
    let invalid = |reason: String| DiscoveryError::InvalidUrl {
        url: base.to_owned(),
        reason,
    };
    let parsed = reqwest::Url::parse(base).map_err(|err| invalid(err.to_string()))?;
    match parsed.scheme() {
        "http" | "https" => Ok(()),
        other => Err(invalid(format!(
            "scheme {other:?} is not http or https (did you leave out \"http://\"?)"
        ))),
    }
}

fn normalize_base_url(base_url: &str) -> String {
    base_url.trim().trim_end_matches('/').to_owned()
}

/// IPv6 literals need brackets in URLs (`http://[::1]:8080`).
fn url_host(host: &str) -> Cow<'_, str> {
    if host.contains(':') && !host.starts_with('[') {
        Cow::Owned(format!("[{host}]"))
    } else {
        Cow::Borrowed(host)
    }
}

#[cfg(test)]
mod tests;
