//! The node's part of the control API: settings, setup (discovery, join codes, joining) and the
//! model lifecycle of its own worker. The contract is `docs/admin-api.md`.

use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::from_fn_with_state;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use super::join_code::{self, JoinDetails};
use super::{Caller, Inner, Node, NodeError};
use crate::proxy::access::admin as auth;
use crate::proxy::access::admin::AdminAccess;
use crate::proxy::edge::answers::{api_error, ControlError};
use crate::proxy::edge::control_body as body;
use crate::settings::edit::{self as settings, SettingsValues};

/// How long "test connection" waits for the proxy.
const JOIN_TEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the routes find their node: built before the node exists (the node's proxy serves
/// them), filled in once it does. Weak, so the routes never keep a stopped node alive.
#[derive(Clone, Default)]
pub struct NodeSlot(Arc<OnceLock<Weak<Inner>>>);

impl NodeSlot {
    /// Points the routes at `node`.
    pub fn set(&self, node: &Node) {
        let _ = self.0.set(Arc::downgrade(&node.inner));
    }

    fn node(&self) -> Result<Node, ControlError> {
        self.0
            .get()
            .and_then(Weak::upgrade)
            .map(|inner| Node { inner })
            .ok_or_else(|| {
                api_error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "node_starting",
                    "the node is starting or stopping; retry in a moment",
                )
            })
    }
}

/// The node's control routes, behind the admin check.
pub fn routes(slot: NodeSlot, access: AdminAccess) -> Router {
    Router::new()
        .route("/api/settings", get(get_settings).put(put_settings))
        .route("/api/config", put(put_config))
        .route("/api/join", post(join))
        .route("/api/join/test", post(test_join))
        .route("/api/join-code", get(join_code))
        .route("/api/worker/rejoin", post(rejoin_worker))
        .route("/api/discovery", get(discover))
        .route("/api/lifecycle", get(lifecycle_status))
        .route("/api/lifecycle/{model}/{action}", post(lifecycle_action))
        .route(
            "/api/start-on-login",
            get(get_start_on_login).put(put_start_on_login),
        )
        // The guard runs first (the outer layer): a refused request's body is never read.
        .route_layer(axum::middleware::from_fn(body::deadline))
        .route_layer(from_fn_with_state(access, auth::guard))
        .with_state(slot)
}

type Answer = Result<Response, ControlError>;

fn invalid(message: impl Into<String>) -> ControlError {
    api_error(StatusCode::BAD_REQUEST, "invalid_settings", message)
}

fn node_error(error: NodeError) -> ControlError {
    match error {
        NodeError::Invalid(message) => invalid(message),
        NodeError::Forbidden(refusal) => ControlError(refusal),
        other => api_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "settings_not_applied",
            other.to_string(),
        ),
    }
}

fn json_body<T>(body: Result<Json<T>, JsonRejection>) -> Result<T, ControlError> {
    body.map(|Json(value)| value).map_err(|rejection| {
        api_error(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            format!("invalid request body: {}", rejection.body_text()),
        )
    })
}

/// `GET /api/settings`'s answer for `node` now.
fn settings_view(node: &Node) -> Answer {
    let path = node.config_path();
    let text = settings::read(path).map_err(|e| {
        api_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "config_unreadable",
            format!("cannot read {}: {e}", path.display()),
        )
    })?;
    let file = settings::validate(&text).map_err(|e| {
        api_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "config_invalid",
            format!("{} is not valid: {e}", path.display()),
        )
    })?;
    Ok(Json(SettingsAnswer {
        path: path.display().to_string(),
        toml: settings::redact(&text),
        settings: SettingsValues::of(&file),
        restart_required: node.restart_required(),
    })
    .into_response())
}

/// `GET /api/settings` (and what a change answers): the file, its text with secrets redacted,
/// the form's values, and the changes that wait for a restart.
#[derive(Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct SettingsAnswer {
    path: String,
    toml: String,
    settings: SettingsValues,
    restart_required: Vec<String>,
}

/// `GET`/`PUT /api/start-on-login`: whether this node has a login entry to switch (the desktop
/// app's), and its state as the OS reports it.
#[derive(Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct StartOnLoginState {
    available: bool,
    enabled: Option<bool>,
    /// Why the state could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(test, ts(optional))]
    error: Option<String>,
}

/// `GET /api/start-on-login` → `{"available": bool, "enabled": bool | null, "error": ...}`.
async fn get_start_on_login(State(slot): State<NodeSlot>) -> Answer {
    let node = slot.node()?;
    let Some(entry) = &node.inner.start_on_login else {
        return Ok(Json(StartOnLoginState {
            available: false,
            enabled: None,
            error: None,
        })
        .into_response());
    };
    Ok(Json(match entry.0.enabled() {
        Ok(enabled) => StartOnLoginState {
            available: true,
            enabled: Some(enabled),
            error: None,
        },
        Err(error) => StartOnLoginState {
            available: true,
            enabled: None,
            error: Some(error.to_string()),
        },
    })
    .into_response())
}

#[derive(Deserialize)]
struct StartOnLoginBody {
    enabled: bool,
}

/// `PUT /api/start-on-login {"enabled": bool}` → the state read back from the OS.
async fn put_start_on_login(
    State(slot): State<NodeSlot>,
    body: Result<Json<StartOnLoginBody>, JsonRejection>,
) -> Answer {
    let node = slot.node()?;
    let wanted = json_body(body)?;
    let Some(entry) = &node.inner.start_on_login else {
        return Err(api_error(
            StatusCode::NOT_FOUND,
            "start_on_login_unavailable",
            "start on login belongs to the desktop app; this node runs without it (use your \
             service manager, e.g. a systemd user unit)",
        ));
    };
    let enabled = entry.0.set_enabled(wanted.enabled).map_err(|error| {
        api_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "start_on_login_failed",
            format!("the login entry could not be changed: {error}"),
        )
    })?;
    Ok(Json(StartOnLoginState {
        available: true,
        enabled: Some(enabled),
        error: None,
    })
    .into_response())
}

async fn get_settings(State(slot): State<NodeSlot>) -> Answer {
    settings_view(&slot.node()?)
}

async fn put_settings(
    State(slot): State<NodeSlot>,
    headers: HeaderMap,
    body: Result<Json<Value>, JsonRejection>,
) -> Answer {
    let node = slot.node()?;
    let patch = json_body(body)?;
    node.save_settings(&patch, Caller::Request(&headers))
        .await
        .map_err(node_error)?;
    settings_view(&node)
}

#[derive(Deserialize)]
struct ConfigText {
    toml: String,
}

async fn put_config(
    State(slot): State<NodeSlot>,
    headers: HeaderMap,
    body: Result<Json<ConfigText>, JsonRejection>,
) -> Answer {
    let node = slot.node()?;
    let body = json_body(body)?;
    node.save_config_text(&body.toml, Caller::Request(&headers))
        .await
        .map_err(node_error)?;
    settings_view(&node)
}

/// A join target: a code, or a URL and secret.
#[derive(Deserialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
#[cfg_attr(test, ts(optional_fields))]
pub struct JoinRequest {
    code: Option<String>,
    proxy_url: Option<String>,
    secret: Option<String>,
    provider: Option<String>,
    /// The proxy's certificate fingerprint (a LAN proxy found by discovery shows it).
    fingerprint: Option<String>,
}

impl JoinRequest {
    fn details(self) -> Result<JoinDetails, ControlError> {
        if let Some(code) = self.code.filter(|c| !c.trim().is_empty()) {
            return join_code::decode(&code)
                .map_err(|m| api_error(StatusCode::BAD_REQUEST, "invalid_join_code", m));
        }
        let url = self
            .proxy_url
            .map(|u| u.trim().trim_end_matches('/').to_string())
            .filter(|u| !u.is_empty())
            .ok_or_else(|| invalid("give `proxy_url` and `secret`, or a join `code`"))?;
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(invalid(format!(
                "`proxy_url` {url:?} must start with http:// or https://"
            )));
        }
        let secret = self
            .secret
            .filter(|s| !s.is_empty())
            .ok_or_else(|| invalid("`secret` is required: the proxy's worker secret"))?;
        let fingerprint = self
            .fingerprint
            .filter(|f| !f.trim().is_empty())
            .map(|f| f.parse::<crate::fingerprint::Fingerprint>())
            .transpose()
            .map_err(|e| invalid(format!("`fingerprint`: {e}")))?;
        Ok(JoinDetails {
            fingerprint,
            urls: Vec::new(),
            url,
            secret,
            provider: self
                .provider
                .filter(|p| !p.trim().is_empty())
                .unwrap_or_else(|| crate::settings::defaults::PROVIDER.to_string()),
        })
    }
}

async fn test_join(body: Result<Json<JoinRequest>, JsonRejection>) -> Answer {
    let details = json_body(body)?.details()?;
    let (ok, message) = match first_reachable(&details).await {
        Ok(url) => (
            true,
            format!(
                "connected to {url} and the secret was accepted (provider {})",
                details.provider
            ),
        ),
        Err(message) => (false, message),
    };
    Ok(Json(JoinTestAnswer { ok, message }).into_response())
}

/// `POST /api/join/test`: whether the proxy accepted the secret, in words.
#[derive(Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct JoinTestAnswer {
    ok: bool,
    message: String,
}

/// The first of the join's URLs (in their order) that accepts the secret, all probed at once,
/// so this takes one probe's time at most; or why the first one failed.
async fn first_reachable(details: &JoinDetails) -> Result<String, String> {
    let attempts: Vec<JoinDetails> = details
        .candidates()
        .into_iter()
        .map(|url| JoinDetails {
            url,
            ..details.clone()
        })
        .collect();
    let answers = futures_util::future::join_all(attempts.iter().map(probe_proxy)).await;
    let mut first_error = None;
    for (attempt, answer) in attempts.into_iter().zip(answers) {
        match answer {
            Ok(()) => return Ok(attempt.url),
            Err(message) => {
                first_error.get_or_insert(message);
            }
        }
    }
    Err(first_error.unwrap_or_default())
}

/// Opens the proxy's worker WebSocket with the secret and hangs up: proves the URL, the
/// provider and the secret without registering.
pub async fn probe_proxy(details: &JoinDetails) -> Result<(), String> {
    let pin = details.fingerprint;
    let url = crate::worker::connect_url(&details.url, &details.provider, pin.is_some())?;
    let mut request = url
        .as_str()
        .into_client_request()
        .map_err(|e| format!("{} is not a usable proxy URL: {e}", details.url))?;
    request.headers_mut().insert(
        "x-worker-secret",
        details
            .secret
            .parse()
            .map_err(|_| "the secret contains characters a header cannot carry".to_string())?,
    );
    let attempt = tokio::time::timeout(
        JOIN_TEST_TIMEOUT,
        crate::worker::dial(request, pin, None),
    )
    .await
    .map_err(|_| {
        format!(
            "{} did not answer within {}s: check the address and that a firewall lets this machine reach it",
            details.url,
            JOIN_TEST_TIMEOUT.as_secs()
        )
    })?;
    if let Err(error) = &attempt {
        if let Some(message) = crate::worker::pin_mismatch_message(&details.url, error) {
            return Err(message);
        }
    }
    match attempt {
        Ok(mut socket) => {
            let _ = socket.close(None).await;
            Ok(())
        }
        Err(tungstenite::Error::Http(response)) => Err(match response.status().as_u16() {
            401 => "the proxy refused the secret: copy it again from the proxy's dashboard or start-up banner".to_string(),
            403 => "the proxy refused this worker (provider disabled, or this worker was drained)".to_string(),
            404 => format!("the proxy has no provider {:?}", details.provider),
            429 => "too many failed attempts from this address: wait a few seconds and retry".to_string(),
            503 => "the proxy is not accepting workers (its proxy role is off, or it is shutting down)".to_string(),
            status => format!("the proxy answered HTTP {status} instead of accepting a worker: is {} a ModelRelay proxy?", details.url),
        }),
        Err(tungstenite::Error::Io(error)) => Err(format!(
            "cannot reach {}: {error}; is the proxy running, and listening beyond loopback (--listen 0.0.0.0:PORT)?",
            details.url
        )),
        Err(error) => Err(format!("could not connect to {}: {error}", details.url)),
    }
}

async fn join(
    State(slot): State<NodeSlot>,
    headers: HeaderMap,
    body: Result<Json<JoinRequest>, JsonRejection>,
) -> Answer {
    let node = slot.node()?;
    let mut details = json_body(body)?.details()?;
    // A code naming several addresses: keep the first this box reaches (the worker pins the
    // certificate whichever it is); if none answers now, the first, and the worker retries it.
    // A single address is saved as given, unprobed, as before.
    if details.candidates().len() > 1 {
        if let Ok(reached) = first_reachable(&details).await {
            details.url = reached;
        }
    }
    let own = super::same_proxy(&details.url, &node.url());
    // Joining this node's own proxy needs no stored URL or secret: the defaults point there.
    let patch = if own {
        json!({"roles": {"worker": true}, "worker": {"proxy_url": null, "worker_secret": null, "proxy_fingerprint": null}})
    } else {
        // A join without a fingerprint removes an earlier pin (`null`), so it cannot outlive
        // the proxy it was for.
        json!({
            "roles": {"worker": true},
            "worker": {
                "proxy_url": details.url,
                "worker_secret": details.secret,
                "proxy_fingerprint": details.fingerprint,
            },
        })
    };
    node.save_settings(&patch, Caller::Request(&headers))
        .await
        .map_err(node_error)?;
    settings_view(&node)
}

/// The dashboard's "rejoin": a fresh worker after its proxy drained the last one.
async fn rejoin_worker(State(slot): State<NodeSlot>) -> Answer {
    let node = slot.node()?;
    let started = node.rejoin_worker().await.map_err(node_error)?;
    if !started {
        return Err(api_error(
            StatusCode::CONFLICT,
            "worker_role_off",
            "this node's worker role is off: turn on \"Run worker\" to join a proxy",
        ));
    }
    Ok(Json(json!({"ok": true})).into_response())
}

async fn join_code(State(slot): State<NodeSlot>) -> Answer {
    let node = slot.node()?;
    if !node.roles().proxy {
        return Err(api_error(
            StatusCode::NOT_FOUND,
            "proxy_role_off",
            "this node does not run a proxy, so other boxes cannot join it",
        ));
    }
    let urls = node.join_urls();
    let details = JoinDetails {
        url: urls[0].clone(),
        secret: node.secret().to_string(),
        provider: node.provider().to_string(),
        fingerprint: node.fingerprint(),
        urls: if urls.len() > 1 { urls } else { Vec::new() },
    };
    Ok(Json(JoinCodeAnswer {
        urls: details.candidates(),
        code: join_code::encode(&details),
        url: details.url,
        secret: details.secret,
        provider: details.provider,
        fingerprint: details.fingerprint,
    })
    .into_response())
}

/// `GET /api/join-code`: how another box joins this node's proxy.
#[derive(Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct JoinCodeAnswer {
    /// Every URL it may be reached at, best first: LAN addresses, then `HOST.local`.
    urls: Vec<String>,
    /// The one other machines reach best (never a wildcard address).
    url: String,
    secret: String,
    provider: String,
    /// Present when the proxy serves TLS with its own certificate.
    #[cfg_attr(test, ts(type = "string | null"))]
    fingerprint: Option<crate::fingerprint::Fingerprint>,
    code: String,
}

async fn discover(State(slot): State<NodeSlot>) -> Answer {
    let node = slot.node()?;
    let (backends, proxies) = node.discover().await;
    let backends = backends
        .iter()
        .map(|b| FoundBackend {
            kind: b.kind,
            label: b.kind.label(),
            url: b.url.clone(),
            models: b.models.clone(),
            owner: b.owner,
            confirmed: b.confirmed,
            usable: b.usable(),
        })
        .collect();
    Ok(Json(DiscoveryAnswer { backends, proxies }).into_response())
}

/// `GET /api/discovery`: model servers on this machine and proxies on the LAN.
#[derive(Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct DiscoveryAnswer {
    backends: Vec<FoundBackend>,
    proxies: Vec<crate::lan::LanProxy>,
}

/// A model server discovery found.
#[derive(Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct FoundBackend {
    kind: crate::discovery::BackendKind,
    /// Its kind, as people call it.
    label: &'static str,
    url: String,
    models: Vec<String>,
    /// Who listens on its port.
    owner: crate::discovery::Owner,
    /// Confirmed by the box's owner (`worker.confirmed_backends`).
    confirmed: bool,
    /// The worker sends it requests: this user's server, or a confirmed one.
    usable: bool,
}

fn lifecycle(node: &Node) -> Option<crate::lifecycle::LifecycleManager> {
    node.worker_report()?.lifecycle()
}

async fn lifecycle_status(State(slot): State<NodeSlot>) -> Answer {
    let node = slot.node()?;
    let mut models = lifecycle(&node).map(|m| m.status()).unwrap_or_default();
    models.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Json(json!({"models": models})).into_response())
}

async fn lifecycle_action(
    State(slot): State<NodeSlot>,
    Path((model, action)): Path<(String, String)>,
) -> Answer {
    let node = slot.node()?;
    let manager = lifecycle(&node)
        .filter(|m| m.has_model(&model))
        .ok_or_else(|| {
            api_error(
                StatusCode::NOT_FOUND,
                "model_not_mapped",
                format!("model {model:?} is not in this node's worker model map"),
            )
        })?;
    let result = match action.as_str() {
        "load" => manager.load(&model).await,
        "unload" => manager.unload(&model).await,
        other => {
            return Err(api_error(
                StatusCode::NOT_FOUND,
                "unknown_action",
                format!("unknown lifecycle action {other:?}: use load or unload"),
            ))
        }
    };
    result.map_err(|e| api_error(StatusCode::BAD_GATEWAY, "lifecycle_failed", e.to_string()))?;
    let status = manager.status().into_iter().find(|s| s.name == model);
    Ok(Json(json!({"ok": true, "model": status})).into_response())
}
