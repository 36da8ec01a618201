//! Who may use the control API: the admin token or a dashboard session ([`crate::proxy::access::session`]).

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::dialect::{ApiError, Dialect, WrongCredential};
use crate::proxy::access::credentials::{secrets_match, FailureLimiter};
use crate::proxy::access::session::Sessions;

/// The admin token; its `Debug` never shows the value.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken(pub String);

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}

/// Where the admin token came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenOrigin {
    /// Set on purpose (`MODELRELAY_ADMIN_TOKEN`, `--admin-token`, `admin_token` in the file): it
    /// then guards every control route, even on loopback.
    Configured,
    /// Generated on first run and kept in this file (owner-only).
    Stored(std::path::PathBuf),
}

impl TokenOrigin {
    /// One line for the start-up banner.
    pub fn short(&self) -> String {
        match self {
            TokenOrigin::Configured => {
                "as configured (MODELRELAY_ADMIN_TOKEN, --admin-token or the config file)"
                    .to_string()
            }
            TokenOrigin::Stored(path) => format!("stored in {}", path.display()),
        }
    }

    /// Where a person finds the token, for messages that ask for it.
    pub fn describe(&self) -> String {
        match self {
            TokenOrigin::Configured => "the admin token configured for this node \
                 (MODELRELAY_ADMIN_TOKEN, --admin-token or admin_token in the config file)"
                .to_string(),
            TokenOrigin::Stored(path) => format!(
                "the admin token stored in {} (readable only by the user running ModelRelay)",
                path.display()
            ),
        }
    }
}

/// The control API's access rule.
#[derive(Debug, Clone)]
pub struct AdminAccess {
    /// The token: configured, or generated and stored.
    token: Option<Arc<AdminToken>>,
    /// Where it came from.
    origin: TokenOrigin,
    /// Whether every control request must present it or a session (the listener is reachable
    /// beyond loopback, or a token was configured on purpose). Without that, loopback may read
    /// the live status ([`OPEN_ON_LOOPBACK`]) and nothing else.
    required: bool,
    /// Requests refused for a missing or wrong token, for `/metrics`; shared by the clones the
    /// proxy's and the node's routes hold.
    failures: Arc<AtomicU64>,
    /// The proxy's one failure limiter, when it has one (every node's does).
    limiter: Option<Arc<FailureLimiter>>,
    /// Dashboard sign-in (login links and session cookies), when there is a token to sign
    /// sessions with.
    sessions: Option<Arc<Sessions>>,
}

/// What a request from this machine may do without signing in: read the dashboard's live
/// status. Everything else under `/api` reveals a secret (join code, settings, keys, usage) or
/// changes something, and being on this machine is not a login: any local user, container or
/// sandboxed app is on it too.
pub const OPEN_ON_LOOPBACK: &[(Method, &str)] = &[
    (Method::GET, "/api/status"),
    (Method::GET, "/api/events"),
    (Method::GET, "/api/lifecycle"),
];

/// Headers a reverse proxy adds to say whom it forwards for. A request carrying any of them came
/// from beyond this machine whatever socket it arrived on — a same-host nginx or Caddy connects
/// over loopback — so it never gets loopback's trust.
pub const FORWARDING_HEADERS: [&str; 4] = [
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-real-ip",
];

/// Whether `headers` say a proxy forwarded the request (see [`FORWARDING_HEADERS`]).
pub fn forwarded(headers: &HeaderMap) -> bool {
    FORWARDING_HEADERS
        .iter()
        .any(|name| headers.contains_key(*name))
}

/// The error code of an `/admin/*` request with a wrong token (which counts towards a lockout).
pub const WRONG_ADMIN_TOKEN_CODE: &str = "wrong_admin_token";

/// The error code of a request that needs the admin token for what it changes.
pub const ELEVATION_CODE: &str = "admin_token_needed";

impl AdminAccess {
    /// The rule for a node listening on a loopback address or not, with `token` from `origin`.
    pub fn new(token: Option<AdminToken>, origin: TokenOrigin, loopback_only: bool) -> Self {
        AdminAccess {
            required: (token.is_some() && origin == TokenOrigin::Configured) || !loopback_only,
            token: token.map(Arc::new),
            origin,
            failures: Arc::default(),
            limiter: None,
            sessions: None,
        }
    }

    /// The same rule, with dashboard sessions for a node listening on `port` (over HTTPS:
    /// `secure`), signed with its token. Without a token there is nothing to sign them with.
    pub fn with_sessions(mut self, port: u16, secure: bool) -> Self {
        self.sessions = self
            .token
            .as_ref()
            .map(|token| Arc::new(Sessions::new(&token.0, port, secure)));
        self
    }

    /// Dashboard sign-in, when this node has it.
    pub fn sessions(&self) -> Option<&Arc<Sessions>> {
        self.sessions.as_ref()
    }

    /// Whether `headers` carry a valid dashboard session cookie.
    fn signed_in(&self, headers: &HeaderMap) -> bool {
        self.sessions
            .as_ref()
            .is_some_and(|sessions| sessions.signed_in(headers))
    }

    /// Whether `token` is this node's admin token (the sign-in page's check), counting a
    /// wrong one like any other refusal.
    pub fn token_matches(&self, token: &str) -> bool {
        let matches = self
            .token
            .as_deref()
            .is_some_and(|expected| secrets_match(token, &expected.0));
        if !matches {
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
        matches
    }

    /// The same rule, counting wrong tokens in `limiter` (shared with every other credential
    /// check of the proxy) and refusing an address it locked out.
    pub fn with_limiter(mut self, limiter: Arc<FailureLimiter>) -> Self {
        self.limiter = Some(limiter);
        self
    }

    /// The limiter's refusal for a request from `peer`, when it presents a credential
    /// (`presents`) and the limiter locked that address out.
    pub fn locked_out(&self, peer: Option<IpAddr>, presents: bool) -> Option<ApiError> {
        let (limiter, ip) = (self.limiter.as_ref()?, peer?);
        if !presents {
            return None;
        }
        let wait = limiter.check(ip, Instant::now()).err()?;
        Some(locked_out(wait))
    }

    /// Counts a wrong credential from `peer` when `response` refused one.
    pub fn count_wrong_credential(&self, peer: Option<IpAddr>, response: &Response) {
        if let (Some(limiter), Some(ip)) = (&self.limiter, peer) {
            if response.extensions().get::<WrongCredential>().is_some() {
                limiter.record_failure(ip, Instant::now());
            }
        }
    }

    /// Requests refused so far for a missing or wrong admin token.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Where the token came from.
    pub fn token_origin(&self) -> &TokenOrigin {
        &self.origin
    }

    /// Whether a token is needed for every control route.
    pub fn required(&self) -> bool {
        self.required
    }

    /// Whether this request must present the token: always when [`AdminAccess::required`], and
    /// on a loopback-only node for any request a reverse proxy forwarded.
    fn required_for(&self, headers: &HeaderMap) -> bool {
        self.required || forwarded(headers)
    }

    fn check(&self, headers: &HeaderMap, method: &Method, path: &str) -> Result<(), ApiError> {
        if !self.required_for(headers) {
            // A proxy built without any token (embedded in a program, tests) has no one to
            // sign in; every node and every binary has one.
            let open = OPEN_ON_LOOPBACK
                .iter()
                .any(|(m, p)| m == method && *p == path);
            if self.token.is_none() || open {
                return Ok(());
            }
        }
        if self.signed_in(headers) {
            return Ok(());
        }
        let missing = if self.required {
            "the control API needs the admin token: sign in on the dashboard, or send \
             `Authorization: Bearer TOKEN`"
        } else if forwarded(headers) {
            "this request came through a reverse proxy (it carries Forwarded, X-Forwarded-For, \
             X-Forwarded-Host or X-Real-IP), so it is not from this machine: the control API \
             needs the admin token: send `Authorization: Bearer TOKEN`"
        } else {
            "sign in first: open the dashboard with `modelrelay dashboard` (or the tray's Open \
             dashboard, or the link printed when the relay started), or send the admin token as \
             `Authorization: Bearer TOKEN`"
        };
        self.verify(presented_token(headers), missing)
    }

    /// The same rule for `/metrics`, whose scrapers send the token as a bearer token; the
    /// refusals say how to configure one, or how to open the endpoint on purpose.
    pub fn check_metrics(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        if !self.required_for(headers) {
            return Ok(());
        }
        self.verify(
            presented_token(headers),
            "/metrics needs the admin token on this node: send `Authorization: Bearer TOKEN` \
             (Prometheus: `authorization: {credentials: TOKEN}` in the scrape config), or start \
             the proxy with --metrics-public (MODELRELAY_METRICS_PUBLIC=true) to let any \
             scraper in",
        )
    }

    /// Whether `presented` is the token, counting every refusal.
    fn verify(&self, presented: Option<String>, missing: &str) -> Result<(), ApiError> {
        let verdict = match (self.token.as_deref(), presented) {
            (None, _) => Err(unauthorized(
                "this node listens beyond loopback and has no admin token: set MODELRELAY_ADMIN_TOKEN (or --admin-token) and restart",
            )),
            (Some(expected), Some(token)) if secrets_match(&token, &expected.0) => Ok(()),
            (Some(_), Some(_)) => Err(unauthorized(
                "wrong admin token: use the one in MODELRELAY_ADMIN_TOKEN, or the one in the admin-token file of the data directory",
            )
            .for_wrong_credential()),
            (Some(_), None) => Err(unauthorized(missing)),
        };
        if verdict.is_err() {
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
        verdict
    }

    /// Whether a request may make a change that runs a program or sends a secret elsewhere
    /// (`what` names it): only with the admin token in a header or a dashboard session,
    /// wherever the request comes from. The refusal says where the token is.
    pub fn elevated(&self, headers: &HeaderMap, what: &str) -> Result<(), ApiError> {
        if self.signed_in(headers) {
            return Ok(());
        }
        let verdict = self.elevation(headers, what);
        if verdict.is_err() {
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
        verdict
    }

    fn elevation(&self, headers: &HeaderMap, what: &str) -> Result<(), ApiError> {
        let where_it_is = self.origin.describe();
        let Some(expected) = self.token.as_deref() else {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                ELEVATION_CODE,
                format!("{what} needs the admin token, and this node has none: set MODELRELAY_ADMIN_TOKEN and restart"),
            ));
        };
        match presented_token(headers) {
            Some(token) if secrets_match(&token, &expected.0) => Ok(()),
            Some(_) => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                ELEVATION_CODE,
                format!("Wrong admin token. {what} needs {where_it_is}."),
            )
            .for_wrong_credential()),
            None => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                ELEVATION_CODE,
                format!("{what} needs {where_it_is}. Send it as `Authorization: Bearer TOKEN`."),
            )),
        }
    }
}

impl AdminAccess {
    /// The published `/admin/*` rule: the admin token must have been configured on purpose
    /// (`MODELRELAY_ADMIN_TOKEN`, `--admin-token`, `admin_token` in the file) and presented as
    /// `Authorization: Bearer`; anything else is 403, as the published proxy answers. A token
    /// this node generated for its dashboard does not open `/admin`: scripts replacing the
    /// published binaries set theirs.
    pub fn check_admin_api(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let verdict = self.admin_api_verdict(headers);
        if verdict.is_err() {
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
        verdict
    }

    fn admin_api_verdict(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let forbidden =
            |message: &str| ApiError::new(StatusCode::FORBIDDEN, "admin_forbidden", message);
        let expected = match (&self.token, &self.origin) {
            (Some(token), TokenOrigin::Configured) => token,
            _ => {
                return Err(forbidden(
                    "the admin API is off: start the proxy with MODELRELAY_ADMIN_TOKEN (or \
                     --admin-token) set, then send it as `Authorization: Bearer TOKEN`",
                ))
            }
        };
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        match bearer {
            Some(token) if secrets_match(token, &expected.0) => Ok(()),
            Some(_) => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                WRONG_ADMIN_TOKEN_CODE,
                "wrong admin token: send the one in MODELRELAY_ADMIN_TOKEN",
            )
            .for_wrong_credential()),
            None => Err(forbidden(
                "the admin API needs the admin token: send `Authorization: Bearer TOKEN`",
            )),
        }
    }
}

/// The answer to a credential from an address the limiter locked out.
pub fn locked_out(wait: Duration) -> ApiError {
    ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "auth_rate_limited",
        format!(
            "too many wrong credentials from this address; retry in {} s",
            wait.as_secs().max(1)
        ),
    )
    .retry_after(wait)
}

fn unauthorized(message: &str) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, "admin_token_required", message)
}

/// The token from `Authorization: Bearer` or `X-Admin-Token`. Never from a URL: URLs end up in
/// access logs, browser history and `Referer` headers (the dashboard's event stream is
/// authorized by its session cookie).
fn presented_token(headers: &HeaderMap) -> Option<String> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").map(str::trim));
    let header_token = headers.get("x-admin-token").and_then(|v| v.to_str().ok());
    bearer.or(header_token).map(str::to_string)
}

/// Middleware on every control route: checks the admin token or the session, under the
/// proxy's failure limiter. No origin is granted cross-origin access: the dashboard (in the
/// desktop app too) is served by the node itself.
pub async fn guard(State(access): State<AdminAccess>, request: Request, next: Next) -> Response {
    if request.method() == Method::OPTIONS {
        return StatusCode::NO_CONTENT.into_response();
    }
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|info| info.0.ip());
    let presents = presented_token(request.headers()).is_some();
    let limited = access.locked_out(peer, presents);
    let response = if let Some(refusal) = limited {
        refusal.into_response(Dialect::OpenAi)
    } else {
        match access.check(request.headers(), request.method(), request.uri().path()) {
            Ok(()) => next.run(request).await,
            Err(error) => error.into_response(Dialect::OpenAi),
        }
    };
    access.count_wrong_credential(peer, &response);
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn a_forwarded_request_to_a_loopback_node_needs_the_token() {
        let access = AdminAccess::new(
            Some(AdminToken("t".into())),
            TokenOrigin::Stored("admin-token".into()),
            true,
        );
        assert!(access
            .check(&HeaderMap::new(), &Method::GET, "/api/status")
            .is_ok());
        for name in FORWARDING_HEADERS {
            let via_proxy = headers(&[(name, "203.0.113.9")]);
            let refused = access
                .check(&via_proxy, &Method::GET, "/api/join-code")
                .unwrap_err();
            assert_eq!(refused.status, StatusCode::UNAUTHORIZED, "{name}");
            assert!(refused.message.contains("reverse proxy"), "{name}");
            assert!(access.check_metrics(&via_proxy).is_err(), "{name}");
            let mut with_token = via_proxy.clone();
            with_token.insert("authorization", HeaderValue::from_static("Bearer t"));
            assert!(access
                .check(&with_token, &Method::GET, "/api/join-code")
                .is_ok());
            assert!(access.check_metrics(&with_token).is_ok());
        }
    }

    #[test]
    fn loopback_without_a_token_is_open() {
        let access = AdminAccess::new(None, TokenOrigin::Configured, true);
        assert!(!access.required());
        assert!(access
            .check(&HeaderMap::new(), &Method::GET, "/api/status")
            .is_ok());
    }

    #[test]
    fn beyond_loopback_the_token_is_required_in_any_of_its_three_places() {
        let access = AdminAccess::new(
            Some(AdminToken("s3cret".into())),
            TokenOrigin::Configured,
            false,
        );
        assert!(access
            .check(&HeaderMap::new(), &Method::GET, "/api/status")
            .is_err());
        assert!(access
            .check(
                &headers(&[("authorization", "Bearer s3cret")]),
                &Method::GET,
                "/api/status"
            )
            .is_ok());
        assert!(access
            .check(
                &headers(&[("x-admin-token", "s3cret")]),
                &Method::GET,
                "/api/status"
            )
            .is_ok());
        assert!(
            access
                .check(&HeaderMap::new(), &Method::GET, "/api/events")
                .is_err(),
            "no token in a URL, not even for the event stream"
        );
        let wrong = access
            .check(
                &headers(&[("authorization", "Bearer nope")]),
                &Method::GET,
                "/api/status",
            )
            .unwrap_err();
        assert!(
            wrong.message.contains("wrong admin token"),
            "{}",
            wrong.message
        );
    }

    #[test]
    fn beyond_loopback_without_a_configured_token_everything_is_refused_with_advice() {
        let access = AdminAccess::new(None, TokenOrigin::Configured, false);
        let error = access
            .check(
                &headers(&[("authorization", "Bearer x")]),
                &Method::GET,
                "/api/status",
            )
            .unwrap_err();
        assert!(error.message.contains("MODELRELAY_ADMIN_TOKEN"));
    }

    #[test]
    fn a_configured_token_is_enforced_on_loopback_too() {
        let access = AdminAccess::new(Some(AdminToken("t".into())), TokenOrigin::Configured, true);
        assert!(access.required());
    }

    #[test]
    fn a_generated_token_leaves_only_the_status_open_on_loopback() {
        let stored = TokenOrigin::Stored("/data/admin-token".into());
        let access = AdminAccess::new(Some(AdminToken("t0k".into())), stored, true)
            .with_sessions(8080, false);
        assert!(!access.required());
        for (method, path) in OPEN_ON_LOOPBACK {
            assert!(access.check(&HeaderMap::new(), method, path).is_ok());
        }
        for (method, path) in [
            (Method::GET, "/api/join-code"),
            (Method::GET, "/api/settings"),
            (Method::GET, "/api/keys"),
            (Method::PUT, "/api/config"),
            (Method::POST, "/api/status"),
        ] {
            let refused = access.check(&HeaderMap::new(), &method, path).unwrap_err();
            assert_eq!(refused.status, StatusCode::UNAUTHORIZED, "{method} {path}");
            assert!(
                refused.message.contains("modelrelay dashboard"),
                "{}",
                refused.message
            );
            let token = headers(&[("authorization", "Bearer t0k")]);
            assert!(access.check(&token, &method, path).is_ok());
        }
        let sessions = access.sessions().unwrap();
        let cookie = sessions.start();
        let pair = cookie
            .to_str()
            .unwrap()
            .split(';')
            .next()
            .unwrap()
            .to_string();
        let signed_in = headers(&[("cookie", &pair)]);
        assert!(access
            .check(&signed_in, &Method::PUT, "/api/config")
            .is_ok());
        assert!(
            access.elevated(&signed_in, "x").is_ok(),
            "a session is a login"
        );
        let refused = access
            .elevated(&HeaderMap::new(), "changing worker.backend_url")
            .unwrap_err();
        assert_eq!(refused.status, StatusCode::FORBIDDEN);
        assert_eq!(refused.code, ELEVATION_CODE);
        assert!(
            refused.message.contains("/data/admin-token"),
            "{}",
            refused.message
        );
        let wrong = access
            .elevated(&headers(&[("authorization", "Bearer nope")]), "x")
            .unwrap_err();
        assert!(
            wrong.message.contains("Wrong admin token"),
            "{}",
            wrong.message
        );
        assert!(access
            .elevated(&headers(&[("authorization", "Bearer t0k")]), "x")
            .is_ok());
    }

    #[test]
    fn metrics_follow_the_control_rule_and_every_refusal_is_counted() {
        let open = AdminAccess::new(None, TokenOrigin::Configured, true);
        assert!(open.check_metrics(&HeaderMap::new()).is_ok());
        let access = AdminAccess::new(Some(AdminToken("t".into())), TokenOrigin::Configured, true);
        let missing = access.check_metrics(&HeaderMap::new()).unwrap_err();
        assert_eq!(missing.status, StatusCode::UNAUTHORIZED);
        assert!(
            missing.message.contains("--metrics-public"),
            "{}",
            missing.message
        );
        assert!(access
            .check_metrics(&headers(&[("authorization", "Bearer nope")]))
            .is_err());
        assert!(access.check_metrics(&HeaderMap::new()).is_err());
        assert!(access
            .check_metrics(&headers(&[("authorization", "Bearer t")]))
            .is_ok());
        assert!(access.elevated(&HeaderMap::new(), "x").is_err());
        let shared = access.clone();
        assert!(shared
            .check(&HeaderMap::new(), &Method::GET, "/api/status")
            .is_err());
        assert_eq!(access.failures(), 5, "clones share one count");
        assert_eq!(open.failures(), 0);
    }

    #[test]
    fn debug_never_shows_the_token() {
        let shown = format!(
            "{:?}",
            AdminAccess::new(
                Some(AdminToken("hunter2".into())),
                TokenOrigin::Configured,
                false
            )
        );
        assert!(!shown.contains("hunter2"), "{shown}");
    }
}
