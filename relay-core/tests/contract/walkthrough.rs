//! The protocol walkthrough's scenarios, end to end: client → proxy → real worker → mock backend.

use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn normal_non_streaming_request_passes_status_headers_and_body_through() {
    let proxy = start_proxy(test_config()).await;
    let backend = MockBackend::start(&["llama3-8b"]).await;
    let worker = RunningWorker::start(&proxy, &backend.url(), None, 4);
    wait_until("the worker registers", || proxy.hub.counts().0 == 1).await;
    let (status, headers, body) = post(
        &proxy.url(),
        "/v1/chat/completions",
        &json!({"model": "llama3-8b", "stream": false, "messages": [{"role": "user", "content": "Hello!"}]}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-mock-backend"], "1");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["choices"][0]["message"]["content"], "hello from mock");
    worker.stop().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn streaming_request_forwards_every_chunk_in_order_and_terminates() {
    let proxy = start_proxy(test_config()).await;
    let backend = MockBackend::start(&["llama3-8b"]).await;
    let worker = RunningWorker::start(&proxy, &backend.url(), None, 4);
    wait_until("the worker registers", || proxy.hub.counts().0 == 1).await;
    let (status, headers, body) = post(
        &proxy.url(),
        "/v1/chat/completions",
        &json!({"model": "llama3-8b", "stream": true, "mock": {"chunks": 20}}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "text/event-stream");
    assert_eq!(headers["x-accel-buffering"], "no");
    let data = sse_data(&body);
    assert_eq!(
        data.len(),
        22,
        "20 content chunks, a usage chunk and [DONE]: {body}"
    );
    for (i, payload) in data.iter().take(20).enumerate() {
        assert!(
            payload.contains(&format!("tok{i} ")),
            "chunk {i} in order: {payload}"
        );
    }
    assert_eq!(data.last().unwrap(), "[DONE]");
    worker.stop().await;
    proxy.shutdown().await;
}
