// Scaling, limits and the life of replicas, with real processes of the
// "behave" fixture app (a Custom app that misbehaves on request). Where a
// test is about the pool's own timers (cooldown, the queue's wait, the run's
// bound), the Runner runs on a FakeClock the test moves, and the test
// asserts on what happened (replica changes, errors), not on elapsed time.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { parseAppConfig } from "../../services/apps/app-config.js";
import { silentLogger } from "../../services/config/logger.js";
import { Cancelled, Overloaded, ReplicaCrashed, RunTimeout } from "../../services/runs/errors.js";
import { freePort } from "../../services/runner/ports.js";
import { Runner, type RunnerOptions } from "../../services/runner/runner.js";
import type { InvokeRequest, InvokeResponse } from "../../services/runs/invoke.js";
import type { ReplicaChange } from "../../services/runner/types.js";
import { skiffToml, type CustomRuntime, type Scaling } from "../helpers/apps.js";
import { FakeClock } from "../helpers/fake-clock.js";
import { TEST_ROOT } from "../helpers/paths.js";
import { alive } from "../helpers/host-processes.js";

const BEHAVE = path.resolve(TEST_ROOT, "fixtures/apps/behave");
let tmp: string;
let runner: Runner | undefined;
const changes: ReplicaChange[] = [];

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-scaling-"));
});
afterEach(async () => {
  await runner?.close();
  runner = undefined;
  changes.length = 0;
});
afterAll(() => rm(tmp, { recursive: true, force: true }));

interface More {
  runtime?: Partial<CustomRuntime>;
  env?: Record<string, string>;
}

function toml(scaling: Scaling, { runtime, env }: More = {}): string {
  return skiffToml({
    name: "behave",
    runtime: { kind: "custom", command: ["node", "server.mjs"], ...runtime },
    env,
    scaling,
  });
}

async function deploy(scaling: Scaling, opts: More & { runner?: Partial<RunnerOptions> } = {}): Promise<Runner> {
  runner = new Runner({
    workDir: path.join(tmp, "work"),
    logger: silentLogger,
    onReplicaChange: (c) => changes.push(c),
    startTimeoutMs: 10_000,
    // A replica restarts after three failed checks of 250 ms: one slow answer on a loaded machine (the
    // check's timeout is its interval) is not a failure the tests that are not about health could see.
    healthIntervalMs: 250,
    unhealthyAfter: 3,
    killGraceMs: 500,
    ...opts.runner,
  });
  await runner.deploy({
    projectId: "p",
    appName: "behave",
    version: 1,
    dir: BEHAVE,
    config: parseAppConfig(toml(scaling, opts)),
  });
  return runner;
}

let seq = 0;
function get(p: string, query = "", more: Partial<InvokeRequest> = {}): InvokeRequest {
  return { runId: `run-${++seq}`, method: "GET", path: p, query, headers: {}, body: new Uint8Array(), ...more };
}

const call = (r: Runner, p: string, query = "", more: Partial<InvokeRequest> = {}) =>
  r.invoke("p", "behave", get(p, query, more));
/**
 * The host pid of the replica that answered: in a sandbox the app's own pid is its namespace's (the same in
 * every replica), so the runner's record of the replica is the one to compare and to probe.
 */
const pidOf = (res: InvokeResponse) =>
  changes.find((c) => c.replica.replicaId === res.replicaId && c.replica.pid !== undefined)?.replica.pid ?? -1;
/** Most replicas starting or ready at once, from the change events. */
function peakLive(): number {
  const live = new Set<string>();
  let peak = 0;
  for (const c of changes) {
    if (c.replica.state === "starting" || c.replica.state === "ready") live.add(c.replica.replicaId);
    else live.delete(c.replica.replicaId);
    peak = Math.max(peak, live.size);
  }
  return peak;
}

describe("runner - scaling and replica life", () => {
  it("cold start: no replica until the first request, then one", async () => {
    const r = await deploy({ cooldown: 30 });
    expect(r.replicas("p", "behave")).toEqual([]);
    const res = await call(r, "/sleep", "ms=0");
    expect(res.status).toBe(200);
    expect(r.replicas("p", "behave")).toMatchObject([
      { replicaId: res.replicaId, state: "ready", inFlight: 0, deploymentVersion: 1 },
    ]);
    expect(pidOf(await call(r, "/sleep", "ms=0"))).toBe(pidOf(res));
  });

  it("min_replicas are warm at deploy and stay through the cooldown", async () => {
    const clock = new FakeClock();
    const r = await deploy({ min_replicas: 2, max_replicas: 3, cooldown: 1 }, { runner: { clock } });
    expect(r.replicas("p", "behave").map((x) => x.state)).toEqual(["ready", "ready"]);
    await clock.advance(5_000); // five cooldowns
    expect(r.replicas("p", "behave").map((x) => x.state)).toEqual(["ready", "ready"]);
    expect(changes.filter((c) => c.replica.state === "draining" || c.replica.state === "stopped")).toEqual([]);
  });

  it("scales up to max_replicas under concurrent load, and not beyond", async () => {
    const r = await deploy({ max_replicas: 3, replica_concurrency: 1 });
    const results = await Promise.all(Array.from({ length: 9 }, () => call(r, "/sleep", "ms=300")));
    expect(results.every((x) => x.status === 200)).toBe(true);
    expect(new Set(results.map(pidOf)).size).toBe(3);
    expect(peakLive()).toBe(3);
  });

  it("at most replica_concurrency requests at once on a replica; the rest wait", async () => {
    const r = await deploy({ max_replicas: 1, replica_concurrency: 2 });
    await call(r, "/sleep", "ms=0");
    let peak = 0;
    const watch = setInterval(() => (peak = Math.max(peak, ...r.replicas("p", "behave").map((x) => x.inFlight))), 10);
    const results = await Promise.all(Array.from({ length: 4 }, () => call(r, "/sleep", "ms=300")));
    clearInterval(watch);
    // All four on the one replica, never more than two at once: two of them waited for a slot.
    expect(new Set(results.map(pidOf)).size).toBe(1);
    expect(peak).toBe(2);
  });

  it("bounded queue: a request past the queue limit, or waiting past queueWaitMs, is Overloaded", async () => {
    const clock = new FakeClock();
    const r = await deploy({ max_replicas: 1 }, { runner: { queueLimit: 2, queueWaitMs: 700, clock } });
    await call(r, "/sleep", "ms=0");
    const busy = call(r, "/sleep", "ms=1000");
    const queued = [call(r, "/sleep", "ms=0"), call(r, "/sleep", "ms=0")].map((q) => q.catch((e: unknown) => e));
    const full = await call(r, "/sleep", "ms=0").catch((e: unknown) => e);
    expect(full).toBeInstanceOf(Overloaded);
    expect((full as Overloaded).retryAfterSeconds).toBeGreaterThan(0);
    // Both queued requests wait past 700 ms of the clock, while the replica is still busy.
    await clock.advance(700);
    for (const q of queued) expect(String(await q)).toMatch(/no replica of app p\/behave was free within 700 ms/);
    expect((await busy).status).toBe(200);
    expect((await call(r, "/sleep", "ms=0")).status).toBe(200);
  });

  it("a replica idle for cooldown stops: scale to zero", async () => {
    const clock = new FakeClock();
    const r = await deploy({ cooldown: 1 }, { runner: { clock } });
    const res = await call(r, "/sleep", "ms=0");
    const pid = pidOf(res);
    await clock.advance(999);
    expect(r.replicas("p", "behave")).toMatchObject([{ state: "ready" }]);
    await clock.advance(1);
    await expect
      .poll(() => changes.some((c) => c.replica.replicaId === res.replicaId && c.replica.state === "stopped"))
      .toBe(true);
    expect(r.replicas("p", "behave")).toEqual([]);
    expect(alive(pid)).toBe(false);
    const next = await call(r, "/sleep", "ms=0");
    expect(pidOf(next)).not.toBe(pid);
  });

  it("a run past response_grace_period fails with RunTimeout; its replica is replaced", async () => {
    const clock = new FakeClock();
    const r = await deploy({ response_grace_period: 1 }, { env: { IGNORE_SIGTERM: "1" }, runner: { clock } });
    const pid = pidOf(await call(r, "/sleep", "ms=0"));
    // Unbounded, this 10 s run would answer 200; the bound (1 s of the clock) makes it a RunTimeout.
    const run = call(r, "/sleep", "ms=10000").catch((e: unknown) => e);
    await expect.poll(() => r.replicas("p", "behave")[0]?.inFlight).toBe(1);
    await clock.advance(1000);
    const err = await run;
    expect(err).toBeInstanceOf(RunTimeout);
    // The replica ignores SIGTERM: it is SIGKILLed after killGraceMs.
    await expect.poll(() => alive(pid), { timeout: 3000, interval: 50 }).toBe(false);
    const next = await call(r, "/sleep", "ms=0");
    expect(next.status).toBe(200);
    expect(pidOf(next)).not.toBe(pid);
  });

  it("graceful stop: SIGTERM lets in-flight work finish", async () => {
    const r = await deploy({ response_grace_period: 5 });
    const pid = pidOf(await call(r, "/sleep", "ms=0"));
    const order: string[] = [];
    const inFlight = call(r, "/sleep", "ms=600").then((x) => (order.push("answered"), x));
    await expect.poll(() => r.replicas("p", "behave")[0]?.inFlight).toBe(1);
    await r.remove("p", "behave").then(() => order.push("removed"));
    // The stop waited for the run on the replica to be answered.
    expect(order).toEqual(["answered", "removed"]);
    expect((await inFlight).status).toBe(200);
    expect(alive(pid)).toBe(false);
    await expect(call(r, "/sleep", "ms=0")).rejects.toMatchObject({ name: "AppNotFound" });
  });

  it("graceful stop: a replica that ignores SIGTERM is SIGKILLed after response_grace_period, failing its run", async () => {
    const r = await deploy({ response_grace_period: 1 }, { env: { IGNORE_SIGTERM: "1" } });
    const pid = pidOf(await call(r, "/sleep", "ms=0"));
    const inFlight = call(r, "/sleep", "ms=5000").catch((e: unknown) => e);
    await new Promise((res) => setTimeout(res, 100));
    const started = Date.now();
    await r.remove("p", "behave");
    const took = Date.now() - started;
    expect(took).toBeGreaterThanOrEqual(900); // it had its grace period first
    expect(alive(pid)).toBe(false);
    // Started before the stop, the run reaches its own bound first.
    expect(await inFlight).toBeInstanceOf(RunTimeout);
  });

  it("crash: in-flight requests fail with ReplicaCrashed; the next request gets a new replica", async () => {
    const r = await deploy({ replica_concurrency: 2, max_replicas: 1 });
    const pid = pidOf(await call(r, "/sleep", "ms=0"));
    const other = call(r, "/sleep", "ms=2000").catch((e: unknown) => e);
    await new Promise((res) => setTimeout(res, 50));
    const crash = await call(r, "/crash").catch((e: unknown) => e);
    expect(crash).toBeInstanceOf(ReplicaCrashed);
    // How it ended, for whoever reads the error: /crash exits with 3.
    expect((crash as Error).message).toContain("(it ended with exit code 3)");
    expect(await other).toBeInstanceOf(ReplicaCrashed);
    const next = await call(r, "/sleep", "ms=0");
    expect(next.status).toBe(200);
    expect(pidOf(next)).not.toBe(pid);
  });

  it("a crashed replica under min_replicas is restarted on its own", async () => {
    const r = await deploy({ min_replicas: 1 });
    const [first] = r.replicas("p", "behave");
    await call(r, "/crash").catch(() => undefined);
    await expect
      .poll(
        () => r.replicas("p", "behave").filter((x) => x.state === "ready" && x.replicaId !== first.replicaId).length,
        { timeout: 3000 },
      )
      .toBe(1);
  });

  it("a failing healthcheck restarts the replica", async () => {
    const r = await deploy({ max_replicas: 1 });
    const pid = pidOf(await call(r, "/sick"));
    await expect.poll(() => alive(pid), { timeout: 3000, interval: 50 }).toBe(false);
    expect(pidOf(await call(r, "/sleep", "ms=0"))).not.toBe(pid);
  });

  it("a failing readycheck takes the replica out of routing until it passes again", async () => {
    const r = await deploy({ max_replicas: 1 }, { runtime: { readycheck: "/ready" } });
    const pid = pidOf(await call(r, "/unready", "ms=800"));
    await expect.poll(() => r.replicas("p", "behave")[0]?.routable, { timeout: 2000, interval: 20 }).toBe(false);
    const res = await call(r, "/sleep", "ms=0");
    // Answered only once the replica was back in routing: that change came before the answer.
    const out = changes.findIndex((c) => c.replica.routable === false);
    expect(changes.slice(out).some((c) => c.replica.routable === true)).toBe(true);
    expect(pidOf(res)).toBe(pid);
    expect(r.replicas("p", "behave")[0]).toMatchObject({ routable: true, state: "ready" });
  });

  it("redeploy: requests in flight and arriving during deploy() all succeed; the new version serves after", async () => {
    const r = await deploy(
      { min_replicas: 1, max_replicas: 2, replica_concurrency: 4, response_grace_period: 5 },
      {
        env: { VERSION: "1" },
      },
    );
    const version = (res: InvokeResponse) =>
      (JSON.parse(Buffer.from(res.body).toString()) as { env: { VERSION: string } }).env.VERSION;
    const inFlight = Array.from({ length: 4 }, () => call(r, "/sleep", "ms=400"));
    let stop = false;
    const stream = (async () => {
      const out: InvokeResponse[] = [];
      while (!stop) out.push(await call(r, "/env"));
      return out;
    })();
    const config = parseAppConfig(
      toml(
        { min_replicas: 1, max_replicas: 2, replica_concurrency: 4, response_grace_period: 5 },
        { env: { VERSION: "2" } },
      ),
    );
    await r.deploy({ projectId: "p", appName: "behave", version: 2, dir: BEHAVE, config });
    expect(r.version("p", "behave")).toBe(2);
    await new Promise((res) => setTimeout(res, 100));
    stop = true;
    const streamed = await stream;
    expect((await Promise.all(inFlight)).map((x) => x.status)).toEqual([200, 200, 200, 200]);
    expect(streamed.every((x) => x.status === 200)).toBe(true);
    // (The first of them may already go to version 2: a request queued behind the busy old
    // replica is handed to the new version as soon as it is ready.)
    expect(version(streamed[streamed.length - 1])).toBe("2");
    expect(version(await call(r, "/env"))).toBe("2");
    await expect
      .poll(() => r.replicas("p", "behave").every((x) => x.deploymentVersion === 2), { timeout: 3000 })
      .toBe(true);
  });

  it("redeploy: requests queued for the old version are served by the new one at once", async () => {
    const r = await deploy({ max_replicas: 1, response_grace_period: 30 }, { env: { VERSION: "1" } });
    await call(r, "/sleep", "ms=0");
    const order: string[] = [];
    // Longer than the new version takes to start on a loaded machine, within the old one's grace period.
    const busy = call(r, "/sleep", "ms=6000").then((x) => (order.push("busy"), x));
    const queued = call(r, "/env").then((x) => (order.push("queued"), x));
    const config = parseAppConfig(toml({ max_replicas: 1, response_grace_period: 30 }, { env: { VERSION: "2" } }));
    await r.deploy({ projectId: "p", appName: "behave", version: 2, dir: BEHAVE, config });
    const res = await queued;
    expect((JSON.parse(Buffer.from(res.body).toString()) as { env: { VERSION: string } }).env.VERSION).toBe("2");
    expect((await busy).status).toBe(200);
    expect(order).toEqual(["queued", "busy"]); // served by the new version, not after the old run
  });

  it("Cancelled: an aborted run fails at once and its replica stays; a cancelled queued request never runs", async () => {
    const r = await deploy({ max_replicas: 1 });
    const pid = pidOf(await call(r, "/sleep", "ms=0"));
    const ac = new AbortController();
    const running = call(r, "/sleep", "ms=3000", { signal: ac.signal }).catch((e: unknown) => e);
    const queuedAc = new AbortController();
    const queued = call(r, "/sleep", "ms=0", { signal: queuedAc.signal }).catch((e: unknown) => e);
    await new Promise((res) => setTimeout(res, 100));
    queuedAc.abort();
    expect(await queued).toBeInstanceOf(Cancelled);
    ac.abort();
    // Left alone, the 3 s run would answer 200.
    expect(await running).toBeInstanceOf(Cancelled);
    const next = await call(r, "/sleep", "ms=0");
    expect(pidOf(next)).toBe(pid);
    const pre = new AbortController();
    pre.abort();
    await expect(call(r, "/sleep", "ms=0", { signal: pre.signal })).rejects.toBeInstanceOf(Cancelled);
  });

  it("a fixed port: one replica on this machine whatever max_replicas says", async () => {
    const port = await freePort();
    // The app ignores PORT here: it is told the fixed port through [env].
    const r = await deploy({ max_replicas: 3 }, { runtime: { port }, env: { FIXED: String(port) } });
    const results = await Promise.all(Array.from({ length: 3 }, () => call(r, "/sleep", "ms=100")));
    expect(new Set(results.map(pidOf)).size).toBe(1);
    expect(peakLive()).toBe(1);
    const config = parseAppConfig(toml({ max_replicas: 3 }, { runtime: { port }, env: { FIXED: String(port) } }));
    await r.deploy({ projectId: "p", appName: "behave", version: 2, dir: BEHAVE, config });
    expect(pidOf(await call(r, "/sleep", "ms=0"))).not.toBe(pidOf(results[0]));
  });
});
