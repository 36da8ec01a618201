//! Client API keys at the door: who a request comes from (a key, or anonymous), whether it may
//! come in (`require_api_keys`), and what its key allows (models, requests per minute, requests
//! at once).
//!
//! A key travels as `Authorization: Bearer mr-…` (OpenAI SDKs, curl) or `x-api-key: mr-…`
//! (Anthropic SDKs, Claude Code's `ANTHROPIC_API_KEY`). Without `require_api_keys` a request
//! with no key, or with a credential that is not one of ours (a client configured for another
//! provider), is served as anonymous; a key of ours still counts, so its usage and limits apply.

use std::borrow::Cow;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, HttpBody};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::Response;

use crate::dialect::{ApiError, Dialect};
use crate::proxy::access::credentials::FailureLimiter;
use crate::proxy::access::priority::client_of;
use crate::proxy::dispatch::telemetry::Telemetry;
use crate::store::usage::ANONYMOUS;
use crate::store::{ApiKey, KeyStore};

/// Who a request comes from; in the request's extensions once [`identify`] let it in.
#[derive(Debug, Clone)]
pub struct ClientIdentity {
    /// The key it presented, when that is one of ours.
    pub key: Option<Arc<ApiKey>>,
    /// The key's id, or `anonymous`: what usage and the metrics account it under.
    pub account: Cow<'static, str>,
    /// Who takes turns in the queue: the key's id, else the peer's address
    /// ([`crate::proxy::access::priority::client_of`]).
    pub client: Option<Arc<str>>,
}

impl ClientIdentity {
    /// A request without a key of ours.
    pub fn anonymous() -> ClientIdentity {
        ClientIdentity {
            key: None,
            account: Cow::Borrowed(ANONYMOUS),
            client: None,
        }
    }

    /// The refusal when its key may not use `model`.
    pub fn check_model(&self, model: &str) -> Result<(), ApiError> {
        let Some(key) = &self.key else { return Ok(()) };
        if key.allows(model) {
            return Ok(());
        }
        let allowed = key.models.as_deref().unwrap_or_default().join(", ");
        Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "model_not_allowed",
            format!(
                "this API key ({}) may not use model {model:?}; it may use: {allowed}",
                key.prefix
            ),
        ))
    }
}

/// The credentials a request presents, in the order they are tried.
fn presented(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        });
    let api_key = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim);
    bearer.into_iter().chain(api_key).filter(|v| !v.is_empty())
}

/// What [`identify`] needs: a few handles, not the whole [`crate::proxy::AppState`], whose clone on
/// every request would cost a score of reference-count updates.
#[derive(Clone)]
pub struct KeyGate {
    pub keys: Arc<KeyStore>,
    pub required: bool,
    pub telemetry: Arc<Telemetry>,
    /// The proxy's one failure limiter: wrong keys count where keys are required.
    pub limiter: Arc<FailureLimiter>,
}

/// Middleware on the client routes: puts the [`ClientIdentity`] in the request, or refuses it
/// (401, in the route's dialect) when keys are required and it has no valid one.
pub async fn identify(State(gate): State<KeyGate>, mut request: Request, next: Next) -> Response {
    let headers = request.headers();
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|info| info.0.ip());
    // Where keys are required, a key is a credential like any other: an address that sent too
    // many wrong ones waits. (Where they are not, any placeholder a client sends is fine.)
    if let (true, Some(ip), true) = (gate.required, peer, presented(headers).next().is_some()) {
        if let Err(wait) = gate.limiter.check(ip, Instant::now()) {
            let dialect = Dialect::for_path(request.uri().path());
            return crate::proxy::access::admin::locked_out(wait).into_response(dialect);
        }
    }
    let mut key = None;
    for secret in presented(headers) {
        key = gate.keys.authenticate(secret).await;
        if key.is_some() {
            break;
        }
    }
    let identity = match key {
        Some(key) => ClientIdentity {
            account: Cow::Owned(key.id.clone()),
            client: client_of(Some(&key), peer),
            key: Some(key),
        },
        None if gate.required => {
            let dialect = Dialect::for_path(request.uri().path());
            let error = if presented(headers).next().is_some() {
                if let Some(ip) = peer {
                    gate.limiter.record_key_failure(ip, Instant::now());
                }
                ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "invalid_api_key",
                    "the API key is not valid or was revoked: create one with POST /admin/keys \
                     (or the dashboard's Keys page) and send it as `Authorization: Bearer mr-…` \
                     or `x-api-key: mr-…`",
                )
            } else {
                ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "missing_api_key",
                    "this relay requires an API key: send it as `Authorization: Bearer mr-…` \
                     or `x-api-key: mr-…` (create one with POST /admin/keys or the dashboard's \
                     Keys page)",
                )
            };
            gate.telemetry.client_auth_failed();
            return error.into_response(dialect);
        }
        None => ClientIdentity {
            client: client_of(None, peer),
            ..ClientIdentity::anonymous()
        },
    };
    request.extensions_mut().insert(identity);
    next.run(request).await
}

/// What each key has used of its limits, in this proxy.
#[derive(Debug, Default)]
pub struct KeyLimits {
    by_key: Mutex<HashMap<String, Usage>>,
}

#[derive(Debug)]
struct Usage {
    in_flight: u32,
    /// Requests it may still start now (a bucket of `requests_per_minute`, refilled evenly).
    allowance: f64,
    refilled: Instant,
}

/// One request of a key counted against its concurrency; released when dropped.
#[derive(Debug)]
pub struct KeyPermit {
    limits: Arc<KeyLimits>,
    key: String,
}

impl Drop for KeyPermit {
    fn drop(&mut self) {
        let mut by_key = self.limits.lock();
        if let Some(usage) = by_key.get_mut(&self.key) {
            usage.in_flight = usage.in_flight.saturating_sub(1);
        }
    }
}

impl KeyLimits {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Usage>> {
        self.by_key.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a request of `key` against its limits, or refuses it (429 with `Retry-After`).
    pub fn admit(self: &Arc<Self>, key: &ApiKey) -> Result<KeyPermit, ApiError> {
        let now = Instant::now();
        let mut by_key = self.lock();
        let usage = by_key.entry(key.id.clone()).or_insert_with(|| Usage {
            in_flight: 0,
            allowance: key.requests_per_minute.map_or(0.0, f64::from),
            refilled: now,
        });
        if let Some(cap) = key.max_concurrent {
            if usage.in_flight >= cap {
                return Err(ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "key_concurrency_limit",
                    format!(
                        "this API key ({}) already has {cap} requests running or waiting, its \
                         max_concurrent; retry when one ends",
                        key.prefix
                    ),
                )
                .retry_after(Duration::from_secs(1)));
            }
        }
        if let Some(per_minute) = key.requests_per_minute {
            let rate = f64::from(per_minute) / 60.0;
            let elapsed = now.duration_since(usage.refilled).as_secs_f64();
            usage.allowance = (usage.allowance + elapsed * rate).min(f64::from(per_minute));
            usage.refilled = now;
            if usage.allowance < 1.0 {
                let wait = ((1.0 - usage.allowance) / rate).ceil().max(1.0);
                return Err(ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "key_rate_limit",
                    format!(
                        "this API key ({}) made its {per_minute} requests of the last minute \
                         (requests_per_minute); retry in {wait} s",
                        key.prefix
                    ),
                )
                .retry_after(Duration::from_secs_f64(wait)));
            }
            usage.allowance -= 1.0;
        }
        usage.in_flight += 1;
        Ok(KeyPermit {
            limits: Arc::clone(self),
            key: key.id.clone(),
        })
    }
}

/// `response` with `held` kept alive until its body has been sent (or dropped): a stream's
/// permit must last as long as the stream, not as long as the handler.
pub fn hold_until_sent<T: Send + Sync + Unpin + 'static>(response: Response, held: T) -> Response {
    response.map(|body| Body::new(Holding { body, _held: held }))
}

struct Holding<T> {
    body: Body,
    _held: T,
}

impl<T: Unpin> HttpBody for Holding<T> {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(max_concurrent: Option<u32>, requests_per_minute: Option<u32>) -> ApiKey {
        ApiKey {
            id: "key_1".into(),
            name: "ci".into(),
            prefix: "mr-AbCdE".into(),
            created_at: 0,
            revoked_at: None,
            last_used_at: None,
            models: Some(vec!["small".into()]),
            max_concurrent,
            requests_per_minute,
            priority: crate::store::KeyPriority::Interactive,
            weight: None,
        }
    }

    #[test]
    fn a_key_runs_at_most_its_concurrency_and_a_finished_request_frees_its_place() {
        let limits = Arc::new(KeyLimits::default());
        let key = key(Some(2), None);
        let first = limits.admit(&key).unwrap();
        let _second = limits.admit(&key).unwrap();
        let refused = limits.admit(&key).unwrap_err();
        assert_eq!(
            (refused.status, refused.code),
            (StatusCode::TOO_MANY_REQUESTS, "key_concurrency_limit")
        );
        assert!(refused.retry_after.is_some());
        drop(first);
        assert!(limits.admit(&key).is_ok());
    }

    #[test]
    fn a_key_makes_at_most_its_requests_per_minute_and_is_told_when_to_retry() {
        let limits = Arc::new(KeyLimits::default());
        let key = key(None, Some(3));
        for _ in 0..3 {
            drop(limits.admit(&key).unwrap());
        }
        let refused = limits.admit(&key).unwrap_err();
        assert_eq!(refused.code, "key_rate_limit");
        let wait = refused.retry_after.unwrap();
        assert!(
            wait >= Duration::from_secs(1) && wait <= Duration::from_secs(20),
            "{wait:?}"
        );
    }

    #[test]
    fn the_allow_list_names_what_the_key_may_use() {
        let identity = ClientIdentity {
            key: Some(Arc::new(key(None, None))),
            account: Cow::Borrowed("key_1"),
            client: None,
        };
        assert!(identity.check_model("small").is_ok());
        let refused = identity.check_model("big").unwrap_err();
        assert_eq!(refused.status, StatusCode::FORBIDDEN);
        assert!(
            refused.message.contains("may use: small"),
            "{}",
            refused.message
        );
        assert!(ClientIdentity::anonymous().check_model("big").is_ok());
    }

    #[test]
    fn credentials_are_read_from_bearer_and_x_api_key() {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, "bearer  mr-a ".parse().unwrap());
        headers.insert("x-api-key", "mr-b".parse().unwrap());
        assert_eq!(presented(&headers).collect::<Vec<_>>(), ["mr-a", "mr-b"]);
        headers.insert(header::AUTHORIZATION, "Basic xyz".parse().unwrap());
        assert_eq!(presented(&headers).collect::<Vec<_>>(), ["mr-b"]);
    }
}
