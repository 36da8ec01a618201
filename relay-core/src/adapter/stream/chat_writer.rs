//! Writing an OpenAI chat-completions stream from canonical events, for a chat client served by
//! an upstream that speaks another API (Anthropic).
//!
//! The shape is what OpenAI sends: a first chunk with the assistant role, content / reasoning /
//! tool-call deltas (a call's first fragment names it, later ones carry arguments under the same
//! `index`), a chunk with the `finish_reason`, the usage chunk (empty `choices`) when the client
//! asked for it with `stream_options.include_usage`, and `data: [DONE]`.

use serde_json::{json, Value};

use super::Writer;
use crate::adapter::canonical::{StopReason, StreamEvent, Usage};
use crate::adapter::openai_chat::{finish_reason, settle_stop_reason, usage_object};
use crate::adapter::sse;
use crate::adapter::Identity;

/// State of one chat stream being written.
#[derive(Debug)]
pub(super) struct ChatWriter {
    identity: Identity,
    model: String,
    include_usage: bool,
    started: bool,
    /// The `finish_reason` chunk went out.
    stopped: bool,
    finished: bool,
    saw_tool: bool,
    usage: Usage,
}

impl ChatWriter {
    /// A writer answering the client's `request` under `model` (empty: the upstream's name).
    pub(super) fn new(identity: Identity, model: String, request: &Value) -> Self {
        ChatWriter {
            identity,
            model,
            include_usage: request.pointer("/stream_options/include_usage") == Some(&json!(true)),
            started: false,
            stopped: false,
            finished: false,
            saw_tool: false,
            usage: Usage::default(),
        }
    }

    /// A `chat.completion.chunk` with `choices` as given.
    fn chunk(&self, out: &mut String, choices: Value, usage: Option<Value>) {
        let mut chunk = json!({
            "id": format!("chatcmpl-{}", self.identity.id),
            "object": "chat.completion.chunk",
            "created": self.identity.created,
            "model": self.model,
            "choices": choices,
        });
        if let Some(usage) = usage {
            chunk["usage"] = usage;
        }
        out.push_str(&sse::data(&chunk));
    }

    /// A chunk of choice 0 with `delta` and `finish_reason`.
    fn delta(&self, out: &mut String, delta: Value, finish: Option<&str>) {
        let choice = json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish});
        self.chunk(out, json!([choice]), None);
    }

    fn start(&mut self, out: &mut String) {
        if !self.started {
            self.started = true;
            self.delta(out, json!({"role": "assistant", "content": ""}), None);
        }
    }

    fn stop(&mut self, out: &mut String, reason: Option<StopReason>) {
        if !self.stopped {
            self.stopped = true;
            let reason = settle_stop_reason(reason, self.saw_tool);
            self.delta(out, json!({}), Some(finish_reason(reason)));
        }
    }
}

impl Writer for ChatWriter {
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
                self.delta(out, json!({"content": text}), None);
            }
            StreamEvent::Thinking(text) => {
                self.start(out);
                self.delta(out, json!({"reasoning_content": text}), None);
            }
            StreamEvent::ToolCall {
                index,
                id,
                name,
                arguments,
            } => {
                self.start(out);
                self.saw_tool = true;
                let mut call = json!({"index": index});
                if let Some(id) = id {
                    call["id"] = json!(id);
                    call["type"] = json!("function");
                }
                let mut function = json!({"arguments": arguments});
                if let Some(name) = name {
                    function["name"] = json!(name);
                }
                call["function"] = function;
                self.delta(out, json!({"tool_calls": [call]}), None);
            }
            StreamEvent::Finish(reason) => {
                self.start(out);
                self.stop(out, Some(reason));
            }
            StreamEvent::Usage(usage) => self.usage = usage,
            StreamEvent::Error(message) => {
                // OpenAI's mid-stream error shape; the SDKs raise it as an API error.
                let error = json!({"error": {"message": message, "type": "api_error", "code": "upstream_error"}});
                out.push_str(&sse::data(&error));
                self.finished = true;
            }
        }
    }

    fn finish(&mut self, out: &mut String) {
        if self.finished {
            return;
        }
        self.start(out);
        // A stream cut off before its stop reason ends the turn as it stands.
        self.stop(out, None);
        if self.include_usage {
            self.chunk(out, json!([]), Some(usage_object(&self.usage)));
        }
        out.push_str("data: [DONE]\n\n");
        self.finished = true;
    }
}
