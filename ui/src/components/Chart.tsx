import { useEffect, useRef } from 'preact/hooks';
import uPlot from 'uplot';
import 'uplot/dist/uPlot.min.css';
import { cssVar } from '../lib/theme';
import { formatCompact } from '../lib/format';

export interface ChartProps {
  title: string;
  data: [number[], number[]];
  color: string;
  testid: string;
  integer?: boolean;
}

const HEIGHT = 130;
/** The x axis always spans at least this many seconds, so a young series does not stretch. */
const MIN_WINDOW_SECS = 60;
const TIME_INCRS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600];

const pad2 = (n: number) => String(n).padStart(2, '0');
function clock(unixSecs: number, withSeconds: boolean): string {
  const d = new Date(unixSecs * 1000);
  const hm = `${pad2(d.getHours())}:${pad2(d.getMinutes())}`;
  return withSeconds ? `${hm}:${pad2(d.getSeconds())}` : hm;
}

/** One live time series (uPlot), updated in place on each status event. */
export function Chart({ title, data, color, testid, integer }: ChartProps) {
  const box = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | null>(null);

  useEffect(() => {
    const el = box.current;
    if (!el) return;
    const axisColor = cssVar('--muted', '#6b7280');
    const gridColor = cssVar('--grid', 'rgba(128,128,128,0.15)');
    const opts: uPlot.Options = {
      width: Math.max(200, el.clientWidth),
      height: HEIGHT,
      legend: { show: false },
      cursor: { drag: { x: false, y: false }, points: { size: 6 } },
      scales: {
        x: {
          time: true,
          range: (_u, min, max) => {
            const hi = Number.isFinite(max) ? max : Math.floor(Date.now() / 1000);
            const lo = Number.isFinite(min) ? min : hi;
            return [Math.min(lo, hi - MIN_WINDOW_SECS), hi];
          },
        },
        y: {
          range: (_u, _min, max) => [0, max > 0 ? (integer ? Math.max(1, Math.ceil(max * 1.15)) : max * 1.15) : 1],
        },
      },
      axes: [
        {
          stroke: axisColor,
          grid: { stroke: gridColor, width: 1 },
          ticks: { stroke: gridColor },
          size: 28,
          space: 70,
          incrs: TIME_INCRS,
          values: (_u, splits, _axis, _space, incr) => splits.map((v) => clock(v, incr < 60)),
        },
        {
          stroke: axisColor,
          grid: { stroke: gridColor, width: 1 },
          ticks: { stroke: gridColor },
          size: 44,
          values: (_u, splits) => splits.map((v) => formatCompact(v, 1)),
        },
      ],
      series: [{}, { label: title, stroke: color, width: 2, fill: `${color}22`, points: { show: false } }],
    };
    plot.current = new uPlot(opts, data, el);
    const ro = new ResizeObserver(() => {
      if (plot.current && el.clientWidth > 0) plot.current.setSize({ width: el.clientWidth, height: HEIGHT });
    });
    ro.observe(el);
    return () => {
      ro.disconnect();
      plot.current?.destroy();
      plot.current = null;
    };
    // created once; data updates go through setData below
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, []);

  useEffect(() => {
    plot.current?.setData(data);
  }, [data]);

  const ys = data[1];
  const last = ys.length ? ys[ys.length - 1] : 0;
  const max = ys.reduce((m, v) => (v > m ? v : m), 0);
  const sum = ys.reduce((s, v) => s + v, 0);
  return (
    <figure class="chart" data-testid={testid} data-points={ys.length} data-last={last} data-max={max} data-sum={sum}>
      <figcaption>
        <span>{title}</span>
        <strong>{formatCompact(last, 1)}</strong>
      </figcaption>
      <div ref={box} class="chart-plot" role="img" aria-label={`${title}: last ${formatCompact(last, 1)}, peak ${formatCompact(max, 1)}`} />
    </figure>
  );
}
