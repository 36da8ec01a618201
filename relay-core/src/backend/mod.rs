//! One request to one HTTP model API: a worker's local backend (llama-server, Ollama, vLLM, LM
//! Studio) or one of the proxy's upstream providers (a cloud API).
//!
//! A request is forwarded as it is when the backend serves its route, and translated through the
//! [`adapter`](crate::adapter) when it does not (Anthropic Messages and OpenAI Responses to chat
//! completions; for an Anthropic API, OpenAI Chat and Responses to Messages). Which routes a
//! backend serves is probed on first use and kept in a [`Capabilities`] table that belongs to
//! its owner: each worker has one, the proxy's upstreams have one.
//!
//! The answer comes back as [`BackendEvent`]s on a channel: SSE text as it arrives, then the
//! final answer, or a failure. The channel closing means the request is over. The worker turns
//! events into its wire messages; the proxy's upstream path turns them into a client response.
//! Nothing here knows either of them.

pub mod answer;
mod capabilities;
mod count_tokens;
pub mod endpoint;
mod forward;
pub mod http;
pub mod sse;
#[cfg(test)]
pub(crate) mod testing;
mod translate;

use axum::http::StatusCode;
use tokio::sync::mpsc;

use crate::dialect::ApiError;
use crate::protocol::{TokenCounts, WireHeaders};

pub use capabilities::{route_missing, Capabilities, NativeOverrides};
pub use count_tokens::{CHARS_PER_TOKEN, IMAGE_TOKENS};
pub use forward::error_chain;

/// What a request's task reports, in order: any number of chunks, then at most one of
/// `Complete` and `Failed`.
///
/// The rare final events are boxed so that an event is as small as a chunk: a request's
/// channel allocates 32 slots at once whatever its bound (tokio's block), and every open
/// stream in a worker has one (4.7 KB a stream unboxed, 1 KB boxed).
#[derive(Debug, Clone, PartialEq)]
pub enum BackendEvent {
    /// Whole SSE events of a streamed answer (several at once when they arrived together).
    Chunk(String),
    /// The answer: a whole body, or the end of a stream (`body: None`).
    Complete(Box<Answer>),
    /// The backend failed before or during its answer (a `code` such as `backend_error`, or the
    /// model lifecycle's); nothing more comes.
    Failed(Box<ApiError>),
}

/// A backend's answer (or one given in its place, in the client's dialect).
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The HTTP status.
    pub status: StatusCode,
    /// The headers that are valid text.
    pub headers: WireHeaders,
    /// The body; `None` after a stream.
    pub body: Option<String>,
    /// Token usage read from the answer.
    pub token_counts: Option<TokenCounts>,
    /// How fast the backend was (llama-server's `timings`), when it said.
    pub timings: Option<crate::protocol::Timings>,
    /// How fast it was by the clock, for a stream ([`sse::UsageTracker::clocked`]): for a
    /// backend that says no `timings`, the worker sends it as the timings where the request
    /// was alone on the backend.
    pub clocked: Option<crate::protocol::Timings>,
}

/// Where a request's events go. A closed channel (the owner gave up) ends the request early.
pub type Events = mpsc::Sender<BackendEvent>;

/// One request for a backend.
#[derive(Debug, Clone)]
pub struct BackendRequest {
    /// Names the request in logs.
    pub id: String,
    /// The route, query string included.
    pub path: String,
    /// Whether the client wants a stream.
    pub is_streaming: bool,
    /// The client's body.
    pub body: String,
    /// The headers to send (the caller decides which of the client's go).
    pub headers: WireHeaders,
    /// The llama-server slot the worker pinned an Anthropic Messages request to
    /// (the worker's slot hints): llama-server drops `id_slot` from `/v1/messages`, so such a
    /// request is translated to chat completions, whose body carries the hint.
    pub slot: Option<u32>,
}

/// The API a backend speaks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Speaks {
    /// OpenAI's chat completions, and maybe more (probed).
    #[default]
    OpenAi,
    /// Anthropic Messages only: OpenAI Chat and Responses requests are translated to it.
    Anthropic,
}

/// A backend: where it is, what it speaks, the client that reaches it and what is known of its
/// routes.
#[derive(Debug, Clone)]
pub struct Backend {
    /// Its base URL (the routes are joined onto it, see [`endpoint::join`]).
    pub base_url: String,
    /// Its API.
    pub speaks: Speaks,
    /// The HTTP client (its pool, timeouts and proxy settings are the owner's).
    pub client: http::HttpClient,
    /// Its owner's table of native routes.
    pub capabilities: Capabilities,
}

impl Backend {
    /// Serves `request`, reporting through `events`. Dropping the future (aborting its task)
    /// drops the backend response, which closes the connection: the backend sees the cancel.
    pub async fn serve(self, request: BackendRequest, events: Events) {
        match self.speaks {
            Speaks::OpenAi => match translate::route_of(&request.path) {
                Some(route) => translate::serve(&self, request, route, &events).await,
                None => forward::serve_native(&self, request, &events).await,
            },
            Speaks::Anthropic => translate::serve_from_anthropic(&self, request, &events).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(path: &str) -> BackendRequest {
        BackendRequest {
            id: "r".into(),
            path: path.into(),
            is_streaming: true,
            body: String::new(),
            headers: WireHeaders::new(),
            slot: None,
        }
    }

    /// Every open stream in a worker has a channel of events whose first block holds 32 of
    /// them: an event is as small as a chunk's text, and the task's size is shown for the
    /// record (2,824 bytes in an optimised build).
    #[test]
    fn a_backend_event_is_no_bigger_than_a_chunks_text() {
        assert_eq!(
            std::mem::size_of::<BackendEvent>(),
            std::mem::size_of::<String>()
        );
        let backend = Backend {
            base_url: "http://127.0.0.1:1".into(),
            speaks: Speaks::OpenAi,
            client: reqwest::Client::new().into(),
            capabilities: Capabilities::default(),
        };
        let (events, _) = mpsc::channel(1);
        let task = backend.serve(request("/v1/chat/completions"), events);
        eprintln!("a request task: {} bytes", std::mem::size_of_val(&task));
    }
}
