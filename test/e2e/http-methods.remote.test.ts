// Every HTTP method and the query string across NATS: the gateway here runs
// no runner, so runs go to a runner process over NATS (runner-client/nats.ts,
// codec.ts run frames) and must keep the caller's method and query there,
// for REST and Connect callers alike; a Cortex body that does not fit comes
// back as the caller's 400.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { InvocationService } from "../../gen/skiff/invocation/v4/invocation_pb.js";
import { skiffToml } from "../helpers/apps.js";
import { deploy, P } from "../helpers/run-apps.js";
import { bearer, startTestRunner, startTestSkiff, type TestRunner, type TestSkiff } from "../helpers/skiff.js";

const SERVER = `
import http from "node:http";
http
  .createServer((req, res) => {
    if (req.url === "/health") return res.end("ok");
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      const out = JSON.stringify({ method: req.method, url: req.url, body: Buffer.concat(chunks).toString() });
      res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(out), "x-method": req.method });
      res.end(req.method === "HEAD" ? undefined : out);
    });
  })
  .listen(Number(process.env.PORT), "127.0.0.1");
`;

let gateway: TestSkiff;
let runner: TestRunner;
let tmp: string;
const v4 = (app: string, rest: string) => `${gateway.url}/v4/${P}/${app}/${rest}`;
const call = async (method: string, url: string, body?: string) => {
  const res = await fetch(url, { method, headers: { authorization: `Bearer ${gateway.devToken}` }, body });
  return { status: res.status, headers: res.headers, text: await res.text() };
};

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-http-remote-"));
  gateway = await startTestSkiff({ env: { SKIFF_ROLES: "invocation,management" } });
  runner = await startTestRunner(gateway);
  const client = gateway.management();
  const runtime = { kind: "custom" as const, command: ["node", "server.mjs"], healthcheck: "/health" };
  await deploy(tmp, client, { "skiff.toml": skiffToml({ name: "echo", runtime }), "server.mjs": SERVER });
  await deploy(tmp, client, {
    "skiff.toml": skiffToml({ name: "fns", runtime: { kind: "cortex", language: "node", entry: "index.mjs" } }),
    "index.mjs": "export function greet({ name }) { return `hi ${name}`; }",
  });
  await vi.waitUntil(async () => (await call("GET", v4("echo", "up"))).status === 200, {
    timeout: 60_000,
    interval: 200,
  });
}, 120_000);
afterAll(async () => {
  await runner?.close();
  await gateway?.close();
  if (tmp) await rm(tmp, { recursive: true, force: true });
});

describe("http methods through a runner over NATS", () => {
  it("REST: PUT, DELETE and HEAD reach the app with their query as written; HEAD answers no body", async () => {
    const put = await call("PUT", v4("echo", "doc/1?rev=2&async=false&x=%20y"), "body");
    expect(JSON.parse(put.text)).toEqual({ method: "PUT", url: "/doc/1?rev=2&x=%20y", body: "body" });
    const del = await call("DELETE", v4("echo", "doc/1"));
    expect(JSON.parse(del.text)).toMatchObject({ method: "DELETE", url: "/doc/1" });
    const head = await call("HEAD", v4("echo", "doc/1?h=1"));
    expect([head.status, head.headers.get("x-method"), head.text]).toEqual([200, "HEAD", ""]);
  });

  it("gRPC: Run and RunStream carry the method and query", async () => {
    const client = createClient(
      InvocationService,
      createGrpcTransport({ baseUrl: gateway.url, interceptors: [bearer(gateway.devToken)] }),
    );
    const res = await client.run({ projectId: P, appName: "echo", path: "a", method: "PATCH", query: "k=v&k=w" });
    expect(JSON.parse(new TextDecoder().decode(res.body!.data))).toEqual({
      method: "PATCH",
      url: "/a?k=v&k=w",
      body: "",
    });
    const parts: Uint8Array[] = [];
    for await (const part of client.runStream({
      projectId: P,
      appName: "echo",
      path: "b",
      method: "GET",
      query: "q=1",
    }))
      if (part.part.case === "chunk") parts.push(part.part.value);
    expect(JSON.parse(Buffer.concat(parts).toString())).toEqual({ method: "GET", url: "/b?q=1", body: "" });
  });

  it("a Cortex body that does not fit is the caller's 400 invalid_argument across NATS too", async () => {
    const res = await call("POST", v4("fns", "greet"), JSON.stringify({ nom: "x" }));
    expect(res.status).toBe(400);
    expect(JSON.parse(res.text)).toEqual({
      code: "invalid_argument",
      message: expect.stringContaining('unknown parameter "nom"'),
    });
  });
});
