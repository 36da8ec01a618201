import { describe, expect, it } from 'vitest';
import type { ApiKey, Status } from '../types';
import {
  EMPTY_KEY_FORM,
  formatAgo,
  limitsLabel,
  parseModelList,
  requiresApiKeys,
  snippetModel,
  sortKeys,
  toggleModel,
  validateKeyForm,
} from './keys';

const key = (over: Partial<ApiKey>): ApiKey => ({
  id: 'key_1',
  name: 'app',
  prefix: 'mr-AbCd',
  created_at: '2026-11-25T12:00:00Z',
  revoked_at: null,
  last_used_at: null,
  models: null,
  max_concurrent: null,
  requests_per_minute: null,
  priority: 'interactive',
  weight: null,
  ...over,
});

describe('the create-key form', () => {
  it('sends only the name when no limit is set', () => {
    expect(validateKeyForm({ ...EMPTY_KEY_FORM, name: '  production-app ' })).toEqual({
      body: { name: 'production-app' },
      errors: {},
    });
  });

  it('sends the allow-list and the limits as numbers', () => {
    const { body, errors } = validateKeyForm({
      name: 'ci',
      models: 'llama3, qwen2.5-7b\nllama3',
      maxConcurrent: ' 4 ',
      requestsPerMinute: '60',
      priority: 'interactive',
      weight: '',
    });
    expect(errors).toEqual({});
    expect(body).toEqual({ name: 'ci', models: ['llama3', 'qwen2.5-7b'], max_concurrent: 4, requests_per_minute: 60 });
  });

  it('sends a weight above 1, nothing for 1 or empty, and refuses what the relay would', () => {
    expect(validateKeyForm({ ...EMPTY_KEY_FORM, name: 'team', weight: '3' }).body).toEqual({ name: 'team', weight: 3 });
    expect(validateKeyForm({ ...EMPTY_KEY_FORM, name: 'team', weight: '1' }).body).toEqual({ name: 'team' });
    expect(validateKeyForm({ ...EMPTY_KEY_FORM, name: 'team', weight: '17' }).errors.weight).toMatch(/16 at most/);
    expect(validateKeyForm({ ...EMPTY_KEY_FORM, name: 'team', weight: '0' }).errors.weight).toMatch(/at least 1/);
    expect(validateKeyForm({ ...EMPTY_KEY_FORM, name: 'team', weight: 'x' }).errors.weight).toMatch(/whole number/);
  });

  it('sends a batch priority, and nothing for the default interactive', () => {
    expect(validateKeyForm({ ...EMPTY_KEY_FORM, name: 'agent', priority: 'batch' }).body).toEqual({
      name: 'agent',
      priority: 'batch',
    });
    expect(validateKeyForm({ ...EMPTY_KEY_FORM, name: 'chat' }).body).toEqual({ name: 'chat' });
  });

  it('names the field that is wrong', () => {
    const { body, errors } = validateKeyForm({
      ...EMPTY_KEY_FORM,
      name: ' ',
      maxConcurrent: '0',
      requestsPerMinute: '1.5',
    });
    expect(body).toBeNull();
    expect(errors.name).toMatch(/name/);
    expect(errors.maxConcurrent).toBe('Concurrent requests must be at least 1 (or empty for no limit).');
    expect(errors.requestsPerMinute).toBe('Requests per minute must be a whole number (or empty for no limit).');
    expect(validateKeyForm({ ...EMPTY_KEY_FORM, name: 'x'.repeat(101) }).errors.name).toMatch(/too long/);
    expect(validateKeyForm({ ...EMPTY_KEY_FORM, name: 'a', maxConcurrent: '-2' }).errors.maxConcurrent).toMatch(/whole number/);
  });

  it('parses and toggles the model allow-list', () => {
    expect(parseModelList(' a,b  c,,\n a ')).toEqual(['a', 'b', 'c']);
    expect(parseModelList('')).toEqual([]);
    expect(toggleModel('a, b', 'c')).toBe('a, b, c');
    expect(toggleModel('a, b, c', 'b')).toBe('a, c');
    expect(toggleModel('', 'llama3')).toBe('llama3');
  });
});

describe('the key list', () => {
  it('shows active keys first, newest first', () => {
    const keys = [
      key({ id: 'old', created_at: '2026-11-01T00:00:00Z' }),
      key({ id: 'revoked', created_at: '2026-11-30T00:00:00Z', revoked_at: '2026-12-01T00:00:00Z' }),
      key({ id: 'new', created_at: '2026-11-20T00:00:00Z' }),
    ];
    expect(sortKeys(keys).map((k) => k.id)).toEqual(['new', 'old', 'revoked']);
    expect(keys.map((k) => k.id)).toEqual(['old', 'revoked', 'new']);
  });

  it('says the limits in a few words', () => {
    expect(limitsLabel(key({}))).toBe('None');
    expect(limitsLabel(key({ models: ['llama3', 'qwen'], max_concurrent: 4, requests_per_minute: 60 }))).toBe(
      'llama3, qwen · 4 at once · 60/min',
    );
    expect(limitsLabel(key({ models: [], requests_per_minute: 5 }))).toBe('5/min');
    expect(limitsLabel(key({ priority: 'batch' }))).toBe('batch');
    expect(limitsLabel(key({ priority: 'interactive' }))).toBe('None');
    expect(limitsLabel(key({ weight: 3 }))).toBe('weight 3');
    expect(limitsLabel(key({ weight: 1 }))).toBe('None');
  });

  it('says when a key was last used', () => {
    const now = Date.parse('2026-11-25T12:10:00Z');
    expect(formatAgo(null, now)).toBe('never');
    expect(formatAgo('2026-11-25T12:09:58Z', now)).toBe('just now');
    expect(formatAgo('2026-11-25T12:05:00Z', now)).toBe('5m 00s ago');
    expect(formatAgo('2026-11-25T09:10:00Z', now)).toBe('3h 00m ago');
    expect(formatAgo('garbage', now)).toBe('garbage');
  });
});

describe('whether keys are required', () => {
  const status = (extra: Partial<Status>, node: Record<string, unknown> = {}) =>
    ({ node: { ...node }, ...extra }) as unknown as Status;
  it('reads the node block of the status', () => {
    expect(requiresApiKeys(status({}, { require_api_keys: true }))).toBe(true);
    expect(requiresApiKeys(status({}, { require_api_keys: false }))).toBe(false);
  });
  it('is unknown without a status or from an older relay', () => {
    expect(requiresApiKeys(null)).toBeNull();
    expect(requiresApiKeys(status({}))).toBeNull();
  });
});

describe('the model in a new key’s snippets', () => {
  it('is one the key may use, else one the relay serves', () => {
    expect(snippetModel(['qwen'], ['llama3'])).toBe('qwen');
    expect(snippetModel(null, ['llama3'])).toBe('llama3');
    expect(snippetModel([], [])).toBeNull();
  });
});
