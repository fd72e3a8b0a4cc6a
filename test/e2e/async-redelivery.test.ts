// Async runs when runner processes die: a run whose runner is killed with
// SIGKILL is delivered again to another runner (attempts counted), and one
// whose runner dies on every attempt ends in failure, never stuck in
// running. The gateway here runs no runner, so sync runs go over NATS.
import type { ChildProcess } from "node:child_process";
import { mkdtemp, readdir, readlink, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { spawnRunnerProcess, startTestSkiff, type TestSkiff } from "../helpers/skiff.js";
import { cortexApp, deploy, P, post, UUID_V7 } from "../helpers/run-apps.js";

const ACK_WAIT_MS = 1500;
let t: TestSkiff;
let tmp: string;
const runners = new Set<{ child: ChildProcess; dataDir: string }>();
const v4 = (rest: string) => `${t.url}/v4/${P}/slow/${rest}`;
const getRun = async (runId: string) => (await t.management().getRun({ projectId: P, appName: "slow", runId })).run!;

async function startRunner(): Promise<{ child: ChildProcess; dataDir: string }> {
  const dataDir = await mkdtemp(path.join(tmp, "runner-"));
  const child = spawnRunnerProcess(t.nats.url, dataDir, {
    SKIFF_RUN_ACK_WAIT_MS: String(ACK_WAIT_MS),
    SKIFF_RESULT_TTL: "0",
    SKIFF_LOG_LEVEL: "error",
  });
  const r = { child, dataDir };
  runners.add(r);
  return r;
}

/** As a machine would die: the runner and its replicas, at once. */
async function kill(r: { child: ChildProcess; dataDir: string }): Promise<void> {
  const exited = new Promise((res) => (r.child.exitCode !== null ? res(undefined) : r.child.once("exit", res)));
  r.child.kill("SIGKILL");
  await exited;
  for (const pid of await readdir("/proc").catch(() => [])) {
    if (!/^\d+$/.test(pid)) continue;
    const cwd = await readlink(`/proc/${pid}/cwd`).catch(() => "");
    if (cwd.startsWith(r.dataDir)) {
      try {
        process.kill(Number(pid), "SIGKILL");
      } catch {
        // already gone
      }
    }
  }
  runners.delete(r);
}

const runningOn = (runId: string, attempt: number) =>
  vi.waitUntil(
    async () => {
      const r = await getRun(runId);
      return r.status === "running" && r.attempts === attempt ? r : undefined;
    },
    { timeout: 90_000, interval: 250 },
  );
/** The run once it has `status`. */
const reaches = (runId: string, status: string, timeout: number) =>
  vi.waitUntil(
    async () => {
      const r = await getRun(runId);
      return r.status === status ? r : undefined;
    },
    { timeout, interval: 250 },
  );

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-redeliver-"));
  t = await startTestSkiff({
    env: { SKIFF_ROLES: "invocation,management", SKIFF_RESULT_TTL: "0", SKIFF_RUN_ACK_WAIT_MS: String(ACK_WAIT_MS) },
  });
  await deploy(
    tmp,
    t.management(),
    cortexApp("slow", { max_replicas: 2, replica_concurrency: 2, response_grace_period: 60 }),
  );
}, 60_000);
afterAll(async () => {
  for (const r of [...runners]) await kill(r);
  await t?.close();
  await rm(tmp, { recursive: true, force: true });
});

describe("async - runners that die", () => {
  it("no runner: a sync call is 503, an async one waits in the queue and runs once a runner comes; results not kept with SKIFF_RESULT_TTL=0 (the runner's setting)", async () => {
    const sync = await post(v4("add"), t.devToken, '{"a":1,"b":1}');
    expect(sync.status).toBe(503);
    expect(sync.json).toMatchObject({ code: "unavailable" });
    expect(sync.headers.get("x-request-id")).toMatch(UUID_V7);
    const queued = await post(`${v4("add")}?async=true`, t.devToken, '{"a":2,"b":2}');
    expect(queued.status).toBe(202);
    await startRunner();
    const done = await reaches(queued.json.run_id, "success", 30_000);
    expect(done).toMatchObject({ attempts: 1, statusCode: 200 });
    expect(done.result).toBeUndefined();
    expect(done.rawResult).toBeUndefined();
    const again = await vi.waitUntil(
      async () => {
        const r = await post(v4("add"), t.devToken, '{"a":1,"b":1}');
        return r.status === 200 ? r : undefined;
      },
      { timeout: 60_000, interval: 250 },
    );
    expect(again.json).toMatchObject({ run_id: again.headers.get("x-request-id"), result: 2 });
  });

  it("SIGKILL mid-run: another runner runs it again and it succeeds, attempt 2", async () => {
    const first = [...runners][0];
    // Long enough that the first attempt is still running when its runner is killed, however loaded the machine.
    const res = await post(`${v4("sleep")}?async=true`, t.devToken, '{"ms":10000}');
    const runId = res.json.run_id as string;
    const before = await runningOn(runId, 1);
    await kill(first);
    await startRunner();
    const done = await reaches(runId, "success", 45_000);
    expect(done).toMatchObject({ attempts: 2, statusCode: 200 });
    expect(before.attempts).toBe(1);
  }, 60_000);

  it("a run whose runner dies on every attempt ends in failure (runner_lost) after 3 attempts", async () => {
    const res = await post(`${v4("sleep")}?async=true`, t.devToken, '{"ms":60000}');
    const runId = res.json.run_id as string;
    for (let attempt = 1; attempt <= 3; attempt++) {
      await runningOn(runId, attempt);
      await kill([...runners][0]);
      await startRunner();
    }
    const failed = await reaches(runId, "failure", 60_000);
    expect(failed).toMatchObject({ attempts: 3, error: { type: "runner_lost" } });
  }, 400_000);
});
