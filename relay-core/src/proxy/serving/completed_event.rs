//! Responses streams passing through the proxy: spotting the `response.completed` event without
//! holding the stream (only the event being read is kept, and only while it may be the one
//! wanted: an event named otherwise is skipped to its end). Patching the events on their way to
//! the client is [`super::stream_patch`]'s.

use serde_json::Value;

/// The name (and `type`) of the event that carries the finished response.
pub(crate) const COMPLETED: &str = "response.completed";

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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    /// A Responses stream with a delta that names the completed event, events `named` or not.
    pub(crate) fn stream(named: bool) -> String {
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
