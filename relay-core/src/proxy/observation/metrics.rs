//! `GET /metrics`: the proxy's counts in the Prometheus text exposition format (version 0.0.4).
//!
//! Nothing here counts: the numbers come from the telemetry the dashboard already keeps (its
//! ledger of ended requests and its counters), the scheduler (queues, workers, load) and the
//! admin access rule (token refusals), read when a scraper asks. So a request pays nothing for
//! the metrics beyond what the dashboard costs, and a scrape takes each lock once, briefly.
//!
//! Label values come from clients and workers: they are escaped as the format requires, and the
//! ledger bounds how many there are (see `telemetry/ledger.rs`).
//!
//! Access follows the control API: where it needs the admin token (one configured on purpose,
//! or a listener beyond loopback), so does this endpoint, unless `metrics_public` says
//! otherwise; on loopback without a configured token it is open, like the dashboard.

use std::collections::BTreeMap;
use std::fmt::Write;

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Extension;

use crate::dialect::Dialect;
use crate::proxy::dispatch::hub::Hub;
use crate::proxy::dispatch::telemetry::{Histogram, CANCEL_REASONS};
use crate::proxy::AppState;
use crate::store::StorageView;

/// The exposition format's content type.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The route's handler.
pub async fn scrape(
    State(state): State<AppState>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    headers: HeaderMap,
) -> Response {
    if !state.config.metrics_public {
        let peer = peer.map(|info| info.0 .0.ip());
        let presents = headers.contains_key(header::AUTHORIZATION);
        if let Some(refusal) = state.admin.locked_out(peer, presents) {
            return refusal.into_response(Dialect::OpenAi);
        }
        if let Err(refused) = state.admin.check_metrics(&headers) {
            let refused = refused.into_response(Dialect::OpenAi);
            state.admin.count_wrong_credential(peer, &refused);
            return refused;
        }
    }
    let storage = state.usage.health().view();
    let mut response = render(&state.hub, state.admin.failures(), &storage).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    // Live numbers: never from a cache.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// The exposition of `hub`'s state, with `admin_failures` token refusals and the database's
/// `storage` health.
pub fn render(hub: &Hub, admin_failures: u64, storage: &StorageView) -> String {
    let telemetry = hub.telemetry();
    let ledger = telemetry.ledger();
    let counters = telemetry.counters();
    let mut out = Exposition::default();

    out.family(
        "modelrelay_build_info",
        "gauge",
        "The running ModelRelay's version; always 1.",
    );
    out.sample(
        "modelrelay_build_info",
        &[("version", env!("CARGO_PKG_VERSION"))],
        1,
    );
    out.family(
        "modelrelay_uptime_seconds",
        "gauge",
        "Seconds since the proxy started.",
    );
    out.sample_f64("modelrelay_uptime_seconds", &[], hub.uptime().as_secs_f64());

    out.family(
        "modelrelay_requests_total",
        "counter",
        "Inference requests that ended, by model, client key and the HTTP status the client got \
         (a stream that ended in an error event counts under the error's status; 499: the \
         client left first). `other` holds models the proxy does not route, beyond the label \
         cap, or absent.",
    );
    for (model, key, status, count) in ledger.requests() {
        let status = status.to_string();
        out.sample(
            "modelrelay_requests_total",
            &[("model", model), ("key", key), ("status", &status)],
            count,
        );
    }
    let tokens = ledger.tokens();
    out.family(
        "modelrelay_input_tokens_total",
        "counter",
        "Prompt tokens of ended requests, as the backends reported them.",
    );
    for (model, key, counted) in &tokens {
        out.sample(
            "modelrelay_input_tokens_total",
            &[("model", model), ("key", key)],
            counted.input,
        );
    }
    out.family(
        "modelrelay_output_tokens_total",
        "counter",
        "Generated tokens of ended requests: the backend's count, else one per streamed data \
         event.",
    );
    for (model, key, counted) in &tokens {
        out.sample(
            "modelrelay_output_tokens_total",
            &[("model", model), ("key", key)],
            counted.output,
        );
    }
    let latency = ledger.latency();
    out.family(
        "modelrelay_time_to_first_token_seconds",
        "histogram",
        "Time from a streaming request's arrival to the first byte of its answer (queueing and \
         a model's start included).",
    );
    for (model, latency) in &latency {
        out.histogram(
            "modelrelay_time_to_first_token_seconds",
            model,
            &latency.ttft,
        );
    }
    out.family(
        "modelrelay_request_duration_seconds",
        "histogram",
        "Time from a request's arrival to the end of its answer, for requests a worker or an \
         upstream took.",
    );
    for (model, latency) in &latency {
        out.histogram(
            "modelrelay_request_duration_seconds",
            model,
            &latency.duration,
        );
    }

    out.family(
        "modelrelay_requests_in_flight",
        "gauge",
        "Requests accepted and not yet answered, queued ones included.",
    );
    out.sample(
        "modelrelay_requests_in_flight",
        &[],
        telemetry.in_flight() as u64,
    );
    out.family(
        "modelrelay_queue_depth",
        "gauge",
        "Requests waiting for a worker, per provider.",
    );
    let depths = hub.queue_depths();
    for (provider, depth) in &depths {
        out.sample(
            "modelrelay_queue_depth",
            &[("provider", provider)],
            *depth as u64,
        );
    }

    let affinity = hub.affinity_counts();
    out.family(
        "modelrelay_affinity_placements_total",
        "counter",
        "Requests placed with a conversation key: on the worker that served the conversation \
         last (hit), elsewhere because that worker was busy or gone (miss), or with no such \
         worker yet (new).",
    );
    for (outcome, count) in [
        ("hit", affinity.hits),
        ("miss", affinity.misses),
        ("new", affinity.new),
    ] {
        out.sample(
            "modelrelay_affinity_placements_total",
            &[("outcome", outcome)],
            count,
        );
    }
    out.family(
        "modelrelay_affinity_conversations",
        "gauge",
        "Conversations whose worker the proxy remembers.",
    );
    out.sample("modelrelay_affinity_conversations", &[], affinity.entries);

    let workers = hub.workers();
    let mut connected: BTreeMap<&str, usize> = depths
        .iter()
        .map(|(provider, _)| (provider.as_str(), 0))
        .collect();
    // By name, not connection id: a reconnect keeps its series, and two connections with one
    // name (never unique by contract) add up instead of repeating a label set.
    let mut by_name: BTreeMap<(&str, &str), (u64, u64)> = BTreeMap::new();
    for worker in &workers {
        *connected.entry(worker.provider.as_str()).or_default() += 1;
        let entry = by_name
            .entry((worker.provider.as_str(), worker.name.as_str()))
            .or_default();
        entry.0 += u64::from(worker.in_flight) + u64::from(worker.external_load);
        entry.1 += u64::from(worker.max_concurrent);
    }
    out.family(
        "modelrelay_workers_connected",
        "gauge",
        "Workers connected, per provider.",
    );
    for (provider, count) in &connected {
        out.sample(
            "modelrelay_workers_connected",
            &[("provider", provider)],
            *count as u64,
        );
    }
    out.family(
        "modelrelay_worker_load",
        "gauge",
        "Requests a worker is running: the proxy's plus those it reported from elsewhere.",
    );
    for ((provider, name), (load, _)) in &by_name {
        out.sample(
            "modelrelay_worker_load",
            &[("provider", provider), ("worker", name)],
            *load,
        );
    }
    out.family(
        "modelrelay_worker_capacity",
        "gauge",
        "Requests a worker runs at once (its max_concurrent).",
    );
    for ((provider, name), (_, capacity)) in &by_name {
        out.sample(
            "modelrelay_worker_capacity",
            &[("provider", provider), ("worker", name)],
            *capacity,
        );
    }
    worker_hardware(&mut out, hub, &workers);
    out.family(
        "modelrelay_worker_registrations_total",
        "counter",
        "Workers that registered; each reconnect counts, so a fast rise means flapping workers.",
    );
    out.sample(
        "modelrelay_worker_registrations_total",
        &[],
        counters.worker_registrations,
    );

    out.family(
        "modelrelay_requeues_total",
        "counter",
        "Requests put back in the queue because their worker failed or left before answering.",
    );
    out.sample("modelrelay_requeues_total", &[], counters.requeues);
    out.family(
        "modelrelay_cancels_total",
        "counter",
        "Requests cancelled, by reason (client_disconnect, timeout, ...).",
    );
    for (reason, count) in CANCEL_REASONS.iter().zip(counters.cancels) {
        out.sample(
            "modelrelay_cancels_total",
            &[("reason", reason.as_str())],
            count,
        );
    }
    out.family(
        "modelrelay_auth_failures_total",
        "counter",
        "Requests refused for a missing or wrong credential: worker (the worker secret), \
         admin (the admin token, on the control API and /metrics) or client (a client API \
         key, when keys are required).",
    );
    out.sample(
        "modelrelay_auth_failures_total",
        &[("kind", "worker")],
        counters.worker_auth_failures,
    );
    out.sample(
        "modelrelay_auth_failures_total",
        &[("kind", "admin")],
        admin_failures,
    );
    out.sample(
        "modelrelay_auth_failures_total",
        &[("kind", "client")],
        counters.client_auth_failures,
    );
    out.family(
        "modelrelay_placements_total",
        "counter",
        "Requests placed on a worker, by why it was that one: cache_hit (its conversation's \
         home), home_busy (the home had no free slot), new_conversation, least_loaded (no \
         conversation), faster_box (cost routing: measured speeds said it answers sooner), \
         waking (only a sleeping box served the model: the request waited while it woke) or \
         side_request (a side request of a conversation, where no conversation's slot is taken).",
    );
    for (reason, count) in hub.reason_counts() {
        out.sample("modelrelay_placements_total", &[("reason", reason)], count);
    }
    out.family(
        "modelrelay_wake_attempts_total",
        "counter",
        "Sleeping boxes the proxy began waking (Wake-on-LAN), by why: nothing_awake (no awake \
         box serves a requested model), first_token_sooner (a long prompt is answered sooner \
         there once awake), slot_wait (a request would wait longer for an awake slot than the \
         wake) or queue_waited (queued requests had waited, together, as long as the wake).",
    );
    for (cause, count) in hub.wake_counts() {
        out.sample("modelrelay_wake_attempts_total", &[("cause", cause)], count);
    }
    out.family(
        "modelrelay_storage_writable",
        "gauge",
        "1 while the proxy's database takes writes; 0 when its disk is full or its data \
         directory read-only (the relay keeps serving; usage is not stored meanwhile).",
    );
    out.sample(
        "modelrelay_storage_writable",
        &[],
        u64::from(storage.writable),
    );
    out.family(
        "modelrelay_usage_records_not_stored_total",
        "counter",
        "Finished requests whose usage record the database refused (full disk, read-only \
         data directory).",
    );
    out.sample(
        "modelrelay_usage_records_not_stored_total",
        &[],
        storage.usage_records_not_stored,
    );
    out.text
}

/// The exposition being written.
#[derive(Default)]
struct Exposition {
    text: String,
}

impl Exposition {
    /// `# HELP` and `# TYPE` of a family.
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: u64) {
        self.line(name, labels, value);
    }

    fn sample_f64(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.line(name, labels, value);
    }

    fn line(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (label, value)) in labels.iter().enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                self.text.push_str(label);
                self.text.push_str("=\"");
                escape_label_value(&mut self.text, value);
                self.text.push('"');
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {value}");
    }

    /// A histogram's `_bucket` lines (cumulative, `+Inf` last), `_sum` and `_count`.
    fn histogram(&mut self, name: &str, model: &str, histogram: &Histogram) {
        let bucket = format!("{name}_bucket");
        for (bound, count) in histogram.cumulative() {
            // Shortest form of the bound ("0.025", "1"), as the Go client writes it.
            let le = bound.to_string();
            self.sample(&bucket, &[("model", model), ("le", &le)], count);
        }
        self.sample(
            &bucket,
            &[("model", model), ("le", "+Inf")],
            histogram.count(),
        );
        self.sample_f64(
            &format!("{name}_sum"),
            &[("model", model)],
            histogram.sum_secs(),
        );
        self.sample(
            &format!("{name}_count"),
            &[("model", model)],
            histogram.count(),
        );
    }
}

/// What workers' pongs said of their boxes: CPU, memory, and each GPU's VRAM, utilisation and
/// temperature, as gauges labelled like the load (a name twice: the first connection's). Only
/// what a report holds is written; a published worker's box writes nothing.
fn worker_hardware(
    out: &mut Exposition,
    hub: &Hub,
    workers: &[crate::proxy::dispatch::scheduler::WorkerSnapshot],
) {
    let telemetry = hub.telemetry();
    let mut reports: BTreeMap<(&str, &str), crate::protocol::HardwareReport> = BTreeMap::new();
    for worker in workers {
        let key = (worker.provider.as_str(), worker.name.as_str());
        if reports.contains_key(&key) {
            continue;
        }
        if let Some(report) = telemetry
            .worker(&worker.id)
            .and_then(|r| r.reported.hardware)
        {
            reports.insert(key, report);
        }
    }
    const MIB: u64 = 1024 * 1024;
    type Field = fn(&crate::protocol::HardwareReport) -> Option<u64>;
    let box_gauges: [(&str, &str, Field); 3] = [
        (
            "modelrelay_worker_cpu_percent",
            "CPU use of the worker's box, percent of all cores.",
            |r| r.cpu_percent.map(u64::from),
        ),
        (
            "modelrelay_worker_memory_used_bytes",
            "Memory in use on the worker's box.",
            |r| r.memory_used_mb.map(|m| m * MIB),
        ),
        (
            "modelrelay_worker_memory_total_bytes",
            "Memory installed on the worker's box.",
            |r| r.memory_total_mb.map(|m| m * MIB),
        ),
    ];
    for (name, help, field) in box_gauges {
        out.family(name, "gauge", help);
        for ((provider, worker), report) in &reports {
            if let Some(value) = field(report) {
                out.sample(name, &[("provider", provider), ("worker", worker)], value);
            }
        }
    }
    type GpuField = fn(&crate::protocol::GpuReport) -> Option<i64>;
    let gpu_gauges: [(&str, &str, GpuField); 4] = [
        (
            "modelrelay_worker_gpu_vram_used_bytes",
            "VRAM in use on one GPU of the worker's box.",
            |g| g.vram_used_mb.map(|m| (m * MIB) as i64),
        ),
        (
            "modelrelay_worker_gpu_vram_total_bytes",
            "VRAM installed on one GPU of the worker's box.",
            |g| g.vram_total_mb.map(|m| (m * MIB) as i64),
        ),
        (
            "modelrelay_worker_gpu_utilization_percent",
            "Utilisation of one GPU of the worker's box.",
            |g| g.utilization_percent.map(i64::from),
        ),
        (
            "modelrelay_worker_gpu_temperature_celsius",
            "Temperature of one GPU of the worker's box.",
            |g| g.temperature_c.map(i64::from),
        ),
    ];
    for (name, help, field) in gpu_gauges {
        out.family(name, "gauge", help);
        for ((provider, worker), report) in &reports {
            for (index, gpu) in report.gpus.iter().enumerate() {
                if let Some(value) = field(gpu) {
                    let index = index.to_string();
                    let labels = [
                        ("provider", *provider),
                        ("worker", *worker),
                        ("gpu", index.as_str()),
                        ("gpu_name", gpu.name.as_str()),
                    ];
                    out.line(name, &labels, value);
                }
            }
        }
    }
}

/// Appends `value` as a label value: backslash, double quote and line feed escaped as the
/// format says; any other control character (which the format would carry raw, and which some
/// line-based readers mishandle) becomes `?`, as in the relay's worker names.
fn escape_label_value(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c if c.is_control() => out.push('?'),
            c => out.push(c),
        }
    }
}

/// A HELP text: backslash and line feed escaped.
fn escape_help(help: &str) -> String {
    help.replace('\\', "\\\\").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn escaped(value: &str) -> String {
        let mut out = String::new();
        escape_label_value(&mut out, value);
        out
    }

    #[test]
    fn label_values_escape_backslashes_quotes_and_line_feeds() {
        assert_eq!(escaped(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(escaped("line\nbreak"), "line\\nbreak");
        assert_eq!(escaped("tab\tcr\r"), "tab?cr?");
        assert_eq!(escaped("llama3.2:3b/ünï"), "llama3.2:3b/ünï");
    }

    #[test]
    fn samples_have_their_labels_in_order_and_integer_values() {
        let mut out = Exposition::default();
        out.family("x_total", "counter", "What x\ncounts \\ here.");
        out.sample("x_total", &[("model", "m\"1"), ("status", "200")], 3);
        out.sample("y", &[], 2);
        assert_eq!(
            out.text,
            "# HELP x_total What x\\ncounts \\\\ here.\n# TYPE x_total counter\n\
             x_total{model=\"m\\\"1\",status=\"200\"} 3\ny 2\n"
        );
    }
}
