//! Who may reach the node from where, checked before any route runs.
//!
//! The node runs at login next to the user's browser, so every request may come from a web page.
//! Two browser attacks matter, and each has a rule that stops it by construction:
//!
//! - **DNS rebinding**: a page on `evil.example` re-resolves its own name to 127.0.0.1, and its
//!   requests then reach us as same-origin ones, carrying `Host: evil.example`. So a request
//!   whose `Host` is not a name of this machine is refused — on a loopback listener for every
//!   route, beyond loopback for the control plane (clients of `/v1` there may use any DNS name or
//!   a reverse proxy; their protection is the Origin rule below). An IP literal is always
//!   accepted: a rebinding page only ever has a host name.
//! - **Cross-site requests** (CSRF): a page on another origin posts to us (forms and `text/plain`
//!   posts need no preflight). A `/api` request whose `Origin` is not the UI's own (the desktop
//!   app's window shows the same page), or that a browser marks `Sec-Fetch-Site:
//!   cross-site|same-site`, is refused,
//!   whatever its method or content type. A `/v1` request carrying a foreign `Origin` is refused
//!   unless that origin is configured (`cors_origins`): browsers always send `Origin` on
//!   cross-site posts, while curl and the SDKs never do, so no existing client breaks.
//!
//! The same layer adds the headers that keep the UI from being framed or sniffed.

use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use tower_layer::Layer;
use tower_service::Service;

use crate::dialect::{ApiError, Dialect};

/// The UI's Content-Security-Policy: only its own scripts, styles and API; never framed. Inline
/// styles are allowed because the charts size themselves with `style` attributes; no inline
/// script is.
const UI_CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; \
form-action 'self'; frame-ancestors 'none'";

/// JSON and event streams are never documents: nothing in them may run or be framed.
const API_CSP: &str = "default-src 'none'; frame-ancestors 'none'";

/// Which rules a path falls under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Area {
    /// `/api/…`: the control plane.
    Control,
    /// `/v1/…`, `/health` and `/metrics`: clients, workers and monitoring. A scraper may reach
    /// the node by any DNS name, like a client; `/metrics` has its own token rule.
    Clients,
    /// Everything else: the web UI's page and files.
    Ui,
}

impl Area {
    fn of(path: &str) -> Area {
        if path == "/api" || path.starts_with("/api/") {
            Area::Control
        } else if path.starts_with("/v1/")
            || path == "/v1"
            || path == "/health"
            || path == "/metrics"
        {
            Area::Clients
        } else {
            Area::Ui
        }
    }
}

/// The rules for one listener.
#[derive(Debug, Clone)]
pub struct SiteGuard(Arc<Rules>);

#[derive(Debug, Clone)]
struct Rules {
    /// Host checks cover every route (the listener is on loopback).
    loopback_listener: bool,
    /// Accepted host names besides loopback names and IP literals, lower case, no port.
    host_names: Vec<String>,
    /// `allowed_hosts` contains `*`: the Host check is off.
    any_host: bool,
    /// Origins that may call `/v1` cross-origin (`cors_origins`), lower case, no trailing `/`.
    cors_origins: Vec<String>,
    /// `cors_origins` contains `*`.
    any_origin: bool,
}

/// How a request's `Origin` relates to this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OriginKind {
    /// No `Origin` header.
    Absent,
    /// The node's own origin (the UI's pages).
    Own,
    /// Configured in `cors_origins`.
    Configured,
    /// Anything else, `null` included.
    Foreign,
}

impl SiteGuard {
    /// Rules for a listener on `loopback_listener` (or not), accepting `machine_names` (this
    /// machine's host name and mDNS name) and the configured `allowed_hosts` and `cors_origins`.
    pub fn new(
        loopback_listener: bool,
        machine_names: &[String],
        allowed_hosts: &[String],
        cors_origins: &[String],
    ) -> Self {
        let normalise = |name: &String| name.trim().trim_end_matches('.').to_ascii_lowercase();
        let host_names = machine_names
            .iter()
            .chain(allowed_hosts)
            .map(normalise)
            .filter(|name| !name.is_empty() && name != "*")
            .collect();
        let cors: Vec<String> = cors_origins
            .iter()
            .map(|origin| origin.trim().trim_end_matches('/').to_ascii_lowercase())
            .filter(|origin| !origin.is_empty())
            .collect();
        SiteGuard(Arc::new(Rules {
            loopback_listener,
            host_names,
            any_host: allowed_hosts.iter().any(|h| h.trim() == "*"),
            any_origin: cors.iter().any(|o| o == "*"),
            cors_origins: cors.into_iter().filter(|o| o != "*").collect(),
        }))
    }

    /// This machine's names: its host name and the `.local` name mDNS answers for.
    pub fn machine_names() -> Vec<String> {
        let host = crate::lan::host_name();
        let first_label = host.split('.').next().unwrap_or_default().to_string();
        let mut names = vec![host.clone(), format!("{first_label}.local")];
        names.dedup();
        names
    }

    /// Whether `host` (a `Host` header value, port allowed) names this machine.
    fn host_allowed(&self, host: &str) -> bool {
        if self.0.any_host {
            return true;
        }
        let name = host_name_part(host).to_ascii_lowercase();
        let name = name.trim_end_matches('.');
        if name.parse::<IpAddr>().is_ok() {
            return true;
        }
        name == "localhost"
            || name.ends_with(".localhost")
            || self.0.host_names.iter().any(|allowed| allowed == name)
    }

    fn origin_kind(&self, headers: &HeaderMap, host_ok: bool) -> OriginKind {
        let Some(origin) = headers.get(header::ORIGIN) else {
            return OriginKind::Absent;
        };
        let Ok(origin) = origin.to_str() else {
            return OriginKind::Foreign;
        };
        let origin = origin.trim_end_matches('/');
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or_default();
        let own = host_ok
            && !host.is_empty()
            && origin.split_once("://").is_some_and(|(scheme, rest)| {
                matches!(scheme, "http" | "https") && rest.eq_ignore_ascii_case(host)
            });
        if own {
            return OriginKind::Own;
        }
        let lower = origin.to_ascii_lowercase();
        if self.0.any_origin || self.0.cors_origins.contains(&lower) {
            return OriginKind::Configured;
        }
        OriginKind::Foreign
    }
}

/// The host part of a `Host` value: `name`, `name:port`, `[v6]` or `[v6]:port`.
fn host_name_part(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or_default();
    }
    match host.rsplit_once(':') {
        // One colon: `name:port`. More without brackets is a bare IPv6 address.
        Some((name, port)) if !name.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            name
        }
        _ => host,
    }
}

/// Whether a browser marked the request as coming from another site.
fn marked_cross_site(headers: &HeaderMap) -> bool {
    headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|site| !matches!(site, "same-origin" | "none"))
}

/// Why a request is refused: its error code and message.
#[derive(Debug)]
struct Refusal {
    code: &'static str,
    message: String,
}

fn forbidden(code: &'static str, message: String) -> Refusal {
    Refusal { code, message }
}

impl Refusal {
    /// The 403 in the dialect of `path`, with the area's headers.
    fn into_response(self, path: &str) -> Response {
        let mut response = ApiError::new(StatusCode::FORBIDDEN, self.code, self.message)
            .into_response(Dialect::for_path(path));
        add_headers(&mut response, Area::of(path));
        response
    }
}

/// The verdict on one request: how its origin relates to this node, or why it is refused.
fn check(guard: &SiteGuard, request: &Request) -> Result<OriginKind, Refusal> {
    let path = request.uri().path();
    let area = Area::of(path);
    let headers = request.headers();
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    // No Host at all is not a browser (browsers always send one): nothing to rebind.
    let host_ok = host.is_none_or(|h| guard.host_allowed(h));
    if !host_ok && (guard.0.loopback_listener || area != Area::Clients) {
        let host = host.unwrap_or_default();
        return Err(forbidden(
            "host_not_allowed",
            format!(
                "Host {host:?} is not a name of this machine, so this request may come from a \
                 web page that re-resolved its own name to this address (DNS rebinding); if \
                 you reach ModelRelay by this name, add it to allowed_hosts in the config file \
                 or to MODELRELAY_ALLOWED_HOSTS"
            ),
        ));
    }
    let origin = guard.origin_kind(headers, host_ok);
    match area {
        Area::Control => {
            let foreign = match origin {
                OriginKind::Own => false,
                OriginKind::Absent => marked_cross_site(headers),
                OriginKind::Configured | OriginKind::Foreign => true,
            };
            if foreign {
                return Err(forbidden(
                    "cross_site_request",
                    "the control API answers only the dashboard's own pages; this request \
                     came from another site"
                        .to_string(),
                ));
            }
        }
        Area::Clients if origin == OriginKind::Foreign => {
            let shown = headers
                .get(header::ORIGIN)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("null");
            return Err(forbidden(
                "origin_not_allowed",
                format!(
                    "requests from web pages of {shown:?} are not allowed: if this web app \
                     should use ModelRelay, add its origin to cors_origins in the config file \
                     or to MODELRELAY_CORS_ORIGINS"
                ),
            ));
        }
        Area::Clients | Area::Ui => {}
    }
    Ok(origin)
}

/// What the guard makes of a request before any route runs.
enum Admission {
    /// Answered here: refused, or a configured origin's preflight.
    Answer(Response),
    /// On to the route; its answer gets the area's headers, and the CORS grant when a
    /// configured origin asked.
    Pass {
        area: Area,
        cors_origin: Option<HeaderValue>,
    },
}

/// Refuses what [`check`] refuses, answers configured origins' preflights on `/v1`, and lets
/// the rest through.
fn admit(guard: &SiteGuard, request: &Request) -> Admission {
    let origin = match check(guard, request) {
        Ok(origin) => origin,
        Err(refusal) => return Admission::Answer(refusal.into_response(request.uri().path())),
    };
    let area = Area::of(request.uri().path());
    let cors_origin = (area == Area::Clients && origin == OriginKind::Configured)
        .then(|| request.headers().get(header::ORIGIN).cloned())
        .flatten();
    match cors_origin {
        Some(allowed) if request.method() == Method::OPTIONS => {
            Admission::Answer(preflight(allowed))
        }
        cors_origin => Admission::Pass { area, cors_origin },
    }
}

/// Adds the security headers of `area` and the CORS grant to a route's answer.
fn finish(response: &mut Response, area: Area, cors_origin: Option<HeaderValue>) {
    add_headers(response, area);
    if let Some(allowed) = cors_origin {
        let headers = response.headers_mut();
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allowed);
        headers.insert(header::VARY, HeaderValue::from_static("origin"));
    }
}

/// The guard as a layer on every route (`Router::layer(site_guard)`). Written by hand rather
/// than with `axum::middleware::from_fn`: `from_fn` boxes a future per request holding the
/// request's parts and the rest of the stack while the route runs (0.9 KB for every request
/// waiting for its answer at the peak of `idle10k`, BENCHMARKS.md). Here the check runs before
/// the route is called, and what waits is the route's own future plus the area and the CORS
/// grant.
impl<S> Layer<S> for SiteGuard {
    type Service = Guarded<S>;

    fn layer(&self, inner: S) -> Guarded<S> {
        Guarded {
            guard: self.clone(),
            inner,
        }
    }
}

/// A route behind the [`SiteGuard`].
#[derive(Debug, Clone)]
pub struct Guarded<S> {
    guard: SiteGuard,
    inner: S,
}

impl<S> Service<Request> for Guarded<S>
where
    S: Service<Request, Response = Response, Error = Infallible> + Clone,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Guarding<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        match admit(&self.guard, &request) {
            Admission::Answer(response) => Guarding::Answered {
                response: Some(response),
            },
            Admission::Pass { area, cors_origin } => {
                // The service that was polled ready is the one called; a clone takes its place.
                let clone = self.inner.clone();
                let mut ready = std::mem::replace(&mut self.inner, clone);
                Guarding::Passing {
                    route: ready.call(request),
                    area,
                    cors_origin,
                }
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// A request's way through the [`SiteGuard`].
    #[project = GuardingProjection]
    pub enum Guarding<F> {
        /// Answered by the guard itself.
        Answered { response: Option<Response> },
        /// Answered by the route, then finished with the guard's headers.
        Passing {
            #[pin]
            route: F,
            area: Area,
            cors_origin: Option<HeaderValue>,
        },
    }
}

impl<F> Future for Guarding<F>
where
    F: Future<Output = Result<Response, Infallible>>,
{
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            GuardingProjection::Answered { response } => Poll::Ready(Ok(response
                .take()
                .expect("a guard future polled after it ended"))),
            GuardingProjection::Passing {
                route,
                area,
                cors_origin,
            } => {
                let Ok(mut response) = std::task::ready!(route.poll(cx));
                finish(&mut response, *area, cors_origin.take());
                Poll::Ready(Ok(response))
            }
        }
    }
}

/// The answer to a configured origin's CORS preflight on `/v1`.
fn preflight(origin: HeaderValue) -> Response {
    cors_preflight(
        origin,
        "GET, POST, DELETE, OPTIONS",
        "authorization, content-type, x-api-key, anthropic-version, anthropic-beta, \
         openai-organization, openai-project, x-stainless-arch, x-stainless-lang, \
         x-stainless-os, x-stainless-package-version, x-stainless-retry-count, \
         x-stainless-runtime, x-stainless-runtime-version, x-stainless-timeout",
    )
}

/// A `204` granting `origin` the `methods` and request `headers` for ten minutes.
pub(crate) fn cors_preflight(
    origin: HeaderValue,
    methods: &'static str,
    headers: &'static str,
) -> Response {
    let mut response = StatusCode::NO_CONTENT.into_response();
    let answer = response.headers_mut();
    answer.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    answer.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static(methods),
    );
    answer.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static(headers),
    );
    answer.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("600"),
    );
    answer.insert(header::VARY, HeaderValue::from_static("origin"));
    response
}

fn add_headers(response: &mut Response, area: Area) {
    let headers = response.headers_mut();
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    match area {
        Area::Ui => {
            headers.insert(
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(UI_CSP),
            );
            headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
            headers.insert(
                header::REFERRER_POLICY,
                HeaderValue::from_static("no-referrer"),
            );
        }
        Area::Control => {
            headers.insert(
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(API_CSP),
            );
            // Answers carry secrets (the join code) and live state: never kept by a cache.
            headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        }
        Area::Clients => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;

    fn guard(loopback: bool) -> SiteGuard {
        SiteGuard::new(
            loopback,
            &["gpu-box".to_string(), "gpu-box.local".to_string()],
            &["relay.home.arpa".to_string()],
            &["https://chat.example".to_string()],
        )
    }

    fn request(method: &str, path: &str, headers: &[(&str, &str)]) -> Request {
        let mut builder = Request::builder().method(method).uri(path);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(Body::empty()).unwrap()
    }

    /// `request` through `app` as the server would send it.
    async fn through(app: &mut axum::Router, request: Request) -> Response {
        std::future::poll_fn(|cx| <axum::Router as Service<Request>>::poll_ready(app, cx))
            .await
            .unwrap();
        app.call(request).await.unwrap()
    }

    #[tokio::test]
    async fn the_layer_grants_configured_origins_answers_their_preflights_and_never_runs_a_refused_route(
    ) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = runs.clone();
        let route = move || {
            counted.fetch_add(1, Ordering::SeqCst);
            async { "models" }
        };
        let mut app = axum::Router::new()
            .route("/v1/models", axum::routing::get(route))
            .route("/", axum::routing::get(|| async { "page" }))
            .layer(guard(true));
        let host = ("host", "127.0.0.1:8080");
        let from_chat = |method| {
            request(
                method,
                "/v1/models",
                &[host, ("origin", "https://chat.example")],
            )
        };

        let granted = through(&mut app, from_chat("GET")).await;
        assert_eq!(granted.status(), StatusCode::OK);
        assert_eq!(
            granted.headers()[header::ACCESS_CONTROL_ALLOW_ORIGIN],
            "https://chat.example"
        );
        assert_eq!(granted.headers()[header::VARY], "origin");
        assert_eq!(granted.headers()[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        assert_eq!(runs.load(Ordering::SeqCst), 1);

        let preflight = through(&mut app, from_chat("OPTIONS")).await;
        assert_eq!(preflight.status(), StatusCode::NO_CONTENT);
        assert_eq!(
            preflight.headers()[header::ACCESS_CONTROL_ALLOW_ORIGIN],
            "https://chat.example"
        );

        let no_origin = through(&mut app, request("GET", "/v1/models", &[host])).await;
        assert_eq!(no_origin.status(), StatusCode::OK);
        assert!(no_origin
            .headers()
            .get(header::ACCESS_CONTROL_ALLOW_ORIGIN)
            .is_none());
        assert_eq!(runs.load(Ordering::SeqCst), 2);

        for refused in [
            request(
                "GET",
                "/v1/models",
                &[host, ("origin", "https://evil.example")],
            ),
            request("GET", "/v1/models", &[("host", "evil.example:8080")]),
        ] {
            let answer = through(&mut app, refused).await;
            assert!(answer.status().is_client_error(), "{}", answer.status());
            assert_eq!(runs.load(Ordering::SeqCst), 2, "a refused route never runs");
        }

        let page = through(&mut app, request("GET", "/", &[host])).await;
        assert_eq!(page.status(), StatusCode::OK);
        assert_eq!(page.headers()[header::X_FRAME_OPTIONS], "DENY");
        assert!(page.headers().contains_key(header::CONTENT_SECURITY_POLICY));
    }

    fn refusal_code(result: Result<OriginKind, Refusal>) -> Option<StatusCode> {
        result
            .err()
            .map(|refusal| refusal.into_response("/api/x").status())
    }

    #[test]
    fn loopback_names_ip_literals_machine_names_and_configured_names_are_hosts_of_this_machine() {
        let g = guard(true);
        for host in [
            "127.0.0.1:8080",
            "localhost:8080",
            "LOCALHOST",
            "app.localhost:1",
            "[::1]:8080",
            "192.168.1.20:8080",
            "gpu-box:8080",
            "gpu-box.local.:8080",
            "relay.home.arpa",
        ] {
            assert!(g.host_allowed(host), "{host}");
        }
        for host in [
            "evil.example:8080",
            "localhost.evil.example",
            "127.0.0.1.evil.example",
            "gpu-box.evil",
            "",
            "2130706433",
        ] {
            assert!(!g.host_allowed(host), "{host}");
        }
    }

    #[test]
    fn a_star_in_allowed_hosts_turns_the_host_check_off() {
        let g = SiteGuard::new(true, &[], &["*".to_string()], &[]);
        assert!(g.host_allowed("anything.example"));
    }

    #[test]
    fn a_rebinding_host_is_refused_on_every_route_of_a_loopback_listener() {
        let g = guard(true);
        for path in [
            "/api/join-code",
            "/v1/chat/completions",
            "/",
            "/health",
            "/metrics",
        ] {
            let verdict = check(&g, &request("GET", path, &[("host", "evil.example:8080")]));
            assert_eq!(refusal_code(verdict), Some(StatusCode::FORBIDDEN), "{path}");
        }
    }

    #[test]
    fn beyond_loopback_an_unknown_host_may_use_v1_and_metrics_but_not_the_control_plane() {
        let g = guard(false);
        let v1 = check(
            &g,
            &request("POST", "/v1/chat/completions", &[("host", "ai.lan")]),
        );
        assert!(v1.is_ok());
        let scrape = check(
            &g,
            &request("GET", "/metrics", &[("host", "relay.internal")]),
        );
        assert!(
            scrape.is_ok(),
            "a scraper may use any name; /metrics has its token rule"
        );
        let api = check(&g, &request("GET", "/api/status", &[("host", "ai.lan")]));
        assert_eq!(refusal_code(api), Some(StatusCode::FORBIDDEN));
    }

    #[test]
    fn control_requests_from_another_origin_are_refused_whatever_their_method() {
        let g = guard(true);
        let host = ("host", "127.0.0.1:8080");
        for (method, origin) in [
            ("POST", "http://evil.example"),
            ("GET", "http://127.0.0.1:9999"),
            ("PUT", "null"),
            ("POST", "https://chat.example"),
        ] {
            let verdict = check(
                &g,
                &request(method, "/api/models/refresh", &[host, ("origin", origin)]),
            );
            assert_eq!(
                refusal_code(verdict),
                Some(StatusCode::FORBIDDEN),
                "{method} {origin}"
            );
        }
        let marked = check(
            &g,
            &request(
                "POST",
                "/api/config",
                &[host, ("sec-fetch-site", "same-site")],
            ),
        );
        assert_eq!(refusal_code(marked), Some(StatusCode::FORBIDDEN));
    }

    #[test]
    fn the_desktop_apps_old_webview_origins_are_foreign() {
        // The desktop window shows the node's own page now: no other origin is its own.
        let g = guard(true);
        for origin in ["tauri://localhost", "http://tauri.localhost"] {
            let headers = [("host", "127.0.0.1:8080"), ("origin", origin)];
            assert_eq!(
                refusal_code(check(&g, &request("POST", "/api/models/refresh", &headers))),
                Some(StatusCode::FORBIDDEN),
                "{origin}"
            );
        }
    }

    #[test]
    fn the_dashboard_and_non_browser_clients_may_use_the_control_api() {
        let g = guard(true);
        let host = ("host", "127.0.0.1:8080");
        for extra in [
            vec![("origin", "http://127.0.0.1:8080")],
            vec![("sec-fetch-site", "same-origin")],
            vec![("sec-fetch-site", "none")],
            vec![],
        ] {
            let mut headers = vec![host];
            headers.extend(extra.iter().copied());
            assert!(
                check(&g, &request("POST", "/api/models/refresh", &headers)).is_ok(),
                "{extra:?}"
            );
        }
    }

    #[test]
    fn a_rebound_page_is_not_its_own_origin() {
        // Beyond loopback a /v1 request with an unknown Host passes the host rule, but its
        // Origin matching that Host does not make it "own".
        let g = guard(false);
        let verdict = check(
            &g,
            &request(
                "POST",
                "/v1/chat/completions",
                &[
                    ("host", "evil.example:8080"),
                    ("origin", "http://evil.example:8080"),
                ],
            ),
        );
        assert_eq!(refusal_code(verdict), Some(StatusCode::FORBIDDEN));
    }

    #[test]
    fn v1_refuses_foreign_origins_and_accepts_configured_ones_and_none() {
        let g = guard(true);
        let host = ("host", "127.0.0.1:8080");
        let foreign = check(
            &g,
            &request(
                "POST",
                "/v1/messages",
                &[host, ("origin", "http://evil.example")],
            ),
        )
        .unwrap_err();
        assert_eq!(foreign.code, "origin_not_allowed");
        let configured = check(
            &g,
            &request(
                "POST",
                "/v1/messages",
                &[host, ("origin", "https://CHAT.example/")],
            ),
        );
        assert_eq!(configured.ok(), Some(OriginKind::Configured));
        assert_eq!(
            check(&g, &request("POST", "/v1/messages", &[host])).ok(),
            Some(OriginKind::Absent)
        );
    }

    proptest::proptest! {
        /// Hostile Host and Origin values never panic the guard, and a name under someone
        /// else's domain is never taken for this machine's, however it is dressed up.
        #[test]
        fn hostile_host_and_origin_values_are_refused_without_panicking(
            label in "[a-z0-9.-]{0,20}",
            noise in "\\PC{0,40}",
            port in proptest::option::of(0u32..70000),
        ) {
            let g = guard(true);
            let port = port.map(|p| format!(":{p}")).unwrap_or_default();
            let rebinding = format!("{label}.evil.example{port}");
            proptest::prop_assert!(!g.host_allowed(&rebinding), "{}", rebinding);
            let _ = g.host_allowed(&noise);
            if let Ok(value) = HeaderValue::from_str(&noise) {
                let mut headers = HeaderMap::new();
                headers.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8080"));
                headers.insert(header::ORIGIN, value);
                let kind = g.origin_kind(&headers, true);
                proptest::prop_assert!(kind != OriginKind::Own || noise.ends_with("127.0.0.1:8080"));
            }
        }
    }

    #[test]
    fn host_values_are_split_from_their_port() {
        assert_eq!(host_name_part("a.example:80"), "a.example");
        assert_eq!(host_name_part("[::1]:80"), "::1");
        assert_eq!(host_name_part("[::1]"), "::1");
        assert_eq!(host_name_part("a.example"), "a.example");
        assert_eq!(host_name_part("::1"), "::1");
    }
}
