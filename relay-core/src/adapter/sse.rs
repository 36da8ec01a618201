//! Server-sent-events framing: reassembling events from text that arrives in arbitrary pieces,
//! and writing events.

use serde_json::Value;

/// Splits text into whole lines, keeping an unfinished last line for the next piece.
#[derive(Debug, Default)]
pub(crate) struct LineBuffer {
    partial: String,
}

impl LineBuffer {
    /// Adds `chunk`; returns the lines it completed, without their `\n` or `\r\n`.
    pub(crate) fn push(&mut self, chunk: &str) -> Vec<String> {
        // Only the new text is searched, so a long line arriving in many pieces costs linear time.
        let Some(last_newline) = chunk.rfind('\n') else {
            self.partial.push_str(chunk);
            return Vec::new();
        };
        self.partial.push_str(&chunk[..last_newline]);
        let complete = std::mem::replace(&mut self.partial, chunk[last_newline + 1..].to_string());
        complete
            .split('\n')
            .map(|line| line.strip_suffix('\r').unwrap_or(line).to_string())
            .collect()
    }

    /// The unfinished last line, if any, when the text ends.
    pub(crate) fn take_rest(&mut self) -> Option<String> {
        let rest = std::mem::take(&mut self.partial);
        let rest = rest.strip_suffix('\r').unwrap_or(&rest).to_string();
        (!rest.is_empty()).then_some(rest)
    }
}

/// Reassembles SSE events and yields the `data` of each.
#[derive(Debug, Default)]
pub(crate) struct EventReader {
    lines: LineBuffer,
    data: Vec<String>,
}

impl EventReader {
    /// Adds `chunk`; returns the data of every event it completed.
    pub(crate) fn push(&mut self, chunk: &str) -> Vec<String> {
        let mut out = Vec::new();
        for line in self.lines.push(chunk) {
            self.line(&line, &mut out);
        }
        out
    }

    /// The data of an event left unterminated when the text ended.
    pub(crate) fn finish(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(line) = self.lines.take_rest() {
            self.line(&line, &mut out);
        }
        self.dispatch(&mut out);
        out
    }

    fn line(&mut self, line: &str, out: &mut Vec<String>) {
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        let Some(data) = line.strip_prefix("data:") else {
            // `event:`, `id:`, `retry:` and `:` comments carry nothing a chat stream needs.
            return;
        };
        if self.pending_is_whole() {
            // A backend that omits the blank line between events would otherwise glue two JSON
            // documents into one unreadable event.
            self.dispatch(out);
        }
        self.data
            .push(data.strip_prefix(' ').unwrap_or(data).to_string());
    }

    fn pending_is_whole(&self) -> bool {
        match self.data.as_slice() {
            [] => false,
            [one] => one == "[DONE]" || serde_json::from_str::<Value>(one).is_ok(),
            _ => false,
        }
    }

    fn dispatch(&mut self, out: &mut Vec<String>) {
        if !self.data.is_empty() {
            out.push(self.data.join("\n"));
            self.data.clear();
        }
    }
}

/// One named SSE event.
pub(crate) fn event(name: &str, data: &Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

/// One unnamed SSE event, as chat-completions streams send them.
pub(crate) fn data(data: &Value) -> String {
    format!("data: {data}\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_split_across_chunks_are_reassembled() {
        let mut lines = LineBuffer::default();
        assert!(lines.push("data: {\"a\"").is_empty());
        assert_eq!(lines.push(":1}\r\n\r\nda"), vec!["data: {\"a\":1}", ""]);
        assert_eq!(lines.take_rest().as_deref(), Some("da"));
        assert_eq!(lines.take_rest(), None);
    }

    #[test]
    fn events_are_dispatched_at_blank_lines() {
        let mut reader = EventReader::default();
        let text = ": comment\nevent: x\ndata: {\"n\":1}\n\ndata: {\"n\":2}\n\ndata: [DONE]\n\n";
        let mut got = Vec::new();
        for piece in text.as_bytes().chunks(3) {
            got.extend(reader.push(std::str::from_utf8(piece).unwrap()));
        }
        assert_eq!(got, vec!["{\"n\":1}", "{\"n\":2}", "[DONE]"]);
        assert!(reader.finish().is_empty());
    }

    #[test]
    fn multi_line_data_is_joined_and_an_unterminated_event_is_flushed() {
        let mut reader = EventReader::default();
        assert_eq!(
            reader.push("data: {\"a\":\ndata: 1}\n\ndata: {\"b\":2}"),
            vec!["{\"a\":\n1}"]
        );
        assert_eq!(reader.finish(), vec!["{\"b\":2}"]);
    }

    #[test]
    fn missing_blank_lines_between_events_are_tolerated() {
        let mut reader = EventReader::default();
        assert_eq!(
            reader.push("data: {\"a\":1}\ndata: {\"b\":2}\ndata: [DONE]\n"),
            vec!["{\"a\":1}", "{\"b\":2}"]
        );
        assert_eq!(reader.finish(), vec!["[DONE]"]);
    }
}
