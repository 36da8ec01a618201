import { describe, expect, it } from 'vitest';
import { formatMiB, sparklinePaths, toHardwareView, toModelStates } from './hardware';

const box = {
  hardware: {
    cpu_percent: 12,
    memory_used_mb: 4096,
    memory_total_mb: 16384,
    gpus: [
      { name: 'NVIDIA GeForce RTX 4090', vram_used_mb: 23900, vram_total_mb: 24564, utilization_percent: 97, temperature_c: 83 },
      { name: 'NVIDIA RTX A6000', vram_used_mb: 3, vram_total_mb: 49140 },
    ],
  },
  hardware_history: { unix_ms: [1, 2], cpu_percent: [10, 12], memory_percent: [25, 25], vram_percent: [null, null] },
  model_states: [
    { model: 'llama', state: 'loaded' },
    { model: 'qwen', state: 'idle' },
    { model: 'new', state: 'some-future-state' },
    { model: 'gemma', state: 'unloaded', load_ms: 1240 },
  ],
};

describe('toHardwareView', () => {
  it('turns a report into meters with tones, GPU facts and model states', () => {
    const view = toHardwareView(box)!;
    expect(view.cpu).toEqual({ label: 'CPU', fraction: 0.12, text: '12%', tone: 'ok' });
    expect(view.memory?.text).toBe('4.0 GiB / 16 GiB');
    expect(view.memory?.fraction).toBe(0.25);
    expect(view.gpus[0].vram?.tone).toBe('bad');
    expect(view.gpus[0].utilization).toBe('97%');
    expect(view.gpus[0].temperature).toBe('83 °C');
    expect(view.gpus[0].temperatureTone).toBe('warn');
    expect(view.gpus[1].vram?.text).toBe('3 MiB / 48 GiB');
    expect(view.gpus[1].utilization).toBeNull();
    expect(view.gpus[1].temperatureTone).toBe('muted');
    expect(view.models.map((m) => m.tone)).toEqual(['ok', 'muted', 'muted', 'muted']);
    expect(view.models.map((m) => m.load)).toEqual([null, null, null, 'loads in 1.2 s']);
  });

  it('leaves out what a report lacks and draws no line for a measure never reported', () => {
    const view = toHardwareView(box)!;
    expect(view.sparklines.map((s) => s.label)).toEqual(['CPU', 'Memory']);
    const bare = toHardwareView({ hardware: { memory_used_mb: 1, memory_total_mb: 0 } })!;
    expect(bare.cpu).toBeNull();
    expect(bare.memory).toBeNull();
    expect(bare.gpus).toEqual([]);
    expect(bare.sparklines).toEqual([]);
  });

  it('is null for a worker that reports nothing (a published worker, an older relay)', () => {
    expect(toHardwareView({})).toBeNull();
    expect(toHardwareView({ hardware: null, model_states: null })).toBeNull();
    expect(toHardwareView({ model_states: [{ model: 'm', state: 'starting' }] })?.models[0].tone).toBe('busy');
  });

  it('clamps odd numbers instead of drawing past the bar', () => {
    const view = toHardwareView({ hardware: { cpu_percent: 250, memory_used_mb: 20, memory_total_mb: 10 } })!;
    expect(view.cpu?.fraction).toBe(1);
    expect(view.memory?.fraction).toBe(1);
  });
});

describe('helpers', () => {
  it('formats MiB and GiB', () => {
    expect(formatMiB(512)).toBe('512 MiB');
    expect(formatMiB(24564)).toBe('24 GiB');
    expect(formatMiB(-1)).toBe('—');
  });

  it('draws sparkline segments split at gaps, clamped to the box', () => {
    expect(sparklinePaths([], 100, 20)).toEqual([]);
    expect(sparklinePaths([50], 100, 20)).toEqual(['50.0,10.0']);
    expect(sparklinePaths([0, 100, null, 200], 90, 20)).toEqual(['0.0,20.0 30.0,0.0', '90.0,0.0']);
  });

  it('maps model states to tones', () => {
    expect(toModelStates(null)).toEqual([]);
    expect(toModelStates([{ model: 'a', state: 'failed' }])[0].tone).toBe('bad');
  });
});
