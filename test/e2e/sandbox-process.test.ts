// The sandbox as the skiff process (`npm start`) lives with it: SIGTERM of
// skiff with a `setsid` orphan inside a replica ends cleanly and leaves no
// process behind; a host where the sandbox cannot work stops skiff at start
// with how to fix it, unless SKIFF_SANDBOX=off.
import { spawn, type ChildProcess } from "node:child_process";
import { cp, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { createInterface } from "node:readline";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { packApp } from "../../services/apps/bundle.js";
import { skiffToml } from "../helpers/apps.js";
import { startNatsServer, type TestNats } from "../helpers/nats-server.js";
import { hostProcessesWith } from "../helpers/host-processes.js";
import { SKIFF_SERVER, TEST_ROOT } from "../helpers/paths.js";

const ROOT = path.resolve(TEST_ROOT, "..");
const SHUTDOWN_TIMEOUT_MS = 15_000;
const PYTHON = { kind: "cortex", language: "python", entry: "main.py" } as const;

let nats: TestNats;
let tmp: string;
const children: ChildProcess[] = [];

beforeAll(async () => {
  nats = await startNatsServer();
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-sandbox-process-"));
});
afterAll(async () => {
  for (const c of children) if (c.exitCode === null) c.kill("SIGKILL");
  await nats?.stop();
  await rm(tmp, { recursive: true, force: true });
});

interface Skiff {
  child: ChildProcess;
  /** Every line it wrote, stdout and stderr. */
  output: string[];
  exit: Promise<number | null>;
}

function startMain(env: Record<string, string>): Skiff {
  const child = spawn(process.execPath, [SKIFF_SERVER], {
    cwd: ROOT,
    env: { PATH: process.env.PATH, HOME: process.env.HOME, CI: "1", SKIFF_NATS_URL: nats.url, SKIFF_PORT: "0", ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  children.push(child);
  const output: string[] = [];
  for (const stream of [child.stdout!, child.stderr!])
    createInterface({ input: stream }).on("line", (l) => output.push(l));
  const exit = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  return { child, output, exit };
}

/** The URL it serves, once it says so; rejects if it exits first. */
async function served(s: Skiff): Promise<string> {
  for (;;) {
    const line = s.output.map((l) => JSON.parse(l.startsWith("{") ? l : "{}")).find((l) => l.url && l.roles);
    if (line) return line.url as string;
    if (s.child.exitCode !== null) throw new Error(`skiff exited with ${s.child.exitCode}:\n${s.output.join("\n")}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe("skiff's SIGTERM with a setsid orphan inside a replica", () => {
  it("ends cleanly (exit 0) within its shutdown timeout and leaves no process behind", async () => {
    const dataDir = path.join(tmp, "orphan");
    const s = startMain({ SKIFF_DATA_DIR: dataDir, SKIFF_SHUTDOWN_TIMEOUT_MS: String(SHUTDOWN_TIMEOUT_MS) });
    const url = await served(s);
    const admin = (await readFile(path.join(dataDir, "admin-token"), "utf8")).trim();
    const app = path.join(tmp, "intruder");
    await cp(path.join(ROOT, "test/fixtures/apps/intruder-py"), app, { recursive: true });
    await writeFile(path.join(app, "skiff.toml"), skiffToml({ name: "intruder", runtime: PYTHON }));
    const bundle = await packApp(app);
    const deployed = await fetch(`${url}/v2/projects/p-dev/apps`, {
      method: "POST",
      headers: { authorization: `Bearer ${admin}`, "content-type": "application/gzip" },
      body: bundle.bytes,
    });
    expect(deployed.status, await deployed.clone().text()).toBe(200);
    const marker = `3600.${process.pid}${Math.floor(Math.random() * 1000)}`;
    const res = await fetch(`${url}/v4/p-dev/intruder/orphan`, {
      method: "POST",
      headers: { authorization: `Bearer ${admin}`, "content-type": "application/json" },
      body: JSON.stringify({ marker }),
    });
    expect(res.status, await res.clone().text()).toBe(200);
    await expect.poll(() => hostProcessesWith(marker), { timeout: 30_000 }).toHaveLength(1);

    s.child.kill("SIGTERM");
    const code = await Promise.race([
      s.exit,
      new Promise((r) => setTimeout(() => r("still running"), SHUTDOWN_TIMEOUT_MS)),
    ]);
    expect(code, s.output.slice(-5).join("\n")).toBe(0);
    expect(s.output.some((l) => l.includes('"msg":"stopped"'))).toBe(true);
    // Gone with the sandbox's pid namespace (the kernel may take a moment to release it under load).
    await expect.poll(() => hostProcessesWith(marker), { timeout: 3000 }).toEqual([]);
  }, 90_000);
});

describe("a host where the sandbox cannot work", () => {
  it.each([
    [
      "a bwrap that does not exist",
      "/nonexistent/bwrap",
      /SKIFF_BWRAP names \/nonexistent\/bwrap, which does not exist/,
    ],
    ["a bwrap that fails", "/bin/false", /bwrap fails here: it exited with code 1 and printed nothing/],
  ])(
    "%s: skiff refuses to start, saying how to fix it",
    async (_, bwrap, reason) => {
      const s = startMain({ SKIFF_DATA_DIR: path.join(tmp, "refuse"), SKIFF_BWRAP: bwrap });
      expect(await s.exit).toBe(1);
      // The log's fatal line and the sentence on stderr, each whole on its line (stdout and stderr interleave).
      const log = s.output.find((l) => l.startsWith("{") && l.includes("cannot sandbox apps on this host"));
      const sentence = s.output.find((l) => l.startsWith("skiff: cannot start: cannot sandbox apps on this host"));
      for (const fatal of [log, sentence]) {
        expect(fatal, s.output.join("\n")).toBeDefined();
        expect(fatal).toMatch(reason);
        expect(fatal).toMatch(/apt-get install bubblewrap/);
        expect(fatal).toMatch(/SKIFF_SANDBOX=off/);
      }
    },
    60_000,
  );

  it("with SKIFF_SANDBOX=off it starts, says so loudly, and /readyz says sandbox off", async () => {
    const s = startMain({
      SKIFF_DATA_DIR: path.join(tmp, "off"),
      SKIFF_BWRAP: "/nonexistent/bwrap",
      SKIFF_SANDBOX: "off",
    });
    const url = await served(s);
    expect(s.output.some((l) => l.includes("DEPLOYED APPS RUN UNCONFINED"))).toBe(true);
    expect(await (await fetch(`${url}/readyz`)).json()).toMatchObject({ status: "ready", sandbox: "off" });
    s.child.kill("SIGTERM");
    expect(await s.exit).toBe(0);
  }, 60_000);
});
