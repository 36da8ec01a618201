//! Decoding the backend's chat-completions stream into canonical [`StreamEvent`]s.

use serde_json::Value;

use super::Decoder;
use crate::adapter::canonical::StreamEvent;
use crate::adapter::openai_chat::{parse_usage, settle_stop_reason, stop_reason};
use crate::adapter::sse::EventReader;

/// Turns chat-completions SSE text into canonical events, one event's worth at a time.
#[derive(Debug, Default)]
pub(super) struct ChatDecoder {
    reader: EventReader,
    started: bool,
    done: bool,
    saw_tool_calls: bool,
}

impl Decoder for ChatDecoder {
    fn reader(&mut self) -> &mut EventReader {
        &mut self.reader
    }

    /// `data: [DONE]` arrived.
    fn is_done(&self) -> bool {
        self.done
    }

    fn data(&mut self, data: &str, out: &mut Vec<StreamEvent>) {
        if data.trim() == "[DONE]" {
            self.done = true;
            return;
        }
        // A chunk that is not JSON carries nothing usable; skipping it keeps the stream alive.
        let Ok(chunk) = serde_json::from_str::<Value>(data) else {
            return;
        };
        if let Some(error) = chunk.get("error").filter(|e| !e.is_null()) {
            let message = match error.get("message").and_then(Value::as_str) {
                Some(message) => message.to_string(),
                None => error.to_string(),
            };
            out.push(StreamEvent::Error(message));
            return;
        }
        if !self.started {
            self.started = true;
            let model = chunk.get("model").and_then(Value::as_str).map(String::from);
            out.push(StreamEvent::Start { model });
        }
        if let Some(choice) = first_choice(&chunk) {
            self.choice(choice, out);
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            out.push(StreamEvent::Usage(parse_usage(usage)));
        }
    }
}

impl ChatDecoder {
    fn choice(&mut self, choice: &Value, out: &mut Vec<StreamEvent>) {
        let text = |key: &str| {
            choice
                .get("delta")
                .and_then(|d| d.get(key))
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(String::from)
        };
        // vLLM and llama-server say `reasoning_content`, Ollama and newer vLLM `reasoning`; a
        // server that sends both sends the same text twice.
        if let Some(reasoning) = text("reasoning_content").or_else(|| text("reasoning")) {
            out.push(StreamEvent::Thinking(reasoning));
        }
        if let Some(content) = text("content") {
            out.push(StreamEvent::Text(content));
        }
        let calls = choice
            .get("delta")
            .and_then(|d| d.get("tool_calls"))
            .and_then(Value::as_array);
        for (position, call) in calls.into_iter().flatten().enumerate() {
            self.saw_tool_calls = true;
            let function = call.get("function");
            let string = |v: Option<&Value>| {
                v.and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .map(String::from)
            };
            let arguments = match function.and_then(|f| f.get("arguments")) {
                Some(Value::String(text)) => text.clone(),
                None | Some(Value::Null) => String::new(),
                // Some servers send the arguments as an object in one piece.
                Some(other) => other.to_string(),
            };
            out.push(StreamEvent::ToolCall {
                // Servers that send each call whole sometimes leave out `index`.
                index: call
                    .get("index")
                    .and_then(Value::as_u64)
                    .unwrap_or(position as u64),
                id: string(call.get("id")),
                name: string(function.and_then(|f| f.get("name"))),
                arguments,
            });
        }
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            let reason = settle_stop_reason(Some(stop_reason(reason)), self.saw_tool_calls);
            out.push(StreamEvent::Finish(reason));
        }
    }
}

/// Choice 0: the relay asks for one answer; a server sending several (`n` > 1) gets the first.
fn first_choice(chunk: &Value) -> Option<&Value> {
    let choices = chunk.get("choices")?.as_array()?;
    choices
        .iter()
        .find(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0) == 0)
}
