// The skiff process as `npm start` runs it.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { startNatsServer, type TestNats } from "../helpers/nats-server.js";
import { SKIFF_SERVER, TEST_ROOT } from "../helpers/paths.js";

const root = join(TEST_ROOT, "..");

function startMain(env: Record<string, string>, args: string[] = []): ChildProcess {
  return spawn(process.execPath, [SKIFF_SERVER, ...args], {
    cwd: root,
    env: { PATH: process.env.PATH, HOME: process.env.HOME, CI: "1", ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
}

/**
 * Resolves with the first JSON log line that matches; one that never comes fails with the lines the process
 * printed meanwhile (its last 40), to say what it did instead.
 */
function logLine(
  child: ChildProcess,
  match: (line: Record<string, unknown>) => boolean,
): Promise<Record<string, unknown>> {
  return new Promise((resolve, reject) => {
    const seen: string[] = [];
    const lines = createInterface({ input: child.stdout! });
    lines.on("line", (text) => {
      if (seen.push(text) > 40) seen.shift();
      try {
        const line = JSON.parse(text);
        if (match(line)) resolve(line);
      } catch {
        // not a log line
      }
    });
    child.once("exit", (code) =>
      reject(new Error(`exited with ${code} before the expected log line; it printed:\n${seen.join("\n")}`)),
    );
  });
}

function exited(child: ChildProcess): Promise<number | null> {
  return new Promise((resolve) => child.once("exit", (code) => resolve(code)));
}

/** Starts skiff with `env`, waits until it serves, sends `signal` and resolves with its exit code. */
async function servesThenStops(env: Record<string, string>, signal: NodeJS.Signals): Promise<number | null> {
  const child = startMain(env);
  await logLine(child, (l) => String(l.msg).startsWith("skiff serves"));
  const code = exited(child);
  child.kill(signal);
  return code;
}

describe("skiff process", () => {
  let nats: TestNats;
  let dataDir: string;
  beforeAll(async () => {
    nats = await startNatsServer();
    dataDir = mkdtempSync(join(tmpdir(), "skiff-main-"));
  });
  afterAll(async () => {
    await nats?.stop();
    rmSync(dataDir, { recursive: true, force: true });
  });

  it("starts, logs the address it serves as JSON, answers /healthz, and exits 0 on SIGTERM", async () => {
    const child = startMain({ SKIFF_NATS_URL: nats.url, SKIFF_PORT: "0", SKIFF_DATA_DIR: dataDir });
    const ready = await logLine(child, (l) => String(l.msg).startsWith("skiff serves"));
    expect(ready.roles).toEqual(["invocation", "management", "webhook", "runner"]);
    const res = await fetch(`${ready.url}/healthz`);
    expect(res.status).toBe(200);
    child.kill("SIGTERM");
    expect(await exited(child)).toBe(0);
  });

  it("Ctrl-C in a terminal (SIGINT to skiff's process group) stops it cleanly, its own nats-server last", async () => {
    const own = mkdtempSync(join(tmpdir(), "skiff-main-ctrl-c-"));
    let child: ChildProcess | undefined;
    try {
      // A group of its own, as a shell's foreground job: the signal goes to every process in it.
      child = spawn(process.execPath, [SKIFF_SERVER], {
        cwd: root,
        env: { PATH: process.env.PATH, HOME: process.env.HOME, CI: "1", SKIFF_PORT: "0", SKIFF_DATA_DIR: own },
        stdio: ["ignore", "pipe", "pipe"],
        detached: true,
      });
      const lines: Record<string, unknown>[] = [];
      createInterface({ input: child.stdout! }).on("line", (text) => {
        try {
          lines.push(JSON.parse(text));
        } catch {
          // not a log line
        }
      });
      const started = await logLine(child, (l) => String(l.msg).startsWith("started nats-server"));
      await logLine(child, (l) => String(l.msg).startsWith("skiff serves"));
      // The server is not in the group, so the signal reaches skiff alone, whose stop still writes to NATS (its
      // replicas' records, the runs under way) and ends the server last: before, the server went first and
      // the stop waited on a lost connection (13 s, "NATS disconnected", KV timeouts).
      const group = (pid: number) => Number(readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1].split(" ")[2]);
      expect(group(started.serverPid as number)).not.toBe(group(child.pid!));
      const code = exited(child);
      process.kill(-child.pid!, "SIGINT");
      expect(await code).toBe(0);
      const complaints = lines
        .filter((l) => Number(l.level) >= 40 && /nats|disconnect|timeout/i.test(JSON.stringify(l)))
        .map((l) => l.msg);
      expect(complaints).toEqual([]);
      // And it did not outlive skiff.
      await vi.waitFor(() => expect(() => process.kill(started.serverPid as number, 0)).toThrow(), { timeout: 10_000 });
    } finally {
      // A failed expectation leaves nothing running: the group, and the server of the data folder.
      if (child?.exitCode === null && child.signalCode === null) process.kill(-child.pid!, "SIGKILL");
      rmSync(own, { recursive: true, force: true });
    }
  });

  it("--roles picks a subset: a webhook-only process serves probes but no management API", async () => {
    const child = startMain({ SKIFF_NATS_URL: nats.url, SKIFF_PORT: "0", SKIFF_DATA_DIR: dataDir }, [
      "--roles",
      "webhook",
    ]);
    const ready = await logLine(child, (l) => String(l.msg).startsWith("skiff serves"));
    expect(ready.roles).toEqual(["webhook"]);
    expect((await fetch(`${ready.url}/healthz`)).status).toBe(200);
    expect((await fetch(`${ready.url}/v2/projects`)).status).toBe(404);
    child.kill("SIGTERM");
    expect(await exited(child)).toBe(0);
  });

  it("a stop that cannot finish ends at SKIFF_STOP_DEADLINE_MS with exit code 1, naming what it waited for", async () => {
    // A NATS server of its own, frozen (SIGSTOP) once skiff runs: the stop's drain can never finish.
    const frozen = await startNatsServer();
    try {
      const child = startMain({
        SKIFF_NATS_URL: frozen.url,
        SKIFF_PORT: "0",
        SKIFF_DATA_DIR: dataDir,
        SKIFF_ROLES: "webhook",
        SKIFF_SHUTDOWN_TIMEOUT_MS: "500",
        SKIFF_STOP_DEADLINE_MS: "2000",
      });
      await logLine(child, (l) => String(l.msg).startsWith("skiff serves"));
      await frozen.freeze();
      const overrun = logLine(child, (l) => String(l.msg).startsWith("stop deadline passed"));
      const code = exited(child);
      const sent = Date.now();
      child.kill("SIGTERM");
      const line = await overrun;
      expect(await code).toBe(1);
      expect(Date.now() - sent).toBeLessThan(6_000);
      expect(line.level).toBe(50);
      expect(line.waitingFor).toEqual([expect.stringContaining(`NATS: draining the connection to ${frozen.url}`)]);
      expect(line.msg).toContain("SKIFF_STOP_DEADLINE_MS=2000");
    } finally {
      frozen.thaw();
      await frozen.stop();
    }
  });

  it("a second skiff on a data folder in use stops before it touches it; the first goes on with its nats-server", async () => {
    const own = mkdtempSync(join(tmpdir(), "skiff-main-twice-"));
    const env = { SKIFF_PORT: "0", SKIFF_DATA_DIR: own, SKIFF_ROLES: "management" };
    const first = startMain(env);
    try {
      const started = await logLine(first, (l) => String(l.msg).startsWith("started nats-server"));
      const ready = await logLine(first, (l) => String(l.msg).startsWith("skiff serves"));
      // Another port even: the folder alone decides.
      const second = startMain(env);
      let stderr = "";
      second.stderr!.on("data", (d) => (stderr += d));
      expect(await exited(second)).toBe(1);
      expect(stderr).toContain(`the data folder ${own} is in use by another skiff (pid ${first.pid})`);
      expect(stderr).toContain("SKIFF_DATA_DIR");
      // Before, the second start took the first's nats-server for a crash's leftover and stopped it.
      expect(() => process.kill(started.serverPid as number, 0)).not.toThrow();
      const health = await fetch(`${ready.url}/healthz`);
      expect(health.status).toBe(200);
      const code = exited(first);
      first.kill("SIGTERM");
      expect(await code).toBe(0);
      // Given up at the stop: the folder is free again.
      expect(await servesThenStops(env, "SIGTERM")).toBe(0);
    } finally {
      if (first.exitCode === null && first.signalCode === null) first.kill("SIGKILL");
      rmSync(own, { recursive: true, force: true });
    }
  });

  it("its nats-server ending on its own ends skiff with exit code 1, saying so; a skiff killed leaves its folder free", async () => {
    const own = mkdtempSync(join(tmpdir(), "skiff-main-nats-gone-"));
    const env = { SKIFF_PORT: "0", SKIFF_DATA_DIR: own, SKIFF_ROLES: "management" };
    try {
      const child = startMain(env);
      const started = await logLine(child, (l) => String(l.msg).startsWith("started nats-server"));
      await logLine(child, (l) => String(l.msg).startsWith("skiff serves"));
      let stderr = "";
      child.stderr!.on("data", (d) => (stderr += d));
      const fatal = logLine(child, (l) => l.level === 60);
      const code = exited(child);
      process.kill(started.serverPid as number, "SIGKILL");
      expect((await fatal).msg).toContain(
        `the nats-server this skiff started (pid ${started.serverPid}) ended on its own`,
      );
      expect(await code).toBe(1);
      expect(stderr).toContain("skiff cannot go on without it");
      // A skiff killed outright holds nothing: the kernel let go of its lock.
      await servesThenStops(env, "SIGKILL");
      expect(await servesThenStops(env, "SIGTERM")).toBe(0);
    } finally {
      rmSync(own, { recursive: true, force: true });
    }
  });

  it.each([
    [{ SKIFF_PORT: "eighty" }, [], /SKIFF_PORT/],
    [
      { SKIFF_STOP_DEADLINE_MS: "5000", SKIFF_SHUTDOWN_TIMEOUT_MS: "5000" },
      [],
      /SKIFF_STOP_DEADLINE_MS: must be more than SKIFF_SHUTDOWN_TIMEOUT_MS/,
    ],
    [{}, ["--roles", "chef"], /--roles: unknown role "chef"/],
    [{ SKIFF_NATS_USER: "skiff" }, [], /SKIFF_NATS_PASSWORD: SKIFF_NATS_USER is set but SKIFF_NATS_PASSWORD is not/],
  ])("a bad setting %j %j stops it with exit code 2 and a message naming it", async (env, args, message) => {
    const child = startMain(env as Record<string, string>, args as string[]);
    let stderr = "";
    child.stderr!.on("data", (d) => (stderr += d));
    expect(await exited(child)).toBe(2);
    expect(stderr).toMatch(message);
  });
});
