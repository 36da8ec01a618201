//! Writing an OpenAI Responses event stream from canonical events.
//!
//! Every event carries `sequence_number` (strictly increasing); item events carry
//! `output_index`, content events also `content_index` — the OpenAI SDK's stream helper indexes
//! its snapshot by them. Each output item goes `output_item.added` → (`content_part.added` →
//! deltas → `*.done` → `content_part.done`) → `output_item.done` before the next is added.

use std::fmt::Write as _;

use serde_json::{json, Value};

use super::Writer;
use crate::adapter::canonical::{Part, Response, StopReason, StreamEvent, Thinking, ToolCall};
use crate::adapter::openai_responses::{
    build_response, envelope, item_id, output_item, output_text, status,
};
use crate::adapter::sse;
use crate::adapter::Identity;

/// The kind of the output item that is open (always the last one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Item {
    Message,
    Reasoning,
    /// A function call, by the backend's call index.
    Call(u64),
}

impl Item {
    /// The item id prefix OpenAI uses for this kind.
    fn prefix(self) -> &'static str {
        match self {
            Item::Message => "msg",
            Item::Reasoning => "rs",
            Item::Call(_) => "fc",
        }
    }
}

/// The per-token events, written by [`ResponsesWriter::emit_delta`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Delta {
    /// `response.output_text.delta`: with `content_index` and `logprobs`.
    Text,
    /// `response.reasoning_text.delta`: with `content_index`.
    Reasoning,
    /// `response.function_call_arguments.delta`: the item's, no content part.
    Arguments,
}

impl Delta {
    fn kind(self) -> &'static str {
        match self {
            Delta::Text => "response.output_text.delta",
            Delta::Reasoning => "response.reasoning_text.delta",
            Delta::Arguments => "response.function_call_arguments.delta",
        }
    }
}

/// State of one Responses stream being written. The output is also accumulated, because
/// `*.done` events and `response.completed` repeat it whole.
#[derive(Debug)]
pub(super) struct ResponsesWriter {
    identity: Identity,
    request: Value,
    sequence: u64,
    started: bool,
    finished: bool,
    response: Response,
    open: Option<Item>,
    closed_calls: Vec<u64>,
    stop: Option<StopReason>,
    saw_tool: bool,
    /// Ended with `response.completed`/`response.incomplete` (not `response.failed`).
    completed: bool,
}

impl ResponsesWriter {
    /// A writer answering the client's `request` body (echoed in the response object).
    pub(super) fn new(identity: Identity, request: Value) -> Self {
        ResponsesWriter {
            identity,
            request,
            sequence: 0,
            started: false,
            finished: false,
            response: Response::default(),
            open: None,
            closed_calls: Vec::new(),
            stop: None,
            saw_tool: false,
            completed: false,
        }
    }

    fn emit(&mut self, out: &mut String, kind: &str, mut data: Value) {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        out.push_str(&sse::event(kind, &data));
    }

    /// A delta event for the open item, written directly: byte for byte what [`Self::emit`]
    /// makes of the same fields (serde_json orders keys; test), without building a `Value` per
    /// token — a translated token cost twice a passed-through one that way (round-2 profile,
    /// BENCHMARKS.md).
    fn emit_delta(&mut self, out: &mut String, delta: Delta, text: &str) {
        let index = self.index();
        let kind = delta.kind();
        out.push_str("event: ");
        out.push_str(kind);
        out.push_str("\ndata: {");
        if delta != Delta::Arguments {
            out.push_str("\"content_index\":0,");
        }
        out.push_str("\"delta\":");
        sse::push_json_string(out, text);
        out.push_str(",\"item_id\":");
        let prefix = self.open.map_or("msg", Item::prefix);
        sse::push_json_string(out, &item_id(prefix, &self.identity, index));
        if delta == Delta::Text {
            out.push_str(",\"logprobs\":[]");
        }
        // Writing into a String cannot fail.
        let _ = write!(
            out,
            ",\"output_index\":{index},\"sequence_number\":{},\"type\":\"{kind}\"}}\n\n",
            self.sequence
        );
        self.sequence += 1;
    }

    fn start(&mut self, out: &mut String) {
        if self.started {
            return;
        }
        self.started = true;
        let response = envelope(&self.request, &self.identity, &self.response.model);
        self.emit(out, "response.created", json!({"response": response}));
        self.emit(out, "response.in_progress", json!({"response": response}));
    }

    /// The output index of the open item.
    fn index(&self) -> usize {
        self.response.content.len() - 1
    }

    /// Adds `part` as a new output item, closing the open one first.
    fn open(&mut self, item: Item, part: Part, out: &mut String) {
        self.close(out);
        self.response.content.push(part);
        let index = self.index();
        let part = &self.response.content[index];
        let mut added = output_item(part, index, &self.identity, "in_progress").unwrap_or_default();
        if !matches!(item, Item::Call(_)) {
            // Content parts are announced separately, so the item starts without them.
            added["content"] = json!([]);
        }
        self.open = Some(item);
        self.emit(
            out,
            "response.output_item.added",
            json!({"output_index": index, "item": added}),
        );
        let content_part = match item {
            Item::Message => Some(output_text("")),
            Item::Reasoning => Some(json!({"type": "reasoning_text", "text": ""})),
            Item::Call(_) => None,
        };
        if let Some(content_part) = content_part {
            let data = self.content_event(json!({"part": content_part}));
            self.emit(out, "response.content_part.added", data);
        }
    }

    /// `data` plus the item id, output index and content index of the open item's content part.
    fn content_event(&self, mut data: Value) -> Value {
        data["content_index"] = json!(0);
        self.item_event(data)
    }

    /// `data` plus the item id and output index of the open item.
    fn item_event(&self, mut data: Value) -> Value {
        let index = self.index();
        // Only called while an item is open.
        let prefix = self.open.map_or("msg", Item::prefix);
        data["item_id"] = json!(item_id(prefix, &self.identity, index));
        data["output_index"] = json!(index);
        data
    }

    fn close(&mut self, out: &mut String) {
        let Some(item) = self.open else { return };
        let index = self.index();
        match (&self.response.content[index], item) {
            (Part::Text(text), Item::Message) => {
                let text = text.clone();
                let data = self.content_event(json!({"text": text, "logprobs": []}));
                self.emit(out, "response.output_text.done", data);
                let data = self.content_event(json!({"part": output_text(&text)}));
                self.emit(out, "response.content_part.done", data);
            }
            (Part::Thinking(thinking), Item::Reasoning) => {
                let text = thinking.text.clone();
                let data = self.content_event(json!({"text": text}));
                self.emit(out, "response.reasoning_text.done", data);
                let part = json!({"type": "reasoning_text", "text": text});
                let data = self.content_event(json!({"part": part}));
                self.emit(out, "response.content_part.done", data);
            }
            (Part::ToolCall(call), Item::Call(backend_index)) => {
                self.closed_calls.push(backend_index);
                let data = json!({"name": call.name, "arguments": call.arguments});
                let data = self.item_event(data);
                self.emit(out, "response.function_call_arguments.done", data);
            }
            _ => {}
        }
        let done = output_item(
            &self.response.content[index],
            index,
            &self.identity,
            "completed",
        )
        .unwrap_or_default();
        self.emit(
            out,
            "response.output_item.done",
            json!({"output_index": index, "item": done}),
        );
        self.open = None;
    }
}

impl Writer for ResponsesWriter {
    fn event(&mut self, event: StreamEvent, out: &mut String) {
        if self.finished {
            return;
        }
        match event {
            StreamEvent::Start { model } => {
                self.response.model = model.unwrap_or_default();
                self.start(out);
            }
            StreamEvent::Text(text) => {
                self.start(out);
                if self.open != Some(Item::Message) {
                    self.open(Item::Message, Part::Text(String::new()), out);
                }
                if let Some(Part::Text(all)) = self.response.content.last_mut() {
                    all.push_str(&text);
                }
                self.emit_delta(out, Delta::Text, &text);
            }
            StreamEvent::Thinking(text) => {
                self.start(out);
                if self.open != Some(Item::Reasoning) {
                    let part = Part::Thinking(Thinking {
                        text: String::new(),
                        signature: None,
                    });
                    self.open(Item::Reasoning, part, out);
                }
                if let Some(Part::Thinking(all)) = self.response.content.last_mut() {
                    all.text.push_str(&text);
                }
                self.emit_delta(out, Delta::Reasoning, &text);
            }
            StreamEvent::ToolCall {
                index,
                id,
                name,
                arguments,
            } => {
                self.start(out);
                self.saw_tool = true;
                if self.open != Some(Item::Call(index)) {
                    if self.closed_calls.contains(&index) {
                        // See the Anthropic writer: a late fragment of a finished call has no
                        // place; backends stream calls one after another.
                        return;
                    }
                    let next = self.response.content.len();
                    let call = ToolCall {
                        id: id.unwrap_or_else(|| format!("call_{}_{next}", self.identity.id)),
                        name: name.unwrap_or_default(),
                        arguments: String::new(),
                    };
                    self.open(Item::Call(index), Part::ToolCall(call), out);
                }
                if !arguments.is_empty() {
                    if let Some(Part::ToolCall(call)) = self.response.content.last_mut() {
                        call.arguments.push_str(&arguments);
                    }
                    self.emit_delta(out, Delta::Arguments, &arguments);
                }
            }
            StreamEvent::Finish(reason) => self.stop = Some(reason),
            StreamEvent::Usage(usage) => self.response.usage = usage,
            StreamEvent::Error(message) => {
                self.start(out);
                // Items end before the response does, so a client's snapshot is never left with
                // an open item; the failed response lists what was produced.
                self.close(out);
                let mut failed = build_response(&self.request, &self.response, &self.identity);
                failed["status"] = json!("failed");
                failed["incomplete_details"] = Value::Null;
                failed["error"] = json!({"code": "server_error", "message": message});
                self.emit(out, "response.failed", json!({"response": failed}));
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
        self.response.stop_reason = self.stop.unwrap_or(if self.saw_tool {
            StopReason::ToolUse
        } else {
            StopReason::EndTurn
        });
        let final_response = build_response(&self.request, &self.response, &self.identity);
        let kind = match status(self.response.stop_reason).0 {
            "completed" => "response.completed",
            _ => "response.incomplete",
        };
        self.emit(out, kind, json!({"response": final_response}));
        self.finished = true;
        self.completed = true;
    }

    fn response(&self) -> Option<&Response> {
        self.completed.then_some(&self.response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The event `emit_delta` replaced, built the generic way.
    fn generic(writer: &mut ResponsesWriter, delta: Delta, text: &str) -> String {
        let data = match delta {
            Delta::Text => writer.content_event(json!({"delta": text, "logprobs": []})),
            Delta::Reasoning => writer.content_event(json!({"delta": text})),
            Delta::Arguments => writer.item_event(json!({"delta": text})),
        };
        let mut out = String::new();
        writer.emit(&mut out, delta.kind(), data);
        out
    }

    #[test]
    fn deltas_written_directly_are_the_bytes_of_the_generic_events() {
        let cases = [
            (Item::Message, Part::Text(String::new()), Delta::Text),
            (
                Item::Reasoning,
                Part::Thinking(Thinking {
                    text: String::new(),
                    signature: None,
                }),
                Delta::Reasoning,
            ),
            (
                Item::Call(0),
                Part::ToolCall(ToolCall {
                    id: "call_1".into(),
                    name: "f".into(),
                    arguments: String::new(),
                }),
                Delta::Arguments,
            ),
        ];
        for (item, part, delta) in cases {
            let mut writer = ResponsesWriter::new(Identity::minted(0), json!({"model": "m"}));
            let mut ignored = String::new();
            writer.start(&mut ignored);
            writer.open(item, part, &mut ignored);
            for text in ["Hello", "\"quoted\"\n\u{1}\\ 🦀", ""] {
                let sequence = writer.sequence;
                let expected = generic(&mut writer, delta, text);
                writer.sequence = sequence;
                let mut direct = String::new();
                writer.emit_delta(&mut direct, delta, text);
                assert_eq!(direct, expected);
                assert_eq!(writer.sequence, sequence + 1);
            }
        }
    }
}
