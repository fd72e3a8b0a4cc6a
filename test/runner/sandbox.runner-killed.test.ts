// A runner killed while a sandbox is starting leaves nothing running: bwrap
// goes on at the end of its block fd as at a byte, before its parent-death
// signal is set, so the command would run with no cgroup and no runner; the
// gate in front of the command (sandbox.ts) ends it instead. Real bwrap, real
// processes: a runner process starts a sandbox and is SIGKILLed, before and
// after it released it. Needs a block fd: a cgroup per sandbox, or else
// slirp4netns; skipped, with the reason, on a host with neither.
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync } from "node:fs";
import { chmod, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { detectCgroups } from "../../services/runner/cgroups.js";
import { SandboxHost } from "../../services/runner/sandbox-host.js";
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
  args: ["-c", "echo ran > /app/ran; exec sleep 600"],
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

/** Runs a runner to its SIGKILL; the app folder it used. */
async function killedRunner(mode: "starting" | "running"): Promise<string> {
  const dir = await mkdtemp(path.join(tmp, `${mode}-`));
  await chmod(dir, 0o777);
  const runner = spawn(process.execPath, ["--import", "tsx", "--input-type=module", "-e", RUNNER], {
    cwd: ROOT,
    env: { ...process.env, APP_DIR: dir, MODE: mode, NETWORK: network },
    stdio: ["ignore", "inherit", "inherit"],
  });
  runners.push(runner);
  const [, signal] = await new Promise<[number | null, string | null]>((resolve) =>
    runner.once("exit", (code, sig) => resolve([code, sig])),
  );
  expect(signal).toBe("SIGKILL");
  return dir;
}

/** Waits up to 5 s for the processes of `dir` to be gone; those left. */
async function leftOf(dir: string): Promise<number[]> {
  for (let i = 0; i < 100; i++) {
    const left = await hostProcessesWith(dir);
    if (left.length === 0) return left;
    await sleep(50);
  }
  return hostProcessesWith(dir);
}

describe.skipIf(!usable)("a runner killed while its sandbox starts", () => {
  beforeAll(async () => {
    tmp = await mkdtemp(path.join(tmpdir(), "skiff-runner-killed-"));
  });
  afterAll(async () => {
    for (const r of runners) if (r.exitCode === null && r.signalCode === null) r.kill("SIGKILL");
    for (const pid of await hostProcessesWith(tmp)) process.kill(pid, "SIGKILL");
    await rm(tmp, { recursive: true, force: true });
  });

  it("before releasing it: the command never runs and nothing of the sandbox is left", async () => {
    const dir = await killedRunner("starting");
    expect(await leftOf(dir)).toEqual([]);
    expect(existsSync(path.join(dir, "ran"))).toBe(false);
  });

  it("after releasing it: the command ran, and the sandbox ends with its runner", async () => {
    const dir = await killedRunner("running");
    expect(existsSync(path.join(dir, "ran"))).toBe(true);
    expect(await leftOf(dir)).toEqual([]);
  });
});
