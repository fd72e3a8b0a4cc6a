// The runner with real replicas of each runtime: the three examples and the
// fixture apps, through Runner.deploy and Runner.invoke.
import { cp, mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { parseAppConfig } from "../../services/apps/app-config.js";
import { silentLogger } from "../../services/config/logger.js";
import { FunctionNotFound, InvalidArguments, PrepareFailed, StartFailed } from "../../services/runs/errors.js";
import { prepareDeployment } from "../../services/runner/prepare.js";
import { Runner } from "../../services/runner/runner.js";
import type { InvokeRequest } from "../../services/runs/invoke.js";
import type { AppLogLine } from "../../services/runner/types.js";
import { skiffToml, type CortexRuntime } from "../helpers/apps.js";
import { TEST_ROOT } from "../helpers/paths.js";

const ROOT = path.resolve(TEST_ROOT, "..");
let tmp: string;
let runner: Runner | undefined;
const logs: AppLogLine[] = [];

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-runner-"));
});
afterEach(async () => {
  await runner?.close();
  runner = undefined;
  logs.length = 0;
});
afterAll(() => rm(tmp, { recursive: true, force: true }));

/** A copy of an app folder, since deploying writes node_modules/ and .skiff/ into it. */
async function app(source: string): Promise<string> {
  const dir = path.join(tmp, `${path.basename(source)}-${Math.random().toString(36).slice(2, 8)}`);
  await cp(path.join(ROOT, source), dir, { recursive: true });
  return dir;
}

async function start(): Promise<Runner> {
  await runner?.close();
  runner = new Runner({
    workDir: path.join(tmp, "work"),
    logger: silentLogger,
    onLog: (l) => logs.push(l),
    startTimeoutMs: 10_000,
  });
  return runner;
}

async function deploy(source: string, toml?: string): Promise<{ runner: Runner; name: string }> {
  const dir = await app(source);
  const config = parseAppConfig(toml ?? (await readFile(path.join(dir, "skiff.toml"), "utf8")));
  const r = await start();
  await r.deploy({ projectId: "p-test", appName: config.app.name, version: 1, dir, config });
  return { runner: r, name: config.app.name };
}

function request(p: string, body: unknown = {}, more: Partial<InvokeRequest> = {}): InvokeRequest {
  return {
    runId: `run-${Math.random().toString(36).slice(2, 10)}`,
    method: "POST",
    path: p,
    query: "",
    headers: {},
    body: new TextEncoder().encode(JSON.stringify(body)),
    ...more,
  };
}

const json = (body: Uint8Array) => JSON.parse(Buffer.from(body).toString("utf8")) as Record<string, unknown>;

const custom = (name: string, env?: Record<string, string>) =>
  skiffToml({ name, runtime: { kind: "custom", command: ["node", "server.mjs"] }, env });
const cortex = (name: string, language: CortexRuntime["language"], entry: string) =>
  skiffToml({ name, runtime: { kind: "cortex", language, entry } });

describe("runner - runtimes", () => {
  it("cortex python (example): the envelope, a raised exception as 500 with type and message, traceback only in the log", async () => {
    const { runner, name } = await deploy("examples/hello-python");
    const ok = await runner.invoke("p-test", name, request("/run", { name: "Ada" }, { runId: "run-py-1" }));
    expect(ok.status).toBe(200);
    expect(ok.headers["content-type"]).toBe("application/json");
    const body = json(ok.body);
    expect(body).toEqual({ run_id: "run-py-1", result: { message: "Hello, Ada!" }, run_time_ms: ok.runTimeMs });
    expect(Object.keys(body)).toEqual(["run_id", "result", "run_time_ms"]);
    expect(json((await runner.invoke("p-test", name, request("run"))).body).result).toEqual({
      message: "Hello, world!",
    });

    const failed = await runner.invoke("p-test", name, request("/stats", { numbers: [] }, { runId: "run-py-2" }));
    expect(failed.status).toBe(500);
    expect(json(failed.body)).toEqual({
      run_id: "run-py-2",
      error: { type: "ValueError", message: "numbers must not be empty" },
    });
    expect(Buffer.from(failed.body).toString()).not.toContain("Traceback");
    // Written as every other answer of skiff's: no spaces after ":" and ",".
    expect(Buffer.from(failed.body).toString()).toBe(
      '{"run_id":"run-py-2","error":{"type":"ValueError","message":"numbers must not be empty"}}',
    );
    const stderrOf = () => logs.filter((l) => l.runId === "run-py-2" && l.stream === "stderr").map((l) => l.text);
    await expect.poll(() => stderrOf().join("\n")).toContain('raise ValueError("numbers must not be empty")');
    const stderr = stderrOf();
    expect(stderr).toContain("Traceback (most recent call last):");
    expect(stderr.join("\n")).toContain('raise ValueError("numbers must not be empty")');
    await expect
      .poll(() => logs.find((l) => l.text === "greeting Ada"))
      .toMatchObject({
        projectId: "p-test",
        appName: name,
        stream: "stdout",
        runId: "run-py-1",
        replicaId: ok.replicaId,
      });
  });

  it("cortex node (example): an async export, a sync export, a thrown error as 500", async () => {
    const { runner, name } = await deploy("examples/hello-node");
    const ok = await runner.invoke("p-test", name, request("/run", { name: "Lin" }, { runId: "run-n-1" }));
    expect(json(ok.body)).toEqual({ run_id: "run-n-1", result: { message: "Hello, Lin!" }, run_time_ms: ok.runTimeMs });
    expect(json((await runner.invoke("p-test", name, request("/reverse", { text: "abc" }))).body).result).toEqual({
      text: "cba",
    });
    const failed = await runner.invoke("p-test", name, request("/reverse", { text: 1 }, { runId: "run-n-2" }));
    expect(failed.status).toBe(500);
    expect(json(failed.body)).toEqual({
      run_id: "run-n-2",
      error: { type: "TypeError", message: "text must be a string" },
    });
    // The trace and the answer travel on different pipes: the trace may come second.
    await expect
      .poll(() => logs.some((l) => l.runId === "run-n-2" && l.stream === "stderr" && l.text.includes("at reverse")))
      .toBe(true);
    await expect(runner.invoke("p-test", name, request("/_greeting"))).rejects.toBeInstanceOf(FunctionNotFound);
  });

  it("custom (example): method, path, query, headers and body forwarded; the response passes through", async () => {
    const { runner, name } = await deploy("examples/custom-http");
    const res = await runner.invoke(
      "p-test",
      name,
      request("/echo/a/b", undefined, {
        runId: "run-c-1",
        method: "PUT",
        query: "x=1&y=two",
        headers: { "content-type": "text/plain", "x-custom": "v", connection: "close", host: "evil" },
        body: new TextEncoder().encode("raw body"),
      }),
    );
    expect(res.status).toBe(200);
    expect(res.headers["x-app"]).toBe("custom-http");
    expect(res.headers["content-type"]).toBe("application/json");
    const echo = json(res.body) as {
      method: string;
      path: string;
      query: string;
      body: string;
      headers: Record<string, string>;
    };
    expect(echo).toMatchObject({ method: "PUT", path: "/echo/a/b", query: "x=1&y=two", body: "raw body" });
    expect(echo.headers).toMatchObject({
      "content-type": "text/plain",
      "x-custom": "v",
      "x-request-id": "run-c-1",
      "content-length": "8",
    });
    expect(echo.headers.host).not.toBe("evil");
    const missing = await runner.invoke(
      "p-test",
      name,
      request("/nowhere", undefined, { method: "GET", body: new Uint8Array() }),
    );
    expect(missing.status).toBe(404);
    expect(json(missing.body)).toEqual({ error: "no route /nowhere" });
    expect(
      json(
        (
          await runner.invoke(
            "p-test",
            name,
            request("/hello", undefined, { method: "GET", query: "name=Bo", body: new Uint8Array() }),
          )
        ).body,
      ),
    ).toEqual({ message: "Hello, Bo!" });
  });

  it("cortex python: only public functions defined in the module are exposed; others are FunctionNotFound without a replica", async () => {
    const toml = cortex("exposure", "python", "main.py");
    const dir = await app("test/fixtures/apps/py-exposure");
    expect(await prepareDeployment(dir, parseAppConfig(toml), silentLogger)).toEqual({
      functions: ["fail", "later", "public", "square"],
    });
    const { runner } = await deploy("test/fixtures/apps/py-exposure", toml);
    for (const fn of ["_private", "_unused", "VALUE", "Thing", "os", "dumps", "nope", "", "public/x"]) {
      await expect(runner.invoke("p-test", "exposure", request(`/${fn}`)), fn).rejects.toThrow(FunctionNotFound);
    }
    expect(runner.replicas("p-test", "exposure")).toEqual([]);
    expect(json((await runner.invoke("p-test", "exposure", request("/public", { x: 5 }))).body).result).toEqual({
      x: 5,
      private: "hidden",
      cwd_is_home: true,
    });
    expect(json((await runner.invoke("p-test", "exposure", request("/later"))).body).result).toBe("done");
    // Bodies that cannot be the function's arguments are the caller's error, found before the function runs.
    await expect(runner.invoke("p-test", "exposure", request("/public", [1, 2], { runId: "run-bad" }))).rejects.toThrow(
      new InvalidArguments("the body must be a JSON object whose fields are the function's arguments"),
    );
    await expect(runner.invoke("p-test", "exposure", request("/public", { y: 1 }))).rejects.toThrow(
      /^the caller's body does not fit public\(x\): unknown parameter "y"$/,
    );
    expect(json((await runner.invoke("p-test", "exposure", request("/fail"))).body)).toMatchObject({
      error: { type: "KeyError", message: "'missing thing'" },
    });
  });

  it("environment isolation: a replica sees only PATH, HOME, LANG, its [env] and PORT", async () => {
    process.env.SKIFF_TEST_SECRET = "platform-secret";
    try {
      const { runner, name } = await deploy(
        "test/fixtures/apps/behave",
        custom("behave", { GREETING: "hi", LANG: "en_US.UTF-8" }),
      );
      const res = await runner.invoke(
        "p-test",
        name,
        request("/env", undefined, { method: "GET", body: new Uint8Array() }),
      );
      const env = json(res.body).env as Record<string, string>;
      expect(Object.keys(env).sort()).toEqual(["GREETING", "HOME", "LANG", "PATH", "PORT"]);
      expect(env).toMatchObject({ GREETING: "hi", LANG: "en_US.UTF-8", PATH: "/usr/local/bin:/usr/bin:/bin" });
      // In its sandbox a replica's HOME and working folder is /app, never a path of the host.
      expect(env.HOME).toBe("/app");
      expect(JSON.stringify(env)).not.toContain("platform-secret");
    } finally {
      delete process.env.SKIFF_TEST_SECRET;
    }
  });

  it("logs: stdout and stderr lines carry app, replica and run id", async () => {
    const { runner, name } = await deploy("test/fixtures/apps/behave", custom("behave"));
    const res = await runner.invoke(
      "p-test",
      name,
      request("/log", undefined, { runId: "run-log", method: "GET", query: "text=line%20one", body: new Uint8Array() }),
    );
    await expect
      .poll(() =>
        logs
          .filter((l) => l.runId === "run-log")
          .map((l) => [l.stream, l.text])
          .sort(),
      )
      .toEqual([
        ["stderr", "err: line one"],
        ["stdout", "line one"],
      ]);
    expect(logs.find((l) => l.runId === "run-log")).toMatchObject({
      projectId: "p-test",
      appName: "behave",
      replicaId: res.replicaId,
    });
    expect(logs.find((l) => l.runId === "run-log")?.time).toBeInstanceOf(Date);
  });

  it("a package.json dependency (a local file: package) is installed at deploy", async () => {
    const toml = cortex("deps", "node", "index.mjs");
    const { runner } = await deploy("test/fixtures/apps/node-deps", toml);
    const res = await runner.invoke("p-test", "deps", request("/run", { name: "Kim" }));
    expect(json(res.body).result).toBe("greetings, Kim");
  });

  it("requirements.txt with no reachable package index: a clear PrepareFailed, nothing deployed", async () => {
    // Installs get no network here (the sandbox's default) and none of this process's pip settings.
    const toml = cortex("reqs", "python", "main.py");
    const err = await deploy("test/fixtures/apps/py-reqs", toml).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(PrepareFailed);
    expect((err as Error).message).toMatch(
      /^could not install requirements\.txt: no reachable package index provides them/,
    );
    expect((err as Error).message).toContain("skiff-test-no-such-package");
    expect(runner?.replicas("p-test", "reqs")).toEqual([]);
    await expect(runner!.invoke("p-test", "reqs", request("/run"))).rejects.toMatchObject({ name: "AppNotFound" });
  }, 60_000);

  it("a Cortex module that fails to import is refused at deploy with its error", async () => {
    const dir = await app("test/fixtures/apps/py-exposure");
    const config = parseAppConfig(cortex("broken", "node", "missing.mjs"));
    await expect(prepareDeployment(dir, config, silentLogger)).rejects.toThrow(
      /^cannot load missing\.mjs:\n.*Cannot find module/s,
    );
  });

  it("a replica that exits at start: StartFailed quoting its stderr, at deploy (min_replicas) and on invoke", async () => {
    const toml = (min: number) =>
      skiffToml({
        name: "dies",
        runtime: { kind: "custom", command: ["node", "-e", "console.error('cannot bind'); process.exit(2)"] },
        scaling: { min_replicas: min },
      });
    const failed = await deploy("test/fixtures/apps/behave", toml(1)).catch((e: unknown) => e);
    expect(failed).toBeInstanceOf(StartFailed);
    expect((failed as Error).message).toMatch(/exited during start \(code 2\).*cannot bind/s);
    expect(runner?.replicas("p-test", "dies")).toEqual([]);
    const { runner: r } = await deploy("test/fixtures/apps/behave", toml(0));
    await expect(r.invoke("p-test", "dies", request("/x"))).rejects.toThrow(StartFailed);
    // A program that is nowhere is said at the deploy, as its replicas' start would find it.
    const missing = skiffToml({ name: "nocmd", runtime: { kind: "custom", command: ["no-such-program-xyz"] } });
    await expect(deploy("test/fixtures/apps/behave", missing)).rejects.toThrow(
      /the app's command "no-such-program-xyz" is not a program on a replica's PATH/,
    );
  });
});
