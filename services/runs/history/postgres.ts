// The run history in a PostgreSQL server (SKIFF_DATABASE_URL), which every
// process serving the run API shares. Tables in schema `skiff` (schema.ts).
// One projector writes at a time: the one holding a session-level advisory
// lock, through the connection that holds it; the others read.
import type { Logger } from "../../config/index.js";
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
import { lockKey, migrate, tables, type Tables } from "./schema.js";
import { openPostgres, type Database, type Session } from "./sql.js";

/** Below this many rows (by the planner's estimate) rows() counts them. */
const ROWS_COUNTED_BELOW = 200_000;
/** Rows written before the statistics are brought up to date again, at least. */
const ANALYZE_MIN_ROWS = 5_000;
/**
 * The columns the history's queries filter and order on: ANALYZE reads only these. The record (jsonb)
 * is never a condition, and its statistics make ANALYZE three times as costly.
 */
const ANALYZED_COLUMNS = "run_id, project_id, app_name, status, async";

/**
 * PostgreSQL's text and jsonb take no NUL character, and jsonb no half of a surrogate pair (an app's error
 * message might carry either, or an emoji cut in two): each becomes U+FFFD.
 */
const storable = (_k: string, v: unknown) =>
  typeof v === "string" ? v.replaceAll("\0", "\ufffd").replace(LONE_SURROGATE, "\ufffd") : v;
const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g;

/**
 * JSON for a batch statement, NUL characters and lone surrogates replaced. JSON.stringify writes a NUL as
 * \u0000 and a lone surrogate as \ud8xx-\udfxx (a whole pair as its character); the replacer, which costs
 * a call per value, runs only when such text shows up. One such record would otherwise fail its batch at
 * every try, and no run after it would reach the history.
 */
function batchJson(rows: unknown[]): string {
  const text = JSON.stringify(rows);
  return text.includes("\\u0000") || /\\ud[89a-f]/i.test(text) ? JSON.stringify(rows, storable) : text;
}

/** Opens the history's tables in the server at `url` (creating what is missing). */
export async function openPostgresHistory(url: string, schema: string, logger: Logger): Promise<PostgresHistory> {
  const db = await openPostgres(url);
  const t = tables(schema);
  try {
    await migrate(db, t);
  } catch (err) {
    await db.close();
    throw err;
  }
  return new PostgresHistory(db, t, logger);
}

export class PostgresHistory implements HistoryBackend {
  readonly kind = "postgres";

  constructor(
    private readonly db: Database,
    private readonly t: Tables,
    private readonly logger: Logger,
  ) {}

  async list(projectId: string, appName: string | undefined, q: ListQuery): Promise<RunPage> {
    const params: unknown[] = [projectId];
    const where = ["project_id = $1"];
    const param = (v: unknown) => `$${params.push(v)}`;
    if (appName !== undefined) where.push(`app_name = ${param(appName)}`);
    if (q.after !== undefined) where.push(`run_id < ${param(pageToken(q.after))}::uuid`);
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

  async minuteStats(projectId: string, appName: string, fromMs: number, toMs: number): Promise<MinuteStats[]> {
    const rows = await this.db.query<{ minute: number; runs: number; failures: number; pcts: number[] | null }>(
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

  async find(projectId: string, appName: string | undefined, runId: string): Promise<HistoryRun | undefined> {
    if (!UUID.test(runId)) return undefined;
    const [row] = await this.db.query<{ record: RunRecord; revision: string | number }>(
      appName === undefined
        ? `SELECT record, revision FROM ${this.t.runs} WHERE run_id = $1::uuid AND project_id = $2`
        : `SELECT record, revision FROM ${this.t.runs} WHERE run_id = $1::uuid AND project_id = $2 AND app_name = $3`,
      appName === undefined ? [runId, projectId] : [runId, projectId, appName],
    );
    return row && { record: row.record, eventSeq: eventSeqOf(row.record, Number(row.revision)) };
  }

  async deliveries(projectId: string, appName: string, runId: string): Promise<unknown[]> {
    if (!UUID.test(runId)) return [];
    const rows = await this.db.query<{ record: unknown }>(
      `SELECT record FROM ${this.t.deliveries} WHERE run_id = $1::uuid AND project_id = $2 AND app_name = $3
       ORDER BY length(delivery_id), delivery_id`,
      [runId, projectId, appName],
    );
    return rows.map((r) => r.record);
  }

  async runningSync(limit: number): Promise<RunRecord[]> {
    const rows = await this.db.query<{ record: RunRecord }>(
      `SELECT record FROM ${this.t.runs} WHERE status = 'running' AND NOT async ORDER BY run_id LIMIT $1`,
      [limit],
    );
    return rows.map((r) => r.record);
  }

  async position(stream: string): Promise<number> {
    const [row] = await this.db.query<{ last_seq: string | number }>(
      `SELECT last_seq FROM ${this.t.cursor} WHERE stream = $1`,
      [stream],
    );
    return row ? Number(row.last_seq) : 0;
  }

  prune(beforeMs: number, batch = PRUNE_BATCH): Promise<number> {
    return this.deleteBelow(idAt(beforeMs), batch);
  }

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

  /** Bytes the history's tables take with their indexes and TOAST. */
  async size(): Promise<number> {
    const [{ n }] = await this.db.query<{ n: string | number }>(
      `SELECT (pg_total_relation_size($1::regclass) + pg_total_relation_size($2::regclass))::float8 AS n`,
      [this.t.runs, this.t.deliveries],
    );
    return Number(n);
  }

  /** Counted when few, else the planner's estimate (kept by ANALYZE and VACUUM). */
  async rows(): Promise<number> {
    const [{ n }] = await this.db.query<{ n: number }>(
      "SELECT reltuples::float8 AS n FROM pg_class WHERE oid = $1::regclass",
      [this.t.runs],
    );
    return Number(n) >= ROWS_COUNTED_BELOW ? Number(n) : this.count();
  }

  /** Plain VACUUM: reads and writes go on. */
  async vacuum(): Promise<void> {
    await this.db.query(`VACUUM ${this.t.runs}`);
    await this.db.query(`VACUUM ${this.t.deliveries}`);
  }

  /** VACUUM FULL: the tables are locked meanwhile. */
  async compact(): Promise<void> {
    await this.db.query(`VACUUM FULL ${this.t.runs}`);
    await this.db.query(`VACUUM FULL ${this.t.deliveries}`);
  }

  async count(): Promise<number> {
    const [{ n }] = await this.db.query<{ n: number }>(`SELECT count(*)::int AS n FROM ${this.t.runs}`);
    return n;
  }

  /** The projector's session: the one that holds the advisory lock, when it can be had. */
  async writer(): Promise<HistoryWriter | undefined> {
    const session = await this.db.session();
    try {
      const [{ ok }] = await session.query<{ ok: boolean }>(
        "SELECT pg_try_advisory_lock(hashtextextended($1, 0)) AS ok",
        [lockKey(this.t, "project")],
      );
      if (!ok) {
        session.release();
        return undefined;
      }
      const writer = new PostgresWriter(session, this.t, this.logger);
      await writer.analyze(false);
      return writer;
    } catch (err) {
      session.release(true);
      throw err;
    }
  }

  close(): Promise<void> {
    return this.db.close();
  }
}

class PostgresWriter implements HistoryWriter {
  /** Rows written since the table's statistics were last brought up to date, and how many call for it again. */
  private sinceAnalyze = 0;
  private analyzeAfter = 0;

  constructor(
    private readonly session: Session,
    private readonly t: Tables,
    private readonly logger: Logger,
  ) {}

  async cursor(stream: string): Promise<Cursor | undefined> {
    const [row] = await this.session.query<{ stream_created: string; last_seq: string | number }>(
      `SELECT stream_created, last_seq FROM ${this.t.cursor} WHERE stream = $1`,
      [stream],
    );
    return row && { streamCreated: row.stream_created, lastSeq: Number(row.last_seq) };
  }

  async restart(stream: string, streamCreated: string, keepEventSeqs = false): Promise<void> {
    await this.session.query(
      `WITH reset AS (UPDATE ${this.t.runs} SET revision = 0, record = CASE WHEN $3 AND NOT record ? 'event_seq'
           THEN jsonb_set(record, '{event_seq}', to_jsonb(revision)) ELSE record END WHERE revision <> 0),
         reset_deliveries AS (UPDATE ${this.t.deliveries} SET revision = 0 WHERE revision <> 0),
         dropped AS (DELETE FROM ${this.t.cursor} WHERE stream <> $1)
       INSERT INTO ${this.t.cursor} AS c (stream, stream_created, last_seq) VALUES ($1, $2, 0)
       ON CONFLICT (stream) DO UPDATE SET last_seq = 0, stream_created = excluded.stream_created`,
      [stream, streamCreated, keepEventSeqs],
    );
  }

  /** One statement: the upserts and the cursor, all or nothing. */
  async write(b: Batch): Promise<void> {
    const t = this.t;
    await this.session.query(
      `WITH upserted AS (
         INSERT INTO ${t.runs} AS r (run_id, project_id, app_name, status, async, queued_at, started_at,
           finished_at, run_time_ms, status_code, error_type, record, revision)
         SELECT run_id, project_id, app_name, status, async, queued_at, started_at,
           finished_at, run_time_ms, status_code, error_type, record, revision
         FROM jsonb_to_recordset($1::jsonb) AS x(run_id uuid, project_id text, app_name text, status text,
           async boolean, queued_at timestamptz, started_at timestamptz, finished_at timestamptz,
           run_time_ms double precision, status_code integer, error_type text, record jsonb, revision bigint)
         ON CONFLICT (run_id) DO UPDATE SET
           project_id = excluded.project_id, app_name = excluded.app_name, status = excluded.status,
           async = excluded.async, queued_at = excluded.queued_at, started_at = excluded.started_at,
           finished_at = excluded.finished_at, run_time_ms = excluded.run_time_ms,
           status_code = excluded.status_code, error_type = excluded.error_type, record = excluded.record,
           revision = excluded.revision
         WHERE excluded.revision > r.revision
           AND (r.status NOT IN ('success', 'failure', 'cancelled')
             OR excluded.status IN ('success', 'failure', 'cancelled'))
         RETURNING 1),
       delivered AS (
         INSERT INTO ${t.deliveries} AS d (run_id, delivery_id, project_id, app_name, record, revision)
         SELECT run_id, delivery_id, project_id, app_name, record, revision
         FROM jsonb_to_recordset($5::jsonb) AS x(run_id uuid, delivery_id text, project_id text, app_name text,
           record jsonb, revision bigint)
         ON CONFLICT (run_id, delivery_id) DO UPDATE SET record = excluded.record, revision = excluded.revision
         WHERE excluded.revision > d.revision
         RETURNING 1)
       INSERT INTO ${t.cursor} AS c (stream, stream_created, last_seq) VALUES ($2, $3, $4::bigint)
       ON CONFLICT (stream) DO UPDATE SET last_seq = excluded.last_seq, stream_created = excluded.stream_created`,
      [
        batchJson(b.runs.map(({ json: _json, ...row }) => row)),
        b.stream,
        b.streamCreated,
        b.lastSeq,
        batchJson(b.deliveries),
      ],
    );
    this.sinceAnalyze += b.runs.length;
    if (this.sinceAnalyze >= this.analyzeAfter) await this.analyze(true);
  }

  /**
   * Brings the table's statistics up to date (`ANALYZE` of the columns queries filter on reads a sample
   * of fixed size) when it never had any, or when a tenth of it (5,000 rows at least) was written since:
   * the planner needs them to walk the listing indexes.
   */
  async analyze(due: boolean): Promise<void> {
    const runs = this.t.runs;
    const estimate = async () =>
      Number(
        (
          await this.session.query<{ n: number }>(
            "SELECT reltuples::float8 AS n FROM pg_class WHERE oid = $1::regclass",
            [runs],
          )
        )[0].n,
      );
    let rows = await estimate();
    if (due || rows < 0) {
      await this.session.query(`ANALYZE ${runs} (${ANALYZED_COLUMNS})`);
      rows = await estimate();
    }
    this.sinceAnalyze = 0;
    this.analyzeAfter = Math.max(ANALYZE_MIN_ROWS, rows / 10);
  }

  async release(broken = false): Promise<void> {
    if (!broken)
      await this.session
        .query("SELECT pg_advisory_unlock(hashtextextended($1, 0))", [lockKey(this.t, "project")])
        .catch((err: unknown) => {
          broken = true;
          this.logger.debug({ err }, "run history: giving up the projector's lock failed");
        });
    this.session.release(broken);
  }
}
