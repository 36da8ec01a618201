//! Passing a chat-completions stream through to a chat client, repairing its terminator.

use serde_json::Value;

use crate::adapter::canonical::Usage;
use crate::adapter::openai_chat::parse_usage;
use crate::adapter::sse::{data_field, LineBuffer};

/// Forwards the backend's lines as they complete. Exactly one `data: [DONE]` ends the stream:
/// a missing one is added at the end, later ones (and anything after the first) are dropped.
#[derive(Debug)]
pub(super) struct ChatPassthrough {
    lines: LineBuffer,
    done: bool,
    /// Whether the last line sent ended an event (or nothing was sent yet).
    at_boundary: bool,
    usage: Option<Usage>,
}

impl Default for ChatPassthrough {
    fn default() -> Self {
        ChatPassthrough {
            lines: LineBuffer::default(),
            done: false,
            at_boundary: true,
            usage: None,
        }
    }
}

impl ChatPassthrough {
    /// Adds a piece of the backend's stream; returns the lines it completed.
    pub(super) fn push(&mut self, chunk: &str) -> String {
        let mut out = String::new();
        for line in self.lines.push(chunk) {
            self.line(&line, &mut out);
        }
        out
    }

    /// Ends the stream: flushes an unfinished line and adds `[DONE]` if the backend did not.
    pub(super) fn finish(&mut self) -> String {
        let mut out = String::new();
        if let Some(line) = self.lines.take_rest().filter(|line| is_whole(line)) {
            self.line(&line, &mut out);
        }
        if !self.done {
            self.done(&mut out);
        }
        out
    }

    /// The last usage the backend reported.
    pub(super) fn usage(&self) -> Option<Usage> {
        self.usage
    }

    fn line(&mut self, line: &str, out: &mut String) {
        if self.done {
            return;
        }
        if let Some(data) = data_field(line) {
            let data = data.trim();
            if data == "[DONE]" {
                self.done(out);
                return;
            }
            if data.contains("\"usage\"") {
                if let Ok(chunk) = serde_json::from_str::<Value>(data) {
                    if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
                        self.usage = Some(parse_usage(usage));
                    }
                }
            }
        }
        out.push_str(line);
        out.push('\n');
        self.at_boundary = line.is_empty();
    }

    fn done(&mut self, out: &mut String) {
        if !self.at_boundary {
            // End the event that is still open, so `[DONE]` is an event of its own.
            out.push('\n');
        }
        out.push_str("data: [DONE]\n\n");
        self.done = true;
    }
}

/// Whether an unterminated last line can be sent: a cut-off `data:` line would make the client's
/// JSON parser fail, so only complete JSON (or `[DONE]`) goes out.
fn is_whole(line: &str) -> bool {
    match data_field(line) {
        Some(data) => {
            let data = data.trim();
            data == "[DONE]" || serde_json::from_str::<Value>(data).is_ok()
        }
        None => true,
    }
}
