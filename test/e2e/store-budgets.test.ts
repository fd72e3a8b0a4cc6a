// Store budgets seen from outside: a skiff whose async run queue has a small
// byte budget and no runner to empty it. Calls are accepted until the queue
// is nearly at its budget, then answered 503 with Retry-After and a message
// naming the queue and its setting (never a 500), whether skiff's own count
// or JetStream's refusal stops them; every accepted run stays queued;
// /readyz names the full store and /metrics shows every store's bytes and
// budget.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { connect, type NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { publishAcked } from "../../services/nats/acked-publish.js";
import { STORE_SPECS } from "../../services/nats/budgets.js";
import { buckets, streams, subjects } from "../../services/nats/layout.js";
import { cortexApp, deploy, P, post } from "../helpers/run-apps.js";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";

const MiB = 2 ** 20;
let t: TestSkiff;
let tmp: string;
let nc: NatsConnection;

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-budgets-e2e-"));
  t = await startTestSkiff({
    env: {
      // No runner: what is queued stays queued.
      SKIFF_ROLES: "invocation,management",
      SKIFF_RUN_QUEUE_MAX_BYTES: "1MB",
      SKIFF_EVENTS_MAX_BYTES: "64MB",
      SKIFF_HISTORY_MAX_BYTES: "32MB",
      SKIFF_MAX_QUEUED_RUNS: "100000",
    },
  });
  nc = await connect({ servers: t.nats.url });
  await deploy(tmp, t.management(), cortexApp("queued", { min_replicas: 0, max_replicas: 1 }));
}, 120_000);

afterAll(async () => {
  await nc?.close();
  await t?.close();
  await rm(tmp, { recursive: true, force: true });
});

const queueInfo = async () => (await (await nc.jetstreamManager()).streams.info(streams.runs.name)).state;

async function readyz(): Promise<{ status: number; body: Record<string, unknown> }> {
  const res = await fetch(`${t.url}/readyz`);
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}

describe("store budgets, end to end", () => {
  it("a full queue answers 503 with Retry-After naming it and its setting; every accepted run stays queued; /readyz names it", async () => {
    const body = JSON.stringify({ a: 1, b: 2, pad: "x".repeat(16 * 1024) });
    const accepted: string[] = [];
    let refusal: Awaited<ReturnType<typeof post>> | undefined;
    for (let i = 0; i < 200 && refusal === undefined; i++) {
      const res = await post(`${t.url}/v4/${P}/queued/add?async=true`, t.devToken, body);
      if (res.status === 202) accepted.push(JSON.parse(res.text).run_id);
      else refusal = res;
    }
    expect(refusal, "the queue never filled").toBeDefined();
    expect(refusal!.status).toBe(503);
    expect(refusal!.headers.get("retry-after")).toBe("5");
    expect(JSON.parse(refusal!.text).message).toMatch(
      /the async run queue SKIFF_RUNS is full.*SKIFF_RUN_QUEUE_MAX_BYTES; no run is dropped/,
    );
    // Refused before JetStream would: the queue holds exactly the accepted runs, from the first.
    const q = await queueInfo();
    expect(q.messages).toBe(accepted.length);
    expect(q.first_seq).toBe(1);
    expect(q.bytes).toBeLessThanOrEqual(MiB);
    expect(accepted.length).toBeGreaterThan(40);

    // A second try is refused too, and nothing was added.
    const again = await post(`${t.url}/v4/${P}/queued/add?async=true`, t.devToken, body);
    expect(again.status).toBe(503);
    expect((await queueInfo()).messages).toBe(accepted.length);

    // /readyz stays 200 (sync calls still work) and names the full store.
    await vi.waitUntil(async () => ((await readyz()).body.full_stores as string[] | undefined)?.length === 1, {
      timeout: 45_000,
      interval: 250,
    });
    expect(await readyz()).toEqual({
      status: 200,
      body: { status: "ready", nats_auth: false, full_stores: [streams.runs.name] },
    });

    // Emptied, it takes runs again.
    await (await nc.jetstreamManager()).streams.purge(streams.runs.name);
    await vi.waitUntil(
      async () => (await post(`${t.url}/v4/${P}/queued/add?async=true`, t.devToken, body)).status === 202,
      { timeout: 45_000, interval: 500 },
    );
    await vi.waitUntil(async () => (await readyz()).body.full_stores === undefined, { timeout: 45_000, interval: 250 });
  });

  it("a queue filled by another process between two measures: JetStream's refusal is the same clear 503", async () => {
    await (await nc.jetstreamManager()).streams.purge(streams.runs.name);
    // Let this process measure the empty queue, then fill it behind its back.
    await vi.waitUntil(async () => (await readyz()).body.full_stores === undefined, { timeout: 45_000, interval: 250 });
    await new Promise((r) => setTimeout(r, 5_500));
    // Large messages, then small ones, until not even a small one fits.
    for (const size of [8 * 1024, 16]) {
      for (let i = 0; ; i++) {
        const stored = await publishAcked(nc, subjects.runQueue(P, "other"), new Uint8Array(size), {
          msgId: `filler-${size}-${i}`,
        }).then(
          () => true,
          () => false,
        );
        if (!stored) break;
      }
    }
    const before = (await queueInfo()).messages;
    const res = await post(`${t.url}/v4/${P}/queued/add?async=true`, t.devToken, JSON.stringify({ a: 1, b: 2 }));
    expect(res.status).toBe(503);
    expect(JSON.parse(res.text).message).toMatch(/the async run queue SKIFF_RUNS is full.*SKIFF_RUN_QUEUE_MAX_BYTES/);
    expect((await queueInfo()).messages).toBe(before);
  });

  it("/metrics shows every store's bytes and budget", async () => {
    let text = "";
    const value = (name: string, store: string) => {
      const line = text.split("\n").find((l) => l.startsWith(`${name}{`) && l.includes(`store="${store}"`));
      return line === undefined ? undefined : Number(line.slice(line.lastIndexOf(" ") + 1));
    };
    // Measured every 5 s; the run history joins once its database is open.
    await vi.waitUntil(
      async () => {
        const res = await fetch(`${t.url}/metrics`, { headers: { authorization: `Bearer ${t.adminToken}` } });
        text = await res.text();
        return value("skiff_store_bytes", "run-history")! > 0 && value("skiff_store_bytes", streams.events.name)! > 0;
      },
      { timeout: 60_000, interval: 500 },
    );
    for (const spec of STORE_SPECS) {
      expect(value("skiff_store_budget_bytes", spec.store), spec.store).toBeGreaterThan(0);
      expect(value("skiff_store_bytes", spec.store), spec.store).toBeGreaterThanOrEqual(0);
    }
    expect(value("skiff_store_budget_bytes", streams.runs.name)).toBe(MiB);
    expect(value("skiff_store_budget_bytes", streams.events.name)).toBe(64 * MiB);
    expect(value("skiff_store_budget_bytes", "run-history")).toBe(32 * MiB);
    expect(value("skiff_store_bytes", buckets.apps.name)).toBeGreaterThan(0);
  });
});
