// Deploying apps through the `skiff` CLI against a test skiff, and calling
// them through the Runner of its runner role; a second runner process
// picking up the same deployments.
import { mkdtemp, readdir, rm, stat, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { Code, ConnectError } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import type { Runner } from "../../services/runner/runner.js";
import type { InvokeRequest } from "../../services/runs/invoke.js";
import { skiffToml, writeApp, type Scaling } from "../helpers/apps.js";
import { runCli, spawnCli } from "../helpers/cli.js";
import { rawTar, TOML } from "../helpers/raw-tar.js";
import { spawnRunnerProcess, startTestSkiff, type TestSkiff } from "../helpers/skiff.js";
import { TEST_ROOT } from "../helpers/paths.js";

const ROOT = path.resolve(TEST_ROOT, "..");
const P = "p-dev";
const MAX_BUNDLE = 256 * 1024;

let t: TestSkiff;
let runner: Runner;
let tmp: string;

const cliEnv = () => ({ SKIFF_URL: t.url, SKIFF_TOKEN: t.devToken });
const skiff = (args: string[]) => runCli(args, { env: cliEnv(), cwd: tmp });

/** Resolves once the runner serves `version` of `app`. */
const served = (app: string, version: number) =>
  vi.waitUntil(() => runner.version(P, app) === version, { timeout: 60_000 });

function request(
  fn: string,
  body: unknown = {},
  runId = `run-${Math.random().toString(36).slice(2, 10)}`,
): InvokeRequest {
  return {
    runId,
    method: "POST",
    path: fn,
    query: "",
    headers: { "content-type": "application/json" },
    body: new TextEncoder().encode(JSON.stringify(body)),
  };
}
const json = (body: Uint8Array) => JSON.parse(Buffer.from(body).toString("utf8")) as Record<string, unknown>;

/** A Cortex Node app whose function `version` answers `version`. */
const nodeApp = (name: string, scaling: Scaling, version: string) => ({
  "skiff.toml": skiffToml({ name, runtime: { kind: "cortex", language: "node", entry: "index.mjs" }, scaling }),
  "index.mjs": `export async function version() { await new Promise((r) => setTimeout(r, 20)); return "${version}"; }\n`,
});

async function postBundle(bytes: Buffer): Promise<{ status: number; body: { code: string; message: string } }> {
  const res = await fetch(`${t.url}/v2/projects/${P}/apps`, {
    method: "POST",
    headers: { authorization: `Bearer ${t.devToken}`, "content-type": "application/gzip" },
    body: bytes,
  });
  return { status: res.status, body: (await res.json()) as { code: string; message: string } };
}

const appNames = async () => (await t.management().listApps({ projectId: P })).apps.map((a) => a.appName);

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-deploy-"));
  t = await startTestSkiff({ env: { SKIFF_MAX_BUNDLE_BYTES: String(MAX_BUNDLE) } });
  runner = t.skiff.runner!;
});
afterAll(async () => {
  await t?.close();
  await rm(tmp, { recursive: true, force: true });
});

describe("deploy - each runtime through the CLI", () => {
  it.each([
    ["hello-python", "/run", { name: "Ada" }, { run_id: "r-py", result: { message: "Hello, Ada!" } }],
    ["hello-node", "/run", { name: "Lin" }, { run_id: "r-node", result: { message: "Hello, Lin!" } }],
  ])("cortex %s: deployed as version 1 and served by the runner", async (app, fn, body, expected) => {
    const res = await skiff(["deploy", path.join(ROOT, "examples", app)]);
    expect(res).toMatchObject({ code: 0, stdout: `deployed ${app} version 1 to project ${P}\n` });
    expect(res.stderr).toMatch(/uploading .* \(100%\)/);
    await served(app, 1);
    const answer = await runner.invoke(P, app, request(fn, body, expected.run_id));
    expect(answer.status).toBe(200);
    expect(json(answer.body)).toMatchObject(expected);
  });

  it("custom: deployed and its response passed through", async () => {
    expect(await skiff(["deploy", path.join(ROOT, "examples", "custom-http")])).toMatchObject({ code: 0 });
    await served("custom-http", 1);
    const answer = await runner.invoke(P, "custom-http", {
      ...request("/hello"),
      method: "GET",
      query: "name=Bo",
      body: new Uint8Array(),
    });
    expect(answer.status).toBe(200);
    expect(json(answer.body)).toEqual({ message: "Hello, Bo!" });
  });
});

describe("deploy - refusals: nothing is deployed", () => {
  it.each([
    [
      "a value of the wrong type",
      'max_replicas = "two"',
      /invalid request \(400\): invalid skiff\.toml:\nskiff\.toml:8: scaling\.max_replicas must be an integer, got a string \("two"\)/,
    ],
    [
      "response_grace_period out of range",
      "response_grace_period = 50000",
      /skiff\.toml:8: scaling\.response_grace_period must be between 1 and 43200, got 50000/,
    ],
  ])("config error, %s: the CLI shows key and line, exit 1", async (_name, scaling, message) => {
    // Written by hand: a wrong value on line 8.
    const toml = `[app]\nname = "bad-config"\n[runtime]\nkind = "cortex"\nlanguage = "node"\nentry = "index.mjs"\n[scaling]\n${scaling}\n`;
    const res = await skiff([
      "deploy",
      await writeApp(tmp, { ...nodeApp("bad-config", {}, "v1"), "skiff.toml": toml }),
    ]);
    expect(res.code).toBe(1);
    expect(res.stderr).toMatch(message);
    expect(await appNames()).not.toContain("bad-config");
  });

  it.each([
    ["an absolute path", [{ path: "/tmp/escape", body: "x" }], /is an absolute path/],
    ["a .. segment", [{ path: "../escape", body: "x" }], /has a "\.\." segment/],
    [
      "a symlink out of the folder",
      [{ path: "escape", type: "SymbolicLink" as const, linkpath: "../../../etc" }],
      /is a link to "\.\.\/\.\.\/\.\.\/etc", outside the app folder/,
    ],
  ])("bundle with %s: 400 invalid_argument", async (_name, entries, message) => {
    const res = await postBundle(
      rawTar([{ path: "skiff.toml", body: TOML }, { path: "server.mjs", body: "" }, ...entries]),
    );
    expect(res.status).toBe(400);
    expect(res.body).toMatchObject({ code: "invalid_argument", message: expect.stringMatching(message) });
    expect(await appNames()).not.toContain("raw");
  });

  it("a folder with a symlink out of it is refused by the CLI before uploading", async () => {
    const dir = await writeApp(tmp, nodeApp("linked", {}, "v1"));
    await symlink("/etc/passwd", path.join(dir, "passwd"));
    const res = await skiff(["deploy", dir]);
    // The folder's problem, not a wrong command line (2): refused, 1.
    expect(res.code).toBe(1);
    expect(res.stderr).toMatch(/passwd is a link to \/etc\/passwd, outside the app folder/);
    expect(res.stderr).not.toContain("--help");
  });

  it("a bundle over SKIFF_MAX_BUNDLE_BYTES, compressed or unpacked", async () => {
    const noise = await writeApp(tmp, nodeApp("too-big", {}, "v1"));
    await writeFile(path.join(noise, "noise.bin"), (await import("node:crypto")).randomBytes(MAX_BUNDLE + 1024));
    const res = await skiff(["deploy", noise]);
    expect(res.code).toBe(1);
    expect(res.stderr).toMatch(
      new RegExp(
        `bundle refused: the bundle is \\d+ bytes, more than the limit of ${MAX_BUNDLE} bytes \\(SKIFF_MAX_BUNDLE_BYTES\\)`,
      ),
    );
    const zeros = await writeApp(tmp, nodeApp("too-big", {}, "v1"));
    await writeFile(path.join(zeros, "zeros.bin"), Buffer.alloc(MAX_BUNDLE * 2));
    expect((await skiff(["deploy", zeros])).stderr).toMatch(/unpacks to more than the limit/);
    expect(await appNames()).not.toContain("too-big");
  });
});

describe("deploy - versions, replicas, logs, delete", () => {
  it("a redeploy serves version 2 without dropping a request during the swap", async () => {
    expect(
      await skiff([
        "deploy",
        await writeApp(tmp, nodeApp("swap", { min_replicas: 1, max_replicas: 4, replica_concurrency: 4 }, "v1")),
      ]),
    ).toMatchObject({ code: 0 });
    await served("swap", 1);
    const answers: string[] = [];
    let stop = false;
    const load = Promise.all(
      Array.from({ length: 4 }, async () => {
        while (!stop) {
          const res = await runner.invoke(P, "swap", request("/version"));
          answers.push(res.status === 200 ? String(json(res.body).result) : `status ${res.status}`);
        }
      }),
    );
    await vi.waitUntil(() => answers.length >= 8, { timeout: 60_000 });
    const res = await skiff([
      "deploy",
      await writeApp(tmp, nodeApp("swap", { min_replicas: 1, max_replicas: 4, replica_concurrency: 4 }, "v2")),
    ]);
    expect(res).toMatchObject({ code: 0, stdout: expect.stringContaining("deployed swap version 2") });
    await served("swap", 2);
    // The 4 callers may each have had a call in flight on version 1 at the switch.
    const at = answers.length + 4;
    await vi.waitUntil(() => answers.length >= at + 8, { timeout: 60_000 });
    stop = true;
    await load; // an invoke that failed would have rejected here
    expect(answers.filter((a) => a !== "v1" && a !== "v2")).toEqual([]);
    expect(answers.slice(at)).toEqual(answers.slice(at).map(() => "v2"));
    const deployments = await t.management().listDeployments({ projectId: P, appName: "swap" });
    expect(deployments.deployments.map((d) => d.version)).toEqual([2, 1]);
  });

  it("GetApp shows config, deployment and the live replicas; apps list and get print them", async () => {
    await served("hello-python", 1);
    await runner.invoke(P, "hello-python", request("/run"));
    const app = await vi.waitUntil(
      async () => {
        const a = (await t.management().getApp({ projectId: P, appName: "hello-python" })).app!;
        return a.replicas.some((r) => r.state === "ready") ? a : undefined;
      },
      { timeout: 60_000, interval: 250 },
    );
    expect(app).toMatchObject({
      appName: "hello-python",
      runtime: { kind: "cortex", language: "python", entry: "main.py" },
      scaling: { maxReplicas: 2, responseGracePeriod: 60 },
    });
    expect(app.deployment).toMatchObject({
      version: 1,
      createdBy: "sa-dev",
      digest: expect.stringMatching(/^[0-9a-f]{64}$/),
    });
    expect(app.replicas.map((r) => r.replicaId).sort()).toEqual(
      runner
        .replicas(P, "hello-python")
        .map((r) => r.replicaId)
        .sort(),
    );
    const get = await skiff(["apps", "get", "hello-python"]);
    expect(get.stdout).toMatch(/runtime: +cortex python main\.py/);
    expect(get.stdout).toMatch(new RegExp(`${app.replicas[0].replicaId}\\s+ready\\s+1`));
    expect((await skiff(["apps", "list"])).stdout).toMatch(/hello-python\s+cortex python main\.py\s+1\s+\d/);
  });

  it("skiff logs shows the lines of a run; --follow prints new lines", async () => {
    await served("hello-python", 1);
    await runner.invoke(P, "hello-python", request("/run", { name: "Logs" }, "run-logs-1"));
    const res = await vi.waitUntil(
      async () => {
        const r = await skiff(["logs", "hello-python", "--run", "run-logs-1"]);
        return r.stdout.includes("greeting Logs") ? r : undefined;
      },
      { timeout: 60_000, interval: 250 },
    );
    expect(res.stdout.trim().split("\n")).toEqual([
      expect.stringMatching(/^\S+Z hello-python-v1-\w+ \[run-logs-1\] greeting Logs$/),
    ]);
    // A run without lines: said on stderr, nothing on stdout; as JSON, an empty list.
    expect(await skiff(["logs", "hello-python", "--run", "run-without-lines"])).toMatchObject({
      code: 0,
      stdout: "",
      stderr: "no log lines of run run-without-lines for app hello-python of project p-dev\n",
    });
    const json = await skiff(["logs", "hello-python", "--run", "run-without-lines", "--json"]);
    expect(JSON.parse(json.stdout)).toEqual({ lines: [] });

    const follow = spawnCli(["logs", "hello-python", "--follow", "--limit", "1"], { env: cliEnv() });
    let out = "";
    follow.stdout!.on("data", (c: Buffer) => (out += c.toString()));
    try {
      await vi.waitUntil(() => out.includes("greeting Logs"), { timeout: 60_000 });
      await runner.invoke(P, "hello-python", request("/run", { name: "Tail" }, "run-tail-1"));
      await vi.waitUntil(() => out.includes("[run-tail-1] greeting Tail"), { timeout: 60_000 });
    } finally {
      follow.kill("SIGTERM");
    }
  });

  it("DeleteApp stops the replicas and the app is gone", async () => {
    expect(await skiff(["deploy", await writeApp(tmp, nodeApp("doomed", { min_replicas: 1 }, "v1"))])).toMatchObject({
      code: 0,
    });
    await served("doomed", 1);
    await vi.waitUntil(() => runner.replicas(P, "doomed").length > 0, { timeout: 60_000 });
    expect(await skiff(["apps", "delete", "doomed"])).toMatchObject({
      code: 0,
      stdout: expect.stringContaining("deleted app doomed"),
    });
    await vi.waitUntil(() => runner.replicas(P, "doomed").length === 0 && runner.version(P, "doomed") === undefined, {
      timeout: 60_000,
    });
    const err = await t
      .management()
      .getApp({ projectId: P, appName: "doomed" })
      .catch((e: unknown) => ConnectError.from(e));
    expect(err).toMatchObject({ code: Code.NotFound });
    expect(await skiff(["apps", "get", "doomed"])).toMatchObject({
      code: 1,
      stderr: expect.stringContaining("not found (404)"),
    });
  });
});

describe("deploy - a second runner process", () => {
  it("hosts the apps deployed through another process: prepares them and keeps its own replica warm", async () => {
    const dataDir = await mkdtemp(path.join(tmp, "runner2-"));
    const child = spawnRunnerProcess(t.nats.url, dataDir, { SKIFF_LOG_LEVEL: "warn" });
    const exited = new Promise((resolve) => child.once("exit", resolve));
    try {
      expect(await skiff(["deploy", await writeApp(tmp, nodeApp("warm", { min_replicas: 1 }, "v1"))])).toMatchObject({
        code: 0,
      });
      await served("warm", 1);
      // A ready replica on each runner.
      const app = await vi.waitUntil(
        async () => {
          const a = (await t.management().getApp({ projectId: P, appName: "warm" })).app!;
          return a.replicas.filter((r) => r.state === "ready").length === 2 ? a : undefined;
        },
        { timeout: 60_000, interval: 250 },
      );
      const here = runner.replicas(P, "warm").map((r) => r.replicaId);
      const there = app.replicas.filter((r) => !here.includes(r.replicaId));
      expect(there).toHaveLength(1);
      // It unpacked and prepared the bundle itself, in its own data folder.
      const digest = app.deployment!.digest;
      expect((await stat(path.join(dataDir, "deployments", digest, ".skiff", "prepared.json"))).isFile()).toBe(true);
      // And it picks up earlier deployments too.
      expect(await readdir(path.join(dataDir, "deployments"))).toContain(app.deployment!.digest);
    } finally {
      child.kill("SIGTERM");
      await exited;
    }
  }, 60_000);
});
