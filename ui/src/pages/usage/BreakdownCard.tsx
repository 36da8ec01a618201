// The rows of the report as a table: per day, per key or per model, with a bar for each row's
// share of the busiest one.
import type { ComponentChildren } from 'preact';
import { Card, DataTable } from '../../components/common';
import type { BreakdownRow } from '../../lib/usage';
import type { UsageGroupBy } from '../../types';

const TITLES: Record<UsageGroupBy, string> = { day: 'By day', key: 'By key', model: 'By model' };
const FIRST_COLUMN: Record<UsageGroupBy, string> = { day: 'Day (UTC)', key: 'Key', model: 'Model' };

export function BreakdownCard({
  groupBy,
  rows,
  actions,
  onShowOne,
}: {
  groupBy: UsageGroupBy;
  rows: BreakdownRow[];
  actions?: ComponentChildren;
  /** Narrow the page to one key or model (its days); absent for days. */
  onShowOne?: (row: BreakdownRow) => void;
}) {
  return (
    <Card title={TITLES[groupBy]} testid="usage-breakdown" actions={actions}>
      {rows.length === 0 ? (
        <p class="empty">No requests to break down.</p>
      ) : (
        <DataTable
          label={`Usage ${TITLES[groupBy].toLowerCase()}`}
          columns={[FIRST_COLUMN[groupBy], 'Requests', 'Errors', 'Input tokens', 'Output tokens', 'Avg TTFT', 'Avg duration']}
        >
          {rows.map((r) => (
            <tr key={r.group} data-testid="usage-row" data-group={r.group}>
              <td>
                {onShowOne && groupBy !== 'day' ? (
                  <button
                    type="button"
                    class="btn-link breakdown-label"
                    onClick={() => onShowOne(r)}
                    title={`Show only ${r.label}, per day`}
                    data-testid="usage-row-show"
                  >
                    {groupBy === 'model' ? <code>{r.label}</code> : <strong>{r.label}</strong>}
                  </button>
                ) : groupBy === 'model' ? (
                  <code>{r.label}</code>
                ) : (
                  <strong>{r.label}</strong>
                )}
                {r.detail ? <div class="muted small">{r.detail}</div> : null}
              </td>
              <td data-testid="usage-row-requests">
                <div class="load">
                  <span>{r.requests}</span>
                  <span class="bar" aria-hidden="true">
                    <span style={{ width: `${Math.round(r.share * 100)}%` }} />
                  </span>
                </div>
              </td>
              <td>
                {r.errors}
                {r.raw.errors ? <span class="muted small"> {r.errorRate}</span> : null}
              </td>
              <td data-testid="usage-row-input">{r.inputTokens}</td>
              <td data-testid="usage-row-output">{r.outputTokens}</td>
              <td>{r.avgTtft}</td>
              <td>{r.avgDuration}</td>
            </tr>
          ))}
        </DataTable>
      )}
    </Card>
  );
}
