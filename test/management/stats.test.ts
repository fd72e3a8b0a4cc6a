// GetAppStats, which the Apps page charts: per-minute buckets over the last
// hour, counted by queue time, with nearest-rank percentiles of finished runs.
// The figures of each minute come from the run history (its query is tested
// in test/runs/history/history.test.ts); here, how they become the hour's 60 buckets.
import { describe, expect, it } from "vitest";
import { hourBuckets, STATS_MINUTES } from "../../services/management/stats.js";

const MINUTE = 60_000;
const NOW = Date.parse("2030-01-01T12:30:20Z");
const minute = (iso: string, runs: number, failures = 0, p = [0, 0, 0]) => ({
  minuteMs: Date.parse(iso),
  runs,
  failures,
  p50Ms: p[0],
  p95Ms: p[1],
  p99Ms: p[2],
});

describe("app stats - buckets of the last hour", () => {
  it("60 minutes, oldest first, the last one the current minute", () => {
    const buckets = hourBuckets([], NOW);
    expect(buckets).toHaveLength(STATS_MINUTES);
    expect(new Date(buckets[59].timeMs).toISOString()).toBe("2030-01-01T12:30:00.000Z");
    expect(new Date(buckets[0].timeMs).toISOString()).toBe("2030-01-01T11:31:00.000Z");
    expect(buckets.every((b) => b.runs === 0 && b.p99Ms === 0)).toBe(true);
  });

  it("each minute's figures land in its bucket; minutes outside the hour are left out", () => {
    const buckets = hourBuckets(
      [
        minute("2030-01-01T11:30:00Z", 9, 9, [1, 1, 1]), // before the hour
        minute("2030-01-01T11:31:00Z", 2, 0, [3, 4, 5]),
        minute("2030-01-01T12:29:00Z", 1, 1, [400, 400, 400]),
        minute("2030-01-01T12:30:00Z", 5, 1, [20, 30, 30]),
      ],
      NOW,
    );
    expect(buckets[0]).toEqual({
      timeMs: NOW - 59 * MINUTE - 20_000,
      runs: 2,
      failures: 0,
      p50Ms: 3,
      p95Ms: 4,
      p99Ms: 5,
    });
    expect(buckets[58]).toMatchObject({ runs: 1, failures: 1, p50Ms: 400 });
    expect(buckets[59]).toMatchObject({ runs: 5, failures: 1, p50Ms: 20, p95Ms: 30, p99Ms: 30 });
    expect(buckets.reduce((n, b) => n + b.runs, 0)).toBe(8);
  });
});
