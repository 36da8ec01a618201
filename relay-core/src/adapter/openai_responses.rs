//! OpenAI Responses ⇄ canonical, and the pieces a response store needs for
//! `previous_response_id`.
//!
//! A Responses answer echoes much of its request (instructions, tools, sampling settings), so
//! the builders take the client's request body alongside the canonical answer.

use serde_json::{json, Value};

use super::canonical::{
    Image, Message, Part, Request, Response, Role, StopReason, Thinking, Tool, ToolCall,
    ToolChoice, ToolResult, Usage,
};
use super::error::AdapterError;
use super::json::At;
use super::openai_chat::empty_schema;
use super::Identity;

/// The conversation of a finished exchange, as a response store keeps it so a later request with
/// `previous_response_id` can continue it. `instructions` are not part of it: OpenAI does not
/// carry them over to the next response.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StoredConversation {
    /// The request's messages followed by the answer as one assistant message.
    pub messages: Vec<Message>,
}

impl StoredConversation {
    /// The conversation after `response` answered `request` (the request already expanded with
    /// any earlier history, so chains of continuations keep everything).
    pub fn from_exchange(request: &Request, response: &Response) -> Self {
        let mut messages = request.messages.clone();
        if !response.content.is_empty() {
            messages.push(Message {
                role: Role::Assistant,
                content: response.content.clone(),
            });
        }
        StoredConversation { messages }
    }
}

/// Reads a Responses request that stands alone. A `previous_response_id` is an error here: the
/// caller that owns a store resolves it and calls [`expand_with_history`] instead, because
/// silently dropping the history would produce a wrong answer.
///
/// Dropped without error: `store`, `metadata`, `include`, `reasoning`, `truncation`, `text`
/// (output format), `service_tier`, `prompt_cache_key`, and built-in tools (`web_search`,
/// `file_search`, ...) that a chat backend cannot run.
pub fn parse_request(body: &Value) -> Result<Request, AdapterError> {
    let root = At::root(body);
    if let Some(previous) = root.get("previous_response_id") {
        return Err(previous.error(
            "stored conversations are not available on this route; send the whole conversation in `input`",
        ));
    }
    parse(&root, Vec::new())
}

/// Reads a Responses request that continues `previous`: its input is appended to the stored
/// conversation. `previous_response_id` itself is not looked at; the store already used it.
pub fn expand_with_history(
    previous: &StoredConversation,
    body: &Value,
) -> Result<Request, AdapterError> {
    parse(&At::root(body), previous.messages.clone())
}

fn parse(root: &At, history: Vec<Message>) -> Result<Request, AdapterError> {
    root.object()?;
    let mut request = Request {
        model: root.opt_str("model")?.unwrap_or_default().to_string(),
        max_tokens: root.opt_u64("max_output_tokens")?,
        temperature: root.opt_f64("temperature")?,
        top_p: root.opt_f64("top_p")?,
        top_k: root.opt_u64("top_k")?,
        stream: root.opt_bool("stream")?.unwrap_or(false),
        user: root.opt_str("user")?.map(str::to_string),
        parallel_tool_calls: root.opt_bool("parallel_tool_calls")?,
        messages: history,
        ..Request::default()
    };
    if let Some(instructions) = root.opt_str("instructions")? {
        request.system.push(instructions.to_string());
    }
    if let Some(input) = root.get("input") {
        match input.value().as_str() {
            Some(text) => request.messages.push(Message {
                role: Role::User,
                content: vec![Part::Text(text.to_string())],
            }),
            None => {
                for item in input.items()? {
                    push_item(&mut request.messages, &item)?;
                }
            }
        }
    }
    if let Some(tools) = root.get("tools") {
        for tool in tools.items()? {
            if tool.kind()? == "function" {
                request.tools.push(Tool {
                    name: tool.require("name")?.str()?.to_string(),
                    description: tool.opt_str("description")?.map(str::to_string),
                    parameters: tool
                        .get("parameters")
                        .map(|p| p.value().clone())
                        .unwrap_or_else(empty_schema),
                });
            }
        }
    }
    request.tool_choice = root
        .get("tool_choice")
        .map(|c| parse_tool_choice(&c))
        .transpose()?;
    Ok(request)
}

fn parse_tool_choice(at: &At) -> Result<ToolChoice, AdapterError> {
    if let Some(choice) = at.value().as_str() {
        return match choice {
            "auto" => Ok(ToolChoice::Auto),
            "none" => Ok(ToolChoice::None),
            "required" => Ok(ToolChoice::Required),
            other => Err(at.error(format!("{other} is not supported"))),
        };
    }
    match at.kind()? {
        "function" => Ok(ToolChoice::Named(at.require("name")?.str()?.to_string())),
        other => Err(at.unsupported_type(other)),
    }
}

/// Adds one input item. Items of one assistant turn (reasoning, text, calls) arrive separately
/// and are merged into one assistant message, the shape chat backends need; consecutive call
/// outputs likewise share one user message.
fn push_item(messages: &mut Vec<Message>, at: &At) -> Result<(), AdapterError> {
    match at.opt_str("type")?.unwrap_or("message") {
        "message" => {
            let role_at = at.require("role")?;
            let role = match role_at.str()? {
                "user" => Role::User,
                "assistant" => Role::Assistant,
                "system" | "developer" => Role::System,
                other => return Err(role_at.error(format!("{other} is not supported"))),
            };
            let content = message_content(&at.require("content")?)?;
            if role == Role::Assistant {
                push_assistant(messages, content);
            } else {
                messages.push(Message { role, content });
            }
        }
        "function_call" => push_assistant(
            messages,
            vec![Part::ToolCall(ToolCall {
                id: at.require("call_id")?.str()?.to_string(),
                name: at.require("name")?.str()?.to_string(),
                arguments: at.opt_str("arguments")?.unwrap_or_default().to_string(),
            })],
        ),
        "function_call_output" => {
            let output = at.require("output")?;
            let result = Part::ToolResult(ToolResult {
                call_id: at.require("call_id")?.str()?.to_string(),
                content: message_content(&output)?,
                is_error: false,
            });
            match messages.last_mut() {
                Some(last)
                    if last.role == Role::User
                        && last
                            .content
                            .iter()
                            .all(|p| matches!(p, Part::ToolResult(_))) =>
                {
                    last.content.push(result)
                }
                _ => messages.push(Message {
                    role: Role::User,
                    content: vec![result],
                }),
            }
        }
        "reasoning" => {
            let text = reasoning_text(at)?;
            push_assistant(
                messages,
                vec![Part::Thinking(Thinking {
                    text,
                    signature: None,
                })],
            );
        }
        other => return Err(at.unsupported_type(other)),
    }
    Ok(())
}

fn push_assistant(messages: &mut Vec<Message>, parts: Vec<Part>) {
    match messages.last_mut() {
        Some(last) if last.role == Role::Assistant => last.content.extend(parts),
        _ => messages.push(Message {
            role: Role::Assistant,
            content: parts,
        }),
    }
}

/// The reasoning's full text if present, else its summary.
fn reasoning_text(at: &At) -> Result<String, AdapterError> {
    for (key, kind) in [("content", "reasoning_text"), ("summary", "summary_text")] {
        let Some(list) = at.get(key) else { continue };
        let mut texts = Vec::new();
        for part in list.items()? {
            if part.kind()? == kind {
                texts.push(part.require("text")?.str()?.to_string());
            }
        }
        if !texts.is_empty() {
            return Ok(texts.join("\n\n"));
        }
    }
    Ok(String::new())
}

fn message_content(at: &At) -> Result<Vec<Part>, AdapterError> {
    if let Some(text) = at.value().as_str() {
        return Ok(vec![Part::Text(text.to_string())]);
    }
    at.items()?
        .iter()
        .map(|part| match part.kind()? {
            "input_text" | "output_text" => {
                Ok(Part::Text(part.require("text")?.str()?.to_string()))
            }
            "refusal" => Ok(Part::Text(part.require("refusal")?.str()?.to_string())),
            "input_image" => match part.get("image_url") {
                Some(url) => Ok(Part::Image(Image::from_url(url.str()?))),
                None => Err(part.field_error(
                    "image_url",
                    "is required (uploaded file references are not supported)",
                )),
            },
            other => Err(part.unsupported_type(other)),
        })
        .collect()
}

/// The Responses answer for `response`, given the client's `request` body.
pub fn build_response(request: &Value, response: &Response, identity: &Identity) -> Value {
    let mut out = envelope(request, identity, &response.model);
    let (status, incomplete) = status(response.stop_reason);
    out["status"] = json!(status);
    out["incomplete_details"] = incomplete;
    let output: Vec<Value> = response
        .content
        .iter()
        .filter(|part| !part.is_blank() && !matches!(part, Part::Image(_) | Part::ToolResult(_)))
        .enumerate()
        .filter_map(|(index, part)| output_item(part, index, identity, "completed"))
        .collect();
    out["output"] = Value::Array(output);
    out["usage"] = usage_object(&response.usage);
    out
}

/// The response object before any output: what `response.created` carries. Settings the client
/// sent are echoed; unset ones get OpenAI's defaults, so SDK models find every field.
pub(crate) fn envelope(request: &Value, identity: &Identity, backend_model: &str) -> Value {
    let echo = |key: &str, default: Value| match request.get(key) {
        Some(value) if !value.is_null() => value.clone(),
        _ => default,
    };
    json!({
        "id": format!("resp_{}", identity.id),
        "object": "response",
        "created_at": identity.created,
        "status": "in_progress",
        "error": null,
        "incomplete_details": null,
        "instructions": echo("instructions", Value::Null),
        "max_output_tokens": echo("max_output_tokens", Value::Null),
        "model": super::client_model(request, backend_model),
        "output": [],
        "parallel_tool_calls": echo("parallel_tool_calls", json!(true)),
        "previous_response_id": echo("previous_response_id", Value::Null),
        "reasoning": echo("reasoning", json!({"effort": null, "summary": null})),
        "store": echo("store", json!(true)),
        "temperature": echo("temperature", json!(1.0)),
        "text": echo("text", json!({"format": {"type": "text"}})),
        "tool_choice": echo("tool_choice", json!("auto")),
        "tools": echo("tools", json!([])),
        "top_p": echo("top_p", json!(1.0)),
        "truncation": echo("truncation", json!("disabled")),
        "usage": null,
        "user": echo("user", Value::Null),
        "metadata": echo("metadata", json!({})),
    })
}

/// The final `status` and `incomplete_details` for a stop reason.
pub(crate) fn status(reason: StopReason) -> (&'static str, Value) {
    match reason {
        StopReason::MaxTokens => ("incomplete", json!({"reason": "max_output_tokens"})),
        StopReason::ContentFilter => ("incomplete", json!({"reason": "content_filter"})),
        _ => ("completed", Value::Null),
    }
}

/// The id of output item `index`. Derived from the response id and the index, so a streamed
/// answer and its final `response.completed` object name each item the same way.
pub(crate) fn item_id(prefix: &str, identity: &Identity, index: usize) -> String {
    format!("{prefix}_{}_{index}", identity.id)
}

/// Output item `index` for `part`, with the given item `status`; `None` for parts that cannot be
/// output (images, tool results).
pub(crate) fn output_item(
    part: &Part,
    index: usize,
    identity: &Identity,
    status: &str,
) -> Option<Value> {
    let item = match part {
        Part::Text(text) => json!({
            "id": item_id("msg", identity, index),
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": [output_text(text)],
        }),
        Part::Thinking(thinking) => json!({
            "id": item_id("rs", identity, index),
            "type": "reasoning",
            "status": status,
            "summary": [],
            "content": [{"type": "reasoning_text", "text": thinking.text}],
        }),
        Part::ToolCall(call) => json!({
            "id": item_id("fc", identity, index),
            "type": "function_call",
            "status": status,
            "call_id": call.id,
            "name": call.name,
            "arguments": call.arguments,
        }),
        Part::Image(_) | Part::ToolResult(_) => return None,
    };
    Some(item)
}

/// An `output_text` content part.
pub(crate) fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// A Responses usage object.
pub(crate) fn usage_object(usage: &Usage) -> Value {
    json!({
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {"cached_tokens": usage.cache_read_tokens},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.total_tokens(),
    })
}

/// The answer's `output` items as conversation messages, for storing the exchange: output items
/// have the shape of input items, so they are read as such. Items a chat backend cannot have
/// produced (built-in tool calls of a native server) are skipped.
pub fn output_messages(response: &Value) -> Result<Vec<Message>, AdapterError> {
    let root = At::root(response);
    let mut messages = Vec::new();
    for item in root.require("output")?.items()? {
        if matches!(
            item.opt_str("type")?,
            Some("message" | "function_call" | "reasoning")
        ) {
            push_item(&mut messages, &item)?;
        }
    }
    Ok(messages)
}

/// A conversation as Responses `input` items: what a request continuing a stored conversation
/// sends in place of `previous_response_id`, so any worker and backend can serve it. Reading
/// the items back ([`expand_with_history`] or [`parse_request`]) gives the same conversation,
/// except that tool results lose `is_error` (Responses has no such flag) and thinking its
/// signature.
pub fn input_items(messages: &[Message]) -> Vec<Value> {
    let mut items = Vec::new();
    for message in messages {
        match message.role {
            Role::Assistant => push_assistant_items(&mut items, &message.content),
            Role::User | Role::System => {
                let role = if message.role == Role::System {
                    "system"
                } else {
                    "user"
                };
                push_input_items(&mut items, role, &message.content);
            }
        }
    }
    items
}

fn push_assistant_items(items: &mut Vec<Value>, parts: &[Part]) {
    let mut text = Vec::new();
    let flush = |items: &mut Vec<Value>, text: &mut Vec<Value>| {
        if !text.is_empty() {
            items.push(json!({
                "type": "message",
                "role": "assistant",
                "content": std::mem::take(text),
            }));
        }
    };
    for part in parts {
        match part {
            Part::Text(t) => text.push(output_text(t)),
            Part::Thinking(thinking) => {
                flush(items, &mut text);
                items.push(json!({
                    "type": "reasoning",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": thinking.text}],
                }));
            }
            Part::ToolCall(call) => {
                flush(items, &mut text);
                items.push(json!({
                    "type": "function_call",
                    "call_id": call.id,
                    "name": call.name,
                    "arguments": call.arguments,
                }));
            }
            // Not part of an assistant turn.
            Part::Image(_) | Part::ToolResult(_) => {}
        }
    }
    flush(items, &mut text);
}

fn push_input_items(items: &mut Vec<Value>, role: &str, parts: &[Part]) {
    let mut content = Vec::new();
    let flush = |items: &mut Vec<Value>, content: &mut Vec<Value>| {
        if !content.is_empty() {
            items.push(json!({
                "type": "message",
                "role": role,
                "content": std::mem::take(content),
            }));
        }
    };
    for part in parts {
        match part {
            Part::Text(_) | Part::Image(_) => content.extend(input_part(part)),
            Part::ToolResult(result) => {
                flush(items, &mut content);
                let output = match result.content.as_slice() {
                    [Part::Text(text)] => json!(text),
                    parts => Value::Array(parts.iter().filter_map(input_part).collect()),
                };
                items.push(json!({
                    "type": "function_call_output",
                    "call_id": result.call_id,
                    "output": output,
                }));
            }
            // Not part of a user turn.
            Part::Thinking(_) | Part::ToolCall(_) => {}
        }
    }
    flush(items, &mut content);
}

/// An `input_text` or `input_image` content part.
fn input_part(part: &Part) -> Option<Value> {
    match part {
        Part::Text(text) => Some(json!({"type": "input_text", "text": text})),
        Part::Image(image) => Some(json!({"type": "input_image", "image_url": image.to_url()})),
        _ => None,
    }
}
