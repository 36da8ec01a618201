//! Which of the routes the adapter can stand in for each backend serves itself.
//!
//! Recent llama-server builds serve `/v1/messages` and `/v1/responses`; Ollama before 0.14, older
//! vLLM, LM Studio before 0.4 and llamafile serve only chat completions. Rather than guess from a
//! fingerprint, the first request for a route is the probe: it goes to the route as it is, and
//! an answer that says "no such route" (see [`route_missing`]) marks the route as translated and
//! the request is served through chat completions instead. A backend that has the route costs
//! nothing extra; one that lacks it costs one quick 404 per refresh period.
//!
//! What was learned is kept per backend URL for one model-refresh interval, so a backend that is
//! upgraded or replaced behind the same URL is probed again soon after. `[worker]
//! native_messages` / `native_responses` settle a route without probing.
//!
//! Each owner keeps its own table (a worker for its backends, the proxy for its upstreams), so
//! one forgetting what it learned (a models refresh) or being configured differently never
//! changes what another does, whatever order they started in.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::http::StatusCode;

/// A route the adapter can translate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// `POST /v1/messages` (Anthropic Messages).
    Messages,
    /// `POST /v1/responses` (OpenAI Responses).
    Responses,
    /// `POST /v1/messages/count_tokens` (estimated when not native).
    CountTokens,
    /// `POST /tokenize` (vLLM's, with chat messages): how a translated `count_tokens` counts
    /// with the backend's own tokenizer.
    Tokenize,
}

impl Route {
    /// The route's path on a backend.
    pub fn path(self) -> &'static str {
        match self {
            Route::Messages => "/v1/messages",
            Route::Responses => "/v1/responses",
            Route::CountTokens => "/v1/messages/count_tokens",
            Route::Tokenize => "/tokenize",
        }
    }
}

/// How a request for a route is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// The backend serves the route: pass the request through.
    Native,
    /// The backend lacks the route: translate to chat completions (or estimate).
    Translated,
    /// Not known yet: send the request as it is and learn from the answer.
    Probe,
}

pub use crate::settings::NativeOverrides;

impl NativeOverrides {
    fn get(&self, route: Route) -> Option<bool> {
        match route {
            Route::Messages => self.messages,
            Route::Responses => self.responses,
            // Forced native messages still fall back to the estimate on a 404: servers that
            // have `/v1/messages` do not all have `count_tokens`.
            Route::CountTokens => self.messages.filter(|native| !native),
            Route::Tokenize => None,
        }
    }
}

/// What one worker configured: its overrides and how long a probe result lasts.
#[derive(Debug, Clone, Copy)]
struct Settings {
    overrides: NativeOverrides,
    reprobe_after: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            overrides: NativeOverrides::default(),
            reprobe_after: Duration::from_secs(30),
        }
    }
}

/// Settings and probe results by backend URL.
#[derive(Debug, Default)]
struct Table {
    /// Settings of backends configured by URL.
    by_backend: HashMap<String, Settings>,
    /// Settings of any other backend (discovered, or started by the model lifecycle).
    fallback: Settings,
    /// Probe results: whether the route is native, and when that was learned.
    learned: HashMap<(String, Route), (bool, Instant)>,
}

impl Table {
    fn settings(&self, backend: &str) -> Settings {
        self.by_backend
            .get(backend)
            .copied()
            .unwrap_or(self.fallback)
    }

    /// Records an owner's settings for `backends` (and for any backend not listed).
    fn configure(
        &mut self,
        backends: &[String],
        overrides: NativeOverrides,
        reprobe_after: Duration,
    ) {
        let settings = Settings {
            overrides,
            reprobe_after,
        };
        for backend in backends {
            self.by_backend.insert(key(backend), settings);
        }
        self.fallback = settings;
    }

    /// How to serve `route` on `backend` at `now`.
    fn support(&self, backend: &str, route: Route, now: Instant) -> Support {
        let backend = key(backend);
        let settings = self.settings(&backend);
        if let Some(native) = settings.overrides.get(route) {
            return if native {
                Support::Native
            } else {
                Support::Translated
            };
        }
        // A backend without `/v1/messages` has no `count_tokens` either.
        if route == Route::CountTokens
            && self.support(&backend, Route::Messages, now) == Support::Translated
        {
            return Support::Translated;
        }
        match self.learned.get(&(backend, route)) {
            Some((native, at)) if now.duration_since(*at) < settings.reprobe_after => {
                if *native {
                    Support::Native
                } else {
                    Support::Translated
                }
            }
            _ => Support::Probe,
        }
    }

    /// Records what a probe (or a native answer) showed.
    fn learn(&mut self, backend: &str, route: Route, native: bool, now: Instant) {
        self.learned.insert((key(backend), route), (native, now));
    }

    /// Forgets every probe result for `backend` (all backends when `None`), so the next
    /// requests probe again.
    fn forget(&mut self, backend: Option<&str>) {
        match backend {
            Some(backend) => {
                let backend = key(backend);
                self.learned.retain(|(b, _), _| *b != backend);
            }
            None => self.learned.clear(),
        }
    }
}

/// Backend URLs compare without a trailing slash.
fn key(backend: &str) -> String {
    backend.trim_end_matches('/').to_string()
}

/// An owner's table of which routes its backends serve; clones share it.
#[derive(Debug, Clone, Default)]
pub struct Capabilities {
    table: Arc<Mutex<Table>>,
}

impl Capabilities {
    /// A table with `overrides` for each of `backends` and for any backend found later, whose
    /// probe results last `reprobe_after`.
    pub fn new(backends: &[String], overrides: NativeOverrides, reprobe_after: Duration) -> Self {
        let capabilities = Capabilities::default();
        capabilities
            .table()
            .configure(backends, overrides, reprobe_after);
        capabilities
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        // The table holds no invariant a panic could break halfway.
        self.table
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// Settles the routes of one backend (an Anthropic upstream, say), leaving the others'.
    pub fn configure_backend(&self, backend: &str, overrides: NativeOverrides) {
        let mut table = self.table();
        let reprobe_after = table.fallback.reprobe_after;
        table.by_backend.insert(
            key(backend),
            Settings {
                overrides,
                reprobe_after,
            },
        );
    }

    /// How to serve `route` on `backend` now.
    pub(crate) fn support(&self, backend: &str, route: Route) -> Support {
        self.table().support(backend, route, Instant::now())
    }

    /// Records whether `backend` serves `route` itself.
    pub(crate) fn learn(&self, backend: &str, route: Route, native: bool) {
        if !native {
            tracing::info!(
                %backend,
                route = route.path(),
                "the backend does not serve this route: translating to chat completions"
            );
        }
        self.table().learn(backend, route, native, Instant::now());
    }

    /// Forgets what was learned about `backend` (every backend when `None`): the next request
    /// for each route probes again. For a model refresh that may have swapped the server behind
    /// a URL.
    pub fn forget(&self, backend: Option<&str>) {
        self.table().forget(backend);
    }
}

/// Whether an answer from a route means the backend has no such route: 404, 405 or 501 (unless
/// a 404 is about a model: Ollama and vLLM answer an unknown model that way on routes they
/// have), or LM Studio's "Unexpected endpoint or method" error, which older versions send for
/// any route they lack.
pub fn route_missing(status: StatusCode, body: &str) -> bool {
    match status.as_u16() {
        404 => !body.to_ascii_lowercase().contains("model"),
        405 | 501 => true,
        _ => body.contains("Unexpected endpoint or method"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: &str = "http://127.0.0.1:9";

    #[test]
    fn routes_are_probed_until_learned_and_again_after_the_refresh_interval() {
        let mut table = Table::default();
        let t0 = Instant::now();
        table.configure(
            &[B.to_string()],
            NativeOverrides::default(),
            Duration::from_secs(30),
        );
        assert_eq!(table.support(B, Route::Messages, t0), Support::Probe);
        table.learn(B, Route::Messages, false, t0);
        table.learn(B, Route::Responses, true, t0);
        let later = t0 + Duration::from_secs(29);
        assert_eq!(
            table.support(B, Route::Messages, later),
            Support::Translated
        );
        assert_eq!(table.support(B, Route::Responses, later), Support::Native);
        assert_eq!(
            table.support(&format!("{B}/"), Route::Messages, later),
            Support::Translated,
            "a trailing slash names the same backend"
        );
        let expired = t0 + Duration::from_secs(30);
        assert_eq!(table.support(B, Route::Messages, expired), Support::Probe);
        table.learn(B, Route::Messages, true, later);
        table.forget(Some(B));
        assert_eq!(table.support(B, Route::Messages, later), Support::Probe);
    }

    #[test]
    fn each_owner_keeps_its_own_table() {
        let worker = Capabilities::new(&[], NativeOverrides::default(), Duration::from_secs(30));
        let upstreams = Capabilities::default();
        let anthropic = NativeOverrides {
            messages: Some(true),
            responses: Some(false),
        };
        upstreams.configure_backend(B, anthropic);
        worker.learn(B, Route::Messages, false);
        upstreams.learn(B, Route::Responses, true);
        // The worker's refresh forgets only what the worker learned.
        worker.forget(None);
        assert_eq!(worker.support(B, Route::Messages), Support::Probe);
        assert_eq!(upstreams.support(B, Route::Messages), Support::Native);
        assert_eq!(upstreams.support(B, Route::Responses), Support::Translated);
        // Clones share their owner's table.
        let clone = worker.clone();
        clone.learn(B, Route::Responses, true);
        assert_eq!(worker.support(B, Route::Responses), Support::Native);
    }

    #[test]
    fn count_tokens_is_estimated_when_messages_are_translated() {
        let mut table = Table::default();
        let now = Instant::now();
        assert_eq!(table.support(B, Route::CountTokens, now), Support::Probe);
        table.learn(B, Route::Messages, false, now);
        assert_eq!(
            table.support(B, Route::CountTokens, now),
            Support::Translated
        );
    }

    #[test]
    fn configured_overrides_settle_routes_without_probing() {
        let mut table = Table::default();
        let now = Instant::now();
        let overrides = NativeOverrides {
            messages: Some(false),
            responses: Some(true),
        };
        table.configure(&[B.to_string()], overrides, Duration::from_secs(30));
        table.learn(B, Route::Messages, true, now);
        assert_eq!(table.support(B, Route::Messages, now), Support::Translated);
        assert_eq!(
            table.support(B, Route::CountTokens, now),
            Support::Translated
        );
        assert_eq!(table.support(B, Route::Responses, now), Support::Native);
        assert_eq!(
            table.support("http://elsewhere:1", Route::Messages, now),
            Support::Translated,
            "backends found later get the worker's settings too"
        );
        table.configure(
            &[B.to_string()],
            NativeOverrides {
                messages: Some(true),
                responses: None,
            },
            Duration::from_secs(30),
        );
        assert_eq!(
            table.support(B, Route::CountTokens, now),
            Support::Probe,
            "native messages do not promise count_tokens"
        );
    }

    #[test]
    fn route_missing_recognizes_each_servers_answer_for_an_unknown_route() {
        let missing = [
            (404, "404 page not found"),
            (404, r#"{"detail":"Not Found"}"#),
            (
                404,
                r#"{"error":{"code":404,"message":"File Not Found","type":"not_found_error"}}"#,
            ),
            (405, r#"{"detail":"Method Not Allowed"}"#),
            (501, ""),
            (
                200,
                r#"{"error":"Unexpected endpoint or method. (POST /v1/messages)"}"#,
            ),
        ];
        for (status, body) in missing {
            assert!(
                route_missing(StatusCode::from_u16(status).unwrap(), body),
                "{status} {body}"
            );
        }
        let present = [
            (
                404,
                r#"{"error":{"message":"model \"x\" not found, try pulling it first"}}"#,
            ),
            (400, r#"{"error":{"message":"messages is required"}}"#),
            (500, r#"{"error":{"message":"'messages' is required"}}"#),
            (200, r#"{"id":"msg_1","type":"message"}"#),
        ];
        for (status, body) in present {
            assert!(
                !route_missing(StatusCode::from_u16(status).unwrap(), body),
                "{status} {body}"
            );
        }
    }
}
