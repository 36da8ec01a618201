// The Usage page: requests and tokens per day, key and model, from the relay's usage records,
// with filters kept in the address (#/usage?key=…) and a CSV export of the same rows.
import { useEffect, useMemo, useRef, useState } from 'preact/hooks';
import { api, errorMessage } from '../api';
import { Alert, Card, Spinner } from '../components/common';
import { DayChart } from '../components/DayChart';
import { ProxyOnlyNotice, isWorkerOnly } from '../components/ProxyOnlyNotice';
import { replaceRouteQuery, routeQuery } from '../hash';
import {
  DEFAULT_FILTERS,
  breakdownRows,
  csvFileName,
  dailyPoints,
  filtersFromHashQuery,
  filtersToHashQuery,
  rangeError,
  usageQuery,
  type UsageFilters,
} from '../lib/usage';
import { useLive } from '../live';
import type { ApiKey, UsageReport } from '../types';
import { BreakdownCard } from './usage/BreakdownCard';
import { ExportCsvButton } from './usage/ExportCsvButton';
import { UsageFiltersBar } from './usage/UsageFiltersBar';
import { UsageTotals } from './usage/UsageTotals';

interface Reports {
  /** Always per day: the chart and the totals. */
  daily: UsageReport;
  /** The table's grouping (the daily report again when grouped by day). */
  grouped: UsageReport;
}

/** Fetch the daily and the grouped report for the filters; the newest filters win a race. */
function useUsageReports(filters: UsageFilters, reloads: number) {
  const [reports, setReports] = useState<Reports | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [loading, setLoading] = useState(false);
  const invalid = rangeError(filters);

  useEffect(() => {
    if (invalid) return;
    let current = true;
    const now = Date.now();
    setLoading(true);
    setError(null);
    const daily = api.usage(usageQuery(filters, now, { groupBy: 'day' }));
    const grouped = filters.groupBy === 'day' ? daily : api.usage(usageQuery(filters, now));
    Promise.all([daily, grouped])
      .then(([d, g]) => current && setReports({ daily: d, grouped: g }))
      .catch((e) => {
        if (!current) return;
        // No stale rows under the error: they would be taken for the answer to these filters.
        setReports(null);
        setError(errorMessage(e));
      })
      .finally(() => current && setLoading(false));
    return () => {
      current = false;
    };
  }, [filters, reloads, invalid]);

  return { reports, error, loading };
}

/** How often the page looks whether the live feed counted new requests. */
const TRAFFIC_CHECK_MS = 10_000;
/** The relay writes usage in batches (every 500 ms): wait a little longer before reading it. */
const USAGE_WRITE_LAG_MS = 1_500;

/**
 * Call `reload` when the live feed's request count has moved, at most every TRAFFIC_CHECK_MS,
 * so the page follows new traffic without refetching on every status event.
 */
function useReloadOnTraffic(liveRequests: number | undefined, reload: () => void) {
  const latest = useRef(liveRequests);
  latest.current = liveRequests;
  const seen = useRef(liveRequests);
  const reloadRef = useRef(reload);
  reloadRef.current = reload;
  useEffect(() => {
    let pending: ReturnType<typeof setTimeout> | undefined;
    const timer = setInterval(() => {
      if (latest.current === undefined || latest.current === seen.current) return;
      seen.current = latest.current;
      clearTimeout(pending);
      pending = setTimeout(() => reloadRef.current(), USAGE_WRITE_LAG_MS);
    }, TRAFFIC_CHECK_MS);
    return () => {
      clearInterval(timer);
      clearTimeout(pending);
    };
  }, []);
}

export function Usage() {
  const { status } = useLive();
  const [filters, setFilters] = useState<UsageFilters>(() => filtersFromHashQuery(routeQuery(location.hash)));
  const [reloads, setReloads] = useState(0);
  const [keys, setKeys] = useState<ApiKey[]>([]);
  const { reports, error, loading } = useUsageReports(filters, reloads);
  const invalid = rangeError(filters);
  useReloadOnTraffic(status?.totals.requests, () => setReloads((n) => n + 1));

  // The key names for the filter and the table; usage still shows without them.
  useEffect(() => {
    api
      .keys()
      .then((r) => setKeys(r.keys))
      .catch(() => setKeys([]));
  }, []);

  const change = (next: UsageFilters) => {
    setFilters(next);
    replaceRouteQuery('usage', filtersToHashQuery(next));
  };

  const models = useMemo(() => {
    const served = (status?.models ?? []).map((m) => m.name);
    const allowed = keys.flatMap((k) => k.models ?? []);
    return Array.from(new Set([...served, ...allowed])).sort();
  }, [status, keys]);

  const points = useMemo(() => (reports ? dailyPoints(reports.daily) : []), [reports]);
  const days = useMemo(() => points.map((p) => p.unixSecs), [points]);
  const requests = useMemo(() => points.map((p) => p.requests), [points]);
  const tokens = useMemo(() => points.map((p) => p.inputTokens + p.outputTokens), [points]);
  const rows = useMemo(() => (reports ? breakdownRows(reports.grouped, keys) : []), [reports, keys]);
  const filtered = filtersToHashQuery({ ...filters, groupBy: DEFAULT_FILTERS.groupBy }) !== '';
  const now = Date.now();

  if (isWorkerOnly(status)) {
    return (
      <main class="page" data-testid="usage">
        <h1>Usage</h1>
        <ProxyOnlyNotice status={status} what="usage records" route="usage" />
      </main>
    );
  }

  return (
    <main class="page" data-testid="usage">
      <div class="page-title">
        <h1>Usage</h1>
        <button
          type="button"
          class="btn"
          onClick={() => setReloads((n) => n + 1)}
          disabled={loading}
          title="The page also refreshes by itself within seconds of new requests"
          data-testid="usage-refresh"
        >
          {loading ? 'Loading…' : 'Refresh'}
        </button>
      </div>
      <UsageFiltersBar filters={filters} keys={keys} models={models} rangeError={invalid} onChange={change} />
      {error ? (
        <Alert kind="error" testid="usage-error">
          Could not read the usage: {error}
        </Alert>
      ) : null}
      {!reports ? (
        error || invalid ? null : <Spinner label="Loading usage…" />
      ) : reports.daily.totals.requests === 0 ? (
        <EmptyUsage filtered={filtered} onClear={() => change({ ...DEFAULT_FILTERS, groupBy: filters.groupBy })} />
      ) : (
        <>
          <UsageTotals totals={reports.daily.totals} />
          <section class="charts charts-2" aria-label="Usage per day" data-testid="usage-charts">
            <DayChart title="Requests per day" days={days} values={requests} color="#2563eb" testid="usage-chart-requests" />
            <DayChart title="Tokens per day" days={days} values={tokens} color="#16a34a" testid="usage-chart-tokens" />
          </section>
          <BreakdownCard
            groupBy={reports.grouped.group_by}
            rows={rows}
            onShowOne={(row) =>
              change(
                reports.grouped.group_by === 'key'
                  ? { ...filters, key: row.group, groupBy: 'day' }
                  : { ...filters, model: row.group, groupBy: 'day' },
              )
            }
            actions={
              <ExportCsvButton
                query={usageQuery(filters, now, { csv: true })}
                fileName={csvFileName(filters, now)}
                disabled={invalid !== null}
              />
            }
          />
        </>
      )}
    </main>
  );
}

function EmptyUsage({ filtered, onClear }: { filtered: boolean; onClear: () => void }) {
  return (
    <Card title="No requests" testid="usage-empty">
      {filtered ? (
        <p>
          No request matches these filters.{' '}
          <button type="button" class="btn btn-link" onClick={onClear}>
            Show all keys and models over the last 30 days
          </button>
        </p>
      ) : (
        <p>No request went through this relay in this range.</p>
      )}
      <p class="muted small">
        Every inference request through this relay is counted here: per day, per <a href="#/keys">API key</a> (or as “No
        key”) and per model, with its tokens, errors and timings. Point a client at the relay (see{' '}
        <a href="#/setup">Setup</a>) and its requests show up.
      </p>
    </Card>
  );
}
