//! The provider-neutral form every dialect is translated through.
//!
//! Each client dialect converts to and from these types, and the backend form (OpenAI Chat
//! Completions) does too, so N dialects need N converters instead of N×N. The types keep only what
//! some backend can act on; dialect-only details (cache hints, beta flags) are dropped on the way in.

use serde_json::Value;

/// A generation request, whatever dialect it arrived in.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Request {
    /// The model name as the client sent it.
    pub model: String,
    /// Leading system prompt parts, in order (Anthropic `system` blocks, Responses `instructions`).
    pub system: Vec<String>,
    /// The conversation, oldest first.
    pub messages: Vec<Message>,
    /// Functions the model may call.
    pub tools: Vec<Tool>,
    /// How the model must use `tools`; `None` leaves it to the backend's default.
    pub tool_choice: Option<ToolChoice>,
    /// Whether several tool calls may come in one turn; `None` leaves it to the backend.
    pub parallel_tool_calls: Option<bool>,
    /// Sequences that end generation.
    pub stop: Vec<String>,
    /// Upper bound on generated tokens.
    pub max_tokens: Option<u64>,
    /// Sampling temperature.
    pub temperature: Option<f64>,
    /// Nucleus sampling mass.
    pub top_p: Option<f64>,
    /// Top-k sampling (Anthropic, llama-server, vLLM, Ollama; not in OpenAI's own API).
    pub top_k: Option<u64>,
    /// Whether the client wants an SSE stream.
    pub stream: bool,
    /// An end-user identifier for the backend's logs (`user`, Anthropic `metadata.user_id`).
    pub user: Option<String>,
}

/// Who speaks a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Instructions inside the conversation (OpenAI `system`/`developer` messages).
    System,
    /// The user, including tool results sent back to the model.
    User,
    /// The model, including its tool calls and reasoning.
    Assistant,
}

/// One turn of the conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// Who speaks.
    pub role: Role,
    /// What is said, in order.
    pub content: Vec<Part>,
}

/// A piece of message content.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    /// Plain text.
    Text(String),
    /// An image given to the model.
    Image(Image),
    /// A call the model made to one of the tools.
    ToolCall(ToolCall),
    /// The answer to a tool call, sent back by the client.
    ToolResult(ToolResult),
    /// The model's visible reasoning (Anthropic `thinking`, chat `reasoning_content`).
    Thinking(Thinking),
}

/// Where an image comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum Image {
    /// Inline bytes, base64-encoded.
    Base64 {
        /// `image/png`, `image/jpeg`, ...
        media_type: String,
        /// The base64 text, without a `data:` prefix.
        data: String,
    },
    /// A URL the backend fetches itself.
    Url(String),
}

/// A tool call made by the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The id the result must quote.
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments as JSON text. Kept as text, not parsed, because chat backends send text and
    /// a model may produce malformed JSON that must be passed on rather than rejected.
    pub arguments: String,
}

/// The outcome of a tool call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolResult {
    /// The id of the call this answers.
    pub call_id: String,
    /// The result: only [`Part::Text`] and [`Part::Image`] occur here.
    pub content: Vec<Part>,
    /// Whether the tool failed.
    pub is_error: bool,
}

/// Reasoning text the model produced before answering.
#[derive(Debug, Clone, PartialEq)]
pub struct Thinking {
    /// The reasoning.
    pub text: String,
    /// Anthropic's integrity signature, kept so a client's history survives a round trip.
    pub signature: Option<String>,
}

/// A function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    /// The function's name.
    pub name: String,
    /// What it does, for the model.
    pub description: Option<String>,
    /// JSON Schema of the arguments object.
    pub parameters: Value,
}

/// How the model must use the tools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides.
    Auto,
    /// No tool calls.
    None,
    /// At least one tool call (Anthropic `any`).
    Required,
    /// Exactly this tool.
    Named(String),
}

/// A complete (non-streamed) answer.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Response {
    /// The backend's id for the answer (client-facing ids are minted by the relay).
    pub id: String,
    /// The model that answered, as the backend names it.
    pub model: String,
    /// Unix seconds when the backend created the answer.
    pub created: u64,
    /// The assistant's output, in order.
    pub content: Vec<Part>,
    /// Why generation ended.
    pub stop_reason: StopReason,
    /// Token counts.
    pub usage: Usage,
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StopReason {
    /// The model finished its turn (chat `stop`).
    #[default]
    EndTurn,
    /// The token limit was hit (chat `length`).
    MaxTokens,
    /// The model wants tool results (chat `tool_calls`).
    ToolUse,
    /// A stop sequence matched. Chat backends report this as `stop`, so it only arrives from
    /// dialects that distinguish it.
    StopSequence,
    /// The backend's content filter ended the answer.
    ContentFilter,
}

/// Token counts of one exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// All prompt tokens, including those served from a cache.
    pub input_tokens: u64,
    /// Generated tokens, including reasoning.
    pub output_tokens: u64,
    /// Prompt tokens read from the backend's prompt cache.
    pub cache_read_tokens: u64,
    /// Prompt tokens written to a prompt cache (Anthropic only; chat backends report none).
    pub cache_creation_tokens: u64,
    /// Generated tokens spent on reasoning, where the backend reports it.
    pub reasoning_tokens: u64,
}

impl Usage {
    /// Input plus output tokens.
    pub fn total_tokens(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }
}

/// One step of a streamed answer, decoded from the backend's chat-completions chunks.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    /// The backend started answering; `model` is its own name for the model.
    Start {
        /// The backend's model name, if the chunk carried one.
        model: Option<String>,
    },
    /// More answer text.
    Text(String),
    /// More reasoning text.
    Thinking(String),
    /// A tool call begins or continues. Chat streams name the call once (id, name) and then send
    /// argument fragments under the same `index`.
    ToolCall {
        /// The backend's index of the call within this turn.
        index: u64,
        /// The call id, on the first fragment.
        id: Option<String>,
        /// The tool name, on the first fragment.
        name: Option<String>,
        /// A fragment of the arguments' JSON text.
        arguments: String,
    },
    /// Why generation ended (usage may still follow).
    Finish(StopReason),
    /// Token counts, usually in the last chunk.
    Usage(Usage),
    /// The backend reported an error inside the stream.
    Error(String),
}

impl Part {
    /// Text or reasoning with nothing in it. Chat backends send `""` content next to tool calls;
    /// Anthropic rejects empty text blocks when a client sends them back, and a stream never
    /// opens a block for them, so answers leave them out.
    pub(crate) fn is_blank(&self) -> bool {
        match self {
            Part::Text(text) => text.is_empty(),
            Part::Thinking(thinking) => thinking.text.is_empty(),
            _ => false,
        }
    }
}

impl Image {
    /// The image named by an OpenAI-style URL: a `data:<type>;base64,` URL becomes inline bytes so
    /// dialects that need them (Anthropic) get them; anything else stays a URL.
    pub fn from_url(url: &str) -> Image {
        let inline = url
            .strip_prefix("data:")
            .and_then(|rest| rest.split_once(";base64,"));
        match inline {
            Some((media_type, data)) => Image::Base64 {
                media_type: media_type.to_string(),
                data: data.to_string(),
            },
            None => Image::Url(url.to_string()),
        }
    }

    /// The image as an OpenAI-style URL (inline bytes as a `data:` URL).
    pub fn to_url(&self) -> String {
        match self {
            Image::Base64 { media_type, data } => format!("data:{media_type};base64,{data}"),
            Image::Url(url) => url.clone(),
        }
    }
}
