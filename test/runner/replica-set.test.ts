// The replicas' lifecycle on its own: fake replicas (no process) and a fake
// clock, so cooldown, crash backoff and health checks are asserted as events
// after the clock moves, without waiting for them.
import { describe, expect, it } from "vitest";
import { parseAppConfig } from "../../services/apps/app-config.js";
import { silentLogger } from "../../services/config/logger.js";
import { ReplicaCrashed, StartFailed } from "../../services/runs/errors.js";
import { backoffMs, ReplicaSet, type ManagedReplica, type ReplicaFactory } from "../../services/runner/replica-set.js";
import type { ReplicaState } from "../../services/runner/types.js";
import { skiffToml, type Scaling } from "../helpers/apps.js";
import { FakeClock } from "../helpers/fake-clock.js";

type OnExit = (r: FakeReplica, code: number | null, signal: NodeJS.Signals | null) => void;

/** A replica without a process: it starts, answers probes and exits as the test says. */
class FakeReplica implements ManagedReplica {
  state: ReplicaState = "starting";
  routable = true;
  inFlight = 0;
  idleSince = 0;
  readyAt: number | undefined;
  stopping = false;
  stopReason: Error | undefined;
  probing = false;
  healthFailures = 0;
  limitReason: string | undefined;
  releasePort: (() => void) | undefined;
  /** What /health and the readycheck answer. */
  health = 200;
  ready = 200;
  stoppedWith: number | undefined;
  private exited = false;
  private markExited!: () => void;
  private readonly exit = new Promise<void>((resolve) => (this.markExited = resolve));

  constructor(
    readonly id: string,
    private readonly onExit: OnExit,
  ) {}

  get alive(): boolean {
    return !this.exited;
  }

  start(): Promise<void> {
    this.state = "ready";
    this.readyAt = 1;
    return Promise.resolve();
  }

  /** The process ends (asked or not). */
  end(code: number | null = 0): void {
    if (this.exited) return;
    this.exited = true;
    this.markExited();
    this.onExit(this, code, null);
  }

  stop(graceMs: number): Promise<void> {
    this.stopping = true;
    this.stoppedWith = graceMs;
    if (this.state !== "stopped") this.state = "draining";
    this.end();
    return this.exit;
  }

  kill(): void {
    this.stopping = true;
    this.end(null);
  }

  whenExited(): Promise<void> {
    return this.exit;
  }

  probe(path: string): Promise<number> {
    return Promise.resolve(path === "/health" ? this.health : this.ready);
  }
}

class FakeReplicas implements ReplicaFactory<FakeReplica> {
  made: FakeReplica[] = [];
  prepared: FakeReplica[] = [];
  /** Set: the next starts fail with it. */
  failStart: Error | undefined;

  create(id: string, onExit: OnExit): FakeReplica {
    const r = new FakeReplica(id, onExit);
    this.made.push(r);
    return r;
  }

  prepare(r: FakeReplica): Promise<void> {
    this.prepared.push(r);
    return Promise.resolve();
  }

  start(r: FakeReplica): Promise<void> {
    return this.failStart ? Promise.reject(this.failStart) : r.start();
  }
}

interface Setup {
  scaling?: Scaling;
  readycheck?: string;
  waiting?: number;
  refusal?: string;
}

function setUp({ scaling = {}, readycheck, waiting = 0, refusal }: Setup = {}) {
  const clock = new FakeClock();
  const factory = new FakeReplicas();
  const demand = { waiting, ready: [] as FakeReplica[], noneComing: [] as Error[] };
  const changes: [string, ReplicaState][] = [];
  const config = parseAppConfig(
    skiffToml({ name: "app", runtime: { kind: "custom", command: ["app"], readycheck }, scaling }),
  );
  const set = new ReplicaSet<FakeReplica>(
    {
      deployment: { projectId: "p", appName: "app", version: 1, dir: "/nowhere", config },
      cap: config.scaling.maxReplicas,
      graceMs: config.scaling.responseGracePeriod * 1000,
      killGraceMs: 500,
      healthIntervalMs: 1000,
      unhealthyAfter: 2,
      logger: silentLogger,
      clock,
      factory,
      refusal: () => refusal,
      changed: (r) => changes.push([r.id, r.state]),
    },
    {
      waiting: () => demand.waiting,
      concurrency: config.scaling.replicaConcurrency,
      ready: (r) => demand.ready.push(r),
      noneComing: (err) => demand.noneComing.push(err),
    },
  );
  return { set, clock, factory, demand, changes };
}

const states = (set: ReplicaSet<FakeReplica>) => set.replicas.map((r) => r.state);

describe("ReplicaSet", () => {
  it("starts ceil(waiting / replica_concurrency) replicas, up to max_replicas, and hands each over when ready", async () => {
    const { set, clock, demand } = setUp({ scaling: { max_replicas: 3, replica_concurrency: 2 }, waiting: 5 });
    set.scale();
    await clock.advance(0);
    expect(states(set)).toEqual(["ready", "ready", "ready"]);
    expect(demand.ready).toEqual(set.replicas);
    demand.waiting = 9;
    set.scale();
    expect(set.liveCount()).toBe(3);
  });

  it("says, for a request that waited in vain, what the replicas that are not ready are doing", async () => {
    const { set, clock, factory } = setUp({ waiting: 1 });
    expect(set.notReady()).toBeUndefined();
    // A start whose health check has not answered yet.
    let answer!: () => void;
    factory.start = (r) => new Promise<void>((resolve) => (answer = () => void r.start().then(resolve)));
    set.scale();
    await clock.advance(0);
    expect(set.notReady()).toBe("none is ready, 1 is still starting (ready once its health check answers 200)");
    answer();
    await clock.advance(0);
    // A ready one: the requests waited for a busy replica, nothing to add.
    expect(set.notReady()).toBeUndefined();

    const other = setUp({ waiting: 1 });
    other.factory.failStart = new StartFailed(
      "/health on port 8000 (the app's port) did not answer 200 within 60000 ms",
    );
    other.set.scale();
    await other.clock.advance(0);
    expect(other.set.notReady()).toBe(
      "the last start failed: /health on port 8000 (the app's port) did not answer 200 within 60000 ms",
    );
  });

  it("a replica idle for cooldown stops once the clock passes it, down to min_replicas", async () => {
    const { set, clock, changes } = setUp({
      scaling: { min_replicas: 1, max_replicas: 3, cooldown: 30, response_grace_period: 5 },
    });
    await set.warm(3);
    const [a, b, c] = set.replicas;
    b.inFlight = 1; // busy: not idle
    await clock.advance(29_000);
    expect(states(set)).toEqual(["ready", "ready", "ready"]);
    await clock.advance(1_000);
    // The idle ones (a, c) stop, gracefully (response_grace_period); b, busy, stays, and is min_replicas.
    expect(a.stoppedWith).toBe(5_000);
    expect(c.stoppedWith).toBe(5_000);
    expect(set.replicas).toEqual([b]);
    expect(changes).toContainEqual([a.id, "stopped"]);
    b.inFlight = 0;
    b.idleSince = clock.now();
    await clock.advance(60_000);
    expect(set.replicas).toEqual([b]); // min_replicas stays
  });

  it("min_replicas: a replica that exits unasked is a crash and is replaced after the backoff, in clock time", async () => {
    const { set, clock, factory } = setUp({ scaling: { min_replicas: 1 } });
    await set.warm(1);
    const [first] = set.replicas;
    first.end(3);
    expect(set.replicas).toHaveLength(1);
    const second = set.replicas[0];
    expect(second).not.toBe(first);
    expect(second.state).toBe("starting");
    expect(factory.prepared).not.toContain(second); // waiting out backoffMs(1)
    await clock.advance(backoffMs(1) - 1);
    expect(factory.prepared).not.toContain(second);
    await clock.advance(1);
    expect(second.state).toBe("ready");
    // A second crash in a row waits twice as long; an answered request resets it.
    second.end(3);
    const third = set.replicas[0];
    await clock.advance(backoffMs(1));
    expect(third.state).toBe("starting");
    await clock.advance(backoffMs(2) - backoffMs(1));
    expect(third.state).toBe("ready");
    set.answered();
    third.end(3);
    await clock.advance(backoffMs(1));
    expect(set.replicas[0].state).toBe("ready");
  });

  it("a start that fails with no replica live fails the waiting requests with StartFailed", async () => {
    const { set, clock, factory, demand } = setUp({ waiting: 1 });
    factory.failStart = new Error("exec format error");
    set.scale();
    await clock.advance(0);
    expect(set.replicas).toEqual([]);
    expect(demand.noneComing).toHaveLength(1);
    expect(demand.noneComing[0]).toBeInstanceOf(StartFailed);
    expect(demand.noneComing[0].message).toBe("replica of app p/app failed to start: exec format error");
    expect(factory.made[0].alive).toBe(false); // killed
  });

  it("warm() rejects with the project's refusal, and scale() keeps it for the waiting requests' error", async () => {
    const { set } = setUp({ waiting: 1, refusal: "project p has 20 replicas on this runner" });
    await expect(set.warm(1)).rejects.toThrow("a replica of app p/app cannot start: project p has 20 replicas");
    set.scale();
    expect(set.blocked()).toBe("project p has 20 replicas on this runner");
    expect(set.replicas).toEqual([]);
  });

  it("failed healthchecks, unhealthyAfter in a row, replace the replica; the clock drives the checks", async () => {
    const { set, clock } = setUp({ scaling: { min_replicas: 1 } });
    await set.warm(1);
    const [r] = set.replicas;
    r.health = 500;
    await clock.advance(1000);
    expect(r.healthFailures).toBe(1);
    expect(r.stopping).toBe(false);
    await clock.advance(1000);
    expect(r.stopping).toBe(true);
    expect(r.stoppedWith).toBe(500); // killGraceMs: stopped as broken
    expect(r.stopReason).toBeInstanceOf(ReplicaCrashed);
    expect(r.stopReason?.message).toBe(`replica ${r.id} failed its healthcheck /health and was restarted`);
    await clock.advance(0);
    expect(set.replicas.map((x) => x.state)).toEqual(["ready"]);
    expect(set.replicas[0]).not.toBe(r);
  });

  it("a failing readycheck takes the replica out of routing, and back when it passes", async () => {
    const { set, clock, demand } = setUp({ readycheck: "/ready", scaling: { min_replicas: 1 } });
    await set.warm(1);
    const [r] = set.replicas;
    demand.ready.length = 0;
    r.ready = 503;
    await clock.advance(1000);
    expect(r.routable).toBe(false);
    r.ready = 200;
    await clock.advance(1000);
    expect(r.routable).toBe(true);
    expect(demand.ready).toEqual([r]);
  });

  it("quarantine: out of routing at once, replaced when still running a second of clock time later", async () => {
    const { set, clock } = setUp({ scaling: { min_replicas: 1 } });
    await set.warm(1);
    const [r] = set.replicas;
    set.quarantine(r);
    expect(r.state).toBe("draining");
    await clock.advance(999);
    expect(r.stopping).toBe(false);
    await clock.advance(1);
    expect(r.stopReason?.message).toBe(`replica ${r.id} stopped answering`);
  });

  it("shutDown stops every replica and the timers", async () => {
    const { set, clock } = setUp({ scaling: { min_replicas: 2 } });
    await set.warm(2);
    const replicas = [...set.replicas];
    await set.shutDown();
    expect(replicas.every((r) => !r.alive)).toBe(true);
    expect(clock.timers).toBe(0);
    set.scale();
    expect(set.replicas).toEqual([]);
  });
});
