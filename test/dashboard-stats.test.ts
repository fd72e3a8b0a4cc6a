// GetAppStats, which the Apps page charts: per-minute buckets over the last
// hour, counted by queue time, with nearest-rank percentiles of finished runs.
import { describe, expect, it } from "vitest";
import { bucketRuns, percentile, STATS_MINUTES } from "../services/management/stats.js";
import type { RunRecord } from "../services/runs/store.js";

const MINUTE = 60_000;
const NOW = Date.parse("2030-01-01T12:30:20Z");
const run = (queuedMsAgo: number, status: RunRecord["status"], runTimeMs?: number) => ({
  queued_at: new Date(NOW - queuedMsAgo).toISOString(),
  status,
  run_time_ms: runTimeMs,
});

describe("app stats - buckets of the last hour", () => {
  it("nearest-rank percentiles", () => {
    const values = Array.from({ length: 100 }, (_, i) => i + 1);
    expect(percentile(values, 50)).toBe(50);
    expect(percentile(values, 95)).toBe(95);
    expect(percentile(values, 99)).toBe(99);
    expect(percentile([7], 99)).toBe(7);
    expect(percentile([], 50)).toBe(0);
  });

  it("60 minutes, oldest first, the last one the current minute", () => {
    const buckets = bucketRuns([], NOW);
    expect(buckets).toHaveLength(STATS_MINUTES);
    expect(new Date(buckets[59].timeMs).toISOString()).toBe("2030-01-01T12:30:00.000Z");
    expect(new Date(buckets[0].timeMs).toISOString()).toBe("2030-01-01T11:31:00.000Z");
    expect(buckets.every((b) => b.runs === 0 && b.p99Ms === 0)).toBe(true);
  });

  it("counts runs and failures by the minute they were queued; run times of finished runs only", () => {
    const buckets = bucketRuns(
      [
        run(5_000, "success", 10),
        run(6_000, "failure", 30),
        run(7_000, "success", 20),
        run(8_000, "running"),
        run(9_000, "cancelled", 999),
        run(MINUTE + 1_000, "failure", 400),
        run(61 * MINUTE, "success", 5), // before the hour
      ],
      NOW,
    );
    const last = buckets[59];
    expect(last).toMatchObject({ runs: 5, failures: 1, p50Ms: 20, p95Ms: 30, p99Ms: 30 });
    expect(buckets[58]).toMatchObject({ runs: 1, failures: 1, p50Ms: 400 });
    expect(buckets.reduce((n, b) => n + b.runs, 0)).toBe(6);
  });
});
