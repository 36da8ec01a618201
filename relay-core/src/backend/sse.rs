//! Cutting a backend's byte stream into whole SSE events, and reading token usage from answers.
//!
//! A `response_chunk` carries text, so a chunk must never end inside a UTF-8 character; cutting at
//! event boundaries also lets usage be read from whole events. Everything that is already complete
//! when bytes arrive is sent as one chunk, so bursts cost one WebSocket frame.

use std::time::Instant;

use serde_json::Value;

use crate::adapter::sse::data_field;
use crate::protocol::TokenCounts;

/// A partial event larger than this is sent anyway (at a character boundary) so a backend that
/// never ends an event cannot make the worker buffer without bound.
const MAX_PENDING: usize = 1024 * 1024;

/// Accumulates bytes and releases whole SSE events.
#[derive(Debug, Default)]
pub struct SseSplitter {
    pending: Vec<u8>,
}

impl SseSplitter {
    /// Adds `bytes`; returns every event completed so far, as one string.
    pub fn push(&mut self, bytes: &[u8]) -> Option<String> {
        self.feed(bytes);
        self.ready()
    }

    /// Adds `bytes` without releasing anything yet (several reads can become one chunk).
    pub fn feed(&mut self, bytes: &[u8]) {
        self.pending.extend_from_slice(bytes);
    }

    /// Bytes fed but not yet released.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Every event completed so far, as one string.
    pub fn ready(&mut self) -> Option<String> {
        let cut = match last_event_end(&self.pending) {
            Some(end) => end,
            None if self.pending.len() > MAX_PENDING => char_boundary(&self.pending),
            None => return None,
        };
        if cut == 0 {
            return None;
        }
        let rest = self.pending.split_off(cut);
        let ready = std::mem::replace(&mut self.pending, rest);
        Some(into_text(ready))
    }

    /// Whatever is left when the stream ends.
    pub fn finish(self) -> Option<String> {
        (!self.pending.is_empty()).then(|| into_text(self.pending))
    }
}

fn into_text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// The index just past the last blank line (`\n\n` or `\r\n\r\n`) in `bytes`.
fn last_event_end(bytes: &[u8]) -> Option<usize> {
    let lf = bytes.windows(2).rposition(|w| w == b"\n\n").map(|i| i + 2);
    let crlf = bytes
        .windows(4)
        .rposition(|w| w == b"\r\n\r\n")
        .map(|i| i + 4);
    lf.max(crlf)
}

/// The longest prefix of `bytes` that does not end inside a UTF-8 character.
fn char_boundary(bytes: &[u8]) -> usize {
    match std::str::from_utf8(bytes) {
        Ok(_) => bytes.len(),
        Err(e) => e.valid_up_to(),
    }
}

/// Whether a streamed OpenAI request (`body` for `path`) gets usage in its stream only when asked:
/// Chat Completions and Completions report it only with `stream_options.include_usage`.
fn reports_usage_only_when_asked(path: &str) -> bool {
    crate::endpoint::Endpoint::of(path).streams_usage_only_when_asked()
}

/// `body` asking for usage in the stream when the client did not (`Some(body)` then): the relay
/// counts every request's tokens whatever the client asked (Open WebUI never asks), and
/// [`without_usage_only_events`] keeps the answer the client did not ask for out of its stream.
/// `None` leaves the body as it is (not such a request, already asking, or not JSON).
pub fn asking_for_usage(path: &str, body: &str) -> Option<String> {
    if !reports_usage_only_when_asked(path) {
        return None;
    }
    let mut value: Value = serde_json::from_str(body).ok()?;
    let object = value.as_object_mut()?;
    if object.get("stream") != Some(&Value::Bool(true)) {
        return None;
    }
    let options = object
        .entry("stream_options")
        .or_insert_with(|| Value::Object(Default::default()));
    let options = options.as_object_mut()?;
    if options.get("include_usage") == Some(&Value::Bool(true)) {
        return None;
    }
    options.insert("include_usage".to_string(), Value::Bool(true));
    Some(value.to_string())
}

/// `text` (whole SSE events) without the usage-only events (`"choices": []` with a `usage`)
/// that [`asking_for_usage`] made the backend send; a chunk without any is returned as it is
/// (no copy: every chunk of such a stream passes here). Asked for usage, llama-server moves its
/// `timings` from the last choice's event into the usage event: that event is kept without its
/// `usage`, so the client still gets the timings it gets from llama-server directly.
pub fn without_usage_only_events(text: String) -> String {
    if !text.contains("usage") {
        return text;
    }
    // `None`: not a usage-only event, kept as it is; `Some(replacement)` otherwise.
    let usage_only = |event: &str| -> Option<String> {
        let data = event
            .lines()
            .filter_map(data_field)
            .find(|data| data.contains("usage"))?;
        let mut value = serde_json::from_str::<Value>(data.trim()).ok()?;
        let object = value.as_object_mut()?;
        let no_choices = object
            .get("choices")
            .and_then(Value::as_array)
            .is_some_and(Vec::is_empty);
        if !(no_choices && object.get("usage").is_some_and(Value::is_object)) {
            return None;
        }
        if !object.contains_key("timings") {
            return Some(String::new());
        }
        object.remove("usage");
        Some(format!("data: {value}\n\n"))
    };
    let mut kept = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while !rest.is_empty() {
        let end = rest
            .find(
                "

",
            )
            .map(|i| i + 2)
            .or_else(|| {
                rest.find(
                    "

",
                )
                .map(|i| i + 4)
            })
            .unwrap_or(rest.len());
        let (event, after) = rest.split_at(end);
        match usage_only(event) {
            None => kept.push_str(event),
            Some(replacement) => kept.push_str(&replacement),
        }
        rest = after;
    }
    kept
}

/// Token usage gathered from an answer: OpenAI Chat/Completions (`usage.prompt_tokens`), OpenAI
/// Responses (`usage.input_tokens`, also inside `response`), and Anthropic Messages
/// (`message.usage` in `message_start`, `usage` in `message_delta`); and, for a stream, when
/// its first event came.
#[derive(Debug, Default, Clone, Copy)]
pub struct UsageTracker {
    counts: TokenCounts,
    timings: Option<crate::protocol::Timings>,
    /// Prompt tokens from the backend's cache, counted within the prompt's tokens (OpenAI's
    /// `prompt_tokens_details.cached_tokens`, `input_tokens_details.cached_tokens`).
    cached_within: Option<u32>,
    /// Prompt tokens from its cache, counted beside them (Anthropic's
    /// `cache_read_input_tokens`).
    cached_beside: Option<u32>,
    /// When the request went out, for [`UsageTracker::clocked`].
    sent: Option<Instant>,
    /// When the stream's first event came.
    first_event: Option<Instant>,
}

impl UsageTracker {
    /// A tracker for the answer to a request sent at `sent`: its stream's first event is
    /// timed ([`UsageTracker::clocked`]).
    pub fn since(sent: Instant) -> Self {
        UsageTracker {
            sent: Some(sent),
            ..UsageTracker::default()
        }
    }

    /// How fast the backend was by the clock, for one that reports no `timings` (Ollama, vLLM,
    /// LM Studio): the prompt's tokens not taken from its cache, over the time from sending the
    /// request to the stream's first event; the tokens generated after the first, over the
    /// time from there to now (the stream's end). Queueing inside the backend counts as
    /// prompt time, so the caller takes it only for a request that was alone there (and the
    /// proxy only from prompts and answers long enough to outweigh the connection's time).
    /// `None` for an answer that was not a timed stream or said no usage.
    pub fn clocked(&self) -> Option<crate::protocol::Timings> {
        let (sent, first) = (self.sent?, self.first_event?);
        let prompt = self.counts.prompt_tokens?;
        let evaluated = prompt.saturating_sub(self.cached_within.unwrap_or(0));
        let generated = self.counts.completion_tokens?.checked_sub(1)?;
        let ms = |duration: std::time::Duration| duration.as_secs_f64() * 1000.0;
        Some(crate::protocol::Timings {
            prompt_tokens: evaluated,
            prompt_ms: ms(first.saturating_duration_since(sent)),
            cached_tokens: self.cached_within.or(self.cached_beside),
            generated_tokens: generated,
            generation_ms: ms(Instant::now().saturating_duration_since(first)),
        })
    }

    /// Reads usage from a whole JSON body.
    pub fn observe_body(&mut self, body: &[u8]) {
        if let Ok(value) = serde_json::from_slice::<Value>(body) {
            self.observe(&value);
        }
    }

    /// Reads usage from the `data:` lines of SSE text, and llama-server's `timings` beside it
    /// (the relay asks every stream for usage, and llama-server then sends its timings in the
    /// usage event); only lines mentioning usage are parsed, one scan of each chunk.
    pub fn observe_events(&mut self, text: &str) {
        if self.first_event.is_none() && self.sent.is_some() {
            self.first_event = Some(Instant::now());
        }
        if !text.contains("usage") {
            return;
        }
        for line in text.lines() {
            let Some(data) = data_field(line) else {
                continue;
            };
            if data.contains("usage") {
                if let Ok(value) = serde_json::from_str::<Value>(data.trim()) {
                    self.observe(&value);
                }
            }
        }
    }

    fn observe(&mut self, value: &Value) {
        if let Some(timings) = value.get("timings").and_then(llama_timings) {
            self.timings = Some(timings);
        }
        let candidates = [
            value.get("usage"),
            value.get("message").and_then(|m| m.get("usage")),
            value.get("response").and_then(|r| r.get("usage")),
        ];
        for usage in candidates.into_iter().flatten() {
            let field = |name: &str| {
                usage
                    .get(name)
                    .and_then(Value::as_u64)
                    .and_then(|n| u32::try_from(n).ok())
            };
            if let Some(n) = field("prompt_tokens").or_else(|| field("input_tokens")) {
                self.counts.prompt_tokens = Some(n);
            }
            if let Some(n) = field("completion_tokens").or_else(|| field("output_tokens")) {
                self.counts.completion_tokens = Some(n);
            }
            if let Some(n) = field("total_tokens") {
                self.counts.total_tokens = Some(n);
            }
            let details = ["prompt_tokens_details", "input_tokens_details"]
                .into_iter()
                .find_map(|name| usage.get(name)?.get("cached_tokens")?.as_u64());
            if let Some(n) = details.and_then(|n| u32::try_from(n).ok()) {
                self.cached_within = Some(n);
            }
            if let Some(n) = field("cache_read_input_tokens") {
                self.cached_beside = Some(n);
            }
        }
    }

    /// llama-server's `timings` of the answer, if it sent them.
    pub fn timings(&self) -> Option<crate::protocol::Timings> {
        self.timings
    }

    /// The counts seen, with the total derived when the backend gave only its parts.
    pub fn token_counts(&self) -> Option<TokenCounts> {
        let mut counts = self.counts;
        if counts.total_tokens.is_none() {
            if let (Some(p), Some(c)) = (counts.prompt_tokens, counts.completion_tokens) {
                counts.total_tokens = Some(p.saturating_add(c));
            }
        }
        (counts != TokenCounts::default()).then_some(counts)
    }
}

/// llama-server's `timings` object (`prompt_n`, `prompt_ms`, `cache_n`, `predicted_n`,
/// `predicted_ms`) as the protocol carries it; `None` when a field it needs is missing.
pub(crate) fn llama_timings(timings: &Value) -> Option<crate::protocol::Timings> {
    let count = |name: &str| {
        timings
            .get(name)
            .and_then(Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
    };
    let ms = |name: &str| {
        timings
            .get(name)
            .and_then(Value::as_f64)
            .filter(|ms| ms.is_finite() && *ms >= 0.0)
    };
    Some(crate::protocol::Timings {
        prompt_tokens: count("prompt_n")?,
        prompt_ms: ms("prompt_ms")?,
        cached_tokens: count("cache_n"),
        generated_tokens: count("predicted_n").unwrap_or(0),
        generation_ms: ms("predicted_ms").unwrap_or(0.0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_usage_event_the_client_did_not_ask_for_goes_but_llama_servers_timings_stay() {
        let stream = "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"length\"}]}\n\n\
                      data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9},\"timings\":{\"prompt_n\":9}}\n\n\
                      data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9}}\n\n\
                      data: [DONE]\n\n";
        let shown = without_usage_only_events(stream.to_string());
        assert!(!shown.contains("\"usage\""), "{shown}");
        assert!(shown.contains("\"timings\":{\"prompt_n\":9}"), "{shown}");
        assert!(
            shown.contains("finish_reason") && shown.ends_with("data: [DONE]\n\n"),
            "{shown}"
        );
        assert_eq!(shown.matches("data:").count(), 3, "{shown}");
    }

    #[test]
    fn llama_servers_timings_are_read_from_its_last_event_and_from_a_whole_body() {
        let mut tracker = UsageTracker::default();
        tracker.observe_events("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n");
        assert_eq!(tracker.timings(), None);
        tracker.observe_events(
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":120,\"completion_tokens\":8},\
             \"timings\":{\"cache_n\":100,\"prompt_n\":20,\"prompt_ms\":12.5,\
             \"predicted_n\":8,\"predicted_ms\":160.0}}\n\n",
        );
        let timings = tracker.timings().expect("timings");
        assert_eq!(
            (timings.prompt_tokens, timings.cached_tokens),
            (20, Some(100))
        );
        assert_eq!((timings.prompt_ms, timings.generation_ms), (12.5, 160.0));
        assert_eq!(timings.generated_tokens, 8);
        let mut whole = UsageTracker::default();
        whole.observe_body(br#"{"timings":{"prompt_n":5,"prompt_ms":"bad"}}"#);
        assert_eq!(
            whole.timings(),
            None,
            "a malformed timings object is ignored"
        );
        whole.observe_body(br#"{"timings":{"prompt_n":5,"prompt_ms":2.0}}"#);
        assert_eq!(whole.timings().map(|t| t.prompt_tokens), Some(5));
    }

    #[test]
    fn whole_events_are_released_and_partial_ones_kept() {
        let mut s = SseSplitter::default();
        assert_eq!(
            s.push(b"data: {\"a\":1}\n\ndata: {\"b\""),
            Some("data: {\"a\":1}\n\n".to_string())
        );
        assert_eq!(s.push(b":2}\n"), None);
        assert_eq!(s.push(b"\n"), Some("data: {\"b\":2}\n\n".to_string()));
        assert_eq!(s.finish(), None);
    }

    #[test]
    fn a_burst_of_events_becomes_one_chunk() {
        let mut s = SseSplitter::default();
        let burst = b"data: 1\n\ndata: 2\n\ndata: 3\n\n";
        assert_eq!(
            s.push(burst).as_deref(),
            Some("data: 1\n\ndata: 2\n\ndata: 3\n\n")
        );
    }

    #[test]
    fn fed_reads_are_released_together() {
        let mut s = SseSplitter::default();
        s.feed(b"data: 1\n\nda");
        s.feed(b"ta: 2\n\nda");
        assert_eq!(s.pending_len(), 20);
        assert_eq!(s.ready().as_deref(), Some("data: 1\n\ndata: 2\n\n"));
        assert_eq!(s.ready(), None);
        assert_eq!(s.finish().as_deref(), Some("da"));
    }

    #[test]
    fn crlf_event_boundaries_are_recognised() {
        let mut s = SseSplitter::default();
        assert_eq!(
            s.push(b"data: x\r\n\r\nda").as_deref(),
            Some("data: x\r\n\r\n")
        );
        assert_eq!(s.finish().as_deref(), Some("da"));
    }

    #[test]
    fn multibyte_characters_split_across_reads_stay_whole() {
        let text = "data: {\"t\":\"héllo 😀\"}\n\n".as_bytes();
        let mut s = SseSplitter::default();
        let mut out = String::new();
        for byte in text {
            if let Some(chunk) = s.push(&[*byte]) {
                out.push_str(&chunk);
            }
        }
        assert_eq!(out.as_bytes(), text);
    }

    #[test]
    fn an_endless_event_is_flushed_at_a_character_boundary() {
        let mut s = SseSplitter::default();
        let mut big = "é".repeat(MAX_PENDING / 2 + 1).into_bytes();
        big.push(0xC3); // first half of another "é"
        let out = s.push(&big).expect("flushed");
        assert!(out.len() > MAX_PENDING);
        assert_eq!(
            s.finish().map(|rest| rest.len()),
            Some(3),
            "the dangling byte is kept (lossy at end)"
        );
    }

    #[test]
    fn openai_usage_from_a_body() {
        let mut u = UsageTracker::default();
        u.observe_body(br#"{"choices":[],"usage":{"prompt_tokens":42,"completion_tokens":128,"total_tokens":170}}"#);
        assert_eq!(
            u.token_counts(),
            Some(TokenCounts {
                prompt_tokens: Some(42),
                completion_tokens: Some(128),
                total_tokens: Some(170)
            })
        );
    }

    #[test]
    fn anthropic_stream_usage_from_message_start_and_delta() {
        let mut u = UsageTracker::default();
        u.observe_events("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":10,\"output_tokens\":1}}}\n\n");
        u.observe_events("event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":25}}\n\n");
        assert_eq!(
            u.token_counts(),
            Some(TokenCounts {
                prompt_tokens: Some(10),
                completion_tokens: Some(25),
                total_tokens: Some(35)
            })
        );
    }

    #[test]
    fn responses_usage_inside_response_object() {
        let mut u = UsageTracker::default();
        u.observe_events("data: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":3,\"output_tokens\":4,\"total_tokens\":7}}}\n\n");
        assert_eq!(u.token_counts().and_then(|c| c.total_tokens), Some(7));
    }

    #[test]
    fn a_streamed_chat_asks_for_usage_the_client_did_not_ask_for() {
        let asked = asking_for_usage(
            "/v1/chat/completions",
            r#"{"model":"m","stream":true,"stream_options":{"x":1},"messages":[]}"#,
        )
        .unwrap();
        let value: Value = serde_json::from_str(&asked).unwrap();
        assert_eq!(value["stream_options"]["include_usage"], true);
        assert_eq!(value["stream_options"]["x"], 1, "the client's options stay");
        for (path, body) in [
            (
                "/v1/chat/completions",
                r#"{"stream":true,"stream_options":{"include_usage":true}}"#,
            ),
            ("/v1/chat/completions", r#"{"stream":false}"#),
            ("/v1/messages", r#"{"stream":true}"#),
            ("/v1/chat/completions", "not json"),
        ] {
            assert_eq!(asking_for_usage(path, body), None, "{path} {body}");
        }
        assert!(asking_for_usage("/v1/completions?x=1", r#"{"stream":true}"#).is_some());
    }

    #[test]
    fn the_usage_only_event_is_kept_out_of_a_stream_that_did_not_ask() {
        let stream = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n\
                      data: {\"choices\":[],\"usage\":{\"prompt_tokens\":31,\"completion_tokens\":2}}\n\n\
                      data: [DONE]\n\n";
        let mut usage = UsageTracker::default();
        usage.observe_events(stream);
        assert_eq!(usage.token_counts().unwrap().prompt_tokens, Some(31));
        assert_eq!(
            without_usage_only_events(stream.to_string()),
            "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\ndata: [DONE]\n\n"
        );
        let plain = "data: {\"choices\":[]}\n\n";
        assert_eq!(without_usage_only_events(plain.to_string()), plain);
    }

    #[test]
    fn no_usage_means_no_counts() {
        let mut u = UsageTracker::default();
        u.observe_events("data: {\"choices\":[]}\n\ndata: [DONE]\n\n");
        u.observe_body(b"not json");
        assert_eq!(u.token_counts(), None);
    }

    #[test]
    fn a_stream_is_clocked_from_the_request_to_its_first_event_and_on_to_its_end() {
        let sent = Instant::now() - std::time::Duration::from_millis(400);
        let mut u = UsageTracker::since(sent);
        u.observe_events("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n");
        std::thread::sleep(std::time::Duration::from_millis(20));
        u.observe_events(concat!(
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1200,",
            "\"completion_tokens\":41,\"prompt_tokens_details\":{\"cached_tokens\":200}}}\n\n"
        ));
        let t = u.clocked().expect("clocked");
        // The cached tokens are counted within the prompt's: 1,000 evaluated.
        assert_eq!((t.prompt_tokens, t.cached_tokens), (1000, Some(200)));
        assert!((400.0..1000.0).contains(&t.prompt_ms), "{t:?}");
        assert_eq!(t.generated_tokens, 40, "the tokens after the first");
        assert!(t.generation_ms >= 20.0, "{t:?}");

        // Anthropic counts its cache beside the input: nothing to take off.
        let mut u = UsageTracker::since(sent);
        u.observe_events(concat!(
            "data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":300,",
            "\"cache_read_input_tokens\":900}}}\n\n"
        ));
        u.observe_events("data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":9}}\n\n");
        let t = u.clocked().expect("clocked");
        assert_eq!((t.prompt_tokens, t.cached_tokens), (300, Some(900)));
    }

    #[test]
    fn only_a_timed_stream_with_usage_and_an_answer_is_clocked() {
        let usage = "data: {\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":5}}\n\n";
        // Not timed (the proxy's upstreams, a body).
        let mut u = UsageTracker::default();
        u.observe_events(usage);
        assert_eq!(u.clocked(), None);
        let mut u = UsageTracker::since(Instant::now());
        u.observe_body(usage.trim_start_matches("data: ").as_bytes());
        assert_eq!(u.clocked(), None, "no first event: a whole body");
        // No usage, or nothing generated.
        let mut u = UsageTracker::since(Instant::now());
        u.observe_events("data: {\"choices\":[]}\n\n");
        assert_eq!(u.clocked(), None);
        let mut u = UsageTracker::since(Instant::now());
        u.observe_events("data: {\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":0}}\n\n");
        assert_eq!(u.clocked(), None);
    }
}
