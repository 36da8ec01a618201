import { formatCount, formatDuration } from '../../lib/format';
import { errorRate } from '../../lib/usage';
import type { UsageCounts } from '../../types';

/** The sums over the filtered range. */
export function UsageTotals({ totals }: { totals: UsageCounts }) {
  const items: [string, string, string, string?][] = [
    ['Requests', formatCount(totals.requests), 'usage-total-requests'],
    ['Errors', formatCount(totals.errors), 'usage-total-errors', totals.requests ? errorRate(totals) : undefined],
    ['Input tokens', formatCount(totals.input_tokens), 'usage-total-input'],
    ['Output tokens', formatCount(totals.output_tokens), 'usage-total-output'],
  ];
  // The relay sends the means over the whole range too; older answers may not have them.
  if (totals.avg_ttft_ms !== undefined) items.push(['Avg TTFT', formatDuration(totals.avg_ttft_ms), 'usage-total-ttft']);
  if (totals.avg_duration_ms !== undefined)
    items.push(['Avg duration', formatDuration(totals.avg_duration_ms), 'usage-total-duration']);
  return (
    <section class="card" aria-label="Totals">
      <dl class="totals usage-totals">
        {items.map(([label, value, testid, note]) => (
          <div key={label}>
            <dt>{label}</dt>
            <dd data-testid={testid}>
              {value}
              {note ? <span class="muted small"> {note}</span> : null}
            </dd>
          </div>
        ))}
      </dl>
    </section>
  );
}
