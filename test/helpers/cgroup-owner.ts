// A stand-in for a skiff process that owns sandbox cgroups, for tests of the
// reaping of leftovers (services/runner/cgroups.ts reapLeftovers).

/**
 * A Node script (`node -e`) that does what skiff does with its cgroups: makes
 * `skiff-<its pid>-<its pid namespace>/sandbox-1` (cgroups.ts skiffFolderName)
 * in each folder of the JSON list in BASES, puts a `sleep 600` it started in
 * it, prints `owner <its pid> <the sleep's pid> <the folder's name>` and waits.
 */
export const CGROUP_OWNER_SCRIPT = `
const { spawn } = require("node:child_process");
const { mkdirSync, readlinkSync, writeFileSync } = require("node:fs");
const path = require("node:path");
const sleeper = spawn("sleep", ["600"], { stdio: "ignore" });
const folder = "skiff-" + process.pid + "-" + /\\[(\\d+)\\]/.exec(readlinkSync("/proc/self/ns/pid"))[1];
for (const base of JSON.parse(process.env.BASES)) {
  const dir = path.join(base, folder, "sandbox-1");
  mkdirSync(dir, { recursive: true });
  writeFileSync(path.join(dir, "cgroup.procs"), String(sleeper.pid));
}
console.log("owner " + process.pid + " " + sleeper.pid + " " + folder);
setInterval(() => {}, 1 << 30);
`;

/** The owner's pid (in its pid namespace), its sleep's (in its own) and its folder's name, from its line. */
export function ownerLine(line: string): { owner: number; sleeper: number; folder: string } {
  const m = /^owner (\d+) (\d+) (skiff-\d+-\d+)$/.exec(line);
  if (!m) throw new Error(`not an owner's line: ${JSON.stringify(line)}`);
  return { owner: Number(m[1]), sleeper: Number(m[2]), folder: m[3] };
}
