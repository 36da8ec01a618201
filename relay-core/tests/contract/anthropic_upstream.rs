//! OpenAI clients served by an Anthropic upstream (issue 3, cloud mode): Chat Completions and
//! Responses requests are translated to Messages and the answers back, whole and streamed; and
//! what upstreams given by pattern list in `GET /v1/models`. A mock Anthropic API stands in for
//! the cloud.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::{routing, Json, Router};
use relay_core::proxy::serving::upstream::{UpstreamConfig, UpstreamKind};
use relay_core::proxy::RunningProxy;
use serde_json::{json, Value};
use tokio::task::JoinHandle;

use crate::support::*;

const KEY: &str = "sk-ant-upstream";
/// What the mock answers with text: this and the last user text (or tool result).
const REPLY_PREFIX: &str = "anthropic says: ";
/// The models the mock lists.
const LISTED: &[&str] = &["claude-sonnet-4-5", "claude-haiku-4-5", "other-model"];

#[derive(Default)]
struct ApiState {
    seen: Mutex<Vec<SeenRequest>>,
}

/// A mock of Anthropic's API: `POST /v1/messages` (whole or streamed, a `tool_use` of the first
/// tool when tools are offered and the last turn holds no tool result) and `GET /v1/models`,
/// both requiring `x-api-key: KEY`. Model `overloaded` gets Anthropic's 529.
struct AnthropicApi {
    url: String,
    state: Arc<ApiState>,
    task: JoinHandle<()>,
}

impl AnthropicApi {
    async fn start() -> AnthropicApi {
        let state = Arc::new(ApiState::default());
        let app = Router::new()
            .route("/v1/messages", routing::post(messages))
            .route("/v1/models", routing::get(models))
            .with_state(state.clone());
        let (addr, task) = serve_app(app, "127.0.0.1:0".parse().expect("address")).await;
        AnthropicApi {
            url: format!("http://{addr}"),
            state,
            task,
        }
    }

    fn seen(&self) -> Vec<SeenRequest> {
        self.state.seen.lock().unwrap().clone()
    }

    /// The Messages requests seen so far.
    fn messages(&self) -> Vec<Value> {
        self.seen()
            .into_iter()
            .filter(|r| r.path.starts_with("/v1/messages"))
            .map(|r| r.body)
            .collect()
    }
}

impl Drop for AnthropicApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn anthropic_error(status: StatusCode, kind: &str, message: &str) -> Response {
    let body = json!({"type": "error", "error": {"type": kind, "message": message}});
    (status, Json(body)).into_response()
}

fn record(state: &ApiState, uri: &Uri, headers: &HeaderMap, body: Value) -> bool {
    state.seen.lock().unwrap().push(SeenRequest {
        path: uri.to_string(),
        headers: headers.clone(),
        body,
    });
    headers.get("x-api-key").and_then(|v| v.to_str().ok()) == Some(KEY)
}

async fn models(State(state): State<Arc<ApiState>>, uri: Uri, headers: HeaderMap) -> Response {
    if !record(&state, &uri, &headers, Value::Null) {
        return anthropic_error(StatusCode::UNAUTHORIZED, "authentication_error", "bad key");
    }
    let data: Vec<Value> = LISTED
        .iter()
        .map(|id| json!({"type": "model", "id": id, "display_name": id, "created_at": "2025-01-01T00:00:00Z"}))
        .collect();
    Json(json!({"data": data, "has_more": false, "first_id": LISTED[0], "last_id": LISTED[2]}))
        .into_response()
}

/// The text the mock answers: the last turn's text or tool result text.
fn last_text(body: &Value) -> String {
    let last = body["messages"].as_array().and_then(|m| m.last());
    let blocks = last.and_then(|m| m["content"].as_array()).cloned();
    let mut text = String::new();
    for block in blocks.into_iter().flatten() {
        match block["type"].as_str() {
            Some("text") => text.push_str(block["text"].as_str().unwrap_or_default()),
            Some("tool_result") => {
                for part in block["content"].as_array().into_iter().flatten() {
                    text.push_str(part["text"].as_str().unwrap_or_default());
                }
            }
            _ => {}
        }
    }
    text
}

async fn messages(
    State(state): State<Arc<ApiState>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    if !record(&state, &uri, &headers, body.clone()) {
        return anthropic_error(StatusCode::UNAUTHORIZED, "authentication_error", "bad key");
    }
    let model = body["model"].as_str().unwrap_or_default().to_string();
    if model == "overloaded" {
        let status = StatusCode::from_u16(529).expect("status");
        return anthropic_error(status, "overloaded_error", "Overloaded");
    }
    let answered_tool = body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .is_some_and(|m| m.to_string().contains("tool_result"));
    let tool = body["tools"]
        .as_array()
        .and_then(|t| t.first())
        .filter(|_| !answered_tool)
        .map(|t| t["name"].as_str().unwrap_or_default().to_string());
    let usage = json!({"input_tokens": 20, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 5, "output_tokens": 9});
    let text = format!("{REPLY_PREFIX}{}", last_text(&body));
    let (block, stop) = match &tool {
        Some(name) => (
            json!({"type": "tool_use", "id": "toolu_mock", "name": name, "input": {"city": "Paris"}}),
            "tool_use",
        ),
        None => (json!({"type": "text", "text": text}), "end_turn"),
    };
    if body["stream"] != true {
        return Json(json!({
            "id": "msg_mock", "type": "message", "role": "assistant", "model": model,
            "content": [block], "stop_reason": stop, "stop_sequence": null, "usage": usage,
        }))
        .into_response();
    }
    let event = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
    let mut events = vec![
        event(
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_mock", "type": "message", "role": "assistant", "model": model, "content": [], "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 20, "cache_read_input_tokens": 5, "output_tokens": 1}}}),
        ),
        event("ping", json!({"type": "ping"})),
    ];
    let delta = |delta: Value| {
        event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": delta}),
        )
    };
    match &tool {
        Some(name) => {
            events.push(event("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": "toolu_mock", "name": name, "input": {}}})));
            for piece in ["{\"city\": ", "\"Paris\"}"] {
                events.push(delta(
                    json!({"type": "input_json_delta", "partial_json": piece}),
                ));
            }
        }
        None => {
            events.push(event("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})));
            for (i, word) in text.split(' ').enumerate() {
                let piece = if i == 0 {
                    word.to_string()
                } else {
                    format!(" {word}")
                };
                events.push(delta(json!({"type": "text_delta", "text": piece})));
            }
        }
    }
    events.push(event(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 0}),
    ));
    events.push(event("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null}, "usage": {"output_tokens": 9}})));
    events.push(event("message_stop", json!({"type": "message_stop"})));
    sse_response(events)
}

fn upstream(base_url: &str, models: &[&str]) -> UpstreamConfig {
    UpstreamConfig {
        name: "claude".to_string(),
        kind: UpstreamKind::Anthropic,
        base_url: base_url.to_string(),
        api_key: Some(KEY.to_string()),
        models: models.iter().map(|m| m.to_string()).collect(),
    }
}

async fn proxy_in_front_of(upstreams: Vec<UpstreamConfig>) -> RunningProxy {
    let mut config = test_config();
    config.upstreams = upstreams;
    start_proxy(config).await
}

fn parse(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// The JSON `data:` payloads of an SSE body; `[DONE]` as the string `"[DONE]"`.
fn data(body: &str) -> Vec<Value> {
    sse_data(body)
        .into_iter()
        .map(|d| serde_json::from_str(&d).unwrap_or(Value::String(d)))
        .collect()
}

const CLIENT_HEADERS: &[(&str, &str)] = &[
    ("authorization", "Bearer client-key"),
    ("openai-organization", "org-client"),
];

/// POSTs chat completions `body` with the client's own credentials (which must stay home);
/// checks that it succeeded and returns the answer's headers and text.
async fn post_chat_as_client(proxy: &RunningProxy, body: &Value) -> (HeaderMap, String) {
    let (status, headers, text) = post_raw(
        &proxy.url(),
        "/v1/chat/completions",
        body.to_string(),
        CLIENT_HEADERS,
    )
    .await;
    assert_eq!(status, 200, "{text}");
    (headers, text)
}

#[tokio::test]
async fn chat_completions_for_an_anthropic_upstream_are_translated_to_messages_and_back() {
    let api = AnthropicApi::start().await;
    let proxy = proxy_in_front_of(vec![upstream(&api.url, &["claude-*"])]).await;
    let body = json!({"model": "claude-sonnet-4-5", "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi there"}
    ]});
    let (_, text) = post_chat_as_client(&proxy, &body).await;
    let answer = parse(&text);
    assert_eq!(answer["object"], "chat.completion");
    assert_eq!(answer["model"], "claude-sonnet-4-5");
    let choice = &answer["choices"][0];
    assert_eq!(choice["message"]["content"], "anthropic says: Hi there");
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(
        answer["usage"]["prompt_tokens"], 25,
        "cached tokens count as prompt"
    );
    assert_eq!(answer["usage"]["completion_tokens"], 9);
    let seen = api.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/v1/messages");
    assert_eq!(seen[0].headers["x-api-key"], KEY);
    assert_eq!(seen[0].headers["anthropic-version"], "2023-06-01");
    assert!(
        seen[0].headers.get("authorization").is_none(),
        "the client's key stays home"
    );
    assert!(seen[0].headers.get("openai-organization").is_none());
    assert_eq!(
        seen[0].body["system"],
        json!([{"type": "text", "text": "Be brief."}])
    );
    assert_eq!(
        seen[0].body["max_tokens"], 4096,
        "Anthropic requires a limit"
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn streamed_chat_completions_from_an_anthropic_upstream_arrive_as_chat_chunks() {
    let api = AnthropicApi::start().await;
    let proxy = proxy_in_front_of(vec![upstream(&api.url, &["claude-*"])]).await;
    let body = json!({"model": "claude-haiku-4-5", "stream": true,
                      "stream_options": {"include_usage": true},
                      "messages": [{"role": "user", "content": "Stream please"}]});
    let (headers, text) = post_chat_as_client(&proxy, &body).await;
    assert_eq!(headers["content-type"], "text/event-stream");
    let chunks = data(&text);
    assert_eq!(chunks.last(), Some(&json!("[DONE]")), "{text}");
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, "anthropic says: Stream please");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let finishes: Vec<&Value> = chunks
        .iter()
        .map(|c| &c["choices"][0]["finish_reason"])
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finishes, [&json!("stop")]);
    let usage = &chunks[chunks.len() - 2];
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["total_tokens"], 34);
    assert_eq!(api.messages()[0]["stream"], true);
    proxy.shutdown().await;
}

#[tokio::test]
async fn chat_tool_calls_round_trip_through_an_anthropic_upstream() {
    let api = AnthropicApi::start().await;
    let proxy = proxy_in_front_of(vec![upstream(&api.url, &["claude-*"])]).await;
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    for stream in [true, false] {
        let mut messages = vec![json!({"role": "user", "content": "Weather in Paris?"})];
        let body = json!({"model": "claude-sonnet-4-5", "stream": stream,
                          "tools": tools, "messages": messages});
        let (status, _, text) = post(&proxy.url(), "/v1/chat/completions", &body).await;
        assert_eq!(status, 200, "{text}");
        let (call, finish) = if stream {
            let chunks = data(&text);
            let arguments: String = chunks
                .iter()
                .filter_map(|c| {
                    c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str()
                })
                .collect();
            let named = chunks
                .iter()
                .find(|c| c["choices"][0]["delta"]["tool_calls"][0]["id"].is_string())
                .expect("a named call");
            let mut call = named["choices"][0]["delta"]["tool_calls"][0].clone();
            call["function"]["arguments"] = json!(arguments);
            let finish = chunks
                .iter()
                .find_map(|c| c["choices"][0]["finish_reason"].as_str().map(String::from));
            (call, finish.expect("finish"))
        } else {
            let answer = parse(&text);
            let choice = &answer["choices"][0];
            (
                choice["message"]["tool_calls"][0].clone(),
                choice["finish_reason"].as_str().unwrap().to_string(),
            )
        };
        assert_eq!(finish, "tool_calls");
        assert_eq!(call["id"], "toolu_mock");
        assert_eq!(call["function"]["name"], "get_weather");
        let arguments: Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(arguments, json!({"city": "Paris"}));
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "toolu_mock", "type": "function", "function": {"name": "get_weather", "arguments": call["function"]["arguments"]}}
        ]}));
        messages.push(json!({"role": "tool", "tool_call_id": "toolu_mock", "content": "Sunny"}));
        let body = json!({"model": "claude-sonnet-4-5", "tools": tools, "messages": messages});
        let (status, _, text) = post(&proxy.url(), "/v1/chat/completions", &body).await;
        assert_eq!(status, 200, "{text}");
        assert_eq!(
            parse(&text)["choices"][0]["message"]["content"],
            "anthropic says: Sunny"
        );
        let sent = api.messages().pop().expect("sent");
        assert_eq!(sent["messages"][1]["content"][0]["type"], "tool_use");
        assert_eq!(
            sent["messages"][1]["content"][0]["input"],
            json!({"city": "Paris"})
        );
        assert_eq!(
            sent["messages"][2]["content"][0],
            json!({"type": "tool_result", "tool_use_id": "toolu_mock", "content": [{"type": "text", "text": "Sunny"}]})
        );
    }
    proxy.shutdown().await;
}

#[tokio::test]
async fn responses_for_an_anthropic_upstream_are_translated_and_continued() {
    let api = AnthropicApi::start().await;
    let proxy = proxy_in_front_of(vec![upstream(&api.url, &["claude-*"])]).await;
    let first =
        json!({"model": "claude-sonnet-4-5", "instructions": "Be brief.", "input": "I am Ada."});
    let (status, _, text) = post(&proxy.url(), "/v1/responses", &first).await;
    assert_eq!(status, 200, "{text}");
    let first = parse(&text);
    assert_eq!(first["object"], "response");
    assert_eq!(first["status"], "completed");
    assert_eq!(
        first["output"][0]["content"][0]["text"],
        "anthropic says: I am Ada."
    );
    assert_eq!(first["usage"]["input_tokens"], 25);

    // A streamed continuation: the stored conversation goes upstream, the stream is Responses.
    let second = json!({"model": "claude-sonnet-4-5", "previous_response_id": first["id"],
                        "input": "Who am I?", "stream": true});
    let (status, _, text) = post(&proxy.url(), "/v1/responses", &second).await;
    assert_eq!(status, 200, "{text}");
    let events = data(&text);
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(kinds.first(), Some(&"response.created"));
    assert_eq!(kinds.last(), Some(&"response.completed"));
    for (i, event) in events.iter().enumerate() {
        assert_eq!(event["sequence_number"], i, "{event}");
    }
    let completed = &events.last().unwrap()["response"];
    assert_eq!(completed["previous_response_id"], first["id"]);
    assert_eq!(events[0]["response"]["previous_response_id"], first["id"]);
    assert_eq!(
        completed["output"][0]["content"][0]["text"],
        "anthropic says: Who am I?"
    );
    let sent = api.messages().pop().expect("sent");
    let texts: Vec<String> = sent["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            format!(
                "{}: {}",
                m["role"].as_str().unwrap(),
                m["content"][0]["text"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        texts,
        [
            "user: I am Ada.",
            "assistant: anthropic says: I am Ada.",
            "user: Who am I?"
        ]
    );
    // The streamed answer was stored too.
    let path = format!("/v1/responses/{}", completed["id"].as_str().unwrap());
    let (status, stored) = get_json(&proxy.url(), &path, &[]).await;
    assert_eq!(status, 200);
    assert_eq!(stored["previous_response_id"], first["id"]);
    proxy.shutdown().await;
}

#[tokio::test]
async fn an_anthropic_upstream_error_reaches_an_openai_client_in_its_dialect() {
    let api = AnthropicApi::start().await;
    let proxy = proxy_in_front_of(vec![upstream(&api.url, &["overloaded", "claude-*"])]).await;
    for path in ["/v1/chat/completions", "/v1/responses"] {
        let body = json!({"model": "overloaded", "input": "hi", "messages": [{"role": "user", "content": "hi"}]});
        let (status, _, text) = post(&proxy.url(), path, &body).await;
        assert_eq!(status.as_u16(), 529, "{path}: {text}");
        let error = parse(&text);
        assert_eq!(error["error"]["message"], "Overloaded", "{path}");
        assert!(
            error.get("type").is_none(),
            "OpenAI shape, not Anthropic's: {text}"
        );
    }
    // What Anthropic has no route for is refused in the client's dialect, without a request.
    let before = api.seen().len();
    for path in ["/v1/completions", "/v1/embeddings"] {
        let body = json!({"model": "claude-sonnet-4-5", "prompt": "x", "input": "x"});
        let (status, _, text) = post(&proxy.url(), path, &body).await;
        assert_eq!(status, 400, "{path}: {text}");
        assert_eq!(parse(&text)["error"]["code"], "unsupported_route");
    }
    assert_eq!(api.seen().len(), before);
    proxy.shutdown().await;
}

#[tokio::test]
async fn models_given_by_pattern_are_listed_from_the_upstreams_own_list() {
    let api = AnthropicApi::start().await;
    let proxy = proxy_in_front_of(vec![upstream(&api.url, &["claude-*", "claude-legacy"])]).await;
    let (status, list) = get_json(&proxy.url(), "/v1/models", &[]).await;
    assert_eq!(status, 200);
    let listed: Vec<(&str, &str)> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["id"].as_str().unwrap(), m["owned_by"].as_str().unwrap()))
        .collect();
    assert_eq!(
        listed,
        [
            ("claude-legacy", "claude"),
            ("claude-sonnet-4-5", "claude"),
            ("claude-haiku-4-5", "claude")
        ],
        "exact names, then the upstream's models matching the pattern"
    );
    let fetches: Vec<SeenRequest> = api.seen();
    assert_eq!(fetches.len(), 1);
    assert_eq!(fetches[0].path, "/v1/models?limit=1000");
    assert_eq!(fetches[0].headers["x-api-key"], KEY);
    // Cached: neither the Anthropic-shaped list nor one model asks the upstream again.
    let (status, list) = get_json(
        &proxy.url(),
        "/v1/models",
        &[("anthropic-version", "2023-06-01")],
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(list["last_id"], "claude-haiku-4-5");
    let (status, model) = get_json(&proxy.url(), "/v1/models/claude-sonnet-4-5", &[]).await;
    assert_eq!(status, 200);
    assert_eq!(model["owned_by"], "claude");
    let (status, _) = get_json(&proxy.url(), "/v1/models/other-model", &[]).await;
    assert_eq!(status, 404, "listed upstream but not matching the pattern");
    assert_eq!(api.seen().len(), 1, "the list is cached");
    proxy.shutdown().await;
}

#[tokio::test]
async fn an_upstream_that_is_down_does_not_fail_the_model_list() {
    let dead = dead_addr().await;
    let proxy = proxy_in_front_of(vec![upstream(
        &format!("http://{dead}"),
        &["claude-*", "claude-exact"],
    )])
    .await;
    let started = Instant::now();
    let (status, list) = get_json(&proxy.url(), "/v1/models", &[]).await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["data"][0]["id"], "claude-exact");
    assert_eq!(list["data"].as_array().unwrap().len(), 1);
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "bounded by the fetch timeout"
    );
    proxy.shutdown().await;
}
