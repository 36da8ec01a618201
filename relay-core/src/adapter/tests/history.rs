//! What a response store keeps and sends back: a conversation rendered as Responses input items
//! reads back as the same conversation, and an answer's output items join it.

use serde_json::json;

use crate::adapter::canonical::{Image, Message, Part, Role, Thinking, ToolCall, ToolResult};
use crate::adapter::openai_responses::{
    expand_with_history, input_items, output_messages, parse_request, StoredConversation,
};

fn message(role: Role, content: Vec<Part>) -> Message {
    Message { role, content }
}

#[test]
fn input_items_read_back_as_the_same_conversation() {
    let conversation = vec![
        message(Role::System, vec![Part::Text("be brief".into())]),
        message(
            Role::User,
            vec![
                Part::Text("what is this?".into()),
                Part::Image(Image::Base64 {
                    media_type: "image/png".into(),
                    data: "iVBOR".into(),
                }),
            ],
        ),
        message(
            Role::Assistant,
            vec![
                Part::Thinking(Thinking {
                    text: "look closer".into(),
                    signature: None,
                }),
                Part::Text("let me check".into()),
                Part::ToolCall(ToolCall {
                    id: "call_1".into(),
                    name: "zoom".into(),
                    arguments: r#"{"x":1}"#.into(),
                }),
                Part::ToolCall(ToolCall {
                    id: "call_2".into(),
                    name: "zoom".into(),
                    arguments: r#"{"x":2}"#.into(),
                }),
            ],
        ),
        message(
            Role::User,
            vec![
                Part::ToolResult(ToolResult {
                    call_id: "call_1".into(),
                    content: vec![Part::Text("a cat".into())],
                    is_error: false,
                }),
                Part::ToolResult(ToolResult {
                    call_id: "call_2".into(),
                    content: vec![
                        Part::Text("a hat".into()),
                        Part::Image(Image::Url("http://x/h.png".into())),
                    ],
                    is_error: false,
                }),
            ],
        ),
        message(Role::Assistant, vec![Part::Text("a cat in a hat".into())]),
    ];
    let body = json!({"model": "m", "input": input_items(&conversation)});
    assert_eq!(parse_request(&body).unwrap().messages, conversation);
}

#[test]
fn a_continuation_is_the_stored_conversation_then_the_new_input() {
    let answer = json!({"id": "resp_1", "output": [
        {"id": "rs_1", "type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "hmm"}]},
        {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "Paris", "annotations": []}]},
        {"id": "ws_1", "type": "web_search_call", "status": "completed"},
    ]});
    let first = parse_request(&json!({"model": "m", "input": "capital of France?"})).unwrap();
    let mut messages = first.messages.clone();
    messages.extend(output_messages(&answer).unwrap());
    let stored = StoredConversation { messages };
    assert_eq!(stored.messages.len(), 2);
    assert_eq!(
        stored.messages[1].content,
        vec![
            Part::Thinking(Thinking {
                text: "hmm".into(),
                signature: None
            }),
            Part::Text("Paris".into())
        ]
    );
    let next = expand_with_history(
        &stored,
        &json!({"model": "m", "previous_response_id": "resp_1", "input": "and Italy?"}),
    )
    .unwrap();
    let texts: Vec<Role> = next.messages.iter().map(|m| m.role).collect();
    assert_eq!(texts, [Role::User, Role::Assistant, Role::User]);
    let resent = json!({"model": "m", "input": input_items(&next.messages)});
    assert_eq!(parse_request(&resent).unwrap().messages, next.messages);
}

#[test]
fn output_messages_name_the_field_of_a_malformed_answer() {
    let error =
        output_messages(&json!({"output": [{"type": "function_call", "name": "f"}]})).unwrap_err();
    assert_eq!(error.to_string(), "output[0].call_id: is required");
}
