//! Streaming translation: the backend's SSE (chat completions, or an Anthropic upstream's
//! Messages events) in, the client's dialect out, one piece at a time. Nothing waits for the
//! whole answer: each piece's complete events are translated and returned at once.

mod anthropic;
mod anthropic_backend;
mod backend;
mod chat;
mod chat_writer;
mod responses;

use serde_json::Value;

use super::canonical::{Response, StreamEvent, Usage};
use super::sse::EventReader;
use super::{client_model, BackendApi, ClientApi, Identity};
use anthropic::AnthropicWriter;
use anthropic_backend::AnthropicDecoder;
use backend::ChatDecoder;
use chat::ChatPassthrough;
use chat_writer::ChatWriter;
use responses::ResponsesWriter;

/// Writes one client dialect from canonical events.
trait Writer: std::fmt::Debug + Send {
    /// Translates one event, appending SSE text to `out`.
    fn event(&mut self, event: StreamEvent, out: &mut String);
    /// Appends the closing events (idempotent): called when the backend's stream is complete or
    /// when it ends without its terminator.
    fn finish(&mut self, out: &mut String);
    /// The finished answer in canonical form, for writers that keep it (Responses).
    fn response(&self) -> Option<&Response> {
        None
    }
}

/// Reads one backend API's stream into canonical events. The SSE framing is the same for every
/// API, so only the decoding of each event's data differs.
trait Decoder: std::fmt::Debug + Send {
    /// The reader that reassembles the backend's events from the pieces of text.
    fn reader(&mut self) -> &mut EventReader;

    /// Decodes one event's data, appending the canonical events it makes to `out`; not called
    /// once [`is_done`](Self::is_done).
    fn data(&mut self, data: &str, out: &mut Vec<StreamEvent>);

    /// Whether the backend's terminator arrived (`[DONE]`, `message_stop`): the answer is
    /// complete and anything after it is ignored.
    fn is_done(&self) -> bool;

    /// Adds a piece of SSE text; returns the events it completed.
    fn push(&mut self, chunk: &str) -> Vec<StreamEvent> {
        let data = self.reader().push(chunk);
        self.decode(data)
    }

    /// The events of an unterminated last event, when the backend's stream ends.
    fn finish(&mut self) -> Vec<StreamEvent> {
        let data = self.reader().finish();
        self.decode(data)
    }

    /// Decodes the data of several events, in order, up to the terminator.
    fn decode(&mut self, data: Vec<String>) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        for data in data {
            if self.is_done() {
                break;
            }
            self.data(&data, &mut out);
        }
        out
    }
}

/// A backend stream decoded and re-written in the client's dialect.
#[derive(Debug)]
struct Translated {
    decoder: Box<dyn Decoder>,
    writer: Box<dyn Writer>,
    usage: Option<Usage>,
}

impl Translated {
    fn new(decoder: Box<dyn Decoder>, writer: Box<dyn Writer>) -> Self {
        Translated {
            decoder,
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
    /// A chat client in front of a chat backend.
    Chat(ChatPassthrough),
    /// A client of the backend's own API, other than chat: nothing to repair or translate.
    Verbatim,
    Translated(Translated),
}

/// Translates one backend stream into the client's dialect.
///
/// Feed the backend's SSE text with [`push`](Self::push) in whatever pieces it arrives (events
/// and lines may be split anywhere) and send each returned string to the client as it is; call
/// [`finish`](Self::finish) when the backend's stream ends, cleanly or not, to get the closing
/// events a cut-off stream lacks. The worker calls this for every translated streaming request,
/// the proxy for OpenAI clients of an Anthropic upstream.
#[derive(Debug)]
pub struct StreamTranslator {
    inner: Inner,
}

impl StreamTranslator {
    /// A translator of a chat backend's stream for a client of `api` that sent `request` (its
    /// original body: the model name and, for Responses, the echoed settings come from it), with
    /// the client-facing ids given by `identity`.
    pub fn with_identity(api: ClientApi, request: &Value, identity: Identity) -> Self {
        Self::for_backend_with_identity(BackendApi::OpenAiChat, api, request, identity)
    }

    /// A translator of a `backend`'s stream for a client of `api`, with the client-facing ids
    /// given by `identity`.
    pub fn for_backend_with_identity(
        backend: BackendApi,
        api: ClientApi,
        request: &Value,
        identity: Identity,
    ) -> Self {
        let decoder: Box<dyn Decoder> = match backend {
            BackendApi::OpenAiChat => Box::<ChatDecoder>::default(),
            BackendApi::AnthropicMessages => Box::<AnthropicDecoder>::default(),
        };
        let model = client_model(request, "");
        let writer: Box<dyn Writer> = match (backend, api) {
            (BackendApi::OpenAiChat, ClientApi::OpenAiChat) => {
                return StreamTranslator {
                    inner: Inner::Chat(ChatPassthrough::default()),
                }
            }
            (BackendApi::AnthropicMessages, ClientApi::AnthropicMessages) => {
                return StreamTranslator {
                    inner: Inner::Verbatim,
                }
            }
            (_, ClientApi::OpenAiChat) => Box::new(ChatWriter::new(identity, model, request)),
            (_, ClientApi::AnthropicMessages) => Box::new(AnthropicWriter::new(identity, model)),
            (_, ClientApi::OpenAiResponses) => {
                Box::new(ResponsesWriter::new(identity, request.clone()))
            }
        };
        StreamTranslator {
            inner: Inner::Translated(Translated::new(decoder, writer)),
        }
    }

    /// Translates a piece of the backend's stream; returns SSE text for the client (possibly
    /// empty while an event is incomplete).
    pub fn push(&mut self, chunk: &str) -> String {
        match &mut self.inner {
            Inner::Chat(chat) => chat.push(chunk),
            Inner::Verbatim => chunk.to_string(),
            Inner::Translated(t) => t.push(chunk),
        }
    }

    /// Ends the stream: returns whatever closing events the client has not had yet (nothing if
    /// the backend ended properly and everything was already sent). Safe to call more than once.
    pub fn finish(&mut self) -> String {
        match &mut self.inner {
            Inner::Chat(chat) => chat.finish(),
            Inner::Verbatim => String::new(),
            Inner::Translated(t) => t.finish(),
        }
    }

    /// The token counts the backend reported so far (usually in its last chunk); not tracked
    /// for a stream passed through verbatim.
    pub fn usage(&self) -> Option<Usage> {
        match &self.inner {
            Inner::Chat(chat) => chat.usage(),
            Inner::Verbatim => None,
            Inner::Translated(t) => t.usage,
        }
    }

    /// For a Responses stream that ended normally, the answer in canonical form, for
    /// [`StoredConversation::from_exchange`](super::openai_responses::StoredConversation::from_exchange);
    /// `None` for other dialects, before the end, or after a failure.
    pub fn response(&self) -> Option<&Response> {
        match &self.inner {
            Inner::Translated(t) => t.writer.response(),
            _ => None,
        }
    }
}
