//! A Responses stream patched line by line on its way to the client ([`StreamPatcher`]).

use std::collections::HashMap;

use bytes::Bytes;
use serde_json::{json, Map, Value};

use crate::adapter::sse::{data_field, LineBuffer};

/// Patches a Responses stream line by line as it passes:
///
/// - a continuation's response objects (`response.created`, `.in_progress`, `.completed`, ...)
///   echo `previous_response_id`: the request the worker got was expanded without it, and OpenAI
///   echoes it, as the unary answer does;
/// - an event without `sequence_number` gets the next one. Native backends (llama-server) leave
///   it out and the OpenAI SDK's stream helper needs it, as do the relay's own `error` events
///   ended onto a stream. Numbers already present are kept, and the count continues after them;
/// - an event without the `output_index` or `content_index` its type has in OpenAI's schema gets
///   them from the stream's structure (llama-server sends neither, and the SDK's
///   `responses.stream()` helper indexes its snapshot with them): each `response.output_item.added`
///   takes the next output index for its item, each `response.content_part.added` the next
///   content index within its item, and every later event naming the item gets the item's output
///   index and, for content events, the index of the item's latest part. Indices already present
///   are kept, and tracked the same way.
///
/// The checks are substring tests per `data:` line, so events that already carry what they need,
/// such as every delta of the relay's own translations, are never parsed; the events opening an
/// item or a part (one each per item or part, not per token) are, to track their indices. Anything
/// unexpected (not JSON, an item never opened) passes as it is. An unfinished line is held until
/// its end arrives, so a split line is never patched in halves.
#[derive(Debug)]
pub struct StreamPatcher {
    previous: Option<String>,
    lines: LineBuffer,
    next_sequence: u64,
    /// The output items opened so far, by item id.
    items: HashMap<String, ItemPlace>,
    /// The output index the next opened item gets, unless its event says otherwise.
    next_output: u64,
}

/// Where an output item sits in the response, as its stream has shown so far.
#[derive(Debug)]
struct ItemPlace {
    output_index: u64,
    /// The latest content part opened in the item, if any.
    content_index: Option<u64>,
    /// The content index the item's next part gets, unless its event says otherwise.
    next_content: u64,
}

/// The event that opens an output item.
const ITEM_ADDED: &str = "response.output_item.added";
/// The event that closes an output item.
const ITEM_DONE: &str = "response.output_item.done";
/// The event that opens a content part.
const PART_ADDED: &str = "response.content_part.added";
/// The prefixes of the event types that carry a `content_index` in OpenAI's schema.
const CONTENT_EVENTS: [&str; 4] = [
    "response.content_part.",
    "response.output_text.",
    "response.refusal.",
    "response.reasoning_text.",
];

impl StreamPatcher {
    /// A patcher; `previous` is the id a continuation continued (`None`: nothing to echo).
    pub fn new(previous: Option<String>) -> Self {
        StreamPatcher {
            previous,
            lines: LineBuffer::default(),
            next_sequence: 0,
            items: HashMap::new(),
            next_output: 0,
        }
    }

    /// Patches the whole lines `bytes` completes; returns them (possibly nothing).
    pub fn push(&mut self, bytes: &[u8]) -> Bytes {
        let mut lines = std::mem::take(&mut self.lines);
        let mut out = Vec::with_capacity(bytes.len() + 32);
        lines.push_bytes(bytes, |content, ending| {
            self.line(content, ending, &mut out)
        });
        self.lines = lines;
        Bytes::from(out)
    }

    /// The end of the stream: an unfinished last line, patched.
    pub fn finish(&mut self) -> Bytes {
        let mut lines = std::mem::take(&mut self.lines);
        let mut out = Vec::new();
        lines.finish_bytes(|content, ending| self.line(content, ending, &mut out));
        Bytes::from(out)
    }

    /// Appends a line (`content`, then its `ending`), patched when it is event data.
    fn line(&mut self, content: &[u8], ending: &[u8], out: &mut Vec<u8>) {
        let patched = std::str::from_utf8(content)
            .ok()
            .and_then(data_field)
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
        // Cheap tests first: only events that may need a change, or open an item or a part, are
        // parsed, and each of those once.
        let echoes = self.previous.is_some() && data.contains("\"response\"");
        let rewritten = if echoes || wants_indices(data) {
            self.rewrite(data)
        } else {
            None
        };
        let data = rewritten.as_deref().unwrap_or(data);
        if let Some(number) = key_value(data, "sequence_number").and_then(leading_number) {
            self.next_sequence = self.next_sequence.max(number.saturating_add(1));
            return rewritten;
        }
        let number = self.next_sequence;
        self.next_sequence += 1;
        let rest = data[1..].trim_start();
        let separator = if rest.starts_with('}') { "" } else { "," };
        Some(format!("{{\"sequence_number\":{number}{separator}{rest}"))
    }

    /// `data` with the continuation echo and the missing indices added, or `None` when it needs
    /// neither (or is not JSON).
    fn rewrite(&mut self, data: &str) -> Option<String> {
        let mut event: Value = serde_json::from_str(data).ok()?;
        let echoed = self.echo_previous(&mut event);
        let indexed = self.fill_indices(&mut event);
        (echoed || indexed).then(|| event.to_string())
    }

    /// Sets the response object's `previous_response_id`, if that is to be echoed and the
    /// object has none; returns whether it did.
    fn echo_previous(&self, event: &mut Value) -> bool {
        let Some(previous) = self.previous.as_deref() else {
            return false;
        };
        let Some(response) = event.get_mut("response").and_then(Value::as_object_mut) else {
            return false;
        };
        insert_missing(response, "previous_response_id", json!(previous))
    }

    /// Tracks the items and parts `event` opens and fills the indices it lacks; returns whether
    /// it filled any.
    fn fill_indices(&mut self, event: &mut Value) -> bool {
        let Some(event) = event.as_object_mut() else {
            return false;
        };
        let Some(kind) = event.get("type").and_then(Value::as_str).map(str::to_owned) else {
            return false;
        };
        let item_id = match kind.as_str() {
            ITEM_ADDED | ITEM_DONE => event.get("item").and_then(|item| item.get("id")),
            _ => event.get("item_id"),
        };
        let item_id = item_id.and_then(Value::as_str).map(str::to_owned);
        if kind == ITEM_ADDED {
            let index = index_in(event, "output_index").unwrap_or(self.next_output);
            self.next_output = self.next_output.max(index.saturating_add(1));
            if let Some(id) = item_id {
                let place = ItemPlace {
                    output_index: index,
                    content_index: None,
                    next_content: 0,
                };
                self.items.insert(id, place);
            }
            return insert_missing(event, "output_index", json!(index));
        }
        let Some(place) = item_id.and_then(|id| self.items.get_mut(&id)) else {
            return false;
        };
        let mut filled = insert_missing(event, "output_index", json!(place.output_index));
        if kind == PART_ADDED {
            let index = index_in(event, "content_index").unwrap_or(place.next_content);
            place.content_index = Some(index);
            place.next_content = place.next_content.max(index.saturating_add(1));
        }
        if CONTENT_EVENTS.iter().any(|prefix| kind.starts_with(prefix)) {
            // Content with no part opened (llama-server's reasoning deltas) belongs to the
            // item's first part: its finished item holds exactly that one.
            let index = place.content_index.unwrap_or(0);
            filled |= insert_missing(event, "content_index", json!(index));
        }
        filled
    }
}

/// Whether an event may lack an index its type has, or opens an item or a part (whose indices
/// are tracked), judged from its JSON text without parsing it. A false "yes" costs only a parse.
fn wants_indices(data: &str) -> bool {
    let lacks_output = || {
        key_value(data, "output_index").is_none()
            && (key_value(data, "item_id").is_some() || key_value(data, "item").is_some())
    };
    let lacks_content = || {
        key_value(data, "content_index").is_none()
            && CONTENT_EVENTS.iter().any(|prefix| data.contains(prefix))
    };
    lacks_output() || lacks_content() || data.contains(ITEM_ADDED) || data.contains(PART_ADDED)
}

/// Sets `key` when it is missing or null; returns whether it did.
fn insert_missing(object: &mut Map<String, Value>, key: &str, value: Value) -> bool {
    match object.get(key) {
        None | Some(Value::Null) => {
            object.insert(key.to_owned(), value);
            true
        }
        Some(_) => false,
    }
}

/// A present, numeric index.
fn index_in(object: &Map<String, Value>, key: &str) -> Option<u64> {
    object.get(key).and_then(Value::as_u64)
}

/// The JSON text after `"key":` in event JSON text, found without parsing: a key is told from
/// text inside a string value by what surrounds its quotes. Only the objects nested in events
/// (items, parts, responses) could hold the same key; the keys looked for here are not among
/// theirs in OpenAI's schema.
fn key_value<'a>(data: &'a str, key: &str) -> Option<&'a str> {
    data.match_indices(key).find_map(|(at, _)| {
        // A key's opening quote follows `{`, `,` or white space; in a string it follows `\`.
        let before = data[..at].strip_suffix('"')?;
        if !before.ends_with(['{', ',', ' ', '\t', '\n', '\r']) {
            return None;
        }
        data[at + key.len()..]
            .strip_prefix('"')?
            .trim_start()
            .strip_prefix(':')
            .map(str::trim_start)
    })
}

/// The number at the start of `text`.
fn leading_number(text: &str) -> Option<u64> {
    let end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    text[..end].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::serving::completed_event::tests::stream;
    use crate::proxy::serving::completed_event::COMPLETED;

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

    /// The fields OpenAI's schema (and so the SDK's event types) requires of an event of `kind`
    /// that this patcher fills: every event is numbered, events about an output item carry its
    /// `output_index`, and content events also the part's `content_index`.
    fn required_fields(kind: &str, event: &Value) -> Vec<&'static str> {
        let mut fields = vec!["sequence_number"];
        if kind == ITEM_ADDED || kind == ITEM_DONE || event.get("item_id").is_some() {
            fields.push("output_index");
        }
        if CONTENT_EVENTS.iter().any(|prefix| kind.starts_with(prefix)) {
            fields.extend(["item_id", "content_index"]);
        }
        fields
    }

    /// The events of `text` as (type, data), each asserted to have every field its type requires.
    fn complete_events(text: &str) -> Vec<(String, Value)> {
        data_of(text)
            .into_iter()
            .map(|event| {
                let kind = event["type"].as_str().expect("type").to_owned();
                for field in required_fields(&kind, &event) {
                    assert!(event.get(field).is_some(), "{field} missing: {event}");
                }
                (kind, event)
            })
            .collect()
    }

    #[test]
    fn a_real_llama_server_stream_gets_every_field_the_sdk_needs() {
        // Recorded from llama-server (llama.cpp 0.6.0-dev) answering a streamed POST /v1/responses.
        let text = include_str!("../../../tests/fixtures/responses/llama_server_native_stream.sse");
        assert!(
            !text.contains("output_index"),
            "the fixture lacks the indices"
        );
        for cut in [1, 13, text.len()] {
            let events = complete_events(&patch_whole(None, text, cut));
            assert_eq!(events.len(), text.matches("data: ").count());
            for (i, (kind, event)) in events.iter().enumerate() {
                assert_eq!(event["sequence_number"], i, "{event}");
                if kind != "response.created" && kind != "response.in_progress" && kind != COMPLETED
                {
                    assert_eq!(event["output_index"], 0, "{event}");
                }
                if kind.starts_with("response.output_text.") {
                    assert_eq!(event["content_index"], 0, "{event}");
                }
            }
        }
    }

    #[test]
    fn missing_indices_follow_the_items_and_parts_the_stream_opens() {
        let events = [
            json!({"type": "response.created", "response": {"id": "resp_1"}}),
            // A reasoning item with no part opened, as llama-server streams reasoning.
            json!({"type": ITEM_ADDED, "item": {"id": "rs_1", "type": "reasoning"}}),
            json!({"type": "response.reasoning_text.delta", "item_id": "rs_1", "delta": "hm"}),
            // A message with two parts, the second with its indices present.
            json!({"type": ITEM_ADDED, "item": {"id": "msg_1", "type": "message"}}),
            json!({"type": PART_ADDED, "item_id": "msg_1", "part": {"type": "output_text"}}),
            json!({"type": "response.output_text.delta", "item_id": "msg_1", "delta": "a"}),
            json!({"type": PART_ADDED, "item_id": "msg_1", "output_index": 1, "content_index": 4, "part": {"type": "refusal"}}),
            json!({"type": "response.refusal.delta", "item_id": "msg_1", "delta": "no"}),
            // An item whose output index is given: the count continues after it.
            json!({"type": ITEM_ADDED, "output_index": 7, "item": {"id": "fc_1", "type": "function_call"}}),
            json!({"type": ITEM_ADDED, "item": {"id": "fc_2", "type": "function_call"}}),
            json!({"type": "response.function_call_arguments.delta", "item_id": "fc_1", "delta": "{"}),
            json!({"type": ITEM_DONE, "item": {"id": "msg_1", "type": "message"}}),
            json!({"type": "response.output_text.done", "item_id": "msg_1", "text": "a"}),
            // Anything the stream never opened is left alone.
            json!({"type": "response.output_text.delta", "item_id": "msg_x", "delta": "?"}),
            json!({"type": COMPLETED, "response": {"id": "resp_1"}}),
        ];
        let text: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
        let expected = [
            (None, None),
            (Some(0), None),
            (Some(0), Some(0)),
            (Some(1), None),
            (Some(1), Some(0)),
            (Some(1), Some(0)),
            (Some(1), Some(4)),
            (Some(1), Some(4)),
            (Some(7), None),
            (Some(8), None),
            (Some(7), None),
            (Some(1), None),
            (Some(1), Some(4)),
            (None, None),
            (None, None),
        ];
        for cut in [1, 9, text.len()] {
            let out = data_of(&patch_whole(None, &text, cut));
            let got: Vec<_> = out
                .iter()
                .map(|e| (e["output_index"].as_u64(), e["content_index"].as_u64()))
                .collect();
            assert_eq!(got, expected, "pieces of {cut}");
            for (got, sent) in out.iter().zip(&events) {
                let mut got = got.clone();
                for field in ["sequence_number", "output_index", "content_index"] {
                    if sent.get(field).is_none() {
                        got.as_object_mut().unwrap().remove(field);
                    }
                }
                assert_eq!(&got, sent, "nothing else changes");
            }
        }
    }

    #[test]
    fn events_carrying_their_indices_pass_without_being_parsed() {
        let complete = [
            r#"{"type":"response.output_text.delta","item_id":"m","output_index":0,"content_index":0,"delta":"x"}"#,
            r#"{"type":"response.function_call_arguments.delta","item_id":"f","output_index" : 1,"delta":"{"}"#,
            r#"{"type":"response.output_item.done","output_index":1,"item":{"id":"f"}}"#,
            r#"{"type":"response.created","response":{"id":"r","output":[]}}"#,
            // Key names inside text are not keys.
            r#"{"type":"response.function_call_arguments.delta","output_index":0,"delta":"\"item_id\": \"content_index\""}"#,
        ];
        for data in complete {
            assert!(!wants_indices(data), "{data}");
        }
        let wanting = [
            r#"{"type":"response.output_text.delta","item_id":"m","output_index":0,"delta":"x"}"#,
            r#"{"type":"response.function_call_arguments.delta","item_id":"f","delta":"{"}"#,
            r#"{"type":"response.output_item.done","item":{"id":"f"}}"#,
            // Opening events are read to track the indices they carry.
            r#"{"type":"response.output_item.added","output_index":0,"item":{"id":"f"}}"#,
        ];
        for data in wanting {
            assert!(wants_indices(data), "{data}");
        }
        let numbered: String = complete
            .iter()
            .enumerate()
            .map(|(i, data)| {
                format!(
                    "data: {}\n\n",
                    data.replacen('{', &format!("{{\"sequence_number\":{i},"), 1)
                )
            })
            .collect();
        assert_eq!(patch_whole(None, &numbered, 5), numbered, "untouched");
    }
}
