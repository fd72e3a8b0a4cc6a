// The queue-depth counter behind SKIFF_MAX_QUEUED_RUNS (invocation/queue-depth.ts)
// against a real nats-server: it counts an app's messages in the work queue,
// adds this process's accepts between reads, and never loses an accept to a
// background read whose answer predates it.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { QueueDepths } from "../../services/invocation/queue-depth.js";
import { subjects } from "../../services/nats/layout.js";
import { startProvisionedNats } from "../helpers/nats-server.js";

let nats: Awaited<ReturnType<typeof startProvisionedNats>>;
const app = { project: "p", app: "a" };

beforeAll(async () => {
  nats = await startProvisionedNats();
});
afterAll(async () => {
  await nats?.stop();
});

const queue = async (n: number) => {
  const js = nats.nc.jetstream();
  for (let i = 0; i < n; i++) await js.publish(subjects.runQueue(app.project, app.app), new Uint8Array([i]));
};

describe("QueueDepths", () => {
  it("reads the app's queued messages, then adds its own accepts until the next read", async () => {
    const depths = new QueueDepths(await nats.nc.jetstreamManager(), 60_000);
    await queue(2);
    expect(await depths.count(app)).toBe(2);
    depths.accepted(app);
    expect(await depths.count(app)).toBe(3);
    expect(await depths.fresh(app)).toBe(2);
    expect(await depths.count({ project: "p", app: "other" })).toBe(0);
  });

  it("an accept made while a background read is in flight is not lost when the read lands", async () => {
    const depths = new QueueDepths(await nats.nc.jetstreamManager(), 20);
    const before = await depths.count(app);
    await new Promise((resolve) => setTimeout(resolve, 30));
    // This call starts a read in the background; the accept lands before its answer.
    expect(await depths.count(app)).toBe(before);
    depths.accepted(app);
    await new Promise((resolve) => setTimeout(resolve, 15));
    expect(await depths.count(app)).toBeGreaterThanOrEqual(before + 1);
  });
});
