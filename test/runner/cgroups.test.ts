// A memory and pids cgroup per sandbox, where the host gives skiff cgroups
// (services/runner/cgroups.ts): the limits then hold for a replica's
// processes together, where the rlimits count per process. Real sandboxes,
// real cgroups; skipped, with the reason, on a host that has none for skiff.
import { existsSync } from "node:fs";
import { cp, mkdtemp, readFile, rm, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parseAppConfig } from "../../services/apps/app-config.js";
import { silentLogger } from "../../services/config/logger.js";
import { ReplicaCrashed } from "../../services/runs/errors.js";
import { Runner } from "../../services/runner/runner.js";
import { DEFAULT_SANDBOX_LIMITS } from "../../services/runner/sandbox.js";
import { SandboxHost } from "../../services/runner/sandbox-host.js";
import { skiffToml } from "../helpers/apps.js";
import { machineCan } from "../helpers/machine.js";
import { TEST_ROOT } from "../helpers/paths.js";

const ROOT = path.resolve(TEST_ROOT, "..");
const host = new SandboxHost();
const found = host.enableCgroups();
const usable = machineCan("sandbox-cgroups", found === true ? undefined : `no cgroups for skiff (${found})`);
const MEMORY_MB = 256;
const PIDS = 64;

let tmp: string;
let runner: Runner;
let seq = 0;

async function call(fn: string, body: unknown = {}): Promise<unknown> {
  const res = await runner.invoke("p-cg", "cg", {
    runId: `cg-${++seq}`,
    method: "POST",
    path: `/${fn}`,
    query: "",
    headers: {},
    body: new TextEncoder().encode(JSON.stringify(body)),
  });
  return JSON.parse(Buffer.from(res.body).toString()).result;
}

/** The cgroup folders (memory, pids) a host process is in, from /proc/<pid>/cgroup. */
async function cgroupsOf(pid: number): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const line of (await readFile(`/proc/${pid}/cgroup`, "utf8")).trim().split("\n")) {
    const [, controllers, where] = line.split(":");
    for (const c of controllers.split(",")) out[c || "unified"] = where;
  }
  return out;
}

describe.skipIf(!usable)("a cgroup per replica", () => {
  beforeAll(async () => {
    tmp = await mkdtemp(path.join(tmpdir(), "skiff-sandbox-cgroups-"));
    runner = new Runner({
      workDir: path.join(tmp, "replicas"),
      logger: silentLogger,
      startTimeoutMs: 20_000,
      sandbox: {
        enabled: true,
        limits: { ...DEFAULT_SANDBOX_LIMITS, memoryMb: MEMORY_MB, pids: PIDS, tmpMb: 16 },
        host,
      },
    });
    const dir = path.join(tmp, "app");
    await cp(path.join(ROOT, "test/fixtures/apps/intruder-py"), dir, { recursive: true });
    await runner.deploy({
      projectId: "p-cg",
      appName: "cg",
      version: 1,
      dir,
      config: parseAppConfig(
        skiffToml({ name: "cg", runtime: { kind: "cortex", language: "python", entry: "main.py" } }),
      ),
    });
  }, 60_000);
  afterAll(async () => {
    await runner?.close();
    await rm(tmp, { recursive: true, force: true });
  });

  it("the replica's processes are in a cgroup of their own with its limits, removed when it stops", async () => {
    expect(await call("ping")).toBe("pong");
    // bwrap's pid; the sandbox's first process is its child.
    const bwrap = runner.replicas("p-cg", "cg")[0].pid!;
    const init = Number((await readFile(`/proc/${bwrap}/task/${bwrap}/children`, "utf8")).trim().split(" ")[0]);
    const groups = await cgroupsOf(init);
    const memory = groups.memory ?? groups.unified;
    const pids = groups.pids ?? groups.unified;
    expect(memory).toMatch(/\/skiff-\d+-\d+\/sandbox-[0-9a-f]{8}-\d+$/);
    expect(pids).toMatch(/\/skiff-\d+-\d+\/sandbox-[0-9a-f]{8}-\d+$/);
    const v1 = groups.memory !== undefined;
    const memoryDir = v1 ? path.join("/sys/fs/cgroup/memory", memory) : path.join("/sys/fs/cgroup", memory);
    const pidsDir = v1 ? path.join("/sys/fs/cgroup/pids", pids) : memoryDir;
    const limit = await readFile(path.join(memoryDir, v1 ? "memory.limit_in_bytes" : "memory.max"), "utf8");
    expect(Number(limit)).toBe(MEMORY_MB * 1024 * 1024);
    // SKIFF_REPLICA_PIDS for the replica, and one for bwrap, which is in it too (from before it forks).
    expect(Number(await readFile(path.join(pidsDir, "pids.max"), "utf8"))).toBe(PIDS + 1);
    expect(await cgroupsOf(bwrap)).toEqual(groups);
    await runner.remove("p-cg", "cg");
    await expect
      .poll(
        () =>
          stat(memoryDir).then(
            () => true,
            () => false,
          ),
        { timeout: 30_000 },
      )
      .toBe(false);
    await expect
      .poll(
        () =>
          stat(pidsDir).then(
            () => true,
            () => false,
          ),
        { timeout: 30_000 },
      )
      .toBe(false);
  });

  it("processes each under the per-process limit but together over it: the kernel ends one, the replica serves on", async () => {
    const dir = path.join(tmp, "app");
    await runner.deploy({
      projectId: "p-cg",
      appName: "cg",
      version: 2,
      dir,
      config: parseAppConfig(
        skiffToml({ name: "cg", runtime: { kind: "cortex", language: "python", entry: "main.py" } }),
      ),
    });
    // 4 × 100 MiB: each child is far below RLIMIT_AS (256 MiB), the four are not below the cgroup's 256 MiB.
    const codes = (await call("memory_together", { children: 4, mb: 100 })) as number[];
    expect(codes).toContain(-9);
    expect(await call("ping")).toBe("pong");
  }, 60_000);

  it("when the replica's own process is the one ended, the error says the replica's memory limit", async () => {
    const err = await call("memory_together", { children: 4, mb: 100, main_first: true }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ReplicaCrashed);
    expect((err as Error).message).toMatch(
      new RegExp(`its processes together used more than ${MEMORY_MB} MiB \\(SKIFF_REPLICA_MEMORY_MB\\)`),
    );
    expect(await call("ping")).toBe("pong");
  }, 60_000);

  it("an app's own memory and CPUs ([cerebrium.hardware]) become its replica's cgroup limits, never above the machine's memory", async () => {
    const dir = path.join(tmp, "app");
    const config = parseAppConfig(
      skiffToml({ name: "cg", runtime: { kind: "cortex", language: "python", entry: "main.py" } }),
    );
    await runner.deploy({
      projectId: "p-cg",
      appName: "cg",
      version: 3,
      dir,
      config: { ...config, resources: { cpu: 0.5, memoryMb: 128 } },
    });
    expect(await call("ping")).toBe("pong");
    const bwrap = runner.replicas("p-cg", "cg").find((r) => r.deploymentVersion === 3)!.pid!;
    const init = Number((await readFile(`/proc/${bwrap}/task/${bwrap}/children`, "utf8")).trim().split(" ")[0]);
    const groups = await cgroupsOf(init);
    const v1 = groups.memory !== undefined;
    const memoryDir = v1
      ? path.join("/sys/fs/cgroup/memory", groups.memory)
      : path.join("/sys/fs/cgroup", groups.unified);
    const limit = await readFile(path.join(memoryDir, v1 ? "memory.limit_in_bytes" : "memory.max"), "utf8");
    expect(Number(limit)).toBe(128 * 1024 * 1024);
    if (v1 && groups.cpu !== undefined) {
      const cpuDir = path.join("/sys/fs/cgroup/cpu", groups.cpu);
      expect(cpuDir).toMatch(/\/skiff-\d+-\d+\/sandbox-[0-9a-f]{8}-\d+$/);
      expect(Number(await readFile(path.join(cpuDir, "cpu.cfs_quota_us"), "utf8"))).toBe(50_000);
      expect(Number(await readFile(path.join(cpuDir, "cpu.cfs_period_us"), "utf8"))).toBe(100_000);
    } else if (!v1 && existsSync(path.join(memoryDir, "cpu.max")))
      expect((await readFile(path.join(memoryDir, "cpu.max"), "utf8")).trim()).toBe("50000 100000");
    // More than the machine's limit is the machine's limit.
    await runner.deploy({
      projectId: "p-cg",
      appName: "cg",
      version: 4,
      dir,
      config: { ...config, resources: { memoryMb: 64 * 1024 } },
    });
    expect(await call("ping")).toBe("pong");
    const next = runner.replicas("p-cg", "cg").find((r) => r.deploymentVersion === 4)!;
    const child = Number((await readFile(`/proc/${next.pid}/task/${next.pid}/children`, "utf8")).trim().split(" ")[0]);
    const g = await cgroupsOf(child);
    const dir4 =
      g.memory !== undefined ? path.join("/sys/fs/cgroup/memory", g.memory) : path.join("/sys/fs/cgroup", g.unified);
    const limit4 = await readFile(
      path.join(dir4, g.memory !== undefined ? "memory.limit_in_bytes" : "memory.max"),
      "utf8",
    );
    expect(Number(limit4)).toBe(MEMORY_MB * 1024 * 1024);
  }, 60_000);
});

describe.skipIf(!usable)("two sandbox hosts in one process", () => {
  it("each names its sandboxes' cgroups apart: a second host's first cgroup is made while the first host's still exists", async () => {
    const a = new SandboxHost();
    const b = new SandboxHost();
    expect(a.enableCgroups()).toBe(true);
    expect(b.enableCgroups()).toBe(true);
    const limits = { memoryBytes: 64 * 1024 * 1024, pids: 16 };
    const first = a.sandboxCgroup(limits)!;
    try {
      const second = b.sandboxCgroup(limits)!; // EEXIST before: both were `skiff-<pid>/sandbox-1`
      await second.remove();
    } finally {
      await first.remove();
    }
  });
});
