// The run history's byte budget: the oldest runs are deleted past what it
// holds, the tables are vacuumed so what comes next reuses their room, and
// its size stays within the budget however many runs arrive (embedded SQLite
// and the PostgreSQL server of this machine). NATS is a real server
// provisioned as skiff provisions it; each test has a schema of its own.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import type { NatsConnection } from "nats";
import pg from "pg";
import { v7 } from "uuid";
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it, vi } from "vitest";
import { silentLogger } from "../../../services/config/logger.js";
import {
  HISTORY_STORE,
  StoreWatch,
  derivedBudget,
  freeDiskBytes,
  STORE_SPECS,
} from "../../../services/nats/budgets.js";
import { publishRunEvent } from "../../../services/runs/events.js";
import { openRunHistory, FEED_STREAM, type RunHistory } from "../../../services/runs/history/index.js";
import type { RunRecord } from "../../../services/runs/store.js";
import { capturingLogger } from "../../helpers/logs.js";
import { startProvisionedNats } from "../../helpers/nats-server.js";

const DATABASE_URL = process.env.SKIFF_TEST_DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test";
const MiB = 2 ** 20;

let nats: Awaited<ReturnType<typeof startProvisionedNats>>;
let nc: NatsConnection;
let dataRoot: string;
const schemas: string[] = [];

beforeAll(async () => {
  dataRoot = await mkdtemp(path.join(tmpdir(), "skiff-history-budget-"));
});

// A NATS server of its own per test: a history follows the run stream from its start, and another test's runs
// would arrive all at once.
beforeEach(async () => {
  nats = await startProvisionedNats();
  nc = nats.nc;
});

afterEach(async () => {
  await nats?.stop();
});

afterAll(async () => {
  const client = new pg.Client({ connectionString: DATABASE_URL });
  await client.connect();
  for (const s of schemas) await client.query(`DROP SCHEMA IF EXISTS "${s}" CASCADE`);
  await client.end();
  await rm(dataRoot, { recursive: true, force: true });
});

type Backend = "sqlite" | "postgres";

function newSchema(): string {
  const s = `b_${Date.now().toString(36)}_${Math.random().toString(36).slice(2, 8)}`;
  schemas.push(s);
  return s;
}

const lastSeq = async () => (await (await nc.jetstreamManager()).streams.info(FEED_STREAM)).state.last_seq;

async function caughtUp(h: RunHistory): Promise<void> {
  const last = await lastSeq();
  await vi.waitUntil(async () => (await h.position()) >= last, { timeout: 60_000, interval: 20 });
}

/** `n` runs of one app, each queued then ended (two events, as an async run has), with a record of some size. */
async function publishRuns(project: string, n: number): Promise<RunRecord[]> {
  const made: RunRecord[] = [];
  const pending: Promise<unknown>[] = [];
  for (let i = 0; i < n; i++) {
    const at = Date.now();
    const queued: RunRecord = {
      run_id: v7(),
      project_id: project,
      app_name: "budget",
      path: "run",
      async: true,
      status: "queued",
      queued_at: new Date(at).toISOString(),
      attempts: 0,
      error: { type: "note", message: "x".repeat(200) },
    };
    const ended: RunRecord = {
      ...queued,
      status: "success",
      finished_at: new Date(at + 3).toISOString(),
      run_time_ms: 3,
      status_code: 200,
      attempts: 1,
    };
    pending.push(publishRunEvent(nc, queued).then(() => publishRunEvent(nc, ended)));
    made.push(ended);
    if (pending.length >= 100) await Promise.all(pending.splice(0));
  }
  await Promise.all(pending);
  return made;
}

async function open(
  backend: Backend,
  budget: number | undefined,
  extra: { sizeCheckEveryMs?: number; watch?: StoreWatch; logger?: ReturnType<typeof capturingLogger>["logger"] } = {},
): Promise<RunHistory> {
  const schema = newSchema();
  return openRunHistory({
    nc,
    logger: extra.logger ?? silentLogger,
    databaseUrl: backend === "postgres" ? DATABASE_URL : undefined,
    // The embedded database is one process's: a data folder of its own for each.
    dataDir: path.join(dataRoot, schema),
    schema,
    projector: { batchMs: 20, leaderRetryMs: 100 },
    budget: { maxBytes: budget, storageShare: 50, watch: extra.watch },
    sizeCheckEveryMs: extra.sizeCheckEveryMs ?? 3_600_000,
  });
}

describe.each<Backend>(["sqlite", "postgres"])("run history budget (%s)", (backend) => {
  it("keeps the newest runs that fit its budget, round after round, and its size within it", async () => {
    const budget = 2 * MiB;
    const h = await open(backend, budget);
    try {
      const P = `p-b-${Math.random().toString(36).slice(2, 8)}`;
      const sizes: number[] = [];
      let newest: RunRecord[] = [];
      let deleted = 0;
      for (let round = 0; round < 20; round++) {
        newest = await publishRuns(P, 150);
        await caughtUp(h);
        deleted += await h.pruneToBudget();
        sizes.push(await h.size());
      }
      // 3,000 runs arrived; the budget holds far fewer.
      expect(deleted).toBeGreaterThan(1000);
      for (const s of sizes) expect(s).toBeLessThanOrEqual(budget);
      // Once full, the files stop growing: the room of deleted runs is reused.
      expect(sizes.at(-1)! / sizes[sizes.length - 4]).toBeLessThan(1.1);
      // The newest runs are all there; the oldest are gone.
      const page = await h.list(P, "budget", { pageSize: 150 });
      expect(page.runs.map((r) => r.run_id)).toEqual(newest.map((r) => r.run_id).reverse());
      expect(page.runs.every((r) => r.status === "success")).toBe(true);
    } finally {
      await h.close();
    }
  }, 120_000);

  it("prunes on its own every few seconds while runs arrive, and reports its bytes and budget to the store watch", async () => {
    const budget = 2 * MiB;
    const { logger, lines } = capturingLogger();
    const watch = new StoreWatch(nc, logger, 3_600_000);
    const h = await open(backend, budget, { sizeCheckEveryMs: 100, watch, logger });
    try {
      const P = `p-b-${Math.random().toString(36).slice(2, 8)}`;
      for (let round = 0; round < 15; round++) {
        await publishRuns(P, 150);
        await caughtUp(h);
        await new Promise((r) => setTimeout(r, 300));
      }
      await watch.measure();
      const u = watch.get(HISTORY_STORE)!;
      expect(u).toMatchObject({ budget, atBudget: "drops oldest", kind: "run history" });
      expect(u.bytes).toBeLessThanOrEqual(budget);
      expect(u.bytes).toBe(await h.size());
      expect(
        lines.some((l) => /oldest runs deleted to stay within its budget .*SKIFF_HISTORY_MAX_BYTES/.test(l.msg)),
      ).toBe(true);
    } finally {
      await h.close();
      await watch.stop();
    }
    // Closed: no longer measured.
    await watch.measure();
    expect(watch.get(HISTORY_STORE)).toBeUndefined();
  }, 120_000);
});

describe("run history budget - unset", () => {
  it("is its part of SKIFF_STORAGE_SHARE of the free disk of the data folder, said in the log", async () => {
    const { logger, lines } = capturingLogger();
    const free = await freeDiskBytes(dataRoot);
    const h = await open("sqlite", undefined, { logger });
    try {
      const spec = STORE_SPECS.find((s) => s.store === HISTORY_STORE)!;
      const want = derivedBudget(spec, 50, free);
      expect(h.budget / want).toBeGreaterThan(0.95);
      expect(h.budget / want).toBeLessThan(1.05);
      expect(lines.filter((l) => /run history: budget .*SKIFF_HISTORY_MAX_BYTES/.test(l.msg))).toHaveLength(1);
    } finally {
      await h.close();
    }
  });
});
