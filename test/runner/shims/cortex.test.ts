// The Cortex shims (services/runner/shims/cortex.py and cortex.mjs) as the
// processes a replica runs, serving a module on 127.0.0.1:$PORT: a body whose
// fields do not fit the function's signature is answered 400
// invalid_argument naming the parameter, before the function runs.
import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import http from "node:http";
import net from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { SHIM_DIR } from "../../../services/runner/sandbox-argv.js";

let tmp: string;
const started: ChildProcess[] = [];

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-cortex-shim-"));
});
afterAll(async () => {
  for (const p of started) p.kill("SIGKILL");
  await rm(tmp, { recursive: true, force: true });
});

async function freePort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as net.AddressInfo).port;
  await new Promise((resolve) => server.close(resolve));
  return port;
}

/** Serves `source` with the shim of its language; resolves to its base URL once /health answers. */
async function serve(file: string, source: string): Promise<string> {
  return (await serveProcess(file, source)).url;
}

/** As serve(), with the shim's process. */
async function serveProcess(file: string, source: string): Promise<{ url: string; proc: ChildProcess }> {
  await writeFile(path.join(tmp, file), source);
  const port = await freePort();
  const [command, shim] = file.endsWith(".py") ? ["python3", "cortex.py"] : [process.execPath, "cortex.mjs"];
  const proc = spawn(command, [path.join(SHIM_DIR, shim), path.join(tmp, file)], {
    cwd: tmp,
    env: { PATH: process.env.PATH, PORT: String(port) },
    stdio: ["ignore", "ignore", "inherit"],
  });
  started.push(proc);
  const url = `http://127.0.0.1:${port}`;
  await vi.waitUntil(
    () =>
      fetch(`${url}/health`).then(
        (r) => r.ok,
        () => false,
      ),
    { timeout: 20_000, interval: 50 },
  );
  return { url, proc };
}

async function post(url: string, fn: string, body: string, runId?: string): Promise<{ status: number; json: any }> {
  const headers: Record<string, string> = { "content-type": "application/json" };
  if (runId !== undefined) headers["x-request-id"] = runId;
  const res = await fetch(`${url}/${fn}`, { method: "POST", body, headers });
  return { status: res.status, json: await res.json() };
}

const misfit = (says: string) => ({ error: { type: "invalid_argument", message: expect.stringContaining(says) } });

describe("cortex shim - Python signatures", () => {
  let url: string;
  beforeAll(async () => {
    url = await serve(
      "app_py.py",
      [
        "calls = []",
        "def predict(prompt, max_tokens=16, *, temperature=0.5):",
        "    calls.append(prompt)",
        "    return [prompt, max_tokens, temperature]",
        "def kw(a, **rest):",
        "    return [a, sorted(rest)]",
        "def count():",
        "    return len(calls)",
        "def tagged(text, run_id):",
        "    return [text, run_id]",
      ].join("\n"),
    );
  });

  it("a missing required parameter, an unknown name, a body that is no object: 400, and the function does not run", async () => {
    expect(await post(url, "predict", "{}")).toEqual({
      status: 400,
      json: misfit('missing required parameter "prompt"'),
    });
    expect(await post(url, "predict", '{"prompt":"p","top_p":1}')).toEqual({
      status: 400,
      json: misfit('unknown parameter "top_p"'),
    });
    expect((await post(url, "predict", "{}")).json.error.message).toBe(
      'the caller\'s body does not fit predict(prompt, max_tokens, temperature): missing required parameter "prompt"',
    );
    expect(await post(url, "predict", "[1]")).toEqual({ status: 400, json: misfit("must be a JSON object") });
    expect((await post(url, "count", "")).json).toBe(0);
  });

  it("keyword-only parameters, defaults and **kwargs take what fits", async () => {
    expect(await post(url, "predict", '{"prompt":"p","temperature":1}')).toEqual({ status: 200, json: ["p", 16, 1] });
    expect(await post(url, "kw", '{"a":1,"b":2}')).toEqual({ status: 200, json: [1, ["b"]] });
    expect(await post(url, "kw", '{"b":2}')).toEqual({ status: 400, json: misfit('missing required parameter "a"') });
  });

  it("a run_id parameter gets the run's id, not what the body says", async () => {
    expect(await post(url, "tagged", '{"text":"t"}', "run-1")).toEqual({ status: 200, json: ["t", "run-1"] });
    expect(await post(url, "tagged", '{"text":"t","run_id":"forged"}', "run-2")).toEqual({
      status: 200,
      json: ["t", "run-2"],
    });
    // Not a parameter of the function: the body's run_id is an unknown name, as any other.
    expect(await post(url, "predict", '{"prompt":"p","run_id":"x"}', "run-3")).toEqual({
      status: 400,
      json: misfit('unknown parameter "run_id"'),
    });
  });
});

describe("cortex shim - Node signatures (the first parameter's object pattern)", () => {
  let url: string;
  beforeAll(async () => {
    url = await serve(
      "app_node.mjs",
      [
        "let calls = 0;",
        "export function greet({ name, greeting = 'hi, (there)' /* a comment, with a comma */ }) { calls++; return `${greeting} ${name}`; }",
        "export const renamed = ({ user: who, opts: { deep } = {}, list: [first] = [] }) => [who, deep ?? null, first ?? null];",
        "export async function* items({ n, ...rest }) { for (let i = 0; i < n; i++) yield i; }",
        "export function whole(args) { return Object.keys(args).length; }",
        "export function none() { return 'none'; }",
        "export function quoted({ 'a-b': ab }) { return ab ?? null; }",
        "export function count() { return calls; }",
        "export function tagged({ text, run_id }) { return [text, run_id]; }",
      ].join("\n"),
    );
  });

  it("a key without a default is required, a key it does not name is unknown, before the function runs", async () => {
    expect(await post(url, "greet", '{"greeting":"yo"}')).toEqual({
      status: 400,
      json: misfit('missing required parameter "name"'),
    });
    expect(await post(url, "greet", '{"name":"a","loud":true}')).toEqual({
      status: 400,
      json: misfit('unknown parameter "loud"'),
    });
    expect((await post(url, "greet", "{}")).json.error.message).toBe(
      'the caller\'s body does not fit greet({ name, greeting }): missing required parameter "name"',
    );
    expect(await post(url, "renamed", '{"opts":{}}')).toEqual({ status: 400, json: misfit('"user"') });
    expect((await post(url, "count", "")).json).toBe(0);
  });

  it("defaults (nested patterns too), a rest element, a plain or no parameter, quoted keys take what they take", async () => {
    expect(await post(url, "greet", '{"name":"ada"}')).toEqual({ status: 200, json: "hi, (there) ada" });
    expect(await post(url, "renamed", '{"user":"u","opts":{"deep":1}}')).toEqual({ status: 200, json: ["u", 1, null] });
    expect(await post(url, "items", '{"n":2,"extra":1}')).toEqual({ status: 200, json: [0, 1] });
    expect(await post(url, "items", '{"extra":1}')).toEqual({
      status: 400,
      json: misfit('missing required parameter "n"'),
    });
    expect(await post(url, "whole", '{"x":1,"y":2}')).toEqual({ status: 200, json: 2 });
    expect(await post(url, "none", '{"x":1}')).toEqual({ status: 200, json: "none" });
    expect(await post(url, "quoted", '{"a-b":5}')).toEqual({ status: 200, json: 5 });
  });

  it("a run_id key gets the run's id, not what the body says", async () => {
    expect(await post(url, "tagged", '{"text":"t"}', "run-1")).toEqual({ status: 200, json: ["t", "run-1"] });
    expect(await post(url, "tagged", '{"text":"t","run_id":"forged"}', "run-2")).toEqual({
      status: 200,
      json: ["t", "run-2"],
    });
    expect(await post(url, "whole", '{"x":1}', "run-3")).toEqual({ status: 200, json: 1 });
  });
});

describe("cortex shims - SIGTERM", () => {
  // A replica is stopped with SIGTERM (a new version, a scale-down, a secret changed) while it may be writing an
  // answer. Node's server.close() also destroys a connection whose answer is ended but not yet written out: an
  // answer larger than the socket takes at once reached the runner cut short ("other side closed").
  const BYTES = 8 * 1024 * 1024;
  for (const [file, source] of [
    ["big_node.mjs", "export function big({ n }) { return 'x'.repeat(n); }\n"],
    ["big_py.py", "def big(n):\n    return 'x' * n\n"],
  ]) {
    it(`${file.endsWith(".py") ? "Python" : "Node"}: an answer being written goes out whole, then the shim exits 0; an idle connection does not hold it`, async () => {
      const { url, proc } = await serveProcess(file, source);
      const exited = once(proc, "exit") as Promise<[number | null, string | null]>;
      const { port } = new URL(url);
      const agent = new http.Agent({ keepAlive: true, maxSockets: 2 });
      // A kept-alive connection left idle: the shim must not wait for it.
      await new Promise<void>((resolve, reject) =>
        http.get({ port, path: "/health", agent }, (r) => r.resume().on("end", resolve)).on("error", reject),
      );
      const body = JSON.stringify({ n: BYTES });
      const answer = new Promise<{ status: number; bytes: number; error?: string }>((resolve) => {
        const req = http.request(
          { port, method: "POST", path: "/big", agent: false, headers: { "content-type": "application/json" } },
          (res) => {
            // The head is here, so the answer is ended on the shim's side; it is not read for a while, so most
            // of it waits in the shim when the signal comes.
            res.pause();
            proc.kill("SIGTERM");
            let bytes = 0;
            res.on("data", (c: Buffer) => (bytes += c.length));
            res.on("end", () => resolve({ status: res.statusCode!, bytes }));
            res.on("error", (err) => resolve({ status: res.statusCode!, bytes, error: err.message }));
            setTimeout(() => res.resume(), 300);
          },
        );
        req.on("error", (err) => resolve({ status: 0, bytes: 0, error: err.message }));
        req.end(body);
      });
      // The JSON string of BYTES characters: two quotes more.
      expect(await answer).toEqual({ status: 200, bytes: BYTES + 2 });
      expect(await exited).toEqual([0, null]);
      agent.destroy();
    });
  }
});
