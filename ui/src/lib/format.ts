// Human-readable numbers, durations and rates. Pure functions, unit-tested.

export const DASH = '—';

const pad2 = (n: number) => String(n).padStart(2, '0');

/** A duration in milliseconds: "850 ms", "1.2 s", "2m 05s", "1h 02m", "3d 4h". */
export function formatDuration(ms: number | null | undefined): string {
  if (ms == null || !Number.isFinite(ms)) return DASH;
  if (ms < 0) ms = 0;
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 10_000) return `${(Math.floor(ms / 100) / 10).toFixed(1)} s`;
  const totalSecs = Math.floor(ms / 1000);
  if (totalSecs < 60) return `${totalSecs} s`;
  const totalMins = Math.floor(totalSecs / 60);
  if (totalMins < 60) return `${totalMins}m ${pad2(totalSecs % 60)}s`;
  const totalHours = Math.floor(totalMins / 60);
  if (totalHours < 24) return `${totalHours}h ${pad2(totalMins % 60)}m`;
  return `${Math.floor(totalHours / 24)}d ${totalHours % 24}h`;
}

/** Seconds of uptime, as a duration. */
export function formatUptime(secs: number | null | undefined): string {
  if (secs == null || !Number.isFinite(secs)) return DASH;
  return formatDuration(secs * 1000);
}

/** How long ago a unix-ms instant was, relative to `nowMs`. */
export function formatSince(unixMs: number | null | undefined, nowMs: number): string {
  if (unixMs == null || !Number.isFinite(unixMs) || unixMs <= 0) return DASH;
  return formatDuration(Math.max(0, nowMs - unixMs));
}

/** A round-trip latency in ms: "0.80 ms", "12.3 ms", "250 ms". */
export function formatLatency(ms: number | null | undefined): string {
  if (ms == null || !Number.isFinite(ms)) return DASH;
  if (ms < 1) return `${ms.toFixed(2)} ms`;
  if (ms < 100) return `${ms.toFixed(1)} ms`;
  if (ms < 10_000) return `${Math.round(ms)} ms`;
  return formatDuration(ms);
}

/** A per-second rate with a unit: "97.2 tok/s", "0.5 req/s", "1.2k tok/s". */
export function formatRate(value: number | null | undefined, unit = '/s'): string {
  if (value == null || !Number.isFinite(value)) return DASH;
  const sep = unit.startsWith('/') ? '' : ' ';
  return `${formatCompact(value, 1)}${sep}${unit}`;
}

/** Compact number: 999, 1.2k, 3.4M (with `digits` decimals below 100 of the unit). */
export function formatCompact(value: number, digits = 1): string {
  if (!Number.isFinite(value)) return DASH;
  const abs = Math.abs(value);
  const scaled = (v: number, suffix: string) => {
    const s = Math.abs(v) >= 100 ? Math.round(v).toString() : trimZeros(v.toFixed(digits));
    return s + suffix;
  };
  if (abs >= 1e9) return scaled(value / 1e9, 'G');
  if (abs >= 1e6) return scaled(value / 1e6, 'M');
  if (abs >= 1e4) return scaled(value / 1e3, 'k');
  if (Number.isInteger(value)) return value.toString();
  return abs >= 100 ? Math.round(value).toString() : trimZeros(value.toFixed(digits));
}

function trimZeros(s: string): string {
  return s.includes('.') ? s.replace(/\.?0+$/, '') : s;
}

/** An integer count with thousands separators: 1234567 → "1,234,567". */
export function formatCount(value: number | null | undefined): string {
  if (value == null || !Number.isFinite(value)) return DASH;
  const sign = value < 0 ? '-' : '';
  return sign + Math.round(Math.abs(value)).toString().replace(/\B(?=(\d{3})+(?!\d))/g, ',');
}

/** A local date-time for tooltips; stable format "2025-11-21 16:00:05". */
export function formatDateTime(unixMs: number | null | undefined): string {
  if (unixMs == null || !Number.isFinite(unixMs) || unixMs <= 0) return DASH;
  const d = new Date(unixMs);
  return `${d.getFullYear()}-${pad2(d.getMonth() + 1)}-${pad2(d.getDate())} ${pad2(d.getHours())}:${pad2(
    d.getMinutes(),
  )}:${pad2(d.getSeconds())}`;
}
