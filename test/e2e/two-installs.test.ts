// Two `npm start` on one machine, each with its own data folder and nothing
// else configured, share nothing: each starts a nats-server of its own (never
// one it finds at 127.0.0.1:4222), so keys, tokens, projects and apps are each
// install's own. The CLI reaches each through its data folder alone.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { createInterface } from "node:readline";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runCli } from "../helpers/cli.js";
import { SKIFF_SERVER } from "../helpers/paths.js";

const root = path.resolve(import.meta.dirname, "../..");

interface Install {
  child: ChildProcess;
  dataDir: string;
  url: string;
  natsUrl: string;
  /** The log line saying which NATS server it uses and why. */
  natsHow: string;
  adminToken: string;
  devToken: string;
  exited: Promise<number | null>;
}

/** `npm start` as it runs after its dashboard build: only a data folder and a free port set. */
async function start(): Promise<Install> {
  const dataDir = mkdtempSync(path.join(tmpdir(), "skiff-install-"));
  const child = spawn(process.execPath, [SKIFF_SERVER], {
    cwd: root,
    env: { PATH: process.env.PATH, HOME: process.env.HOME, CI: "1", SKIFF_DATA_DIR: dataDir, SKIFF_PORT: "0" },
    stdio: ["ignore", "pipe", "ignore"],
  });
  const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  const found: { url?: string; natsUrl?: string; natsHow?: string } = {};
  await new Promise<void>((resolve, reject) => {
    const lines = createInterface({ input: child.stdout! });
    lines.on("line", (text) => {
      let line: Record<string, unknown>;
      try {
        line = JSON.parse(text);
      } catch {
        return;
      }
      const msg = String(line.msg);
      if (msg.startsWith("using NATS server")) {
        found.natsUrl = String(line.url);
        found.natsHow = msg;
      }
      if (msg.startsWith("skiff serves")) {
        found.url = String(line.url);
        resolve();
      }
    });
    void exited.then((code) => reject(new Error(`skiff exited with ${code} before it served`)));
  });
  const read = (name: string) => readFileSync(path.join(dataDir, name), "utf8").trim();
  return {
    child,
    dataDir,
    url: found.url!,
    natsUrl: found.natsUrl!,
    natsHow: found.natsHow!,
    adminToken: read("admin-token"),
    devToken: read("dev-token"),
    exited,
  };
}

const projects = async (i: Install, token: string) =>
  fetch(`${i.url}/v2/projects`, { headers: { authorization: `Bearer ${token}` } });

describe("two installs on one machine", () => {
  let a: Install;
  let b: Install;
  beforeAll(async () => {
    [a, b] = await Promise.all([start(), start()]);
  }, 120_000);
  afterAll(async () => {
    for (const i of [a, b]) {
      if (!i) continue;
      if (i.child.exitCode === null) i.child.kill("SIGTERM");
      await i.exited;
      rmSync(i.dataDir, { recursive: true, force: true });
    }
  });

  it("each runs a nats-server of its own, in its data folder, that demands credentials", () => {
    expect(a.natsUrl).not.toBe(b.natsUrl);
    for (const i of [a, b]) {
      expect(i.natsHow).toContain("(started in the data folder)");
      expect(i.natsUrl).not.toBe("nats://127.0.0.1:4222");
      expect(readFileSync(path.join(i.dataDir, "nats", "skiff.nk"), "utf8")).toMatch(/^SU/);
    }
  });

  it("neither accepts the other's admin or project tokens", async () => {
    expect(a.adminToken).not.toBe(b.adminToken);
    expect((await projects(a, a.adminToken)).status).toBe(200);
    expect((await projects(b, b.adminToken)).status).toBe(200);
    expect((await projects(b, a.adminToken)).status).toBe(401);
    expect((await projects(a, b.adminToken)).status).toBe(401);
    expect((await projects(b, a.devToken)).status).toBe(401);
    expect((await projects(a, b.devToken)).status).toBe(401);
  });

  it("a project made in one is not in the other; the CLI reaches each by its data folder alone", async () => {
    const cwd = mkdtempSync(path.join(tmpdir(), "skiff-install-cli-"));
    try {
      const made = await runCli(["projects", "create", "p-onlya"], { env: { SKIFF_DATA_DIR: a.dataDir }, cwd });
      expect(made).toMatchObject({ code: 0, stderr: "" });
      const inA = await runCli(["projects", "list"], { env: { SKIFF_DATA_DIR: a.dataDir }, cwd });
      const inB = await runCli(["projects", "list"], { env: { SKIFF_DATA_DIR: b.dataDir }, cwd });
      expect(inA).toMatchObject({ code: 0, stdout: expect.stringContaining("p-onlya") });
      expect(inB).toMatchObject({ code: 0, stdout: expect.stringContaining("p-dev") });
      expect(inB.stdout).not.toContain("p-onlya");
    } finally {
      rmSync(cwd, { recursive: true, force: true });
    }
  }, 90_000);

  it("each stops cleanly on SIGTERM, removing its address file", async () => {
    for (const i of [a, b]) {
      i.child.kill("SIGTERM");
      expect(await i.exited).toBe(0);
      expect(() => readFileSync(path.join(i.dataDir, "address"))).toThrow(/ENOENT/);
    }
  }, 60_000);
});
