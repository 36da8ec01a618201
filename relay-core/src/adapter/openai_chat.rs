//! OpenAI Chat Completions ⇄ canonical: the backend form every local server speaks.
//!
//! `build_request` makes what is sent to the backend, `parse_response` reads its answer. The
//! other two directions (`parse_request`, `build_response`) serve a chat client from an
//! Anthropic upstream and let round trips be tested; a chat client in front of a chat backend is
//! passed through untouched by [`super::to_chat_request`].

use serde_json::{json, Map, Value};

use super::canonical::{
    Image, Message, Part, Request, Response, Role, StopReason, Thinking, Tool, ToolCall,
    ToolChoice, ToolResult, Usage,
};
use super::error::AdapterError;
use super::json::At;

/// Reads a chat-completions request.
pub fn parse_request(body: &Value) -> Result<Request, AdapterError> {
    let root = At::root(body);
    root.object()?;
    let mut request = Request {
        model: root.opt_str("model")?.unwrap_or_default().to_string(),
        ..Request::default()
    };
    for message in root.require("messages")?.items()? {
        request.messages.push(parse_message(&message)?);
    }
    if let Some(tools) = root.get("tools") {
        for tool in tools.items()? {
            request.tools.push(parse_tool(&tool)?);
        }
    }
    request.tool_choice = root
        .get("tool_choice")
        .map(|c| parse_tool_choice(&c))
        .transpose()?;
    request.parallel_tool_calls = root.opt_bool("parallel_tool_calls")?;
    request.stop = match root.get("stop") {
        None => Vec::new(),
        Some(stop) if stop.value().is_string() => vec![stop.str()?.to_string()],
        Some(stop) => strings(&stop)?,
    };
    request.max_tokens = match root.opt_u64("max_completion_tokens")? {
        Some(n) => Some(n),
        None => root.opt_u64("max_tokens")?,
    };
    request.temperature = root.opt_f64("temperature")?;
    request.top_p = root.opt_f64("top_p")?;
    request.top_k = root.opt_u64("top_k")?;
    request.stream = root.opt_bool("stream")?.unwrap_or(false);
    request.user = root.opt_str("user")?.map(str::to_string);
    Ok(request)
}

fn strings(at: &At) -> Result<Vec<String>, AdapterError> {
    at.items()?
        .iter()
        .map(|s| s.str().map(str::to_string))
        .collect()
}

fn parse_message(at: &At) -> Result<Message, AdapterError> {
    let role = at.require("role")?;
    match role.str()? {
        "system" | "developer" => Ok(Message {
            role: Role::System,
            content: text_parts(&at.require("content")?)?,
        }),
        "user" => Ok(Message {
            role: Role::User,
            content: user_parts(&at.require("content")?)?,
        }),
        "assistant" => Ok(Message {
            role: Role::Assistant,
            content: assistant_parts(at)?,
        }),
        "tool" => Ok(Message {
            role: Role::User,
            content: vec![Part::ToolResult(ToolResult {
                call_id: at.require("tool_call_id")?.str()?.to_string(),
                content: text_parts(&at.require("content")?)?,
                is_error: false,
            })],
        }),
        other => Err(role.error(format!("{other} is not supported"))),
    }
}

/// Content that may only be text: a string or an array of `text` parts.
fn text_parts(at: &At) -> Result<Vec<Part>, AdapterError> {
    if let Some(text) = at.value().as_str() {
        return Ok(vec![Part::Text(text.to_string())]);
    }
    at.items()?
        .iter()
        .map(|part| match part.kind()? {
            "text" => Ok(Part::Text(part.require("text")?.str()?.to_string())),
            other => Err(part.unsupported_type(other)),
        })
        .collect()
}

fn user_parts(at: &At) -> Result<Vec<Part>, AdapterError> {
    if let Some(text) = at.value().as_str() {
        return Ok(vec![Part::Text(text.to_string())]);
    }
    at.items()?
        .iter()
        .map(|part| match part.kind()? {
            "text" => Ok(Part::Text(part.require("text")?.str()?.to_string())),
            "image_url" => {
                let image = part.require("image_url")?;
                // Some clients send the URL directly instead of `{"url": ...}`.
                let url = match image.value().as_str() {
                    Some(url) => url,
                    None => image.require("url")?.str()?,
                };
                Ok(Part::Image(Image::from_url(url)))
            }
            other => Err(part.unsupported_type(other)),
        })
        .collect()
}

/// An assistant turn: reasoning first (it came first), then text, then tool calls — the order a
/// chat message implies.
fn assistant_parts(at: &At) -> Result<Vec<Part>, AdapterError> {
    let mut parts = Vec::new();
    // vLLM and llama-server say `reasoning_content`; Ollama and newer vLLM say `reasoning`.
    let reasoning = match at.opt_str("reasoning_content")? {
        Some(text) => Some(text),
        None => at.opt_str("reasoning")?,
    };
    if let Some(text) = reasoning {
        parts.push(Part::Thinking(Thinking {
            text: text.to_string(),
            signature: None,
        }));
    }
    if let Some(content) = at.get("content") {
        if let Some(text) = content.value().as_str() {
            parts.push(Part::Text(text.to_string()));
        } else {
            for part in content.items()? {
                let text = match part.kind()? {
                    "text" => part.require("text")?,
                    "refusal" => part.require("refusal")?,
                    other => return Err(part.unsupported_type(other)),
                };
                parts.push(Part::Text(text.str()?.to_string()));
            }
        }
    }
    if let Some(calls) = at.get("tool_calls") {
        for call in calls.items()? {
            parts.push(Part::ToolCall(parse_tool_call(&call)?));
        }
    }
    Ok(parts)
}

fn parse_tool_call(at: &At) -> Result<ToolCall, AdapterError> {
    if let Some(kind) = at.opt_str("type")? {
        if kind != "function" {
            return Err(at.unsupported_type(kind));
        }
    }
    let function = at.require("function")?;
    let arguments = match function.get("arguments") {
        None => String::new(),
        Some(args) => match args.value().as_str() {
            Some(text) => text.to_string(),
            // A few clients send the arguments as an object; chat backends want text.
            None => args.value().to_string(),
        },
    };
    Ok(ToolCall {
        id: at.opt_str("id")?.unwrap_or_default().to_string(),
        name: function.require("name")?.str()?.to_string(),
        arguments,
    })
}

fn parse_tool(at: &At) -> Result<Tool, AdapterError> {
    if let Some(kind) = at.opt_str("type")? {
        if kind != "function" {
            return Err(at.unsupported_type(kind));
        }
    }
    let function = at.require("function")?;
    Ok(Tool {
        name: function.require("name")?.str()?.to_string(),
        description: function.opt_str("description")?.map(str::to_string),
        parameters: function
            .get("parameters")
            .map(|p| p.value().clone())
            .unwrap_or_else(empty_schema),
    })
}

/// The schema of a tool that takes no arguments.
pub(crate) fn empty_schema() -> Value {
    json!({"type": "object", "properties": {}})
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
        "function" => Ok(ToolChoice::Named(
            at.require("function")?.require("name")?.str()?.to_string(),
        )),
        other => Err(at.unsupported_type(other)),
    }
}

/// The chat-completions request for `request`: what a backend is sent.
///
/// Top-level system parts become one leading system message (many local chat templates accept
/// only one, and only first). Tool results become `tool` messages; images inside a tool result
/// follow in a user message, because chat `tool` messages carry only text.
pub fn build_request(request: &Request) -> Value {
    let mut out = Map::new();
    out.insert("model".into(), json!(request.model));
    let mut messages = Vec::new();
    if !request.system.is_empty() {
        messages.push(json!({"role": "system", "content": request.system.join("\n\n")}));
    }
    for message in &request.messages {
        push_message(&mut messages, message);
    }
    out.insert("messages".into(), Value::Array(messages));
    if request.stream {
        out.insert("stream".into(), json!(true));
    }
    if let Some(n) = request.max_tokens {
        out.insert("max_tokens".into(), json!(n));
    }
    if let Some(t) = request.temperature {
        out.insert("temperature".into(), json!(t));
    }
    if let Some(p) = request.top_p {
        out.insert("top_p".into(), json!(p));
    }
    if let Some(k) = request.top_k {
        out.insert("top_k".into(), json!(k));
    }
    if !request.stop.is_empty() {
        out.insert("stop".into(), json!(request.stop));
    }
    if !request.tools.is_empty() {
        let tools: Vec<Value> = request.tools.iter().map(build_tool).collect();
        out.insert("tools".into(), Value::Array(tools));
    }
    if let Some(choice) = &request.tool_choice {
        out.insert("tool_choice".into(), build_tool_choice(choice));
    }
    if let Some(parallel) = request.parallel_tool_calls {
        out.insert("parallel_tool_calls".into(), json!(parallel));
    }
    if let Some(user) = &request.user {
        out.insert("user".into(), json!(user));
    }
    Value::Object(out)
}

fn push_message(messages: &mut Vec<Value>, message: &Message) {
    match message.role {
        Role::System => messages.push(json!({
            "role": "system",
            "content": joined_text(&message.content),
        })),
        Role::Assistant => messages.push(assistant_message(&message.content)),
        Role::User => {
            let mut rest = Vec::new();
            for part in &message.content {
                match part {
                    Part::ToolResult(result) => {
                        let mut text = joined_text(&result.content);
                        if result.is_error {
                            // Chat has no error flag; say it in the text the model reads.
                            text = format!("Error: {text}");
                        }
                        messages.push(json!({
                            "role": "tool",
                            "tool_call_id": result.call_id,
                            "content": text,
                        }));
                        rest.extend(
                            result
                                .content
                                .iter()
                                .filter(|p| matches!(p, Part::Image(_)))
                                .cloned(),
                        );
                    }
                    other => rest.push(other.clone()),
                }
            }
            if !rest.is_empty() {
                messages.push(json!({"role": "user", "content": user_content(&rest)}));
            }
        }
    }
}

/// Text parts joined by blank lines: how separate blocks read when they must become one string.
fn joined_text(parts: &[Part]) -> String {
    let texts: Vec<&str> = parts
        .iter()
        .filter_map(|p| match p {
            Part::Text(text) => Some(text.as_str()),
            _ => None,
        })
        .collect();
    texts.join("\n\n")
}

/// A lone text stays a plain string (what every backend accepts); anything else is a part list.
fn user_content(parts: &[Part]) -> Value {
    if let [Part::Text(text)] = parts {
        return json!(text);
    }
    let parts: Vec<Value> = parts
        .iter()
        .filter_map(|part| match part {
            Part::Text(text) => Some(json!({"type": "text", "text": text})),
            Part::Image(image) => {
                Some(json!({"type": "image_url", "image_url": {"url": image.to_url()}}))
            }
            _ => None,
        })
        .collect();
    Value::Array(parts)
}

fn assistant_message(content: &[Part]) -> Value {
    let mut out = Map::new();
    out.insert("role".into(), json!("assistant"));
    let has_text = content.iter().any(|p| matches!(p, Part::Text(_)));
    let text = if has_text {
        json!(joined_text(content))
    } else {
        Value::Null
    };
    out.insert("content".into(), text);
    let reasoning: Vec<&str> = content
        .iter()
        .filter_map(|p| match p {
            Part::Thinking(t) => Some(t.text.as_str()),
            _ => None,
        })
        .collect();
    if !reasoning.is_empty() {
        out.insert("reasoning_content".into(), json!(reasoning.join("\n\n")));
    }
    let calls: Vec<Value> = content
        .iter()
        .filter_map(|p| match p {
            Part::ToolCall(call) => Some(json!({
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            })),
            _ => None,
        })
        .collect();
    if !calls.is_empty() {
        out.insert("tool_calls".into(), Value::Array(calls));
    }
    Value::Object(out)
}

fn build_tool(tool: &Tool) -> Value {
    let mut function = Map::new();
    function.insert("name".into(), json!(tool.name));
    if let Some(description) = &tool.description {
        function.insert("description".into(), json!(description));
    }
    let mut parameters = tool.parameters.clone();
    if let Some(schema) = parameters.as_object_mut() {
        // `$schema` only names the JSON Schema dialect; some backends' schema-to-grammar
        // converters reject keywords they do not know, and dropping it changes no meaning.
        schema.remove("$schema");
    }
    function.insert("parameters".into(), parameters);
    json!({"type": "function", "function": function})
}

fn build_tool_choice(choice: &ToolChoice) -> Value {
    match choice {
        ToolChoice::Auto => json!("auto"),
        ToolChoice::None => json!("none"),
        ToolChoice::Required => json!("required"),
        ToolChoice::Named(name) => json!({"type": "function", "function": {"name": name}}),
    }
}

/// Reads a complete chat-completions answer (the first choice).
pub fn parse_response(body: &Value) -> Result<Response, AdapterError> {
    let root = At::root(body);
    root.object()?;
    let choices = root.require("choices")?;
    let choice = choices
        .items()?
        .into_iter()
        .next()
        .ok_or_else(|| choices.error("expected at least one choice"))?;
    let content = assistant_parts(&choice.require("message")?)?;
    let has_calls = content.iter().any(|p| matches!(p, Part::ToolCall(_)));
    let finish = choice.opt_str("finish_reason")?.map(stop_reason);
    Ok(Response {
        id: root.opt_str("id")?.unwrap_or_default().to_string(),
        model: root.opt_str("model")?.unwrap_or_default().to_string(),
        created: root.opt_u64("created")?.unwrap_or(0),
        content,
        stop_reason: settle_stop_reason(finish, has_calls),
        usage: body.get("usage").map(parse_usage).unwrap_or_default(),
    })
}

/// The canonical stop reason of a chat `finish_reason`.
pub(crate) fn stop_reason(finish_reason: &str) -> StopReason {
    match finish_reason {
        "length" => StopReason::MaxTokens,
        "tool_calls" | "function_call" => StopReason::ToolUse,
        "content_filter" => StopReason::ContentFilter,
        _ => StopReason::EndTurn,
    }
}

/// The stop reason to report: some backends (older Ollama, some llama-server templates) say
/// `stop` after tool calls, but clients only run tools on `tool_use`/`tool_calls`.
pub(crate) fn settle_stop_reason(finish: Option<StopReason>, has_tool_calls: bool) -> StopReason {
    match finish {
        None | Some(StopReason::EndTurn) if has_tool_calls => StopReason::ToolUse,
        Some(reason) => reason,
        None => StopReason::EndTurn,
    }
}

/// Token counts from a chat `usage` object; missing numbers count as zero.
pub(crate) fn parse_usage(usage: &Value) -> Usage {
    let number = |path: &[&str]| {
        let mut value = usage;
        for key in path {
            value = match value.get(key) {
                Some(v) => v,
                None => return 0,
            };
        }
        value.as_u64().unwrap_or(0)
    };
    Usage {
        input_tokens: number(&["prompt_tokens"]),
        output_tokens: number(&["completion_tokens"]),
        cache_read_tokens: number(&["prompt_tokens_details", "cached_tokens"]),
        cache_creation_tokens: 0,
        reasoning_tokens: number(&["completion_tokens_details", "reasoning_tokens"]),
    }
}

/// The chat-completions answer for `response`.
pub fn build_response(response: &Response) -> Value {
    json!({
        "id": response.id,
        "object": "chat.completion",
        "created": response.created,
        "model": response.model,
        "choices": [{
            "index": 0,
            "message": assistant_message(&response.content),
            "finish_reason": finish_reason(response.stop_reason),
        }],
        "usage": usage_object(&response.usage),
    })
}

/// Chat's `finish_reason` for a stop reason.
pub(crate) fn finish_reason(reason: StopReason) -> &'static str {
    match reason {
        StopReason::EndTurn | StopReason::StopSequence => "stop",
        StopReason::MaxTokens => "length",
        StopReason::ToolUse => "tool_calls",
        StopReason::ContentFilter => "content_filter",
    }
}

/// A chat `usage` object; the detail objects only when there is something in them.
pub(crate) fn usage_object(usage: &Usage) -> Value {
    let mut out = json!({
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.total_tokens(),
    });
    if usage.cache_read_tokens > 0 {
        out["prompt_tokens_details"] = json!({"cached_tokens": usage.cache_read_tokens});
    }
    if usage.reasoning_tokens > 0 {
        out["completion_tokens_details"] = json!({"reasoning_tokens": usage.reasoning_tokens});
    }
    out
}
