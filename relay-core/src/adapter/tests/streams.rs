//! Recorded backend streams (`streams/<name>.sse`, chat-completions SSE as llama-server and
//! Ollama emit it) → expected client streams (`streams/<name>.<api>.sse`), fed whole and one
//! character at a time, plus the ordering invariants clients depend on, checked by code.

use proptest::prelude::*;
use serde_json::{json, Value};

use super::{check_recorded_streams, events, files, fixtures, identity, translate_pieces, Event};
use crate::adapter::canonical::Usage;
use crate::adapter::openai_responses::{build_response, StoredConversation};
use crate::adapter::{openai_chat, ClientApi, Identity, StreamTranslator};

const APIS: [(ClientApi, &str); 3] = [
    (ClientApi::OpenAiChat, "chat"),
    (ClientApi::AnthropicMessages, "anthropic"),
    (ClientApi::OpenAiResponses, "responses"),
];

/// The client request each transcript answers.
fn request(api: ClientApi) -> Value {
    match api {
        ClientApi::OpenAiChat => json!({
            "model": "qwen3", "stream": true, "messages": [{"role": "user", "content": "Hi"}]
        }),
        ClientApi::AnthropicMessages => json!({
            "model": "claude-opus-5-5", "max_tokens": 1024, "stream": true,
            "messages": [{"role": "user", "content": "Hi"}]
        }),
        ClientApi::OpenAiResponses => json!({
            "model": "gpt-5-mini", "input": "Hi", "stream": true,
            "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
        }),
    }
}

/// The client's SSE text for `pieces` of backend text.
fn translate<'a>(api: ClientApi, pieces: impl IntoIterator<Item = &'a str>) -> String {
    let translator = StreamTranslator::with_identity(api, &request(api), identity());
    translate_pieces(translator, pieces)
}

#[test]
fn recorded_streams_translate_to_the_expected_events() {
    check_recorded_streams(
        "streams",
        10,
        &APIS,
        |api, pieces| translate(api, pieces.iter().copied()),
        check_invariants,
    );
}

fn check_invariants(api: ClientApi, events: &[Event], case: &str) {
    match api {
        ClientApi::OpenAiChat => check_chat(events, case),
        ClientApi::AnthropicMessages => check_anthropic(events, case),
        ClientApi::OpenAiResponses => check_responses(events, case),
    }
}

/// One `[DONE]`, last; everything before it is a JSON object.
pub(super) fn check_chat(events: &[Event], case: &str) {
    let (last, rest) = events.split_last().expect("events");
    assert_eq!(last.1, json!("[DONE]"), "{case}: must end with [DONE]");
    for (_, data) in rest {
        assert!(data.is_object(), "{case}: non-JSON event {data}");
    }
}

/// `message_start` (full usage) first; blocks 0, 1, 2, ... each started, given deltas of its own
/// kind and stopped before the next starts; `message_delta` then `message_stop` last — or an
/// `error` event ends it. A tool block's `input_json_delta`s join to its whole arguments.
fn check_anthropic(events: &[Event], case: &str) {
    for (name, data) in events {
        assert_eq!(
            name.as_deref(),
            data["type"].as_str(),
            "{case}: event name and type differ"
        );
    }
    let kinds: Vec<&str> = events.iter().filter_map(|(n, _)| n.as_deref()).collect();
    if kinds.last() == Some(&"error") {
        assert!(!kinds.contains(&"message_stop"), "{case}");
    } else {
        assert_eq!(kinds.first(), Some(&"message_start"), "{case}");
        let usage = &events[0].1["message"]["usage"];
        for field in [
            "input_tokens",
            "output_tokens",
            "cache_creation_input_tokens",
            "cache_read_input_tokens",
        ] {
            assert!(usage[field].is_u64(), "{case}: message_start usage.{field}");
        }
        assert_eq!(
            kinds[kinds.len() - 2..],
            ["message_delta", "message_stop"],
            "{case}"
        );
        assert_eq!(kinds.iter().filter(|k| **k == "message_start").count(), 1);
    }
    let mut next = 0;
    let mut open: Option<(u64, String)> = None;
    let mut json_buf = String::new();
    for (name, data) in events {
        match name.as_deref() {
            Some("content_block_start") => {
                assert!(
                    open.is_none(),
                    "{case}: block started while another is open"
                );
                assert_eq!(
                    data["index"],
                    json!(next),
                    "{case}: indices must be contiguous"
                );
                let kind = data["content_block"]["type"].as_str().expect("type");
                open = Some((next, kind.to_string()));
                json_buf.clear();
                next += 1;
            }
            Some("content_block_delta") => {
                let (index, kind) = open.as_ref().expect("delta outside a block");
                assert_eq!(
                    data["index"],
                    json!(index),
                    "{case}: delta for another block"
                );
                let expected = match kind.as_str() {
                    "text" => "text_delta",
                    "thinking" => "thinking_delta",
                    _ => "input_json_delta",
                };
                assert_eq!(data["delta"]["type"], json!(expected), "{case}");
                if let Some(part) = data["delta"]["partial_json"].as_str() {
                    json_buf.push_str(part);
                }
            }
            Some("content_block_stop") => {
                let (index, kind) = open.take().expect("stop without a block");
                assert_eq!(
                    data["index"],
                    json!(index),
                    "{case}: stopped the wrong block"
                );
                if kind == "tool_use" && !case.starts_with("malformed") {
                    let parsed: Result<Value, _> = serde_json::from_str(&json_buf);
                    assert!(
                        matches!(parsed, Ok(Value::Object(_))),
                        "{case}: tool input {json_buf:?} lost fragments"
                    );
                }
            }
            Some("message_delta") | Some("message_stop") => {
                assert!(open.is_none(), "{case}: message ended inside a block");
            }
            _ => {}
        }
    }
}

/// `sequence_number` 0, 1, 2, ...; created → in_progress first and a terminal event last;
/// output items added at contiguous `output_index`es, each done before the next is added; every
/// item event names the open item, every content event has `content_index`; deltas add up to
/// the done texts, and the final response lists exactly the done items.
pub(super) fn check_responses(events: &[Event], case: &str) {
    for (i, (name, data)) in events.iter().enumerate() {
        assert_eq!(data["sequence_number"], json!(i), "{case}: sequence_number");
        assert_eq!(name.as_deref(), data["type"].as_str(), "{case}");
    }
    let kinds: Vec<&str> = events.iter().filter_map(|(n, _)| n.as_deref()).collect();
    assert_eq!(
        kinds[..2],
        ["response.created", "response.in_progress"],
        "{case}"
    );
    let last = *kinds.last().expect("events");
    assert!(
        matches!(
            last,
            "response.completed" | "response.incomplete" | "response.failed"
        ),
        "{case}: ends with {last}"
    );
    let mut open: Option<(u64, String)> = None;
    let mut added = 0u64;
    let mut done_items = Vec::new();
    let mut text = String::new();
    for (name, data) in events {
        let name = name.as_deref().unwrap_or_default();
        match name {
            "response.output_item.added" => {
                assert!(open.is_none(), "{case}: item added while another is open");
                assert_eq!(data["output_index"], json!(added), "{case}");
                let id = data["item"]["id"].as_str().expect("item id").to_string();
                open = Some((added, id));
                text.clear();
                added += 1;
            }
            "response.output_item.done" => {
                let (index, id) = open.take().expect("done without an item");
                assert_eq!(data["output_index"], json!(index), "{case}");
                assert_eq!(data["item"]["id"], json!(id), "{case}");
                done_items.push(data["item"].clone());
            }
            _ if name.starts_with("response.output_text")
                || name.starts_with("response.content_part")
                || name.starts_with("response.reasoning_text")
                || name.starts_with("response.function_call_arguments") =>
            {
                let (index, id) = open.as_ref().expect("item event outside an item");
                assert_eq!(data["output_index"], json!(index), "{case}: {name}");
                assert_eq!(data["item_id"], json!(id), "{case}: {name}");
                if !name.starts_with("response.function_call_arguments") {
                    assert_eq!(data["content_index"], json!(0), "{case}: {name}");
                }
                if name.ends_with(".delta") {
                    text.push_str(data["delta"].as_str().expect("delta"));
                }
                if name.ends_with("text.done") {
                    assert_eq!(data["text"], json!(text), "{case}: deltas vs done");
                }
                if name.ends_with("arguments.done") {
                    assert_eq!(data["arguments"], json!(text), "{case}: deltas vs done");
                }
            }
            _ => {}
        }
    }
    assert!(open.is_none(), "{case}: an item was left open");
    if last != "response.failed" {
        let final_output = &events.last().expect("events").1["response"]["output"];
        assert_eq!(final_output, &json!(done_items), "{case}: final output");
    }
}

#[test]
fn usage_is_reported_for_every_dialect() {
    let input = std::fs::read_to_string(fixtures("streams").join("tool_calls_parallel.sse"))
        .expect("transcript");
    for (api, name) in APIS {
        let mut translator = StreamTranslator::with_identity(api, &request(api), identity());
        translator.push(&input);
        assert_eq!(
            translator.usage(),
            Some(Usage {
                input_tokens: 200,
                output_tokens: 30,
                cache_read_tokens: 150,
                ..Usage::default()
            }),
            "{name}"
        );
    }
}

/// The complete chat answer the `tool_calls_parallel` transcript streams.
fn tool_calls_parallel_as_one_answer() -> Value {
    json!({
        "id": "chatcmpl-s1", "created": 1760000000, "model": "qwen3",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant",
            "content": "I'll check both cities.",
            "tool_calls": [
                {"id": "call_p", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
                {"id": "call_r", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}
            ]
        }}],
        "usage": {"prompt_tokens": 200, "completion_tokens": 30, "total_tokens": 230, "prompt_tokens_details": {"cached_tokens": 150}}
    })
}

#[test]
fn a_streamed_responses_answer_ends_with_the_same_object_as_a_complete_one() {
    let input = std::fs::read_to_string(fixtures("streams").join("tool_calls_parallel.sse"))
        .expect("transcript");
    let api = ClientApi::OpenAiResponses;
    let mut translator = StreamTranslator::with_identity(api, &request(api), identity());
    assert!(translator.response().is_none());
    let out = translator.push(&input);
    let completed = events(&out).pop().expect("events").1;
    let complete = openai_chat::parse_response(&tool_calls_parallel_as_one_answer()).unwrap();
    assert_eq!(
        completed["response"],
        build_response(&request(api), &complete, &identity())
    );
    // And a store keeps the same conversation either way.
    let asked = crate::adapter::openai_responses::parse_request(&request(api)).unwrap();
    let streamed = translator.response().expect("finished");
    assert_eq!(
        StoredConversation::from_exchange(&asked, streamed),
        StoredConversation::from_exchange(&asked, &complete)
    );
}

#[test]
fn other_dialects_have_no_canonical_answer_and_a_failed_stream_has_none_either() {
    let text = std::fs::read_to_string(fixtures("streams").join("text.sse")).expect("text");
    let api = ClientApi::AnthropicMessages;
    let mut translator = StreamTranslator::with_identity(api, &request(api), identity());
    translator.push(&text);
    assert!(translator.response().is_none());
    let error = std::fs::read_to_string(fixtures("streams").join("backend_error.sse")).unwrap();
    let api = ClientApi::OpenAiResponses;
    let mut translator = StreamTranslator::with_identity(api, &request(api), identity());
    translator.push(&error);
    translator.finish();
    assert!(translator.response().is_none());
}

#[test]
fn fresh_translators_mint_distinct_ids() {
    let api = ClientApi::AnthropicMessages;
    let start = |_| {
        let mut t = StreamTranslator::with_identity(api, &request(api), Identity::minted(0));
        events(&t.push("data: {\"choices\":[]}\n\n"))[0].1["message"]["id"].clone()
    };
    let (a, b) = (start(0), start(1));
    assert!(a.as_str().is_some_and(|id| id.starts_with("msg_")));
    assert_ne!(a, b);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// However the backend's text is cut, the client sees the same events.
    #[test]
    fn any_cutting_of_a_stream_gives_the_same_events(
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..40)
    ) {
        let input = std::fs::read_to_string(
            fixtures("streams").join("tool_calls_parallel.sse"),
        ).expect("transcript");
        let boundaries: Vec<usize> = input.char_indices().map(|(i, _)| i).collect();
        let mut points: Vec<usize> = cuts.iter().map(|c| boundaries[c.index(boundaries.len())]).collect();
        points.push(0);
        points.push(input.len());
        points.sort_unstable();
        points.dedup();
        let pieces: Vec<&str> = points.windows(2).map(|w| &input[w[0]..w[1]]).collect();
        for (api, _) in APIS {
            prop_assert_eq!(events(&translate(api, pieces.iter().copied())), events(&translate(api, [input.as_str()])));
        }
    }
}

/// `data:` lines for chat chunks with the given deltas.
fn chunks(deltas: &[Value]) -> String {
    deltas
        .iter()
        .map(|delta| {
            let chunk = json!({"id": "c", "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": null}]});
            format!("data: {chunk}\n\n")
        })
        .collect()
}

#[test]
fn each_piece_is_translated_as_soon_as_it_arrives() {
    let first = chunks(&[json!({"role": "assistant"}), json!({"content": "Hel"})]);
    for (api, expected) in [
        (ClientApi::OpenAiChat, "\"Hel\""),
        (ClientApi::AnthropicMessages, "\"text_delta\""),
        (ClientApi::OpenAiResponses, "\"response.output_text.delta\""),
    ] {
        let mut translator = StreamTranslator::with_identity(api, &request(api), identity());
        let out = translator.push(&first);
        assert!(out.contains(expected), "{api:?}: {out}");
        assert!(out.contains("Hel"), "{api:?}: {out}");
        // Half an event yields nothing yet, and the rest completes it.
        let next = chunks(&[json!({"content": "lo"})]);
        let (a, b) = next.split_at(next.len() / 2);
        assert_eq!(translator.push(a), "", "{api:?}");
        assert!(translator.push(b).contains("lo"), "{api:?}");
    }
}

#[test]
fn text_between_tool_calls_gets_blocks_of_its_own_in_order() {
    let input = chunks(&[
        json!({"content": "a"}),
        json!({"tool_calls": [{"index": 0, "id": "c0", "function": {"name": "f", "arguments": "{}"}}]}),
        json!({"content": "b"}),
        json!({"tool_calls": [{"index": 1, "id": "c1", "function": {"name": "g", "arguments": "{}"}}]}),
    ]);
    for (api, name) in APIS {
        let out = translate(api, [input.as_str()]);
        check_invariants(api, &events(&out), name);
    }
    let api = ClientApi::AnthropicMessages;
    let starts: Vec<String> = events(&translate(api, [input.as_str()]))
        .into_iter()
        .filter(|(n, _)| n.as_deref() == Some("content_block_start"))
        .map(|(_, d)| {
            d["content_block"]["type"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    assert_eq!(starts, ["text", "tool_use", "text", "tool_use"]);
}

/// Backends stream tool calls one after another; should one send a fragment of a call whose
/// block is already stopped, it is dropped rather than opening a second block for the same call.
#[test]
fn a_late_fragment_of_a_finished_tool_call_never_reopens_it() {
    let input = chunks(&[
        json!({"tool_calls": [{"index": 0, "id": "c0", "function": {"name": "f", "arguments": "{\"a\":1}"}}]}),
        json!({"tool_calls": [{"index": 1, "id": "c1", "function": {"name": "g", "arguments": "{}"}}]}),
        json!({"tool_calls": [{"index": 0, "function": {"arguments": " "}}]}),
    ]);
    for (api, name) in APIS {
        let out = events(&translate(api, [input.as_str()]));
        check_invariants(api, &out, name);
        let opened = out
            .iter()
            .filter(|(n, d)| match n.as_deref() {
                Some("content_block_start") => d["content_block"]["type"] == "tool_use",
                Some("response.output_item.added") => d["item"]["type"] == "function_call",
                _ => false,
            })
            .count();
        let expected = if api == ClientApi::OpenAiChat { 0 } else { 2 };
        assert_eq!(opened, expected, "{name}");
    }
}

/// The fields the official OpenAI Python SDK's models require of each Responses stream event
/// (`openai/types/responses/response_*_event.py`, the ones without a default).
fn sdk_required_fields(kind: &str) -> Option<&'static [&'static str]> {
    let fields: &[&str] = match kind {
        "response.created"
        | "response.in_progress"
        | "response.completed"
        | "response.incomplete"
        | "response.failed" => &["response"],
        "response.output_item.added" | "response.output_item.done" => &["item", "output_index"],
        "response.content_part.added" | "response.content_part.done" => {
            &["content_index", "item_id", "output_index", "part"]
        }
        "response.output_text.delta" => &[
            "content_index",
            "delta",
            "item_id",
            "logprobs",
            "output_index",
        ],
        "response.output_text.done" => &[
            "content_index",
            "item_id",
            "logprobs",
            "output_index",
            "text",
        ],
        "response.reasoning_text.delta" => &["content_index", "delta", "item_id", "output_index"],
        "response.reasoning_text.done" => &["content_index", "item_id", "output_index", "text"],
        "response.function_call_arguments.delta" => &["delta", "item_id", "output_index"],
        "response.function_call_arguments.done" => &["arguments", "item_id", "output_index"],
        "error" => &["message"],
        _ => return None,
    };
    Some(fields)
}

#[test]
fn every_translated_responses_event_has_the_fields_the_openai_sdk_requires() {
    let mut checked = 0;
    for dir in ["streams", "anthropic_streams"] {
        for (name, path) in files(&fixtures(dir), ".responses.sse") {
            let text = std::fs::read_to_string(&path).expect("expected stream");
            for (_, data) in events(&text) {
                let kind = data["type"].as_str().expect("type");
                let required = sdk_required_fields(kind)
                    .unwrap_or_else(|| panic!("{dir}/{name}: {kind} is not an event we checked"));
                for field in required.iter().chain(&["sequence_number", "type"]) {
                    assert!(
                        !data[*field].is_null(),
                        "{dir}/{name}: {kind} lacks {field}: {data}"
                    );
                }
                checked += 1;
            }
        }
    }
    assert!(checked > 100, "only {checked} events checked");
}
