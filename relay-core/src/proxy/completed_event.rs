//! Responses streams passing through the proxy: spotting the `response.completed` event without
//! holding the stream (only the event being read is kept, and only while it may be the one
//! wanted: an event named otherwise is skipped to its end), and patching events on their way to
//! the client ([`StreamPatcher`]).

use bytes::Bytes;
use serde_json::{json, Value};

/// The name (and `type`) of the event that carries the finished response.
const COMPLETED: &str = "response.completed";

/// Watches SSE bytes for `response.completed` and hands out its `response` object.
#[derive(Debug)]
pub struct CompletedWatch {
    /// The current line, while it matters.
    line: Vec<u8>,
    /// Whether the current line has any bytes (kept even when the bytes are not).
    line_nonempty: bool,
    /// The current event's `data`, while it may be the completed event.
    data: Vec<u8>,
    /// The current event is named something else, or grew past `limit`: skip to its end.
    skipping: bool,
    /// The largest event kept.
    limit: usize,
}

impl CompletedWatch {
    /// A watch that gives up on events larger than `limit` bytes.
    pub fn new(limit: usize) -> Self {
        CompletedWatch {
            line: Vec::new(),
            line_nonempty: false,
            data: Vec::new(),
            skipping: false,
            limit,
        }
    }

    /// Reads more of the stream; returns the finished response once its event is complete.
    pub fn push(&mut self, bytes: &[u8]) -> Option<Value> {
        let mut found = None;
        for piece in bytes.split_inclusive(|b| *b == b'\n') {
            let (content, ends_line) = match piece.strip_suffix(b"\n") {
                Some(content) => (content, true),
                None => (piece, false),
            };
            let content = content.strip_suffix(b"\r").unwrap_or(content);
            if !content.is_empty() {
                self.line_nonempty = true;
                if !self.skipping {
                    self.line.extend_from_slice(content);
                    if self.line.len() + self.data.len() > self.limit {
                        self.skip();
                    }
                }
            }
            if ends_line {
                if let Some(response) = self.end_line() {
                    found = Some(response);
                }
            }
        }
        found
    }

    fn skip(&mut self) {
        self.skipping = true;
        self.line = Vec::new();
        self.data = Vec::new();
    }

    fn end_line(&mut self) -> Option<Value> {
        if !self.line_nonempty {
            return self.end_event();
        }
        self.line_nonempty = false;
        let line = std::mem::take(&mut self.line);
        if let Some(name) = line.strip_prefix(b"event:") {
            if name.trim_ascii() != COMPLETED.as_bytes() {
                self.skip();
            }
        } else if let Some(data) = line.strip_prefix(b"data:") {
            if !self.data.is_empty() {
                self.data.push(b'\n');
            }
            self.data
                .extend_from_slice(data.strip_prefix(b" ").unwrap_or(data));
        }
        None
    }

    fn end_event(&mut self) -> Option<Value> {
        let skipped = std::mem::replace(&mut self.skipping, false);
        let data = std::mem::take(&mut self.data);
        self.line.clear();
        // Cheap test first: most events are deltas, never parsed here.
        if skipped || !contains(&data, COMPLETED.as_bytes()) {
            return None;
        }
        let mut event: Value = serde_json::from_slice(&data).ok()?;
        if event.get("type").and_then(Value::as_str) != Some(COMPLETED) {
            return None;
        }
        Some(event.get_mut("response")?.take())
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Patches a Responses stream line by line as it passes:
///
/// - a continuation's response objects (`response.created`, `.in_progress`, `.completed`, ...)
///   echo `previous_response_id`: the request the worker got was expanded without it, and OpenAI
///   echoes it, as the unary answer does;
/// - an event without `sequence_number` gets the next one. Native backends (llama-server) leave
///   it out and the OpenAI SDK's stream helper needs it, as do the relay's own `error` events
///   ended onto a stream. Numbers already present are kept, and the count continues after them.
///
/// Only the `sequence_number` gap is filled for native streams: their missing `output_index` and
/// `content_index` would need the item structure rebuilt from every event, which is the
/// adapter's job (configure the backend as not native for Responses to get complete events).
/// The check is a substring test per `data:` line, so streams that already carry the field,
/// the relay's own translations, cost one scan. An unfinished line is held until its end
/// arrives, so a split line is never patched in halves.
#[derive(Debug)]
pub struct StreamPatcher {
    previous: Option<String>,
    partial: Vec<u8>,
    next_sequence: u64,
}

impl StreamPatcher {
    /// A patcher; `previous` is the id a continuation continued (`None`: nothing to echo).
    pub fn new(previous: Option<String>) -> Self {
        StreamPatcher {
            previous,
            partial: Vec::new(),
            next_sequence: 0,
        }
    }

    /// Patches the whole lines `bytes` completes; returns them (possibly nothing).
    pub fn push(&mut self, bytes: &[u8]) -> Bytes {
        let Some(last_newline) = bytes.iter().rposition(|b| *b == b'\n') else {
            self.partial.extend_from_slice(bytes);
            return Bytes::new();
        };
        let mut text = std::mem::take(&mut self.partial);
        text.extend_from_slice(&bytes[..=last_newline]);
        self.partial.extend_from_slice(&bytes[last_newline + 1..]);
        let mut out = Vec::with_capacity(text.len() + 32);
        for line in text.split_inclusive(|b| *b == b'\n') {
            self.line(line, &mut out);
        }
        Bytes::from(out)
    }

    /// The end of the stream: an unfinished last line, patched.
    pub fn finish(&mut self) -> Bytes {
        let rest = std::mem::take(&mut self.partial);
        let mut out = Vec::new();
        if !rest.is_empty() {
            self.line(&rest, &mut out);
        }
        Bytes::from(out)
    }

    /// Appends `line` (with its line ending, if any), patched when it is event data.
    fn line(&mut self, line: &[u8], out: &mut Vec<u8>) {
        let content_end = line
            .iter()
            .rposition(|b| *b != b'\n' && *b != b'\r')
            .map_or(0, |i| i + 1);
        let (content, ending) = line.split_at(content_end);
        let patched = content
            .strip_prefix(b"data:")
            .and_then(|data| std::str::from_utf8(data).ok())
            .and_then(|data| self.patch(data.trim()));
        match patched {
            Some(data) => {
                out.extend_from_slice(b"data: ");
                out.extend_from_slice(data.as_bytes());
            }
            None => out.extend_from_slice(content),
        }
        out.extend_from_slice(ending);
    }

    /// The patched data of one event, or `None` to send it as it is.
    fn patch(&mut self, data: &str) -> Option<String> {
        // Only whole JSON objects on one line are touched (every Responses server sends them so).
        if !(data.starts_with('{') && data.ends_with('}')) {
            return None;
        }
        let echoed = self.echo_previous(data);
        let data = echoed.as_deref().unwrap_or(data);
        if let Some(number) = sequence_number(data) {
            self.next_sequence = self.next_sequence.max(number.saturating_add(1));
            return echoed;
        }
        let number = self.next_sequence;
        self.next_sequence += 1;
        let rest = data[1..].trim_start();
        let separator = if rest.starts_with('}') { "" } else { "," };
        Some(format!("{{\"sequence_number\":{number}{separator}{rest}"))
    }

    /// `data` with its response object's `previous_response_id` set, if that is to be echoed
    /// and the object has none.
    fn echo_previous(&self, data: &str) -> Option<String> {
        let previous = self.previous.as_deref()?;
        // Cheap test first: only events carrying a whole response object are parsed.
        if !data.contains("\"response\"") {
            return None;
        }
        let mut event: Value = serde_json::from_str(data).ok()?;
        let response = event.get_mut("response")?.as_object_mut()?;
        match response.get("previous_response_id") {
            None | Some(Value::Null) => {
                response.insert("previous_response_id".into(), json!(previous));
                Some(event.to_string())
            }
            Some(_) => None,
        }
    }
}

/// The value of a top-level `sequence_number` in event JSON text, found without parsing: the
/// key cannot occur unescaped inside a string value.
fn sequence_number(data: &str) -> Option<u64> {
    const KEY: &str = "\"sequence_number\"";
    let after = &data[data.find(KEY)? + KEY.len()..];
    let digits = after.trim_start().strip_prefix(':')?.trim_start();
    let end = digits
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(digits.len());
    digits[..end].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stream(named: bool) -> String {
        let event = |name: &str, data: Value| {
            if named {
                format!("event: {name}\ndata: {data}\n\n")
            } else {
                format!("data: {data}\n\n")
            }
        };
        [
            event(
                "response.created",
                json!({"type": "response.created", "response": {"id": "resp_1", "status": "in_progress"}}),
            ),
            event(
                "response.output_text.delta",
                json!({"type": "response.output_text.delta", "delta": "response.completed is a word"}),
            ),
            event(
                "response.completed",
                json!({"type": "response.completed", "response": {"id": "resp_1", "status": "completed"}}),
            ),
        ]
        .concat()
    }

    #[test]
    fn the_completed_response_is_found_however_the_stream_is_cut() {
        for named in [true, false] {
            let text = stream(named).replace("\n", if named { "\n" } else { "\r\n" });
            let bytes = text.as_bytes();
            for cut in [1, 2, 3, 7, 64, bytes.len()] {
                let mut watch = CompletedWatch::new(1 << 20);
                let found: Vec<Value> = bytes.chunks(cut).filter_map(|c| watch.push(c)).collect();
                assert_eq!(
                    found,
                    [json!({"id": "resp_1", "status": "completed"})],
                    "named {named}, pieces of {cut}"
                );
            }
        }
    }

    fn patch_whole(previous: Option<&str>, text: &str, cut: usize) -> String {
        let mut patcher = StreamPatcher::new(previous.map(str::to_string));
        let mut out = Vec::new();
        for piece in text.as_bytes().chunks(cut) {
            out.extend_from_slice(&patcher.push(piece));
        }
        out.extend_from_slice(&patcher.finish());
        String::from_utf8(out).expect("utf-8")
    }

    fn data_of(text: &str) -> Vec<Value> {
        text.lines()
            .filter_map(|line| line.strip_prefix("data: "))
            .map(|data| serde_json::from_str(data).expect("JSON"))
            .collect()
    }

    #[test]
    fn a_continuations_streamed_response_objects_echo_previous_response_id() {
        let text = stream(true);
        for cut in [1, 5, text.len()] {
            let out = patch_whole(Some("resp_0"), &text, cut);
            let events = data_of(&out);
            assert_eq!(events[0]["response"]["previous_response_id"], "resp_0");
            assert_eq!(events[2]["response"]["previous_response_id"], "resp_0");
            assert_eq!(events[1]["delta"], "response.completed is a word");
            assert!(out.starts_with("event: response.created\ndata: {"), "{out}");
        }
        let already = "data: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"previous_response_id\":\"resp_x\"}}\n\n";
        assert_eq!(patch_whole(Some("resp_0"), already, 7), already, "kept");
        assert_eq!(
            patch_whole(None, already, 7),
            already,
            "nothing to echo outside a continuation"
        );
    }

    #[test]
    fn events_without_sequence_number_are_numbered_after_those_with_one() {
        let text = "event: response.created\r\ndata: {\"type\":\"response.created\",\"response\":{}}\r\n\r\n\
                    data: {\"type\":\"x\",\"sequence_number\": 5}\n\n\
                    data: {\"type\":\"response.output_text.delta\",\"delta\":\"\\\"sequence_number\\\": 9\"}\n\n\
                    data: {}\n\ndata: [DONE]\n\n";
        for cut in [1, 3, text.len()] {
            let out = patch_whole(None, text, cut);
            let numbers: Vec<Value> = data_of(&out.replace("data: [DONE]", ""))
                .iter()
                .map(|e| e["sequence_number"].clone())
                .collect();
            assert_eq!(numbers, [json!(0), json!(5), json!(6), json!(7)], "{out}");
            assert!(out.contains("\r\n\r\n"), "line endings are kept: {out:?}");
            assert!(out.ends_with("data: [DONE]\n\n"));
        }
        let numbered = stream(true).replace("\"type\"", "\"sequence_number\":1,\"type\"");
        assert_eq!(patch_whole(None, &numbered, 4), numbered, "untouched");
    }

    #[test]
    fn events_larger_than_the_limit_are_not_kept() {
        let mut watch = CompletedWatch::new(40);
        assert_eq!(watch.push(stream(true).as_bytes()), None);
        assert!(watch.data.capacity() <= 64 && watch.line.capacity() <= 64);
        let mut watch = CompletedWatch::new(1 << 20);
        let found = watch.push(stream(false).as_bytes());
        assert!(found.is_some(), "unnamed events are read from their data");
    }
}
