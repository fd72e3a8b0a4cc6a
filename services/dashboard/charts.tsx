// Charts of an app's last hour, drawn as plain SVG: runs per minute (failures
// stacked in red) and latency percentiles per minute. A chart is drawn at the
// width it is shown at, one unit a pixel, so its labels keep their size on a
// phone instead of shrinking with the picture.
import { useLayoutEffect, useRef, useState, type RefObject } from "react";
import type { StatsBucket } from "../../gen/skiff/management/v2/management_pb.js";
import { dateOf, formatDuration } from "./format.js";

/** Width before the figure is measured, and the least a chart is drawn at. */
const DEFAULT_W = 600;
const MIN_W = 240;
const H = 170;
const PAD = { left: 52, right: 10, top: 10, bottom: 24 };
const PLOT_H = H - PAD.top - PAD.bottom;

/** The figure's width in CSS pixels, followed as the window changes. */
function useWidth(): [RefObject<HTMLElement | null>, number] {
  const ref = useRef<HTMLElement | null>(null);
  const [width, setWidth] = useState(DEFAULT_W);
  useLayoutEffect(() => {
    const el = ref.current;
    if (!el) return;
    const measure = () => setWidth(Math.max(MIN_W, Math.round(el.clientWidth) || DEFAULT_W));
    measure();
    const observer = new ResizeObserver(measure);
    observer.observe(el);
    return () => observer.disconnect();
  }, []);
  return [ref, width];
}

/** A round upper bound for the y axis: 1, 2, 5, 10, 20, 50… */
function niceMax(v: number): number {
  if (v <= 0) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  return ([1, 2, 5, 10].find((m) => m * p >= v) ?? 10) * p;
}

const hhmm = (b: StatsBucket | undefined) => {
  const d = dateOf(b?.time);
  return d ? `${String(d.getHours()).padStart(2, "0")}:${String(d.getMinutes()).padStart(2, "0")}` : "";
};

function Axes({
  buckets,
  max,
  format,
  W,
}: {
  buckets: StatsBucket[];
  max: number;
  format: (v: number) => string;
  W: number;
}) {
  return (
    <g className="axes">
      {[0, 0.5, 1].map((f) => {
        const y = PAD.top + PLOT_H * (1 - f);
        return (
          <g key={f}>
            <line x1={PAD.left} x2={W - PAD.right} y1={y} y2={y} className="grid" />
            <text x={PAD.left - 6} y={y + 4} textAnchor="end">
              {format(max * f)}
            </text>
          </g>
        );
      })}
      <text x={PAD.left} y={H - 6}>
        {hhmm(buckets[0])}
      </text>
      <text x={W - PAD.right} y={H - 6} textAnchor="end">
        {hhmm(buckets.at(-1))}
      </text>
    </g>
  );
}

export function RunsChart({ buckets, title }: { buckets: StatsBucket[]; title: string }) {
  const [ref, W] = useWidth();
  const PLOT_W = W - PAD.left - PAD.right;
  const max = niceMax(Math.max(...buckets.map((b) => b.runs)));
  const slot = PLOT_W / Math.max(buckets.length, 1);
  const total = buckets.reduce((n, b) => n + b.runs, 0);
  const failures = buckets.reduce((n, b) => n + b.failures, 0);
  return (
    <figure className="chart" ref={ref}>
      <svg
        viewBox={`0 0 ${W} ${H}`}
        role="img"
        aria-label={`${title}: ${total} runs in the last hour, ${failures} failed`}
      >
        <Axes buckets={buckets} max={max} format={(v) => String(Number(v.toFixed(1)))} W={W} />
        {buckets.map((b, i) => {
          const x = PAD.left + i * slot + 1;
          const h = (b.runs / max) * PLOT_H;
          const hf = (b.failures / max) * PLOT_H;
          return (
            <g key={i}>
              <title>{`${hhmm(b)}: ${b.runs} runs, ${b.failures} failed`}</title>
              <rect x={x} width={Math.max(slot - 2, 1)} y={PAD.top + PLOT_H - h} height={h} className="bar" />
              {hf > 0 && (
                <rect
                  x={x}
                  width={Math.max(slot - 2, 1)}
                  y={PAD.top + PLOT_H - hf}
                  height={hf}
                  className="bar failure"
                />
              )}
            </g>
          );
        })}
      </svg>
      <figcaption>
        {title}: <strong>{total}</strong> runs in the last hour,{" "}
        <strong className={failures ? "bad-text" : undefined}>{failures}</strong> failed.{" "}
        <span className="legend bar">runs</span> <span className="legend failure">failures</span>
      </figcaption>
    </figure>
  );
}

const SERIES = [
  { key: "p50Ms", label: "p50", className: "p50" },
  { key: "p95Ms", label: "p95", className: "p95" },
  { key: "p99Ms", label: "p99", className: "p99" },
] as const;

export function LatencyChart({ buckets, title }: { buckets: StatsBucket[]; title: string }) {
  const [ref, W] = useWidth();
  const PLOT_W = W - PAD.left - PAD.right;
  const max = niceMax(Math.max(...buckets.map((b) => b.p99Ms)));
  const step = PLOT_W / Math.max(buckets.length - 1, 1);
  const withRuns = buckets.filter((b) => b.runs > 0);
  const worst = withRuns.length ? Math.max(...withRuns.map((b) => b.p99Ms)) : undefined;
  return (
    <figure className="chart" ref={ref}>
      <svg
        viewBox={`0 0 ${W} ${H}`}
        role="img"
        aria-label={`${title}: ${worst === undefined ? "no finished runs" : `worst p99 ${formatDuration(worst)}`} in the last hour`}
      >
        <Axes
          buckets={buckets}
          max={max}
          format={(v) => (v > 0 && v < 10 ? `${Number(v.toFixed(1))} ms` : formatDuration(v))}
          W={W}
        />
        {SERIES.map((s) => {
          // One line through the minutes that have runs: a minute without runs has no percentile, so the line
          // passes over it rather than dropping to zero or breaking into pieces; a dot marks each measured minute.
          const points = buckets.flatMap((b, i) =>
            b.runs === 0 ? [] : [[PAD.left + i * step, PAD.top + PLOT_H * (1 - b[s.key] / max)] as const],
          );
          return (
            <g key={s.key} className={`series ${s.className}`}>
              {points.length > 1 && <polyline points={points.map(([x, y]) => `${x},${y}`).join(" ")} />}
              {points.map(([x, y], j) => (
                <circle key={j} cx={x} cy={y} r={2.5} />
              ))}
            </g>
          );
        })}
      </svg>
      <figcaption>
        {title}:{" "}
        {worst === undefined ? (
          "no finished runs in the last hour."
        ) : (
          <>
            worst p99 <strong>{formatDuration(worst)}</strong>.
          </>
        )}{" "}
        {SERIES.map((s) => (
          <span key={s.key} className={`legend ${s.className}`}>
            {s.label}
          </span>
        ))}
      </figcaption>
    </figure>
  );
}
