//! The protocol adapter end to end (issue 3): a real proxy and a real worker in front of a
//! backend that speaks only chat completions, driven the way Claude Code and the OpenAI
//! Responses tooling drive the relay.

use std::time::Duration;

use axum::extract::ws::{Message as WsMessage, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::response::Response;
use axum::{routing, Router};
use relay_core::backend::NativeOverrides;
use relay_core::proxy::{ProxyConfig, RunningProxy};
use relay_core::worker::WorkerConfig;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::support::*;

const MODEL: &str = "chat-model";

/// Claude Code's headers (see `shared/research/clients.md`).
const CLAUDE_CODE_HEADERS: &[(&str, &str)] = &[
    ("anthropic-version", "2023-06-01"),
    (
        "anthropic-beta",
        "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27",
    ),
    ("x-api-key", "sk-ant-client"),
    ("x-app", "cli"),
];

/// A proxy, a chat-only backend and a real worker in front of it.
struct Setup {
    proxy: RunningProxy,
    backend: ChatOnlyBackend,
    worker: RunningWorker,
}

impl Setup {
    async fn start() -> Setup {
        Setup::with_proxy(test_config()).await
    }

    async fn with_proxy(config: ProxyConfig) -> Setup {
        let proxy = start_proxy(config).await;
        let backend = ChatOnlyBackend::start(&[MODEL, "broken", "cut-off"]).await;
        let worker = RunningWorker::start(&proxy, &backend.url(), None, 4);
        wait_until("the worker registers its models", || {
            proxy.hub.models().len() == 3
        })
        .await;
        Setup {
            proxy,
            backend,
            worker,
        }
    }

    fn url(&self) -> String {
        self.proxy.url()
    }

    async fn post(&self, path: &str, body: &Value, headers: &[(&str, &str)]) -> (u16, String) {
        let (status, _, text) = post_raw(&self.url(), path, body.to_string(), headers).await;
        (status.as_u16(), text)
    }

    async fn stop(self) {
        assert_eq!(
            self.proxy.hub.tracked_requests(),
            0,
            "nothing stays tracked"
        );
        self.worker.stop().await;
        self.proxy.shutdown().await;
    }
}

fn parse(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// An SSE body as (event name, data) pairs; `[DONE]` and comments are skipped.
fn events(body: &str) -> Vec<(String, Value)> {
    body.replace("\r\n", "\n")
        .split("\n\n")
        .filter_map(|event| {
            let mut name = String::new();
            let mut data = None;
            for line in event.lines() {
                if let Some(value) = line.strip_prefix("event:") {
                    name = value.trim().to_string();
                } else if let Some(value) = line.strip_prefix("data:") {
                    data = serde_json::from_str::<Value>(value.trim()).ok();
                }
            }
            let data = data?;
            if name.is_empty() {
                name = data["type"].as_str().unwrap_or_default().to_string();
            }
            Some((name, data))
        })
        .collect()
}

fn names(events: &[(String, Value)]) -> Vec<&str> {
    events.iter().map(|(name, _)| name.as_str()).collect()
}

/// The text of an Anthropic stream's `text_delta`s.
fn anthropic_text(events: &[(String, Value)]) -> String {
    events
        .iter()
        .filter(|(name, data)| {
            name == "content_block_delta" && data["delta"]["type"] == "text_delta"
        })
        .map(|(_, data)| data["delta"]["text"].as_str().unwrap_or_default())
        .collect()
}

fn weather_tool() -> Value {
    json!({
        "name": "get_weather",
        "description": "Current weather for a place",
        "input_schema": {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "properties": {"location": {"type": "string"}},
            "required": ["location"]
        }
    })
}

#[tokio::test]
async fn anthropic_messages_are_translated_for_a_chat_only_backend() {
    let setup = Setup::start().await;
    let body = json!({
        "model": MODEL,
        "max_tokens": 64,
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": "hi there"}],
        "metadata": {"user_id": "u-1"},
    });
    let (status, text) = setup
        .post("/v1/messages?beta=true", &body, CLAUDE_CODE_HEADERS)
        .await;
    assert_eq!(status, 200, "{text}");
    let answer = parse(&text);
    assert_eq!(answer["type"], "message");
    assert_eq!(answer["role"], "assistant");
    assert_eq!(answer["model"], MODEL);
    assert!(answer["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(
        answer["content"],
        json!([{"type": "text", "text": "reply to: hi there"}])
    );
    assert_eq!(answer["stop_reason"], "end_turn");
    assert_eq!(answer["usage"]["input_tokens"], CHAT_ONLY_USAGE.0);
    assert_eq!(answer["usage"]["output_tokens"], CHAT_ONLY_USAGE.1);

    // The first request probed the route (a 404), then went to chat completions.
    assert_eq!(
        setup.backend.paths(),
        ["/v1/messages?beta=true", "/v1/chat/completions"]
    );
    let seen = setup.backend.seen();
    let chat = &seen[1];
    assert_eq!(chat.body["model"], MODEL);
    assert_eq!(chat.body["max_tokens"], 64);
    assert_eq!(chat.body["messages"][0]["role"], "system");
    assert_eq!(chat.body["messages"][1]["role"], "user");
    assert!(
        chat.headers.get("authorization").is_none() && chat.headers.get("x-api-key").is_none(),
        "the client's key stays with the relay unless the provider opts in: {:?}",
        chat.headers
    );
    assert!(chat.headers.get("anthropic-beta").is_none());

    // Learned: the next request goes straight to chat completions.
    let (status, text) = setup
        .post("/v1/messages?beta=true", &body, CLAUDE_CODE_HEADERS)
        .await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(setup.backend.paths().len(), 3);
    assert_eq!(setup.backend.paths()[2], "/v1/chat/completions");
    setup.stop().await;
}

#[tokio::test]
async fn anthropic_stream_with_tool_use_round_trip_is_translated() {
    let setup = Setup::start().await;
    let question = json!({"role": "user", "content": "What is the weather in Paris?"});
    let first = json!({
        "model": MODEL,
        "max_tokens": 128000,
        "stream": true,
        "thinking": {"type": "adaptive"},
        "tools": [weather_tool()],
        "messages": [question],
    });
    let (status, text) = setup
        .post("/v1/messages?beta=true", &first, CLAUDE_CODE_HEADERS)
        .await;
    assert_eq!(status, 200, "{text}");
    let stream = events(&text);
    let sequence = names(&stream);
    assert_eq!(sequence.first(), Some(&"message_start"), "{text}");
    assert_eq!(
        sequence[sequence.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    let start = stream
        .iter()
        .find(|(name, _)| name == "content_block_start")
        .map(|(_, data)| data.clone())
        .expect("a content block");
    assert_eq!(start["content_block"]["type"], "tool_use");
    assert_eq!(start["content_block"]["name"], "get_weather");
    let tool_use_id = start["content_block"]["id"].as_str().unwrap().to_string();
    let arguments: String = stream
        .iter()
        .filter(|(_, data)| data["delta"]["type"] == "input_json_delta")
        .map(|(_, data)| data["delta"]["partial_json"].as_str().unwrap())
        .collect();
    let input = parse(&arguments);
    assert_eq!(input, json!({"location": "mock location"}));
    let delta = &stream[stream.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");
    assert_eq!(delta["usage"]["output_tokens"], CHAT_ONLY_USAGE.1);

    // Claude Code runs the tool and sends its result back.
    let second = json!({
        "model": MODEL,
        "max_tokens": 128000,
        "stream": true,
        "tools": [weather_tool()],
        "messages": [
            question,
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": tool_use_id, "name": "get_weather", "input": input}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": tool_use_id, "content": "sunny, 21 C",
                 "cache_control": {"type": "ephemeral"}}
            ]},
        ],
    });
    let (status, text) = setup
        .post("/v1/messages?beta=true", &second, CLAUDE_CODE_HEADERS)
        .await;
    assert_eq!(status, 200, "{text}");
    let stream = events(&text);
    assert_eq!(anthropic_text(&stream), "reply to: sunny, 21 C");
    assert_eq!(
        stream[stream.len() - 2].1["delta"]["stop_reason"],
        "end_turn"
    );
    assert_eq!(names(&stream).last(), Some(&"message_stop"));

    let chats = setup.backend.chat_bodies();
    assert_eq!(chats.len(), 2);
    assert_eq!(chats[0]["stream"], true);
    assert_eq!(chats[0]["tools"][0]["function"]["name"], "get_weather");
    let turn = &chats[1]["messages"];
    assert_eq!(turn[1]["tool_calls"][0]["id"], tool_use_id.as_str());
    assert_eq!(turn[2]["role"], "tool");
    assert_eq!(turn[2]["tool_call_id"], tool_use_id.as_str());
    setup.stop().await;
}

#[tokio::test]
async fn responses_are_translated_for_a_chat_only_backend() {
    let setup = Setup::start().await;
    let body =
        json!({"model": MODEL, "instructions": "Be brief.", "input": "hello", "store": false});
    let (status, text) = setup.post("/v1/responses", &body, &[]).await;
    assert_eq!(status, 200, "{text}");
    let answer = parse(&text);
    assert_eq!(answer["object"], "response");
    assert_eq!(answer["status"], "completed");
    assert_eq!(answer["output"][0]["content"][0]["text"], "reply to: hello");
    assert_eq!(answer["usage"]["input_tokens"], CHAT_ONLY_USAGE.0);

    let streamed = json!({"model": MODEL, "input": "hello", "stream": true, "store": false});
    let (status, text) = setup.post("/v1/responses", &streamed, &[]).await;
    assert_eq!(status, 200, "{text}");
    let stream = events(&text);
    let sequence = names(&stream);
    assert_eq!(sequence[0], "response.created");
    assert_eq!(sequence.last(), Some(&"response.completed"));
    let numbers: Vec<u64> = stream
        .iter()
        .map(|(_, data)| data["sequence_number"].as_u64().expect("sequence_number"))
        .collect();
    assert!(numbers.windows(2).all(|w| w[1] == w[0] + 1), "{numbers:?}");
    let text: String = stream
        .iter()
        .filter(|(name, _)| name == "response.output_text.delta")
        .map(|(_, data)| data["delta"].as_str().unwrap())
        .collect();
    assert_eq!(text, "reply to: hello");
    setup.stop().await;
}

#[tokio::test]
async fn unsupported_content_gets_a_400_naming_the_field_in_the_clients_dialect() {
    let setup = Setup::start().await;
    for stream in [false, true] {
        let audio = json!({
            "model": MODEL,
            "max_tokens": 16,
            "stream": stream,
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "listen"},
                {"type": "audio", "source": {"type": "base64", "data": "AAAA"}}
            ]}],
        });
        let (status, text) = setup.post("/v1/messages", &audio, &[]).await;
        assert_eq!(status, 400, "{text}");
        let error = parse(&text);
        assert_eq!(error["type"], "error");
        assert_eq!(error["error"]["type"], "invalid_request_error");
        assert_eq!(
            error["error"]["message"],
            "messages[0].content[1].type: audio is not supported"
        );
    }
    let audio = json!({"model": MODEL, "input": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    ]}]});
    let (status, text) = setup.post("/v1/responses", &audio, &[]).await;
    assert_eq!(status, 400, "{text}");
    let error = parse(&text);
    assert_eq!(error["error"]["type"], "invalid_request_error");
    assert_eq!(error["error"]["param"], "input[0].content[0].type");
    assert!(error["error"]["message"]
        .as_str()
        .unwrap()
        .contains("input_audio is not supported"));
    assert!(
        setup.backend.chat_bodies().is_empty(),
        "untranslatable requests never reach the backend's chat route"
    );
    setup.stop().await;
}

#[tokio::test]
async fn backend_errors_are_answered_in_the_clients_dialect() {
    let setup = Setup::start().await;
    let body = json!({"model": "broken", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]});
    for stream in [false, true] {
        let mut body = body.clone();
        body["stream"] = json!(stream);
        let (status, text) = setup.post("/v1/messages", &body, &[]).await;
        assert_eq!(status, 503, "{text}");
        let error = parse(&text);
        assert_eq!(error["type"], "error");
        assert_eq!(error["error"]["type"], "overloaded_error");
        assert_eq!(error["error"]["message"], "mock backend is overloaded");
    }
    setup.stop().await;
}

#[tokio::test]
async fn a_translated_stream_cut_off_by_the_backend_is_closed_properly() {
    let setup = Setup::start().await;
    let body = json!({"model": "cut-off", "max_tokens": 16, "stream": true,
                      "messages": [{"role": "user", "content": "hi"}]});
    let (status, text) = setup.post("/v1/messages", &body, &[]).await;
    assert_eq!(status, 200, "{text}");
    let stream = events(&text);
    assert_eq!(anthropic_text(&stream), "reply");
    assert_eq!(
        names(&stream)[names(&stream).len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"],
        "{text}"
    );
    setup.stop().await;
}

#[tokio::test]
async fn backends_that_serve_messages_natively_get_them_untouched() {
    let proxy = start_proxy(test_config()).await;
    let backend = MockBackend::start(&[MODEL]).await;
    let worker = RunningWorker::start(&proxy, &backend.url(), None, 4);
    wait_until("the worker registers", || proxy.hub.models().len() == 1).await;
    let body =
        json!({"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]});
    for _ in 0..2 {
        let (status, _, text) = post(&proxy.url(), "/v1/messages", &body).await;
        assert_eq!(status, 200, "{text}");
        assert_eq!(
            parse(&text)["id"],
            "chatcmpl-mock",
            "the backend's own answer, unchanged"
        );
    }
    let paths: Vec<String> = backend.seen().into_iter().map(|r| r.path).collect();
    assert_eq!(paths, ["/v1/messages", "/v1/messages"]);
    assert_eq!(backend.seen()[0].body, body, "the body is not rewritten");
    worker.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn native_messages_false_in_config_translates_even_for_a_backend_with_the_route() {
    let proxy = start_proxy(test_config()).await;
    let backend = MockBackend::start(&[MODEL]).await;
    let mut config = WorkerConfig::new(&proxy.url(), SECRET, &backend.url());
    config.native_routes = NativeOverrides {
        messages: Some(false),
        responses: None,
    };
    let worker = RunningWorker::start_with(config);
    wait_until("the worker registers", || proxy.hub.models().len() == 1).await;
    let body =
        json!({"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]});
    let (status, _, text) = post(&proxy.url(), "/v1/messages", &body).await;
    assert_eq!(status, 200, "{text}");
    let answer = parse(&text);
    assert_eq!(answer["type"], "message");
    assert_eq!(answer["content"][0]["text"], "hello from mock");
    let paths: Vec<String> = backend.seen().into_iter().map(|r| r.path).collect();
    assert_eq!(paths, ["/v1/chat/completions"], "no probe when configured");
    worker.stop().await;
    proxy.shutdown().await;
}

// A proxy written only from the seeds: translation happens in the worker, so it works there too.

/// Accepts one worker connection and hands its socket to the test.
async fn seeds_only_proxy() -> (String, mpsc::UnboundedReceiver<WebSocket>) {
    async fn connect(
        State(tx): State<mpsc::UnboundedSender<WebSocket>>,
        upgrade: WebSocketUpgrade,
    ) -> Response {
        upgrade.on_upgrade(move |socket| async move {
            let _ = tx.send(socket);
        })
    }
    let (tx, sockets) = mpsc::unbounded_channel();
    let app = Router::new()
        .route("/v1/worker/connect", routing::get(connect))
        .with_state(tx);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, sockets)
}

async fn next_frame(socket: &mut WebSocket) -> Value {
    loop {
        match tokio::time::timeout(WAIT, socket.recv()).await {
            Ok(Some(Ok(WsMessage::Text(text)))) => return parse(&text),
            Ok(Some(Ok(_))) => continue,
            other => panic!("no frame from the worker: {other:?}"),
        }
    }
}

#[tokio::test]
async fn translation_runs_in_the_worker_so_it_works_behind_a_seeds_only_proxy() {
    let (url, mut sockets) = seeds_only_proxy().await;
    let backend = ChatOnlyBackend::start(&[MODEL]).await;
    let mut config = WorkerConfig::new(&url, "seed-secret", &backend.url());
    config.model_refresh_interval = Duration::from_secs(600);
    let worker = RunningWorker::start_with(config);
    let mut socket = tokio::time::timeout(WAIT, sockets.recv())
        .await
        .expect("the worker connects")
        .expect("socket");
    assert_eq!(next_frame(&mut socket).await["type"], "register");
    let ack = json!({"type": "register_ack", "worker_id": "w-1", "models": [MODEL], "protocol_version": "1"});
    socket
        .send(WsMessage::Text(ack.to_string().into()))
        .await
        .unwrap();
    let body = json!({"model": MODEL, "max_tokens": 16, "stream": true,
                      "messages": [{"role": "user", "content": "hi"}]});
    let request = json!({"type": "request", "request_id": "req-1", "model": MODEL,
        "endpoint_path": "/v1/messages?beta=true", "is_streaming": true, "body": body.to_string(),
        "headers": {"content-type": "application/json", "anthropic-version": "2023-06-01"}});
    socket
        .send(WsMessage::Text(request.to_string().into()))
        .await
        .unwrap();
    let mut sse = String::new();
    let complete = loop {
        let frame = next_frame(&mut socket).await;
        match frame["type"].as_str() {
            Some("response_chunk") => sse.push_str(frame["chunk"].as_str().unwrap()),
            Some("response_complete") => break frame,
            _ => {}
        }
    };
    let stream = events(&sse);
    assert_eq!(names(&stream)[0], "message_start");
    assert_eq!(anthropic_text(&stream), "reply to: hi");
    assert_eq!(complete["status_code"], 200);
    let (input, output) = CHAT_ONLY_USAGE;
    assert_eq!(
        complete["token_counts"],
        json!({"prompt_tokens": input, "completion_tokens": output, "total_tokens": input + output}),
        "token counts come from the translator's usage"
    );
    worker.kill();
}

// `/v1/messages/count_tokens`.

#[tokio::test]
async fn count_tokens_is_estimated_when_the_backend_cannot_count() {
    let setup = Setup::start().await;
    let body = json!({
        "model": MODEL,
        "system": "abcd",
        "messages": [{"role": "user", "content": "12345678"}],
        "tools": [{"name": "ab", "description": "cd", "input_schema": {}}],
    });
    let (status, text) = setup
        .post(
            "/v1/messages/count_tokens?beta=true",
            &body,
            CLAUDE_CODE_HEADERS,
        )
        .await;
    assert_eq!(status, 200, "{text}");
    // Characters / 4, rounded up: 4 + 8 + (2 + 2 + 2) = 18 -> 5; and it says it estimated.
    assert_eq!(parse(&text), json!({"input_tokens": 5, "estimated": true}));
    assert_eq!(
        setup.backend.paths(),
        ["/v1/messages/count_tokens?beta=true", "/tokenize"],
        "probed once (a 404), asked for its tokenizer once (a 404), then estimated"
    );
    let (status, _) = setup
        .post("/v1/messages/count_tokens", &body, CLAUDE_CODE_HEADERS)
        .await;
    assert_eq!(status, 200);
    assert_eq!(setup.backend.paths().len(), 2, "no second probe");
    let audio =
        json!({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "audio"}]}]});
    let (status, text) = setup
        .post("/v1/messages/count_tokens", &audio, CLAUDE_CODE_HEADERS)
        .await;
    assert_eq!(status, 400, "{text}");
    assert_eq!(
        parse(&text)["error"]["message"],
        "messages[0].content[0].type: audio is not supported"
    );
    setup.stop().await;
}

#[tokio::test]
async fn count_tokens_is_not_probed_once_messages_are_known_to_need_translation() {
    let setup = Setup::start().await;
    let message =
        json!({"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]});
    let (status, _) = setup.post("/v1/messages", &message, &[]).await;
    assert_eq!(status, 200);
    let count = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]});
    let (status, text) = setup.post("/v1/messages/count_tokens", &count, &[]).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(parse(&text), json!({"input_tokens": 1, "estimated": true}));
    assert_eq!(
        setup.backend.paths(),
        ["/v1/messages", "/v1/chat/completions", "/tokenize"]
    );
    setup.stop().await;
}

#[tokio::test]
async fn count_tokens_is_forwarded_when_the_backend_counts() {
    let proxy = start_proxy(test_config()).await;
    let backend = MockBackend::start(&[MODEL]).await;
    let worker = RunningWorker::start(&proxy, &backend.url(), None, 4);
    wait_until("the worker registers", || proxy.hub.models().len() == 1).await;
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]});
    let (status, _, text) = post(&proxy.url(), "/v1/messages/count_tokens", &body).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(parse(&text)["id"], "chatcmpl-mock", "the backend's answer");
    let seen = backend.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/v1/messages/count_tokens");
    assert_eq!(seen[0].body, body);
    worker.stop().await;
    proxy.shutdown().await;
}

// The Responses store: `previous_response_id`, `store: false`, GET and DELETE.

/// The texts of the messages of a chat body, as `role: text`.
fn conversation(chat: &Value) -> Vec<String> {
    chat["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let text = match &m["content"] {
                Value::String(text) => text.clone(),
                Value::Array(parts) => parts
                    .iter()
                    .filter_map(|p| p["text"].as_str())
                    .collect::<String>(),
                _ => String::new(),
            };
            format!("{}: {text}", m["role"].as_str().unwrap())
        })
        .collect()
}

fn output_text(response: &Value) -> String {
    response["output"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|item| item["content"].as_array().cloned().unwrap_or_default())
        .filter_map(|part| part["text"].as_str().map(str::to_string))
        .collect()
}

#[tokio::test]
async fn responses_previous_response_id_continues_the_stored_conversation() {
    let setup = Setup::start().await;
    let first = json!({"model": MODEL, "instructions": "Be brief.", "input": "My name is Ada."});
    let (status, text) = setup.post("/v1/responses", &first, &[]).await;
    assert_eq!(status, 200, "{text}");
    let first = parse(&text);
    let first_id = first["id"].as_str().unwrap().to_string();

    let second =
        json!({"model": MODEL, "previous_response_id": first_id, "input": "What is my name?"});
    let (status, text) = setup.post("/v1/responses", &second, &[]).await;
    assert_eq!(status, 200, "{text}");
    let second = parse(&text);
    assert_eq!(second["previous_response_id"], first_id.as_str());
    assert_eq!(output_text(&second), "reply to: What is my name?");
    let chats = setup.backend.chat_bodies();
    assert_eq!(
        conversation(&chats[1]),
        [
            "user: My name is Ada.",
            "assistant: reply to: My name is Ada.",
            "user: What is my name?"
        ],
        "instructions are not carried over, the conversation is"
    );

    // A streamed continuation is stored from its `response.completed` event.
    let third = json!({"model": MODEL, "previous_response_id": second["id"], "input": "Thanks!", "stream": true});
    let (status, text) = setup.post("/v1/responses", &third, &[]).await;
    assert_eq!(status, 200, "{text}");
    let completed = events(&text)
        .into_iter()
        .find(|(name, _)| name == "response.completed")
        .expect("response.completed")
        .1;
    let third_id = completed["response"]["id"].as_str().unwrap().to_string();
    let fourth = json!({"model": MODEL, "previous_response_id": third_id, "input": "Bye."});
    let (status, text) = setup.post("/v1/responses", &fourth, &[]).await;
    assert_eq!(status, 200, "{text}");
    let chats = setup.backend.chat_bodies();
    assert_eq!(
        conversation(&chats[3]).len(),
        7,
        "{:?}",
        conversation(&chats[3])
    );
    assert_eq!(conversation(&chats[3])[5], "assistant: reply to: Thanks!");
    setup.stop().await;
}

#[tokio::test]
async fn responses_with_store_false_are_not_kept() {
    let setup = Setup::start().await;
    for stream in [false, true] {
        let body = json!({"model": MODEL, "input": "secret", "store": false, "stream": stream});
        let (status, text) = setup.post("/v1/responses", &body, &[]).await;
        assert_eq!(status, 200, "{text}");
        let id = if stream {
            events(&text).last().unwrap().1["response"]["id"].clone()
        } else {
            parse(&text)["id"].clone()
        };
        let id = id.as_str().unwrap();
        let (status, _) = get_json(&setup.url(), &format!("/v1/responses/{id}"), &[]).await;
        assert_eq!(status, 404);
        let next = json!({"model": MODEL, "previous_response_id": id, "input": "again"});
        let (status, text) = setup.post("/v1/responses", &next, &[]).await;
        assert_eq!(status, 404, "{text}");
    }
    setup.stop().await;
}

#[tokio::test]
async fn unknown_previous_response_id_is_404_in_openai_shape() {
    let setup = Setup::start().await;
    let body = json!({"model": MODEL, "previous_response_id": "resp_nope", "input": "hi"});
    let (status, text) = setup.post("/v1/responses", &body, &[]).await;
    assert_eq!(status, 404, "{text}");
    let error = parse(&text);
    assert_eq!(error["error"]["code"], "previous_response_not_found");
    assert_eq!(error["error"]["type"], "invalid_request_error");
    assert!(error["error"]["message"]
        .as_str()
        .unwrap()
        .contains("resp_nope"));
    assert!(setup.backend.seen().is_empty(), "nothing was dispatched");
    setup.stop().await;
}

#[tokio::test]
async fn stored_responses_can_be_fetched_and_deleted() {
    let setup = Setup::start().await;
    let (status, text) = setup
        .post(
            "/v1/responses",
            &json!({"model": MODEL, "input": "keep me"}),
            &[],
        )
        .await;
    assert_eq!(status, 200, "{text}");
    let response = parse(&text);
    let path = format!("/v1/responses/{}", response["id"].as_str().unwrap());
    let (status, fetched) = get_json(&setup.url(), &path, &[]).await;
    assert_eq!(status, 200);
    assert_eq!(fetched, response);

    let deleted = http()
        .delete(format!("{}{path}", setup.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 200);
    let deleted = parse(&deleted.text().await.unwrap());
    assert_eq!(
        deleted,
        json!({"id": response["id"], "object": "response", "deleted": true})
    );
    let (status, error) = get_json(&setup.url(), &path, &[]).await;
    assert_eq!(status, 404);
    assert_eq!(error["error"]["code"], "response_not_found");
    let again = http()
        .delete(format!("{}{path}", setup.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 404);
    setup.stop().await;
}

#[tokio::test]
async fn the_responses_store_evicts_the_oldest_beyond_its_entry_bound() {
    let mut config = test_config();
    config.responses_store.max_entries = 1;
    let setup = Setup::with_proxy(config).await;
    let mut ids = Vec::new();
    for input in ["one", "two"] {
        let (status, text) = setup
            .post(
                "/v1/responses",
                &json!({"model": MODEL, "input": input}),
                &[],
            )
            .await;
        assert_eq!(status, 200, "{text}");
        ids.push(parse(&text)["id"].as_str().unwrap().to_string());
    }
    let (status, _) = get_json(&setup.url(), &format!("/v1/responses/{}", ids[0]), &[]).await;
    assert_eq!(status, 404, "evicted");
    let (status, _) = get_json(&setup.url(), &format!("/v1/responses/{}", ids[1]), &[]).await;
    assert_eq!(status, 200);
    setup.stop().await;
}

#[tokio::test]
async fn a_continuation_is_served_by_whichever_worker_is_left() {
    let proxy = start_proxy(test_config()).await;
    let backends = [
        ChatOnlyBackend::start(&[MODEL]).await,
        ChatOnlyBackend::start(&[MODEL]).await,
    ];
    let mut workers: Vec<Option<RunningWorker>> = backends
        .iter()
        .map(|b| Some(RunningWorker::start(&proxy, &b.url(), None, 4)))
        .collect();
    wait_until("both workers register", || proxy.hub.counts().0 == 2).await;
    let (status, _, text) = post(
        &proxy.url(),
        "/v1/responses",
        &json!({"model": MODEL, "input": "remember 42"}),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let id = parse(&text)["id"].clone();
    let first = (0..2)
        .find(|i| !backends[*i].chat_bodies().is_empty())
        .expect("one backend answered");
    workers[first].take().unwrap().stop().await;
    wait_until("the first worker leaves", || proxy.hub.counts().0 == 1).await;
    let next = json!({"model": MODEL, "previous_response_id": id, "input": "what number?"});
    let (status, _, text) = post(&proxy.url(), "/v1/responses", &next).await;
    assert_eq!(status, 200, "{text}");
    let other = &backends[1 - first];
    assert_eq!(
        conversation(&other.chat_bodies()[0]),
        [
            "user: remember 42",
            "assistant: reply to: remember 42",
            "user: what number?"
        ]
    );
    for worker in workers.into_iter().flatten() {
        worker.stop().await;
    }
    proxy.shutdown().await;
}

// Model aliases and the default model.

fn aliased_config() -> ProxyConfig {
    let mut config = test_config();
    config.aliases = relay_core::proxy::serving::aliases::ModelAliases::new(
        [("claude-*".to_string(), MODEL.to_string())],
        Some(MODEL.to_string()),
    );
    config
}

#[tokio::test]
async fn claude_model_names_are_mapped_to_a_served_model_by_alias() {
    let setup = Setup::with_proxy(aliased_config()).await;
    let body = json!({"model": "claude-opus-5-5", "max_tokens": 32, "stream": true,
                      "messages": [{"role": "user", "content": "hi"}]});
    let (status, text) = setup
        .post("/v1/messages?beta=true", &body, CLAUDE_CODE_HEADERS)
        .await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(anthropic_text(&events(&text)), "reply to: hi");
    let seen = setup.backend.seen();
    assert_eq!(
        seen[0].path, "/v1/messages?beta=true",
        "the query string is kept"
    );
    assert_eq!(
        seen[0].body["model"], MODEL,
        "the body names the served model"
    );
    assert_eq!(seen[1].body["model"], MODEL);
    let count =
        json!({"model": "claude-haiku-4-5", "messages": [{"role": "user", "content": "hi"}]});
    let (status, text) = setup
        .post(
            "/v1/messages/count_tokens?beta=true",
            &count,
            CLAUDE_CODE_HEADERS,
        )
        .await;
    assert_eq!(status, 200, "{text}");
    setup.stop().await;
}

#[tokio::test]
async fn names_nobody_serves_go_to_the_default_model_and_served_names_stay() {
    let setup = Setup::with_proxy(aliased_config()).await;
    let ask =
        |model: &str| json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
    let (status, text) = setup
        .post("/v1/chat/completions", &ask("gpt-4o"), &[])
        .await;
    assert_eq!(status, 200, "{text}");
    let (status, text) = setup
        .post("/v1/chat/completions", &ask("broken"), &[])
        .await;
    assert_eq!(status, 503, "a served name is not remapped: {text}");
    let models: Vec<Value> = setup
        .backend
        .chat_bodies()
        .iter()
        .map(|b| b["model"].clone())
        .collect();
    assert_eq!(models, [json!(MODEL), json!("broken")]);
    setup.stop().await;
}

#[tokio::test]
async fn without_aliases_a_model_no_worker_serves_waits_for_one_and_times_out_naming_it() {
    let setup = Setup::with_proxy(config_with_queue_timeout(std::time::Duration::from_millis(
        300,
    )))
    .await;
    // (A Claude name would go to the model chosen for Claude Code: see claude_code.rs.)
    let body = json!({"model": "gpt-4o", "max_tokens": 8, "messages": []});
    let (status, text) = setup.post("/v1/messages", &body, &[]).await;
    assert_eq!(status, 504, "{text}");
    let error = parse(&text);
    assert_eq!(error["error"]["type"], "timeout_error");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("gpt-4o"),
        "{text}"
    );
    assert!(
        setup.backend.paths().is_empty(),
        "nothing reached the backend"
    );
    setup.stop().await;
}

#[tokio::test]
async fn claude_code_second_turn_gets_a_correct_stream_from_a_chat_only_backend() {
    // A recorded Claude Code request: ?beta=true, cache_control system blocks, a system-role
    // message, thinking and context-management settings, $schema tools (one deferred, one
    // server tool), and a second turn with thinking, parallel tool_use and their results.
    let fixture = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/adapter/convert/anthropic_claude_code_second_turn.json"
    ))
    .expect("fixture");
    let body = parse(&fixture)["input"].clone();
    assert_eq!(body["model"], "claude-opus-5-5");
    let setup = Setup::with_proxy(aliased_config()).await;
    let (status, text) = setup
        .post("/v1/messages?beta=true", &body, CLAUDE_CODE_HEADERS)
        .await;
    assert_eq!(status, 200, "{text}");
    let stream = events(&text);
    let sequence = names(&stream);
    assert_eq!(sequence[0], "message_start");
    assert_eq!(stream[0].1["message"]["model"], MODEL);
    assert!(
        stream[0].1["message"]["usage"].is_object(),
        "a full usage object"
    );
    // The mock calls the first tool: every block opened is closed, in order.
    let mut open = None;
    for (name, data) in &stream {
        match name.as_str() {
            "content_block_start" => {
                assert_eq!(open, None, "a block starts before the last one stopped");
                open = data["index"].as_u64();
            }
            "content_block_delta" => assert_eq!(open, data["index"].as_u64()),
            "content_block_stop" => assert_eq!(open.take(), data["index"].as_u64()),
            _ => {}
        }
    }
    assert_eq!(
        sequence[sequence.len() - 2..],
        ["message_delta", "message_stop"]
    );
    let chat = &setup.backend.chat_bodies()[0];
    let roles: Vec<&str> = chat["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles[0], "system");
    assert_eq!(
        roles.iter().filter(|r| **r == "system").count(),
        1,
        "one leading system message, as local chat templates need: {roles:?}"
    );
    assert!(roles.contains(&"tool"), "tool results travel: {roles:?}");
    setup.stop().await;
}

#[tokio::test]
async fn a_continuation_larger_than_max_body_bytes_is_413_not_sent_to_a_worker() {
    let mut config = test_config();
    config.max_body_bytes = 2_000;
    let setup = Setup::with_proxy(config).await;
    let long = "x".repeat(1_200);
    let (status, text) = setup
        .post(
            "/v1/responses",
            &json!({"model": MODEL, "input": long}),
            &[],
        )
        .await;
    assert_eq!(status, 200, "{text}");
    let id = parse(&text)["id"].clone();
    // The stored turn (question and answer, 2,400+ bytes) plus this input exceed the limit.
    let next = json!({"model": MODEL, "previous_response_id": id, "input": "and?"});
    let (status, text) = setup.post("/v1/responses", &next, &[]).await;
    assert_eq!(status, 413, "{text}");
    assert_eq!(parse(&text)["error"]["code"], "request_too_large");
    assert_eq!(setup.backend.chat_bodies().len(), 1);
    setup.stop().await;
}
