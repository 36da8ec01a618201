//! Golden conversions: each `convert/<name>.json` names a conversion, its input (and the client
//! request where a response needs it); `convert/<name>.expected.json` is the output.

use serde_json::Value;

use super::{bless, files, fixtures, identity};
use crate::adapter::{
    anthropic_messages, from_backend_response_with, from_chat_response_with, openai_chat,
    to_backend_request, to_chat_request, AdapterError, BackendApi, ClientApi,
};

fn convert(fixture: &Value) -> Result<Value, AdapterError> {
    let input = &fixture["input"];
    let api = |name: &str| match name {
        "anthropic" => ClientApi::AnthropicMessages,
        "responses" => ClientApi::OpenAiResponses,
        "chat" => ClientApi::OpenAiChat,
        other => panic!("unknown api {other}"),
    };
    let from = fixture["from"].as_str().expect("from");
    let to = fixture["to"].as_str().expect("to");
    match (from, to) {
        (client, "backend") => to_chat_request(api(client), input),
        (client, "anthropic_upstream") => {
            to_backend_request(BackendApi::AnthropicMessages, api(client), input)
        }
        ("anthropic_response", client) => from_backend_response_with(
            BackendApi::AnthropicMessages,
            api(client),
            &fixture["request"],
            input,
            &identity(),
        ),
        ("chat_response", "chat_response") => Ok(openai_chat::build_response(
            &openai_chat::parse_response(input)?,
        )),
        ("chat_response", client) => {
            from_chat_response_with(api(client), &fixture["request"], input, &identity())
        }
        ("chat_request", "anthropic_request") => Ok(anthropic_messages::build_request(
            &openai_chat::parse_request(input)?,
        )),
        ("anthropic", "anthropic_request") => Ok(anthropic_messages::build_request(
            &anthropic_messages::parse_request(input)?,
        )),
        other => panic!("unknown conversion {other:?}"),
    }
}

#[test]
fn every_conversion_matches_its_golden_file() {
    let dir = fixtures("convert");
    let cases: Vec<_> = files(&dir, ".json")
        .into_iter()
        .filter(|(stem, _)| !stem.ends_with(".expected"))
        .collect();
    assert!(cases.len() >= 15, "fixtures missing: {}", cases.len());
    let mut failures = Vec::new();
    for (name, path) in cases {
        let text = std::fs::read_to_string(&path).expect("fixture");
        let fixture: Value = serde_json::from_str(&text).expect("fixture JSON");
        let actual = convert(&fixture).unwrap_or_else(|e| panic!("{name}: {e}"));
        let expected_path = dir.join(format!("{name}.expected.json"));
        if bless() {
            let pretty = serde_json::to_string_pretty(&actual).expect("json") + "\n";
            std::fs::write(&expected_path, pretty).expect("write");
            continue;
        }
        let expected: Value = std::fs::read_to_string(&expected_path)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_else(|| panic!("{name}: no readable {}", expected_path.display()));
        if actual != expected {
            failures.push(format!(
                "{name}:\nexpected {}\nactual   {}",
                serde_json::to_string_pretty(&expected).expect("json"),
                serde_json::to_string_pretty(&actual).expect("json")
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
