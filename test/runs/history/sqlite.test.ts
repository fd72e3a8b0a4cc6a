// The embedded run history's SQLite file: its connection threads (a
// transaction is all or nothing, a failed statement says why), and its
// queries' plans: every page is one walk of one index, newest first, never a
// scan of the table or a sort of an app's runs.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { v7 } from "uuid";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { RunRow } from "../../../services/runs/history/history.js";
import {
  listQuery,
  openSqliteHistory,
  SQLITE_FILE,
  type SqliteHistory,
} from "../../../services/runs/history/sqlite.js";
import { startSqliteThread, type SqliteThread } from "../../../services/runs/history/sqlite-thread.js";
import type { RunStatus } from "../../../services/runs/store.js";

let dir: string;
let history: SqliteHistory;
let thread: SqliteThread;
const P = "p-plan";

function row(i: number, status: RunStatus, async: boolean): RunRow {
  const at = new Date(Date.now() - 10_000 + i).toISOString();
  const run_id = v7();
  return {
    run_id,
    project_id: P,
    app_name: `app${i % 3}`,
    status,
    async,
    queued_at: at,
    started_at: at,
    finished_at: at,
    run_time_ms: 1,
    status_code: 200,
    error_type: null,
    record: { run_id, project_id: P, app_name: `app${i % 3}`, path: "run", async, status, queued_at: at, attempts: 1 },
    revision: i + 1,
  };
}

beforeAll(async () => {
  dir = await mkdtemp(path.join(tmpdir(), "skiff-sqlite-"));
  history = await openSqliteHistory(dir);
  const writer = (await history.writer())!;
  const statuses: RunStatus[] = ["success", "success", "success", "failure", "cancelled", "running"];
  const runs = Array.from({ length: 3000 }, (_, i) => row(i, statuses[i % statuses.length], i % 4 === 0));
  await writer.write({ runs, deliveries: [], stream: "S", streamCreated: "c", lastSeq: 3000 });
  await writer.release();
  thread = await startSqliteThread(path.join(dir, SQLITE_FILE), { pragmas: [], setup: [] });
});

afterAll(async () => {
  await thread?.close();
  await history?.close();
  await rm(dir, { recursive: true, force: true });
});

async function plan(sql: string, params: unknown[]): Promise<string> {
  const [rows] = (await thread.run([{ sql: `EXPLAIN QUERY PLAN ${sql}`, params, mode: "all" }])) as [
    { detail: string }[],
  ];
  return rows.map((r) => r.detail).join("; ");
}

describe("run history - embedded SQLite", () => {
  const token = v7();
  it.each([
    ["an app's page", "app0", {}, "runs_app"],
    ["a project's page", undefined, {}, "runs_project"],
    ["an app's failures", "app0", { status: "failure" }, "runs_app_status"],
    ["a project's cancelled runs", undefined, { status: "cancelled" }, "runs_project_status"],
    ["an app's async runs", "app0", { asyncOnly: true }, "runs_app_async"],
    ["an app's successes (most runs)", "app0", { status: "success" }, "runs_app"],
    ["an app's page after a token, since a time", "app1", { after: token, sinceMs: Date.now() - 60_000 }, "runs_app"],
  ] as const)("%s walks index %s without a sort", async (_name, app, q, index) => {
    const { sql, params } = listQuery(P, app, { pageSize: 50, ...q });
    const p = await plan(sql, params);
    expect(p).toMatch(new RegExp(`USING (COVERING )?INDEX ${index} \\(`));
    expect(p).not.toMatch(/TEMP B-TREE|SCAN runs(?! USING)/);
  });

  it("pages read the rows the writer wrote, and a stale-sync sweep finds its running sync runs by its index", async () => {
    const page = await history.list(P, "app0", { pageSize: 10, status: "failure" });
    expect(page.runs).toHaveLength(10);
    expect(page.runs.every((r) => r.status === "failure" && r.app_name === "app0")).toBe(true);
    const running = await history.runningSync(5);
    expect(running.every((r) => r.status === "running" && !r.async)).toBe(true);
    expect(running).toHaveLength(5);
    expect(
      await plan("SELECT record FROM runs WHERE status = 'running' AND async = 0 ORDER BY run_id LIMIT ?", [5]),
    ).toMatch(/INDEX runs_running_sync/);
  });

  it("a transaction is all or nothing, and a failed statement says why", async () => {
    const before = await history.count();
    const insert = "INSERT INTO projection (stream, stream_created, last_seq) VALUES (?, ?, ?)";
    await expect(
      thread.run(
        [
          { sql: insert, params: ["T", "c", 1], mode: "run" },
          { sql: insert, params: ["T", "c", 2], mode: "run" },
        ],
        true,
      ),
    ).rejects.toMatchObject({
      message: expect.stringMatching(/UNIQUE constraint failed/),
      code: "SQLITE_CONSTRAINT_PRIMARYKEY",
    });
    expect(await history.position("T")).toBe(0);
    await expect(thread.run([{ sql: "SELECT nope FROM runs", mode: "all" }])).rejects.toThrow(/no such column: nope/);
    expect(await history.count()).toBe(before);
    expect(await history.position("S")).toBe(3000);
  });
});
