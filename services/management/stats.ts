// GetAppStats: an app's last hour, one bucket a minute, from the run history
// (one SQL query that groups the hour's runs by minute, so no call scans the
// KV bucket or holds the runs in memory).
//
// A run counts in the minute it was queued: "runs per minute" is the rate at
// which work arrived. Failures are those runs that ended `failure`; the
// percentiles (nearest rank) are over the run times of those that finished
// (success or failure) — queued, running and cancelled runs have no run time
// to count. The query walks the app's index from the hour's first run id on:
// it reads one hour of runs, never the whole history.
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, type ServiceImpl } from "@connectrpc/connect";
import type { ManagementService, StatsBucket } from "../../gen/skiff/management/v2/management_pb.js";
import { APP_NAME_PATTERN } from "../apps/index.js";
import type { MinuteStats } from "../runs/index.js";
import type { ManagementDeps } from "./deps.js";
import * as valid from "./validation.js";

type Impl = ServiceImpl<typeof ManagementService>;

export const STATS_MINUTES = 60;
const MINUTE_MS = 60_000;

type Bucket = Pick<StatsBucket, "runs" | "failures" | "p50Ms" | "p95Ms" | "p99Ms"> & { timeMs: number };

/** The first minute of the hour that ends with the minute of `now`. */
const hourStart = (now: number) => Math.floor(now / MINUTE_MS) * MINUTE_MS - (STATS_MINUTES - 1) * MINUTE_MS;

/**
 * One bucket per minute of the hour that ends with the current minute,
 * oldest first, from the figures of the minutes that had runs; minutes
 * outside that hour are ignored.
 */
export function hourBuckets(minutes: readonly MinuteStats[], now: number): Bucket[] {
  const first = hourStart(now);
  const buckets: Bucket[] = Array.from({ length: STATS_MINUTES }, (_, i) => ({
    timeMs: first + i * MINUTE_MS,
    runs: 0,
    failures: 0,
    p50Ms: 0,
    p95Ms: 0,
    p99Ms: 0,
  }));
  for (const m of minutes) {
    const i = Math.floor((m.minuteMs - first) / MINUTE_MS);
    if (i >= 0 && i < STATS_MINUTES) buckets[i] = { ...m, timeMs: buckets[i].timeMs };
  }
  return buckets.map(({ timeMs, runs, failures, p50Ms, p95Ms, p99Ms }) => ({
    timeMs,
    runs,
    failures,
    p50Ms,
    p95Ms,
    p99Ms,
  }));
}

export function statsHandlers(deps: ManagementDeps): Pick<Impl, "getAppStats"> {
  return {
    async getAppStats(req) {
      const projectId = valid.projectId(req.projectId);
      const project = await deps.projects.get(projectId);
      const known =
        APP_NAME_PATTERN.test(req.appName) && project && (await deps.apps.store.get(projectId, req.appName));
      if (!known)
        throw new ConnectError(
          `app ${JSON.stringify(req.appName.slice(0, 80))} not found in project ${projectId}`,
          Code.NotFound,
        );
      const now = Date.now();
      const from = hourStart(now);
      const history = await deps.runs.history();
      // Runs made before the project's creation are those of a deleted project of that id.
      const own = Math.max(from, Date.parse(project!.runs_since ?? "") || 0);
      const minutes = await history.minuteStats(projectId, req.appName, own, from + STATS_MINUTES * MINUTE_MS);
      return {
        buckets: hourBuckets(minutes, now).map(({ timeMs, ...b }) => ({ ...b, time: timestampFromMs(timeMs) })),
      };
    },
  };
}
