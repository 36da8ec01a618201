//! The slot hint in a request body: llama-server's `id_slot` (and `cache_prompt`, which recent
//! builds turn on by default and older ones need) as the first members of the JSON object the
//! client sent. Pure text work: the body is not parsed again.

/// `body` with `"id_slot":slot` (and `"cache_prompt":true` unless it names `cache_prompt`)
/// added, or `None` when the body is not a JSON object or already names `id_slot` (the
/// client's own choice stands).
///
/// The body was already read as JSON by the proxy; what is checked here is only what the
/// insertion needs: an object's opening brace, and whether it is empty (no comma then). A name
/// in a string value ("id_slot" inside a message) also counts as named: that errs on the side
/// of sending the body as it came.
pub fn with_slot(body: &str, slot: u32) -> Option<String> {
    let start = body.len() - body.trim_start().len();
    let rest = body[start..].strip_prefix('{')?;
    if body.contains("\"id_slot\"") {
        return None;
    }
    let mut hinted = String::with_capacity(body.len() + 40);
    hinted.push_str(&body[..start]);
    hinted.push('{');
    hinted.push_str("\"id_slot\":");
    hinted.push_str(&slot.to_string());
    if !body.contains("\"cache_prompt\"") {
        hinted.push_str(",\"cache_prompt\":true");
    }
    if !rest.trim_start().starts_with('}') {
        hinted.push(',');
    }
    hinted.push_str(rest);
    Some(hinted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::Endpoint;
    use serde_json::{json, Value};

    fn parsed(body: &str) -> Value {
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{body}: {e}"))
    }

    #[test]
    fn the_hint_is_added_to_an_object_and_everything_else_is_kept() {
        let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}"#;
        let hinted = with_slot(body, 2).unwrap();
        let mut expected = parsed(body);
        expected["id_slot"] = json!(2);
        expected["cache_prompt"] = json!(true);
        assert_eq!(parsed(&hinted), expected);
        assert!(
            hinted.ends_with(&body[1..]),
            "the client's bytes follow unchanged"
        );
        assert_eq!(
            parsed(&with_slot(" \n{ } ", 0).unwrap()),
            json!({"id_slot": 0, "cache_prompt": true}),
            "an empty object takes no comma"
        );
        assert_eq!(
            parsed(&with_slot(r#"{"cache_prompt":false,"model":"m"}"#, 1).unwrap()),
            json!({"id_slot": 1, "cache_prompt": false, "model": "m"}),
            "the client's cache_prompt stands"
        );
    }

    #[test]
    fn a_body_that_is_not_an_object_or_names_id_slot_is_left_alone() {
        for body in [
            "",
            "   ",
            "[1,2]",
            "\"text\"",
            "null",
            "17",
            r#"{"model":"m","id_slot":0}"#,
            r#"{"stop":["id_slot"]}"#,
        ] {
            assert_eq!(with_slot(body, 3), None, "{body}");
        }
        // Inside a string the name is escaped, so it is no member: the hint goes in.
        let quoted = r#"{"messages":[{"role":"user","content":"what is \"id_slot\"?"}]}"#;
        assert!(with_slot(quoted, 3).is_some());
    }

    #[test]
    fn only_llama_server_s_chat_and_completion_routes_take_the_hint() {
        for path in [
            "/v1/chat/completions",
            "/v1/chat/completions?x=1",
            "/chat/completions",
            "/v1/completions",
            "/completion",
        ] {
            assert!(Endpoint::of(path).takes_slot_hint(), "{path}");
        }
        for path in [
            "/v1/messages",
            "/v1/responses",
            "/v1/embeddings",
            "/v1/chat/completions/extra",
            "/V1/CHAT/COMPLETIONS",
            "",
        ] {
            assert!(!Endpoint::of(path).takes_slot_hint(), "{path}");
        }
    }

    proptest::proptest! {
        /// Whatever JSON object a client sends, the hinted body is the same object plus the
        /// hint, or the body unchanged.
        #[test]
        fn any_object_stays_the_same_object_plus_the_hint(
            members in proptest::collection::btree_map("[a-z_\"\\\\ é\\u{1}]{0,8}", "[a-z0-9 \"{}\\[\\],:]{0,12}", 0..6),
            slot in 0u32..300,
        ) {
            let object: serde_json::Map<String, Value> =
                members.into_iter().map(|(k, v)| (k, Value::String(v))).collect();
            let body = serde_json::to_string(&object).unwrap();
            match with_slot(&body, slot) {
                None => proptest::prop_assert!(body.contains("\"id_slot\"")),
                Some(hinted) => {
                    let mut expected = Value::Object(object);
                    if !body.contains("\"cache_prompt\"") {
                        expected["cache_prompt"] = json!(true);
                    }
                    expected["id_slot"] = json!(slot);
                    let got: Value = serde_json::from_str(&hinted).unwrap();
                    proptest::prop_assert_eq!(got, expected);
                }
            }
        }
    }
}
