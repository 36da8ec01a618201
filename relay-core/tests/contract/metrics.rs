//! `GET /metrics` (issue 14 §3): who may scrape it, what it counts, and that label values from
//! clients and workers can neither break the exposition nor grow it without bound. Each
//! exposition is read with a strict parser of the text format (below); the Python SDK tests
//! read it with the Prometheus client library's own parser.

use std::collections::{BTreeMap, BTreeSet};

use relay_core::protocol::{ResponseCompleteMessage, TokenCounts, WorkerToServer};
use relay_core::proxy::access::admin::AdminToken;
use relay_core::proxy::dispatch::telemetry::{MAX_MODEL_LABELS, OTHER};
use relay_core::proxy::serving::upstream::{UpstreamConfig, UpstreamKind};
use relay_core::proxy::ProxyConfig;
use serde_json::{json, Value};

use crate::support::*;

const MODEL: &str = "llama3-8b";
const ADMIN_TOKEN: &str = "admin-s3cret";

/// One sample line: its name, labels and value.
#[derive(Debug, Clone, PartialEq)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses the text exposition format strictly: every line is a `# HELP`, a `# TYPE` or a
/// sample of a family whose TYPE came before; names and label names are valid identifiers;
/// label values are quoted with only `\\`, `\"` and `\n` escapes; no sample repeats a name and
/// label set. Panics naming the line otherwise.
fn parse_exposition(text: &str) -> Vec<Sample> {
    assert!(text.ends_with('\n'), "the exposition ends with a line feed");
    let mut typed: BTreeMap<String, String> = BTreeMap::new();
    let mut samples = Vec::new();
    let mut seen = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, _) = rest.split_once(' ').unwrap_or((rest, ""));
            assert!(valid_name(name), "bad HELP line: {line:?}");
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE has a kind");
            assert!(valid_name(name), "bad TYPE line: {line:?}");
            assert!(
                ["counter", "gauge", "histogram"].contains(&kind),
                "bad type: {line:?}"
            );
            assert!(
                typed.insert(name.to_string(), kind.to_string()).is_none(),
                "family typed twice: {line:?}"
            );
            continue;
        }
        let sample = parse_sample(line);
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| {
                let base = sample.name.strip_suffix(suffix)?;
                (typed.get(base).map(String::as_str) == Some("histogram")).then_some(base)
            })
            .unwrap_or(&sample.name);
        assert!(
            typed.contains_key(family),
            "sample before its TYPE: {line:?}"
        );
        assert!(
            seen.insert((sample.name.clone(), sample.labels.clone())),
            "repeated sample: {line:?}"
        );
        samples.push(sample);
    }
    samples
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn parse_sample(line: &str) -> Sample {
    let bad = || -> ! { panic!("malformed sample line: {line:?}") };
    let name_end = line.find(['{', ' ']).unwrap_or_else(|| bad());
    let name = &line[..name_end];
    if !valid_name(name) {
        bad();
    }
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(mut inner) = rest.strip_prefix('{') {
        loop {
            if let Some(after) = inner.strip_prefix('}') {
                rest = after;
                break;
            }
            let (label, after) = inner.split_once("=\"").unwrap_or_else(|| bad());
            if !valid_name(label) {
                bad();
            }
            let mut value = String::new();
            let mut chars = after.char_indices();
            let end = loop {
                match chars.next() {
                    Some((i, '"')) => break i,
                    Some((_, '\\')) => match chars.next() {
                        Some((_, '\\')) => value.push('\\'),
                        Some((_, '"')) => value.push('"'),
                        Some((_, 'n')) => value.push('\n'),
                        _ => bad(),
                    },
                    Some((_, '\n')) => bad(),
                    Some((_, c)) => value.push(c),
                    None => bad(),
                }
            };
            assert!(
                labels.insert(label.to_string(), value).is_none(),
                "label repeated: {line:?}"
            );
            inner = &after[end + 1..];
            inner = inner.strip_prefix(',').unwrap_or(inner);
        }
    }
    let value = rest.strip_prefix(' ').unwrap_or_else(|| bad());
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        number => number.parse().unwrap_or_else(|_| bad()),
    };
    Sample {
        name: name.to_string(),
        labels,
        value,
    }
}

/// The value of the sample `name` with exactly `labels`, if there is one.
fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let wanted: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    samples
        .iter()
        .find(|s| s.name == name && s.labels == wanted)
        .map(|s| s.value)
}

/// GETs `/metrics`, with the bearer `token` if given: status, content type, body.
async fn scrape(base: &str, token: Option<&str>) -> (u16, String, String) {
    let mut request = http().get(format!("{base}/metrics"));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = tokio::time::timeout(WAIT, request.send())
        .await
        .expect("scrape in time")
        .expect("scrape sent");
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    (status, content_type, response.text().await.expect("body"))
}

/// Scrapes an open `/metrics` and parses it.
async fn samples(base: &str) -> Vec<Sample> {
    let (status, _, text) = scrape(base, None).await;
    assert_eq!(status, 200, "{text}");
    parse_exposition(&text)
}

fn config_with_token() -> ProxyConfig {
    let mut config = test_config();
    config.admin_token = Some(AdminToken(ADMIN_TOKEN.to_string()));
    config
}

#[tokio::test]
async fn with_a_configured_token_metrics_need_it_and_refusals_are_counted() {
    let proxy = start_proxy(config_with_token()).await;
    let base = proxy.url();
    let (status, _, text) = scrape(&base, None).await;
    assert_eq!(status, 401, "{text}");
    let error: Value = serde_json::from_str(&text).expect("a JSON error");
    assert_eq!(error["error"]["code"], "admin_token_required");
    let message = error["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("Authorization: Bearer") && message.contains("--metrics-public"),
        "says how to get in: {message}"
    );
    let (status, _, text) = scrape(&base, Some("wrong")).await;
    assert_eq!(status, 401, "{text}");
    assert!(text.contains("wrong admin token"), "{text}");
    let (status, content_type, text) = scrape(&base, Some(ADMIN_TOKEN)).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    let samples = parse_exposition(&text);
    assert_eq!(
        value(
            &samples,
            "modelrelay_auth_failures_total",
            &[("kind", "admin")]
        ),
        Some(2.0),
        "the missing and the wrong token"
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn metrics_public_opens_metrics_but_not_the_control_api() {
    let mut config = config_with_token();
    config.metrics_public = true;
    let proxy = start_proxy(config).await;
    let (status, _, text) = scrape(&proxy.url(), None).await;
    assert_eq!(status, 200, "{text}");
    parse_exposition(&text);
    let (status, _) = get_json(&proxy.url(), "/api/status", &[]).await;
    assert_eq!(status, 401, "the control API keeps its token");
    proxy.shutdown().await;
}

#[tokio::test]
async fn on_loopback_without_a_configured_token_metrics_are_open() {
    let proxy = start_proxy(test_config()).await;
    let samples = samples(&proxy.url()).await;
    assert_eq!(
        value(
            &samples,
            "modelrelay_workers_connected",
            &[("provider", "local")]
        ),
        Some(0.0)
    );
    assert_eq!(
        value(&samples, "modelrelay_requests_in_flight", &[]),
        Some(0.0)
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn requests_tokens_latency_workers_and_auth_failures_are_counted_with_their_labels() {
    let proxy = start_proxy(test_config()).await;
    let base = proxy.url();
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "gpu-1", &[MODEL], 4).await;

    let whole = spawn_post(
        &base,
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": []}),
    );
    let request = worker.next_request().await;
    worker
        .send(&WorkerToServer::ResponseComplete(ResponseCompleteMessage {
            request_id: request.request_id.clone(),
            status_code: 200,
            headers: [("content-type".to_string(), "application/json".to_string())].into(),
            body: Some("{}".to_string()),
            token_counts: Some(TokenCounts {
                prompt_tokens: Some(11),
                completion_tokens: Some(5),
                total_tokens: Some(16),
            }),
            timings: None,
        }))
        .await;
    assert_eq!(answer_of(whole).await.0, 200);

    let stream = spawn_post(
        &base,
        "/v1/chat/completions",
        json!({"model": MODEL, "stream": true, "messages": []}),
    );
    let request = worker.next_request().await;
    worker
        .chunk(
            &request.request_id,
            "data: {\"n\":1}\n\ndata: {\"n\":2}\n\n",
        )
        .await;
    worker.finish_stream(&request.request_id).await;
    assert_eq!(answer_of(stream).await.0, 200);

    let failing = spawn_post(
        &base,
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": []}),
    );
    let request = worker.next_request().await;
    worker
        .complete_with(
            &request.request_id,
            503,
            &[("content-type", "application/json")],
            "{}",
        )
        .await;
    assert_eq!(answer_of(failing).await.0, 503);

    assert_eq!(
        try_connect(proxy.addr, "local", Some("not-the-secret"), None)
            .await
            .err(),
        Some(axum::http::StatusCode::UNAUTHORIZED)
    );

    let samples = samples(&base).await;
    let labels =
        |status: &'static str| [("model", MODEL), ("key", "anonymous"), ("status", status)];
    assert_eq!(
        value(&samples, "modelrelay_requests_total", &labels("200")),
        Some(2.0)
    );
    assert_eq!(
        value(&samples, "modelrelay_requests_total", &labels("503")),
        Some(1.0)
    );
    let per_key = [("model", MODEL), ("key", "anonymous")];
    assert_eq!(
        value(&samples, "modelrelay_input_tokens_total", &per_key),
        Some(11.0)
    );
    assert_eq!(
        value(&samples, "modelrelay_output_tokens_total", &per_key),
        Some(7.0),
        "5 reported, 2 streamed events"
    );
    let model = [("model", MODEL)];
    assert_eq!(
        value(
            &samples,
            "modelrelay_time_to_first_token_seconds_count",
            &model
        ),
        Some(1.0),
        "the stream's"
    );
    assert_eq!(
        value(
            &samples,
            "modelrelay_request_duration_seconds_count",
            &model
        ),
        Some(3.0)
    );
    assert_eq!(
        value(
            &samples,
            "modelrelay_request_duration_seconds_bucket",
            &[("model", MODEL), ("le", "+Inf")]
        ),
        Some(3.0)
    );
    let worker_labels = [("provider", "local"), ("worker", "gpu-1")];
    assert_eq!(
        value(&samples, "modelrelay_worker_capacity", &worker_labels),
        Some(4.0)
    );
    assert_eq!(
        value(&samples, "modelrelay_worker_load", &worker_labels),
        Some(0.0)
    );
    assert_eq!(
        value(
            &samples,
            "modelrelay_workers_connected",
            &[("provider", "local")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(&samples, "modelrelay_worker_registrations_total", &[]),
        Some(1.0)
    );
    assert_eq!(
        value(
            &samples,
            "modelrelay_auth_failures_total",
            &[("kind", "worker")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(&samples, "modelrelay_queue_depth", &[("provider", "local")]),
        Some(0.0)
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn hostile_model_and_worker_names_are_escaped_and_made_up_models_fold_into_other() {
    let proxy = start_proxy(test_config()).await;
    let base = proxy.url();
    // A worker may serve names with quotes and backslashes (never control characters).
    let weird = r#"we"ird\model} 1"#;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, r#"evil"\worker"#, &[weird], 2).await;
    let task = spawn_post(
        &base,
        "/v1/chat/completions",
        json!({"model": weird, "messages": []}),
    );
    let request = worker.next_request().await;
    worker.complete(&request.request_id, "{}").await;
    assert_eq!(answer_of(task).await.0, 200);
    // Clients may send anything; names no worker could serve (control characters) are refused
    // at once and get no label. (A name that is merely unserved waits in the queue for a worker
    // that may bring it: see waiting_for_a_worker.rs.)
    for made_up in [
        "line\nbreak",
        "x\"} 1\nmodelrelay_fake_total 9\n#",
        "tab\tand\\backslash",
        "\u{0}nul",
    ] {
        let (status, _, text) = post(
            &base,
            "/v1/chat/completions",
            &json!({"model": made_up, "messages": []}),
        )
        .await;
        assert_eq!(status, 404, "{text}");
    }

    let (_, _, text) = scrape(&base, None).await;
    assert!(
        !text.contains("modelrelay_fake_total"),
        "nothing a client sends becomes a line:\n{text}"
    );
    let samples = parse_exposition(&text);
    assert_eq!(
        value(
            &samples,
            "modelrelay_requests_total",
            &[("model", weird), ("key", "anonymous"), ("status", "200")]
        ),
        Some(1.0),
        "the served name comes back exactly, through its escapes"
    );
    assert_eq!(
        value(
            &samples,
            "modelrelay_requests_total",
            &[("model", OTHER), ("key", "anonymous"), ("status", "404")]
        ),
        Some(4.0)
    );
    assert_eq!(
        value(
            &samples,
            "modelrelay_worker_capacity",
            &[("provider", "local"), ("worker", r#"evil"\worker"#)]
        ),
        Some(2.0)
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn model_labels_stay_bounded_however_many_names_an_upstream_accepts() {
    let cloud = ChatOnlyBackend::start(&[]).await;
    let mut config = test_config();
    // An upstream taking any name: every model a client makes up is served.
    config.upstreams = vec![UpstreamConfig {
        name: "cloud".to_string(),
        kind: UpstreamKind::OpenAi,
        base_url: cloud.url(),
        api_key: None,
        models: vec!["*".to_string()],
    }];
    let proxy = start_proxy(config).await;
    let base = proxy.url();
    let beyond = 15;
    for n in 0..MAX_MODEL_LABELS + beyond {
        let (status, _, text) = post(
            &base,
            "/v1/chat/completions",
            &json!({"model": format!("made-up-{n}"), "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
        assert_eq!(status, 200, "{text}");
    }
    let samples = samples(&base).await;
    let models: BTreeSet<&str> = samples
        .iter()
        .filter(|s| s.name == "modelrelay_requests_total")
        .map(|s| s.labels["model"].as_str())
        .collect();
    assert_eq!(
        models.len(),
        MAX_MODEL_LABELS + 1,
        "the first {MAX_MODEL_LABELS} names and `other`"
    );
    assert!(models.contains("made-up-0"));
    assert_eq!(
        value(
            &samples,
            "modelrelay_requests_total",
            &[("model", OTHER), ("key", "anonymous"), ("status", "200")]
        ),
        Some(beyond as f64)
    );
    let histograms: BTreeSet<&str> = samples
        .iter()
        .filter(|s| s.name == "modelrelay_request_duration_seconds_count")
        .map(|s| s.labels["model"].as_str())
        .collect();
    assert_eq!(histograms.len(), MAX_MODEL_LABELS + 1);
    proxy.shutdown().await;
}

/// A streaming request for [`MODEL`] from a raw client, and the worker's view of it.
async fn raw_stream(
    proxy: &relay_core::proxy::RunningProxy,
    worker: &mut ScriptedWorker,
) -> (RawHttpClient, String) {
    let body = json!({"model": MODEL, "stream": true, "messages": []});
    let client = RawHttpClient::post(proxy.addr, "/v1/chat/completions", &body).await;
    (client, worker.next_request().await.request_id)
}

#[tokio::test]
async fn a_client_hanging_up_at_done_is_counted_with_the_backends_usage_and_not_cancelled() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "gpu-1", &[MODEL], 2).await;

    // A client leaving mid-stream is noticed and cancelled at once, as always.
    let (mut client, id) = raw_stream(&proxy, &mut worker).await;
    worker.chunk(&id, "data: {\"n\":1}\n\n").await;
    client.read_until("data: {\"n\":1}").await;
    drop(client);
    let cancel = worker.next_cancel().await;
    assert_eq!(cancel.request_id, id);
    worker.fail(Some(&id), "cancelled").await;

    // One leaving right after `data: [DONE]`, as the OpenAI SDK does, has the whole answer:
    // the worker's report, which follows, ends the request instead of a cancel.
    let (mut client, id) = raw_stream(&proxy, &mut worker).await;
    worker
        .chunk(
            &id,
            "data: {\"n\":1}\n\ndata: {\"n\":2}\n\ndata: [DONE]\n\n",
        )
        .await;
    client.read_until("data: [DONE]").await;
    drop(client);
    worker
        .assert_nothing_for(
            std::time::Duration::from_millis(300),
            "no cancel for an answer the client has whole",
        )
        .await;
    worker
        .send(&WorkerToServer::ResponseComplete(ResponseCompleteMessage {
            request_id: id,
            status_code: 200,
            headers: [("content-type".to_string(), "text/event-stream".to_string())].into(),
            body: None,
            token_counts: Some(TokenCounts {
                prompt_tokens: Some(9),
                completion_tokens: Some(4),
                total_tokens: Some(13),
            }),
            timings: None,
        }))
        .await;
    wait_until("both requests ended", || proxy.hub.tracked_requests() == 0).await;
    wait_until("both requests counted", || {
        proxy.hub.telemetry().in_flight() == 0
    })
    .await;

    let samples = samples(&proxy.url()).await;
    let per_key = [("model", MODEL), ("key", "anonymous")];
    assert_eq!(
        value(&samples, "modelrelay_input_tokens_total", &per_key),
        Some(9.0),
        "the backend's report, received after the client left"
    );
    assert_eq!(
        value(&samples, "modelrelay_output_tokens_total", &per_key),
        Some(4.0 + 1.0),
        "4 reported for the whole stream, 1 streamed event for the one cut short"
    );
    assert_eq!(
        value(
            &samples,
            "modelrelay_requests_total",
            &[("model", MODEL), ("key", "anonymous"), ("status", "200")]
        ),
        Some(2.0),
        "both streams went out with a 200"
    );
    assert_eq!(
        value(
            &samples,
            "modelrelay_cancels_total",
            &[("reason", "client_disconnect")]
        ),
        Some(1.0),
        "only the stream cut short"
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_worker_that_never_reports_after_done_gets_its_cancel_after_the_wait() {
    let proxy = start_proxy(test_config()).await;
    let (mut worker, _) = ScriptedWorker::join(proxy.addr, "gpu-1", &[MODEL], 1).await;
    let (mut client, id) = raw_stream(&proxy, &mut worker).await;
    worker
        .chunk(&id, "data: {\"n\":1}\n\ndata: [DONE]\n\n")
        .await;
    client.read_until("data: [DONE]").await;
    let left = std::time::Instant::now();
    drop(client);
    let cancel = worker.next_cancel().await;
    assert_eq!(cancel.request_id, id);
    assert!(
        left.elapsed() >= std::time::Duration::from_millis(1500),
        "the cancel waits for the report a while ({:?})",
        left.elapsed()
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn names_nobody_serves_count_as_other_in_metrics_and_usage() {
    // A client inventing names (nobody serves them; they wait in the queue, then time out)
    // makes no label and no usage row of its own per name.
    let proxy = start_proxy(config_with_queue_timeout(std::time::Duration::from_millis(
        200,
    )))
    .await;
    let base = proxy.url();
    for n in 0..3 {
        let (status, _, text) = post(
            &base,
            "/v1/chat/completions",
            &json!({"model": format!("invented-{n}"), "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
        assert_eq!(status, 504, "{text}");
    }
    let samples = samples(&base).await;
    assert!(
        samples.iter().all(|s| !s
            .labels
            .get("model")
            .is_some_and(|m| m.starts_with("invented"))),
        "an invented name became a label"
    );
    assert_eq!(
        value(
            &samples,
            "modelrelay_requests_total",
            &[("model", OTHER), ("key", "anonymous"), ("status", "504")]
        ),
        Some(3.0)
    );
    // Usage is written in batches: wait for the three rows to land.
    let mut rows = Value::Null;
    for _ in 0..100 {
        let (_, usage) = get_json(&base, "/api/usage?group_by=model", &[]).await;
        if usage["totals"]["requests"] == 3 {
            rows = usage["rows"].clone();
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let groups: Vec<&str> = rows
        .as_array()
        .unwrap_or_else(|| panic!("usage never counted 3: {rows}"))
        .iter()
        .map(|r| r["group"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(groups, ["other"], "{rows}");
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_streamed_chat_that_did_not_ask_for_usage_has_its_tokens_counted_all_the_same() {
    // Open WebUI never sets stream_options.include_usage: its streamed chats must count.
    let proxy = start_proxy(test_config()).await;
    let backend = ChatOnlyBackend::start(&[MODEL]).await;
    let worker = RunningWorker::start(&proxy, &backend.url(), None, 4);
    wait_until("the worker registers", || proxy.hub.models().len() == 1).await;
    let base = proxy.url();
    let ask = |stream: bool| json!({"model": MODEL, "stream": stream, "messages": [{"role": "user", "content": "hi"}]});
    let (status, _, streamed) = post(&base, "/v1/chat/completions", &ask(true)).await;
    assert_eq!(status, 200, "{streamed}");
    assert!(
        !streamed.contains("\"choices\":[]"),
        "the usage the client did not ask for stays out of its stream: {streamed}"
    );
    assert!(streamed.ends_with("data: [DONE]\n\n"), "{streamed}");
    assert_eq!(
        backend.chat_bodies()[0]["stream_options"]["include_usage"],
        true,
        "the worker asked the backend for it"
    );
    let (status, _, _) = post(&base, "/v1/chat/completions", &ask(false)).await;
    assert_eq!(status, 200);
    let (input, output) = CHAT_ONLY_USAGE;
    let samples = samples(&base).await;
    let tokens = |name: &str| {
        samples
            .iter()
            .filter(|s| s.name == name)
            .map(|s| s.value)
            .sum::<f64>()
    };
    assert_eq!(tokens("modelrelay_input_tokens_total"), 2.0 * input as f64);
    assert_eq!(
        tokens("modelrelay_output_tokens_total"),
        2.0 * output as f64
    );
    let mut totals = Value::Null;
    for _ in 0..100 {
        let (_, usage) = get_json(&base, "/api/usage?group_by=model", &[]).await;
        if usage["totals"]["requests"] == 2 {
            totals = usage["totals"].clone();
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(totals["input_tokens"], 2 * input, "{totals}");
    assert_eq!(totals["output_tokens"], 2 * output, "{totals}");
    worker.stop().await;
    proxy.shutdown().await;
}
