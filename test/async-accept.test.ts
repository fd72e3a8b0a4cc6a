// Async accept is one acknowledged publish: the queue message carries the
// `queued` record, written ahead without waiting. A runner that finds no
// record (the write was lost) writes it from the message and runs the run;
// a record written first (a cancel) is never overwritten by the late write.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { v7 } from "uuid";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { subjects } from "../services/nats/layout.js";
import { BodyTransfer, encodeRequest } from "../services/runs/wire.js";
import { RunStore, type RunRecord } from "../services/runs/store.js";
import { cortexApp, deploy, P } from "./helpers/run-apps.js";
import { startTestSkiff, type TestSkiff } from "./helpers/skiff.js";

let t: TestSkiff;
let tmp: string;

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-accept-"));
  t = await startTestSkiff();
  await deploy(tmp, t.management(), cortexApp("accept", { max_replicas: 1 }));
  await vi.waitUntil(() => t.skiff.runner!.version(P, "accept") === 1, { timeout: 30_000 });
}, 60_000);
afterAll(async () => {
  await t?.close();
  await rm(tmp, { recursive: true, force: true });
});

function queuedRecord(runId: string): RunRecord {
  return {
    run_id: runId,
    project_id: P,
    app_name: "accept",
    path: "add",
    async: true,
    status: "queued",
    queued_at: new Date().toISOString(),
    attempts: 0,
  };
}

async function enqueueWithoutRecord(runId: string): Promise<void> {
  const nc = t.skiff.nats.nc;
  const transfer = new BodyTransfer(nc, () => nc.jetstream().views.os("skiff-results"));
  const body = new TextEncoder().encode('{"a":40,"b":2}');
  const invoke = { runId, method: "POST", path: "add", query: "", headers: {}, body };
  const { data } = await encodeRequest(transfer, invoke, queuedRecord(runId));
  await nc.jetstream().publish(subjects.runQueue(P, "accept"), data, { msgID: runId });
}

describe("async accept", () => {
  it("a queued run whose record never landed is recorded from its message by the runner, and succeeds", async () => {
    const runId = v7();
    await enqueueWithoutRecord(runId);
    const run = await vi.waitUntil(
      async () => {
        const r = await t
          .management()
          .getRun({ projectId: P, appName: "accept", runId })
          .catch(() => undefined);
        return r?.run?.status === "success" ? r.run : undefined;
      },
      { timeout: 20_000 },
    );
    expect(run).toMatchObject({ async: true, attempts: 1, statusCode: 200 });
  });

  it("the unacknowledged queued write never overwrites a record written first", async () => {
    const store = await RunStore.open(t.skiff.nats.nc);
    const runId = v7();
    const cancelled: RunRecord = { ...queuedRecord(runId), status: "cancelled", finished_at: new Date().toISOString() };
    await store.create(cancelled);
    store.createUnacked(queuedRecord(runId));
    await t.skiff.nats.nc.flush();
    await new Promise((r) => setTimeout(r, 200));
    // A write the server refused leaves no trace but the record as it was.
    expect((await store.get(P, "accept", runId))?.record.status).toBe("cancelled");
    const fresh = v7();
    store.createUnacked(queuedRecord(fresh));
    await vi.waitUntil(async () => (await store.get(P, "accept", fresh))?.record.status === "queued", {
      timeout: 5_000,
    });
  });
});
