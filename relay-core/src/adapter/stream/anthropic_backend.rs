//! Decoding an Anthropic upstream's Messages stream into canonical [`StreamEvent`]s, so OpenAI
//! clients can be served from it by the same writers as from a chat backend.

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::Decoder;
use crate::adapter::anthropic_messages::{parse_usage, stop_reason};
use crate::adapter::canonical::StreamEvent;
use crate::adapter::sse::EventReader;

/// Turns Anthropic SSE text into canonical events, one event's worth at a time.
///
/// Tool calls are renumbered: Anthropic numbers every content block, chat numbers only the tool
/// calls (0, 1, ...), and the writers follow chat. Usage arrives in two halves (input counts in
/// `message_start`, output counts in `message_delta`) and is reported merged.
#[derive(Debug, Default)]
pub(super) struct AnthropicDecoder {
    reader: EventReader,
    done: bool,
    /// Anthropic block index → tool call number, for `tool_use` blocks.
    tools: HashMap<u64, u64>,
    /// The usage fields seen so far, as Anthropic names them.
    usage: Map<String, Value>,
}

impl Decoder for AnthropicDecoder {
    fn reader(&mut self) -> &mut EventReader {
        &mut self.reader
    }

    /// `message_stop` arrived.
    fn is_done(&self) -> bool {
        self.done
    }

    fn data(&mut self, data: &str, out: &mut Vec<StreamEvent>) {
        // An event that is not JSON carries nothing usable; skipping it keeps the stream alive.
        let Ok(event) = serde_json::from_str::<Value>(data) else {
            return;
        };
        let text = |value: &Value, key: &str| {
            value
                .get(key)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(String::from)
        };
        match event
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default()
        {
            "message_start" => {
                let message = event.get("message").unwrap_or(&Value::Null);
                out.push(StreamEvent::Start {
                    model: text(message, "model"),
                });
                self.add_usage(message.get("usage"), out);
            }
            "content_block_start" => {
                let block = event.get("content_block").unwrap_or(&Value::Null);
                match block.get("type").and_then(Value::as_str) {
                    Some("text") => out.extend(text(block, "text").map(StreamEvent::Text)),
                    Some("thinking") => {
                        out.extend(text(block, "thinking").map(StreamEvent::Thinking))
                    }
                    Some("tool_use") => {
                        let number = self.tools.len() as u64;
                        self.tools.insert(index(&event), number);
                        // The input comes as `input_json_delta`s; a non-empty start value is
                        // a whole input sent at once.
                        let arguments = match block.get("input") {
                            Some(Value::Object(input)) if !input.is_empty() => {
                                Value::Object(input.clone()).to_string()
                            }
                            _ => String::new(),
                        };
                        out.push(StreamEvent::ToolCall {
                            index: number,
                            id: text(block, "id"),
                            name: text(block, "name"),
                            arguments,
                        });
                    }
                    // Redacted reasoning and server-side tools have no chat counterpart.
                    _ => {}
                }
            }
            "content_block_delta" => {
                let delta = event.get("delta").unwrap_or(&Value::Null);
                match delta.get("type").and_then(Value::as_str) {
                    Some("text_delta") => out.extend(text(delta, "text").map(StreamEvent::Text)),
                    Some("thinking_delta") => {
                        out.extend(text(delta, "thinking").map(StreamEvent::Thinking))
                    }
                    Some("input_json_delta") => {
                        let call = self.tools.get(&index(&event)).copied();
                        if let (Some(number), Some(arguments)) = (call, text(delta, "partial_json"))
                        {
                            out.push(StreamEvent::ToolCall {
                                index: number,
                                id: None,
                                name: None,
                                arguments,
                            });
                        }
                    }
                    // Signatures and citations: nothing an OpenAI client can take.
                    _ => {}
                }
            }
            "message_delta" => {
                let reason = event.pointer("/delta/stop_reason").and_then(Value::as_str);
                if let Some(reason) = reason {
                    out.push(StreamEvent::Finish(stop_reason(reason)));
                }
                self.add_usage(event.get("usage"), out);
            }
            "message_stop" => self.done = true,
            "error" => {
                let message = event
                    .pointer("/error/message")
                    .and_then(Value::as_str)
                    .map(String::from)
                    .unwrap_or_else(|| event.to_string());
                out.push(StreamEvent::Error(message));
            }
            // `ping`, `content_block_stop`, and event types added later.
            _ => {}
        }
    }
}

impl AnthropicDecoder {
    /// Merges a usage object into what is known and reports the total.
    fn add_usage(&mut self, usage: Option<&Value>, out: &mut Vec<StreamEvent>) {
        let Some(Value::Object(usage)) = usage else {
            return;
        };
        for (key, value) in usage {
            if value.is_u64() {
                self.usage.insert(key.clone(), value.clone());
            }
        }
        out.push(StreamEvent::Usage(parse_usage(&Value::Object(
            self.usage.clone(),
        ))));
    }
}

/// The block index of a content block event.
fn index(event: &Value) -> u64 {
    event.get("index").and_then(Value::as_u64).unwrap_or(0)
}
