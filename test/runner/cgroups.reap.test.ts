// The sandboxes of a skiff process that was killed outlive it until the next
// skiff starts and ends them (reapLeftovers, services/runner/cgroups.ts).
// Real cgroups, real processes: an owner process makes a sandbox's cgroup
// and puts a process of its own in it, then is SIGKILLed. The folders go in
// `reap-test-<pid>` folders next to this process's cgroup, so that only what
// the test made is reaped. Skipped, with the reason, on a host that has no
// cgroups for skiff.
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { mkdir, readdir, readFile, rmdir, writeFile } from "node:fs/promises";
import { createInterface } from "node:readline";
import path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { detectCgroups, reapLeftovers } from "../../services/runner/cgroups.js";
import { machineCan } from "../helpers/machine.js";
import { CGROUP_OWNER_SCRIPT, ownerLine } from "../helpers/cgroup-owner.js";

const found = detectCgroups();
const usable = machineCan("sandbox-reap", typeof found === "string" ? `no cgroups for skiff (${found})` : undefined);

/** The test's own folders, one per hierarchy, in which the `skiff-<pid>` folders go. */
let bases: string[] = [];
/** The processes the test started itself, ended at the end (with those in its folders). */
const children: ChildProcess[] = [];

function startSleep(): number {
  const child = spawn("sleep", ["600"], { stdio: "ignore" });
  children.push(child);
  return child.pid!;
}

async function startOwner(): Promise<{ owner: ChildProcess; sleeper: number; folder: string }> {
  const owner = spawn(process.execPath, ["-e", CGROUP_OWNER_SCRIPT], {
    env: { ...process.env, BASES: JSON.stringify(bases) },
    stdio: ["ignore", "pipe", "inherit"],
  });
  children.push(owner);
  const line = await new Promise<string>((resolve) => createInterface({ input: owner.stdout! }).once("line", resolve));
  const { sleeper, folder } = ownerLine(line);
  return { owner, sleeper, folder };
}

/** Makes `<folder>/sandbox-1` in each base and moves `pid` into it, as an owner does. */
async function sandboxOf(folder: string, pid: number): Promise<void> {
  for (const base of bases) {
    const dir = path.join(base, folder, "sandbox-1");
    await mkdir(dir, { recursive: true });
    await writeFile(path.join(dir, "cgroup.procs"), String(pid));
  }
}

/** Whether a process is still running (neither gone nor a zombie). */
function alive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return !/^[ZX]$/.test(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0]);
  } catch {
    return false;
  }
}

const folders = (folder: string) =>
  bases.flatMap((base) => [folder, `${folder}/sandbox-1`].map((d) => path.join(base, d)));

async function processesIn(dir: string): Promise<number[]> {
  return (await readFile(path.join(dir, "cgroup.procs"), "utf8")).split("\n").filter(Boolean).map(Number);
}

/** Removes a cgroup folder of the test and those below it, ending the processes in them (the test's) first. */
async function removeTree(dir: string): Promise<void> {
  if (!existsSync(dir)) return;
  for (const entry of await readdir(dir, { withFileTypes: true }))
    if (entry.isDirectory()) await removeTree(path.join(dir, entry.name));
  for (const pid of await processesIn(dir))
    try {
      process.kill(pid, "SIGKILL");
    } catch (err) {
      // Ended between the listing and the kill (the children killed just before, being reaped).
      if ((err as NodeJS.ErrnoException).code !== "ESRCH") throw err;
    }
  for (let attempt = 0; ; attempt++)
    try {
      await rmdir(dir);
      return;
    } catch (err) {
      if (attempt >= 100) throw err;
      await sleep(50); // EBUSY: a killed process is still being reaped
    }
}

describe.skipIf(!usable)("leftovers of a skiff process that was killed", () => {
  beforeAll(async () => {
    if (typeof found === "string") return;
    bases = found.parents.map((p) => path.join(path.dirname(p), `reap-test-${process.pid}`));
    for (const base of bases) await mkdir(base);
  });
  afterAll(async () => {
    for (const child of children) child.kill("SIGKILL"); // nothing for those that have exited
    for (const base of bases) await removeTree(base);
  });

  it("ends its sandboxes' processes and removes its folders, leaving those of live skiff processes alone", async () => {
    const dead = await startOwner();
    const live = await startOwner();
    // This process's own folder, with a process in it.
    const own = startSleep();
    await sandboxOf(`skiff-${process.pid}`, own);
    // A folder whose pid has been reused: that process started after the one in the folder (named as
    // earlier versions named it: `skiff-<pid>`, no pid namespace).
    const early = startSleep();
    await sleep(100);
    const reuser = startSleep();
    await sandboxOf(`skiff-${reuser}`, early);

    dead.owner.kill("SIGKILL");
    await new Promise((resolve) => dead.owner.once("exit", resolve));
    expect(alive(dead.sleeper)).toBe(true); // outlived its owner

    const logged: object[] = [];
    const reaped = await reapLeftovers(bases, {
      info: (obj) => logged.push(obj),
      warn: (obj, msg) => logged.push({ ...obj, warning: msg }),
    });

    expect(alive(dead.sleeper)).toBe(false);
    expect(alive(early)).toBe(false);
    for (const dir of [...folders(dead.folder), ...folders(`skiff-${reuser}`)]) expect(existsSync(dir)).toBe(false);
    expect(reaped).toEqual({ skiffs: 2, processes: 2, folders: 2 * 2 * bases.length });
    expect(logged).toEqual(
      expect.arrayContaining([
        expect.objectContaining({ skiffPid: dead.owner.pid, processes: 1, folders: 2 * bases.length }),
        expect.objectContaining({ skiffPid: reuser, processes: 1, folders: 2 * bases.length }),
      ]),
    );
    expect(logged.filter((l) => "warning" in l)).toEqual([]);

    // A live owner's sandbox and this process's own are left as they were.
    for (const [folder, pid] of [
      [live.folder, live.sleeper],
      [`skiff-${process.pid}`, own],
    ] as const) {
      expect(alive(pid)).toBe(true);
      for (const dir of folders(folder)) expect(existsSync(dir)).toBe(true);
      for (const base of bases) expect(await processesIn(path.join(base, folder, "sandbox-1"))).toEqual([pid]);
    }
    expect(alive(reuser)).toBe(true);
  });
});
