// The host's processes as /proc shows them, for tests that check what a
// sandbox or a killed process left behind.
import { readdir, readFile } from "node:fs/promises";

/** Host pids of the processes whose command line contains `marker` (bwrap's names the folders it binds). */
export async function hostProcessesWith(marker: string): Promise<number[]> {
  const found: number[] = [];
  for (const name of await readdir("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    const cmd = await readFile(`/proc/${name}/cmdline`, "latin1").catch(() => "");
    if (cmd.includes(marker)) found.push(Number(name));
  }
  return found;
}

/** Whether a process of that id exists (signal 0 reaches it). */
export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}
