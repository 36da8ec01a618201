// The key and usage calls against a stubbed fetch: method, path, body, and the error shape.
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { ApiError, api, onUnauthorized, signIn } from './api';

type Call = { url: string; init: RequestInit };
let calls: Call[] = [];

function answer(status: number, body: unknown, contentType = 'application/json') {
  const text = typeof body === 'string' ? body : JSON.stringify(body);
  vi.stubGlobal(
    'fetch',
    vi.fn(async (url: string, init: RequestInit) => {
      calls.push({ url, init });
      return new Response(text, { status, headers: { 'content-type': contentType } });
    }),
  );
}

beforeEach(() => {
  calls = [];
});
afterEach(() => {
  vi.unstubAllGlobals();
});

const KEY = {
  id: 'key_1',
  name: 'production-app',
  prefix: 'mr-AbCd',
  created_at: '2026-11-25T12:00:00Z',
  revoked_at: null,
  last_used_at: null,
  models: ['llama3'],
  max_concurrent: 4,
  requests_per_minute: 60,
};

describe('keys API', () => {
  it('lists keys', async () => {
    answer(200, { keys: [KEY] });
    expect((await api.keys()).keys[0].name).toBe('production-app');
    expect(calls[0].url).toBe('/api/keys');
    expect(calls[0].init.method).toBe('GET');
  });

  it('creates a key with a JSON body and gets the secret back', async () => {
    answer(201, { ...KEY, key: 'mr-AbCdsecret' });
    const created = await api.createKey({ name: 'production-app', models: ['llama3'], max_concurrent: 4 });
    expect(created.key).toBe('mr-AbCdsecret');
    expect(calls[0].init.method).toBe('POST');
    expect(JSON.parse(calls[0].init.body as string)).toEqual({ name: 'production-app', models: ['llama3'], max_concurrent: 4 });
    expect((calls[0].init.headers as Record<string, string>)['Content-Type']).toBe('application/json');
  });

  it('turns a 400 into the relay’s precise message', async () => {
    answer(400, { error: { message: 'max_concurrent must be at least 1', type: 'invalid_request_error', code: 'invalid_field' } });
    const err = await api.createKey({ name: 'x', max_concurrent: 0 }).catch((e) => e);
    expect(err).toBeInstanceOf(ApiError);
    expect(err.message).toBe('max_concurrent must be at least 1');
    expect(err.status).toBe(400);
    expect(err.code).toBe('invalid_field');
  });

  it('revokes by id, escaped into the path', async () => {
    answer(200, { id: 'key_1/x', revoked: true });
    expect(await api.revokeKey('key_1/x')).toEqual({ id: 'key_1/x', revoked: true });
    expect(calls[0].url).toBe('/api/keys/key_1%2Fx');
    expect(calls[0].init.method).toBe('DELETE');
  });

  it('reports an unknown key', async () => {
    answer(404, { error: { message: 'no key key_9', type: 'not_found_error', code: null } });
    await expect(api.revokeKey('key_9')).rejects.toMatchObject({ status: 404, message: 'no key key_9' });
  });
});

describe('usage API', () => {
  it('passes the query string through', async () => {
    answer(200, { group_by: 'key', since: '2026-11-01', until: '2026-11-25', rows: [], totals: { requests: 0, errors: 0, input_tokens: 0, output_tokens: 0 } });
    const report = await api.usage('key=key_1&group_by=key');
    expect(report.group_by).toBe('key');
    expect(calls[0].url).toBe('/api/usage?key=key_1&group_by=key');
  });

  it('downloads the CSV as a blob', async () => {
    answer(200, 'group,requests\n2026-11-25,3\n', 'text/csv');
    const blob = await api.usageCsv('group_by=day&format=csv');
    expect(await blob.text()).toBe('group,requests\n2026-11-25,3\n');
    expect(calls[0].url).toBe('/api/usage?group_by=day&format=csv');
  });

  it('asks the person to sign in when the CSV is refused with 401', async () => {
    answer(401, { error: { message: 'the control API needs the admin token', type: 'authentication_error', code: null } });
    const asked = vi.fn();
    const stop = onUnauthorized(asked);
    await expect(api.usageCsv('format=csv')).rejects.toMatchObject({ status: 401 });
    expect(asked).toHaveBeenCalledOnce();
    stop();
  });
});

describe('signing in', () => {
  it('posts the token once and sends no credential of its own afterwards (the cookie is the session)', async () => {
    answer(200, { ok: true });
    expect(await signIn('the-token')).toBe(true);
    expect(calls[0].url).toBe('/api/login');
    expect(calls[0].init.method).toBe('POST');
    expect(JSON.parse(calls[0].init.body as string)).toEqual({ token: 'the-token' });
    await api.keys();
    const headers = calls[1].init.headers as Record<string, string>;
    expect(headers.Authorization).toBeUndefined();
    expect(calls[1].init.credentials).toBe('same-origin');
    expect(JSON.stringify(calls[1])).not.toContain('the-token');
  });

  it('says false for a refused token and throws for anything else', async () => {
    answer(401, { error: { message: 'wrong admin token', type: 'x', code: 'wrong_admin_token' } });
    expect(await signIn('nope')).toBe(false);
    answer(429, { error: { message: 'too many wrong credentials from this address; retry in 9 s', type: 'x', code: 'auth_rate_limited' } });
    await expect(signIn('nope')).rejects.toMatchObject({ status: 429, message: expect.stringContaining('retry in 9 s') });
  });
});
