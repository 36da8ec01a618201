//! How the real worker uses connections to its backend: a burst of streams is served on one
//! connection each, opened a bounded number at a time (`backend::http`; the bound itself is
//! checked against a backend that counts connections waiting for their first byte in that
//! module's tests), and later requests reuse the pooled connections instead of opening new ones.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::Response;
use axum::routing::{get, post as post_route};
use axum::serve::ListenerExt;
use futures_util::StreamExt;
use relay_core::worker::WorkerConfig;
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::support::*;

const MODEL: &str = "burst-model";
const STREAMS: usize = 300;

/// A backend that counts the connections it accepts. Streams send one event at once and end
/// when `release` turns true, so every stream of a burst holds its connection until then.
struct CountingBackend {
    url: String,
    accepted: Arc<AtomicUsize>,
    release: watch::Sender<bool>,
}

impl CountingBackend {
    async fn start() -> CountingBackend {
        let (release, released) = watch::channel(false);
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = accepted.clone();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let listener = listener.tap_io(move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
        });
        let app = axum::Router::new()
            .route(
                "/v1/models",
                get(|| async {
                    axum::Json(
                        json!({"object": "list", "data": [{"id": MODEL, "object": "model"}]}),
                    )
                }),
            )
            .route(
                "/v1/chat/completions",
                post_route(move |body: Bytes| chat(body, released.clone())),
            );
        tokio::spawn(async move { axum::serve(listener, app).await });
        CountingBackend {
            url,
            accepted,
            release,
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

async fn chat(body: Bytes, mut released: watch::Receiver<bool>) -> Response {
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    if request["stream"] != true {
        let answer = json!({"id": "c", "object": "chat.completion", "model": MODEL,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]});
        return Response::builder()
            .header("content-type", "application/json")
            .body(Body::from(answer.to_string()))
            .unwrap();
    }
    let first = futures_util::stream::once(async {
        Ok::<_, std::convert::Infallible>(Bytes::from_static(
            b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n",
        ))
    });
    let last = futures_util::stream::once(async move {
        let _ = released.wait_for(|go| *go).await;
        Ok(Bytes::from_static(b"data: [DONE]\n\n"))
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(first.chain(last)))
        .unwrap()
}

#[tokio::test]
async fn a_burst_of_streams_is_served_on_one_backend_connection_each_and_later_requests_reuse_them()
{
    let proxy = start_proxy(test_config()).await;
    let backend = CountingBackend::start().await;
    let mut config = WorkerConfig::new(&proxy.url(), SECRET, &backend.url);
    config.max_concurrent = STREAMS as u32 + 10;
    config.model_refresh_interval = Duration::from_secs(600);
    let worker = RunningWorker::start_with(config);
    wait_until("the worker registers", || !proxy.hub.models().is_empty()).await;

    let client = http();
    let body =
        json!({"model": MODEL, "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let streams: Vec<_> = (0..STREAMS)
        .map(|_| {
            let request = client
                .post(format!("{}/v1/chat/completions", proxy.url()))
                .header("content-type", "application/json")
                .body(body.to_string());
            tokio::spawn(async move {
                let response = request.send().await.expect("stream opened");
                assert_eq!(response.status(), 200);
                let mut chunks = response.bytes_stream();
                let first = chunks.next().await.expect("a first event").unwrap();
                (first, chunks)
            })
        })
        .collect();
    let mut open = Vec::new();
    for stream in streams {
        let (first, chunks) = tokio::time::timeout(Duration::from_secs(30), stream)
            .await
            .expect("every stream's first event in time")
            .unwrap();
        assert!(String::from_utf8_lossy(&first).contains("data: "));
        open.push(chunks);
    }
    let during_burst = backend.accepted();
    // One connection per open stream, plus those of what the worker asks the backend itself on
    // its other client (the model list, the context window, llama.cpp's slots: at most one
    // each).
    assert!(
        (STREAMS..=STREAMS + 3).contains(&during_burst),
        "{during_burst} backend connections for {STREAMS} streams"
    );

    backend.release.send_replace(true);
    for mut chunks in open {
        let mut rest = Vec::new();
        while let Some(piece) = chunks.next().await {
            rest.extend_from_slice(&piece.unwrap());
        }
        assert!(String::from_utf8_lossy(&rest).contains("[DONE]"));
    }
    for _ in 0..20 {
        let (status, _, _) = post(
            &proxy.url(),
            "/v1/chat/completions",
            &json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
        assert_eq!(status, 200);
    }
    assert_eq!(
        backend.accepted(),
        during_burst,
        "requests after the burst reuse its pooled connections"
    );
    worker.stop().await;
    proxy.shutdown().await;
}

/// A worker's slot is free the moment its answer is on the wire: the proxy sends the next
/// queued request at once, and the worker must not refuse it as beyond `max_concurrent` because
/// it had not yet seen the finished request's task end (on a busy machine that gap grew until a
/// request was refused three times and failed with a 503 `requeue_exhausted`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_with_one_slot_takes_the_next_request_the_moment_it_has_answered() {
    let backend = ChatOnlyBackend::start(&[MODEL]).await;
    let proxy = start_proxy(test_config()).await;
    let worker = RunningWorker::start(&proxy, &backend.url(), None, 1);
    wait_until("the worker registers", || proxy.hub.models().len() == 1).await;
    // A busy machine: threads that spin beside the relay, so its tasks get descheduled between
    // an answer's last message and the end of the task that sent it.
    let spinning = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let spinners: Vec<_> = (0..3)
        .map(|_| {
            let spinning = spinning.clone();
            std::thread::spawn(move || {
                while spinning.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let url = proxy.url();
            tokio::spawn(async move {
                for _ in 0..100 {
                    let body =
                        json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]});
                    let (status, _, text) = post(&url, "/v1/chat/completions", &body).await;
                    assert_eq!(status, 200, "{text}");
                }
            })
        })
        .collect();
    for client in clients {
        client.await.expect("a client");
    }
    spinning.store(false, Ordering::Relaxed);
    for spinner in spinners {
        spinner.join().expect("a spinner");
    }
    assert_eq!(
        proxy.hub.telemetry().counters().requeues,
        0,
        "no request was refused as beyond max_concurrent (and requeued)"
    );
    worker.stop().await;
    proxy.shutdown().await;
}
