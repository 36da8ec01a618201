//! Who may use the control API: the admin token, and the desktop webview's cross-origin calls.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::dialect::{ApiError, Dialect};
use crate::proxy::auth::secrets_match;

/// The admin token; its `Debug` never shows the value.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken(pub String);

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}

/// The control API's access rule.
#[derive(Debug, Clone)]
pub struct AdminAccess {
    /// The configured token.
    token: Option<Arc<AdminToken>>,
    /// Whether requests must present it (the listener is reachable beyond loopback, or a token
    /// was configured on purpose).
    required: bool,
}

/// Origins of the desktop app's webview (Tauri serves its pages from these), the only origins
/// allowed to call the control API cross-origin.
const DESKTOP_ORIGINS: &[&str] = &["tauri://localhost", "http://tauri.localhost"];

impl AdminAccess {
    /// The rule for a node listening on a loopback address or not, with `token` configured.
    pub fn new(token: Option<AdminToken>, loopback_only: bool) -> Self {
        AdminAccess {
            required: token.is_some() || !loopback_only,
            token: token.map(Arc::new),
        }
    }

    /// Whether a token is needed.
    pub fn required(&self) -> bool {
        self.required
    }

    fn check(&self, headers: &HeaderMap, query: Option<&str>) -> Result<(), ApiError> {
        if !self.required {
            return Ok(());
        }
        let Some(expected) = self.token.as_deref() else {
            return Err(unauthorized(
                "this node listens beyond loopback and has no admin token: set MODELRELAY_ADMIN_TOKEN (or --admin-token) and restart",
            ));
        };
        match presented_token(headers, query) {
            Some(token) if secrets_match(&token, &expected.0) => Ok(()),
            Some(_) => Err(unauthorized(
                "wrong admin token: use the one in MODELRELAY_ADMIN_TOKEN, or the one printed when the relay started",
            )),
            None => Err(unauthorized(
                "the control API needs the admin token: send `Authorization: Bearer TOKEN` (or `?token=` for event streams)",
            )),
        }
    }
}

fn unauthorized(message: &str) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, "admin_token_required", message)
}

/// The token from `Authorization: Bearer`, `X-Admin-Token`, or the `token` query parameter.
fn presented_token(headers: &HeaderMap, query: Option<&str>) -> Option<String> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").map(str::trim));
    let header_token = headers.get("x-admin-token").and_then(|v| v.to_str().ok());
    if let Some(token) = bearer.or(header_token) {
        return Some(token.to_string());
    }
    query?
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(name, _)| *name == "token")
        .map(|(_, value)| percent_decode(value))
}

/// Decodes `%XX` escapes and `+` (tokens are usually plain ASCII; this covers pasted ones).
fn percent_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%' && i + 2 < bytes.len())
            .then(|| Some(hex(bytes[i + 1])? * 16 + hex(bytes[i + 2])?))
            .flatten();
        match (escaped, bytes[i]) {
            (Some(byte), _) => {
                out.push(byte);
                i += 3;
                continue;
            }
            (None, b'+') => out.push(b' '),
            (None, other) => out.push(other),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn allowed_origin(headers: &HeaderMap) -> Option<HeaderValue> {
    let origin = headers.get(header::ORIGIN)?;
    DESKTOP_ORIGINS
        .contains(&origin.to_str().ok()?)
        .then(|| origin.clone())
}

/// Middleware on every control route: answers the desktop webview's CORS preflight, checks the
/// admin token, and marks answers to the webview as allowed.
pub async fn guard(State(access): State<AdminAccess>, request: Request, next: Next) -> Response {
    let origin = allowed_origin(request.headers());
    if request.method() == Method::OPTIONS {
        let mut response = StatusCode::NO_CONTENT.into_response();
        if let Some(origin) = origin {
            let headers = response.headers_mut();
            headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
            headers.insert(
                header::ACCESS_CONTROL_ALLOW_METHODS,
                HeaderValue::from_static("GET, POST, PUT, DELETE, OPTIONS"),
            );
            headers.insert(
                header::ACCESS_CONTROL_ALLOW_HEADERS,
                HeaderValue::from_static("authorization, content-type, x-admin-token"),
            );
            headers.insert(
                header::ACCESS_CONTROL_MAX_AGE,
                HeaderValue::from_static("600"),
            );
        }
        return response;
    }
    let mut response = match access.check(request.headers(), request.uri().query()) {
        Ok(()) => next.run(request).await,
        Err(error) => error.into_response(Dialect::OpenAi),
    };
    if let Some(origin) = origin {
        let headers = response.headers_mut();
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        headers.insert(header::VARY, HeaderValue::from_static("origin"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn loopback_without_a_token_is_open() {
        let access = AdminAccess::new(None, true);
        assert!(!access.required());
        assert!(access.check(&HeaderMap::new(), None).is_ok());
    }

    #[test]
    fn beyond_loopback_the_token_is_required_in_any_of_its_three_places() {
        let access = AdminAccess::new(Some(AdminToken("s3cret".into())), false);
        assert!(access.check(&HeaderMap::new(), None).is_err());
        assert!(access
            .check(&headers(&[("authorization", "Bearer s3cret")]), None)
            .is_ok());
        assert!(access
            .check(&headers(&[("x-admin-token", "s3cret")]), None)
            .is_ok());
        assert!(access
            .check(&HeaderMap::new(), Some("a=1&token=s3cret"))
            .is_ok());
        let wrong = access
            .check(&headers(&[("authorization", "Bearer nope")]), None)
            .unwrap_err();
        assert!(
            wrong.message.contains("wrong admin token"),
            "{}",
            wrong.message
        );
    }

    #[test]
    fn beyond_loopback_without_a_configured_token_everything_is_refused_with_advice() {
        let access = AdminAccess::new(None, false);
        let error = access
            .check(&headers(&[("authorization", "Bearer x")]), None)
            .unwrap_err();
        assert!(error.message.contains("MODELRELAY_ADMIN_TOKEN"));
    }

    #[test]
    fn a_configured_token_is_enforced_on_loopback_too() {
        let access = AdminAccess::new(Some(AdminToken("t".into())), true);
        assert!(access.required());
    }

    #[test]
    fn query_tokens_are_percent_decoded() {
        assert_eq!(percent_decode("a%2Bb+c"), "a+b c");
        assert_eq!(percent_decode("100%"), "100%");
    }

    #[test]
    fn only_desktop_origins_are_allowed_cross_origin() {
        assert!(allowed_origin(&headers(&[("origin", "tauri://localhost")])).is_some());
        assert!(allowed_origin(&headers(&[("origin", "https://evil.example")])).is_none());
        assert!(allowed_origin(&HeaderMap::new()).is_none());
    }

    #[test]
    fn debug_never_shows_the_token() {
        let shown = format!(
            "{:?}",
            AdminAccess::new(Some(AdminToken("hunter2".into())), false)
        );
        assert!(!shown.contains("hunter2"), "{shown}");
    }
}
