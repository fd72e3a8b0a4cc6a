// The slot queue on its own: fake replicas (plain objects with the fields the
// queue reads) and a fake clock, no process.
import { describe, expect, it } from "vitest";
import { Cancelled, Overloaded } from "../../services/runs/errors.js";
import { SlotQueue, type SlotHolder, type SlotQueueOptions } from "../../services/runner/slot-queue.js";
import { FakeClock } from "../helpers/fake-clock.js";

interface FakeReplica extends SlotHolder {
  name: string;
  state: string;
  routable: boolean;
}

const replica = (name: string, more: Partial<FakeReplica> = {}): FakeReplica => ({
  name,
  state: "ready",
  routable: true,
  inFlight: 0,
  idleSince: 0,
  ...more,
});

function queue(
  replicas: FakeReplica[],
  o: Partial<SlotQueueOptions> = {},
  owner = "v1",
): {
  q: SlotQueue<FakeReplica, string>;
  clock: FakeClock;
  wanted: () => number;
  blocked: { why?: string; notReady?: string };
} {
  const clock = (o.clock as FakeClock | undefined) ?? new FakeClock();
  let wanted = 0;
  const blocked: { why?: string; notReady?: string } = {};
  const q = new SlotQueue<FakeReplica, string>(
    owner,
    { owner: "p/app", concurrency: 2, limit: 3, waitMs: 1000, clock, ...o },
    {
      replicas: () => replicas,
      wanted: () => void wanted++,
      blocked: () => blocked.why,
      notReady: () => blocked.notReady,
    },
  );
  return { q, clock, wanted: () => wanted, blocked };
}

describe("SlotQueue", () => {
  it("takes a free slot on a ready, routable replica, at most concurrency per replica", () => {
    const a = replica("a", { routable: false });
    const b = replica("b", { state: "starting" });
    const c = replica("c");
    const { q } = queue([a, b, c]);
    expect(q.take()?.name).toBe("c");
    expect(q.take()?.name).toBe("c");
    expect(q.take()).toBeUndefined();
    expect(c.inFlight).toBe(2);
  });

  it("a waiting request asks for replicas, and gets the first free slot in arrival order", async () => {
    const r = replica("r", { state: "starting" });
    const { q, wanted } = queue([r], { concurrency: 1 });
    const order: number[] = [];
    const first = q.wait(undefined).then((s) => (order.push(1), s));
    const second = q.wait(undefined).then((s) => (order.push(2), s));
    expect(wanted()).toBe(2);
    expect(q.length).toBe(2);
    r.state = "ready";
    q.dispatch(r);
    expect(await first).toEqual({ owner: "v1", replica: r });
    expect(q.length).toBe(1);
    q.release(r);
    expect((await second).replica).toBe(r);
    expect(order).toEqual([1, 2]);
    expect(r.inFlight).toBe(1);
  });

  it("a release marks the replica idle at the clock's time", async () => {
    const r = replica("r");
    const { q, clock } = queue([r]);
    q.take();
    await clock.advance(5000);
    q.release(r);
    expect(r.idleSince).toBe(clock.now());
    expect(r.inFlight).toBe(0);
  });

  it("Overloaded when the queue is full", async () => {
    const { q } = queue([], { limit: 2 });
    const waiting = [q.wait(undefined), q.wait(undefined)];
    for (const w of waiting) w.catch(() => undefined);
    expect(() => q.wait(undefined)).toThrow(Overloaded);
    expect(() => q.wait(undefined)).toThrow("app p/app has 2 requests waiting, the most it queues");
    q.rejectAll(new Error("done"));
  });

  it("Overloaded once the wait passes waitMs of the clock, naming what held a replica back", async () => {
    const { q, clock, blocked } = queue([], { waitMs: 700 });
    const plain = q.wait(undefined).catch((e: unknown) => e);
    await clock.advance(699);
    expect(q.length).toBe(1);
    blocked.why = "project p has 20 replicas";
    await clock.advance(1);
    const err = await plain;
    expect(err).toBeInstanceOf(Overloaded);
    expect((err as Error).message).toBe(
      "no replica of app p/app was free within 700 ms and no other could start: project p has 20 replicas",
    );
    expect((err as Overloaded).retryAfterSeconds).toBe(1);
    expect(q.length).toBe(0);
    expect(clock.timers).toBe(0);

    // No replica ready: what the others are doing comes first.
    blocked.notReady = "none is ready, 1 is still starting (ready once its health check answers 200)";
    const starting = q.wait(undefined).catch((e: unknown) => e);
    await clock.advance(700);
    expect(((await starting) as Error).message).toBe(
      "no replica of app p/app was free within 700 ms: none is ready, 1 is still starting (ready once its health check answers 200); and no other could start: project p has 20 replicas",
    );
  });

  it("Cancelled when the caller aborts while waiting; the request leaves the queue and its timer goes", async () => {
    const r = replica("r", { state: "starting" });
    const { q, clock } = queue([r]);
    const ac = new AbortController();
    const waiting = q.wait(ac.signal).catch((e: unknown) => e);
    ac.abort();
    expect(await waiting).toBeInstanceOf(Cancelled);
    expect(q.length).toBe(0);
    expect(clock.timers).toBe(0);
    r.state = "ready";
    q.dispatch(r);
    expect(r.inFlight).toBe(0);
  });

  it("rejectAll fails every waiting request and stops their timers", async () => {
    const { q, clock } = queue([]);
    const waiting = [q.wait(undefined), q.wait(undefined)].map((p) => p.catch((e: unknown) => e));
    q.rejectAll(new Error("no replica can start"));
    for (const w of waiting) expect(await w).toEqual(new Error("no replica can start"));
    expect(clock.timers).toBe(0);
  });

  it("moveTo hands waiting requests, in order, to the newer version, which serves them and asks for replicas", async () => {
    const clock = new FakeClock();
    const fresh = replica("new", { state: "starting" });
    const old = queue([], { clock });
    const next = queue([fresh], { clock, concurrency: 1 }, "v2");
    const first = old.q.wait(undefined);
    const second = old.q.wait(undefined);
    old.q.moveTo(next.q);
    expect(old.q.length).toBe(0);
    expect(next.q.length).toBe(2);
    expect(next.wanted()).toBe(1);
    fresh.state = "ready";
    next.q.dispatch(fresh);
    expect(await first).toEqual({ owner: "v2", replica: fresh });
    // The second keeps the time it had left: it fails at the first wait's deadline.
    const err = second.catch((e: unknown) => e);
    await clock.advance(1000);
    expect(await err).toBeInstanceOf(Overloaded);
  });
});
