import { useEffect, useRef } from 'preact/hooks';
import uPlot from 'uplot';
import 'uplot/dist/uPlot.min.css';
import { cssVar } from '../lib/theme';
import { formatCompact, formatCount } from '../lib/format';

export interface DayChartProps {
  title: string;
  /** Midnight UTC of each day, unix seconds, oldest first. */
  days: number[];
  values: number[];
  color: string;
  testid: string;
}

const HEIGHT = 160;
const DAY = 86_400;
/** Tick steps: every day, 2 days, a week, two weeks, 30 days. */
const DAY_INCRS = [DAY, 2 * DAY, 7 * DAY, 14 * DAY, 30 * DAY];

/** A day as "11-25" (ticks) or "2026-11-25" (hover), in UTC like the relay's days. */
const dayLabel = (unixSecs: number, withYear: boolean) => new Date(unixSecs * 1000).toISOString().slice(withYear ? 0 : 5, 10);

/** Bars per day (uPlot), for the Usage page; the hover legend shows the day and its value. */
export function DayChart({ title, days, values, color, testid }: DayChartProps) {
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
      // Ticks on UTC midnights, where the relay's days start.
      tzDate: (ts) => uPlot.tzDate(new Date(ts * 1000), 'Etc/UTC'),
      legend: { show: true, live: true },
      cursor: { drag: { x: false, y: false }, points: { show: false } },
      scales: {
        // Half a day of room either side, so the first and last bars are whole.
        x: { time: true, range: (_u, min, max) => [min - DAY / 2, max + DAY / 2] },
        y: { range: (_u, _min, max) => [0, max > 0 ? Math.ceil(max * 1.15) : 1] },
      },
      axes: [
        {
          stroke: axisColor,
          grid: { show: false },
          ticks: { stroke: gridColor },
          size: 28,
          space: 48,
          incrs: DAY_INCRS,
          values: (_u, splits) => splits.map((v) => dayLabel(v, false)),
        },
        {
          stroke: axisColor,
          grid: { stroke: gridColor, width: 1 },
          ticks: { stroke: gridColor },
          size: 48,
          values: (_u, splits) => splits.map((v) => formatCompact(v, 1)),
        },
      ],
      series: [
        { label: 'Day', value: (_u, v) => (v == null ? '—' : dayLabel(v, true)) },
        {
          label: title,
          stroke: color,
          fill: `${color}bb`,
          // No outline: a quiet day (0) would otherwise draw a stub on the axis.
          width: 0,
          paths: uPlot.paths.bars!({ size: [0.7, 48], radius: 0.15 }),
          points: { show: false },
          value: (_u, v) => (v == null ? '—' : formatCount(v)),
        },
      ],
    };
    plot.current = new uPlot(opts, [days, values], el);
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
    plot.current?.setData([days, values]);
  }, [days, values]);

  const sum = values.reduce((s, v) => s + v, 0);
  const max = values.reduce((m, v) => (v > m ? v : m), 0);
  return (
    <figure class="chart day-chart" data-testid={testid} data-points={values.length} data-sum={sum} data-max={max}>
      <figcaption>
        <span>{title}</span>
        <strong>{formatCompact(sum, 1)}</strong>
      </figcaption>
      <div
        ref={box}
        class="chart-plot"
        role="img"
        aria-label={`${title}: ${formatCount(sum)} over ${values.length} days, at most ${formatCount(max)} in a day`}
      />
    </figure>
  );
}
