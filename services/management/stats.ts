// GetAppStats: an app's last hour, one bucket a minute, from the run records
// the run index holds in memory (so no call scans the KV bucket).
//
// A run counts in the minute it was queued: "runs per minute" is the rate at
// which work arrived. Failures are those runs that ended `failure`; the
// percentiles are over the run times of those that finished (success or
// failure) — queued, running and cancelled runs have no run time to count.
// Since run ids sort by queue time, the walk goes from the newest run back
// and stops at the first one queued before the hour: it reads one hour of
// runs, never the whole history.
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, type ServiceImpl } from "@connectrpc/connect";
import type { ManagementService, StatsBucket } from "../../gen/skiff/management/v2/management_pb.js";
import { APP_NAME_PATTERN } from "../apps/index.js";
import type { RunIndex } from "./run-index.js";
import type { RunRecord } from "../runs/index.js";
import type { ManagementDeps } from "./deps.js";
import * as valid from "./validation.js";

type Impl = ServiceImpl<typeof ManagementService>;

export const STATS_MINUTES = 60;
const MINUTE_MS = 60_000;
/** Runs read from the index per step of the walk. */
const WALK_PAGE = 500;

/** Nearest-rank percentile of ascending values; 0 when there are none. */
export function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return 0;
  const rank = Math.ceil((p / 100) * sorted.length);
  return sorted[Math.min(Math.max(rank, 1), sorted.length) - 1];
}

type Bucket = Pick<StatsBucket, "runs" | "failures" | "p50Ms" | "p95Ms" | "p99Ms"> & { timeMs: number };

/**
 * One bucket per minute of the hour that ends with the current minute,
 * oldest first. Runs outside that hour are ignored.
 */
export function bucketRuns(
  runs: Iterable<Pick<RunRecord, "queued_at" | "status" | "run_time_ms">>,
  now: number,
): Bucket[] {
  const first = Math.floor(now / MINUTE_MS) * MINUTE_MS - (STATS_MINUTES - 1) * MINUTE_MS;
  const counts = Array.from({ length: STATS_MINUTES }, () => ({ runs: 0, failures: 0, times: [] as number[] }));
  for (const r of runs) {
    const i = Math.floor((Date.parse(r.queued_at) - first) / MINUTE_MS);
    if (!(i >= 0 && i < STATS_MINUTES)) continue;
    const c = counts[i];
    c.runs++;
    if (r.status === "failure") c.failures++;
    if ((r.status === "success" || r.status === "failure") && r.run_time_ms !== undefined) c.times.push(r.run_time_ms);
  }
  return counts.map((c, i) => {
    const sorted = c.times.sort((a, b) => a - b);
    return {
      timeMs: first + i * MINUTE_MS,
      runs: c.runs,
      failures: c.failures,
      p50Ms: percentile(sorted, 50),
      p95Ms: percentile(sorted, 95),
      p99Ms: percentile(sorted, 99),
    };
  });
}

/** The app's runs queued at or after `since`, newest first. */
function* runsSince(index: RunIndex, projectId: string, appName: string, since: number): Generator<RunRecord> {
  let after: string | undefined;
  for (;;) {
    const page = index.list(projectId, appName, { pageSize: WALK_PAGE, after });
    for (const r of page.runs) {
      if (Date.parse(r.queued_at) < since) return;
      yield r;
    }
    if (page.next === undefined) return;
    after = page.next;
  }
}

export function statsHandlers(deps: ManagementDeps): Pick<Impl, "getAppStats"> {
  return {
    async getAppStats(req) {
      const projectId = valid.projectId(req.projectId);
      const known =
        APP_NAME_PATTERN.test(req.appName) &&
        (await deps.projects.get(projectId)) &&
        (await deps.apps.store.get(projectId, req.appName));
      if (!known)
        throw new ConnectError(
          `app ${JSON.stringify(req.appName.slice(0, 80))} not found in project ${projectId}`,
          Code.NotFound,
        );
      const now = Date.now();
      const since = Math.floor(now / MINUTE_MS) * MINUTE_MS - (STATS_MINUTES - 1) * MINUTE_MS;
      const buckets = bucketRuns(runsSince(deps.runs.index, projectId, req.appName, since), now);
      return { buckets: buckets.map(({ timeMs, ...b }) => ({ ...b, time: timestampFromMs(timeMs) })) };
    },
  };
}
