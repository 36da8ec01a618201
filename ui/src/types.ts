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
  uptime_secs: number;
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

export interface Status {
  node: NodeInfo;
  workers: WorkerInfo[];
  models: ModelInfo[];
  queues: QueueInfo[];
  in_flight: InFlightRequest[];
  totals: { requests: number; errors: number; tokens: number };
  series: Series;
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
  url: string;
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

export interface RelayInfo {
  url: string;
  admin_token: string | null;
}
