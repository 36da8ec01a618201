//! Property tests: where a mapping is lossless, dialect → canonical → dialect gives back the
//! input. Generators produce each dialect's normalized shapes (the ones the builders write).

use proptest::prelude::*;
use serde_json::{json, Map, Value};

use crate::adapter::{anthropic_messages, openai_chat};

fn text() -> impl Strategy<Value = String> {
    "\\PC{0,24}"
}

fn name() -> impl Strategy<Value = String> {
    "[a-zA-Z_][a-zA-Z0-9_]{0,11}"
}

fn id() -> impl Strategy<Value = String> {
    "[a-z]{4}_[a-zA-Z0-9]{1,10}"
}

/// A float that survives JSON exactly (what a client would type).
fn unit_float() -> impl Strategy<Value = f64> {
    (0u32..=100).prop_map(|n| f64::from(n) / 100.0)
}

/// Tool arguments: an object of simple values (no floats: their text form may not round-trip).
fn arguments() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        any::<i32>().prop_map(Value::from),
        text().prop_map(Value::from),
        any::<bool>().prop_map(Value::from),
        Just(Value::Null),
    ];
    proptest::collection::btree_map("[a-z]{1,6}", leaf, 0..4)
        .prop_map(|m| Value::Object(m.into_iter().collect::<Map<String, Value>>()))
}

fn schema() -> impl Strategy<Value = Value> {
    proptest::collection::btree_map(
        "[a-z]{1,6}",
        prop_oneof![Just("string"), Just("integer")],
        0..3,
    )
    .prop_map(|props| {
        let properties: Map<String, Value> = props
            .into_iter()
            .map(|(k, t)| (k, json!({"type": t})))
            .collect();
        json!({"type": "object", "properties": properties})
    })
}

fn media_type() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("image/png".to_string()),
        Just("image/jpeg".to_string())
    ]
}

fn base64() -> impl Strategy<Value = String> {
    "[A-Za-z0-9+/]{4,16}={0,2}"
}

fn url() -> impl Strategy<Value = String> {
    "https://[a-z]{3,8}\\.example/[a-z]{1,8}\\.png"
}

/// Optional settings: each is present or absent, never `null`.
fn put(map: &mut Map<String, Value>, key: &str, value: Option<Value>) {
    if let Some(value) = value {
        map.insert(key.to_string(), value);
    }
}

// ---- Anthropic Messages ----

fn anthropic_image() -> impl Strategy<Value = Value> {
    prop_oneof![
        (media_type(), base64()).prop_map(|(m, d)| json!({"type": "image", "source": {"type": "base64", "media_type": m, "data": d}})),
        url().prop_map(|u| json!({"type": "image", "source": {"type": "url", "url": u}})),
    ]
}

fn anthropic_text() -> impl Strategy<Value = Value> {
    text().prop_map(|t| json!({"type": "text", "text": t}))
}

fn anthropic_user_block() -> impl Strategy<Value = Value> {
    let result_content =
        proptest::collection::vec(prop_oneof![anthropic_text(), anthropic_image()], 0..3);
    let tool_result = (id(), result_content, any::<bool>()).prop_map(|(id, content, is_error)| {
        let mut block = json!({"type": "tool_result", "tool_use_id": id, "content": content});
        if is_error {
            block["is_error"] = json!(true);
        }
        block
    });
    prop_oneof![3 => anthropic_text(), 1 => anthropic_image(), 2 => tool_result]
}

fn anthropic_assistant_block() -> impl Strategy<Value = Value> {
    let thinking = (text(), proptest::option::of("[A-Za-z0-9]{8}")).prop_map(|(t, sig)| {
        let mut block = json!({"type": "thinking", "thinking": t});
        if let Some(sig) = sig {
            block["signature"] = json!(sig);
        }
        block
    });
    let tool_use = (id(), name(), arguments()).prop_map(
        |(id, name, input)| json!({"type": "tool_use", "id": id, "name": name, "input": input}),
    );
    prop_oneof![3 => anthropic_text(), 1 => thinking, 2 => tool_use]
}

fn anthropic_messages() -> impl Strategy<Value = Vec<Value>> {
    let user = proptest::collection::vec(anthropic_user_block(), 1..4);
    let assistant = proptest::collection::vec(anthropic_assistant_block(), 1..4);
    proptest::collection::vec((user, assistant), 1..4).prop_map(|turns| {
        turns
            .into_iter()
            .flat_map(|(u, a)| {
                [
                    json!({"role": "user", "content": u}),
                    json!({"role": "assistant", "content": a}),
                ]
            })
            .collect()
    })
}

fn anthropic_tool_choice() -> impl Strategy<Value = Value> {
    let kind = prop_oneof![
        Just(json!({"type": "auto"})),
        Just(json!({"type": "any"})),
        Just(json!({"type": "none"})),
        name().prop_map(|n| json!({"type": "tool", "name": n})),
    ];
    (kind, any::<bool>()).prop_map(|(mut choice, no_parallel)| {
        if no_parallel {
            choice["disable_parallel_tool_use"] = json!(true);
        }
        choice
    })
}

prop_compose! {
    fn anthropic_request()(
        model in name(),
        max_tokens in 1u64..200_000,
        system in proptest::option::of(proptest::collection::vec(anthropic_text(), 1..4)),
        messages in anthropic_messages(),
        tools in proptest::collection::vec((name(), proptest::option::of(text()), schema()), 0..3),
        tool_choice in proptest::option::of(anthropic_tool_choice()),
        stop in proptest::option::of(proptest::collection::vec(text(), 1..3)),
        temperature in proptest::option::of(unit_float()),
        top_p in proptest::option::of(unit_float()),
        top_k in proptest::option::of(1u64..200),
        stream in any::<bool>(),
        user in proptest::option::of(id()),
    ) -> Value {
        let mut body = Map::new();
        body.insert("model".into(), json!(model));
        body.insert("max_tokens".into(), json!(max_tokens));
        body.insert("messages".into(), json!(messages));
        put(&mut body, "system", system.map(Value::from));
        if !tools.is_empty() {
            let tools: Vec<Value> = tools.into_iter().map(|(name, description, schema)| {
                let mut tool = json!({"name": name, "input_schema": schema});
                if let Some(d) = description { tool["description"] = json!(d); }
                tool
            }).collect();
            body.insert("tools".into(), json!(tools));
        }
        put(&mut body, "tool_choice", tool_choice);
        put(&mut body, "stop_sequences", stop.map(Value::from));
        put(&mut body, "temperature", temperature.map(Value::from));
        put(&mut body, "top_p", top_p.map(Value::from));
        put(&mut body, "top_k", top_k.map(Value::from));
        put(&mut body, "stream", stream.then_some(json!(true)));
        put(&mut body, "metadata", user.map(|u| json!({"user_id": u})));
        Value::Object(body)
    }
}

// ---- OpenAI Chat ----

fn chat_user_content() -> impl Strategy<Value = Value> {
    let part = prop_oneof![
        text().prop_map(|t| json!({"type": "text", "text": t})),
        prop_oneof![
            (media_type(), base64()).prop_map(|(m, d)| format!("data:{m};base64,{d}")),
            url(),
        ]
        .prop_map(|u| json!({"type": "image_url", "image_url": {"url": u}})),
    ];
    prop_oneof![
        text().prop_map(Value::from),
        // A lone text part is written back as a plain string, so it is not generated.
        proptest::collection::vec(part, 1..4)
            .prop_filter("lone text part", |parts| !(parts.len() == 1
                && parts[0]["type"] == "text"))
            .prop_map(Value::from),
    ]
}

fn chat_assistant() -> impl Strategy<Value = Value> {
    let call = (id(), name(), arguments()).prop_map(|(id, name, args)| {
        json!({"id": id, "type": "function", "function": {"name": name, "arguments": args.to_string()}})
    });
    (
        proptest::option::of(text()),
        proptest::option::of(text()),
        proptest::collection::vec(call, 0..3),
    )
        .prop_map(|(content, reasoning, calls)| {
            let mut message = json!({"role": "assistant", "content": content});
            if let Some(r) = reasoning {
                message["reasoning_content"] = json!(r);
            }
            if !calls.is_empty() {
                message["tool_calls"] = json!(calls);
            }
            message
        })
}

fn chat_message() -> impl Strategy<Value = Value> {
    prop_oneof![
        1 => text().prop_map(|t| json!({"role": "system", "content": t})),
        3 => chat_user_content().prop_map(|c| json!({"role": "user", "content": c})),
        3 => chat_assistant(),
        2 => (id(), text()).prop_map(|(id, t)| json!({"role": "tool", "tool_call_id": id, "content": t})),
    ]
}

fn chat_tool_choice() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!("auto")),
        Just(json!("none")),
        Just(json!("required")),
        name().prop_map(|n| json!({"type": "function", "function": {"name": n}})),
    ]
}

prop_compose! {
    fn chat_request()(
        model in name(),
        messages in proptest::collection::vec(chat_message(), 1..8),
        tools in proptest::collection::vec((name(), proptest::option::of(text()), schema()), 0..3),
        tool_choice in proptest::option::of(chat_tool_choice()),
        parallel in proptest::option::of(any::<bool>()),
        stop in proptest::option::of(proptest::collection::vec(text(), 1..3)),
        max_tokens in proptest::option::of(1u64..100_000),
        temperature in proptest::option::of(unit_float()),
        top_p in proptest::option::of(unit_float()),
        top_k in proptest::option::of(1u64..200),
        stream in any::<bool>(),
        user in proptest::option::of(id()),
    ) -> Value {
        let mut body = Map::new();
        body.insert("model".into(), json!(model));
        body.insert("messages".into(), json!(messages));
        if !tools.is_empty() {
            let tools: Vec<Value> = tools.into_iter().map(|(name, description, schema)| {
                let mut function = json!({"name": name, "parameters": schema});
                if let Some(d) = description { function["description"] = json!(d); }
                json!({"type": "function", "function": function})
            }).collect();
            body.insert("tools".into(), json!(tools));
        }
        put(&mut body, "tool_choice", tool_choice);
        put(&mut body, "parallel_tool_calls", parallel.map(Value::from));
        put(&mut body, "stop", stop.map(Value::from));
        put(&mut body, "max_tokens", max_tokens.map(Value::from));
        put(&mut body, "temperature", temperature.map(Value::from));
        put(&mut body, "top_p", top_p.map(Value::from));
        put(&mut body, "top_k", top_k.map(Value::from));
        put(&mut body, "stream", stream.then_some(json!(true)));
        put(&mut body, "user", user.map(Value::from));
        Value::Object(body)
    }
}

prop_compose! {
    fn chat_response()(
        message in chat_assistant(),
        finish in prop_oneof![Just("stop"), Just("length"), Just("tool_calls"), Just("content_filter")],
        id in id(),
        model in name(),
        created in 0u64..2_000_000_000,
        prompt in 0u64..100_000,
        completion in 0u64..100_000,
        cached in 0u64..100,
        reasoning in 0u64..100,
    ) -> Value {
        // A backend that says `stop` after tool calls is reported as `tool_calls`.
        let finish = if finish == "stop" && message.get("tool_calls").is_some() { "tool_calls" } else { finish };
        let mut usage = json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion});
        if cached > 0 { usage["prompt_tokens_details"] = json!({"cached_tokens": cached}); }
        if reasoning > 0 { usage["completion_tokens_details"] = json!({"reasoning_tokens": reasoning}); }
        json!({
            "id": id, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": usage,
        })
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn anthropic_requests_survive_the_canonical_form(body in anthropic_request()) {
        let canonical = anthropic_messages::parse_request(&body).expect("valid request");
        prop_assert_eq!(anthropic_messages::build_request(&canonical), body);
    }

    #[test]
    fn chat_requests_survive_the_canonical_form(body in chat_request()) {
        let canonical = openai_chat::parse_request(&body).expect("valid request");
        prop_assert_eq!(openai_chat::build_request(&canonical), body);
    }

    #[test]
    fn chat_responses_survive_the_canonical_form(body in chat_response()) {
        let canonical = openai_chat::parse_response(&body).expect("valid response");
        prop_assert_eq!(openai_chat::build_response(&canonical), body);
    }

    /// Anthropic → canonical → chat → canonical keeps the conversation's meaning: the chat form
    /// is what backends get, so nothing the model needs may be lost on the way.
    #[test]
    fn anthropic_conversations_reach_the_backend_intact(body in anthropic_request()) {
        let canonical = anthropic_messages::parse_request(&body).expect("valid request");
        let chat = openai_chat::build_request(&canonical);
        let back = openai_chat::parse_request(&chat).expect("chat request parses");
        prop_assert_eq!(&back.model, &canonical.model);
        prop_assert_eq!(back.tools.len(), canonical.tools.len());
        let calls = |r: &crate::adapter::canonical::Request| -> Vec<String> {
            r.messages.iter().flat_map(|m| &m.content).filter_map(|p| match p {
                crate::adapter::canonical::Part::ToolCall(c) => Some(format!("{}:{}:{}", c.id, c.name, c.arguments)),
                crate::adapter::canonical::Part::ToolResult(r) => Some(format!("result:{}", r.call_id)),
                _ => None,
            }).collect()
        };
        prop_assert_eq!(calls(&back), calls(&canonical));
    }
}
