import { describe, expect, it } from 'vitest';
import { parseRoute, routeOfPath, routeQuery } from './hash';

describe('routes', () => {
  it('reads the page from the hash, with or without a query', () => {
    expect(parseRoute('#/dashboard')).toBe('dashboard');
    expect(parseRoute('#/setup?step=2')).toBe('setup');
    expect(parseRoute('#/keys')).toBe('keys');
    expect(parseRoute('#/usage?key=key_1&group_by=model')).toBe('usage');
    expect(parseRoute('#usage')).toBe('usage');
    expect(parseRoute('#/nope')).toBe('');
    expect(parseRoute('')).toBe('');
  });

  it('gives a page its query', () => {
    expect(routeQuery('#/usage?key=key_1&group_by=model')).toBe('key=key_1&group_by=model');
    expect(routeQuery('#/usage')).toBe('');
  });

  it('reads the page from the runbook addresses /dashboard and /setup', () => {
    expect(routeOfPath('/dashboard')).toBe('dashboard');
    expect(routeOfPath('/setup')).toBe('setup');
    expect(routeOfPath('/')).toBe('');
    expect(routeOfPath('/index.html')).toBe('');
  });
});
