// The runs of every app, in memory, for listing: fed by a watch on KV
// `skiff-runs` in the processes that serve the run API, so ListRuns never
// scans the bucket. Run ids are UUIDv7, whose text order is their time order,
// so each app keeps a sorted array of ids (new runs append) and a page is a
// walk backwards from the newest, or from just below the page token.
//
// The index follows the bucket a few milliseconds behind a write; GetRun
// reads the bucket itself. Records expire from the bucket RUN_RETENTION_MS
// after their last write without a delete marker, so the index forgets runs
// of that age by itself (hourly, by the time inside their ids).
import type { KvEntry, NatsConnection } from "nats";
import { followKv, type KvFollower, buckets, RUN_RETENTION_MS } from "../nats/index.js";
import type { Logger } from "../config/index.js";
import { decodeRunRecord, type RunRecord, type RunStatus } from "../runs/index.js";

export const DEFAULT_INDEX_INIT_TIMEOUT_MS = 30_000;
const PRUNE_EVERY_MS = 60 * 60 * 1000;

/** The smallest UUIDv7 text of a given time: ids below it are older. */
function idAt(ms: number): string {
  const hex = Math.max(0, Math.floor(ms)).toString(16).padStart(12, "0");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}`;
}

interface AppRuns {
  /** Run ids, ascending. */
  ids: string[];
  byId: Map<string, RunRecord>;
}

export interface ListQuery {
  pageSize: number;
  /** Run id the previous page ended with; the page starts below it. */
  after?: string;
  asyncOnly?: boolean;
  status?: RunStatus;
}

/** Index of the first id >= `id` in an ascending array. */
function lowerBound(ids: string[], id: string): number {
  let lo = 0;
  let hi = ids.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (ids[mid] < id) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

export class RunIndex {
  private readonly apps = new Map<string, AppRuns>();
  private readonly listeners = new Set<(r: RunRecord) => void>();
  private follower: KvFollower | undefined;
  private readonly pruner = setInterval(() => this.prune(), PRUNE_EVERY_MS).unref();

  private constructor(private readonly logger: Logger) {}

  /** Resolves once the stored runs are loaded (or the wait timed out; the watch keeps filling the index). */
  static async start(nc: NatsConnection, logger: Logger, timeoutMs = DEFAULT_INDEX_INIT_TIMEOUT_MS): Promise<RunIndex> {
    const kv = await nc.jetstream().views.kv(buckets.runs.name, { bindOnly: true });
    const index = new RunIndex(logger);
    // A closed connection ends the watch for good (the process is stopping).
    index.follower = followKv({
      kv,
      name: "runs",
      logger,
      initTimeoutMs: timeoutMs,
      shouldStop: () => nc.isClosed(),
      onEntry: (e) => index.apply(e),
    });
    await index.follower.ready;
    return index;
  }

  /** Runs of one app, newest first, and the id to continue after when there are more. */
  list(projectId: string, appName: string, q: ListQuery): { runs: RunRecord[]; next: string | undefined } {
    const app = this.apps.get(`${projectId}.${appName}`);
    if (!app) return { runs: [], next: undefined };
    const { ids, byId } = app;
    let i = q.after === undefined ? ids.length - 1 : lowerBound(ids, q.after) - 1;
    const runs: RunRecord[] = [];
    for (; i >= 0 && runs.length < q.pageSize; i--) {
      const r = byId.get(ids[i])!;
      if ((q.asyncOnly && !r.async) || (q.status !== undefined && r.status !== q.status)) continue;
      runs.push(r);
    }
    // More may follow only if the walk stopped early; an exact end gives no token.
    return { runs, next: i >= 0 && runs.length > 0 ? runs[runs.length - 1].run_id : undefined };
  }

  /** How many runs the index holds. */
  get size(): number {
    let n = 0;
    for (const a of this.apps.values()) n += a.ids.length;
    return n;
  }

  /** Calls `listener` with every record written from now on; returns a function that stops it. */
  onChange(listener: (r: RunRecord) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  close(): void {
    clearInterval(this.pruner);
    this.listeners.clear();
    this.follower?.stop();
  }

  /** Forgets runs queued more than RUN_RETENTION_MS before `now`; returns how many. */
  prune(now = Date.now()): number {
    const cutoff = idAt(now - RUN_RETENTION_MS);
    let dropped = 0;
    for (const [key, app] of this.apps) {
      const n = lowerBound(app.ids, cutoff);
      if (n === 0) continue;
      for (const id of app.ids.splice(0, n)) app.byId.delete(id);
      dropped += n;
      if (app.ids.length === 0) this.apps.delete(key);
    }
    return dropped;
  }

  private apply(entry: KvEntry): void {
    // Keys are {project}.{app}.{run_id}; neither part contains a dot.
    const cut = entry.key.lastIndexOf(".");
    if (cut < 0) return;
    const appKey = entry.key.slice(0, cut);
    const runId = entry.key.slice(cut + 1);
    const record = decodeRunRecord(entry);
    let app = this.apps.get(appKey);
    if (!record) {
      if (!app?.byId.delete(runId)) return;
      const at = lowerBound(app.ids, runId);
      if (app.ids[at] === runId) app.ids.splice(at, 1);
      return;
    }
    if (!app) this.apps.set(appKey, (app = { ids: [], byId: new Map() }));
    // The listing never shows results: keep their bytes out of memory.
    const slim = record.result ? { ...record, result: undefined } : record;
    if (!app.byId.has(runId)) {
      const { ids } = app;
      if (ids.length === 0 || ids[ids.length - 1] < runId) ids.push(runId);
      else ids.splice(lowerBound(ids, runId), 0, runId);
    }
    app.byId.set(runId, slim);
    for (const listener of this.listeners) {
      try {
        listener(slim);
      } catch (err) {
        this.logger.error({ err, key: entry.key }, "run change listener failed");
      }
    }
  }
}
