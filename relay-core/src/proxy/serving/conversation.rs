//! The affinity key of a client request: which conversation it continues, so the scheduler can
//! send it to the worker whose backend still holds that conversation's prompt in its cache.
//!
//! An explicit session id wins when the client sends one (a session header, then the body's
//! `prompt_cache_key`, Anthropic `metadata.user_id`, OpenAI `user`); otherwise the key is a
//! hash of the prompt's leading part: system prompt or instructions, tool names, and
//! the messages up to and including the first user message, which every later turn of the
//! conversation repeats. Only the text of those messages is hashed, not their JSON, so the
//! The model is left out: an alias may rename it between the first turn and a continuation,
//! and a home that does not serve a request's model is passed over anyway. The
//! markers clients move from turn to turn (Anthropic `cache_control`), whitespace, or a
//! Responses continuation's re-serialized history (its input is the first turn's, expanded
//! from `previous_response_id`) leave the key unchanged.
//!
//! The body fields arrive borrowed and unparsed ([`BodyFields`], read in the same pass that
//! finds `model`); only the leading messages are parsed. Input that does not have the expected
//! shape just yields no key (the backend judges the request itself).

use std::borrow::Cow;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;

use axum::http::HeaderMap;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::adapter::anthropic_messages::{
    marks_a_subagent, without_billing_header, BILLING_HEADER, SUBAGENT_FIELD,
};

/// Request headers that carry a client's session id, most specific first: Claude Code's, the
/// generic ones, Codex's.
pub const SESSION_HEADERS: &[&str] = &[
    "x-claude-code-session-id",
    "x-session-id",
    "x-session-affinity",
    "session_id",
    "session-id",
];

/// Leading messages looked at, at most, for the first user message.
const MAX_LEADING_MESSAGES: usize = 16;

/// Bytes of a `/v1/completions` prompt string hashed: it has no message structure, and its
/// leading part is what the conversation's turns share.
const PROMPT_PREFIX_BYTES: usize = 4096;

/// The fields the proxy reads from a request body in one pass: `model` and `stream`, and the
/// fields an affinity key is made from, as raw JSON borrowed from the body. Every other field
/// is skipped without being built.
#[derive(Debug, Default, Deserialize)]
pub struct BodyFields<'a> {
    /// The requested model (checked by the caller).
    #[serde(default)]
    pub model: Option<serde_json::Value>,
    /// Whether a stream is asked for (checked by the caller).
    #[serde(default)]
    pub stream: Option<serde_json::Value>,
    /// OpenAI `prompt_cache_key`.
    #[serde(borrow, default)]
    pub prompt_cache_key: Option<&'a RawValue>,
    /// Anthropic `metadata` (its `user_id`; Claude Code's names the session).
    #[serde(borrow, default)]
    pub metadata: Option<&'a RawValue>,
    /// OpenAI `user`.
    #[serde(borrow, default)]
    pub user: Option<&'a RawValue>,
    /// Anthropic `system`.
    #[serde(borrow, default)]
    pub system: Option<&'a RawValue>,
    /// Responses `instructions`.
    #[serde(borrow, default)]
    pub instructions: Option<&'a RawValue>,
    /// Tools (only their names are hashed).
    #[serde(borrow, default)]
    pub tools: Option<&'a RawValue>,
    /// Chat Completions and Anthropic `messages`.
    #[serde(borrow, default)]
    pub messages: Option<&'a RawValue>,
    /// Responses `input` (also the embeddings' input: the caller asks for no key there).
    #[serde(borrow, default)]
    pub input: Option<&'a RawValue>,
    /// Completions `prompt`.
    #[serde(borrow, default)]
    pub prompt: Option<&'a RawValue>,
}

/// The affinity key of a request, or `None` when nothing identifies a conversation.
///
/// A Claude Code subagent's request (its Task tool runs a conversation of its own, on the main
/// model, under the main conversation's session id) is keyed by the session and its own
/// prompt's prefix: under the session alone, its turns took the main conversation's slot and
/// left the main conversation's next turn its whole prompt to evaluate again. Its billing line
/// says it is a subagent's; a Claude Code request without the line
/// (`CLAUDE_CODE_ATTRIBUTION_HEADER=0`, which guides for local models recommend) could be
/// either, so each conversation of such a session is keyed by its own prompt's prefix too (the
/// main conversation's stays the same from turn to turn, as its cached prompt does).
pub fn affinity_key(headers: &HeaderMap, hints: &BodyFields<'_>) -> Option<u64> {
    let Some(session) = session_key(headers, hints) else {
        return prefix_key(hints);
    };
    let apart = is_subagent(hints) || (from_claude_code(headers) && !has_billing_line(hints));
    let own = apart.then(|| prefix_key(hints)).flatten();
    let Some(prefix) = own else {
        return Some(session);
    };
    let mut hasher = hasher();
    feed(&mut hasher, b"within a session");
    hasher.write_u64(session);
    hasher.write_u64(prefix);
    Some(hasher.finish())
}

/// Bytes of a request's `system` looked at for Claude Code's subagent marker before anything is
/// parsed: its billing line comes first, and the marker within its first fields.
const SUBAGENT_MARKER_WITHIN: usize = 512;

/// Whether `hints` are a Claude Code subagent's: its system prompt's first text is a billing
/// line that says so ([`marks_a_subagent`]). Every Claude Code turn asks this, so the bytes are
/// searched first and the system parsed only where the marker is.
pub fn is_subagent(hints: &BodyFields<'_>) -> bool {
    const MARKER: &[u8] = SUBAGENT_FIELD.as_bytes();
    let Some(system) = hints.system else {
        return false;
    };
    let head = system.get().as_bytes();
    let head = &head[..head.len().min(SUBAGENT_MARKER_WITHIN)];
    if !head.windows(MARKER.len()).any(|window| window == MARKER) {
        return false;
    }
    let first = string(system).or_else(|| {
        let blocks: Vec<&RawValue> = serde_json::from_str(system.get()).ok()?;
        let block: Part<'_> = serde_json::from_str(blocks.first()?.get()).ok()?;
        block.text
    });
    first.is_some_and(|text| marks_a_subagent(&text))
}

/// Whether `hints` carry Claude Code's billing line: its system prompt opens with it, so only
/// the first bytes are looked at.
fn has_billing_line(hints: &BodyFields<'_>) -> bool {
    const LINE: &[u8] = BILLING_HEADER.as_bytes();
    let head = hints
        .system
        .map_or(&[][..], |system| system.get().as_bytes());
    let head = &head[..head.len().min(SUBAGENT_MARKER_WITHIN)];
    head.windows(LINE.len()).any(|window| window == LINE)
}

/// The key of a side request of a conversation (Claude Code's `claude-haiku-*` titles and
/// summaries carry the main conversation's session id): its own prompt's prefix, never the
/// session, so it takes another slot or box than the one holding the conversation's prompt.
pub fn side_request_key(hints: &BodyFields<'_>) -> Option<u64> {
    prefix_key(hints)
}

/// Whether `headers` carry Claude Code's session header: its client sends side requests (titles,
/// summaries) beside its turns.
pub fn from_claude_code(headers: &HeaderMap) -> bool {
    headers.contains_key(SESSION_HEADERS[0])
}

/// Whether `headers` name a session: the key then does not depend on the body.
pub fn has_session_header(headers: &HeaderMap) -> bool {
    session_header(headers).is_some()
}

/// The key of a body the relay rewrote (a Responses continuation expanded from
/// `previous_response_id`: its leading messages are now the first turn's), for a request whose
/// headers named no session.
pub fn key_of_body(body: &str) -> Option<u64> {
    let fields: BodyFields<'_> = serde_json::from_str(body).ok()?;
    affinity_key(&HeaderMap::new(), &fields)
}

fn session_header(headers: &HeaderMap) -> Option<&[u8]> {
    SESSION_HEADERS
        .iter()
        .filter_map(|name| headers.get(*name))
        .map(|value| value.as_bytes())
        .find(|value| !value.trim_ascii().is_empty())
}

fn hasher() -> impl Hasher {
    // Keyed per process: a client cannot compute which of its requests collide with another
    // client's conversation.
    static KEYS: OnceLock<RandomState> = OnceLock::new();
    KEYS.get_or_init(RandomState::new).build_hasher()
}

/// Feeds one length-delimited field, so ("ab", "c") and ("a", "bc") differ.
fn feed(hasher: &mut impl Hasher, bytes: &[u8]) {
    hasher.write_usize(bytes.len());
    hasher.write(bytes);
}

fn session_key(headers: &HeaderMap, hints: &BodyFields<'_>) -> Option<u64> {
    let header = session_header(headers).map(Cow::Borrowed);
    let body = || {
        let metadata_user = hints
            .metadata
            .and_then(|raw| serde_json::from_str::<Metadata<'_>>(raw.get()).ok())
            .and_then(|m| m.user_id);
        [
            hints.prompt_cache_key.and_then(string),
            metadata_user,
            hints.user.and_then(string),
        ]
        .into_iter()
        .flatten()
        .find(|id| !id.trim().is_empty())
        .map(|id| Cow::Owned(id.into_owned().into_bytes()))
    };
    let id = header.or_else(body)?;
    let mut hasher = hasher();
    feed(&mut hasher, b"session");
    feed(&mut hasher, &id);
    Some(hasher.finish())
}

#[derive(Deserialize)]
struct Metadata<'a> {
    #[serde(borrow, default)]
    user_id: Option<Cow<'a, str>>,
}

fn string(raw: &RawValue) -> Option<Cow<'_, str>> {
    serde_json::from_str(raw.get()).ok()
}

/// One message of the leading part.
#[derive(Deserialize)]
struct Lead<'a> {
    #[serde(borrow, default)]
    role: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
}

/// One content part (or system block); only its text counts.
#[derive(Deserialize)]
struct Part<'a> {
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
}

/// One tool; only its name counts (OpenAI nests it in `function`).
#[derive(Deserialize)]
struct Tool<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    function: Option<ToolFunction<'a>>,
}

#[derive(Deserialize)]
struct ToolFunction<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
}

fn prefix_key(hints: &BodyFields<'_>) -> Option<u64> {
    let mut hasher = hasher();
    feed(&mut hasher, b"prefix");
    for system in [hints.system, hints.instructions].into_iter().flatten() {
        feed(&mut hasher, b"system");
        // As the worker sends it: without Claude Code's billing line, which may change with
        // every request.
        feed_text(&mut hasher, system, without_billing_header);
    }
    if let Some(tools) = hints
        .tools
        .and_then(|raw| serde_json::from_str::<Vec<Tool<'_>>>(raw.get()).ok())
    {
        for tool in tools {
            let name = tool.name.or(tool.function.and_then(|f| f.name));
            feed(&mut hasher, name.as_deref().unwrap_or("").as_bytes());
        }
    }
    let conversation = hints.messages.or(hints.input);
    if let Some(raw) = conversation {
        if let Some(text) = string(raw) {
            // A Responses `input` string is one user message.
            feed(&mut hasher, b"user");
            feed(&mut hasher, text.as_bytes());
        } else {
            let messages: Vec<&RawValue> = serde_json::from_str(raw.get()).ok()?;
            if messages.is_empty() {
                return None;
            }
            for message in messages.iter().take(MAX_LEADING_MESSAGES) {
                let Ok(lead) = serde_json::from_str::<Lead<'_>>(message.get()) else {
                    feed(&mut hasher, message.get().as_bytes());
                    continue;
                };
                let role = lead.role.as_deref().unwrap_or("");
                feed(&mut hasher, role.as_bytes());
                if let Some(content) = lead.content {
                    feed_text(&mut hasher, content, |text| text);
                }
                if role == "user" {
                    break;
                }
            }
        }
    } else {
        let prompt = hints.prompt.and_then(|raw| {
            string(raw).or_else(|| {
                // A batch of prompts: the first one.
                let batch: Vec<Cow<'_, str>> = serde_json::from_str(raw.get()).ok()?;
                batch.into_iter().next()
            })
        })?;
        let mut end = prompt.len().min(PROMPT_PREFIX_BYTES);
        while !prompt.is_char_boundary(end) {
            end -= 1;
        }
        feed(&mut hasher, b"prompt");
        feed(&mut hasher, &prompt.as_bytes()[..end]);
    }
    Some(hasher.finish())
}

/// Feeds the text of a content value, each text read through `read`: a string, or the `text`
/// of each part of an array; any other part (an image) by its JSON.
fn feed_text(hasher: &mut impl Hasher, content: &RawValue, read: fn(&str) -> &str) {
    if let Some(text) = string(content) {
        feed(hasher, read(&text).as_bytes());
        return;
    }
    match serde_json::from_str::<Vec<&RawValue>>(content.get()) {
        Ok(parts) => {
            for part in parts {
                match serde_json::from_str::<Part<'_>>(part.get()) {
                    Ok(Part { text: Some(text) }) => feed(hasher, read(&text).as_bytes()),
                    _ => feed(hasher, part.get().as_bytes()),
                }
            }
        }
        Err(_) => feed(hasher, content.get().as_bytes()),
    }
}

#[cfg(test)]
mod tests;
