// Reading the run history: pages of runs newest first (ListRuns, the
// dashboard), per-minute figures of an app's last hour (GetAppStats), and
// deleting runs past their retention or beyond the newest that fit its byte
// budget. Every query walks one index from a
// known point and reads at most a page (or an hour of one app), so what it
// costs does not depend on how many runs are stored.
import type { RunRecord, RunStatus } from "../store.js";
import type { Sql } from "./sql.js";
import type { Tables } from "./schema.js";

export interface ListQuery {
  pageSize: number;
  /** Run id the previous page ended with (the page token); the page starts below it. */
  after?: string;
  asyncOnly?: boolean;
  status?: RunStatus;
  /** Only runs made at or after this time, ms (the project's creation: a deleted project of that id had the others). */
  sinceMs?: number;
}

/** A run as the history holds it. */
export interface HistoryRun {
  record: RunRecord;
  /** SKIFF_EVENTS sequence of the event the row was last written from; 0 when that stream is not the one it came from. */
  eventSeq: number;
}

export interface RunPage {
  /** Newest first, without results. */
  runs: RunRecord[];
  /** The run id to continue after; undefined when there are no more. */
  next: string | undefined;
}

/** The runs of one app queued in one minute. */
export interface MinuteStats {
  /** Start of the minute, ms since the epoch. */
  minuteMs: number;
  runs: number;
  failures: number;
  /** Nearest-rank percentiles of the run times of runs that finished (success or failure); 0 when none did. */
  p50Ms: number;
  p95Ms: number;
  p99Ms: number;
}

/** Rows deleted by one statement of the retention sweep. */
const PRUNE_BATCH = 10_000;
const MINUTE_MS = 60_000;
/** Below this many rows (by the planner's estimate) rows() counts them. */
const ROWS_COUNTED_BELOW = 200_000;

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/** The smallest UUIDv7 of a time: the ids of runs made before it sort below it. */
function idAt(ms: number): string {
  const hex = Math.max(0, Math.floor(ms)).toString(16).padStart(12, "0").slice(-12);
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-0000-0000-000000000000`;
}

/** The time a UUIDv7 run id was made at, ms: what idAt writes. */
export const timeOfId = (runId: string): number => parseInt(runId.slice(0, 8) + runId.slice(9, 13), 16);

export class HistoryQueries {
  constructor(
    private readonly db: Sql,
    private readonly t: Tables,
  ) {}

  /** Runs of one app (or, with `appName` undefined, of every app of the project), newest first. */
  async list(projectId: string, appName: string | undefined, q: ListQuery): Promise<RunPage> {
    const params: unknown[] = [projectId];
    const where = ["project_id = $1"];
    const param = (v: unknown) => `$${params.push(v)}`;
    if (appName !== undefined) where.push(`app_name = ${param(appName)}`);
    if (q.after !== undefined) {
      if (!UUID.test(q.after)) throw new Error(`page token ${JSON.stringify(q.after)} is not a run id`);
      where.push(`run_id < ${param(q.after)}::uuid`);
    }
    if (q.status !== undefined) where.push(`status = ${param(q.status)}`);
    if (q.sinceMs) where.push(`run_id >= ${param(idAt(q.sinceMs))}::uuid`);
    if (q.asyncOnly) where.push("async");
    // One more than the page says whether another page follows.
    const rows = await this.db.query<{ record: RunRecord }>(
      `SELECT record FROM ${this.t.runs} WHERE ${where.join(" AND ")} ORDER BY run_id DESC LIMIT ${param(q.pageSize + 1)}`,
      params,
    );
    const runs = rows.slice(0, q.pageSize).map((r) => r.record);
    return { runs, next: rows.length > q.pageSize ? runs[runs.length - 1].run_id : undefined };
  }

  /**
   * Per-minute figures of the runs of one app queued in [fromMs, toMs), for
   * the minutes that had any, oldest first. A run counts in the minute it was
   * queued; failures are runs that ended `failure`.
   */
  async minuteStats(projectId: string, appName: string, fromMs: number, toMs: number): Promise<MinuteStats[]> {
    const rows = await this.db.query<{
      minute: number;
      runs: number;
      failures: number;
      pcts: number[] | null;
    }>(
      `SELECT (floor(extract(epoch FROM queued_at) * 1000 / ${MINUTE_MS}) * ${MINUTE_MS})::float8 AS minute,
         count(*)::int AS runs,
         (count(*) FILTER (WHERE status = 'failure'))::int AS failures,
         percentile_disc(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY run_time_ms)
           FILTER (WHERE status IN ('success', 'failure') AND run_time_ms IS NOT NULL) AS pcts
       FROM ${this.t.runs}
       WHERE project_id = $1 AND app_name = $2 AND run_id >= $3::uuid
         AND queued_at >= $4::timestamptz AND queued_at < $5::timestamptz
       GROUP BY 1 ORDER BY 1`,
      // The id bound lets the index skip older runs; a run id is made a moment before its queue time.
      [projectId, appName, idAt(fromMs - MINUTE_MS), new Date(fromMs).toISOString(), new Date(toMs).toISOString()],
    );
    return rows.map((r) => ({
      minuteMs: Number(r.minute),
      runs: r.runs,
      failures: r.failures,
      p50Ms: Number(r.pcts?.[0] ?? 0),
      p95Ms: Number(r.pcts?.[1] ?? 0),
      p99Ms: Number(r.pcts?.[2] ?? 0),
    }));
  }

  /** One run of one app, with the sequence of its event; undefined when the history does not hold it. */
  async find(projectId: string, appName: string, runId: string): Promise<HistoryRun | undefined> {
    if (!UUID.test(runId)) return undefined;
    const [row] = await this.db.query<{ record: RunRecord; revision: string | number }>(
      `SELECT record, revision FROM ${this.t.runs} WHERE run_id = $1::uuid AND project_id = $2 AND app_name = $3`,
      [runId, projectId, appName],
    );
    return row && { record: row.record, eventSeq: Number(row.revision) };
  }

  /**
   * The webhook deliveries of a run that are over and have left KV, as their
   * records were (the webhook role's JSON, opaque here), in delivery order.
   */
  async deliveries(projectId: string, appName: string, runId: string): Promise<unknown[]> {
    if (!UUID.test(runId)) return [];
    const rows = await this.db.query<{ record: unknown }>(
      `SELECT record FROM ${this.t.deliveries} WHERE run_id = $1::uuid AND project_id = $2 AND app_name = $3
       ORDER BY length(delivery_id), delivery_id`,
      [runId, projectId, appName],
    );
    return rows.map((r) => r.record);
  }

  /** Sync runs recorded `running`, oldest first (a partial index holds just them): the stale-sync sweep's candidates. */
  async runningSync(limit: number): Promise<RunRecord[]> {
    const rows = await this.db.query<{ record: RunRecord }>(
      `SELECT record FROM ${this.t.runs} WHERE status = 'running' AND NOT async ORDER BY run_id LIMIT $1`,
      [limit],
    );
    return rows.map((r) => r.record);
  }

  /** Deletes runs made before `beforeMs` (by the time in their ids), PRUNE_BATCH rows a statement; says how many. */
  async prune(beforeMs: number, batch = PRUNE_BATCH): Promise<number> {
    return this.deleteBelow(idAt(beforeMs), batch);
  }

  /**
   * Deletes every run but the newest `keep` (by run id, which is time), and
   * their deliveries; says how many. Walks `keep` entries of the primary key.
   */
  async pruneToNewest(keep: number, batch = PRUNE_BATCH): Promise<number> {
    const [row] = await this.db.query<{ run_id: string }>(
      `SELECT run_id FROM ${this.t.runs} ORDER BY run_id DESC OFFSET $1 LIMIT 1`,
      [Math.max(0, Math.floor(keep))],
    );
    if (row === undefined) return 0;
    // The newest run to go, and every one below it.
    return this.deleteBelow(row.run_id, batch, true);
  }

  /** Deletes runs whose id is below `bound` (or at it, `inclusive`), and their deliveries; says how many runs. */
  private async deleteBelow(bound: string, batch: number, inclusive = false): Promise<number> {
    const total = await this.deleteRows(this.t.runs, "run_id", bound, batch, inclusive);
    // Their deliveries, by the same measure (a delivery's run id is its run's).
    await this.deleteRows(this.t.deliveries, "run_id, delivery_id", bound, batch, inclusive);
    return total;
  }

  /** Deletes the rows of `table` whose run id is below `bound`, `batch` at a time by its key; says how many. */
  private async deleteRows(
    table: string,
    key: string,
    bound: string,
    batch: number,
    inclusive: boolean,
  ): Promise<number> {
    let total = 0;
    for (;;) {
      const [{ n }] = await this.db.query<{ n: number }>(
        `WITH gone AS (
           DELETE FROM ${table} WHERE (${key}) IN (
             SELECT ${key} FROM ${table} WHERE run_id ${inclusive ? "<=" : "<"} $1::uuid ORDER BY run_id LIMIT ${batch})
           RETURNING 1)
         SELECT count(*)::int AS n FROM gone`,
        [bound],
      );
      total += n;
      if (n < batch) return total;
    }
  }

  /** Bytes the history's tables take with their indexes and TOAST: what its budget counts. */
  async size(): Promise<number> {
    const [{ n }] = await this.db.query<{ n: string | number }>(
      `SELECT (pg_total_relation_size($1::regclass) + pg_total_relation_size($2::regclass))::float8 AS n`,
      [this.t.runs, this.t.deliveries],
    );
    return Number(n);
  }

  /** Rows of the runs table: counted when few, else the planner's estimate (kept by ANALYZE and VACUUM). */
  async rows(): Promise<number> {
    const [{ n }] = await this.db.query<{ n: number }>(
      "SELECT reltuples::float8 AS n FROM pg_class WHERE oid = $1::regclass",
      [this.t.runs],
    );
    return Number(n) >= ROWS_COUNTED_BELOW ? Number(n) : this.count();
  }

  /**
   * Makes the room of deleted rows reusable (plain VACUUM: reads and writes go
   * on): PGlite has no autovacuum, and without it the files grow with every
   * update and delete.
   */
  async vacuum(): Promise<void> {
    await this.db.query(`VACUUM ${this.t.runs}`);
    await this.db.query(`VACUUM ${this.t.deliveries}`);
  }

  /**
   * Rewrites the tables and their indexes compactly (VACUUM FULL: the tables
   * are locked meanwhile), which gives their files' free room back to the
   * disk; for files that passed their budget all the same.
   */
  async compact(): Promise<void> {
    await this.db.query(`VACUUM FULL ${this.t.runs}`);
    await this.db.query(`VACUUM FULL ${this.t.deliveries}`);
  }

  /** How many runs the history holds (a count over the table: for tests and tools, not for requests). */
  async count(): Promise<number> {
    const [{ n }] = await this.db.query<{ n: number }>(`SELECT count(*)::int AS n FROM ${this.t.runs}`);
    return n;
  }
}
