//! Streaming translation: the backend's chat-completions SSE in, the client's dialect out, one
//! piece at a time. Nothing waits for the whole answer: each piece's complete events are
//! translated and returned at once.

mod anthropic;
mod backend;
mod chat;
mod responses;

use serde_json::Value;

use super::canonical::{Response, StreamEvent, Usage};
use super::{client_model, ClientApi, Identity};
use anthropic::AnthropicWriter;
use backend::ChatDecoder;
use chat::ChatPassthrough;
use responses::ResponsesWriter;

/// Writes one client dialect from canonical events.
trait Writer {
    /// Translates one event, appending SSE text to `out`.
    fn event(&mut self, event: StreamEvent, out: &mut String);
    /// Appends the closing events (idempotent): called at `[DONE]` or when the backend's stream
    /// ends without one.
    fn finish(&mut self, out: &mut String);
}

/// A chat stream decoded and re-written in another dialect.
#[derive(Debug)]
struct Translated<W> {
    decoder: ChatDecoder,
    writer: W,
    usage: Option<Usage>,
}

impl<W: Writer> Translated<W> {
    fn new(writer: W) -> Self {
        Translated {
            decoder: ChatDecoder::default(),
            writer,
            usage: None,
        }
    }

    fn write(&mut self, events: Vec<StreamEvent>, out: &mut String) {
        for event in events {
            if let StreamEvent::Usage(usage) = &event {
                self.usage = Some(*usage);
            }
            self.writer.event(event, out);
        }
    }

    fn push(&mut self, chunk: &str) -> String {
        let mut out = String::new();
        let events = self.decoder.push(chunk);
        self.write(events, &mut out);
        if self.decoder.is_done() {
            self.writer.finish(&mut out);
        }
        out
    }

    fn finish(&mut self) -> String {
        let mut out = String::new();
        let events = self.decoder.finish();
        self.write(events, &mut out);
        self.writer.finish(&mut out);
        out
    }
}

#[derive(Debug)]
enum Inner {
    Chat(ChatPassthrough),
    Anthropic(Translated<AnthropicWriter>),
    Responses(Translated<ResponsesWriter>),
}

/// Translates one backend chat-completions stream into the client's dialect.
///
/// Feed the backend's SSE text with [`push`](Self::push) in whatever pieces it arrives (events
/// and lines may be split anywhere) and send each returned string to the client as it is; call
/// [`finish`](Self::finish) when the backend's stream ends, cleanly or not, to get the closing
/// events a cut-off stream lacks. The worker calls this for every translated streaming request.
#[derive(Debug)]
pub struct StreamTranslator {
    inner: Inner,
}

impl StreamTranslator {
    /// A translator for a client of `api` that sent `request` (its original body: the model name
    /// and, for Responses, the echoed settings come from it), with freshly minted ids.
    pub fn new(api: ClientApi, request: &Value) -> Self {
        Self::with_identity(api, request, Identity::fresh())
    }

    /// [`new`](Self::new) with the client-facing ids given by `identity`.
    pub fn with_identity(api: ClientApi, request: &Value, identity: Identity) -> Self {
        let inner = match api {
            ClientApi::OpenAiChat => Inner::Chat(ChatPassthrough::default()),
            ClientApi::AnthropicMessages => Inner::Anthropic(Translated::new(
                AnthropicWriter::new(identity, client_model(request, "")),
            )),
            ClientApi::OpenAiResponses => Inner::Responses(Translated::new(ResponsesWriter::new(
                identity,
                request.clone(),
            ))),
        };
        StreamTranslator { inner }
    }

    /// Translates a piece of the backend's stream; returns SSE text for the client (possibly
    /// empty while an event is incomplete).
    pub fn push(&mut self, chunk: &str) -> String {
        match &mut self.inner {
            Inner::Chat(chat) => chat.push(chunk),
            Inner::Anthropic(t) => t.push(chunk),
            Inner::Responses(t) => t.push(chunk),
        }
    }

    /// Ends the stream: returns whatever closing events the client has not had yet (nothing if
    /// the backend ended properly and everything was already sent). Safe to call more than once.
    pub fn finish(&mut self) -> String {
        match &mut self.inner {
            Inner::Chat(chat) => chat.finish(),
            Inner::Anthropic(t) => t.finish(),
            Inner::Responses(t) => t.finish(),
        }
    }

    /// The token counts the backend reported so far (usually in its last chunk).
    pub fn usage(&self) -> Option<Usage> {
        match &self.inner {
            Inner::Chat(chat) => chat.usage(),
            Inner::Anthropic(t) => t.usage,
            Inner::Responses(t) => t.usage,
        }
    }

    /// For a Responses stream that ended normally, the answer in canonical form, for
    /// [`StoredConversation::from_exchange`](super::openai_responses::StoredConversation::from_exchange);
    /// `None` for other dialects, before the end, or after a failure.
    pub fn response(&self) -> Option<&Response> {
        match &self.inner {
            Inner::Responses(t) => t.writer.response(),
            _ => None,
        }
    }
}
