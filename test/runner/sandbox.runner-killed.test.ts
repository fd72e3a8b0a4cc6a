// A runner killed while a sandbox is starting leaves nothing running: bwrap
// goes on at the end of its block fd as at a byte, before its parent-death
// signal is set, so the command would run with no runner; the gate in front
// of the command (sandbox.ts) ends it instead. What bwrap itself may leave (a
// child waiting for a uid map its dead parent never wrote) is in the
// sandbox's cgroup, which bwrap joined before it forked, and the next start
// ends it (cgroups.ts reapLeftovers). Real bwrap, real processes: a runner
// process starts a sandbox and is SIGKILLed, before and after it released it.
// Needs a block fd: a cgroup per sandbox, or else slirp4netns; skipped, with
// the reason, on a host with neither.
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync } from "node:fs";
import { chmod, mkdtemp, readFile, readlink, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { detectCgroups, reapLeftovers } from "../../services/runner/cgroups.js";
import { SandboxHost } from "../../services/runner/sandbox-host.js";
import { DEFAULT_SANDBOX_LIMITS, signalSandbox, spawnSandboxed } from "../../services/runner/sandbox.js";
import { slirpPath } from "../../services/runner/sandbox-network.js";
import { hostProcessesWith } from "../helpers/host-processes.js";
import { machineCan } from "../helpers/machine.js";
import { TEST_ROOT } from "../helpers/paths.js";

const ROOT = path.resolve(TEST_ROOT, "..");
const SANDBOX = path.join(ROOT, "services/runner/sandbox.ts");
const HOST = path.join(ROOT, "services/runner/sandbox-host.ts");
const found = detectCgroups();
const cgroups = typeof found === "string" ? found : true;
const network = cgroups === true ? "none" : slirpPath() ? "slirp4netns" : undefined;
const usable = machineCan(
  "sandbox-runner-killed",
  !new SandboxHost().bwrapPath()
    ? "no bwrap"
    : network === undefined
      ? `neither cgroups (${cgroups}) nor slirp4netns`
      : undefined,
);

/**
 * A runner, as far as the sandbox goes: starts one whose command writes
 * /app/ran and sleeps, and kills itself with SIGKILL when bwrap names the
 * sandbox's first process (MODE=starting: before the release, which waits for
 * that) or once /app/ran exists (MODE=running).
 */
const RUNNER = `
const { existsSync } = await import("node:fs");
const s = await import(${JSON.stringify(SANDBOX)});
const { SandboxHost } = await import(${JSON.stringify(HOST)});
const host = new SandboxHost();
if (process.env.NETWORK === "none" && host.enableCgroups() !== true) throw new Error("no cgroups");
const dir = process.env.APP_DIR;
const sandboxed = s.spawnSandboxed(host, {
  appDir: dir,
  writableApp: true,
  uid: 4242,
  limits: s.DEFAULT_SANDBOX_LIMITS,
  command: "/bin/sh",
  // MARK (digits) names this sandbox's processes on the host: bwrap's command line and the command's.
  args: ["-c", "echo ran > /app/ran; exec sleep 600." + process.env.MARK],
  env: { PATH: "/usr/bin:/bin" },
  network: process.env.NETWORK,
});
const die = () => process.kill(process.pid, "SIGKILL");
// fd 3: bwrap's info fd, the first after the command's own (none here), where it names the first process.
if (process.env.MODE === "starting") sandboxed.child.stdio[3].on("data", die);
else setInterval(() => existsSync(dir + "/ran") && die(), 5);
setInterval(() => {}, 1 << 30);
`;

let tmp: string;
const runners: ChildProcess[] = [];

/** The marks of the sandboxes started here (see RUNNER). */
const marks: string[] = [];
/**
 * The host processes of a sandbox: its command line (bwrap's, the command's) holds its mark. A command line's
 * arguments are apart by NULs, so `sleep`'s holds "600.<mark>" but not "sleep 600.<mark>" (bwrap's does).
 */
const processesOf = (mark: string) => hostProcessesWith(`600.${mark}`);

/** Runs a runner to its SIGKILL; the app folder it used and its sandbox's mark. */
async function killedRunner(mode: "starting" | "running"): Promise<{ dir: string; mark: string }> {
  const dir = await mkdtemp(path.join(tmp, `${mode}-`));
  await chmod(dir, 0o777);
  const mark = `${process.pid}${marks.length}${Date.now() % 1_000_000}`;
  marks.push(mark);
  const runner = spawn(process.execPath, ["--import", "tsx", "--input-type=module", "-e", RUNNER], {
    cwd: ROOT,
    env: { ...process.env, APP_DIR: dir, MODE: mode, NETWORK: network, MARK: mark },
    stdio: ["ignore", "inherit", "inherit"],
  });
  runners.push(runner);
  const [, signal] = await new Promise<[number | null, string | null]>((resolve) =>
    runner.once("exit", (code, sig) => resolve([code, sig])),
  );
  expect(signal).toBe("SIGKILL");
  return { dir, mark };
}

/** Waits up to 5 s for the processes of the sandbox marked `mark` to be gone; those left. */
async function leftOf(mark: string): Promise<number[]> {
  for (let i = 0; i < 100; i++) {
    const left = await processesOf(mark);
    if (left.length === 0) return left;
    await sleep(50);
  }
  return processesOf(mark);
}

/** The program a process runs (its executable's path), or "" when it is gone. */
const programOf = (pid: number) => readlink(`/proc/${pid}/exe`).catch(() => "");
/** A process's cgroups, as /proc/<pid>/cgroup lists them. */
const cgroupsOf = (pid: number) => readFile(`/proc/${pid}/cgroup`, "utf8").catch(() => "");
/** Where skiff processes' cgroup folders are, as a skiff's start looks for them (sandbox-setup.ts). */
const bases = () => (typeof found === "string" ? [] : found.parents.map((p) => path.dirname(p)));
const quiet = { warn: () => undefined, info: () => undefined };
/** The lines of a /proc/<pid>/cgroup text that name a sandbox's cgroup (`…/skiff-<pid>/<sandbox>`). */
const sandboxCgroupLines = (text: string) => text.split("\n").filter((line) => /\/skiff-\d+-\d+\/[^/]+$/.test(line));

describe.skipIf(!usable)("a runner killed while its sandbox starts", () => {
  beforeAll(async () => {
    tmp = await mkdtemp(path.join(tmpdir(), "skiff-runner-killed-"));
  });
  afterAll(async () => {
    for (const r of runners) if (r.exitCode === null && r.signalCode === null) r.kill("SIGKILL");
    for (const mark of marks) for (const pid of await processesOf(mark)) process.kill(pid, "SIGKILL");
    await rm(tmp, { recursive: true, force: true });
  });

  it("before releasing it: the command never runs, and what is left is in the dead runner's cgroup, which the next start ends", async () => {
    const { dir, mark } = await killedRunner("starting");
    const left = await leftOf(mark);
    expect(existsSync(path.join(dir, "ran"))).toBe(false);
    // bwrap's child waits for its parent to write its uid map; when the runner's death ends that parent
    // first, the child waits for good, in a user namespace with no uid mapped, having run nothing (neither
    // the gate nor the command). It is in the sandbox's cgroup, joined by bwrap before it forked, so the
    // next skiff to start ends it with the dead runner's other leftovers.
    for (const pid of left) expect(await programOf(pid)).toMatch(/\/bwrap$/);
    if (cgroups !== true) return; // without cgroups it waits for good (docs/security.md)
    for (const pid of left) expect(sandboxCgroupLines(await cgroupsOf(pid)).length).toBeGreaterThan(0);
    const reaped = await reapLeftovers(bases(), quiet);
    expect(reaped.processes).toBeGreaterThanOrEqual(left.length);
    expect(await leftOf(mark)).toEqual([]);
  });

  it.skipIf(cgroups !== true)(
    "bwrap is in the sandbox's cgroup before it can fork, its first process in the same one",
    async () => {
      // What makes the case above hold whenever the runner dies: bwrap's child is forked by a process that is
      // already in the cgroup, which the next start ends (a child left waiting is rare to catch in the act).
      const host = new SandboxHost();
      expect(host.enableCgroups()).toBe(true);
      const dir = await mkdtemp(path.join(tmp, "joined-"));
      await chmod(dir, 0o777);
      const mark = `${process.pid}${marks.length}${Date.now() % 1_000_000}`;
      marks.push(mark);
      const sandboxed = spawnSandboxed(host, {
        appDir: dir,
        writableApp: true,
        uid: 4242,
        limits: DEFAULT_SANDBOX_LIMITS,
        command: "/bin/sh",
        args: ["-c", `exec sleep 600.${mark}`],
        env: { PATH: "/usr/bin:/bin" },
        network: "none",
      });
      try {
        // At once, before bwrap has read its options: the spawned process (later bwrap) is in a sandbox's cgroup.
        const own = sandboxCgroupLines(await cgroupsOf(process.pid));
        const launcher = sandboxCgroupLines(await cgroupsOf(sandboxed.child.pid!));
        expect(launcher.length).toBeGreaterThan(0);
        expect(launcher.some((line) => own.includes(line))).toBe(false);
        await sandboxed.ready;
        expect(sandboxCgroupLines(await cgroupsOf(sandboxed.initPid()!))).toEqual(launcher);
      } finally {
        signalSandbox(sandboxed, "SIGKILL");
      }
    },
  );

  it("after releasing it: the command ran, and the sandbox ends with its runner", async () => {
    const { dir, mark } = await killedRunner("running");
    expect(existsSync(path.join(dir, "ran"))).toBe(true);
    expect(await leftOf(mark)).toEqual([]);
  });
});
