// Shapes of the control API (docs/admin-api.md). The answers the relay builds from Rust types are
// generated from them (api.generated.ts, checked by the test command): the names below are the
// UI's for them. Only the settings patch, a subset the UI sends, is written here.

import type {
  BoxHistory,
  DiscoveryAnswer,
  FoundBackend,
  JoinDetails as CodeDetails,
  JoinCodeAnswer,
  JoinTestAnswer,
  KeyPriority as GeneratedKeyPriority,
  KeyView,
  LanProxy,
  ModelView,
  NewKey,
  NodeStatus,
  ProxyValues,
  QueueView,
  RequestView,
  Roles,
  SettingsAnswer,
  SleeperView,
  UsageSums,
  WorkerValues,
  WorkerView,
} from './api.generated';

export type {
  AffinityView as AffinityStatus,
  BackendKind,
  GpuReport,
  GroupBy as UsageGroupBy,
  HardwareReport,
  ModelStateReport,
  ModelStatus,
  OwnWorkerState,
  Roles,
  Series,
  Status,
  UsageReport,
  UsageRow,
} from './api.generated';

export type NodeInfo = NodeStatus;
export type WorkerState = WorkerView['state'];
export type WorkerInfo = WorkerView;
export type HardwareHistory = BoxHistory;
export type ModelInfo = ModelView;
export type QueueInfo = QueueView;
export type InFlightRequest = RequestView;
/** A box that went to sleep (README: Sleeping boxes and Wake-on-LAN). */
export type SleeperInfo = SleeperView;
export type DiscoveredProxy = LanProxy;
/** A model server discovery found, as `GET /api/discovery` lists it. */
export type DiscoveredBackend = FoundBackend;
export type UsageCounts = UsageSums;

export type Discovery = DiscoveryAnswer;
/** What a join code carries (encoded and decoded in the browser too: lib/joincode.ts); a code
 * made elsewhere may leave the provider out, which then is the default (`local`). */
export type JoinDetails = Omit<CodeDetails, 'provider'> & { provider?: string };
export type { JoinRequest } from './api.generated';
export type JoinCodeInfo = JoinCodeAnswer;
export type JoinTestResult = JoinTestAnswer;
export type ProxySettings = ProxyValues;
export type WorkerSettings = WorkerValues;
export type { SettingsValues, StartOnLoginState } from './api.generated';
export type SettingsResponse = SettingsAnswer;

/** PUT /api/settings body: any subset; `worker.worker_secret` is write-only. */
export interface SettingsPatch {
  roles?: Partial<Roles>;
  proxy?: Partial<ProxySettings>;
  /** A field set to null goes back to its default. */
  worker?: Partial<{ [K in keyof Omit<WorkerSettings, 'worker_secret_set'>]: WorkerSettings[K] | null }> & {
    worker_secret?: string;
  };
}

/** A client API key as GET /api/keys lists it: metadata only, never the secret. */
export type ApiKey = Omit<KeyView, 'key'>;

/** How urgent a key's requests are (README, "Priority and fair turns"). */
export type KeyPriority = GeneratedKeyPriority;

/** POST /api/keys answer: the key plus its secret, which the relay shows only this once. */
export type CreatedApiKey = ApiKey & { key: string };

/** POST /api/keys body: only `name` is required. */
export type NewApiKey = Pick<NewKey, 'name'> & Partial<Omit<NewKey, 'name'>>;
