//! What upstreams list in `GET /v1/models`.
//!
//! Exact model names are listed as configured. A pattern (`gpt-*`) cannot be enumerated, so the
//! upstream's own list is fetched (`GET /v1/models` with its API key), filtered by its patterns,
//! and kept for [`LIST_TTL`]. A fetch is bounded by [`FETCH_TIMEOUT`]; an upstream that is
//! down, refuses the key or answers something else lists its exact names plus its last good
//! list, and is asked again only after [`RETRY_AFTER`] — so `/v1/models` never fails, and is
//! never slowed for long, because an upstream is unreachable. Fetches of several upstreams run
//! at the same time.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::backend::error_chain;
use crate::protocol::WireHeaders;
use crate::proxy::serving::aliases::is_pattern;
use crate::proxy::serving::upstream::{UpstreamConfig, UpstreamKind};

/// How long a fetched list is used before it is fetched again.
pub const LIST_TTL: Duration = Duration::from_secs(300);
/// How long after a failed fetch the next one is tried (the last good list is used meanwhile).
pub const RETRY_AFTER: Duration = Duration::from_secs(30);
/// The longest a fetch may take: `/v1/models` answers must stay quick.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(3);

/// The last fetch of one upstream's list.
#[derive(Debug, Clone)]
struct Fetched {
    /// The upstream's models from the last successful fetch (empty if none succeeded).
    models: Vec<String>,
    /// When the last fetch was tried.
    at: Instant,
    /// Whether it succeeded.
    ok: bool,
}

impl Fetched {
    /// Whether the list must be fetched (again) at `now`.
    fn stale(&self, now: Instant) -> bool {
        let lifetime = if self.ok { LIST_TTL } else { RETRY_AFTER };
        now.duration_since(self.at) >= lifetime
    }
}

/// The fetched lists, by upstream name.
#[derive(Debug, Default)]
pub(super) struct ModelLists {
    fetched: Mutex<HashMap<String, Fetched>>,
}

impl ModelLists {
    /// Every model `upstreams` serve that can be named, each with its upstream's name, in
    /// configuration order and without repeats.
    pub(super) async fn models(
        &self,
        client: &reqwest::Client,
        upstreams: &[UpstreamConfig],
    ) -> Vec<(String, String)> {
        let lists = futures_util::future::join_all(
            upstreams
                .iter()
                .map(|upstream| self.fetched_models(client, upstream)),
        )
        .await;
        let mut out: Vec<(String, String)> = Vec::new();
        for (upstream, fetched) in upstreams.iter().zip(lists) {
            let exact = upstream.models.iter().filter(|m| !is_pattern(m)).cloned();
            let matching = fetched.into_iter().filter(|m| upstream.serves(m));
            for model in exact.chain(matching) {
                if !out.iter().any(|(listed, _)| *listed == model) {
                    out.push((model, upstream.name.clone()));
                }
            }
        }
        out
    }

    /// The upstream's own list for its patterns: cached, fetched when stale, empty when it has
    /// no patterns (then nothing is fetched).
    async fn fetched_models(
        &self,
        client: &reqwest::Client,
        upstream: &UpstreamConfig,
    ) -> Vec<String> {
        if !upstream.models.iter().any(|m| is_pattern(m)) {
            return Vec::new();
        }
        let cached = self.lock().get(&upstream.name).cloned();
        if let Some(cached) = cached.as_ref().filter(|c| !c.stale(Instant::now())) {
            return cached.models.clone();
        }
        let result = fetch(client, upstream).await;
        let fetched = match result {
            Ok(models) => Fetched {
                models,
                at: Instant::now(),
                ok: true,
            },
            Err(why) => {
                tracing::warn!(upstream = %upstream.name, "could not list the upstream's models: {why}");
                Fetched {
                    models: cached.map(|c| c.models).unwrap_or_default(),
                    at: Instant::now(),
                    ok: false,
                }
            }
        };
        let models = fetched.models.clone();
        self.lock().insert(upstream.name.clone(), fetched);
        models
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Fetched>> {
        // Each update is a single insert: a panic elsewhere cannot leave it half done.
        self.fetched
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }
}

/// Asks `upstream` for its models with its API key.
async fn fetch(client: &reqwest::Client, upstream: &UpstreamConfig) -> Result<Vec<String>, String> {
    // Anthropic pages its list (20 by default); one page of its maximum holds every model.
    let query = match upstream.kind {
        UpstreamKind::OpenAi => "",
        UpstreamKind::Anthropic => "?limit=1000",
    };
    let url = format!(
        "{}/v1/models{query}",
        upstream.base_url.trim_end_matches('/')
    );
    let mut request = client.get(&url).timeout(FETCH_TIMEOUT);
    for (name, value) in upstream.headers(&WireHeaders::new()) {
        request = request.header(name, value);
    }
    let response = request.send().await.map_err(|e| error_chain(&e))?;
    let status = response.status();
    if !status.is_success() {
        return Err(format!("{url} answered {status}"));
    }
    let bytes = response.bytes().await.map_err(|e| error_chain(&e))?;
    let body: Value = serde_json::from_slice(&bytes).map_err(|e| format!("{url}: {e}"))?;
    model_ids(&body).ok_or_else(|| format!("{url} answered without a `data` list"))
}

/// The `data[].id`s of a model list (OpenAI's and Anthropic's have the same shape there).
fn model_ids(body: &Value) -> Option<Vec<String>> {
    let data = body.get("data")?.as_array()?;
    Some(
        data.iter()
            .filter_map(|m| m.get("id").and_then(Value::as_str))
            .map(str::to_string)
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_good_list_is_kept_for_the_ttl_and_a_failure_is_retried_sooner() {
        let at = Instant::now();
        let ok = Fetched {
            models: vec!["gpt-4o".into()],
            at,
            ok: true,
        };
        assert!(!ok.stale(at + LIST_TTL - Duration::from_secs(1)));
        assert!(ok.stale(at + LIST_TTL));
        let failed = Fetched { ok: false, ..ok };
        assert!(!failed.stale(at + RETRY_AFTER - Duration::from_secs(1)));
        assert!(failed.stale(at + RETRY_AFTER));
        assert!(RETRY_AFTER < LIST_TTL);
    }

    #[test]
    fn model_ids_are_read_from_openai_and_anthropic_lists() {
        let openai = json!({"object": "list", "data": [{"id": "gpt-4o", "object": "model"}]});
        let anthropic = json!({"data": [{"type": "model", "id": "claude-x"}], "has_more": false});
        assert_eq!(model_ids(&openai), Some(vec!["gpt-4o".to_string()]));
        assert_eq!(model_ids(&anthropic), Some(vec!["claude-x".to_string()]));
        assert_eq!(model_ids(&json!({"error": "no"})), None);
    }
}
