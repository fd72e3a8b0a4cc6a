// A memory and pids cgroup per sandbox, where the host lets skiff make them:
// cgroup v1 (the memory and pids hierarchies) or v2 (a unified hierarchy in
// which skiff may enable both controllers for a child of its own cgroup).
// Every sandbox's cgroup lives under one `skiff-<pid>` folder next to skiff's
// own cgroup; a sandbox's first process joins it before its command runs, so
// everything the command starts is counted. The limits then hold for the
// replica as a whole (all its processes, and the pages of its tmpfs folders),
// where the rlimits (sandbox.ts) count per process or per uid.
import { existsSync, mkdirSync, readdirSync, readFileSync, rmdirSync, writeFileSync } from "node:fs";
import { rmdir } from "node:fs/promises";
import path from "node:path";

export interface CgroupLimits {
  memoryBytes: number;
  pids: number;
}

/** One sandbox's cgroup (a folder per hierarchy with v1). */
export interface SandboxCgroup {
  /** Moves a process (the sandbox's first) into it; its later children follow. */
  join(pid: number): void;
  /** Whether the kernel's OOM killer ended one of its processes. */
  oomKilled(): boolean;
  /** Removes it once its processes are gone (retried while the kernel finishes them). */
  remove(): Promise<void>;
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

/** Removes empty `skiff-<pid>` folders of processes that are gone, and their empty children. */
function removeStale(base: string): void {
  for (const name of readdirSync(base)) {
    const m = /^skiff-(\d+)$/.exec(name);
    if (!m || Number(m[1]) === process.pid || existsSync(`/proc/${m[1]}`)) continue;
    const dir = path.join(base, name);
    try {
      for (const child of readdirSync(dir, { withFileTypes: true }))
        if (child.isDirectory()) rmdirSync(path.join(dir, child.name));
      rmdirSync(dir);
    } catch {
      // still in use: left for its own process
    }
  }
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
        await new Promise((r) => setTimeout(r, 20)); // EBUSY: its last processes are being reaped
      }
    }
  }
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
  const parents = [memory, pids].map((base) => {
    removeStale(base);
    const dir = path.join(base, `skiff-${process.pid}`);
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
  removeStale(base);
  const parent = path.join(base, `skiff-${process.pid}`);
  mkdirSync(parent, { recursive: true });
  // Fails (EBUSY) where skiff's own cgroup holds processes and is not the root: v2 wants a delegated subtree.
  write(path.join(base, "cgroup.subtree_control"), "+memory +pids");
  write(path.join(parent, "cgroup.subtree_control"), "+memory +pids");
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
            // a cgroup still in it: removed at the next start (removeStale)
          }
      });
      const probe = cgroups.create(`probe-${Date.now()}`, { memoryBytes: 64 * 1024 * 1024, pids: 16 });
      void probe.remove();
      return cgroups;
    } catch (err) {
      reasons.push(`${make === v1 ? "v1" : "v2"}: ${(err as Error).message}`);
    }
  }
  return reasons.join("; ");
}
