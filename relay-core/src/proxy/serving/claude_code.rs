//! Claude Code with nothing but the URL.
//!
//! Claude Code asks for Claude model names (`claude-opus-…`, `claude-sonnet-…`, and
//! `claude-haiku-…` for its quick side requests: titles, summaries) that no local worker
//! serves. Without an alias such a request would wait in the queue for a worker to announce the
//! name, time out, and be retried by Claude Code — a hung terminal. So when a Claude name is
//! claimed by nobody (no worker, no provider, no upstream) and no alias or `default_model`
//! maps it, the relay chooses a served chat model itself: the largest one it can tell for the
//! main conversation, the smallest for `claude-haiku-*` when the fleet has more than one size.
//! An alias (the dashboard writes `claude-*` and `claude-haiku-*` when the user picks), a
//! `default_model` or a served name always wins; any other name keeps the seeds' queueing.

use std::sync::Arc;

use crate::proxy::dispatch::hub::Hub;
use crate::proxy::serving::aliases::LiveAliases;
use crate::proxy::serving::upstream::Upstreams;

/// Where model names go now, read live from the proxy's workers, aliases and upstreams: the
/// one mapping the client routes, the dashboard and the tray all use.
#[derive(Clone)]
pub struct NameRoutes {
    hub: Arc<Hub>,
    aliases: Arc<LiveAliases>,
    upstreams: Arc<Upstreams>,
}

/// The served models Claude Code's requests go to now; `None` while such a request would wait
/// for a worker.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct ClaudeCodeUses {
    /// For the conversation.
    pub model: Option<String>,
    /// For its `claude-haiku-*` side requests.
    pub small_model: Option<String>,
}

impl NameRoutes {
    /// Claude names Claude Code sends, one per kind of request.
    const CONVERSATION: &'static str = "claude-sonnet-4-5";
    const SIDE_REQUESTS: &'static str = "claude-haiku-4-5";

    /// The lookup over the proxy's live state.
    pub fn new(hub: Arc<Hub>, aliases: Arc<LiveAliases>, upstreams: Arc<Upstreams>) -> Self {
        NameRoutes {
            hub,
            aliases,
            upstreams,
        }
    }

    /// The served model a request for `model` goes to: by `[proxy.aliases]` and
    /// `default_model`, else, for a Claude name nobody claims, the model chosen for Claude
    /// Code; `None` keeps `model`.
    pub fn mapped(&self, model: &str) -> Option<String> {
        let aliases = self.aliases.current();
        let served = |m: &str| self.hub.serves(m);
        if !aliases.is_empty() {
            if let Some(target) = aliases.resolve(model, served) {
                return Some(target.to_string());
            }
        }
        if !is_claude(model) || served(model) || self.upstreams.for_unclaimed(model).is_some() {
            return None;
        }
        let models = self.hub.models();
        let choice = choose(models.iter().map(|(name, _)| name.as_str()))?;
        Some(pick(&choice, model).to_string())
    }

    /// What Claude Code's requests go to now (an alias, `default_model`, a served or upstream
    /// Claude name, or the model the relay chose).
    pub fn claude_code(&self) -> ClaudeCodeUses {
        let goes_to = |name: &str| {
            self.mapped(name).or_else(|| {
                let served = self.hub.serves(name) || self.upstreams.for_unclaimed(name).is_some();
                served.then(|| name.to_string())
            })
        };
        ClaudeCodeUses {
            model: goes_to(Self::CONVERSATION),
            small_model: goes_to(Self::SIDE_REQUESTS),
        }
    }
}

/// Whether `model` is a name Claude Code asks for.
pub fn is_claude(model: &str) -> bool {
    let lower = model.to_ascii_lowercase();
    lower == "claude" || lower.starts_with("claude-")
}

/// Whether `model` names Claude's small model, which Claude Code uses for side requests.
pub fn is_small(model: &str) -> bool {
    model.to_ascii_lowercase().contains("haiku")
}

/// The models chosen for Claude Code among served ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// For the conversation (`claude-opus-*`, `claude-sonnet-*`, …).
    pub model: String,
    /// For `claude-haiku-*` side requests: the smallest model when sizes differ, else `model`.
    pub small_model: String,
}

/// The choice among `served` model names, or `None` when none is a chat model.
pub fn choose<'a>(served: impl IntoIterator<Item = &'a str>) -> Option<Choice> {
    let mut chat: Vec<(&str, Option<f64>)> = served
        .into_iter()
        .filter(|name| is_chat_model(name) && !is_claude(name))
        .map(|name| (name, parameters_in_billions(name)))
        .collect();
    chat.sort_by(|a, b| a.0.cmp(b.0));
    chat.dedup_by(|a, b| a.0 == b.0);
    let first = chat.first()?.0;
    let sized = chat
        .iter()
        .filter_map(|(name, size)| size.map(|size| (*name, size)));
    let largest = sized
        .clone()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(name, _)| name);
    let smallest = sized
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(name, _)| name);
    let model = largest.unwrap_or(first);
    Some(Choice {
        model: model.to_string(),
        small_model: smallest.unwrap_or(model).to_string(),
    })
}

/// The served model a request for the Claude name `model` goes to under `choice`.
pub fn pick<'c>(choice: &'c Choice, model: &str) -> &'c str {
    if is_small(model) {
        &choice.small_model
    } else {
        &choice.model
    }
}

/// Names of models that do not chat: embedding, reranking and speech models.
fn is_chat_model(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    !["embed", "rerank", "whisper", "tts", "bge-", "e5-"]
        .iter()
        .any(|word| lower.contains(word))
}

/// The parameter count a model name states (`qwen2.5-coder-32b`, `llama3.1:8b`,
/// `Qwen3-30B-A3B` → 30, `phi-3.5-mini-3.8b` → 3.8), in billions; `None` when it states none.
/// A mixture of experts names its total first, which is what it costs to hold.
fn parameters_in_billions(name: &str) -> Option<f64> {
    let lower = name.to_ascii_lowercase();
    let bytes = lower.as_bytes();
    let mut index = 0;
    while index < bytes.len() {
        let starts_token = index == 0 || !bytes[index - 1].is_ascii_alphanumeric();
        if starts_token && bytes[index].is_ascii_digit() {
            let mut end = index;
            while end < bytes.len() && (bytes[end].is_ascii_digit() || bytes[end] == b'.') {
                end += 1;
            }
            let unit = bytes.get(end).copied();
            let after = bytes.get(end + 1).copied();
            let ends_token = after.is_none_or(|c| !c.is_ascii_alphanumeric());
            if ends_token && matches!(unit, Some(b'b') | Some(b'm')) {
                if let Ok(number) = lower[index..end].parse::<f64>() {
                    return Some(if unit == Some(b'm') {
                        number / 1000.0
                    } else {
                        number
                    });
                }
            }
            index = end.max(index + 1);
        } else {
            index += 1;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claude_names_and_the_small_one_are_recognised() {
        assert!(is_claude("claude-opus-5-5"));
        assert!(is_claude("Claude-3-5-Sonnet-latest"));
        assert!(!is_claude("claudette-7b"));
        assert!(is_small("claude-haiku-4-5-20251001"));
        assert!(!is_small("claude-sonnet-4-5"));
    }

    #[test]
    fn sizes_are_read_from_the_usual_spellings() {
        for (name, size) in [
            ("qwen2.5-coder-32b-instruct", Some(32.0)),
            ("llama3.1:8b", Some(8.0)),
            ("Qwen3-30B-A3B", Some(30.0)),
            ("phi-3.5-mini-3.8b", Some(3.8)),
            ("smollm-135m", Some(0.135)),
            ("gpt-oss-20b", Some(20.0)),
            ("mistral-nemo", None),
            ("qwen2.5", None),
        ] {
            assert_eq!(parameters_in_billions(name), size, "{name}");
        }
    }

    #[test]
    fn the_largest_model_converses_and_the_smallest_takes_side_requests() {
        let choice = choose([
            "qwen2.5-coder-7b",
            "qwen2.5-coder-32b",
            "nomic-embed-text",
            "llama3.2:1b",
        ])
        .unwrap();
        assert_eq!(choice.model, "qwen2.5-coder-32b");
        assert_eq!(choice.small_model, "llama3.2:1b");
        assert_eq!(pick(&choice, "claude-opus-5-5"), "qwen2.5-coder-32b");
        assert_eq!(pick(&choice, "claude-haiku-4-5"), "llama3.2:1b");
    }

    #[test]
    fn one_model_serves_both_and_unsized_names_fall_back_to_name_order() {
        let choice = choose(["tiny"]).unwrap();
        assert_eq!(
            (choice.model.as_str(), choice.small_model.as_str()),
            ("tiny", "tiny")
        );
        let choice = choose(["zeta", "alpha"]).unwrap();
        assert_eq!(choice.model, "alpha");
        assert_eq!(choice.small_model, "alpha");
    }

    #[test]
    fn without_a_chat_model_there_is_no_choice() {
        assert_eq!(choose(["nomic-embed-text", "bge-reranker"]), None);
        assert_eq!(choose(std::iter::empty()), None);
        // A worker serving a Claude name itself is not a choice for the fallback.
        assert_eq!(choose(["claude-opus-5-5"]), None);
    }
}
