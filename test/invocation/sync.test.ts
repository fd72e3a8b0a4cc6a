// Running apps through REST, Connect and gRPC: the sync answers, the async
// 202, and every refusal before a run is accepted.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { InvocationService } from "../../gen/skiff/invocation/v4/invocation_pb.js";
import { bearer, startTestSkiff, type TestSkiff } from "../helpers/skiff.js";
import { cortexApp, deploy, P, post, UUID_V7 } from "../helpers/run-apps.js";
import { TEST_ROOT } from "../helpers/paths.js";

const ROOT = path.resolve(TEST_ROOT, "..");
let t: TestSkiff;
let tmp: string;
const v4 = (app: string, rest: string) => `${t.url}/v4/${P}/${app}/${rest}`;

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-invoke-"));
  t = await startTestSkiff({ env: { SKIFF_MAX_BODY_BYTES: String(64 * 1024) } });
  await deploy(
    tmp,
    t.management(),
    cortexApp("calc", { max_replicas: 2, replica_concurrency: 4, response_grace_period: 2 }),
  );
  const { packApp } = await import("../../services/apps/bundle.js");
  await t.management().deployApp({
    projectId: P,
    bundle: {
      contentType: "application/gzip",
      data: (await packApp(path.join(ROOT, "examples", "custom-http"))).bytes,
    },
  });
  // The apps on the runner.
  await vi.waitUntil(
    () => t.skiff.runner!.version(P, "calc") === 1 && t.skiff.runner!.version(P, "custom-http") === 1,
    { timeout: 60_000 },
  );
}, 60_000);
afterAll(async () => {
  await t?.close();
  await rm(tmp, { recursive: true, force: true });
});

describe("invocation - sync", () => {
  it("a Cortex function answers 200 with the envelope; X-Request-Id is the run id, a UUIDv7", async () => {
    const res = await post(v4("calc", "add"), t.devToken, JSON.stringify({ a: 2, b: 3 }));
    expect(res.status).toBe(200);
    const id = res.headers.get("x-request-id")!;
    expect(id).toMatch(UUID_V7);
    expect(res.json).toEqual({ run_id: id, result: 5, run_time_ms: expect.any(Number) });
  });

  it("a function that raised answers 500 with its error; the run reads failure", async () => {
    const res = await post(v4("calc", "fail"), t.devToken, "{}");
    expect(res.status).toBe(500);
    expect(res.json).toMatchObject({
      run_id: res.headers.get("x-request-id"),
      error: { type: "TypeError", message: "nope" },
    });
    const run = await vi.waitUntil(
      async () => {
        const r = (await t.management().getRun({ projectId: P, appName: "calc", runId: res.json.run_id })).run!;
        return r.status === "failure" ? r : undefined;
      },
      { timeout: 60_000 },
    );
    expect(run).toMatchObject({ async: false, statusCode: 500, error: { type: "TypeError" } });
    // Known by its id alone: app "-" (as ListRuns takes it) finds it in whichever app of the project ran it.
    const byId = await fetch(`${t.url}/v2/projects/${P}/apps/-/runs/${res.json.run_id}`, {
      headers: { authorization: `Bearer ${t.devToken}` },
    });
    expect(byId.status).toBe(200);
    expect(((await byId.json()) as { run: unknown }).run).toMatchObject({
      run_id: res.json.run_id,
      app_name: "calc",
      status: "failure",
    });
    const none = "01900000-0000-7000-8000-000000000000";
    await expect(t.management().getRun({ projectId: P, appName: "-", runId: none })).rejects.toMatchObject({
      code: Code.NotFound,
      rawMessage: `run ${none} not found in project ${P}`,
    });
  });

  it("a Custom app's answer passes through: status, headers, body; skiff's own parameters and credentials are not forwarded", async () => {
    const res = await post(
      `${v4("custom-http", "echo/a%20b")}?x=1&async=false&webhookEndpoint=`,
      t.devToken,
      "raw body",
      { "content-type": "text/plain", "x-extra": "yes" },
    );
    expect(res.status).toBe(200);
    expect(res.headers.get("x-app")).toBe("custom-http");
    expect(res.headers.get("x-request-id")).toMatch(UUID_V7);
    expect(res.json).toMatchObject({ method: "POST", path: "/echo/a%20b", query: "x=1", body: "raw body" });
    expect(res.json.headers).toMatchObject({
      "content-type": "text/plain",
      "x-extra": "yes",
      "x-request-id": res.headers.get("x-request-id"),
    });
    expect(res.json.headers.authorization).toBeUndefined();
    const missing = await post(v4("custom-http", "nothing"), t.devToken, "");
    expect(missing.status).toBe(404);
  });

  it("a Custom app gets the path as the caller wrote it, %2F as / (as generated clients write it), and the run records it so", async () => {
    const res = await post(v4("custom-http", "echo%2Fdeep/x%20y"), t.devToken, "");
    expect(res.status).toBe(200);
    expect(res.json.path).toBe("/echo/deep/x%20y");
    const runId = res.headers.get("x-request-id")!;
    const run = await vi.waitUntil(
      async () => {
        const r = await t
          .management()
          .getRun({ projectId: P, appName: "custom-http", runId })
          .catch(() => undefined);
        return r?.run?.status === "success" ? r.run : undefined;
      },
      { timeout: 60_000 },
    );
    expect(run.path).toBe("/echo/deep/x%20y");
  });

  it("past response_grace_period: 504 deadline_exceeded, the run reads failure with reason timeout", async () => {
    const res = await post(v4("calc", "sleep"), t.devToken, JSON.stringify({ ms: 6000 }));
    expect(res.status).toBe(504);
    expect(res.json).toMatchObject({ code: "deadline_exceeded" });
    const runId = res.headers.get("x-request-id")!;
    const run = await vi.waitUntil(
      async () => {
        const r = (await t.management().getRun({ projectId: P, appName: "calc", runId })).run!;
        return r.status === "failure" ? r : undefined;
      },
      { timeout: 60_000 },
    );
    expect(run.error).toMatchObject({ type: "timeout" });
  });
});

describe("invocation - Connect and gRPC clients", () => {
  it.each([
    [
      "Connect",
      () => createConnectTransport({ baseUrl: t.url, httpVersion: "1.1", interceptors: [bearer(t.devToken)] }),
    ],
    ["gRPC", () => createGrpcTransport({ baseUrl: t.url, interceptors: [bearer(t.devToken)] })],
  ])("%s: sync envelope, async 202 body, X-Request-Id", async (_name, transport) => {
    const client = createClient(InvocationService, transport());
    let header: Headers | undefined;
    const res = await client.run(
      {
        projectId: P,
        appName: "calc",
        path: "add",
        body: { contentType: "application/json", data: new TextEncoder().encode('{"a":1,"b":1}') },
      },
      { onHeader: (h) => (header = h) },
    );
    expect(res.statusCode).toBe(200);
    expect(header?.get("x-request-id")).toBe(res.runId);
    expect(JSON.parse(new TextDecoder().decode(res.body!.data))).toMatchObject({ run_id: res.runId, result: 2 });
    const queued = await client.run({
      projectId: P,
      appName: "calc",
      path: "add",
      async: true,
      body: { data: new TextEncoder().encode('{"a":1,"b":2}') },
    });
    expect(queued.statusCode).toBe(202);
    expect(new TextDecoder().decode(queued.body!.data)).toBe(`{"run_id":"${queued.runId}"}`);
    const err = await client
      .run({ projectId: P, appName: "nope", path: "add" })
      .catch((e: unknown) => ConnectError.from(e));
    expect(err).toMatchObject({ code: Code.NotFound });
  });
});

describe("invocation - refusals come before any 202", () => {
  it.each([
    ["unknown app", "nope", "add", "{}", {}, 404, "not_found"],
    ["unknown function", "calc", "missing", "{}", {}, 404, "not_found"],
    ["private function", "calc", "_hidden", "{}", {}, 404, "not_found"],
    ["malformed JSON", "calc", "add", "{nope", {}, 400, "invalid_argument"],
    ["a body that is not an object", "calc", "add", "[1,2]", {}, 400, "invalid_argument"],
    [
      "webhook to a private address",
      "calc",
      "add",
      "{}",
      { webhookEndpoint: "http://10.1.2.3/hook" },
      400,
      "invalid_argument",
    ],
    ["webhook that is not a URL", "calc", "add", "{}", { webhookEndpoint: "not a url" }, 400, "invalid_argument"],
  ])("%s: %s", async (_name, app, fn, body, query, status, code) => {
    const q = new URLSearchParams({ async: "true", ...query });
    const res = await post(`${v4(app, fn)}?${q}`, t.devToken, body);
    expect(res.status).toBe(status);
    expect(res.json).toMatchObject({ code });
    // The refused call has an id for support and logs, but no run is recorded under it.
    const id = res.headers.get("x-request-id")!;
    expect(id).toMatch(UUID_V7);
    if (app === "calc")
      await expect(t.management().getRun({ projectId: P, appName: app, runId: id })).rejects.toMatchObject({
        code: Code.NotFound,
      });
  });

  it("a body over the limit: 413, with an X-Request-Id", async () => {
    const res = await post(`${v4("calc", "add")}?async=true`, t.devToken, JSON.stringify({ a: "x".repeat(70 * 1024) }));
    expect(res.status).toBe(413);
    expect(res.headers.get("x-request-id")).toMatch(UUID_V7);
  });

  it("no token 401, another project's token 403, each with an X-Request-Id", async () => {
    const anonymous = await post(`${v4("calc", "add")}?async=true`, undefined, "{}");
    expect(anonymous.status).toBe(401);
    expect(anonymous.headers.get("x-request-id")).toMatch(UUID_V7);
    await t.management().createProject({ projectId: "p-other", name: "other" });
    const res = await post(`${t.url}/v4/p-other/calc/add?async=true`, t.devToken, "{}");
    expect(res.status).toBe(403);
    expect(res.headers.get("x-request-id")).toMatch(UUID_V7);
  });
});

describe("invocation - async", () => {
  it('202 with exactly {"run_id"} and X-Request-Id; the run succeeds and GetRun returns its result', async () => {
    const res = await post(`${v4("calc", "add")}?async=true`, t.devToken, JSON.stringify({ a: 20, b: 22 }));
    expect(res.status).toBe(202);
    expect(res.headers.get("content-type")).toBe("application/json");
    const runId = res.headers.get("x-request-id")!;
    expect(runId).toMatch(UUID_V7);
    expect(res.text).toBe(`{"run_id":"${runId}"}`);
    const run = await vi.waitUntil(
      async () => {
        const r = (await t.management().getRun({ projectId: P, appName: "calc", runId })).run!;
        return r.status === "success" ? r : undefined;
      },
      { timeout: 60_000 },
    );
    expect(run).toMatchObject({ async: true, attempts: 1, statusCode: 200 });
    expect(run.result?.kind.case).toBe("structValue");
    const rest = await fetch(`${t.url}/v2/projects/${P}/apps/calc/runs/${runId}`, {
      headers: { authorization: `Bearer ${t.devToken}` },
    });
    const body = (await rest.json()) as { run: { status: string; result: { run_id: string; result: number } } };
    expect(body.run.status).toBe("success");
    expect(body.run.result).toMatchObject({ run_id: runId, result: 42 });
  });

  it("a function that raised in an async run reads failure", async () => {
    const res = await post(`${v4("calc", "fail")}?async=true`, t.devToken, "{}");
    const runId = res.json.run_id as string;
    const run = await vi.waitUntil(
      async () => {
        const r = (await t.management().getRun({ projectId: P, appName: "calc", runId })).run!;
        return r.status === "failure" ? r : undefined;
      },
      { timeout: 60_000 },
    );
    expect(run.error).toMatchObject({ type: "TypeError", message: "nope" });
  });
});
