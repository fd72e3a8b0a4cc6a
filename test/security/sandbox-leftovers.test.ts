// A sandbox's processes and its cgroup (services/runner/sandbox.ts,
// cgroups.ts): nothing of a sandbox runs outside its cgroup, from the root
// launch script on (slirp4netns included); a runner killed at any moment of a
// sandbox's start leaves nothing running once the next start has reaped its
// leftovers; a tenant cannot leave its cgroup, nor go past its memory or its
// process limit; the reaping ends only dead skiff processes' sandboxes.
//
// Real bwrap, real cgroups, real processes, as root. Runner processes run in
// cgroup folders of this file's own (`attack-rd-<pid>`, next to this
// process's cgroup, cgroup v1), so that everything they start, in a sandbox's
// cgroup or not, is found there, and a reap sees only their leftovers.
// Skipped, with the reason, where the machine cannot.
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { chmod, mkdir, mkdtemp, readFile, readlink, rm, rmdir, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { createInterface } from "node:readline";
import { setTimeout as sleep } from "node:timers/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { detectCgroups, reapLeftovers } from "../../services/runner/cgroups.js";
import { SandboxHost } from "../../services/runner/sandbox-host.js";
import { slirpPath } from "../../services/runner/sandbox-network.js";
import {
  DEFAULT_SANDBOX_LIMITS,
  signalSandbox,
  spawnSandboxed,
  type SandboxedProcess,
} from "../../services/runner/sandbox.js";
import type { SandboxLimits } from "../../services/runner/sandbox-argv.js";
import { CGROUP_OWNER_SCRIPT, ownerLine } from "../helpers/cgroup-owner.js";
import { hostProcessesWith } from "../helpers/host-processes.js";
import { machineCan } from "../helpers/machine.js";
import { TEST_ROOT } from "../helpers/paths.js";

const ROOT = path.resolve(TEST_ROOT, "..");
const SANDBOX = path.join(ROOT, "services/runner/sandbox.ts");
const HOST = path.join(ROOT, "services/runner/sandbox-host.ts");
const PYTHON = "/usr/bin/python3";
const isRoot = process.getuid?.() === 0;
const found = detectCgroups();
const has = (tool: string) => existsSync(tool);
const usable = machineCan(
  "attacks on a sandbox's cgroup",
  !new SandboxHost().bwrapPath()
    ? "no bwrap"
    : !isRoot
      ? "they need root"
      : typeof found === "string"
        ? `no cgroups for skiff (${found})`
        : found.version !== 1
          ? "they need cgroup v1 (runners in cgroup folders of the test's own)"
          : !has(PYTHON) || !has("/usr/bin/taskset") || !has("/usr/bin/unshare")
            ? `${PYTHON}, taskset or unshare is missing`
            : undefined,
);
const slirp = slirpPath();

/** The folders of this process's cgroups (one per hierarchy skiff uses), where skiff puts its `skiff-<pid>` folders. */
const ownFolders = typeof found === "string" ? [] : found.parents.map((p) => path.dirname(p));
/** This file's own cgroup folders, one per hierarchy. */
const mine = ownFolders.map((own) => path.join(own, `attack-rd-${process.pid}`));
const quiet = { warn: () => undefined, info: () => undefined };
/** Sandbox uids of this file: above every range skiff gives out (projects, builds, the probe). */
const UID_BASE = 3_000_000 + (process.pid % 100_000) * 20;
let uidSeq = 0;
const nextUid = () => UID_BASE + uidSeq++;

let tmp: string;
const children: ChildProcess[] = [];
const sandboxes: SandboxedProcess[] = [];

/** A cgroup folder and every folder below it, the deepest first. */
function tree(dir: string): string[] {
  if (!existsSync(dir)) return [];
  const below = readdirSync(dir, { withFileTypes: true })
    .filter((e) => e.isDirectory())
    .flatMap((e) => tree(path.join(dir, e.name)));
  return [...below, dir];
}

/** The processes in the given cgroup folders (not below them). */
function processesIn(dirs: string[]): number[] {
  return [
    ...new Set(
      dirs.flatMap((dir) => {
        try {
          return readFileSync(path.join(dir, "cgroup.procs"), "utf8").split("\n").filter(Boolean).map(Number);
        } catch {
          return [];
        }
      }),
    ),
  ];
}

/** Removes a cgroup folder of this file's and those below it, ending their processes first. */
async function removeTree(dir: string): Promise<void> {
  for (const d of tree(dir)) {
    for (let attempt = 0; ; attempt++) {
      for (const pid of processesIn([d]))
        try {
          process.kill(pid, "SIGKILL");
        } catch {
          // gone meanwhile
        }
      try {
        await rmdir(d);
        break;
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === "ENOENT" || attempt >= 150) break;
        await sleep(20);
      }
    }
  }
}

/** Host processes whose real uid is `uid`. */
function processesOfUid(uid: number): number[] {
  const out: number[] = [];
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const m = /^Uid:\s+(\d+)/m.exec(readFileSync(`/proc/${name}/status`, "utf8"));
      if (m && Number(m[1]) === uid) out.push(Number(name));
    } catch {
      // gone
    }
  }
  return out;
}

/** A process's cgroup per hierarchy ("memory" → "/a/b"), from /proc/<pid>/cgroup; {} once it is gone. */
function cgroupsOf(pid: number): Record<string, string> {
  const out: Record<string, string> = {};
  try {
    for (const line of readFileSync(`/proc/${pid}/cgroup`, "utf8").trim().split("\n")) {
      const [, controllers, where] = line.split(":");
      for (const c of controllers.split(",")) out[c || "unified"] = where;
    }
  } catch {
    // gone
  }
  return out;
}
const memoryAndPids = (pid: number) => {
  const g = cgroupsOf(pid);
  return { memory: g.memory, pids: g.pids };
};

/** Waits until `check` holds or `ms` have passed; whether it held. */
async function until(check: () => boolean | Promise<boolean>, ms: number): Promise<boolean> {
  const deadline = Date.now() + ms;
  for (;;) {
    if (await check()) return true;
    if (Date.now() >= deadline) return false;
    await sleep(25);
  }
}

/** New cgroup folders of this file's for one runner (one per hierarchy). */
let runnerSeq = 0;
async function runnerFolders(): Promise<string[]> {
  const n = ++runnerSeq;
  const dirs = mine.map((root) => path.join(root, `runner-${n}`));
  for (const d of dirs) await mkdir(d, { recursive: true });
  return dirs;
}

/**
 * Starts `script` (an ES module) as a runner process in the cgroup folders
 * `dirs`: it moves itself there before node starts, so that whatever it starts
 * is in them or below. `cpu`: pinned to that CPU.
 */
function spawnRunner(script: string, dirs: string[], env: Record<string, string>, cpu?: string): ChildProcess {
  const sh =
    'for d; do echo $$ > "$d/cgroup.procs" || exit 99; done; exec "$RUNNER_NODE" --import tsx --input-type=module -e "$RUNNER_SCRIPT"';
  const argv = ["/bin/sh", "-c", sh, "runner", ...dirs];
  const [program, ...args] = cpu === undefined ? argv : ["/usr/bin/taskset", "-c", cpu, ...argv];
  const child = spawn(program, args, {
    cwd: ROOT,
    env: { ...process.env, ...env, RUNNER_NODE: process.execPath, RUNNER_SCRIPT: script },
    stdio: ["ignore", "pipe", "inherit"],
  });
  children.push(child);
  return child;
}

const exited = (child: ChildProcess) =>
  new Promise<[number | null, string | null]>((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) return resolve([child.exitCode, child.signalCode]);
    child.once("exit", (code, signal) => resolve([code, signal]));
  });

/** A folder for an app, which the sandbox's uid may write. */
async function appDir(prefix: string, files: Record<string, string> = {}): Promise<string> {
  const dir = await mkdtemp(path.join(tmp, prefix));
  await chmod(dir, 0o777);
  for (const [name, text] of Object.entries(files)) await writeFile(path.join(dir, name), text, { mode: 0o644 });
  return dir;
}

/** Starts a sandbox in this process on a host with cgroups; ended after the file. */
function sandbox(
  host: SandboxHost,
  dir: string,
  command: string,
  args: string[],
  more: { limits?: Partial<SandboxLimits>; network?: "none" | "slirp4netns"; uid?: number } = {},
): SandboxedProcess {
  const s = spawnSandboxed(host, {
    appDir: dir,
    writableApp: true,
    uid: more.uid ?? nextUid(),
    limits: { ...DEFAULT_SANDBOX_LIMITS, ...more.limits },
    command,
    args,
    env: { PATH: "/usr/bin:/bin" },
    network: more.network ?? "none",
  });
  sandboxes.push(s);
  return s;
}

/** The first line a stream gives that matches `re`, within `ms`. */
function lineOf(stream: NodeJS.ReadableStream, re: RegExp, ms: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no line matching ${re} within ${ms} ms`)), ms);
    const lines = createInterface({ input: stream });
    lines.on("line", (line) => {
      if (!re.test(line)) return;
      clearTimeout(timer);
      lines.close();
      resolve(line);
    });
  });
}

let host: SandboxHost;

describe.skipIf(!usable)("a sandbox's cgroup, attacked", () => {
  beforeAll(async () => {
    tmp = await mkdtemp(path.join(tmpdir(), "skiff-attack-rd-"));
    await chmod(tmp, 0o755);
    for (const d of mine) await mkdir(d, { recursive: true });
    host = new SandboxHost();
    expect(host.enableCgroups()).toBe(true);
  });
  afterAll(async () => {
    for (const s of sandboxes) signalSandbox(s, "SIGKILL");
    for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
    await Promise.all(sandboxes.map((s) => exited(s.child)));
    for (const d of mine) await removeTree(d);
    // This process's `skiff-<pid>` folders, once the sandboxes' cgroups in them are gone (removed as they end).
    if (typeof found !== "string") {
      await until(() => found.parents.every((p) => tree(p).length <= 1), 5000);
      for (const p of found.parents) if (tree(p).length === 1) await rmdir(p).catch(() => undefined);
    }
    for (let i = 0; i < uidSeq; i++) for (const pid of processesOfUid(UID_BASE + i)) process.kill(pid, "SIGKILL");
    if (tmp) await rm(tmp, { recursive: true, force: true });
  });

  // --- (a) nothing of a sandbox outside its cgroup --------------------------

  it.skipIf(!slirp)(
    "slirp4netns, which carries all of a sandbox's outbound traffic, is in the sandbox's cgroup",
    async () => {
      const dir = await appDir("slirp-");
      const s = sandbox(host, dir, "/bin/sh", ["-c", "echo up > /app/up; exec sleep 600"], {
        network: "slirp4netns",
      });
      expect(await until(() => existsSync(path.join(dir, "up")), 20_000)).toBe(true);
      const init = s.initPid()!;
      const helpers = await hostProcessesWith(`/proc/${init}/ns/net`);
      const slirps: number[] = [];
      for (const pid of helpers)
        if ((await readlink(`/proc/${pid}/exe`).catch(() => "")).endsWith("/slirp4netns")) slirps.push(pid);
      expect(slirps).toHaveLength(1);
      const sandboxGroups = memoryAndPids(init);
      expect(sandboxGroups.memory).toMatch(/\/skiff-\d+-\d+\/sandbox-[0-9a-f]{8}-\d+$/);
      // Its memory (a socket and buffers on the host for every connection the app opens) and its processes
      // count as the sandbox's.
      expect(memoryAndPids(slirps[0])).toEqual(sandboxGroups);
    },
  );

  it("the root launch script forks nothing before the sandbox's process has joined its cgroup, on a busy CPU", async () => {
    // A runner that starts sandboxes one after another and notes, at the instant each process is about to join
    // its cgroup, whether the launch script has already mounted its tmpfs (run `mount`, a child of its own, as
    // root, in the runner's cgroup). Runner and sandboxes share one CPU with busy loops, as on a loaded host.
    const script = `
      const { readFileSync, readlinkSync, mkdtempSync, chmodSync } = await import("node:fs");
      const s = await import(${JSON.stringify(SANDBOX)});
      const { SandboxHost } = await import(${JSON.stringify(HOST)});
      const seen = [];
      class Host extends SandboxHost {
        sandboxCgroup(limits) {
          const cg = super.sandboxCgroup(limits);
          if (!cg) return cg;
          return {
            join(pid) {
              let exe = "";
              try { exe = readlinkSync("/proc/" + pid + "/exe"); } catch {}
              const mounted = readFileSync("/proc/" + pid + "/mountinfo", "utf8").includes(" - tmpfs skiff-sandbox ");
              seen.push({ exe, mounted });
              cg.join(pid);
            },
            oomKilled: () => cg.oomKilled(),
            remove: () => cg.remove(),
          };
        }
      }
      const host = new Host();
      if (host.enableCgroups() !== true) throw new Error("no cgroups");
      for (let i = 0; i < 40; i++) {
        const sandboxed = s.spawnSandboxed(host, {
          appDir: process.env.APP_DIR, writableApp: true, uid: Number(process.env.SANDBOX_UID),
          limits: s.DEFAULT_SANDBOX_LIMITS, command: "/bin/true", args: [], env: { PATH: "/usr/bin:/bin" }, network: "none",
        });
        await new Promise((r) => sandboxed.child.once("close", r));
      }
      console.log("seen " + JSON.stringify(seen));
      process.exit(0);
    `;
    const allowed = /^Cpus_allowed_list:\s*(\d+)/m.exec(readFileSync("/proc/self/status", "utf8"))?.[1] ?? "0";
    // The busy loops in the runner's cgroups, so that the CPU's scheduler weighs them against it directly.
    const dirs = await runnerFolders();
    const busy = [1, 2, 3].map(() =>
      spawn(
        "/usr/bin/taskset",
        [
          "-c",
          allowed,
          "/bin/sh",
          "-c",
          'for d; do echo $$ > "$d/cgroup.procs" || exit 99; done; while :; do :; done',
          "busy",
          ...dirs,
        ],
        { stdio: "ignore" },
      ),
    );
    children.push(...busy);
    try {
      const runner = spawnRunner(
        script,
        dirs,
        {
          APP_DIR: await appDir("launch-"),
          SANDBOX_UID: String(nextUid()),
        },
        allowed,
      );
      const line = await lineOf(runner.stdout!, /^seen /, 50_000);
      const seen = JSON.parse(line.slice(5)) as { exe: string; mounted: boolean }[];
      expect(seen).toHaveLength(40);
      const early = seen.filter((s) => s.mounted);
      // Each of these: the launch script had run `mount` (root, a process of the sandbox's start) before the
      // sandbox's process joined the cgroup, so in none.
      expect(early, `${early.length} of ${seen.length} joined after the launch script forked`).toEqual([]);
    } finally {
      for (const b of busy) b.kill("SIGKILL");
    }
  }, 60_000);

  it("the root launch script forks nothing before the sandbox's process has joined its cgroup, however late the runner gets there", async () => {
    // The same, made certain: a runner that loses the CPU (or stops for a garbage collection) for 50 ms between
    // spawning the launch script and moving it into the cgroup.
    class LateHost extends SandboxHost {
      readonly seen: boolean[] = [];
      override sandboxCgroup(limits: Parameters<SandboxHost["sandboxCgroup"]>[0]) {
        const cg = super.sandboxCgroup(limits);
        if (!cg) return cg;
        const seen = this.seen;
        return {
          join(pid: number) {
            Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 50);
            seen.push(readFileSync(`/proc/${pid}/mountinfo`, "utf8").includes(" - tmpfs skiff-sandbox "));
            cg.join(pid);
          },
          oomKilled: () => cg.oomKilled(),
          remove: () => cg.remove(),
        };
      }
    }
    const late = new LateHost();
    expect(late.enableCgroups()).toBe(true);
    const s = sandbox(late, await appDir("late-"), "/bin/true", []);
    await exited(s.child);
    // True: the launch script had run `mount` as root, in the runner's cgroup, before the sandbox had one.
    expect(late.seen).toEqual([false]);
  });

  // --- (d) a runner killed at any moment of a sandbox's start -----------------

  /**
   * A runner, as far as the sandbox goes: starts one whose command writes /app/ran, leaves processes of its own
   * behind (setsid, nohup, a background job) and sleeps, and kills itself with SIGKILL at the moment MODE says:
   * before-join / after-join (in the very call that puts bwrap in its cgroup), named (when bwrap names the
   * sandbox's first process), delay:N (N ms after spawnSandboxed returned), running (once /app/ran exists).
   * MANY=1: the app folder has thousands of entries, so that bwrap's options are more than a pipe holds.
   */
  const RUNNER = `
    const { existsSync } = await import("node:fs");
    const s = await import(${JSON.stringify(SANDBOX)});
    const { SandboxHost } = await import(${JSON.stringify(HOST)});
    const mode = process.env.MODE;
    const die = () => process.kill(process.pid, "SIGKILL");
    class Host extends SandboxHost {
      sandboxCgroup(limits) {
        const cg = super.sandboxCgroup(limits);
        if (!cg) return cg;
        return {
          join(pid) {
            if (mode === "before-join") die();
            cg.join(pid);
            if (mode === "after-join") die();
          },
          oomKilled: () => cg.oomKilled(),
          remove: () => cg.remove(),
        };
      }
    }
    const host = new Host();
    if (host.enableCgroups() !== true) throw new Error("no cgroups");
    const dir = process.env.APP_DIR;
    const m = process.env.MARK;
    const tenant = "echo ran > /app/ran; (setsid sleep 600." + m + " &); nohup sleep 600." + m +
      " >/dev/null 2>&1 & sleep 600." + m + " & exec sleep 600." + m;
    const sandboxed = s.spawnSandboxed(host, {
      appDir: dir, writableApp: process.env.MANY !== "1", uid: Number(process.env.SANDBOX_UID),
      limits: s.DEFAULT_SANDBOX_LIMITS, command: "/bin/sh", args: ["-c", tenant], env: { PATH: "/usr/bin:/bin" },
      network: process.env.NETWORK,
    });
    if (mode.startsWith("delay:")) setTimeout(die, Number(mode.slice(6)));
    else if (mode === "named") sandboxed.child.stdio[3].on("data", die);
    else if (mode === "running") setInterval(() => existsSync(dir + "/ran") && die(), 2);
    setInterval(() => {}, 1 << 30);
  `;

  interface Outcome {
    what: string;
    /** Processes outside every sandbox cgroup of the runner's, still there well after its death: no reap ends them. */
    outside: number[];
    /** Processes left after the next start's reap: in the runner's folders, of the sandbox's uid, or of its mark. */
    left: number[];
  }

  async function killRunner(mode: string, network: "none" | "slirp4netns", many = false): Promise<Outcome> {
    const what = `${mode} (${network}${many ? ", many files" : ""})`;
    const dirs = await runnerFolders();
    const files: Record<string, string> = {};
    if (many) for (let i = 0; i < 1500; i++) files[`${"f".repeat(60)}${i}`] = "";
    const dir = await appDir("killed-", files);
    const uid = nextUid();
    const mark = `${process.pid}${runnerSeq}${Date.now() % 100_000}`;
    const runner = spawnRunner(RUNNER, dirs, {
      APP_DIR: dir,
      MODE: mode,
      NETWORK: network,
      MARK: mark,
      SANDBOX_UID: String(uid),
      MANY: many ? "1" : "0",
    });
    const [, signal] = await exited(runner);
    expect(signal, what).toBe("SIGKILL");
    // Whatever is outside the sandbox cgroups (`skiff-<pid>/…`) of the memory and pids hierarchies, which every
    // sandbox has: the launch script, slirp4netns, a helper. (A sandbox has a cpu cgroup only with a CPU quota.)
    const outsideNow = () => processesIn(dirs.slice(0, 2));
    await until(() => outsideNow().length === 0, 5000);
    const outside = outsideNow();
    await reapLeftovers(dirs, quiet);
    const leftNow = async () => [
      ...new Set([
        ...processesIn(dirs.flatMap(tree)),
        ...processesOfUid(uid),
        // (A command line is NUL-separated: a sleep's is "sleep\0600.<mark>"; bwrap's has the mark in one argument.)
        ...(await hostProcessesWith(`600.${mark}`)),
      ]),
    ];
    await until(async () => (await leftNow()).length === 0, 5000);
    return { what, outside, left: await leftNow() };
  }

  it("a runner killed at any moment of a sandbox's start leaves nothing once the next start has reaped", async () => {
    const runs: [string, "none" | "slirp4netns", boolean][] = [
      ["before-join", "none", false],
      ["after-join", "none", false],
      ["named", "none", false],
      ["delay:0", "none", false],
      ["delay:4", "none", false],
      ["delay:15", "none", false],
      ["running", "none", false],
      ["delay:0", "none", true],
      ["delay:2", "none", true],
      ["after-join", "none", true],
    ];
    if (slirp)
      runs.push(
        ["named", "slirp4netns", false],
        ["delay:10", "slirp4netns", false],
        ["delay:40", "slirp4netns", false],
        ["delay:120", "slirp4netns", false],
        ["running", "slirp4netns", false],
      );
    const outcomes: Outcome[] = [];
    for (let i = 0; i < runs.length; i += 5)
      outcomes.push(...(await Promise.all(runs.slice(i, i + 5).map(([m, n, many]) => killRunner(m, n, many)))));
    expect(outcomes.filter((o) => o.outside.length > 0 || o.left.length > 0)).toEqual([]);
  }, 60_000);

  // --- (b) a tenant and its cgroup -------------------------------------------

  it("a tenant cannot move itself or its children out of its cgroup", async () => {
    const dir = await appDir("escape-");
    const mark = `${process.pid}9${Date.now() % 100_000}`;
    const tries = [
      "mkdir -p /tmp/c",
      "mount -t cgroup -o pids none /tmp/c",
      "mount -t cgroup2 none /tmp/c",
      "mount -t sysfs none /tmp/c",
      "unshare -C -m true",
      "unshare -U -r true",
      "echo $$ > /sys/fs/cgroup/pids/cgroup.procs",
      "echo $$ > /tmp/c/cgroup.procs",
      "echo $$ > /proc/1/root/sys/fs/cgroup/pids/cgroup.procs",
    ].join(" 2>/dev/null; ");
    const s = sandbox(host, dir, "/bin/sh", [
      "-c",
      `${tries} 2>/dev/null; (setsid sleep 600.${mark} &); sleep 600.${mark} & echo tried > /app/tried; exec sleep 600.${mark}`,
    ]);
    expect(await until(() => existsSync(path.join(dir, "tried")), 20_000)).toBe(true);
    // Its three sleeps (bwrap's command line names the mark too).
    const sleeps = async () => {
      const out: number[] = [];
      for (const pid of await hostProcessesWith(`600.${mark}`))
        if ((await readlink(`/proc/${pid}/exe`).catch(() => "")).endsWith("/sleep")) out.push(pid);
      return out;
    };
    expect(await until(async () => (await sleeps()).length === 3, 10_000)).toBe(true);
    const groups = memoryAndPids(s.initPid()!);
    expect(groups.memory).toMatch(/\/skiff-\d+-\d+\/sandbox-[0-9a-f]{8}-\d+$/);
    for (const pid of [s.child.pid!, s.initPid()!, ...(await sleeps())])
      expect(memoryAndPids(pid), String(pid)).toEqual(groups);
  });

  it("a tenant's processes stay within SKIFF_REPLICA_PIDS, bwrap's own process aside", async () => {
    const PIDS = 24;
    const dir = await appDir("pids-", {
      "fork.py": `
import os, time
n = 0
try:
    while n < 1000:
        if os.fork() == 0:
            time.sleep(600)
            os._exit(0)
        n += 1
except OSError:
    pass
print(n, flush=True)
time.sleep(600)
`,
    });
    const s = sandbox(host, dir, PYTHON, ["/app/fork.py"], { limits: { pids: PIDS } });
    const line = await lineOf(s.child.stdout!, /^\d+$/, 20_000);
    const pidsDir = path.join("/sys/fs/cgroup/pids", memoryAndPids(s.initPid()!).pids!);
    expect(Number(await readFile(path.join(pidsDir, "pids.max"), "utf8"))).toBe(PIDS + 1);
    // bwrap, the sandbox's first process and the script itself are three of the cgroup's PIDS + 1.
    expect(Number(line)).toBeLessThanOrEqual(PIDS - 2);
    expect(Number(await readFile(path.join(pidsDir, "pids.current"), "utf8"))).toBeLessThanOrEqual(PIDS + 1);
  });

  // --- (c) the memory limit ---------------------------------------------------

  // Open (docs/security.md, "Limits"): cgroup v1 does not charge socket buffers to the memory cgroup (v2 does),
  // and its kmem.tcp limit is gone from recent kernels; the bytes count only against the host's tcp_mem. Proposed
  // fix: prefer v2 where skiff can use it; on v1, smaller tcp_rmem/tcp_wmem in each sandbox's network namespace.
  it.fails(
    "a tenant cannot hold more memory than SKIFF_REPLICA_MEMORY_MB in the buffers of its own TCP connections",
    async () => {
      // Connections over the sandbox's own loopback, written to and never read: the kernel keeps the bytes.
      const MEMORY_MB = 128;
      const dir = await appDir("tcp-", {
        "fill.py": `
import socket, sys, time
target = int(sys.argv[1]) * 1024 * 1024
chunk = b"x" * 65536
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1024)
held, total = [], 0
try:
    while total < target:
        a = socket.create_connection(srv.getsockname())
        b, _ = srv.accept()
        a.setblocking(False)
        b.setblocking(False)
        held.append((a, b))
        for s in (a, b):
            while True:
                try:
                    total += s.send(chunk)
                except BlockingIOError:
                    break
except OSError as e:
    print("stopped", e, flush=True)
print("held", total, flush=True)
time.sleep(600)
`,
      });
      const s = sandbox(host, dir, PYTHON, ["/app/fill.py", String(3 * MEMORY_MB)], {
        limits: { memoryMb: MEMORY_MB },
      });
      const exit = exited(s.child).then(() => "ended");
      const line = await Promise.race([lineOf(s.child.stdout!, /^held \d+$/, 30_000), exit]);
      const oomKilled = s.oomKilled!();
      const held = line === "ended" ? 0 : Number(line.split(" ")[1]);
      const memoryDir = path.join("/sys/fs/cgroup/memory", memoryAndPids(s.initPid() ?? 0).memory ?? "gone");
      const used = await readFile(path.join(memoryDir, "memory.max_usage_in_bytes"), "utf8").catch(() => "?");
      // Either the sandbox cannot hold that much, or its cgroup counts it (and the OOM killer ends it).
      expect(
        oomKilled || held <= MEMORY_MB * 1024 * 1024,
        `${held} bytes held in socket buffers by a sandbox limited to ${MEMORY_MB} MiB (its cgroup's peak: ${used.trim()} bytes)`,
      ).toBe(true);
    },
    60_000,
  );

  // --- (b) the reaping touches only dead skiff processes' sandboxes -------------

  // A `skiff-<pid>-<pid namespace>` folder is judged only by a skiff of the same pid namespace (cgroups.ts
  // skiffFolderName): a pid means something in its own namespace only.
  it("a live skiff in another pid namespace keeps its sandboxes when a skiff starts next to it", async () => {
    // Two skiff processes whose cgroups are the same folder (here: the root of a hierarchy, where every
    // process of the host is) and whose pid namespaces differ (one in a container, or under unshare).
    const bases = mine.map((d) => path.join(d, "pidns"));
    for (const b of bases) await mkdir(b, { recursive: true });
    // Its pid inside its namespace: one that no process of this (the host's) namespace has.
    let last = 20_000;
    while (existsSync(`/proc/${last + 1}`) || existsSync(`/proc/${last + 2}`)) last++;
    const owner = spawn(
      "/usr/bin/unshare",
      [
        "--pid",
        "--kill-child",
        "--mount-proc",
        "/bin/sh",
        "-c",
        `echo ${last} > /proc/sys/kernel/ns_last_pid || exit 9; "$OWNER_NODE" -e "$OWNER_SCRIPT" & wait`,
      ],
      {
        env: {
          ...process.env,
          BASES: JSON.stringify(bases),
          OWNER_NODE: process.execPath,
          OWNER_SCRIPT: CGROUP_OWNER_SCRIPT,
        },
        stdio: ["ignore", "pipe", "inherit"],
      },
    );
    children.push(owner);
    const { owner: nsPid, folder } = ownerLine(await lineOf(owner.stdout!, /^owner \d+ \d+ skiff-\d+-\d+$/, 20_000));
    const folders = bases.map((b) => path.join(b, folder, "sandbox-1"));
    const [sleeper] = processesIn(folders);
    expect(sleeper).toBeGreaterThan(0);
    expect(existsSync(`/proc/${nsPid}`)).toBe(false); // no process of this namespace has the owner's pid
    await reapLeftovers(bases, quiet);
    await sleep(100);
    // The owner lives, in its namespace: its sandbox is not a leftover.
    expect(owner.exitCode).toBeNull();
    expect(existsSync(`/proc/${sleeper}`), "the live skiff's sandbox process was killed").toBe(true);
    expect(folders.every((f) => existsSync(f))).toBe(true);
  });
});
