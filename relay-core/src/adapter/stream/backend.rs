//! Decoding the backend's chat-completions stream into canonical [`StreamEvent`]s.

use serde::Deserialize;
use serde_json::value::RawValue;
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
        if self.plain(data, out) {
            return;
        }
        // A chunk that is not JSON carries nothing usable; skipping it keeps the stream alive.
        let Ok(chunk) = serde_json::from_str::<Value>(data) else {
            return;
        };
        self.decode_value(&chunk, out);
    }
}

/// The common chunk of a chat stream (text, reasoning, finish, usage), read without building a
/// `Value` tree: the few strings it needs as `String`s, every other member skipped unstored.
/// Anything else — an error, tool calls, a member of an unexpected type, a duplicate member —
/// fails this shape and goes the general way, which handles every chunk.
#[derive(Deserialize)]
struct PlainChunk<'a> {
    #[serde(default)]
    model: Option<String>,
    #[serde(borrow, default)]
    choices: Option<Vec<PlainChoice<'a>>>,
    #[serde(borrow, default)]
    usage: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct PlainChoice<'a> {
    #[serde(default)]
    index: Option<u64>,
    #[serde(borrow, default)]
    delta: Option<PlainDelta<'a>>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct PlainDelta<'a> {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
    #[serde(default)]
    reasoning: Option<String>,
    #[serde(borrow, default)]
    tool_calls: Option<&'a RawValue>,
}

impl ChatDecoder {
    /// Decodes `data` when it is a [`PlainChunk`] — the same events the general way makes of it
    /// (test) — and says whether it was one. Each streamed token is such a chunk; parsing it
    /// into a `Value` was most of what a translated token cost the worker (round-2 profile,
    /// BENCHMARKS.md).
    fn plain(&mut self, data: &str, out: &mut Vec<StreamEvent>) -> bool {
        // A derived struct also reads a JSON array, field by position: only objects qualify.
        if !data.trim_start().starts_with('{') {
            return false;
        }
        let Ok(chunk) = serde_json::from_str::<PlainChunk>(data) else {
            return false;
        };
        let has_tool_calls = |choice: &PlainChoice| {
            choice
                .delta
                .as_ref()
                .is_some_and(|delta| delta.tool_calls.is_some())
        };
        let choices = chunk.choices.unwrap_or_default();
        if chunk.error.is_some() || choices.iter().any(has_tool_calls) {
            return false;
        }
        let usage = match chunk.usage {
            None => None,
            Some(raw) => match serde_json::from_str::<Value>(raw.get()) {
                Ok(usage) => Some(usage).filter(Value::is_object),
                Err(_) => return false,
            },
        };
        if !self.started {
            self.started = true;
            out.push(StreamEvent::Start { model: chunk.model });
        }
        if let Some(choice) = choices.into_iter().find(|c| c.index.unwrap_or(0) == 0) {
            let text = |piece: Option<String>| piece.filter(|text| !text.is_empty());
            if let Some(delta) = choice.delta {
                let reasoning = text(delta.reasoning_content).or_else(|| text(delta.reasoning));
                if let Some(reasoning) = reasoning {
                    out.push(StreamEvent::Thinking(reasoning));
                }
                if let Some(content) = text(delta.content) {
                    out.push(StreamEvent::Text(content));
                }
            }
            if let Some(reason) = choice.finish_reason.as_deref() {
                let reason = settle_stop_reason(Some(stop_reason(reason)), self.saw_tool_calls);
                out.push(StreamEvent::Finish(reason));
            }
        }
        if let Some(usage) = usage {
            out.push(StreamEvent::Usage(parse_usage(&usage)));
        }
        true
    }

    /// Decodes any chunk, parsed.
    fn decode_value(&mut self, chunk: &Value, out: &mut Vec<StreamEvent>) {
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
        if let Some(choice) = first_choice(chunk) {
            self.choice(choice, out);
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            out.push(StreamEvent::Usage(parse_usage(usage)));
        }
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    /// The events the general way makes of `data`, with the plain shape bypassed.
    fn general(data: &str) -> Vec<StreamEvent> {
        let mut decoder = ChatDecoder::default();
        let mut out = Vec::new();
        if let Ok(chunk) = serde_json::from_str::<Value>(data) {
            decoder.decode_value(&chunk, &mut out);
        }
        out
    }

    #[test]
    fn plain_chunks_decode_to_the_events_of_the_general_way() {
        let chunks = [
            r#"{"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"Hi \"there\"\n"},"logprobs":null,"finish_reason":null}]}"#,
            r#"{"model":"m","choices":[{"delta":{"reasoning_content":"hmm","content":""}}]}"#,
            r#"{"choices":[{"index":1,"delta":{"content":"other"}},{"index":0,"delta":{"reasoning":"r"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":5}}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8}}"#,
            r#"{"choices":[{"index":0,"delta":{"content":null},"finish_reason":"stop"}],"usage":null}"#,
            r#"{"model":null,"choices":null}"#,
            r#"{}"#,
        ];
        for data in chunks {
            let mut decoder = ChatDecoder::default();
            let mut fast = Vec::new();
            assert!(decoder.plain(data, &mut fast), "{data}");
            assert_eq!(fast, general(data), "{data}");
        }
    }

    #[test]
    fn chunks_of_another_shape_are_left_to_the_general_way() {
        for data in [
            r#"{"error":{"message":"boom"}}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"f"}}]}}]}"#,
            r#"{"model":7,"choices":[]}"#,
            r#"{"choices":[{"index":-1,"delta":{"content":"x"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":1}}]}"#,
            r#"{"choices":{"index":0}}"#,
            r#"{"model":"a","model":"b"}"#,
            r#"{"usage":{"prompt_tokens":1"#,
            r#"["m", [{"index": 0, "delta": {"content": "x"}}]]"#,
            "not json",
        ] {
            let mut decoder = ChatDecoder::default();
            let mut out = Vec::new();
            assert!(!decoder.plain(data, &mut out), "{data}");
            assert!(out.is_empty() && !decoder.started, "{data}");
        }
    }
}
