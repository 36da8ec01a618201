//! An estimate for `POST /v1/messages/count_tokens` when the backend cannot count.
//!
//! Clients use the count to decide when to compact a conversation, so a stable, slightly
//! generous figure serves them better than an error. The estimate is the number of characters
//! of everything the model reads — system prompt, message text, reasoning, tool calls and
//! results, and tool definitions (name, description and JSON schema) — divided by 4 and
//! rounded up (about right for English and code with common tokenizers), plus
//! [`IMAGE_TOKENS`] per image.

use serde_json::Value;

use crate::adapter::anthropic_messages;
use crate::adapter::canonical::Part;
use crate::adapter::AdapterError;

/// Characters per token assumed by the estimate.
pub const CHARS_PER_TOKEN: usize = 4;

/// Tokens counted per image: Anthropic's figure for an image of about 1.15 megapixels, the
/// largest size it uses without downscaling.
pub const IMAGE_TOKENS: u64 = 1_600;

/// The estimated input tokens of an Anthropic Messages request body; an error names a field
/// the adapter cannot read (the same 400 `/v1/messages` would give).
pub fn estimate(body: &Value) -> Result<u64, AdapterError> {
    let request = anthropic_messages::parse_request(body)?;
    let mut chars = 0usize;
    let mut images = 0u64;
    let mut count = |part: &Part, chars: &mut usize| match part {
        Part::Text(text) => *chars += text.chars().count(),
        Part::Thinking(thinking) => *chars += thinking.text.chars().count(),
        Part::ToolCall(call) => {
            *chars += call.name.chars().count() + call.arguments.chars().count()
        }
        Part::Image(_) => images += 1,
        Part::ToolResult(_) => {}
    };
    for text in &request.system {
        chars += text.chars().count();
    }
    for message in &request.messages {
        for part in &message.content {
            count(part, &mut chars);
            if let Part::ToolResult(result) = part {
                for inner in &result.content {
                    count(inner, &mut chars);
                }
            }
        }
    }
    for tool in &request.tools {
        chars += tool.name.chars().count();
        chars += tool.description.as_deref().map_or(0, |d| d.chars().count());
        chars += tool.parameters.to_string().chars().count();
    }
    let tokens = chars.div_ceil(CHARS_PER_TOKEN) as u64 + images * IMAGE_TOKENS;
    Ok(tokens.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn count_tokens_estimate_is_characters_over_four_of_everything_the_model_reads() {
        let body = json!({
            "model": "m",
            "system": [{"type": "text", "text": "abcd"}],
            "messages": [
                {"role": "user", "content": "12345678"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "ab", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "xyz"}]},
            ],
            "tools": [{"name": "ab", "description": "cd", "input_schema": {}}],
        });
        // 4 (system) + 8 (user) + 2 + 2 ("ab" + "{}") + 3 (result) + 2 + 2 + 2 (tool) = 25 -> 7.
        assert_eq!(estimate(&body).unwrap(), 7);
        let image = json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}
        ]}]});
        assert_eq!(estimate(&image).unwrap(), IMAGE_TOKENS);
        let empty = json!({"model": "m", "messages": []});
        assert_eq!(estimate(&empty).unwrap(), 1, "never zero");
    }

    #[test]
    fn count_tokens_estimate_rejects_unsupported_content_naming_the_field() {
        let body =
            json!({"model": "m", "messages": [{"role": "user", "content": [{"type": "audio"}]}]});
        assert_eq!(
            estimate(&body).unwrap_err().to_string(),
            "messages[0].content[0].type: audio is not supported"
        );
    }
}
