// The settings form: Settings ⇄ editable strings, and the PUT /api/settings patch of what changed.

import type { SettingsPatch, SettingsValues } from '../types';

export interface AliasRow {
  key: number;
  pattern: string;
  model: string;
}

export interface SettingsForm {
  proxyRole: boolean;
  workerRole: boolean;
  listen: string;
  provider: string;
  maxQueueLen: string;
  queueTimeoutSecs: string;
  requestTimeoutSecs: string;
  defaultModel: string;
  aliases: AliasRow[];
  proxyUrl: string;
  workerSecret: string;
  workerName: string;
  backendUrl: string;
  models: string;
  maxConcurrency: string;
}

/** Field names as the API names them, used to show a server error next to its field. */
export const FIELD_PATHS: Record<keyof SettingsForm, string> = {
  proxyRole: 'roles.proxy',
  workerRole: 'roles.worker',
  listen: 'proxy.listen',
  provider: 'proxy.provider',
  maxQueueLen: 'proxy.max_queue_len',
  queueTimeoutSecs: 'proxy.queue_timeout_secs',
  requestTimeoutSecs: 'proxy.request_timeout_secs',
  defaultModel: 'proxy.default_model',
  aliases: 'proxy.aliases',
  proxyUrl: 'worker.proxy_url',
  workerSecret: 'worker.worker_secret',
  workerName: 'worker.worker_name',
  backendUrl: 'worker.backend_url',
  models: 'worker.models',
  maxConcurrency: 'worker.max_concurrency',
};

let nextKey = 1;
export function newAliasRow(pattern = '', model = ''): AliasRow {
  return { key: nextKey++, pattern, model };
}

export function toForm(s: SettingsValues): SettingsForm {
  return {
    proxyRole: s.roles.proxy,
    workerRole: s.roles.worker,
    listen: s.proxy.listen ?? '',
    provider: s.proxy.provider ?? '',
    maxQueueLen: String(s.proxy.max_queue_len ?? ''),
    queueTimeoutSecs: String(s.proxy.queue_timeout_secs ?? ''),
    requestTimeoutSecs: String(s.proxy.request_timeout_secs ?? ''),
    defaultModel: s.proxy.default_model ?? '',
    aliases: Object.entries(s.proxy.aliases ?? {}).map(([p, m]) => newAliasRow(p, m)),
    proxyUrl: s.worker.proxy_url ?? '',
    workerSecret: '',
    workerName: s.worker.worker_name ?? '',
    backendUrl: s.worker.backend_url ?? '',
    models: (s.worker.models ?? []).join(', '),
    maxConcurrency: String(s.worker.max_concurrency ?? ''),
  };
}

export type FieldErrors = Partial<Record<keyof SettingsForm, string>>;

function parseCount(value: string, min: number): number | null {
  const t = value.trim();
  if (!/^\d+$/.test(t)) return null;
  const n = Number(t);
  return Number.isSafeInteger(n) && n >= min ? n : null;
}

const nullable = (v: string): string | null => (v.trim() === '' ? null : v.trim());

export function parseModels(v: string): string[] | null {
  const list = v
    .split(/[,\n]/)
    .map((m) => m.trim())
    .filter(Boolean);
  return list.length ? list : null;
}

export function aliasesOf(rows: AliasRow[]): { map: Record<string, string>; error: string | null } {
  const map: Record<string, string> = {};
  for (const r of rows) {
    const p = r.pattern.trim();
    const m = r.model.trim();
    if (!p && !m) continue;
    if (!p) return { map, error: `The alias for "${m}" needs a name or pattern.` };
    if (!m) return { map, error: `The alias "${p}" needs a model to map to.` };
    if (p in map) return { map, error: `The alias "${p}" is listed twice.` };
    map[p] = m;
  }
  return { map, error: null };
}

function sameMap(a: Record<string, string>, b: Record<string, string>): boolean {
  const ka = Object.keys(a);
  const kb = Object.keys(b);
  return ka.length === kb.length && ka.every((k) => b[k] === a[k]);
}

function sameList(a: string[] | null, b: string[] | null): boolean {
  if (a === null || b === null) return a === b;
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

/**
 * The patch for what changed between `orig` and the form, or the field errors that stop it.
 * Unchanged fields are left out, so saving never rewrites what the user did not touch.
 */
export function buildPatch(
  orig: SettingsValues,
  f: SettingsForm,
): { patch: SettingsPatch; errors: FieldErrors; changed: boolean } {
  const errors: FieldErrors = {};
  const patch: SettingsPatch = {};

  const roles: Partial<SettingsValues['roles']> = {};
  if (f.proxyRole !== orig.roles.proxy) roles.proxy = f.proxyRole;
  if (f.workerRole !== orig.roles.worker) roles.worker = f.workerRole;
  if (Object.keys(roles).length) patch.roles = roles;

  const proxy: NonNullable<SettingsPatch['proxy']> = {};
  if (!f.listen.trim()) errors.listen = 'Enter an address, e.g. 127.0.0.1:8080.';
  else if (f.listen.trim() !== orig.proxy.listen) proxy.listen = f.listen.trim();
  if (!f.provider.trim()) errors.provider = 'Enter a provider name (default: local).';
  else if (f.provider.trim() !== orig.proxy.provider) proxy.provider = f.provider.trim();

  const counts: [keyof SettingsForm, 'max_queue_len' | 'queue_timeout_secs' | 'request_timeout_secs', number][] = [
    ['maxQueueLen', 'max_queue_len', 0],
    ['queueTimeoutSecs', 'queue_timeout_secs', 1],
    ['requestTimeoutSecs', 'request_timeout_secs', 1],
  ];
  for (const [field, key, min] of counts) {
    const n = parseCount(f[field] as string, min);
    if (n === null) errors[field] = min > 0 ? 'Enter a whole number of at least 1.' : 'Enter a whole number.';
    else if (n !== orig.proxy[key]) proxy[key] = n;
  }
  const dm = nullable(f.defaultModel);
  if (dm !== (orig.proxy.default_model ?? null)) proxy.default_model = dm;
  const aliases = aliasesOf(f.aliases);
  if (aliases.error) errors.aliases = aliases.error;
  else if (!sameMap(aliases.map, orig.proxy.aliases ?? {})) proxy.aliases = aliases.map;
  if (Object.keys(proxy).length) patch.proxy = proxy;

  const worker: NonNullable<SettingsPatch['worker']> = {};
  const pu = nullable(f.proxyUrl);
  if (pu !== null && !/^(https?|wss?):\/\/\S+$/i.test(pu)) errors.proxyUrl = 'Enter a URL starting with http:// or https://.';
  else if (pu !== (orig.worker.proxy_url ?? null)) worker.proxy_url = pu;
  if (f.workerSecret !== '') worker.worker_secret = f.workerSecret;
  const wn = nullable(f.workerName);
  if (wn !== (orig.worker.worker_name ?? null)) worker.worker_name = wn;
  const bu = nullable(f.backendUrl);
  if (bu !== (orig.worker.backend_url ?? null)) worker.backend_url = bu;
  const models = parseModels(f.models);
  if (!sameList(models, orig.worker.models ?? null)) worker.models = models;
  const mc = parseCount(f.maxConcurrency, 1);
  if (mc === null) errors.maxConcurrency = 'Enter a whole number of at least 1.';
  else if (mc !== orig.worker.max_concurrency) worker.max_concurrency = mc;
  if (Object.keys(worker).length) patch.worker = worker;

  return { patch, errors, changed: Object.keys(patch).length > 0 };
}

/** Which form field a server validation message names, if any. */
export function fieldOfMessage(message: string): keyof SettingsForm | null {
  let best: keyof SettingsForm | null = null;
  let bestLen = 0;
  for (const [field, path] of Object.entries(FIELD_PATHS) as [keyof SettingsForm, string][]) {
    const leaf = path.split('.')[1];
    // Plain words ("proxy", "listen") appear in many messages; only distinctive leaves count.
    const needles = leaf.includes('_') ? [path, leaf] : [path];
    for (const needle of needles) {
      if (needle.length > bestLen && new RegExp(`(^|[^a-z_])${needle.replace('.', '\\.')}([^a-z_]|$)`).test(message)) {
        best = field;
        bestLen = needle.length;
      }
    }
  }
  return best;
}
