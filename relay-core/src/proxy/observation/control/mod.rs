//! The control API under `/api/` (live status, admin actions) and the embedded web UI at `/`.
//! The contract is `docs/admin-api.md`; the node adds its settings and setup routes beside these.

pub mod assets;
pub mod status;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::middleware::from_fn_with_state;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;
use serde_json::json;

use crate::lifecycle::ModelStatus;
use crate::proxy::access::admin::AdminAccess;
use crate::proxy::edge::answers::api_error;
use crate::proxy::AppState;

pub use crate::settings::Roles;

/// The state of a node's own worker role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(test, derive(ts_rs::TS))]
pub enum OwnWorkerState {
    /// The worker role is off.
    Off,
    /// Connecting or registering.
    Connecting,
    /// Registered with its proxy.
    Connected,
    /// Its connection failed or dropped; retrying.
    Disconnected,
    /// Its proxy drained it (`graceful_shutdown`): it finished its requests and waits for a
    /// rejoin (`POST /api/worker/rejoin`) instead of reconnecting by itself.
    Drained,
}

/// The node's own worker, as the dashboard shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct OwnWorker {
    /// Its state.
    pub state: OwnWorkerState,
    /// The proxy it joins, while the role is on.
    pub proxy_url: Option<String>,
    /// Its name.
    pub name: Option<String>,
    /// Why its last connection failed, if it did.
    pub last_error: Option<String>,
    /// This box's CPU, memory and GPUs at the worker's last sample (absent while it samples
    /// nothing).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(test, ts(optional))]
    pub hardware: Option<crate::protocol::HardwareReport>,
}

/// What the node embedding this proxy reports about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct NodeInfo {
    /// The base URL clients use.
    pub url: String,
    /// The listen address.
    pub listen: String,
    /// Its roles.
    pub roles: Roles,
    /// Its own worker.
    pub worker: OwnWorker,
    /// The model map of its own worker (llama-server processes started on demand), pushed on
    /// every change; empty without a worker or a model map.
    pub lifecycle: Vec<ModelStatus>,
}

impl NodeInfo {
    /// A proxy with no worker of its own, at `addr`.
    pub fn proxy_only(addr: std::net::SocketAddr) -> Self {
        NodeInfo {
            url: format!("http://{addr}"),
            listen: addr.to_string(),
            roles: Roles {
                proxy: true,
                worker: false,
            },
            worker: OwnWorker {
                state: OwnWorkerState::Off,
                proxy_url: None,
                name: None,
                last_error: None,
                hardware: None,
            },
            lifecycle: Vec::new(),
        }
    }
}

/// Shared node information; the node updates it, the status feed reads it.
pub type SharedNodeInfo = Arc<tokio::sync::watch::Sender<NodeInfo>>;

/// The control routes the proxy serves itself, behind the admin check.
pub fn routes(access: AdminAccess) -> Router<AppState> {
    Router::new()
        .route("/api/status", get(status::get_status))
        .route("/api/events", get(status::events))
        .route("/api/workers/{id}/drain", post(drain_worker))
        .route("/api/models/refresh", post(refresh_models))
        .merge(crate::proxy::observation::admin::dashboard_routes())
        // The guard runs first (the outer layer): a refused request's body is never read.
        .route_layer(axum::middleware::from_fn(
            crate::proxy::edge::control_body::deadline,
        ))
        .route_layer(from_fn_with_state(
            access,
            crate::proxy::access::admin::guard,
        ))
}

async fn drain_worker(State(state): State<AppState>, Path(id): Path<String>) -> Response {
    if state.hub.drain_worker(&id) {
        (StatusCode::ACCEPTED, Json(json!({"ok": true}))).into_response()
    } else {
        api_error(
            StatusCode::NOT_FOUND,
            "worker_not_found",
            format!("no connected worker has id {id}"),
        )
        .into_response()
    }
}

async fn refresh_models(State(state): State<AppState>) -> Response {
    let workers = state.hub.refresh_models("requested from the dashboard");
    (
        StatusCode::ACCEPTED,
        Json(json!({"ok": true, "workers": workers})),
    )
        .into_response()
}

/// Adds one chart point a second for as long as the hub lives.
pub fn spawn_sampler(hub: &Arc<crate::proxy::dispatch::hub::Hub>) {
    let hub = Arc::downgrade(hub);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tick.tick().await;
            let Some(hub) = hub.upgrade() else { return };
            let depth = hub.queue_depths().iter().map(|(_, d)| d).sum();
            hub.telemetry()
                .sample(crate::proxy::dispatch::telemetry::unix_ms() / 1000, depth);
        }
    });
}
