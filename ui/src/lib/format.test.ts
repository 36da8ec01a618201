import { describe, expect, it } from 'vitest';
import {
  DASH,
  formatCompact,
  formatCount,
  formatDuration,
  formatLatency,
  formatRate,
  formatSince,
  formatUptime,
} from './format';

describe('formatDuration', () => {
  it('shows milliseconds below a second', () => {
    expect(formatDuration(0)).toBe('0 ms');
    expect(formatDuration(45)).toBe('45 ms');
    expect(formatDuration(999.4)).toBe('999 ms');
  });
  it('shows tenths of a second below ten seconds, truncated', () => {
    expect(formatDuration(1000)).toBe('1.0 s');
    expect(formatDuration(1234)).toBe('1.2 s');
    expect(formatDuration(9999)).toBe('9.9 s');
  });
  it('shows whole seconds, then minutes, hours and days', () => {
    expect(formatDuration(12_000)).toBe('12 s');
    expect(formatDuration(125_000)).toBe('2m 05s');
    expect(formatDuration(3_720_000)).toBe('1h 02m');
    expect(formatDuration(86_400_000 * 3 + 3_600_000 * 4)).toBe('3d 4h');
  });
  it('treats missing and negative values', () => {
    expect(formatDuration(null)).toBe(DASH);
    expect(formatDuration(undefined)).toBe(DASH);
    expect(formatDuration(NaN)).toBe(DASH);
    expect(formatDuration(-5)).toBe('0 ms');
  });
});

describe('formatUptime and formatSince', () => {
  it('formats seconds of uptime', () => {
    expect(formatUptime(12)).toBe('12 s');
    expect(formatUptime(3600)).toBe('1h 00m');
    expect(formatUptime(null)).toBe(DASH);
  });
  it('measures from a unix-ms instant to now', () => {
    expect(formatSince(1_000_000, 1_065_000)).toBe('1m 05s');
    expect(formatSince(2_000, 1_000)).toBe('0 ms');
    expect(formatSince(0, 1_000)).toBe(DASH);
    expect(formatSince(null, 1_000)).toBe(DASH);
  });
});

describe('formatLatency', () => {
  it('keeps precision for sub-millisecond heartbeats', () => {
    expect(formatLatency(0.8)).toBe('0.80 ms');
    expect(formatLatency(12.34)).toBe('12.3 ms');
    expect(formatLatency(250.4)).toBe('250 ms');
    expect(formatLatency(12_000)).toBe('12 s');
    expect(formatLatency(null)).toBe(DASH);
  });
});

describe('formatRate and formatCompact', () => {
  it('formats rates with their unit', () => {
    expect(formatRate(97.23, 'tok/s')).toBe('97.2 tok/s');
    expect(formatRate(2, 'req/s')).toBe('2 req/s');
    expect(formatRate(0.5)).toBe('0.5/s');
    expect(formatRate(15_300, 'tok/s')).toBe('15.3k tok/s');
    expect(formatRate(null, 'tok/s')).toBe(DASH);
  });
  it('compacts large numbers', () => {
    expect(formatCompact(999)).toBe('999');
    expect(formatCompact(1234.5)).toBe('1235');
    expect(formatCompact(12_345)).toBe('12.3k');
    expect(formatCompact(250_000)).toBe('250k');
    expect(formatCompact(3_400_000)).toBe('3.4M');
    expect(formatCompact(2e9)).toBe('2G');
    expect(formatCompact(1.25)).toBe('1.3');
    expect(formatCompact(0)).toBe('0');
  });
  it('formats counts with thousands separators', () => {
    expect(formatCount(0)).toBe('0');
    expect(formatCount(1234)).toBe('1,234');
    expect(formatCount(1_234_567)).toBe('1,234,567');
    expect(formatCount(-1500)).toBe('-1,500');
    expect(formatCount(null)).toBe(DASH);
  });
});
