import { describe, expect, it } from 'vitest';
import { parseRoute, routeOfPath } from './hash';

describe('routes', () => {
  it('reads the page from the hash', () => {
    expect(parseRoute('#/dashboard')).toBe('dashboard');
    expect(parseRoute('#/setup?step=2')).toBe('setup');
    expect(parseRoute('#/nope')).toBe('');
  });

  it('reads the page from the runbook addresses /dashboard and /setup', () => {
    expect(routeOfPath('/dashboard')).toBe('dashboard');
    expect(routeOfPath('/setup')).toBe('setup');
    expect(routeOfPath('/')).toBe('');
    expect(routeOfPath('/index.html')).toBe('');
  });
});
