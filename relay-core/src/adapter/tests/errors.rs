//! Bad input: every rejection names the exact field, so the client gets a precise 400; and
//! fields the backend has no use for are dropped, never rejected.

use serde_json::{json, Value};

use super::identity;
use crate::adapter::openai_responses::{expand_with_history, StoredConversation};
use crate::adapter::{from_chat_response_with, openai_chat, to_chat_request, ClientApi};

fn anthropic(messages: Value) -> Value {
    json!({"model": "m", "max_tokens": 10, "messages": messages})
}

fn responses(input: Value) -> Value {
    json!({"model": "m", "input": input})
}

#[test]
fn anthropic_rejections_name_the_field() {
    let user = |content: Value| json!({"role": "user", "content": content});
    let cases = [
        (
            anthropic(json!([
                user(json!("hi")),
                {"role": "assistant", "content": "hello"},
                user(json!([{"type": "audio", "source": {"type": "base64", "data": "AAAA"}}])),
            ])),
            "messages[2].content[0].type: audio is not supported",
        ),
        (
            anthropic(json!([user(
                json!([{"type": "image", "source": {"type": "file", "file_id": "f_1"}}])
            )])),
            "messages[0].content[0].source.type: file is not supported",
        ),
        (
            anthropic(json!([user(json!([
                {"type": "text", "text": "read this"},
                {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}},
            ]))])),
            "messages[0].content[1].source.type: documents with a base64 source are not supported",
        ),
        (
            anthropic(json!([
                user(json!("hi")),
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "x", "input": {}}]},
                user(json!([{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "search_result", "title": "x"}]}])),
            ])),
            "messages[2].content[0].content[0].type: search_result is not supported",
        ),
        (
            anthropic(
                json!([user(json!("hi")), {"role": "assistant", "content": [{"type": "tool_use", "name": "x", "input": {}}]}]),
            ),
            "messages[1].content[0].id: is required",
        ),
        (
            anthropic(
                json!([user(json!("hi")), {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "x", "input": "{}"}]}]),
            ),
            "messages[1].content[0].input: expected a JSON object",
        ),
        (
            anthropic(json!([user(json!([{"text": "no type"}]))])),
            "messages[0].content[0].type: is required",
        ),
        (
            anthropic(json!([{"role": "tool", "content": "x"}])),
            "messages[0].role: tool is not supported",
        ),
        (
            anthropic(json!([{"role": "user"}])),
            "messages[0].content: is required",
        ),
        (
            json!({"model": "m", "max_tokens": 10}),
            "messages: is required",
        ),
        (
            json!({"model": "m", "messages": {"role": "user"}}),
            "messages: expected an array",
        ),
        (
            json!({"model": "m", "max_tokens": "lots", "messages": []}),
            "max_tokens: expected a non-negative integer",
        ),
        (
            json!({"model": "m", "system": [{"type": "text", "text": "a"}, {"type": "image", "source": {}}], "messages": []}),
            "system[1].type: image is not supported",
        ),
        (
            json!({"model": "m", "messages": [], "tool_choice": {"type": "sometimes"}}),
            "tool_choice.type: sometimes is not supported",
        ),
        (
            json!({"model": "m", "messages": [], "temperature": "hot"}),
            "temperature: expected a number",
        ),
        (
            json!(["not", "an", "object"]),
            "body: expected a JSON object",
        ),
    ];
    for (body, expected) in cases {
        let error = to_chat_request(ClientApi::AnthropicMessages, &body).unwrap_err();
        assert_eq!(error.to_string(), expected);
    }
}

#[test]
fn responses_rejections_name_the_field() {
    let cases = [
        (
            responses(json!([{"role": "user", "content": [
                {"type": "input_text", "text": "listen"},
                {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
            ]}])),
            "input[0].content[1].type: input_audio is not supported",
        ),
        (
            responses(json!([{"role": "user", "content": [{"type": "input_file", "file_id": "file_1"}]}])),
            "input[0].content[0].type: input_file is not supported",
        ),
        (
            responses(json!([{"role": "user", "content": [{"type": "input_image", "file_id": "file_1"}]}])),
            "input[0].content[0].image_url: is required (uploaded file references are not supported)",
        ),
        (
            responses(json!([{"role": "user", "content": "hi"}, {"type": "item_reference", "id": "msg_1"}])),
            "input[1].type: item_reference is not supported",
        ),
        (
            responses(json!([{"role": "tool", "content": "x"}])),
            "input[0].role: tool is not supported",
        ),
        (
            responses(json!([{"type": "function_call_output", "output": "x"}])),
            "input[0].call_id: is required",
        ),
        (
            json!({"model": "m", "input": "hi", "tool_choice": {"type": "file_search"}}),
            "tool_choice.type: file_search is not supported",
        ),
        (
            json!({"model": "m", "input": "hi", "instructions": 7}),
            "instructions: expected a string",
        ),
        (
            json!({"model": "m", "input": 7}),
            "input: expected an array",
        ),
        (
            json!({"model": "m", "input": "hi", "previous_response_id": "resp_1"}),
            "previous_response_id: stored conversations are not available on this route; send the whole conversation in `input`",
        ),
    ];
    for (body, expected) in cases {
        let error = to_chat_request(ClientApi::OpenAiResponses, &body).unwrap_err();
        assert_eq!(error.to_string(), expected);
    }
}

#[test]
fn chat_rejections_name_the_field() {
    let cases = [
        (
            json!({"model": "m", "messages": [{"role": "user", "content": [
                {"type": "text", "text": "hi"},
                {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
            ]}]}),
            "messages[0].content[1].type: input_audio is not supported",
        ),
        (
            json!({"model": "m", "messages": [{"role": "function", "name": "f", "content": "x"}]}),
            "messages[0].role: function is not supported",
        ),
        (
            json!({"model": "m", "messages": [], "tools": [{"type": "custom", "custom": {"name": "x"}}]}),
            "tools[0].type: custom is not supported",
        ),
    ];
    for (body, expected) in cases {
        let error = openai_chat::parse_request(&body).unwrap_err();
        assert_eq!(error.to_string(), expected);
    }
}

#[test]
fn a_backend_answer_that_is_not_a_chat_completion_is_named() {
    let request = json!({"model": "m", "messages": []});
    for (answer, expected) in [
        (json!({"object": "error"}), "choices: is required"),
        (
            json!({"choices": []}),
            "choices: expected at least one choice",
        ),
        (
            json!({"choices": [{"message": {"role": "assistant", "content": 5}}]}),
            "choices[0].message.content: expected an array",
        ),
    ] {
        for api in [ClientApi::AnthropicMessages, ClientApi::OpenAiResponses] {
            let error = from_chat_response_with(api, &request, &answer, &identity()).unwrap_err();
            assert_eq!(error.to_string(), expected);
        }
    }
}

#[test]
fn fields_a_backend_has_no_use_for_are_dropped_not_rejected() {
    let body = json!({
        "model": "claude-x",
        "max_tokens": 10,
        "thinking": {"type": "enabled", "budget_tokens": 5},
        "output_config": {"effort": "low"},
        "context_management": {"edits": []},
        "metadata": {"user_id": "u", "other": 1},
        "service_tier": "auto",
        "some_future_field": {"nested": true},
        "system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}, "citations": []}
        ]}],
        "tools": [{"name": "t", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}, "defer_loading": true}]
    });
    let chat = to_chat_request(ClientApi::AnthropicMessages, &body).unwrap();
    assert_eq!(
        chat,
        json!({
            "model": "claude-x",
            "max_tokens": 10,
            "user": "u",
            "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "t", "parameters": {"type": "object"}}}]
        })
    );
}

#[test]
fn a_continued_response_appends_its_input_to_the_stored_conversation() {
    let first = json!({"model": "m", "instructions": "Be brief.", "input": "What is 2+2?"});
    let first_canonical = crate::adapter::openai_responses::parse_request(&first).unwrap();
    let answer = openai_chat::parse_response(&json!({
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "4"}}]
    }))
    .unwrap();
    let stored = StoredConversation::from_exchange(&first_canonical, &answer);
    let second = json!({"model": "m", "previous_response_id": "resp_x", "input": "And 3+3?", "stream": true});
    let expanded = expand_with_history(&stored, &second).unwrap();
    assert_eq!(
        crate::adapter::chat_request_for(&expanded),
        json!({
            "model": "m",
            "stream": true,
            "stream_options": {"include_usage": true},
            // Instructions are not carried over to a continuation, as with OpenAI.
            "messages": [
                {"role": "user", "content": "What is 2+2?"},
                {"role": "assistant", "content": "4"},
                {"role": "user", "content": "And 3+3?"}
            ]
        })
    );
}

#[test]
fn paths_choose_the_client_api() {
    for (path, api) in [
        ("/v1/chat/completions", Some(ClientApi::OpenAiChat)),
        ("/v1/messages", Some(ClientApi::AnthropicMessages)),
        ("/v1/messages?beta=true", Some(ClientApi::AnthropicMessages)),
        ("/v1/responses", Some(ClientApi::OpenAiResponses)),
        ("/v1/responses/", Some(ClientApi::OpenAiResponses)),
        ("/v1/messages/count_tokens", None),
        ("/v1/responses/resp_123", None),
        ("/v1/completions", None),
        ("/v1/embeddings", None),
        ("/v1/models", None),
    ] {
        assert_eq!(
            ClientApi::of(crate::endpoint::Endpoint::of(path)),
            api,
            "{path}"
        );
    }
}
