// The Usage page's logic: filters ⇄ query strings (API and address bar), the per-day series
// with the quiet days filled in, and the breakdown rows. Pure functions, unit-tested.

import type { ApiKey, UsageCounts, UsageGroupBy, UsageReport, UsageRow } from '../types';
import { DASH, formatCount, formatDuration } from './format';

/** Preset ranges end now; `custom` uses the two dates. */
export type UsageRange = '7d' | '30d' | '90d' | 'custom';

export interface UsageFilters {
  /** A key id, or '' for every key. */
  key: string;
  /** A model name, or '' for every model. */
  model: string;
  range: UsageRange;
  /** YYYY-MM-DD, for the custom range. */
  since: string;
  until: string;
  groupBy: UsageGroupBy;
}

export const DEFAULT_FILTERS: UsageFilters = { key: '', model: '', range: '30d', since: '', until: '', groupBy: 'day' };

const RANGE_DAYS: Record<Exclude<UsageRange, 'custom'>, number> = { '7d': 7, '30d': 30, '90d': 90 };
export const RANGE_LABELS: Record<UsageRange, string> = {
  '7d': 'Last 7 days',
  '30d': 'Last 30 days',
  '90d': 'Last 90 days',
  custom: 'Custom dates',
};
const GROUPS: UsageGroupBy[] = ['day', 'key', 'model'];
const DATE = /^\d{4}-\d{2}-\d{2}$/;
const DAY_MS = 86_400_000;

/** The UTC day of an instant, YYYY-MM-DD: the relay groups usage by UTC day. */
export function utcDay(ms: number): string {
  return new Date(ms).toISOString().slice(0, 10);
}

/** The day `n` days after a YYYY-MM-DD day (before, when negative). */
export function addDays(day: string, n: number): string {
  return utcDay(Date.parse(`${day}T00:00:00Z`) + n * DAY_MS);
}

/** The since/until the API gets: a preset starts that many days back (today included) and ends now. */
export function rangeBounds(filters: UsageFilters, nowMs: number): { since?: string; until?: string } {
  if (filters.range === 'custom') {
    return { since: filters.since || undefined, until: filters.until || undefined };
  }
  return { since: addDays(utcDay(nowMs), -(RANGE_DAYS[filters.range] - 1)) };
}

/** What is wrong with the custom dates, or null. */
export function rangeError(filters: UsageFilters): string | null {
  if (filters.range !== 'custom') return null;
  for (const [label, value] of [
    ['From', filters.since],
    ['To', filters.until],
  ] as const) {
    if (value && (!DATE.test(value) || !Number.isFinite(Date.parse(value)))) return `${label} must be a date (YYYY-MM-DD).`;
  }
  if (filters.since && filters.until && filters.since > filters.until) return 'The range ends before it starts: From must not be after To.';
  return null;
}

/**
 * The query string of GET /api/usage (without "?"), in a fixed order. `groupBy` overrides the
 * filters' grouping (the page always asks per day for the chart too); `csv` asks for the export.
 */
export function usageQuery(
  filters: UsageFilters,
  nowMs: number,
  { groupBy, csv = false }: { groupBy?: UsageGroupBy; csv?: boolean } = {},
): string {
  const q = new URLSearchParams();
  if (filters.key) q.set('key', filters.key);
  if (filters.model.trim()) q.set('model', filters.model.trim());
  const { since, until } = rangeBounds(filters, nowMs);
  if (since) q.set('since', since);
  if (until) q.set('until', until);
  q.set('group_by', groupBy ?? filters.groupBy);
  if (csv) q.set('format', 'csv');
  return q.toString();
}

/** Filters as the query of the page's address (#/usage?…): only what differs from the defaults. */
export function filtersToHashQuery(filters: UsageFilters): string {
  const q = new URLSearchParams();
  if (filters.key) q.set('key', filters.key);
  if (filters.model) q.set('model', filters.model);
  if (filters.range !== DEFAULT_FILTERS.range) q.set('range', filters.range);
  if (filters.range === 'custom') {
    if (filters.since) q.set('since', filters.since);
    if (filters.until) q.set('until', filters.until);
  }
  if (filters.groupBy !== DEFAULT_FILTERS.groupBy) q.set('group_by', filters.groupBy);
  return q.toString();
}

/** The filters of a page address query; anything unknown falls back to the default. */
export function filtersFromHashQuery(query: string): UsageFilters {
  const q = new URLSearchParams(query);
  const range = q.get('range');
  const groupBy = q.get('group_by');
  const since = q.get('since') ?? '';
  const until = q.get('until') ?? '';
  const custom = range === 'custom' || (range === null && (DATE.test(since) || DATE.test(until)));
  return {
    key: q.get('key') ?? '',
    model: q.get('model') ?? '',
    range: custom ? 'custom' : range && range in RANGE_DAYS ? (range as UsageRange) : DEFAULT_FILTERS.range,
    since: custom ? since : '',
    until: custom ? until : '',
    groupBy: GROUPS.includes(groupBy as UsageGroupBy) ? (groupBy as UsageGroupBy) : DEFAULT_FILTERS.groupBy,
  };
}

export interface DayPoint {
  day: string;
  /** Midnight UTC, in unix seconds (the chart's x). */
  unixSecs: number;
  requests: number;
  errors: number;
  inputTokens: number;
  outputTokens: number;
}

/** At most this many days are filled in, so a range back to 1970 cannot freeze the page. */
const MAX_FILLED_DAYS = 3700;

/**
 * One point per day from the report's since to its until, zeros on days without traffic (the
 * relay lists only days with requests), so the chart's gaps show quiet days instead of joining
 * their neighbours.
 */
export function dailyPoints(report: Pick<UsageReport, 'since' | 'until' | 'rows'>): DayPoint[] {
  const byDay = new Map(report.rows.map((r) => [r.group.slice(0, 10), r]));
  const days = Array.from(byDay.keys()).filter((d) => DATE.test(d)).sort();
  let first = DATE.test(report.since.slice(0, 10)) ? report.since.slice(0, 10) : days[0];
  let last = DATE.test(report.until.slice(0, 10)) ? report.until.slice(0, 10) : days[days.length - 1];
  if (!first || !last) return [];
  if (days.length && days[0] < first) first = days[0];
  if (days.length && days[days.length - 1] > last) last = days[days.length - 1];
  const points: DayPoint[] = [];
  for (let day = first; day <= last && points.length < MAX_FILLED_DAYS; day = addDays(day, 1)) {
    const row = byDay.get(day);
    points.push({
      day,
      unixSecs: Date.parse(`${day}T00:00:00Z`) / 1000,
      requests: row?.requests ?? 0,
      errors: row?.errors ?? 0,
      inputTokens: row?.input_tokens ?? 0,
      outputTokens: row?.output_tokens ?? 0,
    });
  }
  return points;
}

/** A row of the breakdown table, formatted. */
export interface BreakdownRow {
  group: string;
  /** What the row is: a day, a key's name, a model. */
  label: string;
  /** Under the label: the key id (for keys), else empty. */
  detail: string;
  /** Requests relative to the busiest row, 0..1, for the bar. */
  share: number;
  requests: string;
  errors: string;
  errorRate: string;
  inputTokens: string;
  outputTokens: string;
  avgTtft: string;
  avgDuration: string;
  raw: UsageRow;
}

/** What requests without a key are called in the key breakdown. */
export const ANONYMOUS = 'anonymous';

export function keyLabel(row: Pick<UsageRow, 'group' | 'name'>, keys: ApiKey[]): { label: string; detail: string } {
  if (row.group === ANONYMOUS) return { label: 'No key', detail: 'requests without an API key' };
  const name = row.name ?? keys.find((k) => k.id === row.group)?.name;
  return { label: name ?? row.group, detail: name ? row.group : '' };
}

export function errorRate(c: Pick<UsageCounts, 'requests' | 'errors'>): string {
  if (!c.requests) return DASH;
  const pct = (c.errors / c.requests) * 100;
  return `${pct < 10 && pct > 0 ? pct.toFixed(1) : Math.round(pct)}%`;
}

/** The rows of a report for its table: days oldest first, keys and models busiest first. */
export function breakdownRows(report: Pick<UsageReport, 'group_by' | 'rows'>, keys: ApiKey[]): BreakdownRow[] {
  const rows = [...report.rows];
  if (report.group_by === 'day') rows.sort((a, b) => a.group.localeCompare(b.group));
  else rows.sort((a, b) => b.requests - a.requests || a.group.localeCompare(b.group));
  const busiest = rows.reduce((m, r) => Math.max(m, r.requests), 0);
  return rows.map((r) => {
    const { label, detail } =
      report.group_by === 'key' ? keyLabel(r, keys) : { label: r.group, detail: '' };
    return {
      group: r.group,
      label,
      detail,
      share: busiest ? r.requests / busiest : 0,
      requests: formatCount(r.requests),
      errors: formatCount(r.errors),
      errorRate: errorRate(r),
      inputTokens: formatCount(r.input_tokens),
      outputTokens: formatCount(r.output_tokens),
      avgTtft: formatDuration(r.avg_ttft_ms),
      avgDuration: formatDuration(r.avg_duration_ms),
      raw: r,
    };
  });
}

/** The name of the downloaded CSV: usage-by-key-2026-10-27-to-2026-11-25.csv. */
export function csvFileName(filters: UsageFilters, nowMs: number): string {
  const { since, until } = rangeBounds(filters, nowMs);
  const from = since ?? 'start';
  const to = until ?? utcDay(nowMs);
  return `usage-by-${filters.groupBy}-${from}-to-${to}.csv`;
}
