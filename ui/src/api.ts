// The control API client: same-origin JSON calls with the OpenAI error shape, signing in and
// out (the session is an HttpOnly cookie), and the live status feed (SSE).

import type {
  ApiKey,
  StartOnLoginState,
  CreatedApiKey,
  Discovery,
  JoinCodeInfo,
  JoinRequest,
  JoinTestResult,
  ModelStatus,
  NewApiKey,
  SettingsPatch,
  SettingsResponse,
  Status,
  UsageReport,
} from './types';

/** Where an earlier version kept the admin token; cleared at start (the page keeps none now). */
const OLD_TOKEN_KEY = 'modelrelay.adminToken';

const unauthorizedListeners = new Set<() => void>();

/**
 * Start the client. The page is always served by the node it manages (in the desktop app too),
 * so the API is same-origin and the session cookie (HttpOnly: this script never sees it) is
 * the only credential it sends. The page never holds the admin token.
 */
export async function initApi(): Promise<void> {
  try {
    localStorage.removeItem(OLD_TOKEN_KEY);
  } catch {
    /* storage may be unavailable (private mode) */
  }
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

async function send(method: string, path: string, body: unknown): Promise<Response> {
  const headers: Record<string, string> = { Accept: 'application/json' };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  try {
    return await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: 'no-store',
      credentials: 'same-origin',
    });
  } catch (e) {
    throw new ApiError(`Cannot reach the relay (${(e as Error).message || 'network error'}).`, 0);
  }
}

async function checked(res: Response): Promise<Response> {
  if (res.status === 401) {
    const err = await errorFrom(res);
    notifyUnauthorized();
    throw err;
  }
  if (!res.ok) throw await errorFrom(res);
  return res;
}

export async function request<T>(method: string, path: string, body?: unknown): Promise<T> {
  const res = await checked(await send(method, path, body));
  if (res.status === 204) return undefined as T;
  const text = await res.text();
  return (text ? JSON.parse(text) : undefined) as T;
}

/** GET a file (e.g. the usage CSV) as a Blob, with the same session and error handling. */
export async function requestBlob(path: string): Promise<Blob> {
  return (await checked(await send('GET', path, undefined))).blob();
}

/**
 * Sign in with the admin token: the relay answers with the session cookie, and the token is
 * forgotten here at once. False when the token was refused; throws when the relay said
 * something else (e.g. too many tries).
 */
export async function signIn(token: string): Promise<boolean> {
  const res = await send('POST', '/api/login', { token });
  if (res.status === 401) return false;
  if (!res.ok) throw await errorFrom(res);
  return true;
}

/** End this browser's session. */
export async function signOut(): Promise<void> {
  await send('POST', '/api/logout', undefined);
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
  /** Let the worker use model servers another user runs here (the whole list is saved). */
  confirmBackends: (urls: string[]) =>
    request<SettingsResponse>('PUT', '/api/settings', { worker: { confirmed_backends: urls } }),
  saveConfig: (toml: string) => request<SettingsResponse>('PUT', '/api/config', { toml }),
  keys: () => request<{ keys: ApiKey[] }>('GET', '/api/keys'),
  createKey: (body: NewApiKey) => request<CreatedApiKey>('POST', '/api/keys', body),
  revokeKey: (id: string) => request<{ id: string; revoked: boolean }>('DELETE', `/api/keys/${encodeURIComponent(id)}`),
  /** `query` comes from usageQuery() in lib/usage.ts (without the leading "?"). */
  usage: (query: string) => request<UsageReport>('GET', `/api/usage${query ? `?${query}` : ''}`),
  usageCsv: (query: string) => requestBlob(`/api/usage${query ? `?${query}` : ''}`),
  startOnLogin: () => request<StartOnLoginState>('GET', '/api/start-on-login'),
  setStartOnLogin: (enabled: boolean) => request<StartOnLoginState>('PUT', '/api/start-on-login', { enabled }),
};


/** The URL of the live feed (same origin: the session cookie goes with it). */
export function eventsUrl(): string {
  return '/api/events';
}

/** Whether the last failure of the feed was a refusal (EventSource hides the status). */
export async function probeUnauthorized(): Promise<boolean> {
  try {
    const res = await fetch('/api/status', { cache: 'no-store', credentials: 'same-origin' });
    if (res.status === 401) {
      notifyUnauthorized();
      return true;
    }
  } catch {
    /* unreachable: not a sign-in problem */
  }
  return false;
}

export function errorMessage(e: unknown): string {
  if (e instanceof ApiError) return e.message;
  if (e instanceof Error) return e.message;
  return String(e);
}
