// The run history: run records (each event's, many a message in the record
// feed; an earlier version's events carrying theirs in a header) projected
// into SQL (embedded SQLite, and the PostgreSQL server of this
// machine), listed newest
// first with filters and page tokens, kept up to date, resumed after a
// restart, shared by two processes, and pruned by age. Each test has a schema
// of its own; NATS is a real server provisioned as skiff provisions it.
import { mkdir, mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import path from "node:path";
import { headers, type NatsConnection } from "nats";
import pg from "pg";
import { v7 } from "uuid";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { silentLogger } from "../../../services/config/logger.js";
import { coalesceWrites } from "../../../services/nats/coalesce.js";
import { RUN_RETENTION_MS, subjects } from "../../../services/nats/layout.js";
import { publishRunEvent, publishRunEventUnacked } from "../../../services/runs/events.js";
import {
  openRunHistory,
  HISTORY_FOLDER,
  OLD_PGLITE_FOLDER,
  FEED_STREAM,
  RUNS_STREAM,
  type RunHistory,
  type RunHistoryOptions,
} from "../../../services/runs/history/index.js";
import { rowOf } from "../../../services/runs/history/projector.js";
import { SQLITE_FILE } from "../../../services/runs/history/sqlite.js";
import type { RunRecord } from "../../../services/runs/store.js";
import { startProvisionedNats } from "../../helpers/nats-server.js";

const DATABASE_URL = process.env.SKIFF_TEST_DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test";

let nats: Awaited<ReturnType<typeof startProvisionedNats>>;
let nc: NatsConnection;
let sqliteDir: string;
const schemas: string[] = [];
const opened: RunHistory[] = [];

beforeAll(async () => {
  nats = await startProvisionedNats();
  nc = nats.nc;
  // As skiff's own connection: the records of the events one write carries go in one message of the feed.
  coalesceWrites(nc);
  sqliteDir = await mkdtemp(path.join(tmpdir(), "skiff-history-"));
});

afterAll(async () => {
  await Promise.all(opened.map((h) => h.close()));
  const client = new pg.Client({ connectionString: DATABASE_URL });
  await client.connect();
  for (const s of schemas) await client.query(`DROP SCHEMA IF EXISTS "${s}" CASCADE`);
  await client.end();
  await nats?.stop();
  await rm(sqliteDir, { recursive: true, force: true });
});

type Backend = "sqlite" | "postgres";

/** A schema of its own for each test, so that tests sharing a database never see each other's runs. */
function newSchema(): string {
  const s = `t_${Date.now().toString(36)}_${Math.random().toString(36).slice(2, 8)}`;
  schemas.push(s);
  return s;
}

async function open(backend: Backend, schema: string, extra: Partial<RunHistoryOptions> = {}): Promise<RunHistory> {
  const h = await openRunHistory({
    nc,
    logger: silentLogger,
    // The embedded database is one process's: each SQLite test has a data folder of its own.
    databaseUrl: backend === "postgres" ? DATABASE_URL : undefined,
    dataDir: backend === "postgres" ? sqliteDir : path.join(sqliteDir, schema),
    schema,
    projector: { batchMs: 20, leaderRetryMs: 100 },
    ...extra,
  });
  opened.push(h);
  return h;
}

async function close(h: RunHistory): Promise<void> {
  await h.close();
  opened.splice(opened.indexOf(h), 1);
}

/** A history on a schema of its own, for a project of its own, closed after `body`. */
async function withHistory(backend: Backend, body: (h: RunHistory, P: string) => Promise<void>): Promise<void> {
  const h = await open(backend, newSchema());
  try {
    await body(h, newProject());
  } finally {
    await close(h);
  }
}

const lastSeq = async () => (await (await nc.jetstreamManager()).streams.info(FEED_STREAM)).state.last_seq;

/** Waits until the history has applied everything the run stream holds now. */
async function caughtUp(h: RunHistory): Promise<number> {
  const last = await lastSeq();
  await vi.waitUntil(async () => (await h.position()) >= last, { timeout: 60_000, interval: 20 });
  return last;
}

/**
 * The projector's count of messages applied, once it is `n` or more: the count goes up when its write has
 * returned, which can be after another connection (position(), a query) saw the write committed.
 */
async function applied(h: RunHistory, n: number): Promise<number> {
  await vi.waitUntil(() => h.projector!.applied >= n, { timeout: 10_000, interval: 10 });
  return h.projector!.applied;
}

let projects = 0;
const newProject = () => `p-h${++projects}-${Math.random().toString(36).slice(2, 7)}`;

/** A run record; made now (ids then increase, even within one millisecond) unless `at` says when. */
function run(project: string, app: string, over: Partial<RunRecord> = {}, atMs?: number): RunRecord {
  const at = atMs ?? Date.now();
  return {
    run_id: atMs === undefined ? v7() : v7({ msecs: atMs }),
    project_id: project,
    app_name: app,
    path: "run",
    async: false,
    status: "success",
    queued_at: new Date(at).toISOString(),
    finished_at: new Date(at + 5).toISOString(),
    run_time_ms: 5,
    status_code: 200,
    attempts: 1,
    ...over,
  };
}

describe.each<Backend>(["sqlite", "postgres"])("run history (%s)", (backend) => {
  it("runs are listed newest first, filtered by status and async, paged by run id", async () => {
    await withHistory(backend, async (h, P) => {
      const base = Date.now() - 60_000;
      const runs = [
        run(P, "a", { async: true, status: "success" }, base),
        run(
          P,
          "a",
          { async: false, status: "failure", error: { type: "ValueError", message: "no\u0000pe" } },
          base + 1,
        ),
        run(P, "b", { async: true, status: "success" }, base + 2),
        run(P, "a", { async: true, status: "failure" }, base + 3),
        run(P, "a", { async: true, status: "queued", finished_at: undefined, run_time_ms: undefined }, base + 4),
        run(
          P,
          "a",
          {
            async: true,
            status: "success",
            result: { content_type: "application/json", data: "eyJ4IjoxfQ==", expires_at: new Date().toISOString() },
          },
          base + 5,
        ),
      ];
      for (const r of runs) await publishRunEvent(nc, r);
      await caughtUp(h);
      const ids = (page: { runs: RunRecord[] }) => page.runs.map((r) => r.run_id);
      const [a0, a1, b2, a3, a4, a5] = runs.map((r) => r.run_id);

      const all = await h.list(P, "a", { pageSize: 50 });
      expect(ids(all)).toEqual([a5, a4, a3, a1, a0]);
      expect(all.next).toBeUndefined();
      expect(all.runs[0]).toMatchObject({ run_id: a5, project_id: P, app_name: "a", status: "success", async: true });
      expect(all.runs[0].result).toBeUndefined(); // results stay in KV and the object store
      expect(all.runs[3].error).toEqual({ type: "ValueError", message: "no\ufffdpe" });

      const first = await h.list(P, "a", { pageSize: 2 });
      expect(ids(first)).toEqual([a5, a4]);
      expect(first.next).toBe(a4);
      const second = await h.list(P, "a", { pageSize: 2, after: first.next });
      expect(ids(second)).toEqual([a3, a1]);
      const third = await h.list(P, "a", { pageSize: 2, after: second.next });
      expect(ids(third)).toEqual([a0]);
      expect(third.next).toBeUndefined();
      // A page that ends exactly with the last run says there is no more.
      expect((await h.list(P, "a", { pageSize: 1, after: a1 })).next).toBeUndefined();

      expect(ids(await h.list(P, "a", { pageSize: 50, status: "failure" }))).toEqual([a3, a1]);
      expect(ids(await h.list(P, "a", { pageSize: 50, asyncOnly: true }))).toEqual([a5, a4, a3, a0]);
      expect(ids(await h.list(P, "a", { pageSize: 50, asyncOnly: true, status: "failure" }))).toEqual([a3]);
      expect(ids(await h.list(P, undefined, { pageSize: 3 }))).toEqual([a5, a4, a3]);
      expect(ids(await h.list(P, undefined, { pageSize: 50, status: "success" }))).toEqual([a5, b2, a0]);
      expect(ids(await h.list(P, "nope", { pageSize: 50 }))).toEqual([]);
      expect(ids(await h.list(newProject(), "a", { pageSize: 50 }))).toEqual([]);
    });
  });

  it("a later event replaces the run (queued → running → success), never a final state by an earlier one", async () => {
    await withHistory(backend, async (h, P) => {
      const queued = run(P, "a", { async: true, status: "queued", finished_at: undefined, run_time_ms: undefined });
      await publishRunEvent(nc, queued);
      await caughtUp(h);
      expect((await h.list(P, "a", { pageSize: 10, status: "queued" })).runs.map((x) => x.run_id)).toEqual([
        queued.run_id,
      ]);
      const running = { ...queued, status: "running" as const, started_at: new Date().toISOString() };
      await publishRunEvent(nc, running);
      await caughtUp(h);
      expect(await h.get(P, "a", queued.run_id)).toMatchObject({ status: "running" });
      expect((await h.list(P, "a", { pageSize: 10, status: "queued" })).runs).toEqual([]);

      await publishRunEvent(nc, { ...running, status: "success", run_time_ms: 42 });
      // A `running` event that comes after the end (a repeated one) does not bring the run back.
      await publishRunEvent(nc, { ...running, attempts: 2 });
      await caughtUp(h);
      expect((await h.list(P, "a", { pageSize: 10 })).runs).toEqual([
        expect.objectContaining({ run_id: queued.run_id, status: "success", run_time_ms: 42 }),
      ]);
      expect(await h.get(P, "a", queued.run_id)).toMatchObject({ status: "success", run_time_ms: 42 });
      expect(await h.get(P, "other-app", queued.run_id)).toBeUndefined();
    });
  });

  it("an event without a record (of an earlier version) or with one that is not a run is passed over", async () => {
    await withHistory(backend, async (h, P) => {
      nc.publish(subjects.runEvent(P, "a", "success"), new Uint8Array([1, 2, 3]));
      const bad = headers();
      bad.set("Skiff-Run", '{"run_id":"not-a-uuid","status":"success"}');
      nc.publish(subjects.runEvent(P, "a", "success"), new Uint8Array(), { headers: bad });
      const good = run(P, "a");
      await publishRunEvent(nc, good);
      await caughtUp(h);
      expect((await h.list(P, "a", { pageSize: 10 })).runs.map((r) => r.run_id)).toEqual([good.run_id]);
    });
  });

  it("a restart resumes after the last message applied, without reading the stream again", async () => {
    const schema = newSchema();
    const P = newProject();
    let h = await open(backend, schema);
    for (let i = 0; i < 30; i++) await publishRunEvent(nc, run(P, "a"));
    const before = await caughtUp(h);
    expect(await applied(h, 30)).toBeGreaterThanOrEqual(30); // the first start projects the whole stream
    await close(h);

    const later = Array.from({ length: 7 }, () => run(P, "a"));
    for (const r of later) publishRunEventUnacked(nc, r);
    await nc.flush();
    h = await open(backend, schema);
    try {
      const last = await caughtUp(h);
      // One message of the record feed with the seven events' records.
      expect(last - before).toBe(1);
      expect(await applied(h, 1)).toBe(1);
      const page = await h.list(P, "a", { pageSize: 100 });
      expect(page.runs).toHaveLength(37);
      expect(page.runs.slice(0, 7).map((r) => r.run_id)).toEqual(later.map((r) => r.run_id).reverse());
    } finally {
      await close(h);
    }
  });

  it("retention deletes the runs made more than RUN_RETENTION_MS ago, by the time in their ids", async () => {
    await withHistory(backend, async (h, P) => {
      const now = Date.now();
      const old = [1, 2, 3].map((i) => run(P, "aged", {}, now - RUN_RETENTION_MS - i * 60_000));
      const recent = run(P, "aged", {}, now - RUN_RETENTION_MS + 60_000);
      for (const r of [...old, recent]) await publishRunEvent(nc, r);
      await caughtUp(h);
      expect((await h.list(P, "aged", { pageSize: 10 })).runs).toHaveLength(4);
      // The stream holds the other tests' runs too, some as old: at least these three go.
      expect(await h.prune(now)).toBeGreaterThanOrEqual(3);
      expect((await h.list(P, "aged", { pageSize: 10 })).runs.map((r) => r.run_id)).toEqual([recent.run_id]);
      expect(await h.prune(now)).toBe(0);
    });
  });

  it("minute stats: runs by the minute they were queued, failures, nearest-rank percentiles of finished runs", async () => {
    await withHistory(backend, async (h, P) => {
      const MINUTE = 60_000;
      const now = Math.floor(Date.now() / MINUTE) * MINUTE + 30_000;
      const at = (msAgo: number, status: RunRecord["status"], runTimeMs?: number) =>
        run(P, "s", { status, run_time_ms: runTimeMs }, now - msAgo);
      const records = [
        at(5_000, "success", 10),
        at(6_000, "failure", 30),
        at(7_000, "success", 20),
        at(8_000, "running"),
        at(9_000, "cancelled", 999),
        at(MINUTE + 1_000, "failure", 400),
        at(61 * MINUTE, "success", 5), // before the hour
      ];
      for (const r of records) await publishRunEvent(nc, r);
      await caughtUp(h);
      const from = Math.floor(now / MINUTE) * MINUTE - 59 * MINUTE;
      const stats = await h.minuteStats(P, "s", from, now + MINUTE);
      expect(stats).toEqual([
        { minuteMs: from + 58 * MINUTE, runs: 1, failures: 1, p50Ms: 400, p95Ms: 400, p99Ms: 400 },
        { minuteMs: from + 59 * MINUTE, runs: 5, failures: 1, p50Ms: 20, p95Ms: 30, p99Ms: 30 },
      ]);
      expect(await h.minuteStats(P, "other", from, now + MINUTE)).toEqual([]);
    });
  });

  it("the projector holds its batch and nothing per stored run", async () => {
    const batchSize = 20;
    const h = await open(backend, newSchema(), { projector: { batchSize, batchMs: 10, leaderRetryMs: 100 } });
    try {
      const P = newProject();
      for (let i = 0; i < 300; i++) publishRunEventUnacked(nc, run(P, "many"));
      await nc.flush();
      await caughtUp(h);
      expect((await h.list(P, "many", { pageSize: 500 })).runs).toHaveLength(300);
      // Every collection reachable from the projector's own fields holds at most a batch's worth.
      const sizes: number[] = [];
      const seen = new Set<unknown>();
      const walk = (v: unknown, depth: number) => {
        if (typeof v !== "object" || v === null || seen.has(v) || depth > 2) return;
        seen.add(v);
        if (v instanceof Map || v instanceof Set) sizes.push(v.size);
        if (Array.isArray(v)) sizes.push(v.length);
        if (Object.getPrototypeOf(v) === Object.prototype || v === h.projector)
          for (const x of Object.values(v)) walk(x, depth + 1);
      };
      walk(h.projector, 0);
      expect(Math.max(0, ...sizes)).toBeLessThanOrEqual(batchSize);
    } finally {
      await close(h);
    }
  });
});

describe("run history - the embedded database", () => {
  it("lives in a SQLite file of the data folder; a PGlite folder of an earlier version is left alone and said so", async () => {
    const dataDir = await mkdtemp(path.join(tmpdir(), "skiff-history-old-"));
    try {
      await mkdir(path.join(dataDir, OLD_PGLITE_FOLDER));
      await writeFile(path.join(dataDir, OLD_PGLITE_FOLDER, "PG_VERSION"), "17\n");
      const warnings: string[] = [];
      const logger = Object.create(silentLogger) as typeof silentLogger;
      logger.warn = ((_o: unknown, msg?: string) => void warnings.push(msg ?? "")) as typeof logger.warn;
      const P = newProject();
      let h = await open("sqlite", newSchema(), { dataDir, logger });
      const r = run(P, "a");
      await publishRunEvent(nc, r);
      await caughtUp(h);
      await close(h);
      expect(warnings.filter((w) => w.includes("no longer read"))).toHaveLength(1);
      expect((await readdir(dataDir)).sort()).toEqual([HISTORY_FOLDER, OLD_PGLITE_FOLDER].sort());
      expect(await readdir(path.join(dataDir, HISTORY_FOLDER))).toContain("runs.sqlite");
      // Opened again: the runs are there, nothing is projected twice, and the old folder is not spoken of again.
      h = await open("sqlite", newSchema(), { dataDir, logger });
      try {
        expect(await h.get(P, "a", r.run_id)).toMatchObject({ run_id: r.run_id, status: "success" });
        await caughtUp(h);
        expect(h.projector!.applied).toBe(0);
        expect(warnings.filter((w) => w.includes("no longer read"))).toHaveLength(1);
      } finally {
        await close(h);
      }
    } finally {
      await rm(dataDir, { recursive: true, force: true });
    }
  });
});

describe("run history - SKIFF_WORKERS' workers of an earlier version", () => {
  it("each kept a history of its own; those files are left alone and said so, once", async () => {
    const dataDir = await mkdtemp(path.join(tmpdir(), "skiff-history-workers-"));
    try {
      for (const n of ["1", "2"]) {
        await mkdir(path.join(dataDir, "workers", n, HISTORY_FOLDER), { recursive: true });
        await writeFile(path.join(dataDir, "workers", n, HISTORY_FOLDER, "runs.sqlite"), "");
      }
      const warnings: { old?: string[]; msg: string }[] = [];
      const logger = Object.create(silentLogger) as typeof silentLogger;
      logger.warn = ((o: { old?: string[] }, msg?: string) =>
        void warnings.push({ ...o, msg: msg ?? "" })) as typeof logger.warn;
      const said = () => warnings.filter((w) => w.msg.includes("now share one history"));
      await close(await open("sqlite", newSchema(), { dataDir, logger }));
      expect(said()).toHaveLength(1);
      expect(said()[0].old?.sort()).toEqual(["1", "2"].map((n) => path.join(dataDir, "workers", n, HISTORY_FOLDER)));
      // The shared file is there now: not said again.
      await close(await open("sqlite", newSchema(), { dataDir, logger }));
      expect(said()).toHaveLength(1);
      expect(await readdir(path.join(dataDir, "workers", "1", HISTORY_FOLDER))).toEqual(["runs.sqlite"]);
    } finally {
      await rm(dataDir, { recursive: true, force: true });
    }
  });
});

describe("run history - two processes sharing one PostgreSQL", () => {
  it("one projects at a time, the other takes over from the stored cursor, and both read the same runs", async () => {
    const schema = newSchema();
    const P = newProject();
    // Both start at once: the migrations take turns under their lock.
    const [h1, h2] = await Promise.all([open("postgres", schema), open("postgres", schema)]);
    const first = Array.from({ length: 40 }, () => run(P, "a"));
    for (const r of first) publishRunEventUnacked(nc, r);
    await nc.flush();
    const mid = await caughtUp(h1);
    const leaders = [h1, h2].filter((h) => h.projector!.leading);
    expect(leaders).toHaveLength(1);
    const [leader, other] = leaders[0] === h1 ? [h1, h2] : [h2, h1];
    expect(other.projector!.applied).toBe(0);
    expect((await other.list(P, "a", { pageSize: 100 })).runs).toHaveLength(40);

    await close(leader);
    const second = Array.from({ length: 15 }, () => run(P, "a"));
    for (const r of second) publishRunEventUnacked(nc, r);
    await nc.flush();
    try {
      const last = await caughtUp(other);
      expect(other.projector!.leading).toBe(true);
      // Taken over where the first stopped: only the message that came after (the record feed's, with the
      // 15 runs' records).
      expect(last - mid).toBe(1);
      expect(await applied(other, 1)).toBe(1);
      const page = await other.list(P, "a", { pageSize: 100 });
      expect(page.runs.map((r) => r.run_id)).toEqual([...first, ...second].map((r) => r.run_id).reverse());
    } finally {
      await close(other);
    }
  });
});

describe("run history - projected from the run bucket before", () => {
  it("its rows stay, and the events go on from the stream's start, updating them", async () => {
    const schema = newSchema();
    const P = newProject();
    const r = run(P, "a", { status: "running", finished_at: undefined, run_time_ms: undefined });
    const client = new pg.Client({ connectionString: DATABASE_URL });
    await client.connect();
    try {
      let h = await open("postgres", schema);
      await publishRunEvent(nc, r);
      await caughtUp(h);
      await close(h);
      // As an earlier version left it: the cursor of the run bucket's stream, and revisions of that stream.
      await client.query(`UPDATE "${schema}".projection SET stream = 'KV_skiff-runs', last_seq = 999999999`);
      await client.query(`UPDATE "${schema}".runs SET revision = 999999999`);
      h = await open("postgres", schema);
      try {
        await publishRunEvent(nc, { ...r, status: "success", run_time_ms: 7 });
        await caughtUp(h);
        expect(await h.get(P, "a", r.run_id)).toMatchObject({ status: "success", run_time_ms: 7 });
        const cursors = await client.query(`SELECT stream FROM "${schema}".projection`);
        expect(cursors.rows).toEqual([{ stream: FEED_STREAM }]);
      } finally {
        await close(h);
      }
    } finally {
      await client.end();
    }
  });
});

describe("run history - after a version that projected the events themselves", () => {
  it("the events it left are read from their headers, up to the record feed's start, then the feed follows", async () => {
    // A NATS of its own: the feed's first message must be this test's.
    const own = await startProvisionedNats();
    const c = own.nc;
    coalesceWrites(c);
    const schema = newSchema();
    const P = newProject();
    const client = new pg.Client({ connectionString: DATABASE_URL });
    await client.connect();
    const openOwn = () =>
      openRunHistory({
        nc: c,
        logger: silentLogger,
        databaseUrl: DATABASE_URL,
        dataDir: sqliteDir,
        schema,
        projector: { batchMs: 20, leaderRetryMs: 100 },
      });
    /** An event as that version published it: its record in its header, nothing in the feed. */
    const earlierEvent = (r: RunRecord) => {
      const h0 = headers();
      h0.set("Skiff-Run", JSON.stringify(r));
      c.publish(subjects.runEvent(P, "a", r.status), new Uint8Array(), { headers: h0 });
    };
    try {
      const first = run(P, "a");
      earlierEvent(first);
      await c.flush();
      // Its history, as that version left it: the first run projected, its cursor on the events' stream.
      let h = await openOwn();
      await vi.waitUntil(async () => (await h.get(P, "a", first.run_id)) !== undefined, { timeout: 10_000 });
      await h.close();
      const events = await (await c.jetstreamManager()).streams.info(RUNS_STREAM);
      await client.query(`DELETE FROM "${schema}".projection`);
      await client.query(`INSERT INTO "${schema}".projection (stream, stream_created, last_seq) VALUES ($1, $2, $3)`, [
        RUNS_STREAM,
        events.created,
        events.state.last_seq,
      ]);
      // That version went on a while after its history stopped; then this one took over.
      const earlier = [run(P, "a"), run(P, "a", { status: "failure", error: { type: "app_error", message: "x" } })];
      for (const r of earlier) earlierEvent(r);
      await c.flush();
      const later = run(P, "a");
      await publishRunEvent(c, later);
      h = await openOwn();
      try {
        const feedLast = (await (await c.jetstreamManager()).streams.info(FEED_STREAM)).state.last_seq;
        await vi.waitUntil(async () => (await h.position()) >= feedLast, { timeout: 30_000, interval: 20 });
        const page = await h.list(P, "a", { pageSize: 10 });
        expect(page.runs.map((r) => r.run_id)).toEqual([later, ...[...earlier].reverse(), first].map((r) => r.run_id));
        const cursors = await client.query(`SELECT stream FROM "${schema}".projection`);
        expect(cursors.rows).toEqual([{ stream: FEED_STREAM }]);
        // Each run still names its event (where GetRun reads an ended async run's result from), those
        // projected from the events themselves too.
        const jsm = await c.jetstreamManager();
        for (const r of [first, ...earlier, later]) {
          const found = await h.find(P, "a", r.run_id);
          expect(found?.eventSeq, r.run_id).toBeGreaterThan(0);
          const event = await jsm.streams.getMessage(RUNS_STREAM, { seq: found!.eventSeq });
          expect((JSON.parse(event.header.get("Skiff-Run")) as RunRecord).run_id).toBe(r.run_id);
        }
      } finally {
        await h.close();
      }
    } finally {
      await client.end();
      await own.stop();
    }
  });
});

describe("run history - a database that does not take writes for a while", () => {
  /** The part of better-sqlite3 used here (the server loads it on its database threads, untyped). */
  type Sqlite = { exec(sql: string): void; close(): void };
  const Database = createRequire(import.meta.url)("better-sqlite3") as new (file: string) => Sqlite;

  /** Holds the embedded history's write lock from a connection of the test's own until the returned function. */
  function lockSqlite(schema: string): () => void {
    const db = new Database(path.join(sqliteDir, schema, HISTORY_FOLDER, SQLITE_FILE));
    db.exec("BEGIN IMMEDIATE");
    return () => {
      db.exec("COMMIT");
      db.close();
    };
  }

  /** Stream messages the history's projector has been sent of FEED_STREAM: its consumer's last delivered sequence. */
  async function deliveredTo(since: number): Promise<number> {
    const jsm = await nc.jetstreamManager();
    let last = 0;
    for await (const ci of jsm.consumers.list(FEED_STREAM))
      if (Date.parse(ci.created) >= since) last = Math.max(last, ci.delivered.stream_seq);
    return last;
  }

  it("the projector is sent a few of the feed's messages at a time, each of which holds many records", async () => {
    const schema = newSchema();
    const since = Date.now();
    const h = await open("sqlite", schema);
    try {
      const P = newProject();
      // Following the feed (its consumer made) before the database stops taking writes.
      await publishRunEvent(nc, run(P, "first"));
      await caughtUp(h);
      const unlock = lockSqlite(schema);
      const js = nc.jetstream();
      // 120 messages of about 120 KB: 100 records each, of 1 KB paths. Sent them all, the projector would hold 14 MB.
      const first = (await lastSeq()) + 1;
      for (let m = 0; m < 120; m++) {
        const lines = Array.from({ length: 100 }, () => JSON.stringify(run(P, "big", { path: "x".repeat(1024) })));
        await js.publish(subjects.historyRuns, new TextEncoder().encode(lines.join("\n")));
      }
      let held = 0;
      try {
        // Until the server has sent what the projector asked for.
        await vi.waitUntil(
          async () => {
            const now = await deliveredTo(since);
            const settled = now === held && now >= first;
            held = now;
            return settled;
          },
          { timeout: 8_000, interval: 300 },
        );
        // 32 messages the pull, and the two batches the projector makes before it waits (10).
        expect(held - first + 1).toBeLessThan(60);
      } finally {
        unlock();
      }
      await caughtUp(h);
      const page = await h.list(P, "big", { pageSize: 500 });
      expect(page.runs).toHaveLength(500);
      expect(page.next).toBeDefined();
    } finally {
      await close(h);
    }
  });

  it("batches whose time is up wait for the write under way: a stuck write holds two, not one more each batchMs", async () => {
    const schema = newSchema();
    const h = await open("sqlite", schema, { projector: { batchSize: 20, batchMs: 10, leaderRetryMs: 100 } });
    try {
      const P = newProject();
      await publishRunEvent(nc, run(P, "first"));
      await caughtUp(h);
      const unlock = lockSqlite(schema);
      const runs: RunRecord[] = [];
      let most = 0;
      try {
        // One run every 5 ms for a second, each in a message of its own: a batch's time is up many times over.
        for (let i = 0; i < 200; i++) {
          const r = run(P, "trickle");
          runs.push(r);
          await publishRunEvent(nc, r);
          await new Promise((resolve) => setTimeout(resolve, 5));
          most = Math.max(most, h.projector!.queued);
        }
      } finally {
        unlock();
      }
      expect(most).toBeLessThanOrEqual(2);
      await caughtUp(h);
      const page = await h.list(P, "trickle", { pageSize: 500 });
      expect(page.runs.map((r) => r.run_id)).toEqual(runs.map((r) => r.run_id).reverse());
    } finally {
      await close(h);
    }
  });
});

describe("run history - NATS restarts", () => {
  it("the projection goes on after the NATS server restarts, from where it stood", async () => {
    const h = await open("postgres", newSchema());
    try {
      const P = newProject();
      const before = Array.from({ length: 5 }, () => run(P, "a"));
      for (const r of before) await publishRunEvent(nc, r);
      await caughtUp(h);
      // The projector's consumer lives in the server's memory: a restart loses it.
      await nats.nats.restart();
      const after = Array.from({ length: 5 }, () => run(P, "a"));
      await vi.waitUntil(
        async () => {
          try {
            await publishRunEvent(nc, after[0]);
            return true;
          } catch {
            return false;
          }
        },
        { timeout: 60_000, interval: 200 },
      );
      for (const r of after.slice(1)) await publishRunEvent(nc, r);
      await caughtUp(h);
      const page = await h.list(P, "a", { pageSize: 20 });
      expect(page.runs.map((r) => r.run_id)).toEqual([...before, ...after].map((r) => r.run_id).reverse());
    } finally {
      await close(h);
    }
  });
});

describe("rowOf", () => {
  const record: RunRecord = {
    run_id: v7(),
    project_id: "p",
    app_name: "a",
    path: "/x",
    async: true,
    status: "success",
    queued_at: "2026-11-25T00:00:00.000Z",
    finished_at: "2026-11-25T00:00:01.000Z",
    attempts: 1,
  };

  it("keeps an event's record as it is, and leaves out a result and the prior revisions when a record has them", () => {
    expect(rowOf(record, 7)).toMatchObject({ run_id: record.run_id, status: "success", async: true, revision: 7 });
    expect(rowOf(record, 7)!.record).toBe(record);
    const full = rowOf(
      {
        ...record,
        result: { content_type: "text/plain", data: "aGk=", expires_at: record.queued_at },
        prior_revisions: [3],
      },
      8,
    )!;
    expect(full.record).toEqual(record);
    // As it is stored: JSON (the row's record is copied field by field, the two left unset).
    const stored = JSON.parse(JSON.stringify(full.record)) as object;
    expect(stored).toEqual(record);
    expect(stored).not.toHaveProperty("result");
    expect(stored).not.toHaveProperty("prior_revisions");
  });

  it("keeps the header's text as the record's JSON unless something was left out of it or it has a NUL", () => {
    const text = JSON.stringify(record);
    expect(rowOf(JSON.parse(text) as RunRecord, 7, text)!.json).toBe(text);
    const withResult = {
      ...record,
      result: { content_type: "text/plain", data: "aGk=", expires_at: record.queued_at },
    };
    expect(rowOf(withResult, 7, JSON.stringify(withResult))!.json).toBeUndefined();
    const nul = { ...record, error: { type: "E", message: "a\u0000b" } };
    expect(rowOf(nul, 7, JSON.stringify(nul))!.json).toBeUndefined();
    expect(rowOf(record, 7)!.json).toBeUndefined();
  });
});
