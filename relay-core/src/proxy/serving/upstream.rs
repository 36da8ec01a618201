//! Upstream providers: an OpenAI-compatible or an Anthropic HTTP API (a cloud provider, or any
//! server the proxy can reach) that the proxy calls itself, without a worker.
//!
//! Workers come first: a request goes upstream only when no worker serves its model (then to
//! the first upstream whose `models` match, exactly or by glob, else to `fallback_upstream`),
//! or when the model's queue is full (then to `fallback_upstream`). The proxy calls it through
//! the [`backend`](crate::backend) module in-process, so an upstream gets the same treatment as
//! a worker's local backend: routes it lacks (an OpenAI-compatible API has no `/v1/messages`)
//! are translated by the adapter, and streams are relayed as they arrive, through the same
//! [`Waiter`] as a worker's answers. An Anthropic upstream serves OpenAI Chat and Responses
//! clients the same way, through the adapter's Messages converters. The client's credentials
//! never travel upstream; the upstream's API key replaces them, and it is never logged (`Debug`
//! redacts it).

mod models;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::Response;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::adapter::ClientApi;
use crate::backend::{Backend, BackendRequest, Capabilities, NativeOverrides, Speaks};
use crate::dialect::{ApiError, Dialect};
use crate::endpoint::Endpoint;
use crate::protocol::WireHeaders;
use crate::proxy::dispatch::hub::{SubmitError, TrackedRequest};
use crate::proxy::serving::aliases::glob_match;
use crate::proxy::serving::response::{AnswerObserver, AnswerSource, CancelGuard, Waiter};
use crate::settings::defaults;

/// Events an upstream call may have waiting for its client: a few, so a slow client slows the
/// upstream read instead of filling memory.
const UPSTREAM_EVENTS: usize = 16;

pub use crate::settings::UpstreamKind;

pub use crate::settings::UpstreamConfig;

/// How an Anthropic upstream serves a route: `Some(true)` natively (Messages), `Some(false)`
/// translated (OpenAI Chat, Responses), `None` not at all (completions, embeddings).
fn anthropic_route(path: &str) -> Option<bool> {
    let endpoint = Endpoint::of(path);
    if endpoint.is_anthropic() {
        return Some(true);
    }
    match ClientApi::of(endpoint) {
        Some(ClientApi::OpenAiChat | ClientApi::OpenAiResponses) => Some(false),
        _ => None,
    }
}

impl UpstreamConfig {
    /// Whether `model` is one of its models.
    pub fn serves(&self, model: &str) -> bool {
        self.models.iter().any(|pattern| glob_match(pattern, model))
    }

    /// The client's headers without its credentials, with the upstream's.
    fn headers(&self, client: &WireHeaders) -> WireHeaders {
        let mut headers: WireHeaders = client
            .iter()
            .filter(|(name, _)| {
                !matches!(
                    name.to_ascii_lowercase().as_str(),
                    "authorization" | "x-api-key"
                )
            })
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect();
        match self.kind {
            UpstreamKind::OpenAi => {
                if let Some(key) = &self.api_key {
                    headers.insert("authorization".into(), format!("Bearer {key}"));
                }
            }
            UpstreamKind::Anthropic => {
                if let Some(key) = &self.api_key {
                    headers.insert("x-api-key".into(), key.clone());
                }
                headers
                    .entry("anthropic-version".into())
                    .or_insert_with(|| "2023-06-01".into());
            }
        }
        headers
    }
}

/// A request the workers could not take, ready to go upstream.
pub struct UpstreamRequest {
    /// The model asked for (after aliases).
    pub model: String,
    /// The route, query string included.
    pub endpoint_path: String,
    /// Whether the client wants a stream.
    pub is_streaming: bool,
    /// The body as dispatched to a worker.
    pub body: String,
    /// The forwarded client headers.
    pub headers: WireHeaders,
}

/// The configured upstreams, the HTTP client that reaches them and what is known of their
/// routes.
pub struct Upstreams {
    list: Vec<UpstreamConfig>,
    fallback: Option<usize>,
    client: reqwest::Client,
    capabilities: Capabilities,
    request_timeout: Duration,
    max_stream_bytes: u64,
    next_id: AtomicU64,
    lists: models::ModelLists,
}

impl Upstreams {
    /// Upstreams from `list`; `fallback` names the one that takes overflow and unknown models.
    /// `request_timeout` bounds each upstream request, body included.
    pub fn new(
        list: Vec<UpstreamConfig>,
        fallback: Option<&str>,
        request_timeout: Duration,
        max_stream_bytes: u64,
    ) -> Self {
        // What a probe learned lasts as long as on a worker with default settings.
        let capabilities =
            Capabilities::new(&[], NativeOverrides::default(), defaults::MODEL_REFRESH);
        for upstream in &list {
            // An Anthropic API has Messages and nothing else; an OpenAI-compatible one is probed.
            if upstream.kind == UpstreamKind::Anthropic {
                let overrides = NativeOverrides {
                    messages: Some(true),
                    responses: Some(false),
                };
                capabilities.configure_backend(&upstream.base_url, overrides);
            }
        }
        let fallback = fallback.and_then(|name| list.iter().position(|u| u.name == name));
        Upstreams {
            list,
            fallback,
            // Unlike local backends, cloud APIs may sit behind the system's HTTP proxy.
            client: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(10))
                .timeout(request_timeout)
                // An API answers where it is asked. A redirect followed would carry the request
                // (and an Anthropic `x-api-key`, which reqwest keeps across hosts) elsewhere.
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .expect("a client with these options always builds"),
            capabilities,
            request_timeout,
            max_stream_bytes,
            next_id: AtomicU64::new(1),
            lists: models::ModelLists::default(),
        }
    }

    /// The models the upstreams serve that can be named, each with its upstream's name, for
    /// `GET /v1/models`: exact names as configured, and for patterns the upstream's own list
    /// filtered by them (the `models` module says how they are cached, and what an upstream
    /// that is down lists).
    pub async fn models(&self) -> Vec<(String, String)> {
        self.lists.models(&self.client, &self.list).await
    }

    /// Whether none are configured (then requests never look here).
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The upstream for a model the workers do not claim (no worker serves it, no provider lists
    /// it): the first upstream serving it, else the fallback. Without one, the request queues
    /// for a worker to announce the model.
    pub fn for_unclaimed(&self, model: &str) -> Option<&UpstreamConfig> {
        let fallback = self.fallback.map(|i| &self.list[i]);
        self.list.iter().find(|u| u.serves(model)).or(fallback)
    }

    /// The upstream for a request the workers refused with `refusal`, if any: a model name no
    /// worker could serve goes where [`Self::for_unclaimed`] says; a full queue to the fallback.
    pub fn for_refusal(&self, model: &str, refusal: &SubmitError) -> Option<&UpstreamConfig> {
        let fallback = self.fallback.map(|i| &self.list[i]);
        match refusal {
            SubmitError::UnknownModel => self.for_unclaimed(model),
            SubmitError::QueueFull { .. } => fallback,
            SubmitError::ProviderDisabled
            | SubmitError::ShuttingDown
            | SubmitError::PromptTooLong { .. } => None,
        }
    }

    /// Serves `request` from `upstream` and answers the client in `dialect`; `tracked` counts it
    /// on the dashboard like a worker's request.
    pub async fn serve(
        &self,
        upstream: &UpstreamConfig,
        request: UpstreamRequest,
        dialect: Dialect,
        observer: Option<Box<dyn AnswerObserver>>,
        mut tracked: TrackedRequest,
    ) -> Response {
        if upstream.kind == UpstreamKind::Anthropic
            && anthropic_route(&request.endpoint_path).is_none()
        {
            let message = format!(
                "model {} is served by upstream {}, an Anthropic API, which has no {}",
                request.model, upstream.name, request.endpoint_path
            );
            tracked.fail(StatusCode::BAD_REQUEST.as_u16());
            return ApiError::new(StatusCode::BAD_REQUEST, "unsupported_route", message)
                .into_response(dialect);
        }
        let id = format!("upstream-{}", self.next_id.fetch_add(1, Ordering::Relaxed));
        tracing::info!(request = %id, upstream = %upstream.name, model = %request.model, "request sent upstream");
        let backend = Backend {
            base_url: upstream.base_url.clone(),
            speaks: match upstream.kind {
                UpstreamKind::OpenAi => Speaks::OpenAi,
                UpstreamKind::Anthropic => Speaks::Anthropic,
            },
            client: self.client.clone().into(),
            capabilities: self.capabilities.clone(),
        };
        let call = BackendRequest {
            id,
            path: request.endpoint_path,
            is_streaming: request.is_streaming,
            body: request.body,
            headers: upstream.headers(&request.headers),
            slot: None,
        };
        let (events, answers) = mpsc::channel(UPSTREAM_EVENTS);
        let task = tokio::spawn(backend.serve(call, events));
        let source = AnswerSource::Upstream {
            name: upstream.name.clone(),
            events: answers,
            sent: 0,
            limit: self.max_stream_bytes,
            ended: false,
        };
        let deadline = Instant::now() + self.request_timeout;
        Waiter::new(
            CancelGuard::task(task.abort_handle(), Arc::clone(tracked.telemetry())),
            source,
            deadline,
            None,
            dialect,
        )
        .observe(observer)
        .track(tracked)
        .respond()
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(kind: UpstreamKind) -> UpstreamConfig {
        UpstreamConfig {
            name: "cloud".into(),
            kind,
            base_url: "https://api.example.com".into(),
            api_key: Some("sk-upstream-secret".into()),
            models: vec!["gpt-4o".into(), "claude-*".into()],
        }
    }

    #[test]
    fn upstream_api_keys_are_redacted_from_debug_output() {
        let text = format!("{:?}", upstream(UpstreamKind::OpenAi));
        assert!(!text.contains("sk-upstream-secret"), "{text}");
        assert!(text.contains("<redacted>"));
    }

    #[test]
    fn upstream_headers_replace_the_clients_credentials_with_the_upstreams() {
        let client = WireHeaders::from([
            ("authorization".to_string(), "Bearer client".to_string()),
            ("x-api-key".to_string(), "client".to_string()),
            ("anthropic-beta".to_string(), "b".to_string()),
        ]);
        let openai = upstream(UpstreamKind::OpenAi).headers(&client);
        assert_eq!(openai["authorization"], "Bearer sk-upstream-secret");
        assert!(!openai.contains_key("x-api-key"));
        let anthropic = upstream(UpstreamKind::Anthropic).headers(&client);
        assert_eq!(anthropic["x-api-key"], "sk-upstream-secret");
        assert_eq!(anthropic["anthropic-version"], "2023-06-01");
        assert_eq!(anthropic["anthropic-beta"], "b");
        assert!(!anthropic.contains_key("authorization"));
    }

    #[test]
    fn an_anthropic_upstream_serves_messages_natively_and_openai_generation_translated() {
        assert_eq!(anthropic_route("/v1/messages?beta=true"), Some(true));
        assert_eq!(anthropic_route("/v1/messages/count_tokens"), Some(true));
        assert_eq!(anthropic_route("/v1/chat/completions"), Some(false));
        assert_eq!(anthropic_route("/v1/responses"), Some(false));
        assert_eq!(anthropic_route("/v1/embeddings"), None);
        assert_eq!(anthropic_route("/v1/completions"), None);
    }

    #[test]
    fn refused_requests_go_to_the_serving_upstream_or_the_fallback() {
        let mut other = upstream(UpstreamKind::OpenAi);
        other.name = "spare".into();
        other.models = Vec::new();
        let upstreams = Upstreams::new(
            vec![upstream(UpstreamKind::OpenAi), other],
            Some("spare"),
            Duration::from_secs(5),
            1 << 20,
        );
        let unknown = SubmitError::UnknownModel;
        let full = SubmitError::QueueFull {
            retry_after: Duration::from_secs(1),
        };
        let draining = SubmitError::ShuttingDown;
        let name = |u: Option<&UpstreamConfig>| u.map(|u| u.name.clone());
        assert_eq!(
            name(upstreams.for_refusal("claude-x", &unknown)),
            Some("cloud".into())
        );
        assert_eq!(
            name(upstreams.for_refusal("llama", &unknown)),
            Some("spare".into())
        );
        assert_eq!(
            name(upstreams.for_refusal("gpt-4o", &full)),
            Some("spare".into())
        );
        assert_eq!(name(upstreams.for_refusal("gpt-4o", &draining)), None);
    }
}
