import { describe, expect, it } from 'vitest';
import { parseRoute, routeQuery } from './hash';

describe('hash routes', () => {
  it('know the pages, with or without a query', () => {
    expect(parseRoute('#/keys')).toBe('keys');
    expect(parseRoute('#/usage?key=key_1&group_by=model')).toBe('usage');
    expect(parseRoute('#usage')).toBe('usage');
    expect(parseRoute('#/dashboard')).toBe('dashboard');
    expect(parseRoute('#/nope')).toBe('');
    expect(parseRoute('')).toBe('');
  });

  it('give a page its query', () => {
    expect(routeQuery('#/usage?key=key_1&group_by=model')).toBe('key=key_1&group_by=model');
    expect(routeQuery('#/usage')).toBe('');
  });
});
