// The run history's projector on its thread: its log lines reach the
// process's logger, a thread that cannot start says why and is tried again,
// and one that ends is started again and goes on from the stored cursor.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import type { Worker } from "node:worker_threads";
import { headers } from "nats";
import { v7 } from "uuid";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { subjects } from "../../../services/nats/layout.js";
import { publishRunEvent } from "../../../services/runs/events.js";
import { HISTORY_FOLDER, openRunHistory, RUNS_STREAM } from "../../../services/runs/history/index.js";
import { ProjectorThread } from "../../../services/runs/history/projector-thread.js";
import type { RunRecord } from "../../../services/runs/store.js";
import { capturingLogger } from "../../helpers/logs.js";
import { startProvisionedNats } from "../../helpers/nats-server.js";

let nats: Awaited<ReturnType<typeof startProvisionedNats>>;
let dir: string;

beforeAll(async () => {
  nats = await startProvisionedNats();
  dir = await mkdtemp(path.join(tmpdir(), "skiff-projector-thread-"));
});

afterAll(async () => {
  await nats?.stop();
  await rm(dir, { recursive: true, force: true });
});

const WAIT = { timeout: 30_000, interval: 20 };

function run(project: string): RunRecord {
  return {
    run_id: v7(),
    project_id: project,
    app_name: "a",
    path: "/",
    async: true,
    status: "success",
    queued_at: new Date().toISOString(),
    attempts: 1,
  };
}

const lastSeq = async () => (await (await nats.nc.jetstreamManager()).streams.info(RUNS_STREAM)).state.last_seq;

describe("the run history's projector thread", () => {
  it("writes its log lines through the process's logger", async () => {
    const { logger, lines } = capturingLogger();
    const h = await openRunHistory({
      dial: nats.dial,
      logger,
      databaseUrl: undefined,
      dataDir: path.join(dir, "logs"),
      projector: { batchMs: 20 },
    });
    try {
      const bad = headers();
      bad.set("Skiff-Run", '{"run_id":"not-a-uuid","status":"success"}');
      nats.nc.publish(subjects.runEvent("p-logs", "a", "success"), new Uint8Array(), { headers: bad });
      await vi.waitUntil(() => lines.some((l) => l.msg.includes("not a run record")), WAIT);
      const line = lines.find((l) => l.msg.includes("not a run record"))!;
      expect(line).toMatchObject({ level: 40, subject: subjects.runEvent("p-logs", "a", "success") });
    } finally {
      await h.close();
    }
  });

  it("one that cannot start says why and is tried again; the process goes on", async () => {
    const { logger, lines } = capturingLogger();
    const thread = new ProjectorThread(
      {
        // Nothing listens there.
        dial: { servers: "127.0.0.1:1", name: "test" },
        databaseUrl: undefined,
        schema: "skiff",
        sqliteDir: path.join(dir, "unreachable", HISTORY_FOLDER),
        options: { leaderRetryMs: 50 },
      },
      logger,
    );
    try {
      await vi.waitUntil(() => lines.filter((l) => l.msg.includes("the projector cannot start")).length >= 2, WAIT);
      expect(thread.leading).toBe(false);
      expect(thread.applied).toBe(0);
    } finally {
      await thread.stop();
    }
  });

  it("one that ends is started again, and goes on from the stored cursor", async () => {
    const { logger, lines } = capturingLogger();
    const h = await openRunHistory({
      dial: nats.dial,
      logger,
      databaseUrl: undefined,
      dataDir: path.join(dir, "restart"),
      projector: { batchMs: 20, leaderRetryMs: 50 },
    });
    try {
      const first = run("p-restart");
      await publishRunEvent(nats.nc, first);
      const mid = await lastSeq();
      await vi.waitUntil(async () => (await h.position()) >= mid, WAIT);
      await expect.poll(() => h.projector!.applied).toBe(mid);
      // Ended from outside, as a crash would end it.
      await (h.projector as unknown as { worker: Worker }).worker.terminate();
      await vi.waitUntil(() => lines.some((l) => l.msg.includes("projector's thread ended")), WAIT);
      const second = run("p-restart");
      await publishRunEvent(nats.nc, second);
      const last = await lastSeq();
      await vi.waitUntil(async () => (await h.position()) >= last, WAIT);
      // Applied counts on over restarts: the new thread read only what came after the cursor.
      await expect.poll(() => h.projector!.applied).toBe(last);
      expect((await h.list("p-restart", "a", { pageSize: 10 })).runs.map((r) => r.run_id)).toEqual([
        second.run_id,
        first.run_id,
      ]);
    } finally {
      await h.close();
    }
  });
});
