//! Writing an Anthropic Messages event stream from canonical events.
//!
//! Clients such as Claude Code rebuild the message from block indices, so the invariants are
//! strict: `message_start` (with a full usage object) first, then blocks numbered 0, 1, 2, ...,
//! each `content_block_start` → deltas → `content_block_stop` before the next block starts, then
//! `message_delta` (stop reason, usage) and `message_stop`.

use std::fmt::Write as _;

use serde_json::{json, Value};

use super::Writer;
use crate::adapter::anthropic_messages::{message_id, stop_reason_name, usage_object};
use crate::adapter::canonical::{StopReason, StreamEvent, Usage};
use crate::adapter::sse;
use crate::adapter::Identity;

/// The kind of the block that is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Text,
    Thinking,
    /// A tool call, by the backend's call index.
    Tool(u64),
}

/// State of one Anthropic stream being written.
#[derive(Debug)]
pub(super) struct AnthropicWriter {
    identity: Identity,
    model: String,
    started: bool,
    finished: bool,
    /// Blocks opened so far; the open block, if any, has index `blocks - 1`.
    blocks: usize,
    open: Option<Block>,
    /// Tool call indices whose block is already stopped.
    closed_tools: Vec<u64>,
    stop: Option<StopReason>,
    saw_tool: bool,
    usage: Usage,
}

impl AnthropicWriter {
    /// A writer answering under the client-facing `model` name (empty: use the backend's).
    pub(super) fn new(identity: Identity, model: String) -> Self {
        AnthropicWriter {
            identity,
            model,
            started: false,
            finished: false,
            blocks: 0,
            open: None,
            closed_tools: Vec::new(),
            stop: None,
            saw_tool: false,
            usage: Usage::default(),
        }
    }

    fn start(&mut self, out: &mut String) {
        if self.started {
            return;
        }
        self.started = true;
        let message = json!({
            "id": message_id(&self.identity),
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": null,
            "stop_sequence": null,
            // Input counts arrive with the backend's last chunk; the SDKs need every field now.
            "usage": usage_object(&Usage::default()),
        });
        emit(out, "message_start", json!({"message": message}));
        emit(out, "ping", json!({}));
    }

    /// Makes `block` the open block, stopping the previous one first.
    fn open(&mut self, block: Block, content_block: Value, out: &mut String) {
        self.close(out);
        emit(
            out,
            "content_block_start",
            json!({"index": self.blocks, "content_block": content_block}),
        );
        self.blocks += 1;
        self.open = Some(block);
    }

    fn close(&mut self, out: &mut String) {
        if let Some(block) = self.open.take() {
            if let Block::Tool(index) = block {
                self.closed_tools.push(index);
            }
            emit(out, "content_block_stop", json!({"index": self.blocks - 1}));
        }
    }

    /// A `content_block_delta` of `kind` carrying `text` in `field`, for the open block.
    fn delta(&self, out: &mut String, kind: &str, field: &str, text: &str) {
        emit_delta(out, self.blocks - 1, kind, field, text);
    }
}

impl Writer for AnthropicWriter {
    fn event(&mut self, event: StreamEvent, out: &mut String) {
        if self.finished {
            return;
        }
        match event {
            StreamEvent::Start { model } => {
                if self.model.is_empty() {
                    self.model = model.unwrap_or_default();
                }
                self.start(out);
            }
            StreamEvent::Text(text) => {
                self.start(out);
                if self.open != Some(Block::Text) {
                    self.open(Block::Text, json!({"type": "text", "text": ""}), out);
                }
                self.delta(out, "text_delta", "text", &text);
            }
            StreamEvent::Thinking(text) => {
                self.start(out);
                if self.open != Some(Block::Thinking) {
                    let block = json!({"type": "thinking", "thinking": "", "signature": ""});
                    self.open(Block::Thinking, block, out);
                }
                self.delta(out, "thinking_delta", "thinking", &text);
            }
            StreamEvent::ToolCall {
                index,
                id,
                name,
                arguments,
            } => {
                self.start(out);
                self.saw_tool = true;
                if self.open != Some(Block::Tool(index)) {
                    if self.closed_tools.contains(&index) {
                        // A fragment for a call whose block is already stopped cannot be placed:
                        // reopening would make a second tool_use. Backends stream calls one
                        // after another, so this does not happen in practice.
                        return;
                    }
                    let id =
                        id.unwrap_or_else(|| format!("toolu_{}_{}", self.identity.id, self.blocks));
                    let block = json!({
                        "type": "tool_use",
                        "id": id,
                        "name": name.unwrap_or_default(),
                        "input": {},
                    });
                    self.open(Block::Tool(index), block, out);
                }
                if !arguments.is_empty() {
                    // Passed on verbatim, malformed or not: the client parses the whole.
                    self.delta(out, "input_json_delta", "partial_json", &arguments);
                }
            }
            StreamEvent::Finish(reason) => self.stop = Some(reason),
            StreamEvent::Usage(usage) => self.usage = usage,
            StreamEvent::Error(message) => {
                // An error event ends an Anthropic stream; the SDKs raise it as an API error.
                emit(
                    out,
                    "error",
                    json!({"error": {"type": "api_error", "message": message}}),
                );
                self.finished = true;
            }
        }
    }

    fn finish(&mut self, out: &mut String) {
        if self.finished {
            return;
        }
        self.start(out);
        self.close(out);
        // A stream cut off before its finish reason ends the turn as it stands.
        let stop = self.stop.unwrap_or(if self.saw_tool {
            StopReason::ToolUse
        } else {
            StopReason::EndTurn
        });
        emit(
            out,
            "message_delta",
            json!({
                "delta": {"stop_reason": stop_reason_name(stop), "stop_sequence": null},
                "usage": usage_object(&self.usage),
            }),
        );
        emit(out, "message_stop", json!({}));
        self.finished = true;
    }
}

/// Writes a `content_block_delta` event for block `index`: `{"delta": {field: text, "type":
/// kind}, "index": index, "type": "content_block_delta"}`, byte for byte what [`emit`] makes of
/// it (serde_json orders keys; every `field` used sorts before `type`; test), without building
/// a `Value` per token: a translated token cost twice a passed-through one that way (round-2
/// profile, BENCHMARKS.md).
fn emit_delta(out: &mut String, index: usize, kind: &str, field: &str, text: &str) {
    debug_assert!(field < "type");
    out.push_str("event: content_block_delta\ndata: {\"delta\":{\"");
    out.push_str(field);
    out.push_str("\":");
    sse::push_json_string(out, text);
    out.push_str(",\"type\":\"");
    out.push_str(kind);
    // Writing into a String cannot fail.
    let _ = write!(
        out,
        "\"}},\"index\":{index},\"type\":\"content_block_delta\"}}\n\n"
    );
}

/// Writes event `kind` with `data` plus its `type` field.
fn emit(out: &mut String, kind: &str, mut data: Value) {
    data["type"] = json!(kind);
    out.push_str(&sse::event(kind, &data));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas_written_directly_are_the_bytes_of_the_generic_event() {
        for (kind, field) in [
            ("text_delta", "text"),
            ("thinking_delta", "thinking"),
            ("input_json_delta", "partial_json"),
        ] {
            for (index, text) in [(0, "Hello"), (7, "\"quoted\"\n\u{1} 🦀"), (12345, "")] {
                let mut direct = String::new();
                emit_delta(&mut direct, index, kind, field, text);
                let mut generic = String::new();
                let delta = json!({"type": kind, field: text});
                emit(
                    &mut generic,
                    "content_block_delta",
                    json!({"index": index, "delta": delta}),
                );
                assert_eq!(direct, generic);
            }
        }
    }
}
