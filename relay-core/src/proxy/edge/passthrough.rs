//! What a worker's or an upstream's answer may carry onto the relay's origin.
//!
//! A worker is anyone with the shared secret, and an upstream is someone else's server, yet
//! their answers are served from the relay's own origin — the origin of the dashboard and its
//! API. So an answer passes only what an inference API legitimately returns: an allow-list of
//! headers (no cookies, no CORS grants, no authentication challenges, no redirects or policies),
//! a content type the endpoint can return (never a page, a script or an SVG), a real final
//! status, and `nosniff` so a browser never guesses a type.

use axum::http::{header, HeaderName, HeaderValue, StatusCode};

use crate::dialect::ApiError;

/// Headers passed on exactly.
const ALLOWED: &[&str] = &[
    "content-type",
    "retry-after",
    "request-id",
    "x-request-id",
    "cache-control",
];

/// Header families passed on: the OpenAI and Anthropic APIs' rate-limit and processing
/// headers, and servers' own `x-` headers (request and generation ids, timings), which browsers
/// ignore — except those in [`DENIED_X_HEADERS`].
const ALLOWED_PREFIXES: &[&str] = &["anthropic-ratelimit-", "openai-", "x-"];

/// `x-` headers that do something: browser policies, and directives a reverse proxy in front
/// of the relay obeys (`X-Accel-Redirect` makes nginx serve a file of its choosing).
const DENIED_X_HEADERS: &[&str] = &[
    "x-accel-",
    "x-sendfile",
    "x-lighttpd-send-file",
    "x-frame-options",
    "x-xss-protection",
    "x-content-type-options",
    "x-dns-prefetch-control",
    "x-permitted-cross-domain-policies",
    "x-download-options",
    "x-forwarded-",
    "x-real-ip",
];

/// Media types an inference endpoint answers with.
const ALLOWED_TYPES: &[&str] = &[
    "application/json",
    "text/event-stream",
    "text/plain",
    "application/x-ndjson",
];

/// Whether an answer header may pass.
pub fn header_allowed(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    if DENIED_X_HEADERS.iter().any(|d| name.starts_with(d)) {
        return false;
    }
    ALLOWED.contains(&name.as_str()) || ALLOWED_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// The status to answer with, or why the answer is refused: a final status in 200–299 or
/// 400–599. A redirect is refused too: workers and upstreams do not follow them (a request, and
/// a key, would go wherever one points), and one passed on without its `Location` says nothing.
pub fn status(code: u16) -> Result<StatusCode, ApiError> {
    match StatusCode::from_u16(code) {
        Ok(status) if status.is_redirection() => Err(ApiError::new(
            StatusCode::BAD_GATEWAY,
            "bad_backend_answer",
            format!(
                "the backend answered with a redirect (HTTP {code}), which the relay does not \
                 follow: point its URL where the redirect goes"
            ),
        )),
        Ok(status) if (200..=599).contains(&code) => Ok(status),
        _ => Err(ApiError::new(
            StatusCode::BAD_GATEWAY,
            "bad_backend_answer",
            format!(
                "the backend answered with HTTP status {code}, which is not a final HTTP status"
            ),
        )),
    }
}

/// Checks a `Content-Type` the backend sent (`None`: it sent none, and JSON is assumed).
///
/// Anything else is refused with a 502 rather than served as text: a backend that answers HTML
/// is misconfigured (a login page, a reverse proxy's error page, a web UI on the model port), and
/// saying so helps more than a page of markup in a JSON client.
pub fn content_type(value: Option<&str>, backend_status: u16) -> Result<(), ApiError> {
    let Some(value) = value else {
        return Ok(());
    };
    let media = value
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    if ALLOWED_TYPES.contains(&media.as_str()) {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::BAD_GATEWAY,
        "bad_backend_answer",
        format!(
            "the backend answered HTTP {backend_status} with Content-Type {media:?}, which an \
             inference API never returns: check that the worker's backend URL points at the \
             model server's API"
        ),
    ))
}

/// Adds the headers every relayed answer carries.
pub fn harden(headers: &mut axum::http::HeaderMap) {
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
}

/// `name` and `value` as a header that may pass, or `None`.
pub fn allowed_header(name: &str, value: &str) -> Option<(HeaderName, HeaderValue)> {
    if !header_allowed(name) {
        return None;
    }
    Some((
        HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes()).ok()?,
        HeaderValue::from_str(value).ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_api_headers_pass() {
        for name in [
            "Content-Type",
            "retry-after",
            "x-request-id",
            "x-ratelimit-remaining-requests",
            "anthropic-ratelimit-tokens-reset",
            "openai-processing-ms",
            "x-generation-id",
            "X-Upstream-Request-Id",
        ] {
            assert!(header_allowed(name), "{name}");
        }
        for name in [
            "set-cookie",
            "Set-Cookie2",
            "access-control-allow-origin",
            "access-control-allow-credentials",
            "www-authenticate",
            "location",
            "refresh",
            "content-security-policy",
            "link",
            "x-frame-options",
            "content-disposition",
            "strict-transport-security",
            "server",
            "x-accel-redirect",
            "X-Accel-Buffering",
            "x-sendfile",
            "x-frame-options",
            "x-forwarded-host",
        ] {
            assert!(!header_allowed(name), "{name}");
        }
    }

    #[test]
    fn only_final_statuses_pass() {
        assert_eq!(status(200).unwrap(), StatusCode::OK);
        assert_eq!(status(599).unwrap().as_u16(), 599);
        for code in [
            0,
            100,
            101,
            199,
            301,
            302,
            307,
            308,
            600,
            999,
            1000,
            u16::MAX,
        ] {
            let refused = status(code).unwrap_err();
            assert_eq!(refused.status, StatusCode::BAD_GATEWAY, "{code}");
        }
    }

    #[test]
    fn only_api_content_types_pass() {
        for value in [
            "application/json",
            "application/json; charset=utf-8",
            "Text/Event-Stream",
            "text/plain",
            "application/x-ndjson",
        ] {
            assert!(content_type(Some(value), 200).is_ok(), "{value}");
        }
        assert!(content_type(None, 200).is_ok());
        for value in [
            "text/html",
            "text/html; charset=utf-8",
            "image/svg+xml",
            "application/javascript",
            "text/xml",
            "application/xhtml+xml",
            "",
            "multipart/x-mixed-replace",
        ] {
            let refused = content_type(Some(value), 200).unwrap_err();
            assert_eq!(refused.code, "bad_backend_answer", "{value}");
        }
    }
}
