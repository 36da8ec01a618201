//! What passes through the relay: a malicious worker's headers, content types and status codes
//! must not reach the relay's origin, and a malicious proxy's `endpoint_path`s, credentials and
//! excess requests must not make the real worker reach beyond its backend or its capacity.
//! The proxy and the worker under attack are the real binary; the attacker is a raw WebSocket
//! peer speaking the protocol.

use std::net::{SocketAddr, TcpListener as StdListener};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use relay_core::protocol::{
    RegisterAck, RegisterMessage, RequestMessage, ResponseCompleteMessage, ServerToWorker,
    WorkerToServer,
};
use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::binary::*;

const SECRET: &str = "passthrough-secret";
const MODEL: &str = "m";
/// Bound on every wait for a peer.
const PEER_WAIT: Duration = Duration::from_secs(10);

/// A `modelrelay serve` with a known worker secret.
fn start_proxy(data: &TempDir) -> (Running, String) {
    let mut command = modelrelay(data.path());
    command.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--worker-secret",
        SECRET,
    ]);
    let mut proxy = Running::spawn(command);
    let url = proxy.relay_url();
    (proxy, url)
}

/// A worker that answers every request with whatever its script says.
struct EvilWorker {
    socket: WebSocketStream<MaybeTlsStream<TcpStream>>,
}

impl EvilWorker {
    async fn join(proxy_url: &str) -> EvilWorker {
        let url = format!(
            "{}/v1/worker/connect?provider=local",
            proxy_url.replace("http://", "ws://")
        );
        let mut request = url.into_client_request().unwrap();
        request
            .headers_mut()
            .insert("x-worker-secret", SECRET.parse().unwrap());
        let (socket, _) = tokio_tungstenite::connect_async(request)
            .await
            .expect("the evil worker connects");
        let mut worker = EvilWorker { socket };
        worker
            .send(&WorkerToServer::Register(RegisterMessage {
                warm_ups: None,
                sides_first: None,
                worker_name: "evil".to_string(),
                models: vec![MODEL.to_string()],
                max_concurrent: 4,
                protocol_version: Some("1".to_string()),
                current_load: Some(0),
                mac_address: None,
                sleeps_when_idle: None,
                context_windows: None,
            }))
            .await;
        match worker.recv().await {
            ServerToWorker::RegisterAck(_) => worker,
            other => panic!("expected register_ack, got {other:?}"),
        }
    }

    async fn send(&mut self, message: &WorkerToServer) {
        self.socket
            .send(Message::Text(message.to_json().into()))
            .await
            .expect("send");
    }

    async fn recv(&mut self) -> ServerToWorker {
        loop {
            let frame = tokio::time::timeout(PEER_WAIT, self.socket.next())
                .await
                .expect("a message from the proxy in time")
                .expect("socket open")
                .expect("frame");
            if let Message::Text(text) = frame {
                let message = ServerToWorker::from_json(&text).expect("protocol message");
                if !matches!(message, ServerToWorker::Ping(_)) {
                    return message;
                }
            }
        }
    }

    /// Waits for the next request and answers it with `status`, `headers` and `body`.
    async fn answer_next(&mut self, status: u16, headers: &[(&str, &str)], body: &str) {
        let ServerToWorker::Request(request) = self.recv().await else {
            panic!("expected a request");
        };
        self.send(&WorkerToServer::ResponseComplete(ResponseCompleteMessage {
            request_id: request.request_id,
            status_code: status,
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            body: Some(body.to_string()),
            token_counts: None,
            timings: None,
        }))
        .await;
    }
}

/// A chat request from a client, answered by a worker scripted with `status`, `headers`, `body`.
async fn client_sees(status: u16, headers: &[(&str, &str)], body: &str) -> Reply {
    let data = TempDir::new("evil-worker");
    let (_proxy, url) = start_proxy(&data);
    let mut worker = EvilWorker::join(&url).await;
    let chat = format!("{url}/v1/chat/completions");
    let client = tokio::task::spawn_blocking(move || {
        exchange(
            "POST",
            &chat,
            &[],
            Some(r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#),
        )
    });
    worker.answer_next(status, headers, body).await;
    client.await.expect("client thread")
}

#[tokio::test]
async fn a_malicious_worker_cannot_set_cookies_or_grant_cors_on_the_relays_origin() {
    let reply = client_sees(
        200,
        &[
            ("content-type", "application/json"),
            ("set-cookie", "session=stolen; Path=/"),
            ("access-control-allow-origin", "*"),
            ("access-control-allow-credentials", "true"),
            ("www-authenticate", "Basic realm=\"relay\""),
            ("x-accel-redirect", "/etc/passwd"),
            ("location", "http://evil.example/"),
            ("x-request-id", "req-1"),
        ],
        r#"{"choices":[]}"#,
    )
    .await;
    assert_eq!(reply.status, 200, "{reply:?}");
    for forbidden in [
        "set-cookie",
        "access-control-allow-origin",
        "access-control-allow-credentials",
        "www-authenticate",
        "x-accel-redirect",
        "location",
    ] {
        assert_eq!(
            reply.header(forbidden),
            None,
            "{forbidden} passed: {reply:?}"
        );
    }
    assert_eq!(reply.header("x-request-id").as_deref(), Some("req-1"));
    assert_eq!(
        reply.header("x-content-type-options").as_deref(),
        Some("nosniff")
    );
}

#[tokio::test]
async fn a_malicious_worker_cannot_get_a_page_rendered_on_the_relays_origin() {
    let page = "<html><script>fetch('/api/join-code')</script></html>";
    for content_type in ["text/html", "image/svg+xml", "application/javascript"] {
        let reply = client_sees(200, &[("content-type", content_type)], page).await;
        assert_eq!(reply.status, 502, "{content_type}: {reply:?}");
        assert!(!reply.body.contains("<script"), "{reply:?}");
        assert!(
            reply
                .header("content-type")
                .is_some_and(|t| t.starts_with("application/json")),
            "{reply:?}"
        );
        let error: Value = serde_json::from_str(&reply.body).expect("a JSON error");
        assert_eq!(error["error"]["code"], "bad_backend_answer", "{error}");
    }
}

#[tokio::test]
async fn a_worker_status_outside_200_to_599_becomes_502() {
    for status in [999, 101, 0, 600] {
        let reply = client_sees(status, &[("content-type", "application/json")], "{}").await;
        assert_eq!(reply.status, 502, "status {status}: {reply:?}");
    }
}

/// A proxy played by the test: accepts one worker, acks it, then sends it `requests` and
/// collects what comes back.
struct FakeProxy {
    url: String,
    listener: TcpListener,
}

impl FakeProxy {
    async fn bind() -> FakeProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        FakeProxy { url, listener }
    }

    /// Accepts the worker and registers it.
    async fn accept(&self) -> WebSocketStream<TcpStream> {
        let (stream, _) = tokio::time::timeout(PEER_WAIT, self.listener.accept())
            .await
            .expect("the worker connects in time")
            .unwrap();
        let mut socket = tokio_tungstenite::accept_async(stream).await.unwrap();
        loop {
            let frame = next_text(&mut socket).await;
            if let Ok(WorkerToServer::Register(register)) = WorkerToServer::from_json(&frame) {
                let ack = ServerToWorker::RegisterAck(RegisterAck {
                    worker_id: "w-1".to_string(),
                    models: register.models,
                    warnings: Vec::new(),
                    protocol_version: Some("1".to_string()),
                });
                socket
                    .send(Message::Text(ack.to_json().into()))
                    .await
                    .unwrap();
                return socket;
            }
        }
    }
}

async fn next_text(socket: &mut WebSocketStream<TcpStream>) -> String {
    loop {
        let frame = tokio::time::timeout(PEER_WAIT, socket.next())
            .await
            .expect("a message from the worker in time")
            .expect("socket open")
            .expect("frame");
        if let Message::Text(text) = frame {
            return text.to_string();
        }
    }
}

/// Waits for the worker's final word on each of `ids`, in whatever order it comes:
/// `"STATUS BODY"` for an answer, `"error CODE"` for an error.
async fn outcomes(socket: &mut WebSocketStream<TcpStream>, ids: &[String]) -> Vec<String> {
    let mut found: std::collections::HashMap<String, String> = Default::default();
    while found.len() < ids.len() {
        match WorkerToServer::from_json(&next_text(socket).await) {
            Ok(WorkerToServer::ResponseComplete(done)) => {
                let body = done.body.unwrap_or_default();
                found.insert(done.request_id, format!("{} {body}", done.status_code));
            }
            Ok(WorkerToServer::Error(error)) => {
                if let Some(id) = error.request_id {
                    found.insert(id, format!("error {}", error.code));
                }
            }
            _ => {}
        }
    }
    ids.iter().map(|id| found[id].clone()).collect()
}

/// The worker's final word on one request.
async fn outcome(socket: &mut WebSocketStream<TcpStream>, request_id: &str) -> String {
    outcomes(socket, &[request_id.to_string()]).await.remove(0)
}

fn request(id: &str, path: &str, headers: &[(&str, &str)]) -> ServerToWorker {
    ServerToWorker::Request(RequestMessage {
        request_id: id.to_string(),
        model: MODEL.to_string(),
        endpoint_path: path.to_string(),
        is_streaming: false,
        body: r#"{"model":"m","messages":[]}"#.to_string(),
        headers: headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect(),
        conversation: None,
        side_request: None,
    })
}

/// What a backend saw of one request: its path and its headers.
type Seen = (String, Vec<(String, String)>);

/// A backend that records every request (path and headers) and answers after `hold` — but
/// the worker's own reads, which no proxy chooses: its model list, `/props` (not a
/// llama-server: 404, so the worker never warms it up) and `/api/ps` (not an Ollama: 404, so
/// the worker does not watch it for models it unloads).
struct Backend {
    url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    in_flight_peak: Arc<AtomicUsize>,
}

async fn backend(hold: Duration) -> Backend {
    use axum::extract::Request;
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let in_flight = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let (record, now, top) = (seen.clone(), in_flight.clone(), peak.clone());
    let app = axum::Router::new()
        .route(
            "/v1/models",
            axum::routing::get(|| async {
                axum::Json(serde_json::json!({"data":[{"id": MODEL}]}))
            }),
        )
        .route(
            "/props",
            axum::routing::get(|| async { axum::http::StatusCode::NOT_FOUND }),
        )
        .route(
            "/api/ps",
            axum::routing::get(|| async { axum::http::StatusCode::NOT_FOUND }),
        )
        .fallback(move |request: Request| {
            let (record, now, top) = (record.clone(), now.clone(), top.clone());
            async move {
                let headers = request
                    .headers()
                    .iter()
                    .map(|(n, v)| (n.to_string(), v.to_str().unwrap_or("").to_string()))
                    .collect();
                record
                    .lock()
                    .unwrap()
                    .push((request.uri().to_string(), headers));
                let running = now.fetch_add(1, Ordering::SeqCst) + 1;
                top.fetch_max(running, Ordering::SeqCst);
                tokio::time::sleep(hold).await;
                now.fetch_sub(1, Ordering::SeqCst);
                axum::Json(serde_json::json!({"choices": []}))
            }
        });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    Backend {
        url,
        seen,
        in_flight_peak: peak,
    }
}

/// The real worker binary, joined to `proxy`, serving `backend`.
fn start_worker(data: &TempDir, proxy: &FakeProxy, backend: &Backend, extra: &[&str]) -> Running {
    let mut command = modelrelay(data.path());
    command
        .args([
            "worker",
            "--proxy-url",
            &proxy.url,
            "--backend-url",
            &backend.url,
        ])
        .args(["--models", MODEL, "--worker-secret", SECRET])
        .args(extra);
    Running::spawn(command)
}

/// A TCP listener that counts the connections it gets: where a request that left the backend
/// would land.
fn canary() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = StdListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let count = hits.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            if stream.is_ok() {
                count.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    (addr, hits)
}

#[tokio::test]
async fn an_endpoint_path_that_leaves_the_backend_reaches_nothing() {
    let data = TempDir::new("evil-proxy-paths");
    let proxy = FakeProxy::bind().await;
    let backend = backend(Duration::ZERO).await;
    let (canary, hits) = canary();
    let _worker = start_worker(&data, &proxy, &backend, &[]);
    let mut socket = proxy.accept().await;
    let attacks = [
        "@169.254.169.254/x".to_string(),
        format!("@{canary}/x"),
        format!("/@{canary}/x"),
        format!("//{canary}/x"),
        format!("http://{canary}/x"),
        "/../x".to_string(),
        "/v1/%2e%2e/%2e%2e/x".to_string(),
        "/v1\\..\\x".to_string(),
    ];
    for (n, path) in attacks.iter().enumerate() {
        let id = format!("r-{n}");
        socket
            .send(Message::Text(request(&id, path, &[]).to_json().into()))
            .await
            .unwrap();
        let outcome = outcome(&mut socket, &id).await;
        assert!(
            outcome.starts_with("400 ") && outcome.contains("invalid_endpoint_path"),
            "{path}: {outcome}"
        );
    }
    // A legitimate path still works, so the refusals were about the paths.
    socket
        .send(Message::Text(
            request("ok", "/v1/chat/completions", &[]).to_json().into(),
        ))
        .await
        .unwrap();
    assert!(outcome(&mut socket, "ok").await.starts_with("200 "));
    let seen: Vec<String> = backend
        .seen
        .lock()
        .unwrap()
        .iter()
        .map(|s| s.0.clone())
        .collect();
    assert!(
        seen.iter()
            .all(|p| p == "/v1/chat/completions" || p == "/v1/models"),
        "the backend saw {seen:?}"
    );
    assert_eq!(
        hits.load(Ordering::SeqCst),
        0,
        "something reached the canary"
    );
}

#[tokio::test]
async fn clients_credentials_reach_the_backend_only_when_the_worker_opts_in() {
    for (opt_in, expected) in [(false, None), (true, Some("Bearer sk-user"))] {
        let data = TempDir::new("evil-proxy-auth");
        let proxy = FakeProxy::bind().await;
        let backend = backend(Duration::ZERO).await;
        let extra: &[&str] = if opt_in {
            &["--forward-client-auth"]
        } else {
            &[]
        };
        let _worker = start_worker(&data, &proxy, &backend, extra);
        let mut socket = proxy.accept().await;
        let headers = [("authorization", "Bearer sk-user"), ("x-api-key", "sk-ant")];
        socket
            .send(Message::Text(
                request("auth", "/v1/chat/completions", &headers)
                    .to_json()
                    .into(),
            ))
            .await
            .unwrap();
        assert!(outcome(&mut socket, "auth").await.starts_with("200 "));
        let seen = backend.seen.lock().unwrap().clone();
        let (_, headers) = seen
            .iter()
            .find(|(path, _)| path == "/v1/chat/completions")
            .expect("the chat request reached the backend");
        let authorization = headers
            .iter()
            .find(|(n, _)| n == "authorization")
            .map(|(_, v)| v.as_str());
        assert_eq!(authorization, expected, "opt in: {opt_in}");
        assert_eq!(
            headers.iter().any(|(n, _)| n == "x-api-key"),
            opt_in,
            "opt in: {opt_in}"
        );
    }
}

#[tokio::test]
async fn a_worker_never_runs_more_requests_than_its_max_concurrency() {
    let data = TempDir::new("evil-proxy-flood");
    let proxy = FakeProxy::bind().await;
    let backend = backend(Duration::from_millis(1500)).await;
    let _worker = start_worker(&data, &proxy, &backend, &["--max-concurrency", "2"]);
    let mut socket = proxy.accept().await;
    for n in 0..5 {
        socket
            .send(Message::Text(
                request(&format!("f-{n}"), "/v1/chat/completions", &[])
                    .to_json()
                    .into(),
            ))
            .await
            .unwrap();
    }
    let ids: Vec<String> = (0..5).map(|n| format!("f-{n}")).collect();
    let outcomes = outcomes(&mut socket, &ids).await;
    let busy = outcomes
        .iter()
        .filter(|o| *o == "error worker_busy")
        .count();
    let answered = outcomes.iter().filter(|o| o.starts_with("200 ")).count();
    assert_eq!((answered, busy), (2, 3), "{outcomes:?}");
    assert_eq!(backend.in_flight_peak.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_rogue_proxy_reaches_only_inference_routes_and_only_with_the_forwarded_headers() {
    let data = TempDir::new("evil-proxy-routes");
    let proxy = FakeProxy::bind().await;
    let backend = backend(Duration::ZERO).await;
    let _worker = start_worker(&data, &proxy, &backend, &[]);
    let mut socket = proxy.accept().await;
    // Routes of the backend that are not inference: pulling or deleting a model (Ollama),
    // the slots and their saved prompts (llama-server), anything else.
    let injected = [
        ("cookie", "session=x"),
        ("x-injected", "1"),
        ("host", "evil.example"),
    ];
    for (n, path) in [
        "/api/pull",
        "/api/delete",
        "/slots",
        "/v1/models/x",
        "/admin",
    ]
    .iter()
    .enumerate()
    {
        let id = format!("r-{n}");
        socket
            .send(Message::Text(
                request(&id, path, &injected).to_json().into(),
            ))
            .await
            .unwrap();
        let outcome = outcome(&mut socket, &id).await;
        assert!(
            outcome.starts_with("403 ") && outcome.contains("route_not_forwarded"),
            "{path}: {outcome}"
        );
    }
    // An inference request with the same injected headers: forwarded, without them.
    socket
        .send(Message::Text(
            request(
                "ok",
                "/v1/chat/completions",
                &[
                    injected[0],
                    injected[1],
                    ("anthropic-version", "2023-06-01"),
                ],
            )
            .to_json()
            .into(),
        ))
        .await
        .unwrap();
    assert!(outcome(&mut socket, "ok").await.starts_with("200 "));
    let seen = backend.seen.lock().unwrap().clone();
    let paths: Vec<&str> = seen.iter().map(|(path, _)| path.as_str()).collect();
    assert!(
        paths
            .iter()
            .all(|p| *p == "/v1/chat/completions" || *p == "/v1/models"),
        "the backend saw {paths:?}"
    );
    let (_, headers) = seen
        .iter()
        .find(|(path, _)| path == "/v1/chat/completions")
        .expect("the inference request arrived");
    assert!(
        headers
            .iter()
            .all(|(name, _)| name != "cookie" && name != "x-injected"),
        "{headers:?}"
    );
    assert!(headers
        .iter()
        .any(|(name, value)| name == "anthropic-version" && value == "2023-06-01"));
}
