// One skiff process per data folder (services/data-lock.ts): SQLite's
// exclusive lock on <data>/skiff.lock, held for the process's life. Attacked
// as an operator's slip would (two starts at once, the folder by another
// path) and as a local unprivileged user of the host would (a lock of its
// own on the file, which it can read). A second start must never stop the
// first skiff's nats-server, and nobody but a skiff may keep skiff from
// starting. Real skiff processes (`node bin/skiff-server.js`), each with the
// nats-server it starts in its data folder.
import { spawn, type ChildProcess } from "node:child_process";
import { chmodSync, mkdirSync, mkdtempSync, rmSync, statSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SKIFF_SERVER, TEST_ROOT } from "../helpers/paths.js";
import { alive } from "../helpers/host-processes.js";

const root = join(TEST_ROOT, "..");
/** A uid and gid of nobody's: the local unprivileged user. */
const NOBODY = 65534;

let base: string;
const children: ChildProcess[] = [];

function startMain(env: Record<string, string>): ChildProcess {
  const child = spawn(process.execPath, [SKIFF_SERVER], {
    cwd: root,
    env: { PATH: process.env.PATH, HOME: process.env.HOME, CI: "1", ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  children.push(child);
  return child;
}

/** The first JSON log line that matches; undefined when the process exits first. */
function logLine(
  child: ChildProcess,
  match: (line: Record<string, unknown>) => boolean,
): Promise<Record<string, unknown> | undefined> {
  return new Promise((resolve) => {
    const lines = createInterface({ input: child.stdout! });
    lines.on("line", (text) => {
      try {
        const line = JSON.parse(text);
        if (match(line)) resolve(line);
      } catch {
        // not a log line
      }
    });
    child.once("exit", () => resolve(undefined));
  });
}

function exited(child: ChildProcess): Promise<number | null> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve(child.exitCode);
  return new Promise((resolve) => child.once("exit", (code) => resolve(code)));
}

function stderrOf(child: ChildProcess): () => string {
  let text = "";
  child.stderr!.on("data", (d) => (text += d));
  return () => text;
}

/** A data folder as `npm start` makes it: a new folder in a folder others may enter (the checkout's .data). */
function newDataDir(name: string): string {
  const parent = join(base, name);
  mkdirSync(parent, { mode: 0o755 });
  chmodSync(parent, 0o755);
  return join(parent, ".data");
}

const env = (dataDir: string) => ({ SKIFF_PORT: "0", SKIFF_DATA_DIR: dataDir, SKIFF_ROLES: "management" });

async function stop(child: ChildProcess): Promise<number | null> {
  const code = exited(child);
  child.kill("SIGTERM");
  return code;
}

beforeAll(() => {
  base = mkdtempSync(join(tmpdir(), "skiff-attack-lock-"));
  chmodSync(base, 0o755);
});
afterAll(async () => {
  for (const child of children)
    if (child.exitCode === null && child.signalCode === null) {
      const code = exited(child);
      child.kill("SIGKILL");
      await code;
    }
  rmSync(base, { recursive: true, force: true });
});

describe("attack - one skiff per data folder", () => {
  it("two starts at once: one serves, the other stops; the one serving keeps its nats-server", async () => {
    const dataDir = newDataDir("at-once");
    const a = startMain(env(dataDir));
    const b = startMain(env(dataDir));
    const [servedA, servedB] = await Promise.all([
      logLine(a, (l) => String(l.msg).startsWith("skiff serves")),
      logLine(b, (l) => String(l.msg).startsWith("skiff serves")),
    ]);
    expect([servedA, servedB].filter(Boolean)).toHaveLength(1);
    const [winner, loser] = servedA ? [a, b] : [b, a];
    expect(await exited(loser)).toBe(1);
    const url = String((servedA ?? servedB)!.url);
    // The winner still has NATS: a call that needs it (the admin's project list) answers.
    await new Promise((r) => setTimeout(r, 1_000));
    expect(winner.exitCode).toBeNull();
    expect((await fetch(`${url}/readyz`)).status).toBe(200);
    expect(await stop(winner)).toBe(0);
  }, 60_000);

  it("the same folder by another path (a link to it, a relative path): the second stops, the first's nats-server lives", async () => {
    const dataDir = newDataDir("by-link");
    const first = startMain(env(dataDir));
    const started = await logLine(first, (l) => String(l.msg).startsWith("started nats-server"));
    const served = await logLine(first, (l) => String(l.msg).startsWith("skiff serves"));
    expect(started && served).toBeTruthy();
    const link = join(base, "by-link-alias");
    symlinkSync(dataDir, link);
    for (const other of [
      link,
      `${link}/`,
      join(base, "by-link", ".", ".data"),
      join(base, "by-link", "x", "..", ".data"),
    ]) {
      mkdirSync(join(base, "by-link", "x"), { recursive: true });
      const second = startMain(env(other));
      const err = stderrOf(second);
      expect(await exited(second), err()).toBe(1);
      expect(err()).toContain("is in use by another skiff");
      expect(alive(started!.serverPid as number)).toBe(true);
    }
    expect((await fetch(`${served!.url}/readyz`)).status).toBe(200);
    expect(await stop(first)).toBe(0);
  }, 60_000);

  it("a local unprivileged user who waits for a lock on skiff.lock cannot keep skiff from starting again", async () => {
    const dataDir = newDataDir("nobody");
    const first = startMain(env(dataDir));
    expect(await logLine(first, (l) => String(l.msg).startsWith("skiff serves"))).toBeTruthy();
    const lockFile = join(dataDir, "skiff.lock");
    // What the local user can see of it: `npm start` makes the folder 0755 and SQLite the file 0644.
    const modes = { dir: statSync(dataDir).mode & 0o777, lock: statSync(lockFile).mode & 0o777 };
    // As nobody: open it read-only and wait for a read lock on SQLite's lock bytes (PENDING and SHARED); the
    // kernel grants it the moment skiff's exclusive lock goes, when skiff stops.
    const script = join(base, "hold-lock.py");
    writeFileSync(
      script,
      [
        "import fcntl, os, sys, time",
        "fd = os.open(sys.argv[1], os.O_RDONLY)",
        "print('opened', flush=True)",
        "fcntl.lockf(fd, fcntl.LOCK_SH, 512, 0x40000000, 0)",
        "print('locked', flush=True)",
        "time.sleep(600)",
      ].join("\n"),
    );
    chmodSync(script, 0o644);
    const holder = spawn(
      "/usr/bin/setpriv",
      [`--reuid=${NOBODY}`, `--regid=${NOBODY}`, "--clear-groups", "/usr/bin/python3", script, lockFile],
      { stdio: ["ignore", "pipe", "pipe"] },
    );
    children.push(holder);
    let said = "";
    holder.stdout!.on("data", (d) => (said += d));
    holder.stderr!.on("data", (d) => (said += d));
    await new Promise((r) => setTimeout(r, 1_000));
    try {
      expect(await stop(first)).toBe(0);
      await new Promise((r) => setTimeout(r, 500));
      // The operator starts skiff again.
      const again = startMain(env(dataDir));
      const err = stderrOf(again);
      const served = await logLine(again, (l) => String(l.msg).startsWith("skiff serves"));
      expect(
        served,
        `the data folder (mode ${modes.dir.toString(8)}) and skiff.lock (mode ${modes.lock.toString(8)}) ` +
          `are open to nobody, whose process said ${JSON.stringify(said)}; skiff said: ${err()}`,
      ).toBeTruthy();
      expect(await stop(again)).toBe(0);
    } finally {
      const gone = exited(holder);
      holder.kill("SIGKILL");
      await gone;
    }
  }, 60_000);
});
