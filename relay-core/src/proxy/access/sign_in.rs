//! The sign-in routes ([`crate::proxy::access::session`]): a one-time login link (`GET /login?code=…`), the
//! sign-in page's token (`POST /api/login`), and signing out.

use std::net::SocketAddr;
use std::time::Instant;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

use crate::dialect::{ApiError, Dialect};
use crate::proxy::access::admin::locked_out;
use crate::proxy::access::session::Sessions;
use crate::proxy::edge::answers::api_error;
use crate::proxy::edge::control_body as body;
use crate::proxy::AppState;

/// The routes anyone may call: each checks its own credential (a code, a token) under the
/// proxy's failure limiter.
pub fn open_routes() -> Router<AppState> {
    Router::new()
        .route("/login", get(follow_link))
        .route("/api/login", post(sign_in_with_token))
        .route("/api/logout", post(sign_out))
        .route_layer(axum::middleware::from_fn(body::deadline))
}

/// The path of a new one-time login link of `sessions`, valid for `lifetime`.
pub fn link_path(sessions: &Sessions, lifetime: std::time::Duration) -> String {
    format!("/login?code={}", sessions.mint_code(lifetime))
}

#[derive(Deserialize)]
struct LinkQuery {
    code: Option<String>,
}

/// The address a request came from, for the failure limiter.
fn peer(request: &Request) -> Option<std::net::IpAddr> {
    request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|info| info.0.ip())
}

/// Refuses a request from an address the limiter locked out.
fn limited(state: &AppState, peer: Option<std::net::IpAddr>) -> Option<ApiError> {
    let ip = peer?;
    let wait = state.limiter.check(ip, Instant::now()).err()?;
    Some(locked_out(wait))
}

fn record_failure(state: &AppState, peer: Option<std::net::IpAddr>) {
    if let Some(ip) = peer {
        state.limiter.record_failure(ip, Instant::now());
    }
}

async fn follow_link(State(state): State<AppState>, request: Request) -> Response {
    let peer = peer(&request);
    let query = axum::extract::Query::<LinkQuery>::try_from_uri(request.uri())
        .map(|query| query.0)
        .unwrap_or(LinkQuery { code: None });
    if let Some(refusal) = limited(&state, peer) {
        return page(
            StatusCode::TOO_MANY_REQUESTS,
            "Too many tries",
            &refusal.message,
        );
    }
    let Some(sessions) = state.admin.sessions() else {
        return page(
            StatusCode::NOT_FOUND,
            "No sign-in here",
            "This relay has no admin token, so there is nothing to sign in to.",
        );
    };
    let code = query.code.unwrap_or_default();
    if code.is_empty() || !sessions.redeem(&code) {
        if !code.is_empty() {
            record_failure(&state, peer);
        }
        return page(
            StatusCode::FORBIDDEN,
            "This sign-in link does not work",
            "It was used already, has expired, or belongs to another start of the relay. \
             On the machine running ModelRelay, run `modelrelay dashboard` (or use the \
             tray's Open dashboard) for a new link; or open the dashboard and paste the \
             admin token.",
        );
    }
    tracing::info!(peer = ?peer, "dashboard signed in with a one-time link");
    let mut response = (StatusCode::SEE_OTHER, [(header::LOCATION, "/")]).into_response();
    let headers = response.headers_mut();
    headers.insert(header::SET_COOKIE, sessions.start());
    no_store(headers);
    response
}

#[derive(Deserialize)]
struct TokenBody {
    token: String,
}

async fn sign_in_with_token(State(state): State<AppState>, request: Request) -> Response {
    let peer = peer(&request);
    // The body deadline layer has read the body already; this only takes it.
    let body = axum::body::to_bytes(
        request.into_body(),
        crate::proxy::edge::control_body::CONTROL_BODY_LIMIT,
    )
    .await
    .unwrap_or_default();
    if let Some(refusal) = limited(&state, peer) {
        return refusal.into_response(Dialect::OpenAi);
    }
    let Some(sessions) = state.admin.sessions() else {
        return api_error(
            StatusCode::NOT_FOUND,
            "no_admin_token",
            "this relay has no admin token, so there is nothing to sign in to",
        )
        .into_response();
    };
    let Ok(TokenBody { token }) = serde_json::from_slice::<TokenBody>(&body) else {
        return api_error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "send the admin token as JSON: {\"token\": \"...\"}",
        )
        .into_response();
    };
    if !state.admin.token_matches(token.trim()) {
        record_failure(&state, peer);
        return ApiError::new(
            StatusCode::UNAUTHORIZED,
            "wrong_admin_token",
            format!(
                "wrong admin token: use {}",
                state.admin.token_origin().describe()
            ),
        )
        .into_response(Dialect::OpenAi);
    }
    let mut response = (StatusCode::OK, Json(json!({"ok": true}))).into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, sessions.start());
    no_store(response.headers_mut());
    response
}

async fn sign_out(State(state): State<AppState>) -> Response {
    let mut response = (StatusCode::OK, Json(json!({"ok": true}))).into_response();
    if let Some(sessions) = state.admin.sessions() {
        response
            .headers_mut()
            .insert(header::SET_COOKIE, sessions.end());
    }
    response
}

fn no_store(headers: &mut HeaderMap) {
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    // The link's code must not travel on in a Referer.
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
}

/// A plain page (no script) for a browser that followed a link.
fn page(status: StatusCode, title: &str, message: &str) -> Response {
    let escape = |text: &str| {
        text.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    };
    let html = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title} · ModelRelay</title>\
         <style>body{{font:16px/1.5 system-ui,sans-serif;max-width:36rem;margin:4rem auto;\
         padding:0 1rem;color:#1f2328}}code{{background:#f0f1f3;padding:0 .25rem;\
         border-radius:4px}}a{{color:#0b62d6}}</style></head><body><h1>{title}</h1>\
         <p>{message}</p><p><a href=\"/\">Open the dashboard</a></p></body></html>",
        title = escape(title),
        message = escape(message).replace(
            "`modelrelay dashboard`",
            "<code>modelrelay dashboard</code>"
        ),
    );
    let mut response = (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        html,
    )
        .into_response();
    no_store(response.headers_mut());
    response
}
