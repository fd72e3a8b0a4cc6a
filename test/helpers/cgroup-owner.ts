// A stand-in for a skiff process that owns sandbox cgroups, for tests of the
// reaping of leftovers (services/runner/cgroups.ts reapLeftovers).

/**
 * A Node script (`node -e`) that does what skiff does with its cgroups: makes
 * `skiff-<its pid>/sandbox-1` in each folder of the JSON list in BASES, puts a
 * `sleep 600` it started in it, prints `owner <its pid> <the sleep's pid>` and
 * waits.
 */
export const CGROUP_OWNER_SCRIPT = `
const { spawn } = require("node:child_process");
const { mkdirSync, writeFileSync } = require("node:fs");
const path = require("node:path");
const sleeper = spawn("sleep", ["600"], { stdio: "ignore" });
for (const base of JSON.parse(process.env.BASES)) {
  const dir = path.join(base, "skiff-" + process.pid, "sandbox-1");
  mkdirSync(dir, { recursive: true });
  writeFileSync(path.join(dir, "cgroup.procs"), String(sleeper.pid));
}
console.log("owner " + process.pid + " " + sleeper.pid);
setInterval(() => {}, 1 << 30);
`;

/** The owner's pid (in its pid namespace) and its sleep's (in the reader's) from its line. */
export function ownerLine(line: string): { owner: number; sleeper: number } {
  const m = /^owner (\d+) (\d+)$/.exec(line);
  if (!m) throw new Error(`not an owner's line: ${JSON.stringify(line)}`);
  return { owner: Number(m[1]), sleeper: Number(m[2]) };
}
