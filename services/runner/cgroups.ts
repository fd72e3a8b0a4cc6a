// A memory and pids cgroup per sandbox, where the host lets skiff make them:
// cgroup v1 (the memory and pids hierarchies) or v2 (a unified hierarchy in
// which skiff may enable both controllers for a child of its own cgroup).
// Every sandbox's cgroup lives under one `skiff-<pid>-<pid namespace>` folder
// next to skiff's own cgroup; the sandbox's first process (bwrap, or the
// launch script before it) joins it as it is spawned, before it can fork, so
// everything of the sandbox is counted, and nothing of it is ever outside.
// The limits then hold for the replica as a whole (all its processes, and the
// pages of its tmpfs folders), where the rlimits (sandbox.ts) count per
// process or per uid.
//
// A skiff process that is killed (SIGKILL, a crash) cannot remove its
// cgroups, and a sandbox's processes may outlive it (one still starting,
// before bwrap's --die-with-parent holds, or bwrap's child left waiting for
// a uid map its dead parent never wrote). The next skiff to start in the
// same pid namespace ends them and removes the folders, empty ones too
// (reapLeftovers).
import { randomBytes } from "node:crypto";
import { existsSync, mkdirSync, readdirSync, readFileSync, readlinkSync, rmdirSync, writeFileSync } from "node:fs";
import { rmdir } from "node:fs/promises";
import path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";

/** Where skiff says what it found (a pino Logger is one). */
export interface WarnLogger {
  warn(obj: object, msg: string): void;
  info(obj: object, msg: string): void;
}

export interface CgroupLimits {
  memoryBytes: number;
  pids: number;
  /** CPUs its processes may use together (a CFS quota), where the cpu controller is there; undefined: none. */
  cpus?: number;
}

/** The CFS period of a CPU quota, µs: a quota of `cpus` CPUs is cpus × this per period. */
const CPU_PERIOD_US = 100_000;
const cpuQuota = (cpus: number) => Math.max(1000, Math.round(cpus * CPU_PERIOD_US));

/** One sandbox's cgroup (a folder per hierarchy with v1). */
export interface SandboxCgroup {
  /** Moves a process (the sandbox's first) into it; its later children follow. */
  join(pid: number): void;
  /** Whether the kernel's OOM killer ended one of its processes. */
  oomKilled(): boolean;
  /** Removes it once its processes are gone (retried while the kernel finishes them). */
  remove(): Promise<void>;
}

/**
 * Puts a process just spawned (that has started nothing yet) into `cgroup`,
 * or kills it when it cannot: undefined, or why not.
 */
export function joinOrKill(
  cgroup: SandboxCgroup,
  child: { pid?: number; kill(signal: NodeJS.Signals): boolean },
): string | undefined {
  if (child.pid === undefined) return undefined; // not spawned: its "error" says why
  try {
    cgroup.join(child.pid);
    return undefined;
  } catch (err) {
    child.kill("SIGKILL");
    return (err as Error).message || "the write to its cgroup.procs failed";
  }
}

export interface Cgroups {
  version: 1 | 2;
  /** Where the sandboxes' cgroups go (one folder per hierarchy). */
  parents: string[];
  create(name: string, limits: CgroupLimits): SandboxCgroup;
}

interface Mount {
  root: string;
  point: string;
  type: string;
  options: string[];
}

function mounts(): Mount[] {
  const out: Mount[] = [];
  for (const line of readFileSync("/proc/self/mountinfo", "utf8").split("\n")) {
    const [left, right] = line.split(" - ");
    if (!right) continue;
    const f = left.split(" ");
    const [type, , options] = right.split(" ");
    out.push({ root: f[3], point: f[4].replace(/\\040/g, " "), type, options: (options ?? "").split(",") });
  }
  return out;
}

/** This process's cgroup per hierarchy: "memory" → "/a/b", "" (v2) → "/c". */
function ownCgroups(): Map<string, string> {
  const out = new Map<string, string>();
  for (const line of readFileSync("/proc/self/cgroup", "utf8").split("\n")) {
    const m = /^\d+:([^:]*):(.*)$/.exec(line);
    if (!m) continue;
    for (const controller of m[1] === "" ? [""] : m[1].split(",")) out.set(controller, m[2]);
  }
  return out;
}

/** The folder of this process's cgroup in a mounted hierarchy. */
function ownFolder(mount: Mount, cgroup: string): string | undefined {
  const root = mount.root === "/" ? "" : mount.root;
  if (root && cgroup !== root && !cgroup.startsWith(`${root}/`)) return undefined;
  return path.join(mount.point, cgroup.slice(root.length));
}

/** This process's pid namespace (the inode of /proc/self/ns/pid); undefined where it cannot be read. */
function pidNamespace(): string | undefined {
  try {
    return /\[(\d+)\]/.exec(readlinkSync("/proc/self/ns/pid"))?.[1];
  } catch {
    return undefined;
  }
}

/**
 * The folder of this process's sandboxes' cgroups: `skiff-<pid>-<pid
 * namespace>`. A pid means something in its own namespace only, and skiff
 * processes in nested namespaces (a container given the host's cgroupfs) may
 * share these folders: the next start judges only those of its own
 * namespace (otherSkiffFolders).
 */
export function skiffFolderName(): string {
  const ns = pidNamespace();
  return ns === undefined ? `skiff-${process.pid}` : `skiff-${process.pid}-${ns}`;
}

/**
 * The skiff folders in `base` of other processes of this pid namespace than
 * this one, by pid: `skiff-<pid>-<namespace>`, and `skiff-<pid>` as earlier
 * versions named them. Those of another namespace are left to the next start
 * in that namespace, which can tell whether their owner is gone.
 */
function otherSkiffFolders(base: string): Map<number, string> {
  const ns = pidNamespace();
  const out = new Map<number, string>();
  for (const name of readdirSync(base)) {
    const m = /^skiff-(\d+)(?:-(\d+))?$/.exec(name);
    if (!m || Number(m[1]) === process.pid || (m[2] !== undefined && m[2] !== ns)) continue;
    out.set(Number(m[1]), path.join(base, name));
  }
  return out;
}

const write = (file: string, value: string) => writeFileSync(file, value);

function readCount(file: string, key: string): number {
  try {
    const m = new RegExp(`^${key} (\\d+)$`, "m").exec(readFileSync(file, "utf8"));
    return m ? Number(m[1]) : 0;
  } catch {
    return 0;
  }
}

async function removeDirs(dirs: string[]): Promise<void> {
  for (const dir of dirs) {
    for (let attempt = 0; ; attempt++) {
      try {
        await rmdir(dir);
        break;
      } catch (err) {
        const code = (err as NodeJS.ErrnoException).code;
        if (code === "ENOENT" || attempt >= 100) break;
        await sleep(20); // EBUSY: its last processes are being reaped
      }
    }
  }
}

/** A live process's start, in clock ticks since boot (/proc/<pid>/stat); undefined once it is gone or a zombie. */
function startOf(pid: number): number | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // After the command (in parentheses, it may hold spaces) come the state (field 3) … starttime (field 22).
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return fields[0] === "Z" || fields[0] === "X" ? undefined : Number(fields[19]);
  } catch {
    return undefined;
  }
}

/** A cgroup folder and every folder below it, the deepest first (the order rmdir needs). */
function subtree(dir: string): string[] {
  const below = readdirSync(dir, { withFileTypes: true })
    .filter((e) => e.isDirectory())
    .flatMap((e) => subtree(path.join(dir, e.name)));
  return [...below, dir];
}

/** The processes in cgroup folders (cgroup.procs); 0 stands for one this process's pid namespace does not see. */
function processesIn(dirs: string[]): number[] {
  return dirs.flatMap((dir) => {
    try {
      return readFileSync(path.join(dir, "cgroup.procs"), "utf8").split("\n").filter(Boolean).map(Number);
    } catch {
      return []; // removed meanwhile
    }
  });
}

/**
 * Whether the skiff process that made `skiff-<pid>` is gone: no live process
 * has that pid, or the one that has it started after a process in those
 * cgroups (which that skiff started), so the pid has been reused.
 */
function ownerGone(pid: number, processes: number[]): boolean {
  const started = startOf(pid);
  return started === undefined || processes.some((p) => (startOf(p) ?? Infinity) < started);
}

/**
 * Kills the processes in a skiff process's cgroups (`tops`, and `dirs`: every
 * folder in them) until none is left or `ms` have passed, again each round
 * for those forked meanwhile: with v2's cgroup.kill where the kernel has it,
 * else one by one. Returns how many it killed and those still there.
 */
async function killAll(tops: string[], dirs: string[], ms: number): Promise<{ killed: number; left: number[] }> {
  const killed = new Set<number>();
  const deadline = Date.now() + ms;
  for (;;) {
    const left = processesIn(dirs);
    if (left.length === 0 || Date.now() >= deadline) return { killed: killed.size, left };
    for (const p of left) killed.add(p);
    const groupKill = tops.filter((top) => existsSync(path.join(top, "cgroup.kill")));
    for (const top of groupKill) write(path.join(top, "cgroup.kill"), "1");
    if (groupKill.length === 0)
      for (const p of left)
        try {
          process.kill(p, "SIGKILL");
        } catch {
          // gone meanwhile
        }
    await sleep(20);
  }
}

/** What reapLeftovers found and did. */
export interface Reaped {
  /** Skiff processes that were gone and left cgroups. */
  skiffs: number;
  /** Processes killed in those cgroups. */
  processes: number;
  /** Cgroup folders removed. */
  folders: number;
}

/**
 * Ends the sandboxes of skiff processes that are gone and removes their
 * cgroups. `bases` are the folders that hold the `skiff-<pid>` folders, one per
 * hierarchy (next to this process's cgroup). This process's own folder and
 * those of live skiff processes are left alone (see ownerGone). Errors are
 * logged, never thrown: a leftover not ended now is tried again at the next start.
 */
export async function reapLeftovers(bases: string[], logger: WarnLogger): Promise<Reaped> {
  const reaped: Reaped = { skiffs: 0, processes: 0, folders: 0 };
  // One skiff process's `skiff-<pid>` folders (v1: memory and pids), so its processes are judged once.
  const byPid = new Map<number, string[]>();
  for (const base of bases)
    try {
      for (const [pid, dir] of otherSkiffFolders(base)) byPid.set(pid, [...(byPid.get(pid) ?? []), dir]);
    } catch (err) {
      logger.warn({ cgroup: base, err }, "cannot look for cgroups of skiff processes that are gone");
    }
  for (const [pid, tops] of byPid) {
    try {
      const dirs = tops.flatMap(subtree);
      const processes = processesIn(dirs);
      if (!ownerGone(pid, processes)) continue;
      if (processes.includes(0)) {
        logger.warn(
          { skiffPid: pid, cgroups: tops },
          "left alone: cgroups of a skiff process that is gone hold processes of another pid namespace",
        );
        continue;
      }
      const { killed, left } = await killAll(tops, dirs, 2000);
      if (left.length === 0) await removeDirs(dirs);
      const removed = dirs.filter((dir) => !existsSync(dir)).length;
      reaped.skiffs++;
      reaped.processes += killed;
      reaped.folders += removed;
      logger.info(
        { skiffPid: pid, processes: killed, folders: removed, cgroups: tops },
        "ended the sandboxes left by a skiff process that is gone and removed their cgroups",
      );
      if (left.length > 0 || removed < dirs.length)
        logger.warn(
          { skiffPid: pid, processes: left, folders: dirs.length - removed },
          "some processes or cgroups left by a skiff process that is gone remain; tried again at the next start",
        );
    } catch (err) {
      logger.warn({ skiffPid: pid, cgroups: tops, err }, "cannot end the sandboxes of a skiff process that is gone");
    }
  }
  return reaped;
}

function v1(all: Mount[], own: Map<string, string>): Cgroups {
  const hierarchy = (controller: string) => {
    const mount = all.find((m) => m.type === "cgroup" && m.options.includes(controller));
    const cgroup = own.get(controller);
    const folder = mount && cgroup !== undefined ? ownFolder(mount, cgroup) : undefined;
    if (!folder) throw new Error(`no cgroup v1 ${controller} hierarchy of this process is mounted`);
    return folder;
  };
  const [memory, pids] = ["memory", "pids"].map(hierarchy);
  // The cpu hierarchy is optional: without it, a CPU quota is not applied.
  let cpu: string | undefined;
  try {
    cpu = hierarchy("cpu");
  } catch {
    cpu = undefined;
  }
  const parents = [memory, pids, ...(cpu ? [cpu] : [])].map((base) => {
    const dir = path.join(base, skiffFolderName());
    mkdirSync(dir, { recursive: true });
    return dir;
  });
  return {
    version: 1,
    parents,
    create(name, limits) {
      const [mem, pid] = parents.map((p) => path.join(p, name));
      mkdirSync(mem);
      mkdirSync(pid);
      const dirs = [mem, pid];
      try {
        if (limits.cpus !== undefined && parents[2]) {
          const dir = path.join(parents[2], name);
          mkdirSync(dir);
          dirs.push(dir);
          write(path.join(dir, "cpu.cfs_period_us"), String(CPU_PERIOD_US));
          write(path.join(dir, "cpu.cfs_quota_us"), String(cpuQuota(limits.cpus)));
        }
        write(path.join(mem, "memory.limit_in_bytes"), String(limits.memoryBytes));
        // No swap beyond it either, where swap is accounted (memsw must not be below the limit).
        if (existsSync(path.join(mem, "memory.memsw.limit_in_bytes")))
          write(path.join(mem, "memory.memsw.limit_in_bytes"), String(limits.memoryBytes));
        write(path.join(pid, "pids.max"), String(limits.pids));
      } catch (err) {
        void removeDirs(dirs);
        throw err;
      }
      return {
        join(p) {
          for (const dir of dirs) write(path.join(dir, "cgroup.procs"), String(p));
        },
        oomKilled: () => readCount(path.join(mem, "memory.oom_control"), "oom_kill") > 0,
        remove: () => removeDirs(dirs),
      };
    },
  };
}

function v2(all: Mount[], own: Map<string, string>): Cgroups {
  const mount = all.find((m) => m.type === "cgroup2");
  const cgroup = own.get("");
  const base = mount && cgroup !== undefined ? ownFolder(mount, cgroup) : undefined;
  if (!base) throw new Error("no cgroup v2 hierarchy of this process is mounted");
  const controllers = readFileSync(path.join(base, "cgroup.controllers"), "utf8").split(/\s+/);
  for (const c of ["memory", "pids"])
    if (!controllers.includes(c)) throw new Error(`the ${c} controller is not available to skiff's cgroup ${base}`);
  const parent = path.join(base, skiffFolderName());
  mkdirSync(parent, { recursive: true });
  // Fails (EBUSY) where skiff's own cgroup holds processes and is not the root: v2 wants a delegated subtree.
  write(path.join(base, "cgroup.subtree_control"), "+memory +pids");
  write(path.join(parent, "cgroup.subtree_control"), "+memory +pids");
  // The cpu controller is optional: without it, a CPU quota is not applied.
  let cpu = controllers.includes("cpu");
  if (cpu)
    try {
      write(path.join(base, "cgroup.subtree_control"), "+cpu");
      write(path.join(parent, "cgroup.subtree_control"), "+cpu");
    } catch {
      cpu = false;
    }
  return {
    version: 2,
    parents: [parent],
    create(name, limits) {
      const dir = path.join(parent, name);
      mkdirSync(dir);
      try {
        write(path.join(dir, "memory.max"), String(limits.memoryBytes));
        if (existsSync(path.join(dir, "memory.swap.max"))) write(path.join(dir, "memory.swap.max"), "0");
        write(path.join(dir, "pids.max"), String(limits.pids));
        if (limits.cpus !== undefined && cpu)
          write(path.join(dir, "cpu.max"), `${cpuQuota(limits.cpus)} ${CPU_PERIOD_US}`);
      } catch (err) {
        void removeDirs([dir]);
        throw err;
      }
      return {
        join: (p) => write(path.join(dir, "cgroup.procs"), String(p)),
        oomKilled: () => readCount(path.join(dir, "memory.events"), "oom_kill") > 0,
        remove: () => removeDirs([dir]),
      };
    },
  };
}

/**
 * The cgroups skiff can make for its sandboxes here, or why it cannot: v1's
 * memory and pids hierarchies when mounted, else v2's unified one. Making a
 * probe cgroup with both limits is part of the check.
 */
export function detectCgroups(): Cgroups | string {
  let all: Mount[];
  let own: Map<string, string>;
  try {
    all = mounts();
    own = ownCgroups();
  } catch (err) {
    return `cannot read this process's cgroups: ${(err as Error).message}`;
  }
  const hasV1 = all.some((m) => m.type === "cgroup" && m.options.includes("memory"));
  const reasons: string[] = [];
  for (const make of hasV1 ? [v1, v2] : [v2]) {
    try {
      const cgroups = make(all, own);
      // Its sandboxes' cgroups are gone by then (they end with it): the parents go too.
      process.once("exit", () => {
        for (const dir of cgroups.parents)
          try {
            rmdirSync(dir);
          } catch {
            // a cgroup still in it: removed at the next start (reapLeftovers)
          }
      });
      const probe = cgroups.create(`probe-${randomBytes(4).toString("hex")}`, {
        memoryBytes: 64 * 1024 * 1024,
        pids: 16,
      });
      void probe.remove();
      return cgroups;
    } catch (err) {
      reasons.push(`${make === v1 ? "v1" : "v2"}: ${(err as Error).message}`);
    }
  }
  return reasons.join("; ");
}
