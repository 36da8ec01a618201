// Status (from /api/events) → what the dashboard shows. Pure, unit-tested.

import type { ModelStatus, OwnWorkerState, Status, WorkerState } from '../types';
import { toHardwareView, type HardwareView } from './hardware';
import {
  DASH,
  formatCompact,
  formatCount,
  formatDateTime,
  formatDuration,
  formatLatency,
  formatRate,
  formatSince,
  formatUptime,
} from './format';

export type Tone = 'ok' | 'busy' | 'warn' | 'bad' | 'muted';

export interface NodeView {
  url: string;
  version: string;
  listen: string;
  roles: string[];
  rolesLabel: string;
  uptime: string;
  adminTokenRequired: boolean;
  ownWorker: {
    state: OwnWorkerState;
    label: string;
    tone: Tone;
    proxyUrl: string | null;
    name: string | null;
    lastError: string | null;
  };
}

export interface WorkerRow {
  id: string;
  name: string;
  host: string;
  provider: string;
  models: string[];
  /** Context window per model ("32k"), where known. */
  windows: Record<string, string>;
  /** Measured speed per model ("prompt 2,000 tok/s · generation 45 tok/s"), once measured. */
  speeds: Record<string, string>;
  modelsLabel: string;
  load: number;
  maxConcurrent: number;
  loadLabel: string;
  loadFraction: number;
  state: WorkerState;
  tone: Tone;
  connectedSince: string;
  connectedAt: string;
  heartbeat: string;
  canDrain: boolean;
  /** Its box and model states, when it reports them. */
  hardware: HardwareView | null;
}

export interface ModelRow {
  name: string;
  provider: string;
  workerNames: string[];
  workersLabel: string;
}

export interface QueueRow {
  provider: string;
  depth: number;
}

export interface InFlightRow {
  id: string;
  model: string;
  provider: string | null;
  worker: string;
  state: 'queued' | 'running';
  streaming: boolean;
  age: string;
  ttft: string;
  tokens: string;
  tokensPerSec: string;
  /** Why it went to its worker, in words ("" while queued). */
  reason: string;
  /** Where cost routing passed up the usual choice, the estimates it weighed ("" otherwise). */
  weighed: string;
}

export interface TotalsView {
  requests: string;
  errors: string;
  tokens: string;
  errorRate: string;
}

export interface DashboardView {
  node: NodeView;
  workers: WorkerRow[];
  models: ModelRow[];
  queues: QueueRow[];
  queueDepthTotal: number;
  inFlight: InFlightRow[];
  inFlightTotal: number;
  /** "cache hit 360 · faster box 45 · side request 143 · cost routing on" ("" before any). */
  placements: string;
  totals: TotalsView;
  servedModels: string[];
}

export function rolesList(roles: { proxy: boolean; worker: boolean }): string[] {
  const out: string[] = [];
  if (roles.proxy) out.push('proxy');
  if (roles.worker) out.push('worker');
  return out;
}

export function rolesLabel(roles: { proxy: boolean; worker: boolean }): string {
  if (roles.proxy && roles.worker) return 'proxy + worker';
  if (roles.proxy) return 'proxy';
  if (roles.worker) return 'worker';
  return 'no role';
}

const OWN_WORKER_LABEL: Record<OwnWorkerState, [string, Tone]> = {
  off: ['off', 'muted'],
  connecting: ['connecting…', 'warn'],
  connected: ['connected', 'ok'],
  disconnected: ['disconnected', 'bad'],
  drained: ['drained by the proxy', 'warn'],
};

export function workerTone(state: WorkerState): Tone {
  switch (state) {
    case 'idle':
      return 'ok';
    case 'busy':
      return 'busy';
    case 'draining':
      return 'warn';
    default:
      return 'muted';
  }
}

/** Map a Status to the dashboard's rows and labels; `nowMs` is the viewer's clock. */
/** Why a request went where it runs, as the request view says it. */
export const REASON_LABEL: Record<NonNullable<InFlightReason>, string> = {
  cache_hit: 'cache hit (its conversation is there)',
  home_busy: 'home busy (moved, once)',
  new_conversation: 'new conversation',
  least_loaded: 'least loaded',
  faster_box: 'faster box (measured)',
  waking: 'waited for its box to wake',
  side_request: 'side request (kept off the conversations\' slots)',
};

type InFlightReason = Status['in_flight'][number]['reason'];

/** A reason in a count of placements ("cache hit 360"). */
const REASON_SHORT: Record<NonNullable<InFlightReason>, string> = {
  cache_hit: 'cache hit',
  home_busy: 'home busy',
  new_conversation: 'new conversation',
  least_loaded: 'least loaded',
  faster_box: 'faster box',
  waking: 'waking',
  side_request: 'side request',
};

/** Placements since start by reason, the ones that happened, and whether cost routing is on. */
export function placementsLabel(placements: Status['placements'] | undefined): string {
  const counted = (placements?.by_reason ?? []).filter((p) => p.count > 0);
  if (counted.length === 0) return '';
  const parts = counted.map((p) => `${REASON_SHORT[p.reason]} ${formatCount(p.count)}`);
  parts.push(`cost routing ${placements?.cost_routing ? 'on' : 'off'}`);
  return parts.join(' · ');
}
type Weighed = NonNullable<Status['in_flight'][number]['weighed']>;

/** Estimated seconds, as the request view shows them ("4.1 s", "21 s"). */
function estimate(secs: number): string {
  return secs < 10 ? `${secs.toFixed(1)} s` : `${Math.round(secs)} s`;
}

/**
 * What cost routing weighed, in words. Moved: "first token ≈ 0.3 s here, ≈ 6.3 s on slow-box ·
 * answer ≈ 2.6 s sooner". Kept: "first token ≈ 20 s here; ≈ 12 s on fast-box, not clearly
 * sooner" — only where the other was sooner at something (a request kept on the box that is
 * sooner anyway needs no second line). Estimates, so a placement that looks wrong can be read
 * rather than guessed at.
 */
export function weighedLabel(w: Weighed | null): string {
  if (w == null) return '';
  // Kept where the other box was no sooner in any way: nothing to explain.
  if (w.kept && w.other_s >= w.first_token_s && w.answer_s <= 0) return '';
  const there = w.other != null ? `on ${w.other}` : 'waiting for a slot';
  const parts = [
    w.kept
      ? `first token ≈ ${estimate(w.first_token_s)} here; ≈ ${estimate(w.other_s)} ${there}, not clearly sooner`
      : `first token ≈ ${estimate(w.first_token_s)} here, ≈ ${estimate(w.other_s)} ${there}`,
  ];
  if (Math.abs(w.answer_s) >= 0.05) {
    parts.push(`answer ≈ ${estimate(Math.abs(w.answer_s))} ${w.answer_s < 0 ? 'sooner' : 'later'} here`);
  }
  if (w.eviction_s >= 0.05) {
    const where = w.kept ? `${there} ` : '';
    parts.push(`≈ ${estimate(w.eviction_s)} ${where}for the conversation it ${w.kept ? 'would evict' : 'evicts'}`);
  }
  return parts.join(' · ');
}

/** "prompt 2,000 tok/s · generation 45 tok/s", what of it is measured ("" for nothing). */
export function speedLabel(prompt: number | null, generation: number | null): string {
  const parts: string[] = [];
  if (prompt != null) parts.push(`prompt ${formatCount(Math.round(prompt))} tok/s`);
  if (generation != null) parts.push(`generation ${formatCompact(generation, 1)} tok/s`);
  return parts.join(' · ');
}

export function toDashboardView(status: Status, nowMs: number): DashboardView {
  const { node } = status;
  const workerNames = new Map<string, string>();
  for (const w of status.workers) workerNames.set(w.id, w.name || w.id);
  const nameOf = (id: string | null) => (id == null ? DASH : (workerNames.get(id) ?? id));

  const [ownLabel, ownTone] = OWN_WORKER_LABEL[node.worker.state] ?? [node.worker.state, 'muted'];

  const workers: WorkerRow[] = [...status.workers]
    .sort((a, b) => a.name.localeCompare(b.name) || a.id.localeCompare(b.id))
    .map((w) => ({
      id: w.id,
      name: w.name || w.id,
      host: w.host || DASH,
      provider: w.provider,
      models: w.models,
      windows: Object.fromEntries(
        Object.entries(w.context_windows ?? {}).map(([model, tokens]) => [model, tokensLabel(tokens)]),
      ),
      speeds: Object.fromEntries(
        Object.entries(w.speeds ?? {})
          .map(([model, s]) => [model, speedLabel(s.prompt_tps, s.generation_tps)] as const)
          .filter(([, label]) => label !== ''),
      ),
      modelsLabel: w.models.length ? w.models.join(', ') : 'none',
      load: w.load,
      maxConcurrent: w.max_concurrent,
      loadLabel: `${w.load} / ${w.max_concurrent}`,
      loadFraction: w.max_concurrent > 0 ? Math.min(1, Math.max(0, w.load / w.max_concurrent)) : 0,
      state: w.state,
      tone: workerTone(w.state),
      connectedSince: formatSince(w.connected_unix_ms, nowMs),
      connectedAt: formatDateTime(w.connected_unix_ms),
      heartbeat: formatLatency(w.heartbeat_ms),
      canDrain: w.state !== 'draining',
      hardware: toHardwareView(w),
    }));

  const models: ModelRow[] = [...status.models]
    .sort((a, b) => a.name.localeCompare(b.name) || a.provider.localeCompare(b.provider))
    .map((m) => {
      const names = m.workers.map((id) => nameOf(id));
      return {
        name: m.name,
        provider: m.provider,
        workerNames: names,
        workersLabel: names.length
          ? names.join(', ')
          : asleepOn(status, m.name).length
            ? `asleep: ${asleepOn(status, m.name).join(', ')} (a request wakes it)`
            : 'no worker (queueing)',
      };
    });

  const queues = status.queues.map((q) => ({ provider: q.provider, depth: q.depth }));

  // A request waiting for a name nobody serves waits for a worker to bring it (models_update)
  // until its queue timeout: say so, with the name it asked for beside it.
  const servedNow = new Set(status.models.filter((m) => m.workers.length > 0).map((m) => m.name));
  const inFlight: InFlightRow[] = [...status.in_flight]
    .sort((a, b) => b.age_ms - a.age_ms || a.id.localeCompare(b.id))
    .slice(0, MAX_IN_FLIGHT_ROWS)
    .map((r) => ({
      id: r.id,
      model: r.model,
      provider: r.provider,
      worker: r.worker != null ? nameOf(r.worker) : servedNow.has(r.model) ? 'queued' : 'no worker serves this name yet',
      state: r.state,
      streaming: r.streaming,
      age: formatDuration(r.age_ms),
      ttft: formatDuration(r.ttft_ms),
      tokens: formatCount(r.tokens),
      tokensPerSec: formatRate(r.tokens_per_sec, 'tok/s'),
      reason: r.reason ? REASON_LABEL[r.reason] : '',
      weighed: weighedLabel(r.weighed),
    }));

  const t = status.totals;
  const errorRate = t.requests > 0 ? `${formatCompact((100 * t.errors) / t.requests, 1)}%` : DASH;

  const served = Array.from(new Set(status.models.filter((m) => m.workers.length > 0).map((m) => m.name))).sort();

  return {
    node: {
      url: node.url,
      version: node.version,
      listen: node.listen,
      roles: rolesList(node.roles),
      rolesLabel: rolesLabel(node.roles),
      uptime: formatUptime(node.uptime_secs),
      adminTokenRequired: node.admin_token_required,
      ownWorker: {
        state: node.worker.state,
        label: ownLabel,
        tone: ownTone,
        proxyUrl: node.worker.proxy_url,
        name: node.worker.name,
        // Why the last connection ended: news while it is down, history once it is back.
        lastError: node.worker.state === 'connected' ? null : node.worker.last_error,
      },
    },
    workers,
    models,
    queues,
    queueDepthTotal: queues.reduce((s, q) => s + q.depth, 0),
    inFlight,
    inFlightTotal: status.in_flight.length,
    placements: placementsLabel(status.placements),
    totals: {
      requests: formatCount(t.requests),
      errors: formatCount(t.errors),
      tokens: formatCount(t.tokens),
      errorRate,
    },
    servedModels: served,
  };
}

/**
 * "Now" for age columns. The browser's clock, unless it disagrees with the relay's by more than
 * a few seconds (a browser on another machine): then the relay's, read from the last point of
 * `series` (one per second).
 */
export function clockFor(status: Pick<Status, 'series'>, browserNowMs: number): number {
  const xs = status.series?.unix_secs ?? [];
  if (!xs.length) return browserNowMs;
  const serverMs = xs[xs.length - 1] * 1000 + 500;
  return Math.abs(browserNowMs - serverMs) > 5000 ? serverMs : browserNowMs;
}

/** The dashboard lists at most this many in-flight requests (oldest first). */
export const MAX_IN_FLIGHT_ROWS = 100;

/** uPlot data for one series: [x (unix secs), y]. Arrays are trimmed to the same length. */
export function seriesData(
  status: Pick<Status, 'series'>,
  key: 'requests_per_sec' | 'tokens_per_sec' | 'errors_per_sec' | 'queue_depth',
): [number[], number[]] {
  const s = status.series;
  const xs = s?.unix_secs ?? [];
  const ys = s?.[key] ?? [];
  const n = Math.min(xs.length, ys.length);
  return [xs.slice(xs.length - n), ys.slice(ys.length - n)];
}

export interface LifecycleRow {
  name: string;
  state: string;
  tone: Tone;
  detail: string;
  lastUsed: string;
  restarts: number;
  crashes: number;
  inFlight: number;
  lastError: string | null;
  canLoad: boolean;
  canUnload: boolean;
}

export function lifecycleTone(state: string): Tone {
  const s = state.toLowerCase();
  if (s === 'ready' || s === 'loaded' || s === 'running') return 'ok';
  if (s === 'starting' || s === 'loading' || s === 'stopping') return 'warn';
  if (s.includes('fail') || s.includes('crash') || s.includes('broken') || s.includes('open')) return 'bad';
  return 'muted';
}

/** The sleeping boxes that serve `model`. */
function asleepOn(status: Pick<Status, 'sleepers'>, model: string): string[] {
  return (status.sleepers ?? []).filter((s) => s.models.includes(model)).map((s) => s.name);
}

export interface SleeperRow {
  name: string;
  provider: string;
  models: string[];
  state: 'asleep' | 'waking';
  tone: Tone;
  /** "asleep" or "waking (2 packets)". */
  stateLabel: string;
  asleepFor: string;
  /** How long since the first Wake-on-LAN packet of this attempt; a dash when asleep. */
  wakingFor: string;
  /** Why it is being woken, in words; null when asleep. */
  wakeCause: string | null;
  mac: string;
}

/** Why the proxy wakes a box, as the dashboard says it. */
const WAKE_CAUSES: Record<NonNullable<Status['sleepers'][number]['wake_cause']>, string> = {
  nothing_awake: 'a request for a model no awake box serves',
  first_token_sooner: 'a long prompt, answered sooner there once awake',
  slot_wait: 'a request would wait longer for a slot than the wake takes',
  queue_waited: 'requests have waited, together, as long as the wake takes',
};

/** The sleeping boxes, waking ones first, then by name. */
export function toSleeperRows(status: Partial<Pick<Status, 'sleepers'>>, nowMs: number): SleeperRow[] {
  return [...(status.sleepers ?? [])]
    .sort((a, b) => Number(b.state === 'waking') - Number(a.state === 'waking') || a.name.localeCompare(b.name))
    .map((s) => ({
      name: s.name,
      provider: s.provider,
      models: s.models,
      state: s.state,
      tone: s.state === 'waking' ? 'warn' : 'muted',
      stateLabel:
        s.state === 'waking' ? `waking (${s.wake_packets} packet${s.wake_packets === 1 ? '' : 's'})` : 'asleep',
      asleepFor: formatSince(s.since_unix_ms, nowMs),
      wakingFor: s.state === 'waking' ? formatSince(s.waking_since_unix_ms, nowMs) : DASH,
      wakeCause: s.state === 'waking' && s.wake_cause ? WAKE_CAUSES[s.wake_cause] : null,
      mac: s.mac_address ?? 'unknown (cannot be woken)',
    }));
}

/** What the dashboard says when the proxy's database refuses writes (null while all is well). */
export interface StorageNotice {
  problem: string;
  since: string;
  notStored: string;
}

export function toStorageNotice(status: Partial<Pick<Status, 'storage'>>, nowMs: number): StorageNotice | null {
  const storage = status.storage;
  if (!storage || storage.writable) return null;
  const lost = storage.usage_records_not_stored;
  return {
    problem: storage.problem ?? 'the database refuses writes',
    since: storage.since_unix_ms != null ? `for ${formatSince(storage.since_unix_ms, nowMs)}` : 'since start',
    notStored:
      lost === 0
        ? 'No usage lost yet.'
        : `Usage of ${lost} finished request${lost === 1 ? '' : 's'} could not be stored.`,
  };
}

const STOPPED_STATES = new Set(['stopped', 'unloaded', 'idle', 'off', 'not_loaded', 'cold']);

export function toLifecycleRows(models: ModelStatus[], nowMs: number): LifecycleRow[] {
  return [...models]
    .sort((a, b) => a.name.localeCompare(b.name))
    .map((m) => {
      const stopped = STOPPED_STATES.has(m.state.toLowerCase());
      const parts: string[] = [];
      if (m.port != null) parts.push(`port ${m.port}`);
      if (m.pid != null) parts.push(`pid ${m.pid}`);
      if (m.retry_in_secs != null) parts.push(`retry in ${formatUptime(m.retry_in_secs)}`);
      // What a request sent while it is unloaded waits first (cost routing weighs it too).
      if (m.last_load_ms != null) parts.push(`loads in ${(m.last_load_ms / 1000).toFixed(1)} s`);
      return {
        name: m.name,
        state: m.state,
        tone: lifecycleTone(m.state),
        detail: parts.join(' · ') || DASH,
        lastUsed: m.last_used_unix_ms ? `${formatSince(m.last_used_unix_ms, nowMs)} ago` : 'never',
        restarts: m.restarts,
        crashes: m.crashes,
        inFlight: m.in_flight,
        lastError: m.last_error,
        canLoad: stopped || lifecycleTone(m.state) === 'bad',
        canUnload: !stopped,
      };
    });
}

/** A context window as people say it: 4096 → "4k", 131072 → "128k", 1500 → "1.5k". */
export function tokensLabel(tokens: number): string {
  if (tokens < 1000) return String(tokens);
  const k = tokens / 1024;
  return `${Number.isInteger(k) ? k : Math.round(k * 10) / 10}k`;
}
