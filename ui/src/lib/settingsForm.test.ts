import { describe, expect, it } from 'vitest';
import type { SettingsValues } from '../types';
import { aliasesOf, buildPatch, fieldOfMessage, newAliasRow, parseModels, toForm } from './settingsForm';

const base = (): SettingsValues => ({
  roles: { proxy: true, worker: true },
  proxy: {
    listen: '127.0.0.1:8080',
    provider: 'local',
    max_queue_len: 100,
    queue_timeout_secs: 30,
    request_timeout_secs: 300,
    aliases: { 'claude-*': 'qwen2.5-coder' },
    default_model: null,
  },
  worker: {
    proxy_url: null,
    worker_secret_set: true,
    worker_name: 'gpu-box',
    backend_url: null,
    models: null,
    max_concurrency: 4,
    confirmed_backends: [],
  },
});

describe('settings form', () => {
  it('sends nothing when nothing changed', () => {
    const s = base();
    expect(buildPatch(s, toForm(s))).toEqual({ patch: {}, errors: {}, changed: false });
  });

  it('sends only the changed fields, typed', () => {
    const s = base();
    const f = toForm(s);
    f.maxQueueLen = ' 42 ';
    f.workerRole = false;
    f.models = 'a, b,,c';
    f.defaultModel = 'qwen';
    f.workerSecret = 'new-secret';
    const r = buildPatch(s, f);
    expect(r.errors).toEqual({});
    expect(r.patch).toEqual({
      roles: { worker: false },
      proxy: { max_queue_len: 42, default_model: 'qwen' },
      worker: { models: ['a', 'b', 'c'], worker_secret: 'new-secret' },
    });
  });

  it('sends the whole alias map when an alias changed', () => {
    const s = base();
    const f = toForm(s);
    f.aliases = [...f.aliases, newAliasRow('gpt-4o', 'llama3')];
    expect(buildPatch(s, f).patch).toEqual({
      proxy: { aliases: { 'claude-*': 'qwen2.5-coder', 'gpt-4o': 'llama3' } },
    });
    f.aliases = [];
    expect(buildPatch(s, f).patch).toEqual({ proxy: { aliases: {} } });
  });

  it('clears optional fields with null', () => {
    const s = base();
    s.worker.proxy_url = 'http://10.0.0.2:8080';
    s.worker.models = ['x'];
    const f = toForm(s);
    expect(f.models).toBe('x');
    f.proxyUrl = '  ';
    f.models = '';
    expect(buildPatch(s, f).patch).toEqual({ worker: { proxy_url: null, models: null } });
  });

  it('reports invalid fields instead of sending them', () => {
    const s = base();
    const f = toForm(s);
    f.maxQueueLen = 'lots';
    f.queueTimeoutSecs = '0';
    f.maxConcurrency = '-1';
    f.proxyUrl = 'not a url';
    f.listen = '';
    f.aliases = [newAliasRow('x', '')];
    const r = buildPatch(s, f);
    expect(Object.keys(r.errors).sort()).toEqual(
      ['aliases', 'listen', 'maxConcurrency', 'maxQueueLen', 'proxyUrl', 'queueTimeoutSecs'].sort(),
    );
  });

  it('validates alias rows', () => {
    expect(aliasesOf([newAliasRow(' a ', ' b '), newAliasRow('', '')])).toEqual({ map: { a: 'b' }, error: null });
    expect(aliasesOf([newAliasRow('a', 'b'), newAliasRow('a', 'c')]).error).toMatch(/twice/);
    expect(aliasesOf([newAliasRow('', 'c')]).error).toMatch(/name or pattern/);
  });

  it('parses model lists', () => {
    expect(parseModels('')).toBeNull();
    expect(parseModels(' a ,b\nc ')).toEqual(['a', 'b', 'c']);
  });

  it('finds the field a server message names', () => {
    expect(fieldOfMessage('proxy.max_queue_len: must be at most 100000')).toBe('maxQueueLen');
    expect(fieldOfMessage('invalid max_concurrency: 0')).toBe('maxConcurrency');
    expect(fieldOfMessage('worker.proxy_url is not a URL')).toBe('proxyUrl');
    expect(fieldOfMessage('the proxy could not start')).toBeNull();
  });
});
