//! Every request path the relay knows, parsed once into an [`Endpoint`] that every layer
//! matches on: the proxy's routes and dialects, the worker's forwarding rules and slot hints, the
//! backend's translation and usage handling, the adapter's client APIs. A path is read one way
//! everywhere — the query string dropped (Claude Code sends `/v1/messages?beta=true`), one
//! trailing `/` ignored — so adding a route is one variant here and the places the compiler then
//! names. Pure: no I/O, imports nothing else of the crate.

/// A request path, classified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// `POST /v1/chat/completions` (OpenAI).
    ChatCompletions,
    /// `POST /v1/completions` (OpenAI, legacy text completions).
    Completions,
    /// `POST /v1/embeddings` (OpenAI).
    Embeddings,
    /// `POST /v1/messages` (Anthropic).
    Messages,
    /// `POST /v1/messages/count_tokens` (Anthropic).
    CountTokens,
    /// `POST /v1/responses` (OpenAI Responses).
    Responses,
    /// `GET` / `DELETE /v1/responses/{id}`.
    StoredResponse,
    /// `GET /v1/responses/{id}/input_items`.
    ResponseInputItems,
    /// `GET /v1/models`.
    Models,
    /// `GET /v1/models/{id}`.
    Model,
    /// llama-server's own routes without the `/v1` prefix (`/chat/completions`,
    /// `/completions`, `/completion`): never relayed unless a worker's owner adds them, but
    /// they take a slot hint like the OpenAI ones.
    LlamaServerNative,
    /// A route under `/v1/messages/` the relay does not serve (answered `404` in Anthropic's
    /// words).
    OtherAnthropic,
    /// A route under `/v1/responses/` the relay does not serve (answered `404` as Responses).
    OtherResponses,
    /// Anything else.
    Other,
}

impl Endpoint {
    /// The endpoint of `path` (a query string allowed).
    pub fn of(path: &str) -> Endpoint {
        let path = path.split_once('?').map_or(path, |(path, _)| path);
        let path = path.strip_suffix('/').unwrap_or(path);
        match path {
            "/v1/chat/completions" => Endpoint::ChatCompletions,
            "/v1/completions" => Endpoint::Completions,
            "/v1/embeddings" => Endpoint::Embeddings,
            "/v1/messages" => Endpoint::Messages,
            "/v1/messages/count_tokens" => Endpoint::CountTokens,
            "/v1/responses" => Endpoint::Responses,
            "/v1/models" => Endpoint::Models,
            "/chat/completions" | "/completions" | "/completion" => Endpoint::LlamaServerNative,
            _ => {
                if let Some(rest) = path.strip_prefix("/v1/responses/") {
                    match rest.split_once('/') {
                        None if !rest.is_empty() => Endpoint::StoredResponse,
                        Some((id, "input_items")) if !id.is_empty() => Endpoint::ResponseInputItems,
                        _ => Endpoint::OtherResponses,
                    }
                } else if path.starts_with("/v1/messages/") {
                    Endpoint::OtherAnthropic
                } else if path
                    .strip_prefix("/v1/models/")
                    .is_some_and(|id| !id.is_empty())
                {
                    Endpoint::Model
                } else {
                    Endpoint::Other
                }
            }
        }
    }

    /// The endpoints a worker relays to its backend (`endpoint_path`): the inference routes.
    pub const INFERENCE: [Endpoint; 6] = [
        Endpoint::ChatCompletions,
        Endpoint::Completions,
        Endpoint::Embeddings,
        Endpoint::Messages,
        Endpoint::CountTokens,
        Endpoint::Responses,
    ];

    /// Whether a worker relays it to its backend.
    pub fn is_inference(self) -> bool {
        Self::INFERENCE.contains(&self)
    }

    /// The path of an endpoint with one fixed path.
    pub fn path(self) -> Option<&'static str> {
        Some(match self {
            Endpoint::ChatCompletions => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
            Endpoint::Embeddings => "/v1/embeddings",
            Endpoint::Messages => "/v1/messages",
            Endpoint::CountTokens => "/v1/messages/count_tokens",
            Endpoint::Responses => "/v1/responses",
            Endpoint::Models => "/v1/models",
            _ => return None,
        })
    }

    /// Whether its errors and streams speak Anthropic's dialect.
    pub fn is_anthropic(self) -> bool {
        matches!(
            self,
            Endpoint::Messages | Endpoint::CountTokens | Endpoint::OtherAnthropic
        )
    }

    /// Whether it is part of the OpenAI Responses API (its stream errors are typed events).
    pub fn is_responses(self) -> bool {
        matches!(
            self,
            Endpoint::Responses
                | Endpoint::StoredResponse
                | Endpoint::ResponseInputItems
                | Endpoint::OtherResponses
        )
    }

    /// Whether a conversation's later turns through it find their prompt in a backend's cache:
    /// the generation routes (an embedding or a count keeps nothing).
    pub fn keeps_a_prompt_cache(self) -> bool {
        matches!(
            self,
            Endpoint::ChatCompletions
                | Endpoint::Completions
                | Endpoint::Messages
                | Endpoint::Responses
        )
    }

    /// Whether a stream from it carries usage only when the request asks
    /// (`stream_options.include_usage`): OpenAI's Chat Completions and Completions.
    pub fn streams_usage_only_when_asked(self) -> bool {
        matches!(self, Endpoint::ChatCompletions | Endpoint::Completions)
    }

    /// Whether llama-server reads a slot hint (`id_slot`) from its body: its OpenAI chat and
    /// text completion routes and its own. Its `/v1/messages` and `/v1/responses` convert the
    /// body and drop members they do not know, so a hint there would be lost.
    pub fn takes_slot_hint(self) -> bool {
        matches!(
            self,
            Endpoint::ChatCompletions | Endpoint::Completions | Endpoint::LlamaServerNative
        )
    }

    /// Whether a stream of this endpoint opens with its first token, so the time to its first
    /// event is the time to a first token: OpenAI chat and text completions. A Messages or
    /// Responses stream opens with an event of its own (`message_start`, `response.created`)
    /// that a server may send before it evaluates the prompt.
    pub fn first_event_is_first_token(self) -> bool {
        matches!(
            self,
            Endpoint::ChatCompletions | Endpoint::Completions | Endpoint::LlamaServerNative
        )
    }

    /// Whether a worker pins a request of this endpoint to a llama-server slot: those whose body
    /// takes the hint, and Anthropic Messages (Claude Code's), which the worker then translates
    /// to chat completions to carry it.
    pub fn pinnable(self) -> bool {
        self.takes_slot_hint() || self == Endpoint::Messages
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_is_read_one_way() {
        for (path, endpoint) in [
            ("/v1/chat/completions", Endpoint::ChatCompletions),
            ("/v1/chat/completions/", Endpoint::ChatCompletions),
            ("/v1/chat/completions?x=1", Endpoint::ChatCompletions),
            ("/v1/completions", Endpoint::Completions),
            ("/v1/embeddings", Endpoint::Embeddings),
            ("/v1/messages?beta=true", Endpoint::Messages),
            ("/v1/messages/", Endpoint::Messages),
            ("/v1/messages/count_tokens?beta=true", Endpoint::CountTokens),
            ("/v1/responses", Endpoint::Responses),
            ("/v1/responses/resp_1", Endpoint::StoredResponse),
            (
                "/v1/responses/resp_1/input_items",
                Endpoint::ResponseInputItems,
            ),
            ("/v1/responses/resp_1/other", Endpoint::OtherResponses),
            ("/v1/responses//input_items", Endpoint::OtherResponses),
            ("/v1/messages/batches", Endpoint::OtherAnthropic),
            ("/v1/models", Endpoint::Models),
            ("/v1/models/qwen2.5:7b", Endpoint::Model),
            ("/v1/models/org/model", Endpoint::Model),
            ("/chat/completions", Endpoint::LlamaServerNative),
            ("/completion", Endpoint::LlamaServerNative),
            ("/v1/chat/completionsx", Endpoint::Other),
            ("/v1/chat//completions", Endpoint::Other),
            ("/V1/chat/completions", Endpoint::Other),
            ("", Endpoint::Other),
            ("/", Endpoint::Other),
            ("/api/generate", Endpoint::Other),
        ] {
            assert_eq!(Endpoint::of(path), endpoint, "{path:?}");
        }
    }

    #[test]
    fn fixed_paths_classify_as_themselves() {
        for endpoint in Endpoint::INFERENCE.into_iter().chain([Endpoint::Models]) {
            let path = endpoint.path().expect("a fixed path");
            assert_eq!(Endpoint::of(path), endpoint);
        }
        assert_eq!(Endpoint::StoredResponse.path(), None);
    }

    #[test]
    fn what_each_layer_asks_of_an_endpoint() {
        assert!(Endpoint::CountTokens.is_anthropic() && Endpoint::CountTokens.is_inference());
        assert!(Endpoint::ResponseInputItems.is_responses());
        assert!(!Endpoint::ResponseInputItems.is_inference());
        assert!(!Endpoint::LlamaServerNative.is_inference());
        assert!(Endpoint::LlamaServerNative.takes_slot_hint());
        assert!(!Endpoint::Messages.takes_slot_hint());
        // Claude Code's Messages are pinned all the same: the worker translates them to chat
        // completions to carry the hint. The Responses API and token counts go as they came.
        assert!(Endpoint::Messages.pinnable());
        assert!(Endpoint::ChatCompletions.pinnable());
        assert!(!Endpoint::Responses.pinnable());
        assert!(!Endpoint::CountTokens.pinnable());
        assert!(Endpoint::ChatCompletions.first_event_is_first_token());
        assert!(Endpoint::Completions.first_event_is_first_token());
        assert!(!Endpoint::Messages.first_event_is_first_token());
        assert!(!Endpoint::Responses.first_event_is_first_token());
        assert!(Endpoint::Completions.streams_usage_only_when_asked());
        assert!(!Endpoint::Responses.streams_usage_only_when_asked());
        assert!(Endpoint::Messages.keeps_a_prompt_cache());
        assert!(!Endpoint::Embeddings.keeps_a_prompt_cache());
    }
}
