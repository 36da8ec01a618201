//! The pages the owner opens: the web UI (embedded, [`super::control::assets`]) at `/` and at the
//! published runbook's `/dashboard` and `/setup`, `/metrics`, and the answers to unknown routes
//! and methods (a file of the web UI, else an error in the client's dialect).

use axum::extract::OriginalUri;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::get;
use axum::Router;

use crate::dialect::{ApiError, Dialect};
use crate::proxy::AppState;

/// The routes, with the fallbacks for everything no other route takes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/metrics", get(super::metrics::scrape))
        .route("/", get(index_page))
        // The published runbook's addresses of the dashboard and the setup wizard: the same
        // page, which opens the route its path names.
        .route("/dashboard", get(index_page))
        .route("/setup", get(index_page))
        .fallback(unknown_route)
        .method_not_allowed_fallback(crate::proxy::edge::answers::wrong_method)
}

async fn index_page() -> Response {
    super::control::assets::serve("/").unwrap_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "ui_not_built",
            "this build has no web UI: run `npm ci && npm run build` in ui/ and rebuild",
        )
        .into_response(Dialect::OpenAi)
    })
}

/// Files of the web UI; anything else is an unknown route in the client's dialect.
async fn unknown_route(method: axum::http::Method, OriginalUri(uri): OriginalUri) -> Response {
    let asset = (method == axum::http::Method::GET && !uri.path().starts_with("/v1/"))
        .then(|| super::control::assets::serve(uri.path()))
        .flatten();
    if let Some(asset) = asset {
        return asset;
    }
    ApiError::new(
        StatusCode::NOT_FOUND,
        "unknown_route",
        format!("no route for {}", uri.path()),
    )
    .into_response(Dialect::for_path(uri.path()))
}
