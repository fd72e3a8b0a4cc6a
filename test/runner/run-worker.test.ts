// A runner killed between an async run's final record and its terminal
// event: the run's queue message, never acked, comes to another runner,
// which finds the record final. It publishes the terminal event again
// (deduplicated by its message id) before acking, so the webhook is still
// sent, once. Found by the fault suite (SIGKILL of a runner during 500 runs:
// 4 runs `success` with no event and no webhook). Here the dead runner's
// writes are made by hand: the final record without its event.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { loadConfig } from "../../services/config/config.js";
import { silentLogger } from "../../services/config/logger.js";
import { RunStore, type RunRecord } from "../../services/runs/store.js";
import { startSkiff, type Skiff } from "../../services/start.js";
import { publishRunEvent } from "../../services/runs/events.js";
import { cortexApp, deploy, P, post } from "../helpers/run-apps.js";
import { followRunRecords, type RunRecords } from "../helpers/run-records.js";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";
import { startReceiver, type Receiver } from "../helpers/webhook-receiver.js";

let gateway: TestSkiff;
let runner: Skiff | undefined;
let rx: Receiver;
let tmp: string;
let store: RunStore;
let records: RunRecords;
const events: string[] = [];

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-final-event-"));
  rx = await startReceiver(() => 200);
  // No runner yet: accepted runs wait in the queue.
  gateway = await startTestSkiff({
    env: { SKIFF_ROLES: "invocation,management,webhook", SKIFF_RUN_ACK_WAIT_MS: "1500" },
  });
  await deploy(tmp, gateway.management(), cortexApp("fin", { max_replicas: 1 }));
  store = await RunStore.open(gateway.skiff.nats.nc);
  records = await followRunRecords(gateway.skiff.nats.nc);
  gateway.skiff.nats.nc.subscribe(`skiff.events.runs.${P}.fin.success`, {
    callback: (_, m) => events.push(m.subject),
  });
}, 60_000);
afterAll(async () => {
  records?.stop();
  await runner?.close();
  await gateway?.close();
  await rx?.close();
  await rm(tmp, { recursive: true, force: true });
});

/** Queues a run with a webhook, then writes its final record as a runner that died right after would have. */
async function finishedWithoutEvent(path: string, alsoEvent: boolean): Promise<RunRecord> {
  const res = await post(
    `${gateway.url}/v4/${P}/fin/add?async=true&webhookEndpoint=${encodeURIComponent(`${rx.url}${path}`)}`,
    gateway.devToken,
    '{"a":20,"b":22}',
  );
  expect(res.status).toBe(202);
  const runId = res.json.run_id as string;
  // No runner yet: the run's record is its queue message, and its `queued` event.
  const queued = await vi.waitUntil(() => records.latest(runId), { timeout: 30_000 });
  const now = new Date();
  const body = JSON.stringify({ run_id: runId, result: 42, run_time_ms: 3 });
  const written = await store.create({
    ...queued,
    status: "success",
    attempts: 1,
    runner: "a-runner-that-died",
    started_at: now.toISOString(),
    finished_at: now.toISOString(),
    run_time_ms: 3,
    status_code: 200,
    result: {
      content_type: "application/json",
      data: Buffer.from(body).toString("base64"),
      expires_at: new Date(now.getTime() + 86_400_000).toISOString(),
    },
  });
  expect(queued.status).toBe("queued");
  const final = written?.record;
  if (alsoEvent)
    await publishRunEvent(gateway.skiff.nats.nc, final!, {
      contentType: "application/json",
      data: new TextEncoder().encode(body),
    });
  return final!;
}

describe("an async run found final when its message comes again", () => {
  it("its terminal event is published again, once: the webhook is sent with the kept result; an event that did land is not repeated", async () => {
    const lost = await finishedWithoutEvent("/lost", false);
    const landed = await finishedWithoutEvent("/landed", true);
    await rx.waitFor("/landed", 1);
    expect(rx.to("/lost")).toHaveLength(0);
    // The runner that gets the messages now.
    runner = await startSkiff(
      loadConfig({
        SKIFF_NATS_URL: gateway.nats.url,
        SKIFF_PORT: "0",
        SKIFF_DATA_DIR: path.join(tmp, "runner"),
        SKIFF_ROLES: "runner",
        SKIFF_RUN_ACK_WAIT_MS: "1500",
      }),
      silentLogger,
    );
    const [got] = await rx.waitFor("/lost", 1, 60_000);
    expect(got.headers["x-request-id"]).toBe(lost.run_id);
    expect(JSON.parse(got.body.toString())).toMatchObject({ run_id: lost.run_id, result: 42 });
    // Both messages were acked without running the app again.
    await vi.waitUntil(
      async () => {
        const jsm = await gateway.skiff.nats.nc.jetstreamManager();
        const info = await jsm.consumers.info("SKIFF_RUNS", `runs-${P}-fin`);
        return info.num_pending === 0 && info.num_ack_pending === 0;
      },
      { timeout: 60_000, interval: 200 },
    );
    await new Promise((r) => setTimeout(r, 1_500));
    // Stored in SKIFF_EVENTS: one success event each (the landed run's second publish was deduplicated).
    const jsm = await gateway.skiff.nats.nc.jetstreamManager();
    const stored = await jsm.streams.info("SKIFF_EVENTS", { subjects_filter: `skiff.events.runs.${P}.fin.success` });
    expect(stored.state.subjects).toEqual({ [`skiff.events.runs.${P}.fin.success`]: 2 });
    // Published: the lost one's event once, the landed one's twice.
    expect(events).toHaveLength(3);
    expect(rx.to("/lost")).toHaveLength(1);
    expect(rx.to("/landed")).toHaveLength(1);
    expect((await store.get(P, "fin", lost.run_id))!.record).toMatchObject({ status: "success", attempts: 1 });
    expect((await store.get(P, "fin", landed.run_id))!.record.runner).toBe("a-runner-that-died");
  }, 120_000);
});
