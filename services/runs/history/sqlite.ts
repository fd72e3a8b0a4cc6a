// The run history embedded in the process: a SQLite file under
// SKIFF_DATA_DIR (better-sqlite3), for one process. Two connections, each on
// a thread of its own (sqlite-thread.ts): one writes (the projector's
// batches, deletes), one reads (pages, stats), so that neither the writes nor
// a long read take the thread that answers requests, and a page never waits
// behind a batch (WAL: readers see the last committed state while a write
// goes on).
import { mkdir, stat } from "node:fs/promises";
import path from "node:path";
import type { RunRecord } from "../store.js";
import {
  idAt,
  MINUTE_MS,
  eventSeqOf,
  pageToken,
  PRUNE_BATCH,
  UUID,
  type Batch,
  type Cursor,
  type HistoryBackend,
  type HistoryRun,
  type HistoryWriter,
  type ListQuery,
  type MinuteStats,
  type RunPage,
} from "./history.js";
import { startSqliteThread, type SqliteThread, type Step } from "./sqlite-thread.js";

/** The file in the history's folder. */
export const SQLITE_FILE = "runs.sqlite";

/** Pages of the file each connection keeps in memory (negative: KiB), beside the operating system's file cache. */
const CACHE_KIB = 16 * 1024;

const PRAGMAS = [
  // For a new file only: fewer, fuller pages for rows that are appended in key order.
  "page_size = 8192",
  "journal_mode = WAL",
  // In WAL mode a commit is written without a sync; a crash may lose the last batches, never half of one, and
  // their cursor goes with them, so the projector applies them again.
  "synchronous = NORMAL",
  `cache_size = -${CACHE_KIB}`,
  "busy_timeout = 10000",
  // The write-ahead log counts against the history's budget: a checkpoint every 256 pages (2 MiB), and
  // the file cut back to that after one (it grows past it while a reader holds old pages).
  "wal_autocheckpoint = 256",
  `journal_size_limit = ${2 * 1024 * 1024}`,
];

const FINAL = "('success', 'failure', 'cancelled')";

/**
 * The tables. run_id is a UUIDv7 as text: its order is time order, so "newest first" is "run_id DESC".
 * Runs `success`, by far the most, go in the primary key and two indexes only: the status indexes hold
 * the other states (a page of successes walks the app's or project's index, where most runs are
 * successes), and the async index the runs that went through the queue.
 */
const SCHEMA = [
  `CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    project_id TEXT NOT NULL,
    app_name TEXT NOT NULL,
    status TEXT NOT NULL,
    async INTEGER NOT NULL,
    queued_at TEXT NOT NULL,
    started_at TEXT,
    finished_at TEXT,
    run_time_ms REAL,
    status_code INTEGER,
    error_type TEXT,
    record TEXT NOT NULL,
    revision INTEGER NOT NULL
  ) WITHOUT ROWID`,
  "CREATE INDEX IF NOT EXISTS runs_app ON runs (project_id, app_name, run_id DESC)",
  "CREATE INDEX IF NOT EXISTS runs_project ON runs (project_id, run_id DESC)",
  "CREATE INDEX IF NOT EXISTS runs_app_status ON runs (project_id, app_name, status, run_id DESC) WHERE status <> 'success'",
  "CREATE INDEX IF NOT EXISTS runs_project_status ON runs (project_id, status, run_id DESC) WHERE status <> 'success'",
  "CREATE INDEX IF NOT EXISTS runs_app_async ON runs (project_id, app_name, run_id DESC) WHERE async = 1",
  // The few sync runs in progress, for the sweep of those whose gateway is gone (runs/stale-sync.ts).
  "CREATE INDEX IF NOT EXISTS runs_running_sync ON runs (run_id) WHERE status = 'running' AND async = 0",
  `CREATE TABLE IF NOT EXISTS webhook_deliveries (
    run_id TEXT NOT NULL,
    delivery_id TEXT NOT NULL,
    project_id TEXT NOT NULL,
    app_name TEXT NOT NULL,
    record TEXT NOT NULL,
    revision INTEGER NOT NULL,
    PRIMARY KEY (run_id, delivery_id)
  )`,
  `CREATE TABLE IF NOT EXISTS projection (
    stream TEXT PRIMARY KEY,
    stream_created TEXT NOT NULL,
    last_seq INTEGER NOT NULL
  )`,
];

const UPSERT_RUN = `INSERT INTO runs (run_id, project_id, app_name, status, async, queued_at, started_at, finished_at,
    run_time_ms, status_code, error_type, record, revision)
  VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
  ON CONFLICT (run_id) DO UPDATE SET
    project_id = excluded.project_id, app_name = excluded.app_name, status = excluded.status,
    async = excluded.async, queued_at = excluded.queued_at, started_at = excluded.started_at,
    finished_at = excluded.finished_at, run_time_ms = excluded.run_time_ms, status_code = excluded.status_code,
    error_type = excluded.error_type, record = excluded.record, revision = excluded.revision
  WHERE excluded.revision > runs.revision
    AND (runs.status NOT IN ${FINAL} OR excluded.status IN ${FINAL})`;

const UPSERT_DELIVERY = `INSERT INTO webhook_deliveries (run_id, delivery_id, project_id, app_name, record, revision)
  VALUES (?, ?, ?, ?, ?, ?)
  ON CONFLICT (run_id, delivery_id) DO UPDATE SET record = excluded.record, revision = excluded.revision
  WHERE excluded.revision > webhook_deliveries.revision`;

const SET_CURSOR = `INSERT INTO projection (stream, stream_created, last_seq) VALUES (?, ?, ?)
  ON CONFLICT (stream) DO UPDATE SET last_seq = excluded.last_seq, stream_created = excluded.stream_created`;

/** Records are kept as the JSON text they came as; a NUL character (an app's error message may carry one) becomes U+FFFD, as in PostgreSQL. */
const noNul = (_k: string, v: unknown) =>
  typeof v === "string" && v.includes("\0") ? v.replaceAll("\0", "\ufffd") : v;

function json(v: unknown): string {
  const text = JSON.stringify(v);
  return text.includes("\\u0000") ? JSON.stringify(v, noNul) : text;
}

const all = <R>(thread: SqliteThread, sql: string, params: unknown[] = []) =>
  thread.run([{ sql, params, mode: "all" }]).then((r) => r[0] as R[]);

/** The statement of a page of runs: one walk of one index from the newest run or the page token. */
export function listQuery(
  projectId: string,
  appName: string | undefined,
  q: ListQuery,
): { sql: string; params: unknown[] } {
  const where = ["project_id = ?"];
  const params: unknown[] = [projectId];
  const and = (condition: string, ...values: unknown[]) => {
    where.push(condition);
    params.push(...values);
  };
  if (appName !== undefined) and("app_name = ?", appName);
  if (q.after !== undefined) and("run_id < ?", pageToken(q.after));
  // Any status but success is in the status indexes, whose condition the query must state to use them.
  if (q.status === "success") and("status = 'success'");
  else if (q.status !== undefined) and("status = ? AND status <> 'success'", q.status);
  if (q.sinceMs) and("run_id >= ?", idAt(q.sinceMs));
  if (q.asyncOnly) and("async = 1");
  params.push(q.pageSize + 1); // one more than the page says whether another page follows
  return { sql: `SELECT record FROM runs WHERE ${where.join(" AND ")} ORDER BY run_id DESC LIMIT ?`, params };
}

/** Opens (and makes when missing) the history's file in `dir`. One process per folder. */
export async function openSqliteHistory(dir: string): Promise<SqliteHistory> {
  await mkdir(dir, { recursive: true });
  const file = path.join(dir, SQLITE_FILE);
  const write = await startSqliteThread(file, { pragmas: PRAGMAS, setup: SCHEMA });
  try {
    // Reads never write: a mistake shows as an error instead of a write racing the projector's.
    const read = await startSqliteThread(file, {
      pragmas: [
        ...PRAGMAS.filter((p) => !p.startsWith("page_size") && !p.startsWith("journal_mode")),
        "query_only = ON",
      ],
      setup: [],
    });
    return new SqliteHistory(file, write, read);
  } catch (err) {
    await write.close();
    throw err;
  }
}

export class SqliteHistory implements HistoryBackend {
  readonly kind = "sqlite";
  private writing = false;

  constructor(
    private readonly file: string,
    private readonly write: SqliteThread,
    private readonly read: SqliteThread,
  ) {}

  async list(projectId: string, appName: string | undefined, q: ListQuery): Promise<RunPage> {
    const { sql, params } = listQuery(projectId, appName, q);
    const rows = await all<{ record: string }>(this.read, sql, params);
    const runs = rows.slice(0, q.pageSize).map((r) => JSON.parse(r.record) as RunRecord);
    return { runs, next: rows.length > q.pageSize ? runs[runs.length - 1].run_id : undefined };
  }

  /**
   * Nearest-rank percentiles as PostgreSQL's percentile_disc gives them: the value at position
   * ceil(p × n) of a minute's n finished runs ordered by run time.
   */
  async minuteStats(projectId: string, appName: string, fromMs: number, toMs: number): Promise<MinuteStats[]> {
    const rank = (pct: number) => `max(CASE WHEN rn = (n * ${pct} + 99) / 100 THEN run_time_ms END)`;
    const rows = await all<{ minute: string; runs: number; failures: number; p50: number; p95: number; p99: number }>(
      this.read,
      `WITH m AS (
         SELECT substr(queued_at, 1, 16) AS minute, status, run_time_ms FROM runs
         WHERE project_id = ? AND app_name = ? AND run_id >= ? AND queued_at >= ? AND queued_at < ?),
       counted AS (
         SELECT minute, count(*) AS runs, sum(status = 'failure') AS failures FROM m GROUP BY minute),
       ranked AS (
         SELECT minute, run_time_ms, row_number() OVER (PARTITION BY minute ORDER BY run_time_ms) AS rn,
           count(*) OVER (PARTITION BY minute) AS n
         FROM m WHERE status IN ('success', 'failure') AND run_time_ms IS NOT NULL),
       pcts AS (
         SELECT minute, ${rank(50)} AS p50, ${rank(95)} AS p95, ${rank(99)} AS p99 FROM ranked GROUP BY minute)
       SELECT c.minute, c.runs, c.failures, p.p50, p.p95, p.p99
       FROM counted c LEFT JOIN pcts p ON p.minute = c.minute ORDER BY c.minute`,
      // The id bound lets the index skip older runs; a run id is made a moment before its queue time.
      [projectId, appName, idAt(fromMs - MINUTE_MS), new Date(fromMs).toISOString(), new Date(toMs).toISOString()],
    );
    return rows.map((r) => ({
      minuteMs: Date.parse(`${r.minute}:00.000Z`),
      runs: r.runs,
      failures: r.failures,
      p50Ms: r.p50 ?? 0,
      p95Ms: r.p95 ?? 0,
      p99Ms: r.p99 ?? 0,
    }));
  }

  async find(projectId: string, appName: string | undefined, runId: string): Promise<HistoryRun | undefined> {
    if (!UUID.test(runId)) return undefined;
    const [row] = await all<{ record: string; revision: number }>(
      this.read,
      appName === undefined
        ? "SELECT record, revision FROM runs WHERE run_id = ? AND project_id = ?"
        : "SELECT record, revision FROM runs WHERE run_id = ? AND project_id = ? AND app_name = ?",
      appName === undefined ? [runId, projectId] : [runId, projectId, appName],
    );
    if (!row) return undefined;
    const record = JSON.parse(row.record) as RunRecord;
    return { record, eventSeq: eventSeqOf(record, row.revision) };
  }

  async deliveries(projectId: string, appName: string, runId: string): Promise<unknown[]> {
    if (!UUID.test(runId)) return [];
    const rows = await all<{ record: string }>(
      this.read,
      `SELECT record FROM webhook_deliveries WHERE run_id = ? AND project_id = ? AND app_name = ?
       ORDER BY length(delivery_id), delivery_id`,
      [runId, projectId, appName],
    );
    return rows.map((r) => JSON.parse(r.record) as unknown);
  }

  async runningSync(limit: number): Promise<RunRecord[]> {
    const rows = await all<{ record: string }>(
      this.read,
      "SELECT record FROM runs WHERE status = 'running' AND async = 0 ORDER BY run_id LIMIT ?",
      [limit],
    );
    return rows.map((r) => JSON.parse(r.record) as RunRecord);
  }

  async position(stream: string): Promise<number> {
    const [row] = await all<{ last_seq: number }>(this.read, "SELECT last_seq FROM projection WHERE stream = ?", [
      stream,
    ]);
    return row?.last_seq ?? 0;
  }

  prune(beforeMs: number, batch = PRUNE_BATCH): Promise<number> {
    return this.deleteBelow(idAt(beforeMs), batch, false);
  }

  async pruneToNewest(keep: number, batch = PRUNE_BATCH): Promise<number> {
    const [row] = await all<{ run_id: string }>(
      this.read,
      "SELECT run_id FROM runs ORDER BY run_id DESC LIMIT 1 OFFSET ?",
      [Math.max(0, Math.floor(keep))],
    );
    if (row === undefined) return 0;
    // The newest run to go, and every one below it.
    return this.deleteBelow(row.run_id, batch, true);
  }

  /**
   * Deletes runs whose id is below `bound` (or at it, `inclusive`), and their deliveries, `batch` rows a
   * transaction (the projector's batches go on between them); says how many runs.
   */
  private async deleteBelow(bound: string, batch: number, inclusive: boolean): Promise<number> {
    const op = inclusive ? "<=" : "<";
    const steps: Step[] = [
      {
        sql: `DELETE FROM runs WHERE run_id IN (SELECT run_id FROM runs WHERE run_id ${op} ? ORDER BY run_id LIMIT ?)`,
        params: [bound, batch],
        mode: "run",
      },
      {
        sql: `DELETE FROM webhook_deliveries WHERE rowid IN
          (SELECT rowid FROM webhook_deliveries WHERE run_id ${op} ? ORDER BY run_id LIMIT ?)`,
        params: [bound, batch],
        mode: "run",
      },
    ];
    let total = 0;
    for (;;) {
      const [runs, deliveries] = (await this.write.run(steps, true)) as number[];
      total += runs;
      if (runs < batch && deliveries < batch) return total;
    }
  }

  /** Bytes of the file and its write-ahead log. */
  async size(): Promise<number> {
    const bytes = (f: string) =>
      stat(f).then(
        (s) => s.size,
        () => 0,
      );
    return (await bytes(this.file)) + (await bytes(`${this.file}-wal`));
  }

  async rows(): Promise<number> {
    return this.count();
  }

  /**
   * SQLite reuses the pages of deleted rows by itself; what is left is the write-ahead log, which a
   * checkpoint moves into the file and cuts back.
   */
  async vacuum(): Promise<void> {
    await this.write.run([{ sql: "PRAGMA wal_checkpoint(TRUNCATE)", mode: "all" }]);
  }

  /** VACUUM: the file rewritten without its free pages (writes wait meanwhile; reads go on). */
  async compact(): Promise<void> {
    await this.write.run([
      { sql: "VACUUM", mode: "run" },
      { sql: "PRAGMA wal_checkpoint(TRUNCATE)", mode: "all" },
    ]);
  }

  async count(): Promise<number> {
    const [{ n }] = await all<{ n: number }>(this.read, "SELECT count(*) AS n FROM runs");
    return n;
  }

  /** One writer at a time in the process; the file is the process's own. */
  async writer(): Promise<HistoryWriter | undefined> {
    if (this.writing) return undefined;
    this.writing = true;
    return new SqliteWriter(this.write, () => (this.writing = false));
  }

  async close(): Promise<void> {
    await Promise.all([this.read.close(), this.write.close()]);
  }
}

class SqliteWriter implements HistoryWriter {
  constructor(
    private readonly thread: SqliteThread,
    private readonly done: () => void,
  ) {}

  async cursor(stream: string): Promise<Cursor | undefined> {
    const [row] = await all<{ stream_created: string; last_seq: number }>(
      this.thread,
      "SELECT stream_created, last_seq FROM projection WHERE stream = ?",
      [stream],
    );
    return row && { streamCreated: row.stream_created, lastSeq: row.last_seq };
  }

  async restart(stream: string, streamCreated: string, keepEventSeqs = false): Promise<void> {
    await this.thread.run(
      [
        {
          sql: `UPDATE runs SET revision = 0, record = CASE WHEN ? AND json_type(record, '$.event_seq') IS NULL
            THEN json_set(record, '$.event_seq', revision) ELSE record END WHERE revision <> 0`,
          params: [keepEventSeqs ? 1 : 0],
          mode: "run",
        },
        { sql: "UPDATE webhook_deliveries SET revision = 0 WHERE revision <> 0", mode: "run" },
        { sql: "DELETE FROM projection WHERE stream <> ?", params: [stream], mode: "run" },
        { sql: SET_CURSOR, params: [stream, streamCreated, 0], mode: "run" },
      ],
      true,
    );
  }

  async write(b: Batch): Promise<void> {
    const steps: Step[] = [];
    if (b.runs.length > 0)
      steps.push({
        sql: UPSERT_RUN,
        many: b.runs.map((r) => [
          r.run_id,
          r.project_id,
          r.app_name,
          r.status,
          r.async ? 1 : 0,
          r.queued_at,
          r.started_at,
          r.finished_at,
          r.run_time_ms,
          r.status_code,
          r.error_type,
          r.json ?? json(r.record),
          r.revision,
        ]),
        mode: "run",
      });
    if (b.deliveries.length > 0)
      steps.push({
        sql: UPSERT_DELIVERY,
        many: b.deliveries.map((d) => [d.run_id, d.delivery_id, d.project_id, d.app_name, json(d.record), d.revision]),
        mode: "run",
      });
    steps.push({ sql: SET_CURSOR, params: [b.stream, b.streamCreated, b.lastSeq], mode: "run" });
    await this.thread.run(steps, true);
  }

  async release(): Promise<void> {
    this.done();
  }
}
