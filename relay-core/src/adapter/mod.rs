//! Protocol adapter: serves Anthropic Messages and OpenAI Responses clients from backends that
//! speak only OpenAI Chat Completions, and OpenAI clients from Anthropic upstreams.
//!
//! Everything here is pure (no I/O): the worker calls [`client_api_for_path`] to learn whether a
//! request needs translating, [`to_backend_request`] for the body it sends the backend, and then
//! [`from_backend_response`] for a complete answer or a [`StreamTranslator`] fed the backend's
//! SSE text chunk by chunk. The backend speaks a [`BackendApi`]: chat completions (local servers,
//! OpenAI-compatible upstreams) or Anthropic Messages (Anthropic upstreams). Every dialect goes
//! through one provider-neutral form in [`canonical`].
//!
//! Errors are [`AdapterError`]s naming the offending field, for a 400 in the client's dialect.

pub mod anthropic_messages;
pub mod canonical;
mod error;
mod json;
pub mod openai_chat;
pub mod openai_responses;
pub mod sse;
mod stream;

#[cfg(test)]
mod tests;

use crate::endpoint::Endpoint;
use serde_json::{json, Value};

pub use error::AdapterError;
pub use stream::StreamTranslator;

/// The API a client speaks, as chosen by the request path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientApi {
    /// `POST /v1/chat/completions`: the backend's own form, passed through.
    OpenAiChat,
    /// `POST /v1/messages`.
    AnthropicMessages,
    /// `POST /v1/responses`.
    OpenAiResponses,
}

/// The API a backend is sent translated requests in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendApi {
    /// `POST /v1/chat/completions`: what every local server speaks.
    OpenAiChat,
    /// `POST /v1/messages`: an Anthropic upstream.
    AnthropicMessages,
}

impl BackendApi {
    /// The route translated requests go to.
    pub fn path(self) -> &'static str {
        match self {
            BackendApi::OpenAiChat => "/v1/chat/completions",
            BackendApi::AnthropicMessages => "/v1/messages",
        }
    }
}

impl ClientApi {
    /// The generation API of an endpoint; `None` for everything the adapter does not translate:
    /// other routes, and sub-resources such as `count_tokens` or a stored response.
    pub fn of(endpoint: Endpoint) -> Option<ClientApi> {
        match endpoint {
            Endpoint::ChatCompletions => Some(ClientApi::OpenAiChat),
            Endpoint::Messages => Some(ClientApi::AnthropicMessages),
            Endpoint::Responses => Some(ClientApi::OpenAiResponses),
            _ => None,
        }
    }
}

/// The chat-completions body to send a backend for a client's request `body`.
///
/// A chat request is returned unchanged: the backend speaks that dialect, and a round trip
/// through the canonical form would only lose fields it does not model (`response_format`,
/// `seed`, `logprobs`, ...). Translated streaming requests ask for usage in the stream
/// (`stream_options.include_usage`), which the Anthropic and Responses events report.
pub fn to_chat_request(api: ClientApi, body: &Value) -> Result<Value, AdapterError> {
    let request = match api {
        ClientApi::OpenAiChat => return Ok(body.clone()),
        ClientApi::AnthropicMessages => anthropic_messages::parse_request(body)?,
        ClientApi::OpenAiResponses => openai_responses::parse_request(body)?,
    };
    Ok(chat_request_for(&request))
}

/// The body to send a `backend` for a client's request `body`: [`to_chat_request`] for a chat
/// backend; for an Anthropic one, [`anthropic_messages::build_upstream_request`] of the parsed
/// request. A request already in the backend's own form is returned unchanged.
pub fn to_backend_request(
    backend: BackendApi,
    api: ClientApi,
    body: &Value,
) -> Result<Value, AdapterError> {
    match (backend, api) {
        (BackendApi::OpenAiChat, _) => to_chat_request(api, body),
        (BackendApi::AnthropicMessages, ClientApi::AnthropicMessages) => Ok(body.clone()),
        (BackendApi::AnthropicMessages, ClientApi::OpenAiChat) => Ok(
            anthropic_messages::build_upstream_request(&openai_chat::parse_request(body)?),
        ),
        (BackendApi::AnthropicMessages, ClientApi::OpenAiResponses) => Ok(
            anthropic_messages::build_upstream_request(&openai_responses::parse_request(body)?),
        ),
    }
}

/// The backend body for a canonical request from a translated dialect: what [`to_chat_request`]
/// sends, exposed for a response store that built the request with
/// [`openai_responses::expand_with_history`].
///
/// System messages at the start of the conversation join the system prompt, so the backend sees
/// one leading system message: many local chat templates (Qwen's, for one) reject a second.
pub fn chat_request_for(request: &canonical::Request) -> Value {
    let mut request = request.clone();
    let leading = request
        .messages
        .iter()
        .take_while(|m| m.role == canonical::Role::System)
        .count();
    for message in request.messages.drain(..leading) {
        for part in message.content {
            if let canonical::Part::Text(text) = part {
                request.system.push(text);
            }
        }
    }
    let mut body = openai_chat::build_request(&request);
    if request.stream {
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

/// The client's non-streaming answer, from the backend's complete chat-completions answer to
/// `request` (the client's original body, needed for the model name and Responses echo fields),
/// with the client-facing ids and timestamp given by `identity`.
///
/// An error here means the backend's answer was not a chat completion (a 502, not a 400).
pub fn from_chat_response_with(
    api: ClientApi,
    request: &Value,
    chat_response: &Value,
    identity: &Identity,
) -> Result<Value, AdapterError> {
    match api {
        ClientApi::OpenAiChat => Ok(chat_response.clone()),
        ClientApi::AnthropicMessages => {
            let response = openai_chat::parse_response(chat_response)?;
            let model = client_model(request, &response.model);
            Ok(anthropic_messages::build_response(
                &response, &model, identity,
            ))
        }
        ClientApi::OpenAiResponses => {
            let response = openai_chat::parse_response(chat_response)?;
            Ok(openai_responses::build_response(
                request, &response, identity,
            ))
        }
    }
}

/// The client's non-streaming answer from a `backend`'s complete answer to `request` (the
/// client's original body), with the client-facing ids and timestamp given by `identity`. An
/// answer already in the client's form is returned unchanged. An error means the backend's
/// answer was not what its API returns (a 502).
pub fn from_backend_response_with(
    backend: BackendApi,
    api: ClientApi,
    request: &Value,
    answer: &Value,
    identity: &Identity,
) -> Result<Value, AdapterError> {
    let from_anthropic = || anthropic_messages::parse_response(answer);
    match (backend, api) {
        (BackendApi::OpenAiChat, _) => from_chat_response_with(api, request, answer, identity),
        (BackendApi::AnthropicMessages, ClientApi::AnthropicMessages) => Ok(answer.clone()),
        (BackendApi::AnthropicMessages, ClientApi::OpenAiChat) => {
            let mut response = from_anthropic()?;
            // Chat ids and timestamps are the relay's, as for every translated answer.
            response.id = format!("chatcmpl-{}", identity.id);
            response.created = identity.created;
            response.model = client_model(request, &response.model);
            Ok(openai_chat::build_response(&response))
        }
        (BackendApi::AnthropicMessages, ClientApi::OpenAiResponses) => Ok(
            openai_responses::build_response(request, &from_anthropic()?, identity),
        ),
    }
}

/// The client-facing ids and creation time of one translated answer.
///
/// The relay mints its own ids rather than reusing the backend's: some backends' ids are short
/// and repeat (Ollama's), and a response store keys stored conversations by them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// A unique suffix: the answer is `msg_<id>` (Anthropic) or `resp_<id>` (Responses), and
    /// output items derive their ids from it.
    pub id: String,
    /// Unix seconds, for Responses' `created_at`.
    pub created: u64,
}

impl Identity {
    /// A new random id, created at `created` (Unix seconds: the caller reads the clock, so the
    /// translation stays a function of its arguments).
    pub fn minted(created: u64) -> Self {
        Identity {
            id: format!(
                "{:016x}{:08x}",
                rand::random::<u64>(),
                rand::random::<u32>()
            ),
            created,
        }
    }
}

/// The model name the client sees: the one it asked for (it may be an alias the relay mapped to
/// a local model), else the backend's.
pub(crate) fn client_model(request: &Value, backend_model: &str) -> String {
    match request.get("model").and_then(Value::as_str) {
        Some(model) if !model.is_empty() => model.to_string(),
        _ => backend_model.to_string(),
    }
}
