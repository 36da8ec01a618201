//! Control requests' bodies arrive in time and within bounds: a client trickling a
//! `PUT /api/config` a byte at a time would otherwise hold a connection (and its task) for as
//! long as it likes. The body is read whole, under a deadline and a size bound, before the
//! route sees it; the dashboard's bodies are a few kilobytes.

use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, LengthLimitError, Limited};

use crate::dialect::{ApiError, Dialect};

/// The time a control request's body has to arrive.
pub const CONTROL_BODY_DEADLINE: Duration = Duration::from_secs(10);

/// The largest control request body (a whole config file with a big model map fits many times).
pub const CONTROL_BODY_LIMIT: usize = 2 * 1024 * 1024;

/// Middleware on the control routes: reads the body within [`CONTROL_BODY_DEADLINE`] and
/// [`CONTROL_BODY_LIMIT`] (408 and 413 otherwise), then runs the route with it.
pub async fn deadline(request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    let reading = Limited::new(body, CONTROL_BODY_LIMIT).collect();
    let bytes = match tokio::time::timeout(CONTROL_BODY_DEADLINE, reading).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(error)) if error.downcast_ref::<LengthLimitError>().is_some() => {
            return refuse(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                format!("a control request's body may be {CONTROL_BODY_LIMIT} bytes at most"),
            ))
        }
        Ok(Err(error)) => {
            return refuse(ApiError::new(
                StatusCode::BAD_REQUEST,
                "body_unreadable",
                format!("the request body could not be read: {error}"),
            ))
        }
        Err(_) => {
            return refuse(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                format!(
                    "the request body did not arrive within {} s",
                    CONTROL_BODY_DEADLINE.as_secs()
                ),
            ))
        }
    };
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

fn refuse(error: ApiError) -> Response {
    let mut response = error.into_response(Dialect::OpenAi);
    // The rest of a body that was not read must not be taken for the next request.
    response.headers_mut().insert(
        axum::http::header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    response.into_response()
}
