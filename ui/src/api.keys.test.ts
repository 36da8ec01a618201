// The key and usage calls against a stubbed fetch: method, path, body, and the error shape.
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { ApiError, api, getToken, onElevationNeeded, onUnauthorized, setToken } from './api';

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

  it('asks for the admin token when the CSV is refused with 401', async () => {
    answer(401, { error: { message: 'the control API needs the admin token', type: 'authentication_error', code: null } });
    const asked = vi.fn();
    const stop = onUnauthorized(asked);
    await expect(api.usageCsv('format=csv')).rejects.toMatchObject({ status: 401 });
    expect(asked).toHaveBeenCalledOnce();
    stop();
  });
});

describe('a key change that needs the admin token', () => {
  it('retries with the offered token and keeps it even when the change is refused for a field', async () => {
    const answers = [
      new Response(JSON.stringify({ error: { message: 'Creating an API key needs the admin token', type: 'x', code: 'admin_token_needed' } }), { status: 403 }),
      new Response(JSON.stringify({ error: { message: '`max_concurrent` must be 1 to 100000', type: 'x', code: 'invalid_request' } }), { status: 400 }),
    ];
    vi.stubGlobal(
      'fetch',
      vi.fn(async (url: string, init: RequestInit) => {
        calls.push({ url, init });
        return answers.shift()!;
      }),
    );
    setToken(null);
    const stop = onElevationNeeded(async () => 'the-token');
    const err = await api.createKey({ name: 'x', max_concurrent: 200000 }).catch((e) => e);
    stop();
    expect(err.message).toBe('`max_concurrent` must be 1 to 100000');
    expect((calls[1].init.headers as Record<string, string>).Authorization).toBe('Bearer the-token');
    expect(getToken()).toBe('the-token');
    setToken(null);
  });

  it('does not keep a token the relay refused', async () => {
    const refused = () =>
      new Response(JSON.stringify({ error: { message: 'Wrong admin token', type: 'x', code: 'admin_token_needed' } }), { status: 403 });
    vi.stubGlobal('fetch', vi.fn(async () => refused()));
    setToken(null);
    let offers = 0;
    const stop = onElevationNeeded(async () => (offers++ === 0 ? 'wrong' : null));
    await expect(api.revokeKey('key_1')).rejects.toMatchObject({ status: 403 });
    stop();
    expect(getToken()).toBeNull();
  });
});
