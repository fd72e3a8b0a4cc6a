import { spawn, type ChildProcess } from "node:child_process";
import { afterAll, afterEach, beforeAll, expect, test, vi } from "vitest";
import { listDeliveries } from "../../services/webhooks/deliveries.js";
import { INTERRUPTED_GRACE_MS } from "../../services/webhook/deliver.js";
import { publishRunEvent, terminalEvent } from "../helpers/webhook-events.js";
import { settled, startWebhookHarness, type WebhookHarness } from "../helpers/webhook-harness.js";
import { startReceiver, type Receiver } from "../helpers/webhook-receiver.js";

const TIMEOUT_MS = 1_500;
/** For the mid-attempt case only: JetStream hands a silent process's message on after ack_wait. */
const SHORT_ACK_WAIT_MS = 2_000;

let h: WebhookHarness;
let rx: Receiver;
const children = new Set<ChildProcess>();

beforeAll(async () => {
  h = await startWebhookHarness();
  // /404/*: always 404; /hang-once/*: the first request never gets an answer, later ones 200.
  rx = await startReceiver((path, n) =>
    path.startsWith("/404/") ? 404 : path.startsWith("/hang-once/") && n === 1 ? "hang" : 200,
  );
});
afterEach(() => {
  for (const c of children) c.kill("SIGKILL");
  children.clear();
});
afterAll(async () => {
  await h?.close();
  await rx?.close();
});

/** A webhook process of its own, as `--roles webhook` would be; resolves once it consumes. */
async function spawnWebhookProcess(ackWaitMs?: number): Promise<ChildProcess> {
  const child = spawn(process.execPath, ["--import", "tsx", "test/helpers/webhook-role-child.ts"], {
    env: {
      ...process.env,
      NATS_URL: h.nats.url,
      WEBHOOK_TIMEOUT_MS: String(TIMEOUT_MS),
      WEBHOOK_ACK_WAIT_MS: ackWaitMs === undefined ? "" : String(ackWaitMs),
    },
    stdio: ["ignore", "pipe", "inherit"],
  });
  children.add(child);
  await new Promise<void>((resolve, reject) => {
    let out = "";
    child.stdout!.on("data", (d: Buffer) => {
      out += d.toString();
      if (out.includes("ready\n")) resolve();
    });
    child.on("exit", (code) => reject(new Error(`webhook process exited with ${code} before it was ready`)));
  });
  return child;
}

async function sigkill(child: ChildProcess): Promise<number> {
  const exited = new Promise((resolve) => child.once("exit", resolve));
  child.kill("SIGKILL");
  await exited;
  children.delete(child);
  return Date.now();
}

test("webhook - a process killed between attempts is replaced, and the next one continues without exceeding 3 attempts", async () => {
  // The production ack_wait: the delayed message goes straight to the live process.
  const first = await spawnWebhookProcess();
  const e = terminalEvent(`${rx.url}/404/between`, '{"n":1}');
  await publishRunEvent(h.nc, e);
  // Killed once attempt 1 is recorded and before attempt 2 (due 1 s later) starts.
  await vi.waitUntil(async () => (await listDeliveries(h.nc, e.runId))[0]?.attempts[0]?.outcome === "retry", {
    timeout: 30_000,
    interval: 20,
  });
  const killedAt = await sigkill(first);
  expect(rx.to("/404/between")).toHaveLength(1);

  await spawnWebhookProcess();
  const [d] = await h.waitForDeliveries(e.runId, settled);
  expect(d.state).toBe("failed");
  expect(d.attempts.map((a) => [a.attempt, a.statusCode, a.outcome])).toEqual([
    [1, 404, "retry"],
    [2, 404, "retry"],
    [3, 404, "failed"],
  ]);
  const got = rx.to("/404/between");
  expect(got).toHaveLength(3);
  expect(
    got.slice(1).every((r) => r.at > killedAt),
    "attempts 2 and 3 come from the second process",
  ).toBe(true);
  expect(got.map((r) => r.headers["x-request-id"])).toEqual([e.runId, e.runId, e.runId]);
  // Nothing more arrives later.
  await new Promise((r) => setTimeout(r, 1_500));
  expect(rx.to("/404/between")).toHaveLength(3);
});

test("webhook - a process killed mid-attempt: the attempt counts, and the next process continues after its deadline", async () => {
  const first = await spawnWebhookProcess(SHORT_ACK_WAIT_MS);
  const e = terminalEvent(`${rx.url}/hang-once/mid`, '{"n":2}');
  await publishRunEvent(h.nc, e);
  await rx.waitFor("/hang-once/mid", 1);
  const killedAt = await sigkill(first);

  await spawnWebhookProcess(SHORT_ACK_WAIT_MS);
  const [d] = await h.waitForDeliveries(e.runId, settled, 20_000);
  expect(d.state).toBe("delivered");
  expect(d.attempts.map((a) => [a.attempt, a.statusCode, a.outcome])).toEqual([
    [1, 0, "retry"],
    [2, 200, "delivered"],
  ]);
  expect(d.attempts[0].error).toMatch(/interrupted/);
  const got = rx.to("/hang-once/mid");
  expect(got).toHaveLength(2);
  // Not before the first attempt's deadline had passed: it might still have been answered.
  expect(got[1].at).toBeGreaterThanOrEqual(got[0].at + TIMEOUT_MS + INTERRUPTED_GRACE_MS);
  expect(got[1].at).toBeGreaterThan(killedAt);
});
