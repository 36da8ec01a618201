//! The Responses API around the store (issue 3): `GET /v1/responses/{id}/input_items`, streamed
//! continuations echoing `previous_response_id`, and native Responses streams (passed through
//! from a backend that serves `/v1/responses` itself, as llama-server does) getting the
//! `sequence_number`, `output_index` and `content_index` they lack.

use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{routing, Json, Router};
use relay_core::proxy::RunningProxy;
use serde_json::{json, Value};

use crate::support::*;

const MODEL: &str = "chat-model";

fn parse(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// The JSON `data:` payloads of an SSE body.
fn data(body: &str) -> Vec<Value> {
    sse_data(body).iter().map(|d| parse(d)).collect()
}

/// A proxy and a real worker in front of the backend at `url`.
async fn relay_to(url: &str) -> (RunningProxy, RunningWorker) {
    let proxy = start_proxy(test_config()).await;
    let worker = RunningWorker::start(&proxy, url, None, 4);
    wait_until("the worker registers", || proxy.hub.models().len() == 1).await;
    (proxy, worker)
}

async fn respond(proxy: &RunningProxy, body: Value) -> Value {
    let (status, _, text) = post(&proxy.url(), "/v1/responses", &body).await;
    assert_eq!(status, 200, "{text}");
    parse(&text)
}

/// The text of an input item's content, as `role: text`.
fn item_text(item: &Value) -> String {
    let text: String = item["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|part| part["text"].as_str())
        .collect();
    format!("{}: {text}", item["role"].as_str().unwrap_or_default())
}

#[tokio::test]
async fn input_items_list_the_context_a_stored_response_was_generated_from() {
    let backend = ChatOnlyBackend::start(&[MODEL]).await;
    let (proxy, worker) = relay_to(&backend.url()).await;
    let first = respond(
        &proxy,
        json!({"model": MODEL, "instructions": "Be brief.", "input": "My name is Ada."}),
    )
    .await;
    let second = respond(
        &proxy,
        json!({"model": MODEL, "previous_response_id": first["id"],
               "input": [{"role": "user", "content": "What is my name?"}]}),
    )
    .await;
    let path = format!(
        "/v1/responses/{}/input_items",
        second["id"].as_str().unwrap()
    );
    let (status, list) = get_json(&proxy.url(), &path, &[]).await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["object"], "list");
    assert_eq!(list["has_more"], false);
    let items = list["data"].as_array().unwrap();
    let texts: Vec<String> = items.iter().map(item_text).collect();
    assert_eq!(
        texts,
        [
            "user: What is my name?",
            "assistant: reply to: My name is Ada.",
            "user: My name is Ada."
        ],
        "newest first by default; the continued conversation included, instructions not"
    );
    assert_eq!(list["first_id"], items[0]["id"]);
    assert_eq!(list["last_id"], items[2]["id"]);
    assert_eq!(items[0]["type"], "message");
    assert_eq!(items[0]["status"], "completed");
    assert_eq!(items[0]["content"][0]["type"], "input_text");
    assert_eq!(items[1]["content"][0]["type"], "output_text");
    assert!(items[0]["id"].as_str().unwrap().starts_with("msg_"));

    // Paging in ascending order with `limit` and `after`.
    let (_, page) = get_json(&proxy.url(), &format!("{path}?order=asc&limit=2"), &[]).await;
    let ids: Vec<&Value> = page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| &i["id"])
        .collect();
    assert_eq!(ids, [&items[2]["id"], &items[1]["id"]]);
    assert_eq!(page["has_more"], true);
    let after = page["last_id"].as_str().unwrap();
    let (_, rest) = get_json(
        &proxy.url(),
        &format!("{path}?order=asc&limit=2&after={after}"),
        &[],
    )
    .await;
    assert_eq!(rest["data"].as_array().unwrap().len(), 1);
    assert_eq!(rest["data"][0]["id"], items[0]["id"]);
    assert_eq!(rest["has_more"], false);

    // The first response's own input is just its input.
    let path = format!(
        "/v1/responses/{}/input_items",
        first["id"].as_str().unwrap()
    );
    let (_, list) = get_json(&proxy.url(), &path, &[]).await;
    let texts: Vec<String> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(item_text)
        .collect();
    assert_eq!(texts, ["user: My name is Ada."]);
    worker.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn input_items_of_an_unknown_response_or_with_bad_parameters_are_errors_in_openai_shape() {
    let backend = ChatOnlyBackend::start(&[MODEL]).await;
    let (proxy, worker) = relay_to(&backend.url()).await;
    let (status, error) = get_json(&proxy.url(), "/v1/responses/resp_nope/input_items", &[]).await;
    assert_eq!(status, 404);
    assert_eq!(error["error"]["code"], "response_not_found");
    assert_eq!(error["error"]["type"], "invalid_request_error");
    let stored = respond(&proxy, json!({"model": MODEL, "input": "hi"})).await;
    let path = format!(
        "/v1/responses/{}/input_items",
        stored["id"].as_str().unwrap()
    );
    for query in [
        "limit=0",
        "limit=101",
        "limit=x",
        "order=sideways",
        "after=msg_unknown",
    ] {
        let (status, error) = get_json(&proxy.url(), &format!("{path}?{query}"), &[]).await;
        assert_eq!(status, 400, "{query}: {error}");
        assert_eq!(error["error"]["code"], "invalid_request", "{query}");
        let name = query.split('=').next().unwrap();
        assert!(
            error["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with(name),
            "{query}: the message names the parameter: {error}"
        );
    }
    worker.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_streamed_continuation_echoes_previous_response_id_like_a_unary_one() {
    let backend = ChatOnlyBackend::start(&[MODEL]).await;
    let (proxy, worker) = relay_to(&backend.url()).await;
    let first = respond(&proxy, json!({"model": MODEL, "input": "One."})).await;
    let body = json!({"model": MODEL, "previous_response_id": first["id"], "input": "Two.", "stream": true});
    let (status, _, text) = post(&proxy.url(), "/v1/responses", &body).await;
    assert_eq!(status, 200, "{text}");
    let events = data(&text);
    let with_response: Vec<&Value> = events
        .iter()
        .filter(|e| e.get("response").is_some())
        .collect();
    let kinds: Vec<&str> = with_response
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.in_progress",
            "response.completed"
        ]
    );
    for event in with_response {
        assert_eq!(
            event["response"]["previous_response_id"], first["id"],
            "{event}"
        );
    }
    for (i, event) in events.iter().enumerate() {
        assert_eq!(event["sequence_number"], i, "numbering is kept: {event}");
    }
    // A standalone stream echoes nothing.
    let body = json!({"model": MODEL, "input": "Alone.", "stream": true});
    let (_, _, text) = post(&proxy.url(), "/v1/responses", &body).await;
    assert!(data(&text)[0]["response"]["previous_response_id"].is_null());
    worker.stop().await;
    proxy.shutdown().await;
}

// A backend that serves /v1/responses itself, streaming the way llama-server does: every event
// without `sequence_number`, `output_index` or `content_index`.

#[derive(Default)]
struct NativeState {
    bodies: Mutex<Vec<Value>>,
}

/// The events of the native stream, as the backend sends them.
fn native_events(previous: Option<&str>) -> Vec<Value> {
    let response = |status: &str, output: Value| {
        json!({"id": "resp_native", "object": "response", "status": status, "model": MODEL,
               "output": output, "previous_response_id": previous})
    };
    let message = json!({"id": "msg_native", "type": "message", "role": "assistant", "status": "completed",
                         "content": [{"type": "output_text", "text": "Hi there", "annotations": []}]});
    vec![
        json!({"type": "response.created", "response": response("in_progress", json!([]))}),
        json!({"type": "response.output_item.added", "item": {"id": "msg_native", "type": "message", "role": "assistant", "status": "in_progress", "content": []}}),
        json!({"type": "response.content_part.added", "item_id": "msg_native", "part": {"type": "output_text", "text": ""}}),
        json!({"type": "response.output_text.delta", "item_id": "msg_native", "delta": "Hi"}),
        json!({"type": "response.output_text.delta", "item_id": "msg_native", "delta": " there"}),
        json!({"type": "response.output_text.done", "item_id": "msg_native", "text": "Hi there"}),
        json!({"type": "response.output_item.done", "item": message}),
        json!({"type": "response.completed", "response": response("completed", json!([message]))}),
    ]
}

async fn native_responses(State(state): State<Arc<NativeState>>, body: Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    state.bodies.lock().unwrap().push(body.clone());
    // Like llama-server: no store of its own, so `previous_response_id` is never echoed.
    let events = native_events(None);
    if body["stream"] != true {
        return Json(events.last().unwrap()["response"].clone()).into_response();
    }
    let text: String = events
        .iter()
        .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap()))
        .collect();
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from(text))
        .expect("response")
}

async fn native_models() -> Json<Value> {
    Json(json!({"object": "list", "data": [{"id": MODEL, "object": "model"}]}))
}

#[tokio::test]
async fn native_responses_streams_get_sequence_numbers_indices_and_the_continuation_echo() {
    let state = Arc::new(NativeState::default());
    let app = Router::new()
        .route("/v1/models", routing::get(native_models))
        .route("/v1/responses", routing::post(native_responses))
        .with_state(state.clone());
    let (addr, task) = serve_app(app, "127.0.0.1:0".parse().unwrap()).await;
    let (proxy, worker) = relay_to(&format!("http://{addr}")).await;
    let first = respond(&proxy, json!({"model": MODEL, "input": "Hello"})).await;
    assert_eq!(first["id"], "resp_native", "passed through");
    let body = json!({"model": MODEL, "previous_response_id": "resp_native", "input": "Again", "stream": true});
    let (status, _, text) = post(&proxy.url(), "/v1/responses", &body).await;
    assert_eq!(status, 200, "{text}");
    let events = data(&text);
    let sent = native_events(None);
    assert_eq!(events.len(), sent.len());
    let zero = json!(0);
    for (i, (got, sent)) in events.iter().zip(&sent).enumerate() {
        assert_eq!(got["sequence_number"], i, "{got}");
        let kind = sent["type"].as_str().unwrap();
        // The stream's one item, and its one part: what the SDK's stream helper indexes.
        let about_item =
            kind.starts_with("response.output_") || kind.starts_with("response.content_");
        let about_part =
            kind.starts_with("response.output_text.") || kind.starts_with("response.content_");
        assert_eq!(
            got.get("output_index"),
            about_item.then_some(&zero),
            "{got}"
        );
        assert_eq!(
            got.get("content_index"),
            about_part.then_some(&zero),
            "{got}"
        );
        let mut got = got.clone();
        for added in ["sequence_number", "output_index", "content_index"] {
            got.as_object_mut().unwrap().remove(added);
        }
        if let Some(response) = got.get_mut("response") {
            assert_eq!(response["previous_response_id"], "resp_native");
            response["previous_response_id"] = Value::Null;
        }
        assert_eq!(&got, sent, "nothing else changes");
    }
    // The continuation reached the native backend as a whole conversation.
    let continued = state.bodies.lock().unwrap()[1].clone();
    assert!(
        continued.get("previous_response_id").is_none(),
        "{continued}"
    );
    assert_eq!(continued["input"].as_array().unwrap().len(), 3);
    worker.stop().await;
    proxy.shutdown().await;
    task.abort();
}

#[tokio::test]
async fn a_continuation_answered_with_json_that_is_not_an_object_passes_as_it_is() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "odd", &[MODEL], 4).await;
    let base = proxy.url();
    let first = tokio::spawn(async move {
        post(
            &base,
            "/v1/responses",
            &json!({"model": MODEL, "input": "One."}),
        )
        .await
    });
    let request = worker.next_request().await;
    let stored = json!({"id": "resp_a", "object": "response", "status": "completed", "model": MODEL,
        "output": [{"type": "message", "id": "msg_a", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": "Hi.", "annotations": []}]}]});
    worker
        .complete(&request.request_id, &stored.to_string())
        .await;
    let (status, _, text) = first.await.unwrap();
    assert_eq!(status, 200, "{text}");

    // The continuation is found, and the backend's odd answers neither panic the proxy nor change.
    for odd in ["[1,2]", "\"text\"", "42", "null"] {
        let base = proxy.url();
        let body = json!({"model": MODEL, "previous_response_id": "resp_a", "input": "Two."});
        let next = tokio::spawn(async move { post(&base, "/v1/responses", &body).await });
        let request = worker.next_request().await;
        worker.complete(&request.request_id, odd).await;
        let (status, _, text) = next.await.unwrap();
        assert_eq!((status.as_u16(), text.as_str()), (200, odd));
    }
    let (status, _, _) = post(&proxy.url(), "/v1/models", &json!({})).await;
    assert_eq!(status, 405, "the proxy still serves");
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_worker_answering_with_a_stored_responses_id_cannot_replace_it() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "rogue", &[MODEL], 4).await;
    let answer = |text: &str| {
        json!({"id": "resp_same", "object": "response", "status": "completed", "model": MODEL,
            "output": [{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": text, "annotations": []}]}]})
        .to_string()
    };
    // A first request is answered and stored as resp_same...
    let first = spawn_post(
        &proxy.url(),
        "/v1/responses",
        json!({"model": MODEL, "input": "the first client's prompt"}),
    );
    let request = worker.next_request().await;
    worker
        .complete(&request.request_id, &answer("first answer"))
        .await;
    assert_eq!(first.await.unwrap().0, 200);
    // ... then the worker answers another request with the same id.
    let second = spawn_post(
        &proxy.url(),
        "/v1/responses",
        json!({"model": MODEL, "input": "a second prompt"}),
    );
    let request = worker.next_request().await;
    worker
        .complete(&request.request_id, &answer("planted answer"))
        .await;
    assert_eq!(second.await.unwrap().0, 200);
    // The stored response and its prompt are still the first request's.
    let (status, stored) = get_json(&proxy.url(), "/v1/responses/resp_same", &[]).await;
    assert_eq!(status, 200, "{stored}");
    let text = stored.to_string();
    assert!(
        text.contains("first answer") && !text.contains("planted"),
        "{text}"
    );
    let (status, items) = get_json(&proxy.url(), "/v1/responses/resp_same/input_items", &[]).await;
    assert_eq!(status, 200, "{items}");
    assert!(
        items.to_string().contains("the first client's prompt"),
        "{items}"
    );
    proxy.shutdown().await;
}
