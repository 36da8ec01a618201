//! Anthropic Messages ⇄ canonical.
//!
//! `parse_request` and `build_response` serve an Anthropic client (Claude Code, the SDKs) from a
//! chat backend. The reverse direction serves OpenAI clients from an Anthropic upstream:
//! `build_upstream_request` makes what the upstream is sent, `parse_response` reads its answer
//! (its streams are decoded by the adapter's stream module).

use serde_json::{json, Map, Value};

use super::canonical::{
    Image, Message, Part, Request, Response, Role, StopReason, Thinking, Tool, ToolCall,
    ToolChoice, ToolResult, Usage,
};
use super::error::AdapterError;
use super::json::At;
use super::openai_chat::empty_schema;
use super::Identity;

/// Reads a Messages request.
///
/// Dropped without error, because a chat backend has no use for them: `cache_control`,
/// Claude Code's billing line in `system` ([`without_billing_header`]),
/// `metadata` (except `user_id`), `thinking` and `output_config` settings, `context_management`,
/// `redacted_thinking` blocks, citations, and server-side tools (`web_search_*`, ...) — a tool
/// the backend cannot run only narrows what the model may do, which beats failing an agent's
/// whole request. A `system`-role entry inside `messages` (Claude Code sends one) joins the
/// system prompt: local chat templates often reject system messages after the first turn.
pub fn parse_request(body: &Value) -> Result<Request, AdapterError> {
    let root = At::root(body);
    root.object()?;
    let mut request = Request {
        model: root.opt_str("model")?.unwrap_or_default().to_string(),
        max_tokens: root.opt_u64("max_tokens")?,
        temperature: root.opt_f64("temperature")?,
        top_p: root.opt_f64("top_p")?,
        top_k: root.opt_u64("top_k")?,
        stream: root.opt_bool("stream")?.unwrap_or(false),
        ..Request::default()
    };
    if let Some(stop) = root.get("stop_sequences") {
        for s in stop.items()? {
            request.stop.push(s.str()?.to_string());
        }
    }
    if let Some(metadata) = root.get("metadata") {
        request.user = metadata.opt_str("user_id")?.map(str::to_string);
    }
    if let Some(system) = root.get("system") {
        request.system = system_texts(&system)?;
    }
    for message in root.require("messages")?.items()? {
        let role = message.require("role")?;
        let content = message.require("content")?;
        let role = match role.str()? {
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "system" => {
                request.system.extend(system_texts(&content)?);
                continue;
            }
            other => return Err(role.error(format!("{other} is not supported"))),
        };
        request.messages.push(Message {
            role,
            content: content_parts(&content)?,
        });
    }
    if let Some(tools) = root.get("tools") {
        for tool in tools.items()? {
            if let Some(tool) = parse_tool(&tool)? {
                request.tools.push(tool);
            }
        }
    }
    if let Some(choice) = root.get("tool_choice") {
        let (choice, parallel) = parse_tool_choice(&choice)?;
        request.tool_choice = Some(choice);
        request.parallel_tool_calls = parallel;
    }
    Ok(request)
}

/// `system`: a string or a list of text blocks, without Claude Code's billing line.
fn system_texts(at: &At) -> Result<Vec<String>, AdapterError> {
    let texts = match at.value().as_str() {
        Some(text) => vec![text],
        None => at
            .items()?
            .iter()
            .map(|block| match block.kind()? {
                "text" => block.require("text")?.str(),
                other => Err(block.unsupported_type(other)),
            })
            .collect::<Result<_, _>>()?,
    };
    // A block that was nothing but the billing line goes; an empty block the client sent stays.
    Ok(texts
        .into_iter()
        .filter_map(|text| match without_billing_header(text) {
            "" if !text.is_empty() => None,
            rest => Some(rest.to_string()),
        })
        .collect())
}

/// How Claude Code's billing line starts: `x-anthropic-billing-header: cc_version=…;
/// cc_entrypoint=…;`, the first block of its system prompt.
pub const BILLING_HEADER: &str = "x-anthropic-billing-header:";

/// The field of the billing line that marks a subagent's request.
pub const SUBAGENT_FIELD: &str = "cc_is_subagent=true";

/// Whether `text` opens with a Claude Code billing line that marks a subagent's request
/// (`cc_is_subagent=true`): its Task tool's conversation of its own, sent on the main model
/// under the main conversation's session id.
pub fn marks_a_subagent(text: &str) -> bool {
    text.strip_prefix(BILLING_HEADER)
        .and_then(|rest| rest.lines().next())
        .is_some_and(|line| line.split(';').any(|field| field.trim() == SUBAGENT_FIELD))
}

/// `text` without a leading Claude Code billing line (and the blank lines after it).
///
/// The line is Anthropic's attribution, meaningless to a local model. Against Anthropic's own
/// URL (or a gateway that claims to be it) Claude Code also puts a hash of the request and turn
/// counters in it (`cch=`, `cc_prev_req=`, `cc_prompt_index=`, ...), so it changes with every
/// request. As the first thing a prompt says, that would make every turn's prompt differ from
/// its first token on, and a backend's prompt cache would keep nothing of the conversation.
/// (llama-server's own `/v1/messages` blanks `cch=` alone; the relay translates Claude Code's
/// requests itself to pin them to slots, so it drops the line.)
pub fn without_billing_header(text: &str) -> &str {
    if !text.starts_with(BILLING_HEADER) {
        return text;
    }
    match text.split_once('\n') {
        Some((_, rest)) => rest.trim_start_matches(['\r', '\n']),
        None => "",
    }
}

/// Message content: a string or a list of blocks.
fn content_parts(at: &At) -> Result<Vec<Part>, AdapterError> {
    if let Some(text) = at.value().as_str() {
        return Ok(vec![Part::Text(text.to_string())]);
    }
    let mut parts = Vec::new();
    for block in at.items()? {
        if let Some(part) = parse_block(&block)? {
            parts.push(part);
        }
    }
    Ok(parts)
}

fn parse_block(at: &At) -> Result<Option<Part>, AdapterError> {
    let part = match at.kind()? {
        "text" => Part::Text(at.require("text")?.str()?.to_string()),
        "image" => Part::Image(parse_image(&at.require("source")?)?),
        "document" => Part::Text(parse_text_document(&at.require("source")?)?),
        "tool_use" => Part::ToolCall(ToolCall {
            id: at.require("id")?.str()?.to_string(),
            name: at.require("name")?.str()?.to_string(),
            arguments: at
                .get("input")
                .map(|input| input.object().map(|_| input.value().to_string()))
                .transpose()?
                .unwrap_or_else(|| "{}".to_string()),
        }),
        "tool_result" => Part::ToolResult(ToolResult {
            call_id: at.require("tool_use_id")?.str()?.to_string(),
            content: match at.get("content") {
                Some(content) => tool_result_parts(&content)?,
                None => Vec::new(),
            },
            is_error: at.opt_bool("is_error")?.unwrap_or(false),
        }),
        "thinking" => Part::Thinking(Thinking {
            text: at.require("thinking")?.str()?.to_string(),
            signature: at.opt_str("signature")?.map(str::to_string),
        }),
        // Encrypted reasoning only Anthropic's own models can read.
        "redacted_thinking" => return Ok(None),
        other => return Err(at.unsupported_type(other)),
    };
    Ok(Some(part))
}

fn tool_result_parts(at: &At) -> Result<Vec<Part>, AdapterError> {
    if let Some(text) = at.value().as_str() {
        return Ok(vec![Part::Text(text.to_string())]);
    }
    at.items()?
        .iter()
        .map(|block| match block.kind()? {
            "text" => Ok(Part::Text(block.require("text")?.str()?.to_string())),
            "image" => Ok(Part::Image(parse_image(&block.require("source")?)?)),
            // A tool search result naming a deferred tool. The backend is offered every tool up
            // front, so the reference only needs to read as what it means.
            "tool_reference" => Ok(Part::Text(format!(
                "Tool {} is available.",
                block.require("tool_name")?.str()?
            ))),
            other => Err(block.unsupported_type(other)),
        })
        .collect()
}

fn parse_image(source: &At) -> Result<Image, AdapterError> {
    match source.kind()? {
        "base64" => Ok(Image::Base64 {
            media_type: source.require("media_type")?.str()?.to_string(),
            data: source.require("data")?.str()?.to_string(),
        }),
        "url" => Ok(Image::Url(source.require("url")?.str()?.to_string())),
        other => Err(source.unsupported_type(other)),
    }
}

/// A plain-text document is just text to a chat model; PDFs and file references are not.
fn parse_text_document(source: &At) -> Result<String, AdapterError> {
    let kind = source.kind()?;
    if kind != "text" {
        return Err(source.field_error(
            "type",
            format!("documents with a {kind} source are not supported"),
        ));
    }
    Ok(source.require("data")?.str()?.to_string())
}

/// A tool, or `None` for a server-side tool the backend cannot run (see [`parse_request`]).
fn parse_tool(at: &At) -> Result<Option<Tool>, AdapterError> {
    match at.opt_str("type")? {
        None | Some("custom") => {}
        Some(_) => return Ok(None),
    }
    Ok(Some(Tool {
        name: at.require("name")?.str()?.to_string(),
        description: at.opt_str("description")?.map(str::to_string),
        parameters: at
            .get("input_schema")
            .map(|s| s.value().clone())
            .unwrap_or_else(empty_schema),
    }))
}

fn parse_tool_choice(at: &At) -> Result<(ToolChoice, Option<bool>), AdapterError> {
    let choice = match at.kind()? {
        "auto" => ToolChoice::Auto,
        "any" => ToolChoice::Required,
        "none" => ToolChoice::None,
        "tool" => ToolChoice::Named(at.require("name")?.str()?.to_string()),
        other => return Err(at.unsupported_type(other)),
    };
    // Only an explicit `true` changes anything; `false` is the default.
    let parallel = match at.opt_bool("disable_parallel_tool_use")? {
        Some(true) => Some(false),
        _ => None,
    };
    Ok((choice, parallel))
}

/// The Messages request for `request`. System-role messages join the top-level `system`, the
/// only place Anthropic takes them; consecutive messages of one role are merged, since turns
/// alternate there; content is always written as a block list.
pub fn build_request(request: &Request) -> Value {
    let mut out = Map::new();
    out.insert("model".into(), json!(request.model));
    let mut system: Vec<Value> = request
        .system
        .iter()
        .map(|text| json!({"type": "text", "text": text}))
        .collect();
    let mut messages: Vec<Value> = Vec::new();
    for message in &request.messages {
        let role = match message.role {
            Role::System => {
                system.extend(message.content.iter().map(|p| block(p, false)));
                continue;
            }
            Role::User => "user",
            Role::Assistant => "assistant",
        };
        let content = message.content.iter().map(|p| block(p, false));
        match messages.last_mut() {
            // Chat's one-message-per-tool-result becomes one user turn holding all results, the
            // shape Anthropic expects after a turn with several tool calls.
            Some(last) if last["role"] == role => {
                if let Some(blocks) = last["content"].as_array_mut() {
                    blocks.extend(content);
                }
            }
            _ => messages.push(json!({"role": role, "content": content.collect::<Vec<_>>()})),
        }
    }
    if !system.is_empty() {
        out.insert("system".into(), Value::Array(system));
    }
    out.insert("messages".into(), Value::Array(messages));
    if let Some(n) = request.max_tokens {
        out.insert("max_tokens".into(), json!(n));
    }
    if !request.stop.is_empty() {
        out.insert("stop_sequences".into(), json!(request.stop));
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
    if request.stream {
        out.insert("stream".into(), json!(true));
    }
    if !request.tools.is_empty() {
        let tools: Vec<Value> = request.tools.iter().map(build_tool).collect();
        out.insert("tools".into(), Value::Array(tools));
    }
    if let Some(choice) = build_tool_choice(request) {
        out.insert("tool_choice".into(), choice);
    }
    if let Some(user) = &request.user {
        out.insert("metadata".into(), json!({"user_id": user}));
    }
    Value::Object(out)
}

fn build_tool(tool: &Tool) -> Value {
    let mut out = Map::new();
    out.insert("name".into(), json!(tool.name));
    if let Some(description) = &tool.description {
        out.insert("description".into(), json!(description));
    }
    out.insert("input_schema".into(), tool.parameters.clone());
    Value::Object(out)
}

fn build_tool_choice(request: &Request) -> Option<Value> {
    let no_parallel = request.parallel_tool_calls == Some(false);
    let mut choice = match (&request.tool_choice, no_parallel) {
        (None, false) => return None,
        (None, true) | (Some(ToolChoice::Auto), _) => json!({"type": "auto"}),
        (Some(ToolChoice::None), _) => json!({"type": "none"}),
        (Some(ToolChoice::Required), _) => json!({"type": "any"}),
        (Some(ToolChoice::Named(name)), _) => json!({"type": "tool", "name": name}),
    };
    if no_parallel {
        choice["disable_parallel_tool_use"] = json!(true);
    }
    Some(choice)
}

/// The content block for `part`. A response always carries a thinking `signature` (the SDKs'
/// types require it); a request carries one only if it had one.
fn block(part: &Part, response: bool) -> Value {
    match part {
        Part::Text(text) => json!({"type": "text", "text": text}),
        Part::Image(image) => json!({"type": "image", "source": image_source(image)}),
        Part::ToolCall(call) => json!({
            "type": "tool_use",
            "id": call.id,
            "name": call.name,
            "input": tool_input(&call.arguments),
        }),
        Part::ToolResult(result) => {
            let content: Vec<Value> = result.content.iter().map(|p| block(p, response)).collect();
            let mut out = json!({
                "type": "tool_result",
                "tool_use_id": result.call_id,
                "content": content,
            });
            if result.is_error {
                out["is_error"] = json!(true);
            }
            out
        }
        Part::Thinking(thinking) => {
            let mut out = json!({"type": "thinking", "thinking": thinking.text});
            match (&thinking.signature, response) {
                (Some(signature), _) => out["signature"] = json!(signature),
                (None, true) => out["signature"] = json!(""),
                (None, false) => {}
            }
            out
        }
    }
}

fn image_source(image: &Image) -> Value {
    match image {
        Image::Base64 { media_type, data } => {
            json!({"type": "base64", "media_type": media_type, "data": data})
        }
        Image::Url(url) => json!({"type": "url", "url": url}),
    }
}

/// A `tool_use.input` object from chat argument text. Empty text means no arguments. Text that is
/// not a JSON object (a model's malformed output) is passed on under `_raw_arguments` instead of
/// failing the answer: the client's tool-input validation then tells the model what went wrong.
pub(crate) fn tool_input(arguments: &str) -> Value {
    if arguments.trim().is_empty() {
        return json!({});
    }
    match serde_json::from_str::<Value>(arguments) {
        Ok(value @ Value::Object(_)) => value,
        _ => json!({"_raw_arguments": arguments}),
    }
}

/// The Messages answer for `response`, under the client-facing `model` name.
pub fn build_response(response: &Response, model: &str, identity: &Identity) -> Value {
    let content: Vec<Value> = response
        .content
        .iter()
        .filter(|p| !p.is_blank())
        .map(|p| block(p, true))
        .collect();
    json!({
        "id": message_id(identity),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason_name(response.stop_reason),
        "stop_sequence": null,
        "usage": usage_object(&response.usage),
    })
}

/// The client-facing message id.
pub(crate) fn message_id(identity: &Identity) -> String {
    format!("msg_{}", identity.id)
}

/// Anthropic's name for a stop reason.
pub(crate) fn stop_reason_name(reason: StopReason) -> &'static str {
    match reason {
        StopReason::EndTurn => "end_turn",
        StopReason::MaxTokens => "max_tokens",
        StopReason::ToolUse => "tool_use",
        StopReason::StopSequence => "stop_sequence",
        StopReason::ContentFilter => "refusal",
    }
}

/// A full Anthropic usage object. Anthropic's `input_tokens` excludes cached tokens, which it
/// reports separately; clients add the three up for the context size.
pub(crate) fn usage_object(usage: &Usage) -> Value {
    let uncached = usage
        .input_tokens
        .saturating_sub(usage.cache_read_tokens)
        .saturating_sub(usage.cache_creation_tokens);
    json!({
        "input_tokens": uncached,
        "output_tokens": usage.output_tokens,
        "cache_creation_input_tokens": usage.cache_creation_tokens,
        "cache_read_input_tokens": usage.cache_read_tokens,
    })
}

/// Output tokens asked for when the client set no limit: Anthropic requires `max_tokens`, and
/// every Claude model can produce at least this many.
pub const DEFAULT_UPSTREAM_MAX_TOKENS: u64 = 4096;

/// The Messages request an Anthropic upstream is sent for `request` (from an OpenAI client).
///
/// Anthropic's API is stricter than chat servers, so what it would refuse is left out rather
/// than sent: empty text (chat assistant turns carry `""` next to tool calls), reasoning
/// without a signature (chat history has none, and Anthropic only takes signed thinking back),
/// and turns left with no content. `max_tokens` gets [`DEFAULT_UPSTREAM_MAX_TOKENS`] if unset.
pub fn build_upstream_request(request: &Request) -> Value {
    let mut request = request.clone();
    for message in &mut request.messages {
        message.content.retain(accepted_upstream);
        for part in &mut message.content {
            if let Part::ToolResult(result) = part {
                result.content.retain(accepted_upstream);
            }
        }
    }
    request.messages.retain(|m| !m.content.is_empty());
    request.max_tokens = request.max_tokens.or(Some(DEFAULT_UPSTREAM_MAX_TOKENS));
    build_request(&request)
}

/// Whether Anthropic accepts `part` in a request.
fn accepted_upstream(part: &Part) -> bool {
    match part {
        Part::Thinking(thinking) => thinking.signature.is_some() && !part.is_blank(),
        _ => !part.is_blank(),
    }
}

/// Reads a complete Messages answer (from an Anthropic upstream).
///
/// Blocks a chat backend has no counterpart for (`redacted_thinking`, server tool calls and
/// their results) are skipped: the client could not send them back anyway.
pub fn parse_response(body: &Value) -> Result<Response, AdapterError> {
    let root = At::root(body);
    root.object()?;
    let mut content = Vec::new();
    for block in root.require("content")?.items()? {
        if matches!(block.kind()?, "text" | "thinking" | "tool_use") {
            content.extend(parse_block(&block)?);
        }
    }
    Ok(Response {
        id: root.opt_str("id")?.unwrap_or_default().to_string(),
        model: root.opt_str("model")?.unwrap_or_default().to_string(),
        created: 0,
        content,
        stop_reason: root
            .opt_str("stop_reason")?
            .map(stop_reason)
            .unwrap_or_default(),
        usage: body.get("usage").map(parse_usage).unwrap_or_default(),
    })
}

/// The canonical stop reason of an Anthropic `stop_reason`. `pause_turn` (a server tool paused
/// the turn) ends it as it stands; a full context window is a length stop.
pub(crate) fn stop_reason(name: &str) -> StopReason {
    match name {
        "max_tokens" | "model_context_window_exceeded" => StopReason::MaxTokens,
        "tool_use" => StopReason::ToolUse,
        "stop_sequence" => StopReason::StopSequence,
        "refusal" => StopReason::ContentFilter,
        _ => StopReason::EndTurn,
    }
}

/// Token counts from an Anthropic usage object (the inverse of [`usage_object`]): its
/// `input_tokens` leaves out cached tokens, the canonical count includes them.
pub(crate) fn parse_usage(usage: &Value) -> Usage {
    let number = |key: &str| usage.get(key).and_then(Value::as_u64).unwrap_or(0);
    let cache_read_tokens = number("cache_read_input_tokens");
    let cache_creation_tokens = number("cache_creation_input_tokens");
    Usage {
        input_tokens: number("input_tokens")
            .saturating_add(cache_read_tokens)
            .saturating_add(cache_creation_tokens),
        output_tokens: number("output_tokens"),
        cache_read_tokens,
        cache_creation_tokens,
        reasoning_tokens: 0,
    }
}
