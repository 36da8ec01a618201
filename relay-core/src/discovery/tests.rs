//! Tests of local backend discovery: fingerprints of each server kind, port scans against
//! real listeners, and the classification of what answers.

use super::*;

use std::time::Instant;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{Html, Response};
use axum::routing::get as route;
use axum::{Json, Router};
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

async fn serve(router: Router) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    port
}

/// Stamps a `Server` header on every response, 404s included, the way
/// llama.cpp and llamafile do.
fn with_server_header(router: Router, value: &'static str) -> Router {
    router.layer(axum::middleware::map_response(
        move |mut response: Response| async move {
            response
                .headers_mut()
                .insert(header::SERVER, HeaderValue::from_static(value));
            response
        },
    ))
}

fn openai_list(owner: &str, ids: &[&str]) -> Json<Value> {
    let data: Vec<Value> = ids
        .iter()
        .map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": owner}))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

fn ollama_tags(names: &[&str]) -> Json<Value> {
    let models: Vec<Value> = names
        .iter()
        .map(|n| json!({"name": n, "model": n, "size": 1, "digest": "abc"}))
        .collect();
    Json(json!({ "models": models }))
}

async fn llama_server() -> u16 {
    let router = Router::new()
        .route(
            "/v1/models",
            route(|| async { openai_list("llamacpp", &["qwen2.5-7b-instruct-q4_k_m.gguf"]) }),
        )
        .route("/health", route(|| async { Json(json!({"status": "ok"})) }))
        .route(
            "/props",
            route(|| async {
                Json(json!({"total_slots": 1, "model_path": "/m/qwen.gguf", "build_info": "b5000"}))
            }),
        )
        // llama-server emulates Ollama's listing; that must not make it Ollama.
        .route("/api/tags", route(|| async { ollama_tags(&["qwen"]) }))
        .route(
            "/",
            route(|| async { Html("<!doctype html><title>llama.cpp</title>") }),
        );
    serve(with_server_header(router, "llama.cpp")).await
}

async fn llama_server_loading() -> u16 {
    let loading = || async {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"error": {"code": 503, "message": "Loading model"}})),
        )
    };
    let router = Router::new()
        .route("/v1/models", route(loading))
        .route("/health", route(loading))
        .route("/", route(loading));
    serve(with_server_header(router, "llama.cpp")).await
}

async fn llamafile() -> u16 {
    let router = Router::new().route(
        "/v1/models",
        route(|| async { openai_list("llamafile", &["Meta-Llama-3-8B-Instruct.Q4_0"]) }),
    );
    serve(with_server_header(router, "llamafile/0.9.3")).await
}

async fn ollama_tags_only() -> u16 {
    serve(
        Router::new()
            .route("/", route(|| async { "Ollama is running" }))
            .route(
                "/api/version",
                route(|| async { Json(json!({"version": "0.12.6"})) }),
            )
            .route(
                "/api/tags",
                route(|| async {
                    ollama_tags(&["llama3.2:latest", "qwen3:8b", "llama3.2:latest"])
                }),
            ),
    )
    .await
}

async fn ollama_full() -> u16 {
    serve(
        Router::new()
            .route("/", route(|| async { "Ollama is running" }))
            .route(
                "/api/version",
                route(|| async { Json(json!({"version": "0.12.6"})) }),
            )
            .route(
                "/api/tags",
                route(|| async { ollama_tags(&["gemma3:4b", "qwen3:8b"]) }),
            )
            .route(
                "/v1/models",
                route(|| async { openai_list("library", &["gemma3:4b", "qwen3:8b"]) }),
            ),
    )
    .await
}

/// Ollama's native API without the tell-tale root page (e.g. behind a
/// reverse proxy that routes only `/api`).
async fn ollama_without_root() -> u16 {
    serve(
        Router::new()
            .route(
                "/api/version",
                route(|| async { Json(json!({"version": "0.5.1"})) }),
            )
            .route(
                "/api/tags",
                route(|| async { ollama_tags(&["phi4:latest"]) }),
            ),
    )
    .await
}

async fn vllm() -> u16 {
    let router = Router::new()
        .route(
            "/v1/models",
            route(|| async { openai_list("vllm", &["meta-llama/Llama-3.1-8B-Instruct"]) }),
        )
        .route(
            "/version",
            route(|| async { Json(json!({"version": "0.11.0"})) }),
        )
        .route("/health", route(|| async { StatusCode::OK }));
    serve(with_server_header(router, "uvicorn")).await
}

async fn lm_studio() -> u16 {
    serve(Router::new().route(
        "/v1/models",
        route(|| async {
            openai_list(
                "organization_owner",
                &["qwen/qwen3-4b", "text-embedding-nomic-embed-text-v1.5"],
            )
        }),
    ))
    .await
}

/// LM Studio with nothing loaded: the OpenAI list is empty, so only its
/// native REST API gives it away.
async fn lm_studio_empty() -> u16 {
    serve(
        Router::new()
            .route(
                "/v1/models",
                route(|| async { openai_list("organization_owner", &[]) }),
            )
            .route(
                "/api/v0/models",
                route(|| async { openai_list("organization_owner", &[]) }),
            ),
    )
    .await
}

async fn generic_openai() -> u16 {
    serve(Router::new().route(
        "/v1/models",
        route(|| async {
            openai_list(
                "koboldcpp",
                &["koboldcpp/mistral", "koboldcpp/mistral", "other"],
            )
        }),
    ))
    .await
}

async fn relay_proxy() -> u16 {
    serve(
        Router::new()
            .route(
                "/health",
                route(|| async { Json(json!({"status": "ok", "workers_connected": 2})) }),
            )
            .route(
                "/v1/models",
                route(|| async { openai_list("modelrelay", &["qwen3:8b"]) }),
            ),
    )
    .await
}

async fn html_404() -> u16 {
    serve(Router::new().fallback(|| async {
        (
            StatusCode::NOT_FOUND,
            Html("<html><body><h1>404 Not Found</h1></body></html>"),
        )
    }))
    .await
}

async fn garbage_json() -> u16 {
    serve(Router::new().fallback(|| async { "this is { not json" })).await
}

async fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().port()
    // Dropping the listener closes the port.
}

/// Something that is not HTTP at all: writes bytes and hangs up.
async fn raw_garbage() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let _ = socket.write_all(b"\x00\xffSSH-2.0-nope\r\n\r\n").await;
        }
    });
    port
}

/// Accepts connections and never answers.
async fn black_hole() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    port
}

fn options(ports: Vec<u16>) -> DiscoveryOptions {
    DiscoveryOptions {
        ports,
        timeout: Duration::from_millis(1000),
        ..DiscoveryOptions::default()
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .no_proxy()
        .build()
        .unwrap()
}

fn url(port: u16) -> String {
    format!("http://127.0.0.1:{port}")
}

/// What `discover` reports for a test server of this process on `port`.
fn backend(kind: BackendKind, port: u16, models: &[&str]) -> DiscoveredBackend {
    DiscoveredBackend {
        kind,
        url: url(port),
        models: models.iter().map(|m| m.to_string()).collect(),
        owner: Owner::ThisUser,
        confirmed: false,
    }
}

#[tokio::test]
async fn discovers_each_kind_and_sorts_by_port() {
    let llama = llama_server().await;
    let llama_loading = llama_server_loading().await;
    let lfile = llamafile().await;
    let ollama_native = ollama_tags_only().await;
    let ollama_both = ollama_full().await;
    let ollama_api_only = ollama_without_root().await;
    let vllm = vllm().await;
    let lms = lm_studio().await;
    let lms_empty = lm_studio_empty().await;
    let generic = generic_openai().await;
    let proxy = relay_proxy().await;
    let html = html_404().await;
    let garbage = garbage_json().await;
    let raw = raw_garbage().await;
    let closed = closed_port().await;

    let ports = vec![
        llama,
        llama_loading,
        lfile,
        ollama_native,
        ollama_both,
        ollama_api_only,
        vllm,
        lms,
        lms_empty,
        generic,
        proxy,
        html,
        garbage,
        raw,
        closed,
    ];
    let started = Instant::now();
    let found = discover(&options(ports)).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );

    let mut expected = vec![
        backend(
            BackendKind::LlamaServer,
            llama,
            &["qwen2.5-7b-instruct-q4_k_m.gguf"],
        ),
        backend(BackendKind::LlamaServer, llama_loading, &[]),
        backend(
            BackendKind::Llamafile,
            lfile,
            &["Meta-Llama-3-8B-Instruct.Q4_0"],
        ),
        backend(
            BackendKind::Ollama,
            ollama_native,
            &["llama3.2:latest", "qwen3:8b"],
        ),
        backend(BackendKind::Ollama, ollama_both, &["gemma3:4b", "qwen3:8b"]),
        backend(BackendKind::Ollama, ollama_api_only, &["phi4:latest"]),
        backend(
            BackendKind::Vllm,
            vllm,
            &["meta-llama/Llama-3.1-8B-Instruct"],
        ),
        backend(
            BackendKind::LmStudio,
            lms,
            &["qwen/qwen3-4b", "text-embedding-nomic-embed-text-v1.5"],
        ),
        backend(BackendKind::LmStudio, lms_empty, &[]),
        backend(
            BackendKind::OpenAiCompatible,
            generic,
            &["koboldcpp/mistral", "other"],
        ),
    ];
    expected.sort_by_key(|b| b.url.rsplit(':').next().unwrap().parse::<u16>().unwrap());
    assert_eq!(found, expected);
}

#[tokio::test]
async fn relay_proxy_is_never_a_backend() {
    let proxy = relay_proxy().await;
    assert_eq!(probe(&client(), &url(proxy)).await, None);
    assert!(discover(&options(vec![proxy])).await.is_empty());
}

#[tokio::test]
async fn non_llm_servers_are_ignored() {
    let client = client();
    for port in [
        html_404().await,
        garbage_json().await,
        raw_garbage().await,
        closed_port().await,
    ] {
        assert_eq!(probe(&client, &url(port)).await, None, "port {port}");
    }
}

#[tokio::test]
async fn silent_port_is_bounded_by_the_timeout() {
    let hole = black_hole().await;
    let llama = llama_server().await;
    let opts = DiscoveryOptions {
        timeout: Duration::from_millis(300),
        ..options(vec![hole, llama])
    };
    let started = Instant::now();
    let found = discover(&opts).await;
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].kind, BackendKind::LlamaServer);
}

#[tokio::test]
async fn excluded_and_repeated_ports_are_probed_once_or_not_at_all() {
    let a = generic_openai().await;
    let b = vllm().await;
    let opts = DiscoveryOptions {
        exclude_ports: vec![b],
        ..options(vec![a, b, a, 0])
    };
    let found = discover(&opts).await;
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].url, url(a));
}

#[tokio::test]
async fn probe_normalises_the_base_url() {
    let port = vllm().await;
    let found = probe(&client(), &format!("http://127.0.0.1:{port}/"))
        .await
        .unwrap();
    assert_eq!(found.url, url(port));
}

#[tokio::test]
async fn fetch_models_prefers_openai_and_falls_back_to_ollama() {
    let client = client();
    let generic = generic_openai().await;
    assert_eq!(
        fetch_models(&client, &url(generic)).await.unwrap(),
        ["koboldcpp/mistral", "other"]
    );
    let ollama = ollama_tags_only().await;
    assert_eq!(
        fetch_models(&client, &format!("{}/", url(ollama)))
            .await
            .unwrap(),
        ["llama3.2:latest", "qwen3:8b"]
    );
}

#[tokio::test]
async fn fetch_models_connection_refused_names_the_url() {
    let port = closed_port().await;
    let err = fetch_models(&client(), &url(port)).await.unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, DiscoveryError::Connect { .. }), "{err:?}");
    assert!(
        message.contains(&format!("{}/v1/models", url(port))),
        "{message}"
    );
    assert!(message.to_lowercase().contains("refused"), "{message}");
}

#[tokio::test]
async fn fetch_models_http_status_names_the_url() {
    let port = html_404().await;
    let err = fetch_models(&client(), &url(port)).await.unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, DiscoveryError::NoModelList { .. }), "{err:?}");
    assert!(
        message.contains(&format!("{}/v1/models answered HTTP 404", url(port))),
        "{message}"
    );
    assert!(
        message.contains(&format!("{}/api/tags answered HTTP 404", url(port))),
        "{message}"
    );
    // An HTML error page is noise, not an explanation.
    assert!(!message.contains("<html>"), "{message}");
}

#[tokio::test]
async fn fetch_models_quotes_a_json_error_body() {
    let port = serve(Router::new().fallback(|| async {
        (
            StatusCode::UNAUTHORIZED,
            Json(json!({"error": "Unauthorized"})),
        )
    }))
    .await;
    let message = fetch_models(&client(), &url(port))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("401 Unauthorized: {\"error\":\"Unauthorized\"}"),
        "{message}"
    );
}

#[tokio::test]
async fn fetch_models_unparseable_body_names_the_url() {
    let port = garbage_json().await;
    let message = fetch_models(&client(), &url(port))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        message.contains(&format!(
            "{}/v1/models did not return a model list: body is not JSON",
            url(port)
        )),
        "{message}"
    );
}

#[tokio::test]
async fn fetch_models_rejects_an_invalid_url() {
    for bad in ["localhost:8080", "not a url", "ftp://127.0.0.1:8080"] {
        let err = fetch_models(&client(), bad).await.unwrap_err();
        assert!(matches!(err, DiscoveryError::InvalidUrl { .. }), "{err:?}");
        assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
    }
    assert_eq!(probe(&client(), "not a url").await, None);
}

#[tokio::test]
async fn fetch_models_on_garbage_protocol_fails_cleanly() {
    let port = raw_garbage().await;
    let err = fetch_models(&client(), &url(port)).await.unwrap_err();
    assert!(err.to_string().contains(&url(port)), "{err}");
}

#[test]
fn parsers_accept_real_shapes_and_reject_lookalikes() {
    let ollama_empty = json!({"object": "list", "data": null});
    assert!(parse_openai_list(&ollama_empty).unwrap().ids.is_empty());
    assert!(parse_openai_list(&json!({"data": []})).is_err());
    assert!(parse_openai_list(&json!({"data": [{"name": "x"}]})).is_err());
    assert!(parse_openai_list(&json!([1, 2])).is_err());
    let list = parse_openai_list(
        &json!({"data": [{"id": " a "}, {"id": "a"}, {"id": ""}, 7, {"id": "b"}]}),
    )
    .unwrap();
    assert_eq!(list.ids, ["a", "b"]);
    assert_eq!(
        parse_ollama_tags(&json!({"models": [{"model": "m:1"}]})).unwrap(),
        ["m:1"]
    );
    assert!(parse_ollama_tags(&json!({"models": "x"})).is_err());
    assert!(contains_key(
        &json!({"a": [{"workers_connected": 0}]}),
        "workers_connected"
    ));
}

#[test]
fn defaults_and_labels() {
    let opts = DiscoveryOptions::default();
    assert_eq!(opts.host, "127.0.0.1");
    assert_eq!(opts.ports, WELL_KNOWN_PORTS);
    assert_eq!(opts.timeout, Duration::from_millis(800));
    assert!(opts.exclude_ports.is_empty());
    for port in [8080, 8000, 11434, 1234, 5001] {
        assert!(WELL_KNOWN_PORTS.contains(&port), "{port}");
    }
    assert_eq!(BackendKind::LlamaServer.label(), "llama-server");
    assert_eq!(BackendKind::Vllm.label(), "vLLM");
    assert_eq!(BackendKind::LmStudio.label(), "LM Studio");
    assert_eq!(BackendKind::OpenAiCompatible.label(), "OpenAI-compatible");
    assert_eq!(
        serde_json::to_value(BackendKind::OpenAiCompatible).unwrap(),
        json!("openai_compatible")
    );
    assert_eq!(url_host("::1"), "[::1]");
    assert_eq!(url_host("127.0.0.1"), "127.0.0.1");
}

#[tokio::test]
async fn only_a_llama_cpp_server_s_props_give_a_slot_count() {
    let client = reqwest::Client::new();
    let base = |port: u16| format!("http://127.0.0.1:{port}");
    let llama = llama_server().await;
    assert_eq!(fetch_slots(&client, &base(llama)).await, Some(1));
    let props = |body: &'static str, server: &'static str| {
        let router = Router::new().route(
            "/props",
            route(move || async move { ([(header::CONTENT_TYPE, "application/json")], body) }),
        );
        serve(with_server_header(router, server))
    };
    let four = props(r#"{"total_slots":4}"#, "llama.cpp").await;
    assert_eq!(fetch_slots(&client, &base(four)).await, Some(4));
    // Another server's /props, or llama.cpp's header on an answer that is not a sane count.
    for (body, server) in [
        (r#"{"total_slots":4}"#, "uvicorn"),
        (r#"{"total_slots":0}"#, "llama.cpp"),
        (r#"{"total_slots":-1}"#, "llama.cpp"),
        (r#"{"total_slots":257}"#, "llama.cpp"),
        (r#"{"total_slots":18446744073709551616}"#, "llama.cpp"),
        (r#"{"total_slots":"4"}"#, "llama.cpp"),
        (r#"{"total_slots":4.5}"#, "llama.cpp"),
        (r#"[4]"#, "llama.cpp"),
        (r#"{"total_slots":4"#, "llama.cpp"),
        ("", "llama.cpp"),
    ] {
        let port = props(body, server).await;
        assert_eq!(
            fetch_slots(&client, &base(port)).await,
            None,
            "{body} from {server}"
        );
    }
    let vllm = vllm().await;
    assert_eq!(fetch_slots(&client, &base(vllm)).await, None);
    assert_eq!(fetch_slots(&client, &base(closed_port().await)).await, None);
    assert_eq!(fetch_slots(&client, "not a url").await, None);
}
