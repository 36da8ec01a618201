//! OpenAI clients served by an Anthropic upstream: recorded Messages streams
//! (`anthropic_streams/<name>.sse`) → expected chat and Responses streams
//! (`<name>.chat.sse`, `<name>.responses.sse`), the invariants those clients depend on, and the
//! stream's answer agreeing with the complete one.

use serde_json::{json, Value};

use super::streams::{check_chat, check_responses};
use super::{by_char, check_recorded_streams, events, fixtures, identity, translate_pieces, Event};
use crate::adapter::canonical::Usage;
use crate::adapter::{
    from_backend_response_with, to_backend_request, BackendApi, ClientApi, Identity,
    StreamTranslator,
};

const APIS: [(ClientApi, &str); 2] = [
    (ClientApi::OpenAiChat, "chat"),
    (ClientApi::OpenAiResponses, "responses"),
];

/// The client request each transcript answers.
fn request(api: ClientApi) -> Value {
    match api {
        ClientApi::OpenAiResponses => json!({
            "model": "claude-sonnet-4-5", "input": "Weather?", "stream": true,
            "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
        }),
        _ => json!({
            "model": "claude-sonnet-4-5", "stream": true,
            "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": "Weather?"}]
        }),
    }
}

/// The client's SSE text for `pieces` of the upstream's stream.
fn translate<'a>(api: ClientApi, pieces: impl IntoIterator<Item = &'a str>) -> String {
    let backend = BackendApi::AnthropicMessages;
    let translator =
        StreamTranslator::for_backend_with_identity(backend, api, &request(api), identity());
    translate_pieces(translator, pieces)
}

#[test]
fn recorded_anthropic_streams_translate_to_the_expected_openai_events() {
    check_recorded_streams(
        "anthropic_streams",
        5,
        &APIS,
        |api, pieces| translate(api, pieces.iter().copied()),
        |api, events, case| match api {
            ClientApi::OpenAiResponses => check_responses(events, case),
            _ => check_translated_chat(events, case),
        },
    );
}

/// A chat stream the relay wrote: chunks of one id, object and model, the role first, exactly
/// one `finish_reason`, then the usage chunk (asked for) and `[DONE]` — or an `error` object
/// last. Each tool call's fragments join to a JSON object under one index.
fn check_translated_chat(events: &[Event], case: &str) {
    let failed = events
        .last()
        .is_some_and(|(_, data)| data.get("error").is_some());
    if !failed {
        check_chat(events, case);
    }
    let chunks: Vec<&Value> = events
        .iter()
        .map(|(_, data)| data)
        .filter(|data| data.get("choices").is_some())
        .collect();
    let first = chunks.first().expect("chunks");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant", "{case}");
    let id = first["id"].as_str().expect("id");
    assert!(id.starts_with("chatcmpl-"), "{case}: {id}");
    for chunk in &chunks {
        assert_eq!(chunk["id"], json!(id), "{case}");
        assert_eq!(chunk["object"], "chat.completion.chunk", "{case}");
        assert_eq!(chunk["model"], "claude-sonnet-4-5", "{case}");
    }
    let finishes = chunks
        .iter()
        .filter(|c| !c["choices"][0]["finish_reason"].is_null())
        .count();
    let mut calls: Vec<String> = Vec::new();
    for chunk in &chunks {
        for call in chunk["choices"][0]["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let index = call["index"].as_u64().expect("index") as usize;
            if index == calls.len() {
                assert!(
                    call["id"].is_string(),
                    "{case}: a call's first fragment names it"
                );
                calls.push(String::new());
            }
            calls[index].push_str(call["function"]["arguments"].as_str().unwrap_or_default());
        }
    }
    if failed {
        assert_eq!(finishes, 0, "{case}");
        return;
    }
    assert_eq!(finishes, 1, "{case}");
    for arguments in calls {
        let parsed: Value = serde_json::from_str(&arguments).expect("whole arguments");
        assert!(parsed.is_object(), "{case}: {arguments}");
    }
    let usage = &events[events.len() - 2].1;
    assert_eq!(
        usage["choices"],
        json!([]),
        "{case}: usage chunk before [DONE]"
    );
    assert!(usage["usage"]["total_tokens"].is_u64(), "{case}");
}

#[test]
fn anthropic_usage_is_reported_with_cached_tokens_counted_as_input() {
    let input =
        std::fs::read_to_string(fixtures("anthropic_streams").join("thinking_and_tools.sse"))
            .expect("transcript");
    for (api, name) in APIS {
        let backend = BackendApi::AnthropicMessages;
        let mut translator = StreamTranslator::for_backend_with_identity(
            backend,
            api,
            &request(api),
            Identity::minted(0),
        );
        translator.push(&input);
        assert_eq!(
            translator.usage(),
            Some(Usage {
                input_tokens: 320,
                output_tokens: 57,
                cache_creation_tokens: 20,
                ..Usage::default()
            }),
            "{name}"
        );
    }
}

/// The complete Messages answer the `thinking_and_tools` transcript streams.
fn thinking_and_tools_as_one_answer() -> Value {
    json!({
        "id": "msg_01B", "type": "message", "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
        "content": [
            {"type": "thinking", "thinking": "Two cities, two calls.", "signature": "EqQBCkYIBxgCKkA"},
            {"type": "text", "text": "I'll check both."},
            {"type": "tool_use", "id": "toolu_01P", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_01R", "name": "get_weather", "input": {"city": "Rome"}}
        ],
        "stop_reason": "tool_use", "stop_sequence": null,
        "usage": {"input_tokens": 300, "cache_creation_input_tokens": 20, "cache_read_input_tokens": 0, "output_tokens": 57}
    })
}

#[test]
fn a_streamed_answer_from_anthropic_ends_like_the_complete_one() {
    let input =
        std::fs::read_to_string(fixtures("anthropic_streams").join("thinking_and_tools.sse"))
            .expect("transcript");
    let api = ClientApi::OpenAiResponses;
    let backend = BackendApi::AnthropicMessages;
    let streamed = events(&translate(api, [input.as_str()]));
    let mut completed = streamed.last().expect("events").1["response"].clone();
    let whole = thinking_and_tools_as_one_answer();
    let complete =
        from_backend_response_with(backend, api, &request(api), &whole, &identity()).unwrap();
    // The argument text differs only in spacing: the stream passes the upstream's text on,
    // the complete answer's input object is serialized anew.
    for item in completed["output"].as_array_mut().expect("output") {
        if let Some(arguments) = item["arguments"].as_str() {
            let value: Value = serde_json::from_str(arguments).expect("JSON");
            item["arguments"] = json!(value.to_string());
        }
    }
    assert_eq!(completed, complete);
    // A chat client gets the same calls either way.
    let chat = from_backend_response_with(
        backend,
        ClientApi::OpenAiChat,
        &request(ClientApi::OpenAiChat),
        &whole,
        &identity(),
    )
    .unwrap();
    let message = &chat["choices"][0]["message"];
    assert_eq!(chat["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(message["content"], "I'll check both.");
    assert_eq!(message["reasoning_content"], "Two cities, two calls.");
    assert_eq!(message["tool_calls"][1]["id"], "toolu_01R");
    assert_eq!(
        chat["model"], "claude-sonnet-4-5",
        "the name the client asked for"
    );
    assert_eq!(chat["usage"]["prompt_tokens"], 320);
}

#[test]
fn requests_for_an_anthropic_upstream_leave_out_what_anthropic_refuses() {
    let chat = json!({
        "model": "claude-sonnet-4-5",
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "", "reasoning_content": "unsigned",
             "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": ""},
            {"role": "assistant", "content": ""}
        ]
    });
    let sent = to_backend_request(BackendApi::AnthropicMessages, ClientApi::OpenAiChat, &chat)
        .expect("translated");
    assert_eq!(sent["max_tokens"], 4096, "Anthropic requires a limit");
    assert_eq!(
        sent["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": []}]}
        ]),
        "no empty text, no unsigned thinking, no empty turn"
    );
    let messages = json!({"model": "m", "max_tokens": 1, "messages": []});
    assert_eq!(
        to_backend_request(
            BackendApi::AnthropicMessages,
            ClientApi::AnthropicMessages,
            &messages
        )
        .unwrap(),
        messages,
        "the upstream's own dialect is passed through"
    );
}

#[test]
fn an_answer_that_is_not_a_message_is_an_error_naming_the_field() {
    let not_a_message = json!({"type": "error", "error": {"type": "api_error", "message": "x"}});
    let error = from_backend_response_with(
        BackendApi::AnthropicMessages,
        ClientApi::OpenAiChat,
        &request(ClientApi::OpenAiChat),
        &not_a_message,
        &identity(),
    )
    .unwrap_err();
    assert_eq!(error.path, "content");
}

#[test]
fn an_anthropic_stream_for_an_anthropic_client_is_passed_through_verbatim() {
    let input = std::fs::read_to_string(fixtures("anthropic_streams").join("text.sse"))
        .expect("transcript");
    let backend = BackendApi::AnthropicMessages;
    let api = ClientApi::AnthropicMessages;
    let mut translator = StreamTranslator::for_backend_with_identity(
        backend,
        api,
        &json!({"model": "m"}),
        Identity::minted(0),
    );
    let out: String = by_char(&input)
        .into_iter()
        .map(|p| translator.push(p))
        .collect();
    assert_eq!(out + &translator.finish(), input);
    assert!(translator.response().is_none());
}
