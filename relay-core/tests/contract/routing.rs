//! Routing on unequal boxes (issue 29): each box's speed is measured from what its backend
//! reports (llama-server's `timings`), carried by the real worker to the proxy, shown on the
//! dashboard; every placement says why it went where it did, on the dashboard and in
//! `/metrics`.

use axum::routing::{get, post as post_route};
use serde_json::{json, Value};

use crate::support::*;

const MODEL: &str = "timed-model";

/// A backend that answers like llama-server: a body with `timings` (2,000 prompt tokens in
/// 1 s, 50 generated in 1 s, 500 from its cache).
async fn timed_backend() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new()
        .route(
            "/v1/models",
            get(|| async { axum::Json(json!({"object": "list", "data": [{"id": MODEL}]})) }),
        )
        .route(
            "/v1/chat/completions",
            post_route(|| async {
                axum::Json(json!({
                    "id": "chatcmpl-1", "object": "chat.completion", "model": MODEL,
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": "hi"}}],
                    "usage": {"prompt_tokens": 2500, "completion_tokens": 50},
                    "timings": {"cache_n": 500, "prompt_n": 2000, "prompt_ms": 1000.0,
                                "predicted_n": 50, "predicted_ms": 1000.0}
                }))
            }),
        );
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

#[tokio::test]
async fn a_workers_timings_teach_the_proxy_its_speed_and_each_placement_says_why() {
    let backend = timed_backend().await;
    let proxy = start_proxy(test_config()).await;
    let worker = RunningWorker::start(&proxy, &backend, None, 2);
    wait_until("the worker registers", || proxy.hub.models().len() == 1).await;
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "hello"}]});
    let (status, _, text) = post(&proxy.url(), "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{text}");
    let answer: Value = serde_json::from_str(&text).unwrap();
    assert!(
        answer["timings"].is_object(),
        "the client gets the body as sent: {answer}"
    );

    let (code, status) = get_json(&proxy.url(), "/api/status", &[]).await;
    assert_eq!(code, 200);
    let speed = &status["workers"][0]["speeds"][MODEL];
    assert_eq!(speed["prompt_tps"], 2000.0, "{status}");
    assert_eq!(speed["generation_tps"], 50.0, "{status}");

    let metrics = metrics_text(&proxy.url()).await;
    assert!(
        metrics.contains("modelrelay_placements_total{reason=\"new_conversation\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("modelrelay_placements_total{reason=\"faster_box\"} 0"));
    worker.stop().await;
    proxy.shutdown().await;
}
