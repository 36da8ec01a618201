//! Bad input: every malformed request gets a precise error in its endpoint's dialect (OpenAI
//! `{"error":{"message","type","code"}}`, Anthropic `{"type":"error","error":{"type","message"}}`),
//! nothing reaches a worker, nothing stays tracked, and the proxy keeps serving. On the worker
//! side, an oversized WebSocket message ends that connection without losing its request.

use std::collections::BTreeSet;
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use relay_core::proxy::{ProxyConfig, RunningProxy};
use serde_json::{json, Value};

use crate::support::*;

const MODEL: &str = "llama3-8b";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    OpenAi,
    Anthropic,
}

/// Every inference endpoint and the error dialect its clients expect.
const ENDPOINTS: [(&str, Shape); 6] = [
    ("/v1/chat/completions", Shape::OpenAi),
    ("/v1/completions", Shape::OpenAi),
    ("/v1/embeddings", Shape::OpenAi),
    ("/v1/responses", Shape::OpenAi),
    ("/v1/messages", Shape::Anthropic),
    ("/v1/messages/count_tokens", Shape::Anthropic),
];

/// A proxy with a real worker in front of a mock backend.
struct Setup {
    proxy: RunningProxy,
    backend: MockBackend,
    worker: RunningWorker,
}

async fn setup(config: ProxyConfig) -> Setup {
    let proxy = start_proxy(config).await;
    let backend = MockBackend::start(&[MODEL]).await;
    let worker = RunningWorker::start(&proxy, &backend.url(), None, 4);
    wait_until("the worker registers", || proxy.hub.counts().0 == 1).await;
    Setup {
        proxy,
        backend,
        worker,
    }
}

impl Setup {
    fn url(&self) -> String {
        self.proxy.url()
    }

    /// Nothing leaked or reached the backend, and every endpoint still serves a valid request.
    async fn assert_still_serving(self) {
        assert_eq!(
            self.proxy.hub.tracked_requests(),
            0,
            "a rejected request stayed tracked"
        );
        assert_eq!(
            self.backend.seen().len(),
            0,
            "a rejected request reached the backend"
        );
        for (path, _) in ENDPOINTS {
            let (status, _, body) = post(
                &self.url(),
                path,
                &json!({"model": MODEL, "max_tokens": 8, "messages": [], "input": "hi"}),
            )
            .await;
            assert_eq!(status, 200, "{path} after bad input: {body}");
        }
        assert_eq!(self.backend.seen().len(), ENDPOINTS.len());
        assert_eq!(self.proxy.hub.tracked_requests(), 0);
        self.worker.stop().await;
        self.proxy.shutdown().await;
    }
}

type Answer = (StatusCode, HeaderMap, String);

/// POSTs raw bytes with a JSON content type.
async fn send(base: &str, path: &str, body: impl Into<reqwest::Body>) -> Answer {
    let response = tokio::time::timeout(
        WAIT,
        http()
            .post(format!("{base}{path}"))
            .header("content-type", "application/json")
            .body(body)
            .send(),
    )
    .await
    .expect("response in time")
    .expect("request sent");
    let status = response.status();
    let headers = response.headers().clone();
    let text = response.text().await.expect("body");
    (status, headers, text)
}

/// The `type` an SDK of `shape` expects for `status`.
fn expected_type(shape: Shape, status: u16) -> &'static str {
    match (shape, status) {
        (Shape::Anthropic, 404) => "not_found_error",
        (Shape::Anthropic, 413) => "request_too_large",
        (_, 429) => "rate_limit_error",
        (_, 504) => "timeout_error",
        _ => "invalid_request_error",
    }
}

fn keys(value: &Value) -> BTreeSet<&str> {
    value
        .as_object()
        .unwrap_or_else(|| panic!("expected a JSON object: {value}"))
        .keys()
        .map(String::as_str)
        .collect()
}

/// Asserts a `want` error in `shape`'s dialect (OpenAI `code` one of `codes`); returns the message.
fn assert_error(
    shape: Shape,
    what: &str,
    (status, headers, body): &Answer,
    want: u16,
    codes: &[&str],
) -> String {
    assert_eq!(status.as_u16(), want, "{what}: {body}");
    assert_eq!(
        headers["content-type"], "application/json",
        "{what}: error bodies are JSON"
    );
    let value: Value = serde_json::from_str(body)
        .unwrap_or_else(|e| panic!("{what}: error body is not JSON ({e}): {body}"));
    let error = &value["error"];
    match shape {
        Shape::OpenAi => {
            assert_eq!(keys(&value), BTreeSet::from(["error"]), "{what}: {body}");
            assert_eq!(
                keys(error),
                BTreeSet::from(["message", "type", "code"]),
                "{what}: {body}"
            );
            let code = error["code"].as_str().unwrap_or_default();
            assert!(
                codes.contains(&code),
                "{what}: code {code:?} not in {codes:?}"
            );
        }
        Shape::Anthropic => {
            assert_eq!(value["type"], "error", "{what}: {body}");
            assert_eq!(
                keys(error),
                BTreeSet::from(["type", "message"]),
                "{what}: {body}"
            );
        }
    }
    assert_eq!(error["type"], expected_type(shape, want), "{what}: {body}");
    let message = error["message"].as_str().unwrap_or_default().to_string();
    assert!(!message.is_empty(), "{what}: empty message");
    message
}

#[tokio::test]
async fn malformed_json_is_400_invalid_json_in_each_endpoint_dialect() {
    let setup = setup(test_config()).await;
    let bodies: [&[u8]; 5] = [
        br#"{"model": "llama3-8b","#,
        br#"{model: llama3-8b}"#,
        br#"{"model": "llama3-8b"} trailing"#,
        br#"{"model": "llama3-8b", "messages": [}"#,
        b"{\"model\": \"llama3-8b\", \"x\": \"\xff\xfe\"}",
    ];
    for (path, shape) in ENDPOINTS {
        for body in bodies {
            let what = format!("{path} {}", String::from_utf8_lossy(body));
            let answer = send(&setup.url(), path, body.to_vec()).await;
            assert_error(shape, &what, &answer, 400, &["invalid_json"]);
        }
    }
    setup.assert_still_serving().await;
}

#[tokio::test]
async fn body_that_is_not_a_json_object_is_400_in_each_endpoint_dialect() {
    let setup = setup(test_config()).await;
    let bodies = [
        r#"[{"model": "llama3-8b"}]"#,
        r#""llama3-8b""#,
        "42",
        "null",
        "true",
        "",
        "   \n",
    ];
    for (path, shape) in ENDPOINTS {
        for body in bodies {
            let what = format!("{path} {body:?}");
            let answer = send(&setup.url(), path, body.to_string()).await;
            let message = assert_error(shape, &what, &answer, 400, &["invalid_json"]);
            assert!(message.contains("JSON object"), "{what}: {message}");
        }
    }
    setup.assert_still_serving().await;
}

#[tokio::test]
async fn missing_model_is_400_missing_model_in_each_endpoint_dialect() {
    let setup = setup(test_config()).await;
    let bodies = [
        json!({}),
        json!({"messages": [{"role": "user", "content": "hi"}]}),
        json!({"Model": MODEL}),
        json!({"params": {"model": MODEL}}),
    ];
    for (path, shape) in ENDPOINTS {
        for body in &bodies {
            let what = format!("{path} {body}");
            let answer = send(&setup.url(), path, body.to_string()).await;
            let message = assert_error(shape, &what, &answer, 400, &["missing_model"]);
            assert!(message.contains("model"), "{what}: {message}");
        }
    }
    setup.assert_still_serving().await;
}

#[tokio::test]
async fn model_that_is_not_a_non_empty_string_is_400_in_each_endpoint_dialect() {
    let setup = setup(test_config()).await;
    let bodies = [
        json!({"model": 42}),
        json!({"model": null}),
        json!({"model": {"id": MODEL}}),
        json!({"model": [MODEL]}),
        json!({"model": true}),
        json!({"model": ""}),
        json!({"model": "   "}),
    ];
    for (path, shape) in ENDPOINTS {
        for body in &bodies {
            let what = format!("{path} {body}");
            let answer = send(&setup.url(), path, body.to_string()).await;
            let message = assert_error(
                shape,
                &what,
                &answer,
                400,
                &["invalid_model", "missing_model"],
            );
            assert!(message.contains("model"), "{what}: {message}");
        }
    }
    setup.assert_still_serving().await;
}

const LIMIT: usize = 1024;

fn small_body_config() -> ProxyConfig {
    let mut config = test_config();
    config.max_body_bytes = LIMIT;
    config
}

/// A valid request body of exactly `len` bytes.
fn body_of_len(len: usize) -> String {
    let empty = json!({"model": MODEL, "pad": ""}).to_string();
    let body = json!({"model": MODEL, "pad": "x".repeat(len - empty.len())}).to_string();
    assert_eq!(body.len(), len);
    body
}

#[tokio::test]
async fn body_over_the_limit_with_content_length_is_413_in_each_endpoint_dialect() {
    let setup = setup(small_body_config()).await;
    for (path, shape) in ENDPOINTS {
        for len in [LIMIT + 1, 4 * LIMIT] {
            let what = format!("{path} {len} bytes");
            let answer = send(&setup.url(), path, body_of_len(len)).await;
            let message = assert_error(shape, &what, &answer, 413, &["request_too_large"]);
            assert!(message.contains(&LIMIT.to_string()), "{what}: {message}");
        }
    }
    setup.assert_still_serving().await;
}

/// A body sent with chunked transfer encoding (no Content-Length), in 256-byte pieces.
fn chunked(body: String) -> reqwest::Body {
    let pieces: Vec<Result<Vec<u8>, std::io::Error>> = body
        .into_bytes()
        .chunks(256)
        .map(|piece| Ok(piece.to_vec()))
        .collect();
    reqwest::Body::wrap_stream(futures_util::stream::iter(pieces))
}

#[tokio::test]
async fn chunked_body_over_the_limit_is_413_in_each_endpoint_dialect() {
    let setup = setup(small_body_config()).await;
    for (path, shape) in ENDPOINTS {
        for len in [LIMIT + 1, 4 * LIMIT] {
            let what = format!("{path} chunked {len} bytes");
            let answer = send(&setup.url(), path, chunked(body_of_len(len))).await;
            assert_error(shape, &what, &answer, 413, &["request_too_large"]);
        }
    }
    setup.assert_still_serving().await;
}

#[tokio::test]
async fn body_of_exactly_the_limit_is_accepted_with_or_without_content_length() {
    let setup = setup(small_body_config()).await;
    let (status, _, body) = send(&setup.url(), "/v1/chat/completions", body_of_len(LIMIT)).await;
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = send(&setup.url(), "/v1/messages", chunked(body_of_len(LIMIT))).await;
    assert_eq!(status, 200, "{body}");
    let seen = setup.backend.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(
        seen[1].body["pad"].as_str().unwrap().len(),
        seen[0].body["pad"].as_str().unwrap().len()
    );
    setup.worker.stop().await;
    setup.proxy.shutdown().await;
}

#[tokio::test]
async fn a_model_name_no_worker_could_advertise_is_404_model_not_found_in_each_endpoint_dialect() {
    let setup = setup(test_config()).await;
    let too_long = "m".repeat(257);
    for name in [too_long.as_str(), "llama\u{7}3"] {
        for (path, shape) in ENDPOINTS {
            let what = format!("{path} model {name:?}");
            let answer = send(
                &setup.url(),
                path,
                json!({"model": name, "messages": []}).to_string(),
            )
            .await;
            let message = assert_error(shape, &what, &answer, 404, &["model_not_found"]);
            assert!(
                message.contains("no provider for model"),
                "{what}: {message}"
            );
        }
    }
    setup.assert_still_serving().await;
}

#[tokio::test]
async fn a_model_no_worker_serves_times_out_in_the_queue_with_504_naming_it_in_each_endpoint_dialect(
) {
    let setup = setup(config_with_queue_timeout(Duration::from_millis(200))).await;
    for (path, shape) in ENDPOINTS {
        let what = format!("{path} unserved model");
        let answer = send(
            &setup.url(),
            path,
            json!({"model": "no-such-model", "messages": []}).to_string(),
        )
        .await;
        let message = assert_error(shape, &what, &answer, 504, &["queue_timeout"]);
        assert!(message.contains("no-such-model"), "{what}: {message}");
    }
    setup.assert_still_serving().await;
}

#[tokio::test]
async fn a_full_queue_answers_service_temporarily_at_capacity_in_each_endpoint_dialect() {
    let mut config = test_config();
    config.providers[0].limits.max_queue_len = 1;
    let setup = setup(config).await;
    // One request for a model nobody serves fills the queue.
    let waiting = spawn_post(
        &setup.url(),
        "/v1/chat/completions",
        json!({"model": "later"}),
    );
    wait_until("the first request waits", || {
        setup.proxy.hub.counts().1 == 1
    })
    .await;
    for (path, shape) in ENDPOINTS {
        let what = format!("{path} beyond max_queue_len");
        let answer = send(
            &setup.url(),
            path,
            json!({"model": "later", "messages": []}).to_string(),
        )
        .await;
        let message = assert_error(shape, &what, &answer, 429, &["queue_full"]);
        assert!(
            message.starts_with("Service temporarily at capacity"),
            "{what}: the seed's stable client message: {message}"
        );
        assert!(answer.1.contains_key("retry-after"), "{what}: Retry-After");
    }
    waiting.abort();
    wait_until("the waiting request left with its client", || {
        setup.proxy.hub.tracked_requests() == 0
    })
    .await;
    setup.assert_still_serving().await;
}

#[tokio::test]
async fn unknown_route_is_404_json_in_the_paths_dialect() {
    let setup = setup(test_config()).await;
    let cases = [
        ("GET", "/v1/unknown", Shape::OpenAi),
        ("POST", "/v1/chat/complete", Shape::OpenAi),
        ("POST", "/v2/chat/completions", Shape::OpenAi),
        ("GET", "/no-such-page", Shape::OpenAi),
        ("POST", "/v1/messages/batches", Shape::Anthropic),
    ];
    for (method, path, shape) in cases {
        let what = format!("{method} {path}");
        let request = match method {
            "GET" => http().get(format!("{}{path}", setup.url())),
            _ => http()
                .post(format!("{}{path}", setup.url()))
                .header("content-type", "application/json")
                .body(json!({"model": MODEL}).to_string()),
        };
        let response = request.send().await.expect("response");
        let answer = (
            response.status(),
            response.headers().clone(),
            response.text().await.expect("body"),
        );
        let message = assert_error(shape, &what, &answer, 404, &["unknown_route"]);
        assert!(message.contains(path), "{what}: {message}");
    }
    setup.assert_still_serving().await;
}

#[tokio::test]
async fn oversized_websocket_message_closes_that_worker_and_its_request_is_requeued() {
    let mut config = test_config();
    config.max_ws_message_bytes = 4096;
    let proxy = start_proxy(config).await;
    let (mut oversized, _) = ScriptedWorker::join(proxy.addr, "oversized", &[MODEL], 1).await;
    let base = proxy.url();
    let client =
        tokio::spawn(
            async move { post(&base, "/v1/chat/completions", &json!({"model": MODEL})).await },
        );
    let request = oversized.next_request().await;
    let huge = json!({"content": "x".repeat(8192)}).to_string();
    oversized.complete(&request.request_id, &huge).await;
    tokio::time::timeout(WAIT, oversized.closed())
        .await
        .expect("the proxy ends the connection");
    wait_until("the oversized worker is gone", || proxy.hub.counts().0 == 0).await;
    assert_eq!(
        proxy.hub.tracked_requests(),
        1,
        "the request is still alive, waiting for another worker"
    );

    let (mut next, _) = ScriptedWorker::join(proxy.addr, "next", &[MODEL], 1).await;
    let again = next.next_request().await;
    assert_eq!(
        again.request_id, request.request_id,
        "the same request, requeued"
    );
    next.complete(&again.request_id, r#"{"ok":true}"#).await;
    let (status, _, body) = client.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, r#"{"ok":true}"#);
    wait_until("nothing is tracked", || proxy.hub.tracked_requests() == 0).await;
    assert_eq!(proxy.hub.counts().0, 1, "the well-behaved worker stays");
    proxy.shutdown().await;
}

#[tokio::test]
async fn wrong_method_is_405_json_in_the_paths_dialect() {
    let proxy = start_proxy(test_config()).await;
    let (status, body) = get_json(&proxy.url(), "/v1/chat/completions", &[]).await;
    assert_eq!(status, 405);
    assert_eq!(body["error"]["code"], "method_not_allowed", "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    let (status, body) = get_json(&proxy.url(), "/v1/messages", &[]).await;
    assert_eq!(status, 405);
    assert_eq!(body["type"], "error", "{body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("GET"),
        "{body}"
    );
}

/// A request body of `pairs` escaped quotes: each `\"` doubles once escaped into a frame.
fn quote_heavy_body(pairs: usize) -> String {
    format!(
        r#"{{"model":"{MODEL}","max_tokens":8,"messages":[],"input":"{}"}}"#,
        "\\\"".repeat(pairs)
    )
}

#[tokio::test]
async fn a_request_whose_frame_would_exceed_what_a_worker_accepts_is_413_and_the_worker_stays() {
    let mut config = test_config();
    config.worker_frame_limit = 1024 * 1024;
    let setup = setup(config).await;
    // 1.2 MB raw, under the body limit, but 2.4 MB once escaped into the frame.
    for (path, shape) in ENDPOINTS {
        let (status, _, text) = send(&setup.url(), path, quote_heavy_body(600_000)).await;
        assert_eq!(status, 413, "{path}: {text}");
        let body: Value = serde_json::from_str(&text).expect("JSON error");
        match shape {
            Shape::OpenAi => assert_eq!(body["error"]["code"], "request_too_large", "{body}"),
            Shape::Anthropic => assert_eq!(body["type"], "error", "{body}"),
        }
    }
    // One that fits once escaped (0.8 MB) still travels.
    let (status, _, text) = send(
        &setup.url(),
        "/v1/chat/completions",
        quote_heavy_body(200_000),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        setup.proxy.hub.counts().0,
        1,
        "the worker kept its connection"
    );
    assert_eq!(setup.backend.seen().len(), 1);
    setup.worker.stop().await;
    setup.proxy.shutdown().await;
}

#[tokio::test]
async fn a_body_that_does_not_arrive_within_body_read_timeout_is_408_in_the_routes_dialect() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut config = test_config();
    config.body_read_timeout = std::time::Duration::from_millis(500);
    let proxy = start_proxy(config).await;
    let mut socket = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let head = format!(
        "POST /v1/messages HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{{\"model\":",
        proxy.addr
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    let started = std::time::Instant::now();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(WAIT, async {
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&answer).ends_with(r#""type":"error"}"#) {
            let n = socket.read(&mut buf).await.unwrap();
            assert!(
                n > 0,
                "closed without an answer after {:?}",
                started.elapsed()
            );
            answer.extend_from_slice(&buf[..n]);
        }
    });
    read.await.expect("answered in time");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("body_read_timeout_secs"), "{text}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    assert_eq!(proxy.hub.tracked_requests(), 0, "nothing was queued");
    proxy.shutdown().await;
}

#[tokio::test]
async fn request_bytes_beyond_max_in_flight_get_503_until_earlier_requests_end() {
    let mut config = test_config();
    config.max_request_bytes_in_flight = 1_000_000;
    let proxy = start_proxy(config).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "slow", &[MODEL], 4).await;
    let big = |tag: &str| {
        json!({"model": MODEL, "messages": [], "padding": "x".repeat(600_000), "tag": tag})
            .to_string()
    };
    let base = proxy.url();
    let first_body = big("first");
    let first = tokio::spawn(async move { send(&base, "/v1/chat/completions", first_body).await });
    let held = worker.next_request().await;
    // Two such bodies do not fit: the second is refused before it is read, in its dialect.
    let (status, headers, text) = send(&proxy.url(), "/v1/messages", big("second")).await;
    assert_eq!(status, 503, "{text}");
    assert!(headers.contains_key("retry-after"));
    assert!(text.contains("max_request_bytes_in_flight"), "{text}");
    assert!(
        text.contains(r#""type":"error""#),
        "Anthropic shape: {text}"
    );
    // Small requests still pass while the big one is held.
    let base = proxy.url();
    let small = tokio::spawn(async move {
        send(
            &base,
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": []}).to_string(),
        )
        .await
    });
    let request = worker.next_request().await;
    worker.complete(&request.request_id, r#"{"ok":1}"#).await;
    assert_eq!(small.await.unwrap().0, 200);
    // Once the first has its answer, its bytes are free again.
    worker.complete(&held.request_id, r#"{"ok":2}"#).await;
    assert_eq!(first.await.unwrap().0, 200);
    let base = proxy.url();
    let third =
        tokio::spawn(async move { send(&base, "/v1/chat/completions", big("third")).await });
    let request = worker.next_request().await;
    worker.complete(&request.request_id, r#"{"ok":3}"#).await;
    assert_eq!(third.await.unwrap().0, 200);
    proxy.shutdown().await;
}
