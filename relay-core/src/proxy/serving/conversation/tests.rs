//! The key a request gets: same conversation, same key; anything else, another (or none).

use crate::proxy::serving::conversation::*;
use axum::http::HeaderValue;
use serde_json::json;

fn key_with(headers: &HeaderMap, body: &serde_json::Value) -> Option<u64> {
    let text = body.to_string();
    let fields: BodyFields<'_> = serde_json::from_str(&text).expect("parses");
    affinity_key(headers, &fields)
}

fn key(body: serde_json::Value) -> Option<u64> {
    key_with(&HeaderMap::new(), &body)
}

fn system_prompt() -> String {
    "You are a careful assistant. ".repeat(300)
}

fn chat(turns: &[&str]) -> serde_json::Value {
    let mut messages = vec![json!({"role": "system", "content": system_prompt()})];
    for (i, text) in turns.iter().enumerate() {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        messages.push(json!({"role": role, "content": text}));
    }
    json!({"model": "m", "messages": messages, "stream": true})
}

#[test]
fn every_turn_of_a_chat_conversation_gets_the_key_of_its_first_turn() {
    let first = key(chat(&["plan a trip"])).expect("a key");
    assert_eq!(key(chat(&["plan a trip", "sure", "to Rome"])), Some(first));
    assert_eq!(
        key(chat(&["plan a trip", "sure", "to Rome", "ok", "in May"])),
        Some(first)
    );
}

#[test]
fn conversations_sharing_a_system_prompt_but_not_their_first_message_get_different_keys() {
    assert_ne!(key(chat(&["plan a trip"])), key(chat(&["write a poem"])));
}

#[test]
fn the_tools_are_part_of_the_prefix_and_the_model_is_not() {
    // An alias may rename the model between turns.
    let mut other_model = chat(&["hi"]);
    other_model["model"] = json!("n");
    assert_eq!(key(other_model), key(chat(&["hi"])));
    let mut with_tools = chat(&["hi"]);
    with_tools["tools"] = json!([{"type": "function", "function": {"name": "search"}}]);
    let mut other_tools = chat(&["hi"]);
    other_tools["tools"] = json!([{"type": "function", "function": {"name": "fetch"}}]);
    assert_ne!(key(with_tools.clone()), key(chat(&["hi"])));
    assert_ne!(key(with_tools.clone()), key(other_tools));
    // A tool's description or schema may be re-rendered between turns: only names count.
    let mut described = with_tools.clone();
    described["tools"][0]["function"]["description"] = json!("look things up");
    assert_eq!(key(described), key(with_tools));
}

#[test]
fn anthropic_cache_control_markers_moving_between_turns_leave_the_key_alone() {
    let turn_one = json!({
        "model": "m",
        "system": [{"type": "text", "text": system_prompt(), "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "fix the bug", "cache_control": {"type": "ephemeral"}}
        ]}],
    });
    let turn_two = json!({
        "model": "m",
        "system": [{"type": "text", "text": system_prompt()}],
        "tools": [{"name": "Bash", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "fix the bug"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok",
                "cache_control": {"type": "ephemeral"}}]},
        ],
    });
    assert_eq!(key(turn_one), key(turn_two));
}

#[test]
fn claude_codes_billing_line_changing_between_requests_leaves_the_key_alone() {
    // Told its base URL is Anthropic's, Claude Code hashes each request into the line; the
    // worker leaves the line out of the prompt, so the key does too.
    let side_request = |billing: &str| {
        json!({
            "model": "claude-haiku-4-5",
            "system": [
                {"type": "text", "text": format!("x-anthropic-billing-header: cc_version=2.1.330; cc_entrypoint=cli;{billing}")},
                {"type": "text", "text": "Write a five-word title for the conversation."}
            ],
            "messages": [{"role": "user", "content": "fix the bug"}],
        })
    };
    assert_eq!(
        key(side_request(" cch=3f9a1; cc_prompt_index=1;")),
        key(side_request(" cch=b77c0; cc_prompt_index=2;"))
    );
    // Elsewhere than a system text's start, the same words are the user's.
    let quoted = |billing: &str| {
        json!({"model": "m", "system": format!("Quote: x-anthropic-billing-header: {billing}"),
               "messages": [{"role": "user", "content": "hi"}]})
    };
    assert_ne!(key(quoted("cch=1")), key(quoted("cch=2")));
}

#[test]
fn a_responses_continuation_expanded_from_previous_response_id_keeps_the_first_turns_key() {
    let first = json!({"model": "m", "instructions": "be brief", "input": "hello"});
    // What `responses_api::prepare` sends for `previous_response_id`: the history as items.
    let expanded = json!({"model": "m", "instructions": "be brief", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "hello"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "more"}]},
    ]});
    assert_eq!(key(first.clone()), key(expanded));
    let other = json!({"model": "m", "instructions": "be brief", "input": "goodbye"});
    assert_ne!(key(first), key(other));
}

#[test]
fn a_session_header_pins_the_conversation_whatever_the_prompt() {
    // (Claude Code's own header names a session of several conversations: see
    // `without_its_billing_line_…`.)
    let mut headers = HeaderMap::new();
    headers.insert("x-session-id", HeaderValue::from_static("4f1c"));
    let a = key_with(&headers, &chat(&["one thing"]));
    let b = key_with(&headers, &chat(&["another"]));
    assert_eq!(a, b);
    assert_ne!(a, key(chat(&["one thing"])));
    let mut other = HeaderMap::new();
    other.insert("x-session-id", HeaderValue::from_static("4f1d"));
    assert_ne!(key_with(&other, &chat(&["one thing"])), a);
    // Not UTF-8: still an id.
    let mut binary = HeaderMap::new();
    binary.insert(
        "x-session-id",
        HeaderValue::from_bytes(&[0xff, 0xfe]).expect("opaque bytes"),
    );
    assert!(key_with(&binary, &chat(&["x"])).is_some());
}

/// A Claude Code request of session `session`: its billing line (with `fields`), the system
/// prompt `prompt`, and a conversation opened by `task` of `turns` messages.
fn claude_code(session: &str, fields: &str, prompt: &str, task: &str, turns: usize) -> Option<u64> {
    let line =
        format!("x-anthropic-billing-header: cc_version=2.1.330; cc_entrypoint=cli;{fields}");
    claude_code_with(session, Some(&line), prompt, task, turns)
}

/// [`claude_code`] without the billing line (`CLAUDE_CODE_ATTRIBUTION_HEADER=0`).
fn claude_code_unattributed(session: &str, prompt: &str, task: &str, turns: usize) -> Option<u64> {
    claude_code_with(session, None, prompt, task, turns)
}

fn claude_code_with(
    session: &str,
    billing_line: Option<&str>,
    prompt: &str,
    task: &str,
    turns: usize,
) -> Option<u64> {
    let mut headers = HeaderMap::new();
    headers.insert(
        "x-claude-code-session-id",
        HeaderValue::from_str(session).expect("a header value"),
    );
    let mut messages = vec![json!({"role": "user", "content": task})];
    for n in 1..turns {
        let role = if n % 2 == 0 { "user" } else { "assistant" };
        messages.push(json!({"role": role, "content": format!("step {n}")}));
    }
    let mut system =
        vec![json!({"type": "text", "text": prompt, "cache_control": {"type": "ephemeral"}})];
    if let Some(line) = billing_line {
        system.insert(0, json!({"type": "text", "text": line}));
    }
    let body = json!({"model": "claude-sonnet-4-5", "system": system, "messages": messages});
    key_with(&headers, &body)
}

#[test]
fn a_claude_code_subagent_is_a_conversation_of_its_own_within_its_session() {
    const SUBAGENT: &str = " cc_is_subagent=true;";
    let main = claude_code("s1", "", "You are Claude Code.", "fix the bug", 1);
    // The main conversation keeps the session's key whatever its prompt.
    assert_eq!(
        main,
        claude_code("s1", "", "You are Claude Code.", "fix the bug", 5)
    );
    assert_eq!(
        main,
        claude_code("s1", "", "Another prompt.", "another task", 1)
    );
    // A subagent: its own key, the same turn after turn, apart from its parallel siblings'.
    let search = |turns| claude_code("s1", SUBAGENT, "You search.", "find the tests", turns);
    let sibling = claude_code("s1", SUBAGENT, "You search.", "find the docs", 1);
    assert_eq!(search(1), search(3));
    assert!(search(1).is_some());
    assert_ne!(search(1), main);
    assert_ne!(search(1), sibling);
    assert_ne!(sibling, main);
    // The same subagent in another session is another conversation.
    assert_ne!(
        search(1),
        claude_code("s2", SUBAGENT, "You search.", "find the tests", 1)
    );
    // The marker counts only as a field of the billing line that opens the system prompt.
    for fields in [" cc_is_subagent=false;", " cc_is_subagent=trueish;", ""] {
        assert_eq!(
            claude_code("s1", fields, "You search.", "find the tests", 1),
            main,
            "{fields}"
        );
    }
    assert_eq!(
        claude_code(
            "s1",
            "",
            "x-anthropic-billing-header: cc_is_subagent=true;",
            "find the tests",
            1
        ),
        main,
        "in a later block"
    );
    // Beyond the bytes looked at first, it is not the billing line's.
    let far = format!(" cc_workload={};{SUBAGENT}", "w".repeat(600));
    assert_eq!(
        claude_code("s1", &far, "You search.", "find the tests", 1),
        main
    );
}

#[test]
fn without_its_billing_line_each_conversation_of_a_claude_code_session_keeps_a_key_of_its_own() {
    let main = |turns| claude_code_unattributed("s1", "You are Claude Code.", "fix it", turns);
    let search = |turns| claude_code_unattributed("s1", "You search.", "find the tests", turns);
    // Each the same turn after turn, apart from the other.
    assert!(main(1).is_some());
    assert_eq!(main(1), main(7));
    assert_eq!(search(1), search(3));
    assert_ne!(main(1), search(1));
    // Apart from the same conversations in another session.
    assert_ne!(
        main(1),
        claude_code_unattributed("s2", "You are Claude Code.", "fix it", 1)
    );
    // With the line, the main conversation keeps the session's key whatever its prompt.
    assert_eq!(
        claude_code("s1", "", "You are Claude Code.", "fix it", 1),
        claude_code("s1", "", "You search.", "find the tests", 1)
    );
}

#[test]
fn body_session_ids_pin_in_order_prompt_cache_key_metadata_user_id_then_user() {
    let mut body = chat(&["a"]);
    body["user"] = json!("alice");
    let by_user = key(body.clone());
    let mut other_turn = chat(&["b"]);
    other_turn["user"] = json!("alice");
    assert_eq!(key(other_turn), by_user);
    body["metadata"] = json!({"user_id": "user_x_session_1"});
    let by_metadata = key(body.clone());
    assert_ne!(by_metadata, by_user);
    body["prompt_cache_key"] = json!("conv-9");
    let by_cache_key = key(body.clone());
    assert_ne!(by_cache_key, by_metadata);
    let mut same_cache_key = chat(&["zzz"]);
    same_cache_key["prompt_cache_key"] = json!("conv-9");
    assert_eq!(key(same_cache_key), by_cache_key);
}

#[test]
fn blank_or_wrongly_typed_session_ids_fall_back_to_the_prompt_prefix() {
    let plain = key(chat(&["a"]));
    let mut headers = HeaderMap::new();
    headers.insert("x-session-id", HeaderValue::from_static("   "));
    assert_eq!(key_with(&headers, &chat(&["a"])), plain);
    for odd in [
        json!(""),
        json!(42),
        json!({"nested": true}),
        json!(["x"]),
        json!(null),
    ] {
        let mut body = chat(&["a"]);
        body["prompt_cache_key"] = odd.clone();
        body["user"] = odd.clone();
        body["metadata"] = json!({"user_id": odd});
        assert_eq!(key(body), plain, "{odd}");
    }
    let mut body = chat(&["a"]);
    body["metadata"] = json!("not an object");
    assert_eq!(key(body), plain);
}

#[test]
fn malformed_prompts_yield_no_key_or_a_key_without_failing() {
    assert_eq!(key(json!({"model": "m"})), None);
    assert_eq!(key(json!({"model": "m", "messages": []})), None);
    assert!(key(json!({"model": "m", "messages": "text"})).is_some());
    assert_eq!(
        key(json!({"model": "m", "messages": {"role": "user"}})),
        None
    );
    assert_eq!(key(json!({"model": "m", "messages": 7})), None);
    assert_eq!(key(json!({"model": "m", "prompt": 7})), None);
    // Elements of any shape still hash (by their JSON), deterministically.
    let odd =
        json!({"model": "m", "messages": [1, null, {"role": 5}, {"content": {"x": 1}}, [[]]]});
    assert!(key(odd.clone()).is_some());
    assert_eq!(key(odd.clone()), key(odd));
    let tools =
        json!({"model": "m", "tools": "none", "messages": [{"role": "user", "content": "a"}]});
    assert!(key(tools).is_some());
}

#[test]
fn only_the_leading_messages_up_to_the_first_user_message_are_read() {
    // No user message among many: the key covers the first 16 and ignores the rest.
    let mut messages: Vec<_> = (0..MAX_LEADING_MESSAGES)
        .map(|i| json!({"role": "system", "content": format!("rule {i}")}))
        .collect();
    let base = key(json!({"model": "m", "messages": messages.clone()}));
    messages.push(json!({"role": "user", "content": "late"}));
    assert_eq!(key(json!({"model": "m", "messages": messages})), base);
    // Deeply nested content in a later message is skipped, not parsed into values.
    let deep = format!("{}{}", "[".repeat(100), "]".repeat(100));
    let body = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"a"}},{{"role":"assistant","content":{deep}}}]}}"#
    );
    let fields: BodyFields<'_> = serde_json::from_str(&body).expect("parses");
    assert_eq!(
        affinity_key(&HeaderMap::new(), &fields),
        key(json!({"model": "m", "messages": [{"role": "user", "content": "a"}]}))
    );
}

#[test]
fn completion_prompts_are_keyed_by_their_leading_bytes_cut_at_a_character_boundary() {
    let head = "é".repeat(PROMPT_PREFIX_BYTES); // two bytes each
    let a = key(json!({"model": "m", "prompt": format!("{head}turn one")}));
    let b = key(json!({"model": "m", "prompt": format!("{head}turn one, two")}));
    assert!(a.is_some());
    assert_eq!(a, b);
    assert_ne!(a, key(json!({"model": "m", "prompt": "short"})));
    assert_eq!(
        key(json!({"model": "m", "prompt": ["first", "second"]})),
        key(json!({"model": "m", "prompt": "first"}))
    );
}
