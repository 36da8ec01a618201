// A worker's box as the dashboard shows it: bars for CPU, memory and each GPU's VRAM, a
// sparkline per measure, and its model map's states. Pure: unit-tested in hardware.test.ts.
import type { HardwareHistory, ModelStateReport, WorkerInfo } from '../types';
import type { Tone } from './viewmodel';

export interface Meter {
  /** What is measured, e.g. `CPU`, `Memory`, `VRAM`. */
  label: string;
  /** 0–1 for the bar. */
  fraction: number;
  /** What the bar says, e.g. `4.2 / 16 GiB`. */
  text: string;
  tone: Tone;
}

export interface GpuView {
  name: string;
  vram: Meter | null;
  /** `97%`, or null when the tool did not say. */
  utilization: string | null;
  /** `71 °C`, or null. */
  temperature: string | null;
  temperatureTone: Tone;
}

export interface Sparkline {
  label: string;
  /** Percent values, oldest first (gaps as null). */
  values: (number | null)[];
}

export interface ModelStateView {
  model: string;
  state: string;
  tone: Tone;
  /** How long its last load took, where measured ("loads in 1.2 s"). */
  load: string | null;
}

export interface HardwareView {
  cpu: Meter | null;
  memory: Meter | null;
  gpus: GpuView[];
  sparklines: Sparkline[];
  models: ModelStateView[];
}

/** Above this share a meter is a warning; above the second, bad. */
const WARN_AT = 0.8;
const BAD_AT = 0.95;
/** GPU temperatures (°C) worth a warning, and a bad tone. */
const HOT_C = 80;
const TOO_HOT_C = 90;

function toneOf(fraction: number): Tone {
  if (fraction >= BAD_AT) return 'bad';
  if (fraction >= WARN_AT) return 'warn';
  return 'ok';
}

const clamp01 = (x: number) => (Number.isFinite(x) ? Math.min(1, Math.max(0, x)) : 0);

/** MiB as `512 MiB` or `23.9 GiB`. */
export function formatMiB(mb: number): string {
  if (!Number.isFinite(mb) || mb < 0) return '—';
  if (mb < 1024) return `${Math.round(mb)} MiB`;
  const gib = mb / 1024;
  return `${gib < 10 ? gib.toFixed(1) : Math.round(gib)} GiB`;
}

function usageMeter(label: string, used: number | null | undefined, total: number | null | undefined): Meter | null {
  if (used == null || total == null || !(total > 0)) return null;
  const fraction = clamp01(used / total);
  return { label, fraction, text: `${formatMiB(used)} / ${formatMiB(total)}`, tone: toneOf(fraction) };
}

const MODEL_TONES: Record<string, Tone> = {
  loaded: 'ok',
  starting: 'busy',
  idle: 'muted',
  // A backend the worker does not manage freed it by itself; it loads at the next request.
  unloaded: 'muted',
  stopping: 'busy',
  failed: 'bad',
};

function sparklines(history: HardwareHistory | undefined): Sparkline[] {
  if (!history || history.unix_ms.length === 0) return [];
  const lines: Sparkline[] = [
    { label: 'CPU', values: history.cpu_percent },
    { label: 'Memory', values: history.memory_percent },
    { label: 'VRAM', values: history.vram_percent },
  ];
  // A measure no report had (VRAM on a box without GPUs) gets no line.
  return lines.filter((l) => l.values.some((v) => v != null));
}

export function toModelStates(states: ModelStateReport[] | null | undefined): ModelStateView[] {
  return (states ?? []).map((s) => ({
    model: s.model,
    state: s.state,
    tone: MODEL_TONES[s.state] ?? 'muted',
    load: s.load_ms != null ? `loads in ${(s.load_ms / 1000).toFixed(1)} s` : null,
  }));
}

/** The worker's box, or null when it reported nothing (a published worker, an older relay). */
export function toHardwareView(
  worker: Partial<Pick<WorkerInfo, 'hardware' | 'hardware_history' | 'model_states'>>,
): HardwareView | null {
  const hw = worker.hardware;
  const models = toModelStates(worker.model_states);
  if (!hw && models.length === 0) return null;
  const cpu =
    hw?.cpu_percent != null
      ? { label: 'CPU', fraction: clamp01(hw.cpu_percent / 100), text: `${Math.round(hw.cpu_percent)}%`, tone: toneOf(hw.cpu_percent / 100) }
      : null;
  const gpus: GpuView[] = (hw?.gpus ?? []).map((g) => ({
    name: g.name || 'GPU',
    vram: usageMeter('VRAM', g.vram_used_mb, g.vram_total_mb),
    utilization: g.utilization_percent != null ? `${g.utilization_percent}%` : null,
    temperature: g.temperature_c != null ? `${g.temperature_c} °C` : null,
    temperatureTone:
      g.temperature_c == null ? 'muted' : g.temperature_c >= TOO_HOT_C ? 'bad' : g.temperature_c >= HOT_C ? 'warn' : 'ok',
  }));
  return {
    cpu,
    memory: usageMeter('Memory', hw?.memory_used_mb, hw?.memory_total_mb),
    gpus,
    sparklines: sparklines(worker.hardware_history),
    models,
  };
}

/**
 * An SVG polyline's points for `values` (percent) in a `width` × `height` box; a gap (null)
 * splits the line into segments.
 */
export function sparklinePaths(values: (number | null)[], width: number, height: number): string[] {
  const n = values.length;
  if (n === 0) return [];
  const step = n > 1 ? width / (n - 1) : 0;
  const segments: string[] = [];
  let current: string[] = [];
  values.forEach((v, i) => {
    if (v == null || !Number.isFinite(v)) {
      if (current.length) segments.push(current.join(' '));
      current = [];
      return;
    }
    const x = n > 1 ? i * step : width / 2;
    const y = height - (Math.min(100, Math.max(0, v)) / 100) * height;
    current.push(`${x.toFixed(1)},${y.toFixed(1)}`);
  });
  if (current.length) segments.push(current.join(' '));
  return segments;
}
