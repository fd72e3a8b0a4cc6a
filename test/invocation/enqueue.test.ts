// Async accept is one acknowledged publish: the queue message carries the
// `queued` record, and nothing is written to KV. The runner that takes the
// run writes its first record, `running`, from the message; a record written
// first (a cancel) is never overwritten, and the runner acks the run unrun.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { v7 } from "uuid";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { subjects } from "../../services/nats/layout.js";
import { encodeRequest } from "../../services/runner-client/codec.js";
import { BodyTransfer } from "../../services/runs/transfer.js";
import { RunStore, type RunRecord } from "../../services/runs/store.js";
import { cortexApp, deploy, P, post } from "../helpers/run-apps.js";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";

let t: TestSkiff;
let tmp: string;

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-accept-"));
  t = await startTestSkiff();
  await deploy(tmp, t.management(), cortexApp("accept", { max_replicas: 1 }));
  await vi.waitUntil(() => t.skiff.runner!.version(P, "accept") === 1, { timeout: 60_000 });
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
  const { data } = await encodeRequest(transfer, invoke, { record: queuedRecord(runId) });
  await nc.jetstream().publish(subjects.runQueue(P, "accept"), data, { msgID: runId });
}

describe("async accept", () => {
  it("a queued run is recorded from its message by the runner, and succeeds", async () => {
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
      { timeout: 60_000 },
    );
    expect(run).toMatchObject({ async: true, attempts: 1, statusCode: 200 });
  });

  it("a queued run has no KV record (the queue message is its record); a record written first (a cancel) makes the runner ack the message unrun", async () => {
    const store = await RunStore.open(t.skiff.nats.nc);
    // Accepted through the gateway: only the queue message and the `queued` event, nothing in KV; the runner's
    // `running` is the first revision of the run's record, its end the second.
    const res = await post(`${t.url}/v4/${P}/accept/add?async=true`, t.devToken, '{"a":1,"b":1}');
    expect(res.status).toBe(202);
    const accepted = res.json.run_id as string;
    await vi.waitUntil(async () => (await store.get(P, "accept", accepted))?.record.status === "success", {
      timeout: 60_000,
    });
    const subject = `$KV.skiff-runs.${P}.accept.${accepted}`;
    const jsm = await t.skiff.nats.nc.jetstreamManager();
    expect((await jsm.streams.info("KV_skiff-runs", { subjects_filter: subject })).state.subjects).toEqual({
      [subject]: 2,
    });
    // A run cancelled before any runner took it: its first record is `cancelled`, and a runner never starts it.
    const runId = v7();
    const cancelled: RunRecord = { ...queuedRecord(runId), status: "cancelled", finished_at: new Date().toISOString() };
    expect(await store.create(cancelled)).toMatchObject({ record: cancelled });
    expect(await store.create({ ...cancelled, status: "running" })).toBeUndefined();
    await enqueueWithoutRecord(runId);
    await vi.waitUntil(
      async () => {
        const info = await jsm.consumers.info("SKIFF_RUNS", `runs-${P}-accept`);
        return info.num_pending === 0 && info.num_ack_pending === 0;
      },
      { timeout: 60_000, interval: 100 },
    );
    expect((await store.get(P, "accept", runId))?.record).toMatchObject({ status: "cancelled", attempts: 0 });
  });
});
