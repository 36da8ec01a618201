//! The worker wire protocol: JSON messages over one WebSocket per worker, tagged by `"type"`.
//!
//! Field names follow the ModelRelay protocol of the seeds exactly, so a worker or proxy written
//! only from that description interoperates with ours. Extensions are optional fields that older
//! peers ignore; we never send a message type an older peer does not know, because the published
//! worker rejects the whole connection on an unknown `type`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Header names and values carried in `request` and `response_complete` (lower-case names).
pub type WireHeaders = BTreeMap<String, String>;

/// The protocol version our worker announces by default: the one the published ModelRelay
/// worker sends, so our worker can join a published proxy as well as ours.
pub const BRIDGE_PROTOCOL_VERSION: &str = "2026-04-bridge-v1";

/// The protocol version string of the seeds' wire traces.
pub const SEED_PROTOCOL_VERSION: &str = "1";

/// Versions the proxy accepts in `register.protocol_version`; an absent version (a legacy worker)
/// is accepted too.
pub const ACCEPTED_PROTOCOL_VERSIONS: &[&str] = &[SEED_PROTOCOL_VERSION, BRIDGE_PROTOCOL_VERSION];

/// The `error.code` with which our worker confirms a `cancel`, so the proxy frees the slot at
/// once. (A published worker sends nothing; the proxy's grace timer covers that.)
pub const CANCELLED_CODE: &str = "cancelled";

/// The largest WebSocket message either side accepts (the published worker's limit too). Both
/// sides derive their limits from it: the proxy refuses a request whose frame would not fit,
/// and the worker answers an error instead of a `response_complete` that would not.
pub const MAX_FRAME_BYTES: usize = 64 * 1024 * 1024;

/// Room in a frame for everything but the body: ids, model, path, headers, field names.
pub const FRAME_OVERHEAD_BYTES: usize = 64 * 1024;

/// The length of `text` written as a JSON string (quotes and escapes included), as it travels
/// inside a frame: a body of quotes or backslashes doubles, one of control characters grows
/// six-fold.
pub fn json_string_len(text: &str) -> usize {
    2 + text
        .bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0x00..=0x1f => 6,
            _ => 1,
        })
        .sum::<usize>()
}

/// Client headers that carry users' credentials. Not forwarded to workers, nor by workers to
/// their backends, unless the provider or worker opts in (`forward_client_auth`): anyone with the
/// shared worker secret could otherwise collect users' keys.
pub const CLIENT_AUTH_HEADERS: &[&str] = &["authorization", "x-api-key"];

/// Client headers carried to the worker besides [`CLIENT_AUTH_HEADERS`]: content type, the
/// OpenAI and Anthropic version and feature headers, and the session ids a worker's model
/// lifecycle and slot hints key on. Transport headers (user-agent, accept-encoding, ...) stay
/// behind, as the contract says; a worker passes on no other header whatever a proxy sends.
pub const FORWARDED_HEADERS: &[&str] = &[
    "content-type",
    "openai-organization",
    "openai-project",
    "openai-beta",
    "anthropic-version",
    "anthropic-beta",
    "session-id",
    "session_id",
    "x-session-affinity",
    "x-client-request-id",
    "x-claude-code-session-id",
];

/// Whether a worker announcing `version` may register.
pub fn is_accepted_protocol_version(version: Option<&str>) -> bool {
    version.is_none_or(|v| ACCEPTED_PROTOCOL_VERSIONS.contains(&v))
}

/// Messages the proxy sends to a worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServerToWorker {
    /// Registration accepted: the worker's id and the models it may be routed.
    RegisterAck(RegisterAck),
    /// One inference request to forward to the backend.
    Request(RequestMessage),
    /// Stop working on a request.
    Cancel(CancelMessage),
    /// Heartbeat probe; answered with `pong`.
    Ping(PingMessage),
    /// Stop taking work, finish what is in flight, then disconnect.
    GracefulShutdown(GracefulShutdownMessage),
    /// Re-read the backend's model list and answer with `models_update`.
    ModelsRefresh(ModelsRefreshMessage),
}

/// Messages a worker sends to the proxy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WorkerToServer {
    /// First message on a connection: who the worker is and what it serves.
    Register(RegisterMessage),
    /// The worker's model list or load changed.
    ModelsUpdate(ModelsUpdateMessage),
    /// Part of a streaming response, already SSE-framed.
    ResponseChunk(ResponseChunkMessage),
    /// The end of a request: final status, headers, body and token counts.
    ResponseComplete(ResponseCompleteMessage),
    /// Heartbeat answer carrying the worker's live load.
    Pong(PongMessage),
    /// A failure, scoped to one request when `request_id` is set.
    Error(ErrorMessage),
}

/// `register`: sent once by the worker right after the WebSocket opens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterMessage {
    /// Human-readable worker name (often the host name).
    pub worker_name: String,
    /// Exact model names the worker serves.
    pub models: Vec<String>,
    /// How many requests the worker runs at once.
    pub max_concurrent: u32,
    /// Protocol version; absent for legacy workers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol_version: Option<String>,
    /// Requests already running when the worker (re)connects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_load: Option<u32>,
    /// Extension: the MAC address of the worker's network card (`aa:bb:cc:dd:ee:ff`), so the
    /// proxy can wake the box with a Wake-on-LAN packet after it went to sleep. Absent means
    /// unknown; a malformed one is ignored with a registration warning (a value that is not
    /// even a string reads as an empty one, so it gets that warning too instead of costing the
    /// worker its registration).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_string"
    )]
    pub mac_address: Option<String>,
    /// Extension: the box suspends itself when idle, so its connection ending (other than by the
    /// proxy, or after the empty `models_update` of a shutdown) means it went to sleep: the proxy
    /// keeps its models listed as asleep. Absent (or not a boolean) means false.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_bool"
    )]
    pub sleeps_when_idle: Option<bool>,
    /// Extension: the tokens one request may hold on this worker, per model (its backend's
    /// context window for one request), where the worker knows it. Absent means unknown; a
    /// value that is not such a map reads as absent.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_windows"
    )]
    pub context_windows: Option<ContextWindows>,
    /// Extension: what the worker's backends took, alone, to evaluate a prompt and generate a
    /// few tokens when the worker started ([`WarmUp`]), per model; our proxy routes by it until
    /// traffic has measured the box. Absent means none; a value that is not such a list reads
    /// as absent, and an entry that is not a warm-up is skipped.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_warm_ups"
    )]
    pub warm_ups: Option<Vec<WarmUp>>,
    /// Extension: the models whose backend evaluates this worker's side requests (titles,
    /// summaries) before the conversations' turns waiting there: it gives them the lowest free
    /// slot of a llama-server that keeps pinned slots, and llama-server fills each batch in
    /// slot order. Our proxy then counts about one batch of others' prompt ahead of a side
    /// request there, not every prompt waiting. Absent means none; a value that is not a list
    /// of names reads as absent, and an entry that is not a name is skipped.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_names"
    )]
    pub sides_first: Option<Vec<String>>,
}

/// Context windows by model name (tokens), as a worker reports them.
pub type ContextWindows = std::collections::BTreeMap<String, u32>;

/// One model's warm-up: the timings of a prompt of about a thousand tokens and a few generated
/// tokens, evaluated by the backend alone when the worker started (llama-server's own
/// `timings`), so that a proxy that has never seen the box answer knows its speed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarmUp {
    /// The model it was measured on.
    pub model: String,
    /// What the backend reported.
    pub timings: Timings,
}

/// `register_ack`: the proxy's answer to `register`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterAck {
    /// Id the proxy assigned to this connection.
    pub worker_id: String,
    /// The sanitized model list the proxy will route to this worker.
    pub models: Vec<String>,
    /// What sanitization changed (dropped, duplicated or truncated models).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// The protocol version the proxy speaks on this connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol_version: Option<String>,
}

/// `request`: one client request for the worker to forward to its backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestMessage {
    /// Correlates chunks, completion and cancellation.
    pub request_id: String,
    /// The model the client asked for.
    pub model: String,
    /// Path to call on the backend, e.g. `/v1/chat/completions` (query string included).
    pub endpoint_path: String,
    /// Whether the client asked for an SSE stream.
    pub is_streaming: bool,
    /// The client's JSON body, untouched.
    pub body: String,
    /// Compatibility-critical client headers (auth, content type, Anthropic/OpenAI versions).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: WireHeaders,
    /// Extension: the conversation this request continues (the proxy's affinity key, 16 hex
    /// digits), so a worker in front of llama-server can keep each conversation in one slot
    /// (`id_slot`) instead of letting another conversation's turn overwrite its cached prompt.
    /// Absent means unknown; a worker that ignores it (the published one) loses nothing.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_string"
    )]
    pub conversation: Option<String>,
    /// Extension: a side request of that conversation (Claude Code's titles and summaries),
    /// which a worker keeps out of the slots its conversations are kept in. Absent, or anything
    /// but `true`, is an ordinary request.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_bool"
    )]
    pub side_request: Option<bool>,
}

impl RequestMessage {
    /// The wire form of an affinity key.
    pub fn conversation_of(key: u64) -> String {
        format!("{key:016x}")
    }

    /// The affinity key in [`RequestMessage::conversation`], when it is one: exactly 16 hex
    /// digits. Anything else (a published proxy's future use of the name, a hostile proxy's
    /// garbage) is no key, and the request is served without a slot hint.
    pub fn conversation_key(&self) -> Option<u64> {
        let text = self.conversation.as_deref()?;
        if text.len() != 16 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u64::from_str_radix(text, 16).ok()
    }
}

/// `cancel`: stop working on a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelMessage {
    /// The request to stop.
    pub request_id: String,
    /// Why it was cancelled.
    pub reason: CancelReason,
}

/// Why a request was cancelled (the seeds' `CancelReason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CancelReason {
    /// The HTTP client went away.
    ClientDisconnect,
    /// The request outlived `REQUEST_TIMEOUT_SECS`.
    Timeout,
    /// The proxy is draining.
    GracefulShutdown,
    /// The worker's connection closed.
    WorkerDisconnect,
    /// The request was requeued too often.
    RequeueExhausted,
    /// The proxy is terminating.
    ServerShutdown,
}

impl CancelReason {
    /// The wire name, for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            CancelReason::ClientDisconnect => "client_disconnect",
            CancelReason::Timeout => "timeout",
            CancelReason::GracefulShutdown => "graceful_shutdown",
            CancelReason::WorkerDisconnect => "worker_disconnect",
            CancelReason::RequeueExhausted => "requeue_exhausted",
            CancelReason::ServerShutdown => "server_shutdown",
        }
    }
}

/// `ping`: heartbeat probe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct PingMessage {
    /// Sender's clock, echoed in `pong` so round trips can be measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp_unix_ms: Option<u64>,
    /// Extension: the requests whose streams the worker should hold back for now, because their
    /// clients read slower than the backend writes (the whole set, replacing the previous one;
    /// absent means unchanged). Our proxy sends it whenever the set changes; a worker that
    /// ignores it (the published one) is still bounded by the proxy ending a stream whose client
    /// falls too far behind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_requests: Option<Vec<String>>,
    /// Extension: network cards (MAC addresses) of sleeping boxes on this worker's LAN that a
    /// request is waiting for: the worker sends each a Wake-on-LAN packet, because a proxy on
    /// another network (a VPS) cannot broadcast onto the boxes' LAN. A worker that ignores it
    /// (the published one) leaves the waking to the proxy's own packet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wake_macs: Option<Vec<String>>,
}

/// `pong`: heartbeat answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PongMessage {
    /// Requests the worker is running right now.
    pub current_load: u32,
    /// The `ping`'s timestamp, echoed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp_unix_ms: Option<u64>,
    /// Extension: the worker's box as it was last sampled (CPU, memory, GPUs); absent means
    /// unknown. The published proxy ignores it (serde skips unknown fields). Read leniently: a
    /// malformed value is dropped, never the pong, so a bad report cannot stop the heartbeat;
    /// lists and names are cut to [`MAX_REPORTED_GPUS`] and [`MAX_REPORT_NAME_BYTES`].
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub hardware: Option<HardwareReport>,
    /// Extension: the state of each model of the worker's model map; absent means unknown (a
    /// worker without a model map sends none). Read like `hardware`, cut to
    /// [`MAX_REPORTED_MODELS`].
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub model_states: Option<Vec<ModelStateReport>>,
}

/// GPUs a report keeps; a box with more reports the first ones.
pub const MAX_REPORTED_GPUS: usize = 16;
/// Model states a report keeps.
pub const MAX_REPORTED_MODELS: usize = 64;
/// The longest model load a report keeps, in milliseconds (an hour).
pub const MAX_REPORTED_LOAD_MS: u64 = 3_600_000;
/// The longest GPU name, model name or state kept, in bytes (cut at a character boundary).
pub const MAX_REPORT_NAME_BYTES: usize = 128;

/// A box's CPU, memory and GPUs. Every number is optional: a tool or platform that does not
/// tell leaves it out. Integers only, so messages stay comparable and small.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct HardwareReport {
    /// CPU use over the last sampling interval, all cores, 0–100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_percent: Option<u32>,
    /// Memory in use, MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_used_mb: Option<u64>,
    /// Memory installed, MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_total_mb: Option<u64>,
    /// Each GPU found; empty when none (or no vendor tool).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuReport>,
}

/// One GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct GpuReport {
    /// The product name, e.g. `NVIDIA GeForce RTX 4090`.
    #[serde(default)]
    pub name: String,
    /// VRAM in use, MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vram_used_mb: Option<u64>,
    /// VRAM installed, MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vram_total_mb: Option<u64>,
    /// GPU utilisation, 0–100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilization_percent: Option<u32>,
    /// Temperature, °C.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature_c: Option<i32>,
}

/// One model of a worker and its state: of its model map, `loaded`, `starting`, `idle` (not
/// running), `stopping` or `failed` (refusing starts for a while); of a backend it does not
/// manage that unloads models by itself (llama-server's sleep, Ollama's keep-alive), `loaded`
/// or `unloaded` (loaded again at the next request). Plain text, so a newer worker's states
/// reach an older dashboard as they are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct ModelStateReport {
    /// The model name.
    pub model: String,
    /// Its state.
    pub state: String,
    /// How long loading it took the last time, in milliseconds (ours, optional; for a backend
    /// the worker does not manage, as the request that found it unloaded measured it): what the
    /// proxy's cost routing adds for a box where it is not loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_ms: Option<u64>,
}

/// What a report may hold, whoever sent it.
pub trait Bounded {
    /// The value cut to the report limits.
    fn bounded(self) -> Self;
    /// Whether `value` has the JSON shape of this report (serde would also read a struct from
    /// an array, by position: not a report we meant).
    fn has_shape(value: &serde_json::Value) -> bool;
}

fn cut(mut text: String) -> String {
    if text.len() > MAX_REPORT_NAME_BYTES {
        let mut end = MAX_REPORT_NAME_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

impl Bounded for HardwareReport {
    fn has_shape(value: &serde_json::Value) -> bool {
        value.is_object()
            && value["gpus"]
                .as_array()
                .is_none_or(|gpus| gpus.iter().all(serde_json::Value::is_object))
    }

    fn bounded(mut self) -> Self {
        self.gpus.truncate(MAX_REPORTED_GPUS);
        self.cpu_percent = self.cpu_percent.map(|p| p.min(100));
        for gpu in &mut self.gpus {
            gpu.name = cut(std::mem::take(&mut gpu.name));
            gpu.utilization_percent = gpu.utilization_percent.map(|p| p.min(100));
        }
        self
    }
}

impl Bounded for Vec<ModelStateReport> {
    fn has_shape(value: &serde_json::Value) -> bool {
        value
            .as_array()
            .is_some_and(|states| states.iter().all(serde_json::Value::is_object))
    }

    fn bounded(mut self) -> Self {
        self.truncate(MAX_REPORTED_MODELS);
        for report in &mut self {
            report.model = cut(std::mem::take(&mut report.model));
            report.state = cut(std::mem::take(&mut report.state));
            report.load_ms = report.load_ms.map(|ms| ms.min(MAX_REPORTED_LOAD_MS));
        }
        self
    }
}

/// Reads an optional extension field, turning a value of the wrong shape into `None` and
/// cutting a good one to the report limits.
fn lenient<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned + Bounded,
{
    let value = serde_json::Value::deserialize(deserializer)?;
    if !T::has_shape(&value) {
        return Ok(None);
    }
    Ok(serde_json::from_value::<T>(value)
        .ok()
        .map(Bounded::bounded))
}

/// `graceful_shutdown`: stop taking work and drain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct GracefulShutdownMessage {
    /// Why, for the worker's logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// How long in-flight work may take before the proxy closes the connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_timeout_secs: Option<u64>,
    /// Our extension, ignored by published workers: `true` when the proxy itself is stopping
    /// (a restart, an upgrade, a reboot) rather than sending this worker away, so the worker
    /// finishes what it holds and reconnects once the proxy is back. Absent or `false` keeps
    /// the seeds' meaning: this worker is drained and stays away.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconnect: Option<bool>,
}

/// `models_refresh`: re-read the backend's models.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ModelsRefreshMessage {
    /// Why, for the worker's logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `models_update`: the worker's current models and load.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelsUpdateMessage {
    /// Every model the worker serves now (replaces the previous list).
    pub models: Vec<String>,
    /// Requests the worker is running right now.
    pub current_load: u32,
    /// Extension: `true` when the box is about to suspend; the worker closes the connection
    /// right after. Sent with an empty `models`, so a proxy that ignores the field simply stops
    /// routing to it (as on shutdown); ours remembers the models it served before as asleep.
    /// Not a boolean reads as absent.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_bool"
    )]
    pub going_to_sleep: Option<bool>,
    /// Extension: as in `register`, for the models now served.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_windows"
    )]
    pub context_windows: Option<ContextWindows>,
    /// Extension: what the worker's backends took, alone, to evaluate a prompt and generate a
    /// few tokens when the worker started ([`WarmUp`]), as in `register`: a warm-up that ended
    /// after the worker registered comes with the next `models_update`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_warm_ups"
    )]
    pub warm_ups: Option<Vec<WarmUp>>,
    /// Extension: as in `register`, for the models now served.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_names"
    )]
    pub sides_first: Option<Vec<String>>,
    /// Extension: as in `pong`, sent at once when a backend unloaded a model or loaded one again,
    /// so the proxy does not route by the state of the last heartbeat.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub model_states: Option<Vec<ModelStateReport>>,
}

/// `response_chunk`: SSE-framed bytes of a streaming answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResponseChunkMessage {
    /// The request this belongs to.
    pub request_id: String,
    /// Raw SSE text, written to the client byte for byte.
    pub chunk: String,
}

/// `response_complete`: the end of a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResponseCompleteMessage {
    /// The request that finished.
    pub request_id: String,
    /// The backend's HTTP status.
    pub status_code: u16,
    /// The backend's response headers.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: WireHeaders,
    /// The whole body of a non-streaming answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// Usage reported by the backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_counts: Option<TokenCounts>,
    /// How fast the backend was on this request (optional, ours; published proxies ignore it):
    /// what the proxy learns each box's speed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
}

/// How long a backend took over one request: its prompt processing and its generation.
/// llama-server reports these itself (`timings`); for other backends the worker measures them
/// (time to the first byte, and after it) with the backend's usage.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
pub struct Timings {
    /// Prompt tokens evaluated (not taken from a cache).
    pub prompt_tokens: u32,
    /// Milliseconds spent evaluating them.
    pub prompt_ms: f64,
    /// Prompt tokens taken from the backend's cache, when it says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u32>,
    /// Tokens generated.
    pub generated_tokens: u32,
    /// Milliseconds spent generating them.
    pub generation_ms: f64,
}

// JSON has no NaN: every value read or measured compares equal to itself.
impl Eq for Timings {}

/// Token usage of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct TokenCounts {
    /// Input tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<u32>,
    /// Generated tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_tokens: Option<u32>,
    /// Input plus generated tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_tokens: Option<u32>,
}

/// `error`: a failure reported by the worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorMessage {
    /// The failed request; absent for worker-level errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// Machine-readable code, e.g. `backend_unavailable`.
    #[serde(default)]
    pub code: String,
    /// What went wrong, for people.
    pub message: String,
}

/// An optional extension field that must never cost a peer its message: a boolean, else absent.
fn lenient_bool<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    Ok(serde_json::Value::deserialize(d)?.as_bool())
}

/// Context windows that must never cost a worker its message: anything but a map of names to
/// positive integers that fit u32 reads as absent; entries that are not such are dropped.
fn lenient_windows<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<ContextWindows>, D::Error> {
    let serde_json::Value::Object(map) = serde_json::Value::deserialize(d)? else {
        return Ok(None);
    };
    Ok(Some(
        map.into_iter()
            .filter_map(|(model, tokens)| {
                let tokens = u32::try_from(tokens.as_u64()?).ok().filter(|t| *t > 0)?;
                Some((model, tokens))
            })
            .collect(),
    ))
}

/// Warm-ups as a peer may send them: a value that is not a list reads as absent, an entry that
/// is not a warm-up is skipped, and at most [`MAX_WARM_UPS`] are read.
fn lenient_warm_ups<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<WarmUp>>, D::Error> {
    let serde_json::Value::Array(entries) = serde_json::Value::deserialize(d)? else {
        return Ok(None);
    };
    Ok(Some(
        entries
            .into_iter()
            .filter_map(|entry| serde_json::from_value(entry).ok())
            .take(MAX_WARM_UPS)
            .collect(),
    ))
}

/// The most warm-ups one message carries that are read: one per model a worker may serve.
pub const MAX_WARM_UPS: usize = 64;

/// Model names as a peer may send them: a value that is not a list reads as absent, an entry
/// that is not a string is skipped, and at most [`MAX_WARM_UPS`] (one per model a worker may
/// serve) are read.
fn lenient_names<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    let serde_json::Value::Array(entries) = serde_json::Value::deserialize(d)? else {
        return Ok(None);
    };
    Ok(Some(
        entries
            .into_iter()
            .filter_map(|entry| match entry {
                serde_json::Value::String(name) => Some(name),
                _ => None,
            })
            .take(MAX_WARM_UPS)
            .collect(),
    ))
}

/// An optional extension string that must never cost a peer its message: any other JSON value
/// reads as the empty string (which the field's own check then refuses, with a warning).
fn lenient_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(match serde_json::Value::deserialize(d)? {
        serde_json::Value::String(text) => Some(text),
        serde_json::Value::Null => None,
        _ => Some(String::new()),
    })
}

impl ServerToWorker {
    /// Serializes to the JSON text of one WebSocket frame.
    pub fn to_json(&self) -> String {
        // Serializing these plain structs cannot fail: every key is a string.
        serde_json::to_string(self).expect("protocol message serializes")
    }

    /// Parses one frame's JSON text; a `request` is read straight into its struct when its tag
    /// leads (see [`WorkerToServer::from_json`]: the body is not buffered twice).
    pub fn from_json(text: &str) -> serde_json::Result<ServerToWorker> {
        if text.starts_with(r#"{"type":"request","#) {
            return serde_json::from_str(text).map(ServerToWorker::Request);
        }
        serde_json::from_str(text)
    }
}

impl WorkerToServer {
    /// Serializes to the JSON text of one WebSocket frame.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("protocol message serializes")
    }

    /// Parses one frame's JSON text.
    ///
    /// serde reads an internally tagged enum by first buffering the whole object into a generic
    /// tree (the tag may come last), then converting it. The two messages that make up the
    /// traffic, chunks and completions, are read straight into their structs when the tag leads,
    /// as serde writes it (the struct ignores the `type` key); any other shape takes the general
    /// path, so every peer's spelling is still understood.
    pub fn from_json(text: &str) -> serde_json::Result<WorkerToServer> {
        if text.starts_with(r#"{"type":"response_chunk","#) {
            return serde_json::from_str(text).map(WorkerToServer::ResponseChunk);
        }
        if text.starts_with(r#"{"type":"response_complete","#) {
            return serde_json::from_str(text).map(WorkerToServer::ResponseComplete);
        }
        serde_json::from_str(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The estimate is exactly what serde writes, whatever the text.
        #[test]
        fn json_string_len_is_the_length_serde_writes(text in "\\PC{0,40}|[\\x00-\\x20\"\\\\a-z]{0,40}") {
            proptest::prop_assert_eq!(json_string_len(&text), serde_json::to_string(&text).unwrap().len());
        }
    }

    #[test]
    fn the_fast_path_reads_what_the_general_parse_reads() {
        let chunk = WorkerToServer::ResponseChunk(ResponseChunkMessage {
            request_id: "r-1".to_string(),
            chunk: "data: {\"a\":\"\\u00e9\"}\n\n".to_string(),
        });
        let complete = WorkerToServer::ResponseComplete(ResponseCompleteMessage {
            request_id: "r-2".to_string(),
            status_code: 200,
            headers: [("content-type".to_string(), "application/json".to_string())].into(),
            body: Some("{}".to_string()),
            token_counts: Some(TokenCounts {
                completion_tokens: Some(3),
                ..TokenCounts::default()
            }),
            timings: Some(Timings {
                prompt_tokens: 20,
                prompt_ms: 12.5,
                cached_tokens: Some(100),
                generated_tokens: 3,
                generation_ms: 60.0,
            }),
        });
        for message in [chunk, complete] {
            let text = message.to_json();
            assert_eq!(WorkerToServer::from_json(&text).unwrap(), message);
            assert_eq!(
                serde_json::from_str::<WorkerToServer>(&text).unwrap(),
                message
            );
        }
        let request = ServerToWorker::Request(RequestMessage {
            request_id: "r-3".to_string(),
            model: "m".to_string(),
            endpoint_path: "/v1/chat/completions".to_string(),
            is_streaming: true,
            body: "{\"model\":\"m\"}".to_string(),
            headers: WireHeaders::new(),
            conversation: Some(RequestMessage::conversation_of(0xfeed)),
            side_request: Some(true),
        });
        let text = request.to_json();
        assert_eq!(ServerToWorker::from_json(&text).unwrap(), request);
        assert_eq!(
            ServerToWorker::from_json(r#"{"type":"ping"}"#).unwrap(),
            ServerToWorker::Ping(PingMessage::default())
        );
    }

    #[test]
    fn a_request_s_conversation_is_optional_lenient_and_only_sixteen_hex_digits_are_a_key() {
        let plain = r#"{"type":"request","request_id":"r","model":"m","endpoint_path":"/v1/chat/completions","is_streaming":false,"body":"{}"}"#;
        let ServerToWorker::Request(message) = ServerToWorker::from_json(plain).unwrap() else {
            panic!("a request");
        };
        assert_eq!(message.conversation, None);
        assert_eq!(message.conversation_key(), None);
        assert_eq!(message.side_request, None);
        let written = ServerToWorker::Request(message.clone()).to_json();
        assert!(!written.contains("conversation"), "absent when unset");
        assert!(!written.contains("side_request"), "absent when unset");
        // A side request is `true`; anything else a peer might send costs it nothing.
        for (value, side) in [
            ("true", Some(true)),
            ("false", Some(false)),
            ("null", None),
            ("1", None),
            (r#""yes""#, None),
            ("[true]", None),
            (r#"{"a":1}"#, None),
        ] {
            let text = plain.replace(
                r#""body":"{}""#,
                &format!(r#""body":"{{}}","side_request":{value}"#),
            );
            let ServerToWorker::Request(message) = ServerToWorker::from_json(&text).unwrap() else {
                panic!("a request for {value}");
            };
            assert_eq!(message.side_request, side, "{value}");
        }
        let with = |value: &str| {
            let text = plain.replace(
                r#""body":"{}""#,
                &format!(r#""body":"{{}}","conversation":{value}"#),
            );
            let ServerToWorker::Request(message) = ServerToWorker::from_json(&text).unwrap() else {
                panic!("a request for {value}");
            };
            message.conversation_key()
        };
        assert_eq!(with(r#""00000000000000ff""#), Some(255));
        assert_eq!(with(r#""FFFFFFFFFFFFFFFF""#), Some(u64::MAX));
        assert_eq!(
            RequestMessage::conversation_of(255),
            "00000000000000ff",
            "what the proxy writes reads back"
        );
        let huge = format!(r#""{}""#, "a".repeat(100_000));
        for hostile in [
            r#""ff""#,
            r#""+000000000000ff""#,
            r#""0000000000000000ff""#,
            r#""zzzzzzzzzzzzzzzz""#,
            r#""0000000000000é""#,
            r#""""#,
            "17",
            "null",
            "[1]",
            r#"{"a":1}"#,
            &huge,
        ] {
            assert_eq!(with(hostile), None, "{hostile:.40}");
        }
    }

    #[test]
    fn the_sleep_extensions_are_optional_lenient_and_absent_when_unset() {
        let register = r#"{"type":"register","worker_name":"w","models":["m"],"max_concurrent":1}"#;
        let WorkerToServer::Register(message) = WorkerToServer::from_json(register).unwrap() else {
            panic!("a register");
        };
        assert_eq!(
            (message.mac_address.as_deref(), message.sleeps_when_idle),
            (None, None)
        );
        let text = WorkerToServer::Register(message).to_json();
        assert!(
            !text.contains("mac_address") && !text.contains("sleeps_when_idle"),
            "{text}"
        );
        for (mac, sleeps, want_mac, want_sleeps) in [
            (
                r#""02:00:00:00:00:01""#,
                "true",
                Some("02:00:00:00:00:01"),
                Some(true),
            ),
            ("7", r#""yes""#, Some(""), None),
            ("{}", "[]", Some(""), None),
            ("null", "null", None, None),
        ] {
            let text = format!(
                r#"{{"type":"register","worker_name":"w","models":[],"max_concurrent":1,"mac_address":{mac},"sleeps_when_idle":{sleeps}}}"#
            );
            let WorkerToServer::Register(message) = WorkerToServer::from_json(&text).unwrap()
            else {
                panic!("a register");
            };
            assert_eq!(message.mac_address.as_deref(), want_mac, "{text}");
            assert_eq!(message.sleeps_when_idle, want_sleeps, "{text}");
        }
        let update =
            r#"{"type":"models_update","models":[],"current_load":0,"going_to_sleep":"soon"}"#;
        let WorkerToServer::ModelsUpdate(update) = WorkerToServer::from_json(update).unwrap()
        else {
            panic!("a models_update");
        };
        assert_eq!(update.going_to_sleep, None);
        let asleep = WorkerToServer::ModelsUpdate(ModelsUpdateMessage {
            warm_ups: None,
            sides_first: None,
            going_to_sleep: Some(true),
            context_windows: None,
            ..update
        });
        assert!(asleep.to_json().contains(r#""going_to_sleep":true"#));
    }

    /// A `register` and a `models_update` whose extension `field` holds the JSON `value`.
    fn register_and_update_with(field: &str, value: &str) -> [String; 2] {
        [
            format!(
                r#"{{"type":"register","worker_name":"w","models":["m"],"max_concurrent":1,"{field}":{value}}}"#
            ),
            format!(
                r#"{{"type":"models_update","models":["m"],"current_load":0,"{field}":{value}}}"#
            ),
        ]
    }

    #[test]
    fn warm_ups_are_optional_lenient_and_absent_when_unset() {
        let warm_up = r#"{"model":"m","timings":{"prompt_tokens":1000,"prompt_ms":400.0,"generated_tokens":16,"generation_ms":200.0}}"#;
        let many = vec![warm_up; MAX_WARM_UPS + 5].join(",");
        for (value, want) in [
            (format!("[{warm_up}]"), Some(1)),
            // Entries that are not warm-ups are skipped, not the message.
            (
                format!(r#"[{warm_up},7,{{"model":"m"}},{{"model":1,"timings":{{}}}}]"#),
                Some(1),
            ),
            (format!("[{many}]"), Some(MAX_WARM_UPS)),
            ("{}".to_string(), None),
            (r#""fast""#.to_string(), None),
            ("null".to_string(), None),
        ] {
            for message in register_and_update_with("warm_ups", &value) {
                let warm_ups = match WorkerToServer::from_json(&message).unwrap() {
                    WorkerToServer::Register(register) => register.warm_ups,
                    WorkerToServer::ModelsUpdate(update) => update.warm_ups,
                    other => panic!("{other:?}"),
                };
                assert_eq!(warm_ups.as_ref().map(Vec::len), want, "{message}");
                if let Some(first) = warm_ups.as_ref().and_then(|w| w.first()) {
                    assert_eq!(first.model, "m");
                    assert_eq!(first.timings.prompt_tokens, 1000);
                    assert_eq!(first.timings.generation_ms, 200.0);
                }
            }
        }
        let register = r#"{"type":"register","worker_name":"w","models":["m"],"max_concurrent":1}"#;
        let message = WorkerToServer::from_json(register).unwrap();
        assert!(!message.to_json().contains("warm_ups"), "absent when unset");
    }

    #[test]
    fn a_models_updates_model_states_are_read_as_a_pongs_and_absent_when_unset() {
        let state = r#"{"model":"m","state":"unloaded","load_ms":99999999999}"#;
        let many = vec![state; MAX_REPORTED_MODELS + 5].join(",");
        for (value, want) in [
            (format!("[{state}]"), Some(1)),
            (format!("[{many}]"), Some(MAX_REPORTED_MODELS)),
            // A value of the wrong shape is dropped, never the message.
            (format!("[{state},7]"), None),
            (r#""unloaded""#.to_string(), None),
            ("null".to_string(), None),
        ] {
            let [_, update] = register_and_update_with("model_states", &value);
            let WorkerToServer::ModelsUpdate(update) = WorkerToServer::from_json(&update).unwrap()
            else {
                panic!("a models_update");
            };
            let states = update.model_states;
            assert_eq!(states.as_ref().map(Vec::len), want, "{value}");
            if let Some(first) = states.as_ref().and_then(|s| s.first()) {
                assert_eq!(
                    (first.model.as_str(), first.state.as_str()),
                    ("m", "unloaded")
                );
                assert_eq!(first.load_ms, Some(MAX_REPORTED_LOAD_MS));
            }
        }
        let update = r#"{"type":"models_update","models":["m"],"current_load":0}"#;
        let message = WorkerToServer::from_json(update).unwrap();
        assert!(
            !message.to_json().contains("model_states"),
            "absent when unset"
        );
    }

    #[test]
    fn sides_first_is_optional_lenient_and_absent_when_unset() {
        let many = vec![r#""m""#; MAX_WARM_UPS + 5].join(",");
        for (value, want) in [
            (r#"["m","n"]"#.to_string(), Some(vec!["m", "n"])),
            // Entries that are not names are skipped, not the message.
            (
                r#"["m",7,null,{"model":"x"},["n"]]"#.to_string(),
                Some(vec!["m"]),
            ),
            (format!("[{many}]"), Some(vec!["m"; MAX_WARM_UPS])),
            ("[]".to_string(), Some(vec![])),
            (r#""m""#.to_string(), None),
            ("true".to_string(), None),
            (r#"{"m":true}"#.to_string(), None),
            ("null".to_string(), None),
        ] {
            for message in register_and_update_with("sides_first", &value) {
                let sides_first = match WorkerToServer::from_json(&message).unwrap() {
                    WorkerToServer::Register(register) => register.sides_first,
                    WorkerToServer::ModelsUpdate(update) => update.sides_first,
                    other => panic!("{other:?}"),
                };
                let want: Option<Vec<String>> = want
                    .clone()
                    .map(|names| names.into_iter().map(String::from).collect());
                assert_eq!(sides_first, want, "{message}");
            }
        }
        let update = r#"{"type":"models_update","models":["m"],"current_load":0}"#;
        let message = WorkerToServer::from_json(update).unwrap();
        assert!(
            !message.to_json().contains("sides_first"),
            "absent when unset"
        );
    }

    #[test]
    fn other_spellings_take_the_general_path() {
        let tag_last = r#"{"request_id":"r-1","chunk":"x","type":"response_chunk"}"#;
        let spaced = r#"{ "type": "response_complete", "request_id": "r-2", "status_code": 204 }"#;
        assert!(matches!(
            WorkerToServer::from_json(tag_last).unwrap(),
            WorkerToServer::ResponseChunk(chunk) if chunk.chunk == "x"
        ));
        assert!(matches!(
            WorkerToServer::from_json(spaced).unwrap(),
            WorkerToServer::ResponseComplete(complete) if complete.status_code == 204
        ));
        assert!(WorkerToServer::from_json(r#"{"type":"response_chunk","chunk":1}"#).is_err());
        assert!(WorkerToServer::from_json(r#"{"type":"bogus"}"#).is_err());
    }
}

#[cfg(test)]
mod report_tests {
    use super::*;

    fn pong(extra: &str) -> PongMessage {
        let text = format!(r#"{{"type":"pong","current_load":2{extra}}}"#);
        match WorkerToServer::from_json(&text).expect("a pong reads whatever its extensions") {
            WorkerToServer::Pong(pong) => pong,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn extension_fields_of_the_wrong_shape_are_dropped_and_the_pong_kept() {
        for bad in [
            r#","hardware":"lots""#,
            r#","hardware":[1,2]"#,
            r#","hardware":{"gpus":7}"#,
            r#","hardware":{"gpus":[[1,2]]}"#,
            r#","hardware":{"cpu_percent":-1}"#,
            r#","hardware":null,"model_states":{"m":"loaded"}"#,
            r#","model_states":[["m","loaded"]]"#,
        ] {
            let pong = pong(bad);
            assert_eq!(pong.current_load, 2);
            assert_eq!((pong.hardware, pong.model_states), (None, None), "{bad}");
        }
    }

    #[test]
    fn a_report_is_cut_to_the_limits_and_unknown_fields_are_skipped() {
        let name = "é".repeat(MAX_REPORT_NAME_BYTES);
        let gpus: Vec<String> = (0..MAX_REPORTED_GPUS + 5)
            .map(|_| format!(r#"{{"name":"{name}","utilization_percent":400,"new":1}}"#))
            .collect();
        let cut_pong = pong(&format!(
            r#","hardware":{{"cpu_percent":101,"gpus":[{}],"future":{{}}}}"#,
            gpus.join(",")
        ));
        let hardware = cut_pong.hardware.unwrap();
        assert_eq!(hardware.cpu_percent, Some(100));
        assert_eq!(hardware.gpus.len(), MAX_REPORTED_GPUS);
        // Two-byte characters: cut at a boundary, never in the middle of one.
        assert_eq!(hardware.gpus[0].name.len(), MAX_REPORT_NAME_BYTES);
        assert_eq!(hardware.gpus[0].utilization_percent, Some(100));
        // A model's load time: kept as sent, an absurd one cut to an hour, a malformed one
        // drops the states (the rest of the pong stands).
        let states = pong(r#","model_states":[{"model":"a","state":"idle","load_ms":12500},{"model":"b","state":"idle","load_ms":99999999999},{"model":"c","state":"loaded"}]"#)
            .model_states
            .unwrap();
        let loads: Vec<_> = states.iter().map(|s| s.load_ms).collect();
        assert_eq!(loads, [Some(12_500), Some(MAX_REPORTED_LOAD_MS), None]);
        let bad = pong(r#","model_states":[{"model":"a","state":"idle","load_ms":-5}]"#);
        assert_eq!((bad.current_load, bad.model_states), (2, None));
    }

    #[test]
    fn a_pong_without_extensions_writes_none() {
        let plain = WorkerToServer::Pong(PongMessage {
            current_load: 1,
            timestamp_unix_ms: None,
            hardware: None,
            model_states: None,
        });
        assert_eq!(plain.to_json(), r#"{"type":"pong","current_load":1}"#);
    }
}
