// The run history's tables, created at start by every process that opens the
// history. Several processes may start at once against one PostgreSQL: the
// statements are all `IF NOT EXISTS`, and they run under an advisory lock,
// because two concurrent `CREATE TABLE IF NOT EXISTS` of one table can still
// collide in the catalog.
import type { Database } from "./sql.js";

export const DEFAULT_SCHEMA = "skiff";
const IDENT = /^[a-z_][a-z0-9_]{0,62}$/;

/** The schema-qualified names of the history's tables. */
export interface Tables {
  schema: string;
  /** One row per run: its latest record, as its events on SKIFF_EVENTS carry it. */
  runs: string;
  /** Where the projection of each stream stands. */
  cursor: string;
  /** One row per webhook delivery that is over: its record, as its message on SKIFF_EVENTS carries it. */
  deliveries: string;
}

export function tables(schema: string): Tables {
  if (!IDENT.test(schema)) throw new Error(`schema ${JSON.stringify(schema)}: use lower-case letters, digits and _`);
  return {
    schema,
    runs: `"${schema}".runs`,
    cursor: `"${schema}".projection`,
    deliveries: `"${schema}".webhook_deliveries`,
  };
}

/** Advisory lock keys are database-wide: each names its schema, so two schemas never share one. */
export const lockKey = (t: Tables, what: "migrate" | "project") => `skiff:${t.schema}:${what}`;

function statements(t: Tables): string[] {
  return [
    `CREATE SCHEMA IF NOT EXISTS "${t.schema}"`,
    // run_id is a UUIDv7: uuid order is byte order, which is time order, so "newest first" is "run_id DESC".
    `CREATE TABLE IF NOT EXISTS ${t.runs} (
      run_id uuid PRIMARY KEY,
      project_id text NOT NULL,
      app_name text NOT NULL,
      status text NOT NULL,
      async boolean NOT NULL,
      queued_at timestamptz NOT NULL,
      started_at timestamptz,
      finished_at timestamptz,
      run_time_ms double precision,
      status_code integer,
      error_type text,
      record jsonb NOT NULL,
      revision bigint NOT NULL
    )`,
    `CREATE INDEX IF NOT EXISTS runs_app ON ${t.runs} (project_id, app_name, run_id DESC)`,
    `CREATE INDEX IF NOT EXISTS runs_project ON ${t.runs} (project_id, run_id DESC)`,
    `CREATE INDEX IF NOT EXISTS runs_app_status ON ${t.runs} (project_id, app_name, status, run_id DESC)`,
    `CREATE INDEX IF NOT EXISTS runs_project_status ON ${t.runs} (project_id, status, run_id DESC)`,
    `CREATE INDEX IF NOT EXISTS runs_app_async ON ${t.runs} (project_id, app_name, run_id DESC) WHERE async`,
    // The few sync runs in progress, for the sweep of those whose gateway is gone (runs/stale-sync.ts).
    `CREATE INDEX IF NOT EXISTS runs_running_sync ON ${t.runs} (run_id) WHERE status = 'running' AND NOT async`,
    // Deliveries leave KV `skiff-webhooks` once over; GetRun reads a run's from here too.
    `CREATE TABLE IF NOT EXISTS ${t.deliveries} (
      run_id uuid NOT NULL,
      delivery_id text NOT NULL,
      project_id text NOT NULL,
      app_name text NOT NULL,
      record jsonb NOT NULL,
      revision bigint NOT NULL,
      PRIMARY KEY (run_id, delivery_id)
    )`,
    `CREATE TABLE IF NOT EXISTS ${t.cursor} (
      stream text PRIMARY KEY,
      stream_created text NOT NULL,
      last_seq bigint NOT NULL
    )`,
  ];
}

/** Creates what is missing; safe to run from many processes at once, and again at every start. */
export async function migrate(db: Database, t: Tables): Promise<void> {
  const s = await db.session();
  let broken = false;
  try {
    await s.query("SELECT pg_advisory_lock(hashtextextended($1, 0))", [lockKey(t, "migrate")]);
    try {
      for (const sql of statements(t)) await s.query(sql);
    } finally {
      await s.query("SELECT pg_advisory_unlock(hashtextextended($1, 0))", [lockKey(t, "migrate")]);
    }
  } catch (err) {
    broken = true;
    throw err;
  } finally {
    s.release(broken);
  }
}
