//! The `adapter` scenario: an Anthropic Messages client and an OpenAI Responses client, each
//! against a chat-only backend (the worker's adapter translates the request and the answer) and
//! against a backend that serves the route itself (the worker passes it through), both through
//! the relay in the same run. The "direct" column is pass-through, the "relay" column translated.

use std::time::Duration;

use serde_json::{json, Value};

use crate::cpu;
use crate::load;
use crate::procs::{start_backend, start_backend_with, start_proxy, start_worker_for};
use crate::report::Row;

/// Delta events per streamed answer, as in `stream64`.
const DELTAS: u64 = 200;
const CLIENTS: usize = 64;

/// A client dialect: its route and its request bodies.
struct Dialect {
    name: &'static str,
    path: &'static str,
    request: fn(model: &str, stream: bool) -> Value,
}

const DIALECTS: [Dialect; 3] = [
    Dialect {
        name: "adapter messages",
        path: "/v1/messages",
        request: |model, stream| {
            json!({"model": model, "max_tokens": DELTAS, "stream": stream,
                   "messages": [{"role": "user", "content": "hi"}]})
        },
    },
    Dialect {
        name: "adapter messages, Claude Code's size",
        path: "/v1/messages",
        request: claude_code_turn,
    },
    Dialect {
        name: "adapter responses",
        path: "/v1/responses",
        // Not stored: the figure is the translation, not the proxy's conversation store.
        request: |model, stream| {
            json!({"model": model, "max_output_tokens": DELTAS, "stream": stream,
                   "store": false, "input": "hi"})
        },
    },
];

/// A request the size and shape of a Claude Code turn (about 60 KB, as its ~12,000-token
/// prompts are): the billing line and a long system prompt, a score of tools with schemas, and
/// a conversation of tool calls and results. Claude Code's turns reach a llama-server with slot
/// hints translated (`BackendRequest::slot`), so this is what each of them costs the worker.
fn claude_code_turn(model: &str, stream: bool) -> Value {
    let prose =
        |words: usize| -> String { (0..words).map(|i| format!("rule{} ", i % 89)).collect() };
    let tools: Vec<Value> = (0..20)
        .map(|i| {
            json!({"name": format!("Tool{i}"), "description": prose(60),
                   "input_schema": {"type": "object", "properties": {
                       "path": {"type": "string", "description": prose(12)},
                       "limit": {"type": "integer"}}, "required": ["path"]}})
        })
        .collect();
    let mut messages = vec![json!({"role": "user", "content": "Fix the failing test."})];
    for i in 0..6 {
        messages.push(json!({"role": "assistant", "content": [
            {"type": "text", "text": prose(30)},
            {"type": "tool_use", "id": format!("toolu_{i}"), "name": "Tool1",
             "input": {"path": format!("src/file{i}.rs")}}]}));
        messages.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": format!("toolu_{i}"), "content": prose(300)}]}));
    }
    json!({"model": model, "max_tokens": DELTAS, "stream": stream,
           "system": [
               {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.330; cc_entrypoint=cli;"},
               {"type": "text", "text": prose(4000), "cache_control": {"type": "ephemeral"}}],
           "tools": tools, "messages": messages})
}

/// Every adapter row: per dialect, unary p50 and streamed deltas/s, pass-through against
/// translated, and the worker's CPU per delta for each.
pub async fn rows(duration: Duration) -> Vec<Row> {
    let (chat_backend, chat_port) = start_backend();
    let (native_backend, native_port) = start_backend_with(&["--native"]);
    let (proxy, proxy_port) = start_proxy(&[]);
    let translating = start_worker_for("bench", proxy_port, chat_port, 1024);
    let passing = start_worker_for("native", proxy_port, native_port, 1024);
    crate::procs::wait_for_workers(&load::client(1), proxy_port, 2).await;
    let base = format!("http://127.0.0.1:{proxy_port}");
    let mut rows = Vec::new();
    for dialect in &DIALECTS {
        let url = format!("{base}{}", dialect.path);
        let body = |model: &str, stream: bool| (dialect.request)(model, stream).to_string();
        let mut unary_native = load::unary_to(&url, &body("native", false), 1, duration).await;
        let mut unary_translated = load::unary_to(&url, &body("bench", false), 1, duration).await;
        let (n50, t50) = (
            unary_native.quantile_ms(0.5),
            unary_translated.quantile_ms(0.5),
        );
        rows.push(Row {
            scenario: dialect.name,
            figure: "unary p50 (ms; direct: pass-through, relay: translated)",
            direct: Some(n50),
            relay: t50,
            target: "added ≤ 0.3 ms".to_string(),
            met: Some(t50 - n50 <= 0.3 && unary_translated.failed == 0),
        });
        let meter = cpu::Meter::start(&[&passing]);
        let native = load::streams_to(&url, &body("native", true), CLIENTS, duration).await;
        let native_us = meter.per_unit_us(native.ok * DELTAS)[0];
        let meter = cpu::Meter::start(&[&translating]);
        let translated = load::streams_to(&url, &body("bench", true), CLIENTS, duration).await;
        let translated_us = meter.per_unit_us(translated.ok * DELTAS)[0];
        // Deltas, not events: the two sides open and close a stream with different events.
        let rate = |s: &load::Samples| (s.ok * DELTAS) as f64 / s.elapsed.as_secs_f64();
        let (nrate, trate) = (rate(&native), rate(&translated));
        eprintln!(
            "{}: unary failed {} / {}; streams pass-through {} ({} failed), translated {} ({} failed)",
            dialect.name,
            unary_native.failed,
            unary_translated.failed,
            native.ok,
            native.failed,
            translated.ok,
            translated.failed
        );
        rows.push(Row {
            scenario: dialect.name,
            figure: "streamed deltas/s (direct: pass-through, relay: translated)",
            direct: Some(nrate),
            relay: trate,
            target: "≥ 60% of pass-through".to_string(),
            met: Some(trate >= 0.6 * nrate && translated.failed == 0),
        });
        rows.push(Row {
            scenario: dialect.name,
            figure: "worker CPU per delta (µs; direct: pass-through)",
            direct: Some(native_us),
            relay: translated_us,
            target: "–".to_string(),
            met: None,
        });
    }
    drop((chat_backend, native_backend, proxy, translating, passing));
    rows
}
