import { Badge } from './common';
import { sparklinePaths, type HardwareView, type Meter, type Sparkline } from '../lib/hardware';

const SPARK_W = 120;
const SPARK_H = 24;

function MeterBar({ meter, testid }: { meter: Meter; testid: string }) {
  const percent = Math.round(meter.fraction * 100);
  return (
    <div class="meter" data-testid={testid} data-tone={meter.tone}>
      <span class="meter-label">{meter.label}</span>
      <span
        class={`bar meter-bar meter-${meter.tone}`}
        role="meter"
        aria-label={meter.label}
        aria-valuemin={0}
        aria-valuemax={100}
        aria-valuenow={percent}
      >
        <span style={{ width: `${percent}%` }} />
      </span>
      <span class="meter-text">{meter.text}</span>
    </div>
  );
}

function SparklineSvg({ line }: { line: Sparkline }) {
  const last = [...line.values].reverse().find((v) => v != null);
  return (
    <figure class="spark" data-testid="hardware-sparkline" data-label={line.label}>
      <svg width={SPARK_W} height={SPARK_H} viewBox={`0 0 ${SPARK_W} ${SPARK_H}`} aria-hidden="true">
        {sparklinePaths(line.values, SPARK_W, SPARK_H).map((points, i) => (
          <polyline key={i} points={points} fill="none" stroke="currentColor" stroke-width="1.5" />
        ))}
      </svg>
      <figcaption>
        {line.label} {last != null ? `${last}%` : '—'}
      </figcaption>
    </figure>
  );
}

/** One worker's box: CPU, memory and GPU bars, sparklines, and its model map's states. */
export function WorkerHardware({ view }: { view: HardwareView }) {
  return (
    <div class="hardware" data-testid="worker-hardware">
      <div class="meters">
        {view.cpu ? <MeterBar meter={view.cpu} testid="hardware-cpu" /> : null}
        {view.memory ? <MeterBar meter={view.memory} testid="hardware-memory" /> : null}
        {view.gpus.map((gpu, i) => (
          <div class="gpu" key={i} data-testid="hardware-gpu">
            <div class="gpu-head">
              <strong data-testid="gpu-name">{gpu.name}</strong>
              {gpu.utilization ? <span class="muted small" data-testid="gpu-utilization"> {gpu.utilization} busy</span> : null}
              {gpu.temperature ? (
                <Badge tone={gpu.temperatureTone} testid="gpu-temperature">
                  {gpu.temperature}
                </Badge>
              ) : null}
            </div>
            {gpu.vram ? <MeterBar meter={gpu.vram} testid="gpu-vram" /> : null}
          </div>
        ))}
      </div>
      {view.sparklines.length ? (
        <div class="sparks">
          {view.sparklines.map((line) => (
            <SparklineSvg key={line.label} line={line} />
          ))}
        </div>
      ) : null}
      {view.models.length ? (
        <div class="model-states" data-testid="worker-model-states">
          {view.models.map((m) => (
            <span key={m.model} class="model-state" data-testid="worker-model-state" data-model={m.model} data-state={m.state}>
              <code>{m.model}</code>{' '}
              <Badge tone={m.tone}>{m.state}</Badge>
              {m.load ? <span class="muted"> {m.load}</span> : null}
            </span>
          ))}
        </div>
      ) : null}
    </div>
  );
}
