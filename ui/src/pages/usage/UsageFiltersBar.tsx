// The filters of the Usage page: which key, which model, which days, grouped how. Every change
// applies at once (the model box when it is left or Enter is pressed).
import type { ApiKey, UsageGroupBy } from '../../types';
import { isRevoked } from '../../lib/keys';
import { ANONYMOUS, RANGE_LABELS, type UsageFilters, type UsageRange } from '../../lib/usage';

const GROUP_LABELS: Record<UsageGroupBy, string> = { day: 'Day', key: 'Key', model: 'Model' };

export function UsageFiltersBar({
  filters,
  keys,
  models,
  rangeError,
  onChange,
}: {
  filters: UsageFilters;
  keys: ApiKey[];
  models: string[];
  rangeError: string | null;
  onChange: (next: UsageFilters) => void;
}) {
  const set = <K extends keyof UsageFilters>(field: K, value: UsageFilters[K]) => onChange({ ...filters, [field]: value });
  const value = (e: Event) => (e.target as HTMLInputElement | HTMLSelectElement).value;
  // A filter on a key that is not in the list (e.g. from a shared address) still shows.
  const keyKnown = !filters.key || filters.key === ANONYMOUS || keys.some((k) => k.id === filters.key);

  return (
    <form class="card usage-filters" aria-label="Usage filters" onSubmit={(e) => e.preventDefault()} data-testid="usage-filters">
      <label class="field">
        <span>Key</span>
        <select value={filters.key} onChange={(e) => set('key', value(e))} data-testid="usage-key">
          <option value="">All keys</option>
          <option value={ANONYMOUS}>No key (requests without one)</option>
          {keys.map((k) => (
            <option key={k.id} value={k.id}>
              {k.name} ({k.prefix}…){isRevoked(k) ? ' — revoked' : ''}
            </option>
          ))}
          {keyKnown ? null : <option value={filters.key}>{filters.key}</option>}
        </select>
      </label>
      <label class="field">
        <span>Model</span>
        <input
          type="text"
          list="usage-models"
          value={filters.model}
          placeholder="All models"
          autocomplete="off"
          onChange={(e) => set('model', value(e).trim())}
          data-testid="usage-model"
        />
        <datalist id="usage-models">
          {models.map((m) => (
            <option key={m} value={m} />
          ))}
        </datalist>
      </label>
      <label class="field">
        <span>Range</span>
        <select value={filters.range} onChange={(e) => set('range', value(e) as UsageRange)} data-testid="usage-range">
          {(Object.keys(RANGE_LABELS) as UsageRange[]).map((r) => (
            <option key={r} value={r}>
              {RANGE_LABELS[r]}
            </option>
          ))}
        </select>
      </label>
      {filters.range === 'custom' ? (
        <>
          <label class="field">
            <span>From (UTC)</span>
            <input
              type="date"
              value={filters.since}
              max={filters.until || undefined}
              aria-invalid={rangeError ? 'true' : undefined}
              aria-describedby={rangeError ? 'usage-range-error' : undefined}
              onChange={(e) => set('since', value(e))}
              data-testid="usage-since"
            />
          </label>
          <label class="field">
            <span>To (UTC)</span>
            <input
              type="date"
              value={filters.until}
              min={filters.since || undefined}
              aria-invalid={rangeError ? 'true' : undefined}
              aria-describedby={rangeError ? 'usage-range-error' : undefined}
              onChange={(e) => set('until', value(e))}
              data-testid="usage-until"
            />
          </label>
        </>
      ) : null}
      <fieldset class="field">
        <legend>Group by</legend>
        <div class="segmented" data-testid="usage-group-by">
          {(Object.keys(GROUP_LABELS) as UsageGroupBy[]).map((g) => (
            <label key={g} class={filters.groupBy === g ? 'selected' : ''}>
              <input type="radio" name="usage-group-by" value={g} checked={filters.groupBy === g} onChange={() => set('groupBy', g)} />
              {GROUP_LABELS[g]}
            </label>
          ))}
        </div>
      </fieldset>
      {rangeError ? (
        <p id="usage-range-error" class="field-error usage-filters-error" role="alert">
          {rangeError}
        </p>
      ) : null}
    </form>
  );
}
