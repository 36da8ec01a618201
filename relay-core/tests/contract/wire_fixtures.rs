//! Wire fixtures: one hand-written JSON file per protocol message, copied from the seeds' wire
//! traces (same field names and values). Each must parse into our protocol types and serialize
//! back to the same JSON, so a peer written only from the seeds reads what we write and we read
//! what it writes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use relay_core::protocol::{
    CancelReason, ErrorMessage, GracefulShutdownMessage, ModelsRefreshMessage, PingMessage,
    RegisterAck, RegisterMessage, RequestMessage, ResponseCompleteMessage, ServerToWorker,
    TokenCounts, WorkerToServer,
};
use serde_json::{json, Value};

/// Message types the proxy sends.
const SERVER_TYPES: &[&str] = &[
    "register_ack",
    "request",
    "cancel",
    "ping",
    "graceful_shutdown",
    "models_refresh",
];

/// Message types a worker sends.
const WORKER_TYPES: &[&str] = &[
    "register",
    "models_update",
    "response_chunk",
    "response_complete",
    "pong",
    "error",
];

/// Either direction's parsed message.
#[derive(Debug)]
enum Parsed {
    Server(ServerToWorker),
    Worker(WorkerToServer),
}

impl Parsed {
    fn to_value(&self) -> Value {
        let text = match self {
            Parsed::Server(message) => message.to_json(),
            Parsed::Worker(message) => message.to_json(),
        };
        serde_json::from_str(&text).expect("our serialization is JSON")
    }
}

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wire")
}

/// Every fixture file name (without `.json`), sorted.
fn fixture_names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(fixtures_dir())
        .expect("fixtures directory")
        .map(|entry| entry.expect("dir entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .map(|path| path.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn fixture(name: &str) -> Value {
    let path = fixtures_dir().join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("read fixture {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("fixture {name} is not JSON: {e}"))
}

/// Parses `value` in the direction its `type` belongs to.
fn parse(name: &str, value: &Value) -> Parsed {
    let kind = value["type"]
        .as_str()
        .unwrap_or_else(|| panic!("fixture {name} has no string \"type\""));
    if SERVER_TYPES.contains(&kind) {
        Parsed::Server(
            serde_json::from_value(value.clone())
                .unwrap_or_else(|e| panic!("fixture {name} as ServerToWorker: {e}")),
        )
    } else if WORKER_TYPES.contains(&kind) {
        Parsed::Worker(
            serde_json::from_value(value.clone())
                .unwrap_or_else(|e| panic!("fixture {name} as WorkerToServer: {e}")),
        )
    } else {
        panic!("fixture {name} has unknown type {kind:?}")
    }
}

/// Parses fixture `name`, re-serializes it and checks the JSON is unchanged; returns the message.
fn round_trip(name: &str) -> Parsed {
    let original = fixture(name);
    let parsed = parse(name, &original);
    assert_eq!(
        parsed.to_value(),
        original,
        "fixture {name} must serialize back to the same JSON"
    );
    parsed
}

fn server(name: &str) -> ServerToWorker {
    match round_trip(name) {
        Parsed::Server(message) => message,
        Parsed::Worker(other) => panic!("{name} parsed as a worker message: {other:?}"),
    }
}

fn worker(name: &str) -> WorkerToServer {
    match round_trip(name) {
        Parsed::Worker(message) => message,
        Parsed::Server(other) => panic!("{name} parsed as a server message: {other:?}"),
    }
}

fn keys(value: &Value) -> BTreeSet<String> {
    value
        .as_object()
        .expect("a JSON object")
        .keys()
        .cloned()
        .collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| n.to_string()).collect()
}

#[test]
fn every_wire_fixture_serializes_back_to_identical_json() {
    let names = fixture_names();
    assert!(!names.is_empty(), "no fixtures in {:?}", fixtures_dir());
    for name in &names {
        round_trip(name);
    }
}

#[test]
fn fixtures_cover_every_message_type_and_every_cancel_reason() {
    let mut types = BTreeSet::new();
    let mut reasons = BTreeSet::new();
    for name in fixture_names() {
        let value = fixture(&name);
        types.insert(value["type"].as_str().unwrap().to_string());
        if value["type"] == "cancel" {
            reasons.insert(value["reason"].as_str().unwrap().to_string());
        }
    }
    let all: BTreeSet<String> = SERVER_TYPES
        .iter()
        .chain(WORKER_TYPES)
        .map(|t| t.to_string())
        .collect();
    assert_eq!(types, all);
    assert_eq!(
        reasons,
        set(&[
            "client_disconnect",
            "timeout",
            "graceful_shutdown",
            "worker_disconnect",
            "requeue_exhausted",
            "server_shutdown",
        ])
    );
}

#[test]
fn register_fixture_is_the_seed_registration() {
    let WorkerToServer::Register(register) = worker("register") else {
        panic!("not a register")
    };
    assert_eq!(
        register,
        RegisterMessage {
            warm_ups: None,
            sides_first: None,
            worker_name: "gpu-box-1".to_string(),
            models: vec!["llama3-8b".to_string()],
            max_concurrent: 4,
            protocol_version: Some("1".to_string()),
            current_load: Some(0),
            mac_address: None,
            sleeps_when_idle: None,
            context_windows: None,
        }
    );
}

#[test]
fn register_ack_fixtures_carry_worker_id_models_version_and_warnings() {
    let ServerToWorker::RegisterAck(ack) = server("register_ack") else {
        panic!("not a register_ack")
    };
    assert_eq!(ack.worker_id, "w-a1b2c3");
    assert_eq!(ack.models, ["llama3-8b"]);
    assert_eq!(ack.protocol_version.as_deref(), Some("1"));
    assert!(ack.warnings.is_empty());
    let ServerToWorker::RegisterAck(ack) = server("register_ack_with_warnings") else {
        panic!("not a register_ack")
    };
    assert_eq!(ack.warnings.len(), 1);
}

#[test]
fn request_fixtures_carry_id_model_path_streaming_flag_raw_body_and_headers() {
    let ServerToWorker::Request(request) = server("request") else {
        panic!("not a request")
    };
    assert_eq!(request.request_id, "r-001");
    assert_eq!(request.model, "llama3-8b");
    assert_eq!(request.endpoint_path, "/v1/chat/completions");
    assert!(!request.is_streaming);
    let body: Value = serde_json::from_str(&request.body).expect("body is JSON text");
    assert_eq!(body["messages"][0]["content"], "Hello!");
    assert_eq!(request.headers["authorization"], "Bearer sk-client");
    let ServerToWorker::Request(request) = server("request_streaming") else {
        panic!("not a request")
    };
    assert!(request.is_streaming);
}

#[test]
fn response_chunk_fixture_carries_sse_text_verbatim() {
    let WorkerToServer::ResponseChunk(chunk) = worker("response_chunk") else {
        panic!("not a response_chunk")
    };
    assert_eq!(chunk.request_id, "r-002");
    assert_eq!(chunk.chunk, "data: {\"choices\":[...]}\n\n");
}

#[test]
fn response_complete_fixtures_carry_status_headers_body_and_token_counts() {
    let WorkerToServer::ResponseComplete(complete) = worker("response_complete") else {
        panic!("not a response_complete")
    };
    assert_eq!(complete.status_code, 200);
    assert_eq!(complete.headers["content-type"], "application/json");
    assert!(complete.body.is_some());
    assert_eq!(
        complete.token_counts,
        Some(TokenCounts {
            prompt_tokens: Some(42),
            completion_tokens: Some(128),
            total_tokens: Some(170),
        })
    );
    let WorkerToServer::ResponseComplete(complete) = worker("response_complete_streaming") else {
        panic!("not a response_complete")
    };
    assert_eq!(complete.request_id, "r-002");
    assert!(complete.headers.is_empty());
    assert_eq!(complete.body, None);
}

#[test]
fn cancel_fixtures_parse_to_each_cancel_reason() {
    let expected = [
        ("cancel_client_disconnect", CancelReason::ClientDisconnect),
        ("cancel_timeout", CancelReason::Timeout),
        ("cancel_graceful_shutdown", CancelReason::GracefulShutdown),
        ("cancel_worker_disconnect", CancelReason::WorkerDisconnect),
        ("cancel_requeue_exhausted", CancelReason::RequeueExhausted),
        ("cancel_server_shutdown", CancelReason::ServerShutdown),
    ];
    for (name, reason) in expected {
        let ServerToWorker::Cancel(cancel) = server(name) else {
            panic!("{name} is not a cancel")
        };
        assert_eq!(cancel.reason, reason, "{name}");
        assert_eq!(fixture(name)["reason"], reason.as_str(), "{name}");
    }
}

#[test]
fn ping_and_pong_fixtures_echo_the_timestamp_and_report_load() {
    let ServerToWorker::Ping(ping) = server("ping") else {
        panic!("not a ping")
    };
    let WorkerToServer::Pong(pong) = worker("pong") else {
        panic!("not a pong")
    };
    assert_eq!(ping.timestamp_unix_ms, Some(1_767_225_600_000));
    assert_eq!(pong.timestamp_unix_ms, ping.timestamp_unix_ms);
    assert_eq!(pong.current_load, 1);
}

#[test]
fn graceful_shutdown_fixture_carries_reason_and_drain_timeout() {
    let ServerToWorker::GracefulShutdown(message) = server("graceful_shutdown") else {
        panic!("not a graceful_shutdown")
    };
    assert_eq!(
        message,
        GracefulShutdownMessage {
            reason: Some("maintenance".to_string()),
            drain_timeout_secs: Some(30),
            reconnect: None,
        }
    );
}

#[test]
fn graceful_shutdown_of_a_stopping_proxy_adds_only_the_optional_reconnect_field() {
    let message = ServerToWorker::GracefulShutdown(GracefulShutdownMessage {
        reason: Some("proxy shutting down".to_string()),
        drain_timeout_secs: Some(30),
        reconnect: Some(true),
    });
    let sent: Value = serde_json::from_str(&message.to_json()).unwrap();
    assert_eq!(
        sent,
        json!({
            "type": "graceful_shutdown",
            "reason": "proxy shutting down",
            "drain_timeout_secs": 30,
            "reconnect": true
        })
    );
    // The seeds' message (a published proxy's, or an admin's drain) has no such field.
    let ServerToWorker::GracefulShutdown(seed) = server("graceful_shutdown") else {
        panic!("not a graceful_shutdown")
    };
    assert_eq!(seed.reconnect, None);
}

#[test]
fn models_refresh_and_models_update_fixtures_are_the_seed_messages() {
    let ServerToWorker::ModelsRefresh(refresh) = server("models_refresh") else {
        panic!("not a models_refresh")
    };
    assert_eq!(refresh.reason.as_deref(), Some("periodic"));
    let WorkerToServer::ModelsUpdate(update) = worker("models_update") else {
        panic!("not a models_update")
    };
    assert_eq!(update.models, ["llama3-8b", "codellama-13b"]);
    assert_eq!(update.current_load, 1);
}

#[test]
fn error_fixtures_are_request_scoped_or_worker_level() {
    let WorkerToServer::Error(error) = worker("error") else {
        panic!("not an error")
    };
    assert_eq!(error.request_id.as_deref(), Some("r-001"));
    assert_eq!(error.code, "backend_unavailable");
    let WorkerToServer::Error(error) = worker("error_worker_level") else {
        panic!("not an error")
    };
    assert_eq!(error.request_id, None);
}

#[test]
fn absent_optional_fields_are_omitted_not_sent_as_null() {
    let register = serde_json::to_value(WorkerToServer::Register(RegisterMessage {
        warm_ups: None,
        sides_first: None,
        worker_name: "w".to_string(),
        models: vec!["m".to_string()],
        max_concurrent: 1,
        protocol_version: None,
        current_load: None,
        mac_address: None,
        sleeps_when_idle: None,
        context_windows: None,
    }))
    .unwrap();
    assert_eq!(
        keys(&register),
        set(&["type", "worker_name", "models", "max_concurrent"])
    );

    let ack = serde_json::to_value(ServerToWorker::RegisterAck(RegisterAck {
        worker_id: "w-1".to_string(),
        models: vec![],
        warnings: vec![],
        protocol_version: None,
    }))
    .unwrap();
    assert_eq!(keys(&ack), set(&["type", "worker_id", "models"]));

    let request = serde_json::to_value(ServerToWorker::Request(RequestMessage {
        request_id: "r-1".to_string(),
        model: "m".to_string(),
        endpoint_path: "/v1/chat/completions".to_string(),
        is_streaming: false,
        body: "{}".to_string(),
        headers: BTreeMap::new(),
        conversation: None,
        side_request: None,
    }))
    .unwrap();
    assert_eq!(
        keys(&request),
        set(&[
            "type",
            "request_id",
            "model",
            "endpoint_path",
            "is_streaming",
            "body"
        ])
    );

    let complete =
        serde_json::to_value(WorkerToServer::ResponseComplete(ResponseCompleteMessage {
            request_id: "r-1".to_string(),
            status_code: 200,
            headers: BTreeMap::new(),
            body: None,
            token_counts: None,
            timings: None,
        }))
        .unwrap();
    assert_eq!(keys(&complete), set(&["type", "request_id", "status_code"]));

    let partial_counts = serde_json::to_value(TokenCounts {
        prompt_tokens: Some(3),
        completion_tokens: None,
        total_tokens: None,
    })
    .unwrap();
    assert_eq!(partial_counts, json!({"prompt_tokens": 3}));

    assert_eq!(
        serde_json::to_value(ServerToWorker::Ping(PingMessage::default())).unwrap(),
        json!({"type": "ping"})
    );
    assert_eq!(
        serde_json::to_value(ServerToWorker::GracefulShutdown(
            GracefulShutdownMessage::default()
        ))
        .unwrap(),
        json!({"type": "graceful_shutdown"})
    );
    assert_eq!(
        serde_json::to_value(ServerToWorker::ModelsRefresh(
            ModelsRefreshMessage::default()
        ))
        .unwrap(),
        json!({"type": "models_refresh"})
    );
    let worker_error = serde_json::to_value(WorkerToServer::Error(ErrorMessage {
        request_id: None,
        code: "x".to_string(),
        message: "y".to_string(),
    }))
    .unwrap();
    assert_eq!(keys(&worker_error), set(&["type", "code", "message"]));
}

#[test]
fn messages_without_optional_fields_parse_as_legacy_peers_send_them() {
    let register: WorkerToServer = serde_json::from_value(json!({
        "type": "register", "worker_name": "old", "models": ["m"], "max_concurrent": 2
    }))
    .expect("legacy register without protocol_version or current_load");
    let WorkerToServer::Register(register) = register else {
        panic!("not a register")
    };
    assert_eq!(register.protocol_version, None);
    assert_eq!(register.current_load, None);

    let complete: WorkerToServer = serde_json::from_value(json!({
        "type": "response_complete", "request_id": "r-1", "status_code": 204
    }))
    .expect("response_complete with only the required fields");
    let WorkerToServer::ResponseComplete(complete) = complete else {
        panic!("not a response_complete")
    };
    assert!(complete.headers.is_empty());
    assert_eq!(complete.body, None);
    assert_eq!(complete.token_counts, None);

    let request: ServerToWorker = serde_json::from_value(json!({
        "type": "request", "request_id": "r-1", "model": "m",
        "endpoint_path": "/v1/messages", "is_streaming": true, "body": "{}"
    }))
    .expect("request without headers");
    let ServerToWorker::Request(request) = request else {
        panic!("not a request")
    };
    assert!(request.headers.is_empty());

    let ping: ServerToWorker =
        serde_json::from_value(json!({"type": "ping"})).expect("ping without timestamp");
    assert_eq!(ping, ServerToWorker::Ping(PingMessage::default()));
}

#[test]
fn unknown_fields_from_newer_peers_are_ignored() {
    for name in fixture_names() {
        let original = fixture(&name);
        let mut extended = original.clone();
        let object = extended.as_object_mut().unwrap();
        object.insert(
            "x_added_in_a_later_version".to_string(),
            json!({"nested": [1, 2, 3], "flag": true}),
        );
        object.insert("priority".to_string(), json!(7));
        if let Some(counts) = object.get_mut("token_counts") {
            counts
                .as_object_mut()
                .unwrap()
                .insert("cached_tokens".to_string(), json!(12));
        }
        let parsed = parse(&name, &extended);
        assert_eq!(
            parsed.to_value(),
            original,
            "fixture {name} with extra fields must parse as if they were absent"
        );
    }
}
