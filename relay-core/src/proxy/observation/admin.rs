//! The published admin API under `/admin/` (workers, stats, client API keys, usage), for the
//! scripts and dashboards written against the published ModelRelay, and the same key and usage
//! handlers under `/api/` for the web UI.
//!
//! `/admin/*` follows the published rule ([`AdminAccess::check_admin_api`]: 403 unless the
//! configured admin token is sent); `/api/*` follows the control API's (open on loopback, the
//! token beyond it), like the rest of the dashboard.

use std::net::SocketAddr;
use std::time::Instant;

use axum::extract::{ConnectInfo, Path, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::dialect::{ApiError, Dialect};
use crate::proxy::access::admin::WRONG_ADMIN_TOKEN_CODE;
use crate::proxy::observation::control::status;
use crate::proxy::AppState;
use crate::store::dates::{day_of, now_ms, parse_time};
use crate::store::usage::{to_csv, GroupBy, UsageQuery, ANONYMOUS};
use crate::store::{KeyError, KeyView, NewKey};

/// Days a usage query covers when it names no start.
const DEFAULT_USAGE_DAYS: i64 = 30;

/// `/admin/*`, behind the published admin rule. Every field the published ModelRelay returns
/// is there with its name and type (scripts written for it work unchanged); ours stay beside.
pub fn admin_routes(state: AppState) -> Router<AppState> {
    Router::new()
        .route("/admin/workers", get(workers))
        .route("/admin/stats", get(stats))
        .route(
            "/admin/keys",
            get(published_list_keys).post(published_create_key),
        )
        .route("/admin/keys/{id}", delete(revoke_key))
        .route("/admin/usage", get(usage))
        .route_layer(from_fn_with_state(state, admin_guard))
}

/// The key and usage routes of the web UI, mounted with the control API (behind its rule).
pub fn dashboard_routes() -> Router<AppState> {
    Router::new()
        .route("/api/keys", get(list_keys).post(dashboard_create_key))
        .route("/api/keys/{id}", delete(dashboard_revoke_key))
        .route("/api/usage", get(usage))
}

/// While keys are required, a key opens the relay: making or revoking one from the dashboard
/// then needs the admin token even where the dashboard is open (loopback), or any local user
/// could mint themselves a way past the requirement.
fn key_change_allowed(state: &AppState, headers: &HeaderMap, what: &str) -> Result<(), ApiError> {
    if state.config.require_api_keys {
        state.admin.elevated(headers, what)
    } else {
        Ok(())
    }
}

async fn dashboard_create_key(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if let Err(refused) = key_change_allowed(&state, &headers, "Creating an API key") {
        return api_error(refused);
    }
    create_key(State(state), body).await
}

async fn dashboard_revoke_key(
    State(state): State<AppState>,
    headers: HeaderMap,
    id: Path<String>,
) -> Response {
    if let Err(refused) = key_change_allowed(&state, &headers, "Revoking an API key") {
        return api_error(refused);
    }
    revoke_key(State(state), id).await
}

/// Refuses `/admin/*` without the configured token; after repeated wrong tokens from one address
/// every token from it is refused for a while (the proxy's one failure limiter, shared with
/// every other credential check), so the token cannot be guessed at network speed.
async fn admin_guard(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
    next: Next,
) -> Response {
    let ip = peer.ip();
    let now = Instant::now();
    if let Err(wait) = state.limiter.check(ip, now) {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "admin_locked_out",
            format!(
                "too many wrong credentials from this address; retry in {} s",
                wait.as_secs().max(1)
            ),
        )
        .retry_after(wait)
        .into_response(Dialect::OpenAi);
    }
    match state.admin.check_admin_api(request.headers()) {
        Ok(()) => {
            let mut response = next.run(request).await;
            // Answers carry key metadata, usage and, once, a key's secret: never cached.
            response.headers_mut().insert(
                header::CACHE_CONTROL,
                axum::http::HeaderValue::from_static("no-store"),
            );
            response
        }
        Err(error) => {
            if error.code == WRONG_ADMIN_TOKEN_CODE {
                state.limiter.record_failure(ip, now);
            }
            error.into_response(Dialect::OpenAi)
        }
    }
}

fn api_error(error: ApiError) -> Response {
    error.into_response(Dialect::OpenAi)
}

/// `GET /admin/workers`: every connected worker, as the dashboard lists them, with the
/// published fields (`worker_id`, `worker_name`, `reported_load`, `in_flight_count`,
/// `is_draining`) beside ours.
async fn workers(State(state): State<AppState>) -> Response {
    let status = serde_json::to_value(status::snapshot(&state)).unwrap_or_default();
    let snapshots = state.hub.workers();
    let workers: Vec<Value> = status["workers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|view| {
            let mut entry = view.clone();
            if let Some(worker) = snapshots.iter().find(|w| view["id"] == w.id.as_str()) {
                entry["worker_id"] = json!(worker.id);
                entry["worker_name"] = json!(worker.name);
                // What the worker itself reports running: the proxy's requests and any other.
                entry["reported_load"] = json!(worker.in_flight + worker.external_load);
                entry["in_flight_count"] = json!(worker.in_flight);
                entry["is_draining"] = json!(worker.draining);
            }
            entry
        })
        .collect();
    Json(json!({"workers": workers})).into_response()
}

/// `GET /admin/stats`: totals since start, queues and what runs now.
async fn stats(State(state): State<AppState>) -> Response {
    let status = serde_json::to_value(status::snapshot(&state)).unwrap_or_default();
    let depths: serde_json::Map<String, Value> = state
        .hub
        .queue_depths()
        .into_iter()
        .map(|(provider, depth)| (provider, json!(depth)))
        .collect();
    let depth: u64 = depths.values().filter_map(Value::as_u64).sum();
    let workers = status["workers"].as_array().map_or(0, Vec::len);
    let telemetry = state.hub.telemetry();
    Json(json!({
        "uptime_secs": status["node"]["uptime_secs"],
        // The published names: connected workers, and the depth per provider.
        "active_workers": workers,
        "queue_depth": depths,
        "workers_connected": workers,
        "queue_depth_total": depth,
        "queues": status["queues"],
        "in_flight": status["in_flight"].as_array().map_or(0, Vec::len),
        "totals": status["totals"],
        "client_auth_failures": telemetry.counters().client_auth_failures,
        "usage_records_dropped": state.usage.dropped(),
    }))
    .into_response()
}

async fn list_keys(State(state): State<AppState>) -> Response {
    let keys: Vec<KeyView> = state
        .keys
        .list()
        .iter()
        .map(|k| KeyView::from(&**k))
        .collect();
    Json(json!({"keys": keys})).into_response()
}

/// A key as the published `/admin/keys` shows it: times in epoch seconds, `revoked`, and the
/// secret as `secret` (once, on creation); our fields stay beside (`key` for the secret).
fn published_key(view: &KeyView) -> Value {
    let seconds = |time: &Option<String>| {
        time.as_deref()
            .and_then(crate::store::dates::parse_time)
            .map(|ms| ms / 1000)
    };
    let mut key = serde_json::to_value(view).unwrap_or_default();
    key["created_at"] = json!(seconds(&Some(view.created_at.clone())));
    key["last_used_at"] = json!(seconds(&view.last_used_at));
    key["revoked_at"] = json!(seconds(&view.revoked_at));
    key["revoked"] = json!(view.revoked_at.is_some());
    if let Some(secret) = &view.key {
        key["secret"] = json!(secret);
    }
    key
}

/// `GET /admin/keys` in the published shape.
async fn published_list_keys(State(state): State<AppState>) -> Response {
    let keys: Vec<Value> = state
        .keys
        .list()
        .iter()
        .map(|k| published_key(&KeyView::from(&**k)))
        .collect();
    Json(json!({"keys": keys})).into_response()
}

/// `POST /admin/keys` in the published shape.
async fn published_create_key(State(state): State<AppState>, body: axum::body::Bytes) -> Response {
    match new_key(&state, &body).await {
        Ok(view) => (StatusCode::CREATED, Json(published_key(&view))).into_response(),
        Err(refusal) => api_error(refusal),
    }
}

async fn create_key(State(state): State<AppState>, body: axum::body::Bytes) -> Response {
    match new_key(&state, &body).await {
        Ok(view) => (StatusCode::CREATED, Json(view)).into_response(),
        Err(refusal) => api_error(refusal),
    }
}

/// Makes the key `body` asks for.
async fn new_key(state: &AppState, body: &[u8]) -> Result<KeyView, ApiError> {
    let new: NewKey = serde_json::from_slice(body).map_err(|error| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            format!(
                "expected {{\"name\": \"…\", \"models\"?: [\"…\"], \"max_concurrent\"?: n, \
                 \"requests_per_minute\"?: n, \"priority\"?: \"interactive\" | \"batch\", \
                 \"weight\"?: 1-16}}: \
                 {error}"
            ),
        )
    })?;
    state.keys.create(new).await.map_err(key_error)
}

async fn revoke_key(State(state): State<AppState>, Path(id): Path<String>) -> Response {
    match state.keys.revoke(&id).await {
        Ok(()) => Json(json!({"id": id, "revoked": true})).into_response(),
        Err(error) => api_error(key_error(error)),
    }
}

fn key_error(error: KeyError) -> ApiError {
    match error {
        KeyError::Invalid(message) => {
            ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", message)
        }
        KeyError::NotFound(_) => {
            ApiError::new(StatusCode::NOT_FOUND, "key_not_found", error.to_string())
        }
        KeyError::Database(_) => {
            tracing::error!(%error, "key store");
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "database_unavailable",
                error.to_string(),
            )
        }
    }
}

/// `GET /admin/usage` and `/api/usage`'s parameters.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct UsageParams {
    key: Option<String>,
    model: Option<String>,
    since: Option<String>,
    until: Option<String>,
    group_by: Option<String>,
    /// `csv` for a download; JSON otherwise.
    format: Option<String>,
}

impl UsageParams {
    fn query(self) -> Result<(UsageQuery, bool), ApiError> {
        let bad =
            |message: String| ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", message);
        let time = |name: &str, value: Option<String>| -> Result<Option<i64>, ApiError> {
            match value.filter(|v| !v.is_empty()) {
                None => Ok(None),
                Some(text) => parse_time(&text).map(Some).ok_or_else(|| {
                    bad(format!("`{name}` must be a date (2026-11-25) or an RFC 3339 time (2026-11-25T12:00:00Z), not {text:?}"))
                }),
            }
        };
        let until = time("until", self.until)?.unwrap_or_else(now_ms);
        let since =
            time("since", self.since)?.unwrap_or(until - (DEFAULT_USAGE_DAYS - 1) * 86_400_000);
        // Usage is kept per day, so each bound names its whole (UTC) day: compared as instants,
        // `since=2026-11-25T12:00:00Z&until=2026-11-25` (midnight) would refuse a valid day.
        let (since, until) = (day_of(since), day_of(until));
        if since > until {
            return Err(bad("`since` is after `until`".into()));
        }
        let group_by = match self.group_by.as_deref().filter(|g| !g.is_empty()) {
            None => GroupBy::Day,
            Some(text) => GroupBy::parse(text).ok_or_else(|| {
                bad(format!(
                    "`group_by` must be day, key or model, not {text:?}"
                ))
            })?,
        };
        let csv = match self.format.as_deref() {
            None | Some("" | "json") => false,
            Some("csv") => true,
            Some(other) => return Err(bad(format!("`format` must be json or csv, not {other:?}"))),
        };
        let filter = |v: Option<String>| v.filter(|v| !v.is_empty());
        Ok((
            UsageQuery {
                key: filter(self.key),
                model: filter(self.model),
                since,
                until,
                group_by,
            },
            csv,
        ))
    }
}

async fn usage(
    State(state): State<AppState>,
    params: Result<Query<UsageParams>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let params = match params {
        Ok(Query(params)) => params,
        Err(rejection) => {
            return api_error(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                format!("usage takes key, model, since, until, group_by (day, key, model) and format (json, csv): {rejection}"),
            ))
        }
    };
    let (query, csv) = match params.query() {
        Ok(parts) => parts,
        Err(error) => return api_error(error),
    };
    let mut report = match state.usage.query(&query).await {
        Ok(report) => report,
        Err(error) => {
            tracing::error!(%error, "usage query");
            return api_error(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "database_unavailable",
                format!("the usage could not be read: {error}"),
            ));
        }
    };
    if query.group_by == GroupBy::Key {
        for row in &mut report.rows {
            row.name = if row.group == ANONYMOUS {
                None
            } else {
                state.keys.name_of(&row.group)
            };
        }
    }
    if csv {
        let file = format!("modelrelay-usage-{}-{}.csv", query.since, query.until);
        return (
            [
                (header::CONTENT_TYPE, "text/csv; charset=utf-8".to_string()),
                (
                    header::CONTENT_DISPOSITION,
                    format!("attachment; filename=\"{file}\""),
                ),
            ],
            to_csv(&report),
        )
            .into_response();
    }
    Json(serde_json::to_value(report).unwrap_or(Value::Null)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(since: &str, until: &str) -> UsageParams {
        UsageParams {
            since: Some(since.into()),
            until: Some(until.into()),
            ..UsageParams::default()
        }
    }

    #[test]
    fn usage_bounds_are_whole_days_so_a_time_within_the_last_day_is_not_after_it() {
        let (query, csv) = params("2026-11-25T23:59:59Z", "2026-11-25")
            .query()
            .unwrap();
        assert_eq!(
            (query.since.as_str(), query.until.as_str()),
            ("2026-11-25", "2026-11-25")
        );
        assert!(!csv);
        let (query, _) = params("2026-11-01", "2026-11-25T00:00:01+01:00")
            .query()
            .unwrap();
        assert_eq!(query.until, "2026-11-24", "the UTC day of the time");
        let refused = params("2026-11-26", "2026-11-25T23:59:59Z")
            .query()
            .unwrap_err();
        assert_eq!(refused.status, StatusCode::BAD_REQUEST);
        assert!(refused.message.contains("after"), "{}", refused.message);
    }
}
