// Generated from the relay's Rust types by relay-core/src/typescript.rs: do not edit.
// Write it again with `MODELRELAY_WRITE_TS=1 cargo test -p relay-core --lib typescript`.

export type AffinityView = { enabled: boolean, 
/**
 * Requests routed to their home worker.
 */
hits: number, 
/**
 * Requests that had a home but were routed elsewhere.
 */
misses: number, 
/**
 * Requests whose conversation had no home yet.
 */
new: number, 
/**
 * Conversations the table remembers now.
 */
entries: number, };

export type BackendKind = "llama_server" | "ollama" | "vllm" | "lm_studio" | "llamafile" | "openai_compatible";

export type BoxHistory = { 
/**
 * Each point's time.
 */
unix_ms: Array<number>, 
/**
 * CPU use, percent.
 */
cpu_percent: Array<number | null>, 
/**
 * Memory in use, percent of installed.
 */
memory_percent: Array<number | null>, 
/**
 * VRAM in use over all GPUs that tell, percent of their total.
 */
vram_percent: Array<number | null>, };

export type ClaudeCodeUses = { 
/**
 * For the conversation.
 */
model: string | null, 
/**
 * For its `claude-haiku-*` side requests.
 */
small_model: string | null, };

export type DiscoveryAnswer = { backends: Array<FoundBackend>, proxies: Array<LanProxy>, };

export type FoundBackend = { kind: BackendKind, 
/**
 * Its kind, as people call it.
 */
label: string, url: string, models: Array<string>, 
/**
 * Who listens on its port.
 */
owner: Owner, 
/**
 * Confirmed by the box's owner (`worker.confirmed_backends`).
 */
confirmed: boolean, 
/**
 * The worker sends it requests: this user's server, or a confirmed one.
 */
usable: boolean, };

export type GpuReport = { 
/**
 * The product name, e.g. `NVIDIA GeForce RTX 4090`.
 */
name: string, 
/**
 * VRAM in use, MiB.
 */
vram_used_mb?: number | null, 
/**
 * VRAM installed, MiB.
 */
vram_total_mb?: number | null, 
/**
 * GPU utilisation, 0–100.
 */
utilization_percent?: number | null, 
/**
 * Temperature, °C.
 */
temperature_c?: number | null, };

export type GroupBy = "day" | "key" | "model";

export type HardwareReport = { 
/**
 * CPU use over the last sampling interval, all cores, 0–100.
 */
cpu_percent?: number | null, 
/**
 * Memory in use, MiB.
 */
memory_used_mb?: number | null, 
/**
 * Memory installed, MiB.
 */
memory_total_mb?: number | null, 
/**
 * Each GPU found; empty when none (or no vendor tool).
 */
gpus?: Array<GpuReport>, };

export type JoinCodeAnswer = { 
/**
 * Every URL it may be reached at, best first: LAN addresses, then `HOST.local`.
 */
urls: Array<string>, 
/**
 * The one other machines reach best (never a wildcard address).
 */
url: string, secret: string, provider: string, 
/**
 * Present when the proxy serves TLS with its own certificate.
 */
fingerprint: string | null, code: string, };

export type JoinDetails = { 
/**
 * The proxy's base URL.
 */
url: string, 
/**
 * Its worker secret.
 */
secret: string, 
/**
 * The provider to join.
 */
provider: string, 
/**
 * The SHA-256 fingerprint of the proxy's certificate: the worker connects over `wss://` and
 * trusts that certificate only.
 */
fingerprint?: string, 
/**
 * Every URL the proxy may be reached at, best first (`url` is the first): its LAN
 * addresses and its `HOST.local` name. A joining box uses the first that answers.
 * Optional, so older codes (and older decoders) go on working with `url` alone.
 */
urls?: Array<string>, };

export type JoinRequest = { code?: string, proxy_url?: string, secret?: string, provider?: string, 
/**
 * The proxy's certificate fingerprint (a LAN proxy found by discovery shows it).
 */
fingerprint?: string, };

export type JoinTestAnswer = { ok: boolean, message: string, };

export type KeyPriority = "interactive" | "batch";

export type KeyView = { id: string, name: string, prefix: string, created_at: string, revoked_at: string | null, last_used_at: string | null, models: Array<string> | null, max_concurrent: number | null, requests_per_minute: number | null, priority: KeyPriority, weight: number | null, 
/**
 * The secret: only in the answer that created the key.
 */
key?: string, };

export type LanProxy = { 
/**
 * Instance name the proxy announced (usually its machine's host name).
 */
name: string, 
/**
 * Base URL to reach the proxy, e.g. `http://192.168.1.20:8080`.
 */
url: string, 
/**
 * The proxy machine's mDNS host name, without the trailing dot, e.g. `box.local`.
 */
host: string, 
/**
 * TCP port the proxy listens on.
 */
port: number, 
/**
 * The proxy's ModelRelay version (TXT `version`), if it said.
 */
version: string | null, 
/**
 * The model provider behind the proxy (TXT `provider`), if it said.
 */
provider: string | null, 
/**
 * The SHA-256 fingerprint of the proxy's TLS certificate (TXT `fingerprint`): join it
 * pinned to this. Only as trustworthy as the LAN it came from; the join code from the
 * proxy's own dashboard is the authoritative copy.
 */
fingerprint: string | null, };

export type ModelState = "stopped" | "starting" | "ready" | "stopping" | "failed";

export type ModelStateReport = { 
/**
 * The model name.
 */
model: string, 
/**
 * Its state.
 */
state: string, 
/**
 * How long loading it took the last time, in milliseconds (ours, optional; for a backend
 * the worker does not manage, as the request that found it unloaded measured it): what the
 * proxy's cost routing adds for a box where it is not loaded.
 */
load_ms?: number | null, };

export type ModelStatus = { 
/**
 * The model name.
 */
name: string, 
/**
 * Its state.
 */
state: ModelState, 
/**
 * Its port while it runs.
 */
port: number | null, 
/**
 * Its process id while it runs.
 */
pid: number | null, 
/**
 * When a request last used it, in milliseconds since the Unix epoch.
 */
last_used_unix_ms: number | null, 
/**
 * Starts after the first one (after idle unloads, crashes, session changes, ...).
 */
restarts: number, 
/**
 * Times its process died unexpectedly.
 */
crashes: number, 
/**
 * Requests using it now.
 */
in_flight: number, 
/**
 * The last failure, if any.
 */
last_error: string | null, 
/**
 * While failed: seconds until a start is tried again.
 */
retry_in_secs: number | null, 
/**
 * How long its last start took to serve, in milliseconds (what loading it costs a request).
 */
last_load_ms: number | null, };

export type ModelView = { name: string, provider: string, workers: Array<string>, };

export type NewKey = { name: string, models: Array<string> | null, max_concurrent: number | null, requests_per_minute: number | null, 
/**
 * Interactive when left out.
 */
priority: KeyPriority, 
/**
 * 1 when left out.
 */
weight: number | null, };

export type NodeStatus = { 
/**
 * The crate version.
 */
version: string, 
/**
 * Whether the control API needs the admin token.
 */
admin_token_required: boolean, 
/**
 * Whether inference requests need a client API key.
 */
require_api_keys: boolean, 
/**
 * Seconds since start.
 */
uptime_secs: number, 
/**
 * Where Claude Code's requests go now.
 */
claude_code: ClaudeCodeUses, 
/**
 * The base URL clients use.
 */
url: string, 
/**
 * The listen address.
 */
listen: string, 
/**
 * Its roles.
 */
roles: Roles, 
/**
 * Its own worker.
 */
worker: OwnWorker, 
/**
 * The model map of its own worker (llama-server processes started on demand), pushed on
 * every change; empty without a worker or a model map.
 */
lifecycle: Array<ModelStatus>, };

export type OwnWorker = { 
/**
 * Its state.
 */
state: OwnWorkerState, 
/**
 * The proxy it joins, while the role is on.
 */
proxy_url: string | null, 
/**
 * Its name.
 */
name: string | null, 
/**
 * Why its last connection failed, if it did.
 */
last_error: string | null, 
/**
 * This box's CPU, memory and GPUs at the worker's last sample (absent while it samples
 * nothing).
 */
hardware?: HardwareReport, };

export type OwnWorkerState = "off" | "connecting" | "connected" | "disconnected" | "drained";

export type Owner = { "user": "this_user" } | { "user": "other_user", "uid": number } | { "user": "unknown" };

export type PlacementCount = { reason: 'cache_hit' | 'home_busy' | 'new_conversation' | 'least_loaded' | 'faster_box' | 'waking' | 'side_request', count: number, };

export type PlacementsView = { cost_routing: boolean, by_reason: Array<PlacementCount>, };

export type ProxyValues = { listen: string, provider: string, max_queue_len: number, queue_timeout_secs: number, request_timeout_secs: number, aliases: { [key in string]: string }, default_model: string | null, };

export type QueueView = { provider: string, depth: number, };

export type RequestView = { id: string, model: string, provider: string | null, worker: string | null, state: 'queued' | 'running', streaming: boolean, age_ms: number, ttft_ms: number | null, tokens: number, tokens_per_sec: number | null, 
/**
 * Why it went to its worker: `cache_hit`, `home_busy`, `new_conversation`,
 * `least_loaded`, `faster_box`, `waking` or `side_request` (none while queued).
 */
reason: 'cache_hit' | 'home_busy' | 'new_conversation' | 'least_loaded' | 'faster_box' | 'waking' | 'side_request' | null, 
/**
 * What cost routing weighed for it, moving it (`faster_box`, `waking`) or not.
 */
weighed: WeighedView | null, };

export type Roles = { 
/**
 * Serves clients and accepts workers.
 */
proxy: boolean, 
/**
 * Runs a worker that joins a proxy (this node's own or another).
 */
worker: boolean, };

export type Series = { 
/**
 * Seconds between points.
 */
interval_secs: number, 
/**
 * Each point's time.
 */
unix_secs: Array<number>, 
/**
 * Requests ended per second.
 */
requests_per_sec: Array<number>, 
/**
 * Output tokens per second.
 */
tokens_per_sec: Array<number>, 
/**
 * Errors per second.
 */
errors_per_sec: Array<number>, 
/**
 * Queued requests at the point.
 */
queue_depth: Array<number>, };

export type SettingsAnswer = { path: string, toml: string, settings: SettingsValues, restart_required: Array<string>, };

export type SettingsValues = { 
/**
 * Which roles run.
 */
roles: Roles, 
/**
 * `[proxy]`.
 */
proxy: ProxyValues, 
/**
 * `[worker]`.
 */
worker: WorkerValues, };

export type SleeperView = { name: string, provider: string, models: Array<string>, mac_address: string | null, since_unix_ms: number, state: 'asleep' | 'waking', waking_since_unix_ms: number | null, wake_packets: number, 
/**
 * Why it is being woken (none while asleep): a request for a model no awake box serves,
 * a long prompt whose first token comes sooner there, a request that would wait longer for
 * an awake slot than the wake, or a queue that has waited as long as the wake.
 */
wake_cause: 'nothing_awake' | 'first_token_sooner' | 'slot_wait' | 'queue_waited' | null, };

export type SpeedView = { 
/**
 * Prompt tokens evaluated per second.
 */
prompt_tps: number | null, 
/**
 * Tokens generated per second.
 */
generation_tps: number | null, 
/**
 * Whether it evaluates side requests (titles, summaries) before the turns waiting there:
 * its worker gives them the lowest slot of a llama-server, which evaluates slots in order,
 * so cost routing counts about one batch of prompt ahead of them, not all that waits.
 */
sides_first: boolean, };

export type StartOnLoginState = { available: boolean, enabled: boolean | null, 
/**
 * Why the state could not be read.
 */
error?: string, };

export type Status = { node: NodeStatus, workers: Array<WorkerView>, models: Array<ModelView>, sleepers: Array<SleeperView>, queues: Array<QueueView>, in_flight: Array<RequestView>, totals: TotalsSnapshot, series: Series, affinity: AffinityView, placements: PlacementsView, 
/**
 * Whether the database takes writes (a full disk or read-only data directory says so).
 */
storage: StorageView, };

export type StorageView = { 
/**
 * Writes work (the last one succeeded, and the database was opened for writing).
 */
writable: boolean, 
/**
 * What is wrong, and what to do, in a sentence; none while all is well.
 */
problem: string | null, 
/**
 * Since when (Unix ms), if something is wrong.
 */
since_unix_ms: number | null, 
/**
 * Finished requests whose usage could not be written since start.
 */
usage_records_not_stored: number, 
/**
 * Writes refused since start (usage batches, key changes).
 */
writes_failed: number, };

export type TotalsSnapshot = { 
/**
 * Requests that ended (answered or failed).
 */
requests: number, 
/**
 * Requests that ended with a relay error or a backend status of 400 or more.
 */
errors: number, 
/**
 * Output tokens.
 */
tokens: number, };

export type UsageReport = { group_by: GroupBy, since: string, until: string, rows: Array<UsageRow>, totals: UsageSums, };

export type UsageRow = { 
/**
 * The day, key id (or `anonymous`) or model.
 */
group: string, 
/**
 * The key's name, for rows grouped by key.
 */
name?: string, requests: number, errors: number, input_tokens: number, output_tokens: number, 
/**
 * Mean time to first byte over requests that got one.
 */
avg_ttft_ms: number | null, avg_duration_ms: number | null, };

export type UsageSums = { requests: number, errors: number, input_tokens: number, output_tokens: number, 
/**
 * Mean time to first byte over requests that got one.
 */
avg_ttft_ms: number | null, avg_duration_ms: number | null, };

export type WeighedView = { 
/**
 * It stayed with the usual choice: the other was not clearly sooner.
 */
kept: boolean, 
/**
 * Until the first token where it went (a woken box's wake included), with what its prompt
 * delays the prompts evaluated beside it there.
 */
first_token_s: number, 
/**
 * The worker weighed against (its name): the usual choice where it moved, the best other
 * where it stayed; `null`: it moved to a waking box while no worker was free.
 */
other: string | null, 
/**
 * The same estimate there (with no worker free, the wait for a slot included).
 */
other_s: number, 
/**
 * How much longer its answer takes where it went than there (below zero: sooner), where a
 * quiet fleet weighed answers; 0 where it did not.
 */
answer_s: number, 
/**
 * Charged for the conversation evicted on the worker that is not the usual choice; 0
 * where it evicts none.
 */
eviction_s: number, };

export type WorkerValues = { proxy_url: string | null, worker_secret_set: boolean, worker_name: string, backend_url: string | null, models: Array<string> | null, max_concurrency: number, confirmed_backends: Array<string>, };

export type WorkerView = { id: string, provider: string, name: string, host: string | null, models: Array<string>, load: number, max_concurrent: number, state: 'idle' | 'busy' | 'draining', connected_unix_ms: number | null, heartbeat_ms: number | null, 
/**
 * The worker's box at its last report (`null` for a worker that sends none).
 */
hardware: HardwareReport | null, 
/**
 * CPU, memory and VRAM use over the last reports, for sparklines.
 */
hardware_history: BoxHistory, 
/**
 * The states of its model map's models (`null` without a model map or report).
 */
model_states: Array<ModelStateReport> | null, 
/**
 * The tokens one request may hold, per model, where the worker reported them.
 */
context_windows: { [key in string]: number }, 
/**
 * Its measured speeds per model (tokens per second), once it has answered with timings.
 */
speeds: { [key in string]: SpeedView }, };
