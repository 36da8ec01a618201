//! Streaming and cancellation (contract: "Streaming chunk ordering and termination semantics",
//! "Client cancellation propagation end to end", "Worker disconnect during active request", and
//! the invariant that worker churn or late chunks never leave requests hanging).

use std::pin::Pin;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{SinkExt, Stream, StreamExt};
use relay_core::protocol::{CancelReason, ServerToWorker};
use relay_core::proxy::ProxyConfig;
use serde_json::{json, Value};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;

use crate::support::*;

type BodyStream = Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>;

const QUIET: Duration = Duration::from_millis(300);
/// How long a chunk may take from the worker to the client for the flush to count as prompt.
const PROMPT: Duration = Duration::from_secs(3);

fn streaming_chat(model: &str) -> Value {
    json!({"model": model, "stream": true, "messages": [{"role": "user", "content": "hi"}]})
}

fn streaming_messages(model: &str) -> Value {
    json!({"model": model, "stream": true, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]})
}

/// Sends a streaming request in the background; the response arrives with the first chunk.
fn open_stream(base: &str, path: &str, body: Value) -> JoinHandle<reqwest::Response> {
    let url = format!("{base}{path}");
    tokio::spawn(async move {
        http()
            .post(url)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .expect("request sent")
    })
}

async fn response_of(task: JoinHandle<reqwest::Response>) -> reqwest::Response {
    tokio::time::timeout(WAIT, task)
        .await
        .expect("response headers in time")
        .expect("client task")
}

fn body_stream(response: reqwest::Response) -> BodyStream {
    Box::pin(response.bytes_stream())
}

/// Reads exactly `expected.len()` bytes (however they are split) within `within`.
async fn read_exact(body: &mut BodyStream, len: usize, within: Duration) -> Vec<u8> {
    let deadline = tokio::time::Instant::now() + within;
    let mut got = Vec::new();
    while got.len() < len {
        match tokio::time::timeout_at(deadline, body.next()).await {
            Err(_) => panic!(
                "only {:?} of {len} bytes arrived within {within:?}",
                String::from_utf8_lossy(&got)
            ),
            Ok(Some(Ok(bytes))) => got.extend_from_slice(&bytes),
            Ok(Some(Err(error))) => panic!("body error: {error}"),
            Ok(None) => panic!("stream ended early: {:?}", String::from_utf8_lossy(&got)),
        }
    }
    got
}

/// Reads until the stream ends.
async fn read_to_end(body: &mut BodyStream) -> String {
    let mut got = Vec::new();
    loop {
        match tokio::time::timeout(WAIT, body.next())
            .await
            .expect("the stream ends in time")
        {
            Some(Ok(bytes)) => got.extend_from_slice(&bytes),
            Some(Err(error)) => panic!("body error: {error}"),
            None => return String::from_utf8(got).expect("UTF-8 body"),
        }
    }
}

fn config_with(change: impl FnOnce(&mut ProxyConfig)) -> ProxyConfig {
    let mut config = test_config();
    change(&mut config);
    config
}

#[tokio::test]
async fn streaming_chunks_reach_the_client_promptly_in_order_and_byte_for_byte() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "w", &["m"], 1).await;
    let task = open_stream(&proxy.url(), "/v1/chat/completions", streaming_chat("m"));
    let request = worker.next_request().await;
    assert!(request.is_streaming);
    let chunks = [
        "data: {\"choices\":[{\"delta\":{\"content\":\"h\u{e9}llo \u{1f600}\"}}]}\n\n",
        ": keep-alive comment\n\n",
        "event: custom\r\ndata: {\"a\" : 1}\r\n\r\n",
        "data: {\"partial\":",
        " \"line\"}\n\n",
        "data: [DONE]\n\n",
    ];
    worker.chunk(&request.request_id, chunks[0]).await;
    let response = response_of(task).await;
    assert_eq!(response.status(), 200);
    let mut body = body_stream(response);
    for (i, chunk) in chunks.iter().enumerate() {
        if i > 0 {
            worker.chunk(&request.request_id, chunk).await;
        }
        // Handshake: the next chunk is sent only once this one reached the client.
        let got = read_exact(&mut body, chunk.len(), PROMPT).await;
        assert_eq!(
            String::from_utf8(got).unwrap(),
            *chunk,
            "chunk {i} arrives alone, unaltered, before the next is sent"
        );
    }
    worker.finish_stream(&request.request_id).await;
    assert_eq!(
        read_to_end(&mut body).await,
        "",
        "nothing after the last chunk"
    );
}

#[tokio::test]
async fn streaming_response_is_an_event_stream_with_proxy_buffering_disabled() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "w", &["m"], 1).await;
    let task = open_stream(&proxy.url(), "/v1/chat/completions", streaming_chat("m"));
    let request = worker.next_request().await;
    worker.chunk(&request.request_id, "data: {}\n\n").await;
    let response = response_of(task).await;
    assert_eq!(response.status(), 200);
    let headers = response.headers().clone();
    assert!(
        headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream"),
        "SSE content type: {headers:?}"
    );
    assert_eq!(headers["x-accel-buffering"], "no");
    worker.finish_stream(&request.request_id).await;
    assert_eq!(
        read_to_end(&mut body_stream(response)).await,
        "data: {}\n\n"
    );
}

#[tokio::test]
async fn response_complete_ends_the_stream_and_frees_the_worker() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "w", &["m"], 1).await;
    let task = open_stream(&proxy.url(), "/v1/messages", streaming_messages("m"));
    let request = worker.next_request().await;
    let events = "event: message_start\ndata: {\"type\":\"message_start\"}\n\n";
    worker.chunk(&request.request_id, events).await;
    let stop = "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
    worker.chunk(&request.request_id, stop).await;
    worker.finish_stream(&request.request_id).await;
    let response = response_of(task).await;
    let body = read_to_end(&mut body_stream(response)).await;
    assert_eq!(body, format!("{events}{stop}"));
    wait_until("nothing is tracked", || proxy.hub.tracked_requests() == 0).await;
    assert_eq!(proxy.hub.in_flight(), 0, "the slot is free");

    let task = spawn_post(&proxy.url(), "/v1/chat/completions", json!({"model": "m"}));
    let next = worker.next_request().await;
    worker.complete(&next.request_id, "{}").await;
    assert_eq!(answer_of(task).await.0, 200);
}

#[tokio::test]
async fn stream_over_the_size_ceiling_ends_with_an_sse_error_and_cancels_the_worker() {
    let proxy = start_proxy(config_with(|c| c.max_stream_bytes = 64)).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "w", &["m"], 1).await;
    let task = open_stream(&proxy.url(), "/v1/chat/completions", streaming_chat("m"));
    let request = worker.next_request().await;
    let first = format!("data: {{\"chunk\":1,\"pad\":\"{}\"}}\n\n", "x".repeat(10));
    let second = format!("data: {{\"chunk\":2,\"pad\":\"{}\"}}\n\n", "y".repeat(30));
    assert!(first.len() <= 64 && first.len() + second.len() > 64);
    worker.chunk(&request.request_id, &first).await;
    let mut body = body_stream(response_of(task).await);
    assert_eq!(
        read_exact(&mut body, first.len(), PROMPT).await,
        first.as_bytes()
    );

    worker.chunk(&request.request_id, &second).await;
    let rest = read_to_end(&mut body).await;
    assert!(
        !rest.contains("\"chunk\":2"),
        "the oversized chunk is not sent: {rest}"
    );
    let data = sse_data(&rest);
    assert_eq!(
        data.len(),
        1,
        "exactly one SSE error event ends the stream: {rest:?}"
    );
    let error: Value = serde_json::from_str(&data[0]).expect("JSON error event");
    assert!(
        error["error"]["message"].is_string(),
        "OpenAI stream error: {error}"
    );

    let cancel = worker.next_cancel().await;
    assert_eq!(cancel.request_id, request.request_id);
    wait_until("nothing is tracked", || proxy.hub.tracked_requests() == 0).await;
}

/// A stream whose worker dies after its first chunk: returns the rest of the client's body and
/// checks that a second, idle worker never receives the request.
async fn worker_dies_mid_stream(path: &str, body: Value) -> String {
    let proxy = start_proxy(test_config()).await;
    let (mut first, _) = ScriptedWorker::join(proxy.addr, "first", &["m"], 1).await;
    let task = open_stream(&proxy.url(), path, body);
    let request = first.next_request().await;
    let (mut second, _) = ScriptedWorker::join(proxy.addr, "second", &["m"], 1).await;
    let chunk = "data: {\"part\":1}\n\n";
    first.chunk(&request.request_id, chunk).await;
    let response = response_of(task).await;
    assert_eq!(response.status(), 200);
    let mut stream = body_stream(response);
    assert_eq!(
        read_exact(&mut stream, chunk.len(), PROMPT).await,
        chunk.as_bytes()
    );

    first.crash();
    let rest = read_to_end(&mut stream).await;
    second
        .assert_nothing_for(
            QUIET,
            "a request whose answer already started is never requeued",
        )
        .await;
    wait_until("nothing is tracked", || proxy.hub.tracked_requests() == 0).await;
    rest
}

#[tokio::test]
async fn worker_death_after_first_chunk_ends_an_openai_stream_with_an_error_event_not_a_requeue() {
    let rest = worker_dies_mid_stream("/v1/chat/completions", streaming_chat("m")).await;
    assert!(rest.starts_with("data: {"), "an OpenAI SSE error: {rest:?}");
    let data = sse_data(&rest);
    assert_eq!(data.len(), 1, "{rest:?}");
    let error: Value = serde_json::from_str(&data[0]).expect("JSON error");
    assert!(error["error"]["message"].is_string(), "{error}");
}

#[tokio::test]
async fn worker_death_after_first_chunk_ends_an_anthropic_stream_with_an_error_event() {
    let rest = worker_dies_mid_stream("/v1/messages", streaming_messages("m")).await;
    assert!(
        rest.starts_with("event: error\n"),
        "an Anthropic error event: {rest:?}"
    );
    let data = sse_data(&rest);
    assert_eq!(data.len(), 1, "{rest:?}");
    let error: Value = serde_json::from_str(&data[0]).expect("JSON error");
    assert_eq!(error["type"], "error", "{error}");
    assert!(error["error"]["type"].is_string(), "{error}");
}

#[tokio::test]
async fn worker_death_before_first_chunk_requeues_the_stream_to_another_worker() {
    let proxy = start_proxy(test_config()).await;
    let (mut first, _) = ScriptedWorker::join(proxy.addr, "first", &["m"], 1).await;
    let task = open_stream(&proxy.url(), "/v1/chat/completions", streaming_chat("m"));
    let request = first.next_request().await;
    let (mut second, _) = ScriptedWorker::join(proxy.addr, "second", &["m"], 1).await;
    first.crash();

    let again = second.next_request().await;
    assert_eq!(again.request_id, request.request_id);
    assert!(again.is_streaming);
    let chunks = ["data: {\"from\":\"second\"}\n\n", "data: [DONE]\n\n"];
    for chunk in chunks {
        second.chunk(&again.request_id, chunk).await;
    }
    second.finish_stream(&again.request_id).await;
    let response = response_of(task).await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        read_to_end(&mut body_stream(response)).await,
        chunks.concat(),
        "a clean stream from the second worker"
    );
}

#[tokio::test]
async fn client_disconnect_while_queued_removes_the_request_from_the_queue() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "w", &["m"], 1).await;
    let busy = spawn_post(&proxy.url(), "/v1/chat/completions", json!({"model": "m"}));
    let running = worker.next_request().await;

    let client =
        RawHttpClient::post(proxy.addr, "/v1/chat/completions", &json!({"model": "m"})).await;
    wait_until("the request is queued", || proxy.hub.counts().1 == 1).await;
    // Make sure the proxy is not answering it: it stays queued.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(proxy.hub.counts().1, 1);
    client.disconnect();
    wait_until("the queue is empty again", || proxy.hub.counts().1 == 0).await;

    worker.complete(&running.request_id, "{}").await;
    assert_eq!(answer_of(busy).await.0, 200);
    worker
        .assert_nothing_for(QUIET, "the abandoned request is never dispatched")
        .await;
    wait_until("nothing is tracked", || proxy.hub.tracked_requests() == 0).await;
}

#[tokio::test]
async fn client_disconnect_mid_stream_sends_cancel_client_disconnect_and_drops_late_chunks() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "w", &["m"], 1).await;
    let mut client =
        RawHttpClient::post(proxy.addr, "/v1/chat/completions", &streaming_chat("m")).await;
    let request = worker.next_request().await;
    worker
        .chunk(
            &request.request_id,
            "data: {\"marker\":\"first-chunk\"}\n\n",
        )
        .await;
    client.read_until("first-chunk").await;
    client.disconnect();

    let cancel = worker.next_cancel().await;
    assert_eq!(cancel.request_id, request.request_id);
    assert_eq!(cancel.reason, CancelReason::ClientDisconnect);

    // Late chunks and the completion of the cancelled request go nowhere.
    worker
        .chunk(&request.request_id, "data: {\"marker\":\"late\"}\n\n")
        .await;
    worker.finish_stream(&request.request_id).await;
    let task = spawn_post(&proxy.url(), "/v1/chat/completions", json!({"model": "m"}));
    let next = worker.next_request().await;
    worker.complete(&next.request_id, r#"{"fresh":true}"#).await;
    let (status, _, body) = answer_of(task).await;
    assert_eq!(status, 200);
    assert_eq!(
        body, r#"{"fresh":true}"#,
        "no late chunk leaks into another answer"
    );
    wait_until("nothing is tracked", || proxy.hub.tracked_requests() == 0).await;
    assert_eq!(proxy.hub.counts().0, 1);
}

#[tokio::test]
async fn client_disconnect_before_the_answer_sends_cancel_client_disconnect() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "w", &["m"], 1).await;
    let client =
        RawHttpClient::post(proxy.addr, "/v1/chat/completions", &json!({"model": "m"})).await;
    let request = worker.next_request().await;
    assert!(!request.is_streaming);
    client.disconnect();
    let cancel = worker.next_cancel().await;
    assert_eq!(cancel.request_id, request.request_id);
    assert_eq!(cancel.reason, CancelReason::ClientDisconnect);
}

/// A cancelled request on a full worker (max 1) with another request queued behind it; `confirm`
/// is what the worker does after the cancel. Returns how long the queued request took to be
/// dispatched after the cancel.
async fn queued_request_after_cancel(
    confirm: impl AsyncFnOnce(&mut ScriptedWorker, &str),
) -> Duration {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "w", &["m"], 1).await;
    let client =
        RawHttpClient::post(proxy.addr, "/v1/chat/completions", &streaming_chat("m")).await;
    let cancelled = worker.next_request().await;
    let queued = spawn_post(
        &proxy.url(),
        "/v1/chat/completions",
        json!({"model": "m", "queued": true}),
    );
    wait_until("the second request is queued", || proxy.hub.counts().1 == 1).await;
    client.disconnect();
    let cancel = worker.next_cancel().await;
    let cancelled_at = Instant::now();
    assert_eq!(cancel.request_id, cancelled.request_id);
    assert_eq!(cancel.reason, CancelReason::ClientDisconnect);

    confirm(&mut worker, &cancelled.request_id).await;
    let next = worker.next_request().await;
    let waited = cancelled_at.elapsed();
    assert_eq!(next.body, json!({"model": "m", "queued": true}).to_string());
    worker
        .complete(&next.request_id, r#"{"queued":"served"}"#)
        .await;
    assert_eq!(answer_of(queued).await.2, r#"{"queued":"served"}"#);
    wait_until("nothing is tracked", || proxy.hub.tracked_requests() == 0).await;
    waited
}

#[tokio::test]
async fn a_cancel_frees_the_slot_at_once_even_when_the_worker_never_reports_back() {
    // The seeds' architecture: the slot is free at once. A published worker never reports
    // back after a cancel; the queued request must not wait for it.
    let waited =
        queued_request_after_cancel(async |_worker: &mut ScriptedWorker, _id: &str| {}).await;
    assert!(
        waited < Duration::from_millis(500),
        "the queued request waited {waited:?}"
    );
}

#[tokio::test]
async fn what_a_worker_still_sends_for_a_cancelled_request_is_dropped() {
    // Our worker confirms the end (an error, or the stream's completion when it had ended
    // anyway): the next request is served all the same, and the late frames change nothing.
    for late in [true, false] {
        let waited =
            queued_request_after_cancel(async move |worker: &mut ScriptedWorker, id: &str| {
                if late {
                    worker.fail(Some(id), "cancelled").await
                } else {
                    worker.finish_stream(id).await
                }
            })
            .await;
        assert!(waited < Duration::from_millis(500), "{waited:?}");
    }
}

#[tokio::test]
async fn duplicate_response_complete_is_ignored_and_the_worker_keeps_serving() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "w", &["m"], 2).await;
    let first = spawn_post(
        &proxy.url(),
        "/v1/chat/completions",
        json!({"model": "m", "n": 1}),
    );
    let r1 = worker.next_request().await;
    let second = spawn_post(
        &proxy.url(),
        "/v1/chat/completions",
        json!({"model": "m", "n": 2}),
    );
    let r2 = worker.next_request().await;

    worker.complete(&r1.request_id, r#"{"answer":1}"#).await;
    worker
        .complete(&r1.request_id, r#"{"answer":"duplicate"}"#)
        .await;
    assert_eq!(answer_of(first).await.2, r#"{"answer":1}"#);
    worker
        .assert_nothing_for(QUIET, "a duplicate completion changes nothing")
        .await;
    assert!(!second.is_finished(), "the other request is still running");
    assert_eq!(proxy.hub.in_flight(), 1);

    worker.complete(&r2.request_id, r#"{"answer":2}"#).await;
    assert_eq!(answer_of(second).await.2, r#"{"answer":2}"#);
    wait_until("nothing is tracked", || proxy.hub.tracked_requests() == 0).await;
    assert_eq!(proxy.hub.counts().0, 1, "the worker stays connected");
}

#[tokio::test]
async fn stray_and_malformed_worker_frames_are_ignored_and_the_worker_keeps_serving() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "w", &["m"], 1).await;
    let task = open_stream(&proxy.url(), "/v1/chat/completions", streaming_chat("m"));
    let request = worker.next_request().await;
    worker
        .chunk(&request.request_id, "data: {\"mine\":1}\n\n")
        .await;

    worker.chunk("r-999999", "data: {\"stray\":1}\n\n").await;
    worker
        .chunk("not-a-request-id", "data: {\"stray\":2}\n\n")
        .await;
    worker.complete("r-888888", r#"{"stray":3}"#).await;
    worker.fail(Some("r-777777"), "stray error").await;
    worker.send_text("this is not JSON at all").await;
    worker
        .send_text(r#"{"type":"mystery_message","x":1}"#)
        .await;
    worker.send_text(r#"{"type":"response_chunk"}"#).await;
    worker
        .socket
        .send(Message::Binary(vec![0u8, 159, 146, 150].into()))
        .await
        .expect("send binary frame");
    worker
        .send(&relay_core::protocol::WorkerToServer::Register(
            register_message("again", &["other"], 9, Some("1"), Some(0)),
        ))
        .await;

    worker.chunk(&request.request_id, "data: [DONE]\n\n").await;
    worker.finish_stream(&request.request_id).await;
    let body = read_to_end(&mut body_stream(response_of(task).await)).await;
    assert_eq!(
        body, "data: {\"mine\":1}\n\ndata: [DONE]\n\n",
        "only this request's chunks"
    );

    let task = spawn_post(&proxy.url(), "/v1/chat/completions", json!({"model": "m"}));
    let next = match worker.recv().await {
        ServerToWorker::Request(next) => next,
        other => panic!("the worker keeps serving; got {other:?}"),
    };
    worker.complete(&next.request_id, r#"{"ok":true}"#).await;
    assert_eq!(answer_of(task).await.2, r#"{"ok":true}"#);
    assert_eq!(proxy.hub.counts().0, 1, "the worker stays connected");
    assert_eq!(
        proxy.hub.workers()[0].models,
        vec!["m"],
        "a second register does not change the worker's models"
    );
    wait_until("nothing is tracked", || proxy.hub.tracked_requests() == 0).await;
}

#[tokio::test]
async fn cancelled_request_is_not_requeued_when_its_worker_dies() {
    let proxy = start_proxy(test_config()).await;
    let (mut first, _) = ScriptedWorker::join(proxy.addr, "first", &["m"], 1).await;
    let client =
        RawHttpClient::post(proxy.addr, "/v1/chat/completions", &json!({"model": "m"})).await;
    let request = first.next_request().await;
    let (mut second, _) = ScriptedWorker::join(proxy.addr, "second", &["m"], 1).await;
    client.disconnect();
    let cancel = first.next_cancel().await;
    assert_eq!(cancel.request_id, request.request_id);
    first.crash();
    second
        .assert_nothing_for(QUIET, "a request whose client is gone is not requeued")
        .await;
    wait_until("nothing is tracked", || proxy.hub.tracked_requests() == 0).await;
    assert_eq!(proxy.hub.counts().1, 0);
}

#[tokio::test]
async fn request_timeout_mid_stream_ends_the_stream_with_an_error_event_and_cancels_with_reason_timeout(
) {
    let mut config = test_config();
    config.providers[0].limits.request_timeout = Duration::from_millis(800);
    let proxy = start_proxy(config).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "w", &["m"], 1).await;
    let task = open_stream(&proxy.url(), "/v1/messages", streaming_messages("m"));
    let request = worker.next_request().await;
    let start = "event: message_start\ndata: {\"type\":\"message_start\"}\n\n";
    worker.chunk(&request.request_id, start).await;
    let mut body = body_stream(response_of(task).await);
    assert_eq!(
        read_exact(&mut body, start.len(), PROMPT).await,
        start.as_bytes()
    );

    // The worker goes quiet; the request's lifetime runs out mid-stream.
    let cancel = worker.next_cancel().await;
    assert_eq!(cancel.request_id, request.request_id);
    assert_eq!(cancel.reason, CancelReason::Timeout);
    let rest = read_to_end(&mut body).await;
    assert!(
        rest.starts_with("event: error\n"),
        "the stream ends with an Anthropic error event: {rest:?}"
    );
    wait_until("nothing is tracked", || proxy.hub.tracked_requests() == 0).await;
}

#[tokio::test]
async fn a_worker_that_stops_reading_is_closed_after_the_write_timeout_and_its_requests_go_elsewhere(
) {
    let mut config = test_config();
    config.worker_write_timeout = Duration::from_secs(1);
    // Heartbeats alone would take longer to notice: the worker's TCP stack still acks pings.
    config.heartbeat_timeout = Duration::from_secs(60);
    let proxy = start_proxy(config).await;
    // Joins, then never reads again: its socket buffers fill with the requests below.
    let (stuck, _) = ScriptedWorker::join(proxy.addr, "stuck", &["big-model"], 4).await;
    let body = |n: usize| json!({"model": "big-model", "messages": [], "padding": "x".repeat(8_000_000), "n": n});
    let clients: Vec<_> = (0..4)
        .map(|n| {
            let (base, body) = (proxy.url(), body(n));
            tokio::spawn(async move { post(&base, "/v1/chat/completions", &body).await })
        })
        .collect();
    // Bounded generously: four 8 MB bodies are read and parsed first, slow on a busy machine
    // in a debug build; the write timeout itself is 1 s.
    wait_until_within(
        Duration::from_secs(30),
        "the stuck worker is closed",
        || proxy.hub.counts().0 == 0,
    )
    .await;
    // Nothing of them reached a client, so all four wait for the next worker.
    let (mut good, _) = ScriptedWorker::join(proxy.addr, "good", &["big-model"], 4).await;
    for _ in 0..4 {
        let request = good.next_request().await;
        good.complete(&request.request_id, r#"{"ok":true}"#).await;
    }
    for client in clients {
        let (status, _, text) = client.await.unwrap();
        assert_eq!(status, 200, "{text}");
    }
    drop(stuck);
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_client_that_stops_reading_has_its_stream_ended_once_the_bytes_waiting_for_it_pass_the_bound(
) {
    let mut config = test_config();
    config.max_buffered_stream_bytes = 1024 * 1024;
    let proxy = start_proxy(config).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "fast", &["big-model"], 1).await;
    // A client that sends its request and then reads nothing.
    let body = json!({"model": "big-model", "stream": true, "messages": []});
    let mut client = RawHttpClient::post(proxy.addr, "/v1/chat/completions", &body).await;
    let request = worker.next_request().await;
    let piece = format!("data: {{\"x\":\"{}\"}}\n\n", "y".repeat(64 * 1024));
    // Far more than the socket buffers between proxy and client hold: the rest waits in the
    // proxy until the bound ends the stream and the worker is told to stop.
    let sender = tokio::spawn(async move {
        for _ in 0..400 {
            worker.chunk(&request.request_id, &piece).await;
        }
        worker.next_cancel().await
    });
    let cancel = tokio::time::timeout(WAIT, sender)
        .await
        .expect("the worker is told to stop in time")
        .unwrap();
    assert_eq!(cancel.reason, CancelReason::ClientDisconnect);
    wait_until("nothing is tracked", || proxy.hub.tracked_requests() == 0).await;
    // What the client gets when it reads again: the stream so far, then the reason it ended.
    let text = client.read_until("max_buffered_stream_bytes").await;
    assert!(
        text.contains("client_too_slow"),
        "the error event names why"
    );
    proxy.shutdown().await;
}

/// The per-request push-back: a client that reads slower than the backend writes gets its
/// stream held back at the worker (which stops reading that request's backend) instead of
/// buffered in the proxy until the bound ends it; the worker's other streams keep their pace.
#[tokio::test]
async fn a_slow_clients_stream_is_held_back_at_the_worker_and_arrives_whole_while_another_stream_of_the_same_worker_keeps_its_pace(
) {
    const CHUNKS: usize = 600;
    const CHUNK_BYTES: usize = 64 * 1024;
    let mut config = test_config();
    // Far less than the stream: without the push-back the stream would be ended (see
    // a_client_that_stops_reading_has_its_stream_ended_…).
    config.max_buffered_stream_bytes = 1024 * 1024;
    let proxy = start_proxy(config).await;
    let backend = MockBackend::start(&["big-model"]).await;
    let worker = RunningWorker::start(&proxy, &backend.url(), Some(&["big-model"]), 2);
    wait_until("the worker registers", || proxy.hub.models().len() == 1).await;

    // A client that asks for ~37 MiB and then reads nothing for a while.
    let body = json!({"model": "big-model", "stream": true, "messages": [],
        "mock": {"chunks": CHUNKS, "chunk_bytes": CHUNK_BYTES}});
    let mut slow = RawHttpClient::post_with_receive_buffer(
        proxy.addr,
        "/v1/chat/completions",
        &body,
        64 * 1024,
    )
    .await;
    // The backend is held back: its writes stop well before the end of the stream.
    let last = backend_held_back(&backend).await;
    tokio::time::sleep(QUIET).await;
    let streamed = backend.streamed_events();
    assert_eq!(
        streamed, last,
        "the backend stays held back while the client reads nothing"
    );
    assert_eq!(
        backend.aborted_streams(),
        0,
        "the stream is held back, not ended"
    );
    assert!(
        streamed < CHUNKS,
        "the backend was held back before the end ({streamed} of {CHUNKS} events)"
    );

    // Meanwhile another stream of the same worker goes through at its own pace.
    let started = Instant::now();
    let quick =
        json!({"model": "big-model", "stream": true, "messages": [], "mock": {"chunks": 50}});
    let (status, _, text) = post(&proxy.url(), "/v1/chat/completions", &quick).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(sse_data(&text).last().map(String::as_str), Some("[DONE]"));
    assert!(started.elapsed() < PROMPT, "took {:?}", started.elapsed());

    // The slow client reads at last and gets the whole stream, in order.
    let body = slow.read_chunked_body(Duration::from_secs(60)).await;
    let text = String::from_utf8(body).expect("UTF-8");
    assert!(
        !text.contains("client_too_slow"),
        "the stream was not ended"
    );
    let events = sse_data(&text);
    assert_eq!(
        events.len(),
        CHUNKS + 1,
        "every event and [DONE] (the usage the client did not ask for is counted, not shown)"
    );
    for (i, event) in events[..CHUNKS].iter().enumerate() {
        let event: Value = serde_json::from_str(event).expect("JSON event");
        let content = event["choices"][0]["delta"]["content"]
            .as_str()
            .expect("content");
        assert!(
            content.starts_with(&format!("tok{i} ")),
            "event {i} in order"
        );
        assert_eq!(content.len(), format!("tok{i} ").len() + CHUNK_BYTES);
    }
    assert_eq!(events[CHUNKS], "[DONE]");
    wait_until("nothing is tracked", || proxy.hub.tracked_requests() == 0).await;
    worker.stop().await;
    proxy.shutdown().await;
}

/// A held-back stream whose client leaves ends like any other: the worker lets the request go,
/// the backend sees the end, the slot is free.
#[tokio::test]
async fn a_held_back_stream_whose_client_leaves_is_cancelled_through_to_the_backend_and_frees_its_slot(
) {
    let mut config = test_config();
    config.max_buffered_stream_bytes = 1024 * 1024;
    let proxy = start_proxy(config).await;
    let backend = MockBackend::start(&["big-model"]).await;
    let worker = RunningWorker::start(&proxy, &backend.url(), Some(&["big-model"]), 1);
    wait_until("the worker registers", || proxy.hub.models().len() == 1).await;
    let body = json!({"model": "big-model", "stream": true, "messages": [],
        "mock": {"chunks": 600, "chunk_bytes": 64 * 1024}});
    let slow = RawHttpClient::post_with_receive_buffer(
        proxy.addr,
        "/v1/chat/completions",
        &body,
        64 * 1024,
    )
    .await;
    backend_held_back(&backend).await;
    slow.disconnect();
    wait_until("the backend's stream ends", || {
        backend.aborted_streams() == 1
    })
    .await;
    wait_until("nothing is tracked", || proxy.hub.tracked_requests() == 0).await;
    // The worker's only slot serves the next request.
    let quick =
        json!({"model": "big-model", "stream": true, "messages": [], "mock": {"chunks": 3}});
    let (status, _, text) = post(&proxy.url(), "/v1/chat/completions", &quick).await;
    assert_eq!(status, 200, "{text}");
    worker.stop().await;
    proxy.shutdown().await;
}

/// Waits until the backend's stream writes stop (no new event for a second, long enough on a
/// busy machine for the socket buffers between it and the worker to have filled); returns how
/// many it wrote.
async fn backend_held_back(backend: &MockBackend) -> usize {
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut last, mut still) = (usize::MAX, 0);
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = backend.streamed_events();
        still = if now == last && now > 0 { still + 1 } else { 0 };
        // Two seconds without a write: on a loaded two-core machine the pipeline can stall for
        // one second and go on (seen in CI: 68 events still for a second, then 89).
        if still == 8 {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "the backend's writes never stopped ({now} events)"
        );
        last = now;
    }
}

#[tokio::test]
async fn a_streamed_response_whose_response_complete_carries_a_final_body_segment_delivers_it_before_the_stream_ends(
) {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "w", &["m"], 1).await;
    let task = open_stream(&proxy.url(), "/v1/chat/completions", streaming_chat("m"));
    let request = worker.next_request().await;
    let first = "data: {\"choices\":[{\"delta\":{\"content\":\"he\"}}]}\n\n";
    let tail = "data: {\"choices\":[{\"delta\":{\"content\":\"llo\"}}]}\n\ndata: [DONE]\n\n";
    worker.chunk(&request.request_id, first).await;
    let response = response_of(task).await;
    assert_eq!(response.status(), 200);
    let mut body = body_stream(response);
    assert_eq!(
        read_exact(&mut body, first.len(), PROMPT).await,
        first.as_bytes()
    );
    // The worker sends the rest of the stream as response_complete's body.
    worker
        .complete_with(
            &request.request_id,
            200,
            &[("content-type", "text/event-stream")],
            tail,
        )
        .await;
    assert_eq!(read_to_end(&mut body).await, tail, "the tail, then the end");
    wait_until("nothing is tracked", || proxy.hub.tracked_requests() == 0).await;
    proxy.shutdown().await;
}
