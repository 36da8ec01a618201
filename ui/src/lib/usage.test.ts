import { describe, expect, it } from 'vitest';
import type { ApiKey, UsageRow } from '../types';
import {
  DEFAULT_FILTERS,
  addDays,
  breakdownRows,
  csvFileName,
  dailyPoints,
  errorRate,
  filtersFromHashQuery,
  filtersToHashQuery,
  rangeError,
  usageQuery,
  type UsageFilters,
} from './usage';

const NOW = Date.parse('2026-11-25T15:30:00Z');
const row = (group: string, requests: number, over: Partial<UsageRow> = {}): UsageRow => ({
  group,
  requests,
  errors: 0,
  input_tokens: requests * 10,
  output_tokens: requests * 20,
  avg_ttft_ms: 120,
  avg_duration_ms: 900,
  ...over,
});

describe('the usage query', () => {
  it('asks for the last 30 days per day by default', () => {
    expect(usageQuery(DEFAULT_FILTERS, NOW)).toBe('since=2026-10-27&group_by=day');
  });

  it('carries every filter, the grouping asked for and the CSV format', () => {
    const f: UsageFilters = { key: 'key_abc', model: ' llama3 ', range: '7d', since: '', until: '', groupBy: 'model' };
    expect(usageQuery(f, NOW)).toBe('key=key_abc&model=llama3&since=2026-11-19&group_by=model');
    expect(usageQuery(f, NOW, { groupBy: 'day' })).toBe('key=key_abc&model=llama3&since=2026-11-19&group_by=day');
    expect(usageQuery(f, NOW, { csv: true })).toBe('key=key_abc&model=llama3&since=2026-11-19&group_by=model&format=csv');
  });

  it('uses the custom dates as typed, and either may be open', () => {
    const f: UsageFilters = { ...DEFAULT_FILTERS, range: 'custom', since: '2026-11-01', until: '2026-11-10' };
    expect(usageQuery(f, NOW)).toBe('since=2026-11-01&until=2026-11-10&group_by=day');
    expect(usageQuery({ ...f, since: '' }, NOW)).toBe('until=2026-11-10&group_by=day');
  });

  it('escapes what it carries', () => {
    expect(usageQuery({ ...DEFAULT_FILTERS, model: 'org/model a&b' }, NOW)).toContain('model=org%2Fmodel+a%26b');
  });

  it('refuses a range that ends before it starts', () => {
    expect(rangeError({ ...DEFAULT_FILTERS, range: 'custom', since: '2026-11-10', until: '2026-11-01' })).toMatch(
      /ends before it starts/,
    );
    expect(rangeError({ ...DEFAULT_FILTERS, range: 'custom', since: '11/10/2026' })).toBe('From must be a date (YYYY-MM-DD).');
    expect(rangeError({ ...DEFAULT_FILTERS, range: 'custom', since: '2026-11-01', until: '2026-11-01' })).toBeNull();
    expect(rangeError({ ...DEFAULT_FILTERS, since: 'junk' })).toBeNull();
  });

  it('names the CSV after the grouping and the range', () => {
    expect(csvFileName({ ...DEFAULT_FILTERS, groupBy: 'key' }, NOW)).toBe('usage-by-key-2026-10-27-to-2026-11-25.csv');
    expect(csvFileName({ ...DEFAULT_FILTERS, range: 'custom', since: '', until: '2026-11-02' }, NOW)).toBe(
      'usage-by-day-start-to-2026-11-02.csv',
    );
  });
});

describe('the page address', () => {
  it('keeps only what differs from the defaults', () => {
    expect(filtersToHashQuery(DEFAULT_FILTERS)).toBe('');
    const f: UsageFilters = { key: 'key_1', model: 'm', range: 'custom', since: '2026-11-01', until: '', groupBy: 'key' };
    expect(filtersToHashQuery(f)).toBe('key=key_1&model=m&range=custom&since=2026-11-01&group_by=key');
  });

  it('reads back what it wrote', () => {
    for (const f of [
      DEFAULT_FILTERS,
      { key: 'key_1', model: 'a b', range: '90d', since: '', until: '', groupBy: 'model' },
      { key: '', model: '', range: 'custom', since: '2026-01-01', until: '2026-02-01', groupBy: 'day' },
    ] as UsageFilters[]) {
      expect(filtersFromHashQuery(filtersToHashQuery(f))).toEqual(f);
    }
  });

  it('falls back to the defaults for anything unknown, and treats bare dates as a custom range', () => {
    expect(filtersFromHashQuery('range=1y&group_by=hour')).toEqual(DEFAULT_FILTERS);
    expect(filtersFromHashQuery('since=2026-11-01')).toMatchObject({ range: 'custom', since: '2026-11-01' });
  });
});

describe('the per-day series', () => {
  it('has a point for every day of the range, zero on quiet days', () => {
    const points = dailyPoints({
      since: '2026-11-20T00:00:00Z',
      until: '2026-11-23T15:00:00Z',
      rows: [row('2026-11-23', 3), row('2026-11-21', 1, { errors: 1 })],
    });
    expect(points.map((p) => [p.day, p.requests, p.errors])).toEqual([
      ['2026-11-20', 0, 0],
      ['2026-11-21', 1, 1],
      ['2026-11-22', 0, 0],
      ['2026-11-23', 3, 0],
    ]);
    expect(points[0].unixSecs).toBe(Date.parse('2026-11-20T00:00:00Z') / 1000);
    expect(points[3].outputTokens).toBe(60);
  });

  it('stretches to rows outside the reported range and copes with no range at all', () => {
    expect(dailyPoints({ since: '', until: '', rows: [row('2026-11-02', 1), row('2026-11-01', 2)] }).map((p) => p.day)).toEqual([
      '2026-11-01',
      '2026-11-02',
    ]);
    expect(dailyPoints({ since: '', until: '', rows: [] })).toEqual([]);
  });

  it('crosses month ends', () => {
    expect(addDays('2026-02-28', 1)).toBe('2026-03-01');
    expect(addDays('2026-01-01', -1)).toBe('2025-12-31');
  });
});

describe('the breakdown', () => {
  const keys = [{ id: 'key_b', name: 'from-the-list' }] as ApiKey[];

  it('lists keys busiest first, by name, with no-key requests named', () => {
    const rows = breakdownRows(
      {
        group_by: 'key',
        rows: [row('anonymous', 2, {}), row('key_a', 8, { name: 'production-app' }), row('key_b', 4)],
      },
      keys,
    );
    expect(rows.map((r) => [r.label, r.detail, r.share])).toEqual([
      ['production-app', 'key_a', 1],
      ['from-the-list', 'key_b', 0.5],
      ['No key', 'requests without an API key', 0.25],
    ]);
  });

  it('lists days oldest first and formats the numbers', () => {
    const rows = breakdownRows(
      { group_by: 'day', rows: [row('2026-11-02', 1500, { errors: 15, avg_ttft_ms: null }), row('2026-11-01', 0)] },
      [],
    );
    expect(rows.map((r) => r.label)).toEqual(['2026-11-01', '2026-11-02']);
    expect(rows[1]).toMatchObject({ requests: '1,500', errorRate: '1.0%', inputTokens: '15,000', avgTtft: '—', avgDuration: '900 ms' });
    expect(rows[0].errorRate).toBe('—');
  });

  it('rounds error rates', () => {
    expect(errorRate({ requests: 3, errors: 1 })).toBe('33%');
    expect(errorRate({ requests: 1000, errors: 1 })).toBe('0.1%');
    expect(errorRate({ requests: 5, errors: 0 })).toBe('0%');
  });
});
