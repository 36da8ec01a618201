//! Answers the node gives whatever the route: a method the route does not take, the proxy role
//! being off, and the control API's errors.

use axum::extract::OriginalUri;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::dialect::{ApiError, Dialect};

/// `405` naming the method, in the dialect of the route's path.
pub async fn wrong_method(method: axum::http::Method, OriginalUri(uri): OriginalUri) -> Response {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{method} is not supported on {}", uri.path()),
    )
    .into_response(Dialect::for_path(uri.path()))
}

/// `503`: client and worker routes while this node's proxy role is off.
pub fn proxy_role_off() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "proxy_role_off",
        "this node's proxy role is off: turn on \"Run proxy\" in the tray menu or the dashboard's settings, or use the proxy this node's worker joins",
    )
}

/// A control-API error, answered in the OpenAI error shape.
#[derive(Debug)]
pub struct ControlError(pub ApiError);

impl IntoResponse for ControlError {
    fn into_response(self) -> Response {
        self.0.into_response(Dialect::OpenAi)
    }
}

/// A control-API error.
pub fn api_error(
    status: StatusCode,
    code: &'static str,
    message: impl Into<String>,
) -> ControlError {
    ControlError(ApiError::new(status, code, message))
}
