// The control API client: base URL (same origin, or the desktop app's relay), admin token,
// JSON calls with the OpenAI error shape, and the live status feed (SSE).

import type {
  ApiKey,
  CreatedApiKey,
  Discovery,
  JoinCodeInfo,
  JoinTestResult,
  ModelStatus,
  NewApiKey,
  RelayInfo,
  SettingsPatch,
  SettingsResponse,
  Status,
  UsageReport,
} from './types';

export const TOKEN_KEY = 'modelrelay.adminToken';

interface TauriGlobal {
  core: { invoke<T>(cmd: string, args?: Record<string, unknown>): Promise<T> };
}

declare global {
  interface Window {
    __TAURI__?: TauriGlobal;
  }
}

export function tauri(): TauriGlobal | null {
  return typeof window !== 'undefined' && window.__TAURI__?.core ? window.__TAURI__ : null;
}

export function isTauri(): boolean {
  return tauri() !== null;
}

let baseUrl = '';
let token: string | null = null;
const unauthorizedListeners = new Set<() => void>();

function readStoredToken(): string | null {
  try {
    return localStorage.getItem(TOKEN_KEY);
  } catch {
    return null;
  }
}

/** Find the API: same origin in a browser; in the desktop app, ask it where its relay is. */
export async function initApi(): Promise<void> {
  token = readStoredToken();
  const t = tauri();
  if (t) {
    const info = await t.core.invoke<RelayInfo>('relay_info');
    baseUrl = info.url.replace(/\/+$/, '');
    if (info.admin_token) token = info.admin_token;
  }
}

export function apiBase(): string {
  return baseUrl;
}

export function getToken(): string | null {
  return token;
}

export function setToken(value: string | null): void {
  token = value && value.trim() ? value.trim() : null;
  try {
    if (token) localStorage.setItem(TOKEN_KEY, token);
    else localStorage.removeItem(TOKEN_KEY);
  } catch {
    /* storage may be unavailable (private mode); the token still lives in memory */
  }
}

/**
 * Asked for the admin token when a change needs it even on loopback (it makes the node run a
 * program or send a secret elsewhere): given the relay's message (which says where the token
 * file is), resolves to the token to retry with, or null when the person cancels.
 */
type ElevationHandler = (message: string) => Promise<string | null>;
let elevationHandler: ElevationHandler | null = null;

/** The code of a 403 that a retry with the admin token can turn into a success. */
export const ELEVATION_CODE = 'admin_token_needed';

export function onElevationNeeded(handler: ElevationHandler): () => void {
  elevationHandler = handler;
  return () => {
    if (elevationHandler === handler) elevationHandler = null;
  };
}

/** Called when any API call answers 401 (the UI then asks for the token). */
export function onUnauthorized(listener: () => void): () => void {
  unauthorizedListeners.add(listener);
  return () => unauthorizedListeners.delete(listener);
}

function notifyUnauthorized() {
  for (const l of unauthorizedListeners) l();
}

export class ApiError extends Error {
  constructor(
    message: string,
    readonly status: number,
    readonly code: string | null = null,
    readonly type: string | null = null,
  ) {
    super(message);
    this.name = 'ApiError';
  }
}

function authHeaders(tokenOverride?: string | null): Record<string, string> {
  const t = tokenOverride === undefined ? token : tokenOverride;
  return t ? { Authorization: `Bearer ${t}` } : {};
}

async function errorFrom(res: Response): Promise<ApiError> {
  let message = `${res.status} ${res.statusText}`.trim();
  let code: string | null = null;
  let type: string | null = null;
  try {
    const text = await res.text();
    try {
      const body = JSON.parse(text);
      const err = body?.error;
      if (err && typeof err.message === 'string') {
        message = err.message;
        code = err.code ?? null;
        type = err.type ?? null;
      } else if (text) {
        message = text;
      }
    } catch {
      if (text) message = text.slice(0, 500);
    }
  } catch {
    /* no body */
  }
  return new ApiError(message, res.status, code, type);
}

async function send(method: string, path: string, body: unknown, tokenOverride?: string | null): Promise<Response> {
  const headers: Record<string, string> = { Accept: 'application/json', ...authHeaders(tokenOverride) };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  try {
    return await fetch(baseUrl + path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: 'no-store',
    });
  } catch (e) {
    throw new ApiError(`Cannot reach the relay (${(e as Error).message || 'network error'}).`, 0);
  }
}

export async function request<T>(method: string, path: string, body?: unknown): Promise<T> {
  let res = await send(method, path, body);
  // A guarded change: ask for the token (the message says where it is) and retry with it, as
  // long as the person keeps offering tokens; a refused one comes back with its own message.
  while (res.status === 403 && elevationHandler) {
    const err = await errorFrom(res);
    if (err.code !== ELEVATION_CODE) throw err;
    const offered = await elevationHandler(err.message);
    if (!offered) throw err;
    res = await send(method, path, body, offered);
    // Any answer but a refusal means the guard took the token: keep it, even when the change
    // itself failed (a 400 for a bad field), so fixing the field does not ask again.
    if (res.status !== 401 && res.status !== 403) setToken(offered);
  }
  if (res.status === 401) {
    const err = await errorFrom(res);
    notifyUnauthorized();
    throw err;
  }
  if (!res.ok) throw await errorFrom(res);
  if (res.status === 204) return undefined as T;
  const text = await res.text();
  return (text ? JSON.parse(text) : undefined) as T;
}

/**
 * GET a file (e.g. the usage CSV) as a Blob. A plain link cannot carry the admin token, so the
 * download goes through fetch like every other call, with the same error handling.
 */
export async function requestBlob(path: string): Promise<Blob> {
  const res = await send('GET', path, undefined);
  if (res.status === 401) {
    const err = await errorFrom(res);
    notifyUnauthorized();
    throw err;
  }
  if (!res.ok) throw await errorFrom(res);
  return res.blob();
}

/** Check a token without storing it: true when the API accepts it. */
export async function checkToken(candidate: string): Promise<boolean> {
  const res = await fetch(baseUrl + '/api/status', { headers: authHeaders(candidate), cache: 'no-store' });
  return res.status !== 401;
}

export const api = {
  status: () => request<Status>('GET', '/api/status'),
  drain: (id: string) => request<{ ok: boolean }>('POST', `/api/workers/${encodeURIComponent(id)}/drain`),
  refreshModels: () => request<{ ok: boolean; workers: number }>('POST', '/api/models/refresh'),
  /** This node's own worker joins its proxy again after the proxy drained it. */
  rejoinWorker: () => request<{ ok: boolean }>('POST', '/api/worker/rejoin'),
  lifecycleAction: (model: string, action: 'load' | 'unload') =>
    request<{ ok: boolean; model: ModelStatus }>('POST', `/api/lifecycle/${encodeURIComponent(model)}/${action}`),
  discovery: () => request<Discovery>('GET', '/api/discovery'),
  joinCode: () => request<JoinCodeInfo>('GET', '/api/join-code'),
  joinTest: (body: JoinRequest) => request<JoinTestResult>('POST', '/api/join/test', body),
  join: (body: JoinRequest) => request<SettingsResponse>('POST', '/api/join', body),
  settings: () => request<SettingsResponse>('GET', '/api/settings'),
  saveSettings: (patch: SettingsPatch) => request<SettingsResponse>('PUT', '/api/settings', patch),
  saveConfig: (toml: string) => request<SettingsResponse>('PUT', '/api/config', { toml }),
  keys: () => request<{ keys: ApiKey[] }>('GET', '/api/keys'),
  createKey: (body: NewApiKey) => request<CreatedApiKey>('POST', '/api/keys', body),
  revokeKey: (id: string) => request<{ id: string; revoked: boolean }>('DELETE', `/api/keys/${encodeURIComponent(id)}`),
  /** `query` comes from usageQuery() in lib/usage.ts (without the leading "?"). */
  usage: (query: string) => request<UsageReport>('GET', `/api/usage${query ? `?${query}` : ''}`),
  usageCsv: (query: string) => requestBlob(`/api/usage${query ? `?${query}` : ''}`),
};

export type JoinRequest = { proxy_url: string; secret: string; provider?: string; fingerprint?: string } | { code: string };

/** The URL of the live feed (EventSource cannot send headers, so the token goes in the query). */
export function eventsUrl(): string {
  const t = token;
  return `${baseUrl}/api/events${t ? `?token=${encodeURIComponent(t)}` : ''}`;
}

/** Whether the last failure of the feed was a refused token (EventSource hides the status). */
export async function probeUnauthorized(): Promise<boolean> {
  try {
    const res = await fetch(baseUrl + '/api/status', { headers: authHeaders(), cache: 'no-store' });
    if (res.status === 401) {
      notifyUnauthorized();
      return true;
    }
  } catch {
    /* unreachable: not a token problem */
  }
  return false;
}

export function errorMessage(e: unknown): string {
  if (e instanceof ApiError) return e.message;
  if (e instanceof Error) return e.message;
  return String(e);
}
