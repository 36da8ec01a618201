// Shapes of the control API (docs/admin-api.md). Keep in step with the contract.

export interface Roles {
  proxy: boolean;
  worker: boolean;
}

/** `drained`: its proxy sent graceful_shutdown; it finished and waits for a rejoin. */
export type OwnWorkerState = 'off' | 'connecting' | 'connected' | 'disconnected' | 'drained';

export interface NodeInfo {
  version: string;
  url: string;
  listen: string;
  roles: Roles;
  worker: {
    state: OwnWorkerState;
    proxy_url: string | null;
    name: string | null;
    last_error: string | null;
  };
  /** The own worker's model map; absent from relays older than this UI. */
  lifecycle?: ModelStatus[];
  admin_token_required: boolean;
  /** Some relays report whether inference needs a client API key here rather than at the top. */
  require_api_keys?: boolean;
  uptime_secs: number;
  /** Where Claude Code's requests go now (null: they would wait for a worker). */
  claude_code?: { model: string | null; small_model: string | null };
}

export type WorkerState = 'idle' | 'busy' | 'draining';

export interface WorkerInfo {
  id: string;
  provider: string;
  name: string;
  host: string;
  models: string[];
  load: number;
  max_concurrent: number;
  state: WorkerState;
  connected_unix_ms: number;
  heartbeat_ms: number | null;
  /** The worker's box at its last report; null (or absent from an older relay) when unknown. */
  hardware?: HardwareReport | null;
  /** CPU, memory and VRAM use over the last reports (percent; null where a report lacked it). */
  hardware_history?: HardwareHistory;
  /** Its model map's models and their states (`loaded`, `starting`, `idle`, …). */
  model_states?: ModelStateReport[] | null;
  /** Tokens one request may hold, per model, where the worker reported it. */
  context_windows?: Record<string, number>;
}

export interface GpuReport {
  name: string;
  vram_used_mb?: number;
  vram_total_mb?: number;
  utilization_percent?: number;
  temperature_c?: number;
}

export interface HardwareReport {
  cpu_percent?: number;
  memory_used_mb?: number;
  memory_total_mb?: number;
  gpus?: GpuReport[];
}

export interface HardwareHistory {
  unix_ms: number[];
  cpu_percent: (number | null)[];
  memory_percent: (number | null)[];
  vram_percent: (number | null)[];
}

export interface ModelStateReport {
  model: string;
  state: string;
}

export interface ModelInfo {
  name: string;
  provider: string;
  workers: string[];
}

export interface QueueInfo {
  provider: string;
  depth: number;
}

export interface InFlightRequest {
  id: string;
  model: string;
  provider: string;
  worker: string | null;
  state: 'queued' | 'running';
  streaming: boolean;
  age_ms: number;
  ttft_ms: number | null;
  tokens: number;
  tokens_per_sec: number | null;
}

export interface Series {
  interval_secs: number;
  unix_secs: number[];
  requests_per_sec: number[];
  tokens_per_sec: number[];
  errors_per_sec: number[];
  queue_depth: number[];
}

/** A box that went to sleep (README: Sleeping boxes and Wake-on-LAN). */
export interface SleeperInfo {
  name: string;
  provider: string;
  models: string[];
  mac_address: string | null;
  since_unix_ms: number;
  state: 'asleep' | 'waking';
  waking_since_unix_ms: number | null;
  wake_packets: number;
}

export interface Status {
  node: NodeInfo;
  workers: WorkerInfo[];
  models: ModelInfo[];
  /** Absent from relays older than sleeping boxes. */
  sleepers?: SleeperInfo[];
  queues: QueueInfo[];
  in_flight: InFlightRequest[];
  totals: { requests: number; errors: number; tokens: number };
  series: Series;
  /** Whether inference needs a client API key (`--require-api-keys`); absent from older relays. */
  require_api_keys?: boolean;
  /** Conversation affinity since start; absent from older relays. */
  affinity?: AffinityStatus;
}

/** How requests with a conversation key were placed: on their home worker (hit), elsewhere (miss), or with no home yet (new). */
export interface AffinityStatus {
  enabled: boolean;
  hits: number;
  misses: number;
  new: number;
  /** Conversations remembered now. */
  entries: number;
}

export interface ModelStatus {
  name: string;
  state: string;
  port: number | null;
  pid: number | null;
  last_used_unix_ms: number | null;
  restarts: number;
  crashes: number;
  in_flight: number;
  last_error: string | null;
  retry_in_secs: number | null;
}

export interface DiscoveredBackend {
  kind: string;
  label: string;
  url: string;
  models: string[];
  /** Who listens on its port: this node's user, another user (uid), or nobody known. */
  owner: { user: 'this_user' } | { user: 'other_user'; uid: number } | { user: 'unknown' };
  /** Confirmed by the box's owner (`worker.confirmed_backends`). */
  confirmed: boolean;
  /** The worker sends it requests: this user's server, or a confirmed one. */
  usable: boolean;
}

export interface DiscoveredProxy {
  name: string;
  url: string;
  host: string;
  port: number;
  /** SHA-256 of the proxy's TLS certificate (`sha256:<hex>`): joined pinned to it. */
  fingerprint?: string | null;
}

export interface Discovery {
  backends: DiscoveredBackend[];
  proxies: DiscoveredProxy[];
}

export interface JoinDetails {
  url: string;
  secret: string;
  provider?: string | null;
  /** SHA-256 of the proxy's TLS certificate; the worker trusts only that certificate. */
  fingerprint?: string | null;
}

export interface JoinCodeInfo {
  /** The proxy's URL that other machines reach best (never a wildcard address). */
  url: string;
  /** Every URL it may be reached at, best first (`url` first): LAN addresses, then HOST.local. */
  urls?: string[];
  secret: string;
  provider: string;
  /** Present when the proxy serves TLS with its own certificate. */
  fingerprint?: string | null;
  code: string;
}

export interface JoinTestResult {
  ok: boolean;
  message: string;
}

export interface ProxySettings {
  listen: string;
  provider: string;
  max_queue_len: number;
  queue_timeout_secs: number;
  request_timeout_secs: number;
  aliases: Record<string, string>;
  default_model: string | null;
}

export interface WorkerSettings {
  proxy_url: string | null;
  worker_secret_set: boolean;
  worker_name: string | null;
  backend_url: string | null;
  models: string[] | null;
  max_concurrency: number;
  /** Other users' local model servers the owner confirmed for the worker. */
  confirmed_backends: string[];
}

export interface SettingsValues {
  roles: Roles;
  proxy: ProxySettings;
  worker: WorkerSettings;
}

export interface SettingsResponse {
  path: string;
  toml: string;
  settings: SettingsValues;
  restart_required: string[];
}

/** PUT /api/settings body: any subset; `worker.worker_secret` is write-only. */
export interface SettingsPatch {
  roles?: Partial<Roles>;
  proxy?: Partial<ProxySettings>;
  worker?: Partial<Omit<WorkerSettings, 'worker_secret_set'>> & { worker_secret?: string };
}

/** GET/PUT /api/start-on-login: the desktop app's login entry, served by its node. */
export interface StartOnLoginState {
  available: boolean;
  enabled: boolean | null;
  error?: string;
}

/** A client API key as GET /api/keys lists it: metadata only, never the secret. */
export interface ApiKey {
  id: string;
  name: string;
  /** The first characters of the secret, to recognise it ("mr-AbCd"). */
  prefix: string;
  created_at: string;
  revoked_at: string | null;
  last_used_at: string | null;
  /** Allowed models; null allows every model. */
  models: string[] | null;
  max_concurrent: number | null;
  requests_per_minute: number | null;
  /** Batch keys' requests wait behind interactive ones when slots are busy; absent from older relays. */
  priority?: KeyPriority;
  /** Its turns for each turn of a weight-1 client when they wait for the same slots; null is 1. */
  weight?: number | null;
}

/** How urgent a key's requests are (README, "Priority and fair turns"). */
export type KeyPriority = 'interactive' | 'batch';

/** POST /api/keys answer: the key plus its secret, which the relay shows only this once. */
export interface CreatedApiKey extends ApiKey {
  key: string;
}

/** POST /api/keys body: only `name` is required. */
export interface NewApiKey {
  name: string;
  models?: string[];
  max_concurrent?: number;
  requests_per_minute?: number;
  priority?: KeyPriority;
  weight?: number;
}

export type UsageGroupBy = 'day' | 'key' | 'model';

export interface UsageCounts {
  requests: number;
  errors: number;
  input_tokens: number;
  output_tokens: number;
  /** Means over the requests that had a first token / over all requests; null without any. */
  avg_ttft_ms?: number | null;
  avg_duration_ms?: number | null;
}

export interface UsageRow extends UsageCounts {
  /** A day (YYYY-MM-DD), a key id (or "anonymous"), or a model name, after `group_by`. */
  group: string;
  /** With group_by=key: the key's name; absent (or null) for requests without a key. */
  name?: string | null;
}

export interface UsageReport {
  group_by: UsageGroupBy;
  since: string;
  until: string;
  rows: UsageRow[];
  totals: UsageCounts;
}
