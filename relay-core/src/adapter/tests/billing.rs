//! Claude Code's billing line (`x-anthropic-billing-header: …`) never reaches a backend's
//! prompt: against Anthropic's own URL it changes with every request, and as the prompt's first
//! line it would leave the backend's prompt cache nothing to reuse.

use serde_json::{json, Value};

use crate::adapter::anthropic_messages::without_billing_header;
use crate::adapter::{to_backend_request, BackendApi, ClientApi};

const LINE: &str = "x-anthropic-billing-header: cc_version=2.1.330; cc_entrypoint=cli;";

/// A Claude Code turn whose billing line carries `fields` after the version.
fn turn(fields: &str) -> Value {
    json!({
        "model": "m",
        "max_tokens": 64,
        "system": [
            {"type": "text", "text": format!("{LINE}{fields}")},
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}
        ],
        "messages": [{"role": "user", "content": "hi"}]
    })
}

fn chat(body: &Value) -> Value {
    to_backend_request(BackendApi::OpenAiChat, ClientApi::AnthropicMessages, body)
        .expect("translates")
}

#[test]
fn turns_whose_billing_lines_differ_reach_the_backend_as_the_same_prompt() {
    let first = chat(&turn(
        " cch=3f9a1; cc_prev_req=req_011CVx; cc_prompt_index=1;",
    ));
    let second = chat(&turn(
        " cch=b77c0; cc_prev_req=req_011CWa; cc_prompt_index=2;",
    ));
    assert_eq!(first, second);
    assert_eq!(
        first["messages"][0],
        json!({"role": "system", "content": "You are Claude Code."})
    );
    assert!(!first.to_string().contains("billing"), "{first}");
}

#[test]
fn only_a_leading_billing_line_is_left_out() {
    // Its own block, as Claude Code sends it.
    assert_eq!(without_billing_header(LINE), "");
    // The first line of a longer text: the rest stays, without the blank lines between.
    assert_eq!(
        without_billing_header(&format!("{LINE}\n\nYou are Claude Code.\nBe brief.")),
        "You are Claude Code.\nBe brief."
    );
    assert_eq!(
        without_billing_header(&format!("{LINE}\r\nBe brief.")),
        "Be brief."
    );
    // Anywhere else it is the user's text.
    for text in [
        "Quote: x-anthropic-billing-header: cc_version=1",
        " x-anthropic-billing-header: leading space",
        "X-Anthropic-Billing-Header: another case",
        "",
    ] {
        assert_eq!(without_billing_header(text), text);
    }
}

#[test]
fn a_system_of_nothing_but_the_billing_line_sends_no_system_message() {
    for system in [json!(LINE), json!([{"type": "text", "text": LINE}])] {
        let body = json!({
            "model": "m",
            "max_tokens": 8,
            "system": system,
            // The system-role entry Claude Code sends inside `messages` is read the same way.
            "messages": [
                {"role": "system", "content": format!("{LINE} cch=00000;")},
                {"role": "user", "content": "hi"}
            ]
        });
        let sent = chat(&body);
        assert_eq!(
            sent["messages"],
            json!([{"role": "user", "content": "hi"}]),
            "{system}"
        );
    }
}
