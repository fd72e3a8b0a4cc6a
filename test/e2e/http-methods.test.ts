// Every HTTP method and the query string through a real skiff (every role,
// sandboxed replicas) to Custom apps written as users write them: a FastAPI
// app under uvicorn (Debian's python3-fastapi and python3-uvicorn) with GET,
// POST, PUT and DELETE routes, query parameters, a health check, an HTML page
// with a static asset and a WebSocket endpoint; a plain Node server for HEAD,
// OPTIONS and PATCH, once without and once with a CORS allow-list. Connect
// callers of Run and RunStream carry the method and query; a queued run
// keeps them. Cortex apps take POST only, and a body that does not fit a
// function's parameters is the caller's 400, in Python and in Node.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { toJson } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import WebSocket from "ws";
import { InvocationService } from "../../gen/skiff/invocation/v4/invocation_pb.js";
import { skiffToml } from "../helpers/apps.js";
import { deploy, P, UUID_V7 } from "../helpers/run-apps.js";
import { bearer, startTestSkiff, type TestSkiff } from "../helpers/skiff.js";
import { startReceiver, type Receiver } from "../helpers/webhook-receiver.js";

const FASTAPI_MAIN = `
import os

import uvicorn
from fastapi import FastAPI, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import HTMLResponse, PlainTextResponse

app = FastAPI()
store = {}


@app.get("/health")
def health():
    return {"status": "ok"}


@app.get("/", response_class=HTMLResponse)
def page():
    return '<!doctype html><html><head><script src="./assets/app.js"></script></head><body>shop</body></html>'


@app.get("/assets/app.js")
def asset():
    return PlainTextResponse("console.log('shop');", media_type="application/javascript")


@app.get("/items/{item_id}")
def read_item(item_id: str, request: Request, limit: int = 10):
    return {
        "item_id": item_id,
        "value": store.get(item_id),
        "limit": limit,
        "tags": request.query_params.getlist("tag"),
        "query": request.url.query,
    }


@app.post("/items")
async def create_item(request: Request):
    return {"created": await request.json(), "query": request.url.query}


@app.put("/items/{item_id}")
async def put_item(item_id: str, request: Request):
    store[item_id] = await request.json()
    return {"stored": item_id}


@app.delete("/items/{item_id}")
def delete_item(item_id: str):
    return {"deleted": item_id, "existed": store.pop(item_id, None) is not None}


@app.websocket("/ws")
async def echo(websocket: WebSocket):
    await websocket.accept()
    try:
        while True:
            text = await websocket.receive_text()
            await websocket.send_text("echo: " + text)
    except WebSocketDisconnect:
        pass


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["PORT"]), log_level="warning")
`;

const NODE_SERVER = `
import http from "node:http";
http
  .createServer((req, res) => {
    if (req.url === "/health") return res.end("ok");
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      if (req.method === "OPTIONS") {
        res.writeHead(204, { allow: "GET, HEAD, PATCH, OPTIONS", "x-app-options": "yes" });
        return res.end();
      }
      const out = JSON.stringify({ method: req.method, url: req.url, body: Buffer.concat(chunks).toString() });
      res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(out), "x-method": req.method });
      res.end(req.method === "HEAD" ? undefined : out);
    });
  })
  .listen(Number(process.env.PORT), "127.0.0.1");
`;

const WEB_ORIGIN = "https://shop.example";

let t: TestSkiff;
let tmp: string;
let receiver: Receiver;
let invocation: Client<typeof InvocationService>;
const v4 = (app: string, rest: string) => `${t.url}/v4/${P}/${app}/${rest}`;

interface Answer {
  status: number;
  headers: Headers;
  text: string;
}

async function call(method: string, url: string, init: { body?: string; headers?: Record<string, string> } = {}) {
  const res = await fetch(url, {
    method,
    headers: { authorization: `Bearer ${t.devToken}`, ...init.headers },
    body: init.body,
  });
  return { status: res.status, headers: res.headers, text: await res.text() } satisfies Answer;
}

const json = (a: Answer) => JSON.parse(a.text) as Record<string, unknown>;

async function finalRun(app: string, runId: string) {
  return vi.waitUntil(
    async () => {
      const r = await t
        .management()
        .getRun({ projectId: P, appName: app, runId })
        .catch(() => undefined);
      return r?.run && ["success", "failure"].includes(r.run.status) ? r.run : undefined;
    },
    { timeout: 60_000, interval: 100 },
  );
}

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-http-methods-"));
  // The webhook receiver is on this machine.
  t = await startTestSkiff({ env: { SKIFF_WEBHOOK_ALLOWED_CIDRS: "127.0.0.0/8" } });
  receiver = await startReceiver(() => 200);
  invocation = createClient(
    InvocationService,
    createConnectTransport({ baseUrl: t.url, httpVersion: "1.1", interceptors: [bearer(t.devToken)] }),
  );
  const client = t.management();
  const scaling = { max_replicas: 1, replica_concurrency: 8, response_grace_period: 60 };
  await deploy(tmp, client, {
    "skiff.toml": skiffToml({
      name: "shop",
      runtime: { kind: "custom", command: ["python3", "main.py"], healthcheck: "/health" },
      scaling,
    }),
    "main.py": FASTAPI_MAIN,
  });
  // The shape such apps are published in: uvicorn's own command on a fixed port.
  await deploy(tmp, client, {
    "skiff.toml": skiffToml({
      name: "shop-cli",
      runtime: {
        kind: "custom",
        command: ["uvicorn", "main:app", "--host", "0.0.0.0", "--port", "5000"],
        healthcheck: "/health",
        port: 5000,
      },
      scaling,
    }),
    "main.py": FASTAPI_MAIN,
  });
  const node = { kind: "custom" as const, command: ["node", "server.mjs"], healthcheck: "/health" };
  await deploy(tmp, client, {
    "skiff.toml": skiffToml({ name: "plain", runtime: node, scaling }),
    "server.mjs": NODE_SERVER,
  });
  await deploy(tmp, client, {
    "skiff.toml": `${skiffToml({ name: "web", runtime: node, scaling })}\n[cors]\nallow_origins = ["${WEB_ORIGIN}"]\n`,
    "server.mjs": NODE_SERVER,
  });
  await deploy(tmp, client, {
    "skiff.toml": skiffToml({
      name: "py-fn",
      runtime: { kind: "cortex", language: "python", entry: "main.py" },
      scaling,
    }),
    "main.py": [
      "def predict(prompt, max_tokens=16, *, temperature=0.5):",
      "    return {'prompt': prompt, 'max_tokens': max_tokens}",
      "",
      "def anything(**kwargs):",
      "    return sorted(kwargs)",
    ].join("\n"),
  });
  await deploy(tmp, client, {
    "skiff.toml": skiffToml({
      name: "node-fn",
      runtime: { kind: "cortex", language: "node", entry: "index.mjs" },
      scaling,
    }),
    "index.mjs": [
      "export function greet({ name, greeting = 'hello' }) { return `${greeting} ${name}`; }",
      "export const keys = async ({ first, ...others }) => [first, Object.keys(others)];",
      "export function loose(args) { return Object.keys(args); }",
    ].join("\n"),
  });
}, 120_000);

afterAll(async () => {
  await receiver?.close();
  await t?.close();
  if (tmp) await rm(tmp, { recursive: true, force: true });
});

describe("http methods - a FastAPI app under uvicorn", () => {
  it("GET, POST, PUT and DELETE reach its routes, with the query as written less skiff's own parameters", async () => {
    const health = await call("GET", v4("shop", "health"));
    expect(health.status).toBe(200);
    expect(json(health)).toEqual({ status: "ok" });
    expect(health.headers.get("x-request-id")).toMatch(UUID_V7);

    const put = await call("PUT", v4("shop", "items/a1"), {
      body: JSON.stringify({ colour: "red" }),
      headers: { "content-type": "application/json" },
    });
    expect([put.status, json(put)]).toEqual([200, { stored: "a1" }]);

    const got = await call("GET", v4("shop", "items/a1?tag=x&async=false&limit=3&tag=y%20z&webhookEndpoint="));
    expect(got.status).toBe(200);
    expect(json(got)).toEqual({
      item_id: "a1",
      value: { colour: "red" },
      limit: 3,
      tags: ["x", "y z"],
      query: "tag=x&limit=3&tag=y%20z",
    });

    const created = await call("POST", v4("shop", "items?src=form+1"), {
      body: JSON.stringify({ n: 1 }),
      headers: { "content-type": "application/json" },
    });
    expect(json(created)).toEqual({ created: { n: 1 }, query: "src=form+1" });

    const deleted = await call("DELETE", v4("shop", "items/a1"));
    expect(json(deleted)).toEqual({ deleted: "a1", existed: true });
    const again = await call("GET", v4("shop", "items/a1"));
    expect(json(again)).toMatchObject({ value: null, limit: 10 });
    const wrong = await call("PATCH", v4("shop", "items/a1"));
    expect(wrong.status).toBe(405); // FastAPI's own answer, passed through
  });

  it("served by uvicorn's own command on a fixed port, it answers the same", async () => {
    const got = await call("GET", v4("shop-cli", "items/b2?tag=t&limit=1"));
    expect(json(got)).toEqual({ item_id: "b2", value: null, limit: 1, tags: ["t"], query: "tag=t&limit=1" });
    const deleted = await call("DELETE", v4("shop-cli", "items/b2"));
    expect(json(deleted)).toEqual({ deleted: "b2", existed: false });
  });

  it("a page and its static assets load with GET, as a Gradio-like UI's do", async () => {
    const page = await call("GET", v4("shop", ""));
    expect(page.status).toBe(200);
    expect(page.headers.get("content-type")).toMatch(/^text\/html/);
    expect(page.text).toContain('<script src="./assets/app.js">');
    const asset = await call("GET", v4("shop", "assets/app.js"));
    expect(asset.status).toBe(200);
    expect(asset.headers.get("content-type")).toMatch(/^application\/javascript/);
    expect(asset.text).toBe("console.log('shop');");
  });

  it("its WebSocket endpoint answers through skiff", async () => {
    const ws = new WebSocket(`${t.url.replace(/^http/, "ws")}/v4/${P}/shop/ws?room=1`, {
      headers: { authorization: `Bearer ${t.devToken}` },
    });
    await new Promise<void>((resolve, reject) => {
      ws.once("open", () => resolve());
      ws.once("error", reject);
      ws.once("unexpected-response", (_req, res) => reject(new Error(`unexpected ${res.statusCode}`)));
    });
    const replies: string[] = [];
    const two = new Promise<void>((resolve) =>
      ws.on("message", (data) => {
        replies.push(String(data));
        if (replies.length === 2) resolve();
      }),
    );
    ws.send("hi");
    ws.send("there");
    await two;
    expect(replies).toEqual(["echo: hi", "echo: there"]);
    ws.close(1000);
    await new Promise((resolve) => ws.once("close", resolve));
  });
});

describe("http methods - a Node server", () => {
  it("HEAD answers the app's head and no body; OPTIONS and PATCH reach the app", async () => {
    const head = await call("HEAD", v4("plain", "thing?x=1"));
    expect(head.status).toBe(200);
    expect(head.headers.get("x-method")).toBe("HEAD");
    expect(head.headers.get("content-type")).toBe("application/json");
    expect(head.text).toBe("");

    const options = await call("OPTIONS", v4("plain", "thing"), {
      headers: { origin: WEB_ORIGIN, "access-control-request-method": "PATCH" },
    });
    expect(options.status).toBe(204);
    expect(options.headers.get("x-app-options")).toBe("yes");
    expect(options.headers.get("allow")).toBe("GET, HEAD, PATCH, OPTIONS");
    expect(options.headers.get("access-control-allow-origin")).toBeNull();

    const patch = await call("PATCH", v4("plain", "thing/7?op=add&async=0"), {
      body: "+1",
      headers: { "content-type": "text/plain" },
    });
    expect(json(patch)).toEqual({ method: "PATCH", url: "/thing/7?op=add", body: "+1" });
  });

  it("GET with async=true is queued like a POST: 202 {run_id}, and the run keeps its method and query", async () => {
    const res = await call("GET", v4("plain", "report?async=true&month=2026-11&sort=-date"));
    expect(res.status).toBe(202);
    const runId = res.headers.get("x-request-id")!;
    expect(JSON.parse(res.text)).toEqual({ run_id: runId });
    const run = await finalRun("plain", runId);
    expect(run.status).toBe("success");
    expect(run.async).toBe(true);
    expect(toJson(ValueSchema, run.result!)).toEqual({
      method: "GET",
      url: "/report?month=2026-11&sort=-date",
      body: "",
    });
  });

  it("webhookEndpoint works on any method: a sync PUT's answer and a queued DELETE's are POSTed to it", async () => {
    const hook = encodeURIComponent(`${receiver.url}/hooks`);
    const put = await call("PUT", v4("plain", `doc?v=1&webhookEndpoint=${hook}`), { body: "new" });
    expect(json(put)).toEqual({ method: "PUT", url: "/doc?v=1", body: "new" });
    const del = await call("DELETE", v4("plain", `doc?webhookEndpoint=${hook}&async=true`));
    expect(del.status).toBe(202);
    const got = await receiver.waitFor("/hooks", 2, 60_000);
    const bodies = got.map((r) => JSON.parse(r.body.toString()) as unknown);
    expect(got.every((r) => r.method === "POST")).toBe(true);
    expect(bodies).toEqual(
      expect.arrayContaining([
        { method: "PUT", url: "/doc?v=1", body: "new" },
        { method: "DELETE", url: "/doc", body: "" },
      ]),
    );
    expect(new Set(got.map((r) => r.headers["x-request-id"]))).toEqual(
      new Set([put.headers.get("x-request-id"), del.headers.get("x-request-id")]),
    );
  });

  it("Connect's Run and RunStream carry the method and query; a method skiff does not know is invalid_argument", async () => {
    const res = await invocation.run({
      projectId: P,
      appName: "plain",
      path: "x/y",
      method: "put",
      query: "?a=1&b=%2F",
    });
    expect(res.statusCode).toBe(200);
    expect(JSON.parse(new TextDecoder().decode(res.body!.data))).toEqual({
      method: "PUT",
      url: "/x/y?a=1&b=%2F",
      body: "",
    });
    const parts: Uint8Array[] = [];
    let head: number | undefined;
    for await (const part of invocation.runStream({
      projectId: P,
      appName: "plain",
      path: "z",
      method: "DELETE",
      query: "keep=1&webhookEndpoint=x",
    })) {
      if (part.part.case === "head") head = part.part.value.statusCode;
      else if (part.part.case === "chunk") parts.push(part.part.value);
    }
    expect(head).toBe(200);
    expect(JSON.parse(Buffer.concat(parts).toString())).toEqual({ method: "DELETE", url: "/z?keep=1", body: "" });
    const plainPost = await invocation.run({ projectId: P, appName: "plain", path: "p" });
    expect(JSON.parse(new TextDecoder().decode(plainPost.body!.data))).toMatchObject({ method: "POST", url: "/p" });
    for (const [method, query] of [
      ["BREW", ""],
      ["GET", "a b"],
      ["GET", "a#b"],
    ]) {
      const err = await invocation.run({ projectId: P, appName: "plain", path: "p", method, query }).catch((e) => e);
      expect(err).toBeInstanceOf(ConnectError);
      expect((err as ConnectError).code).toBe(Code.InvalidArgument);
    }
  });

  it("with a CORS allow-list skiff answers preflights and marks answers of listed origins", async () => {
    const preflight = await fetch(v4("web", "thing"), {
      method: "OPTIONS",
      headers: {
        origin: WEB_ORIGIN,
        "access-control-request-method": "PATCH",
        "access-control-request-headers": "authorization, content-type",
      },
    });
    expect(preflight.status).toBe(204);
    expect(preflight.headers.get("access-control-allow-origin")).toBe(WEB_ORIGIN);
    expect(preflight.headers.get("access-control-allow-methods")).toContain("PATCH");
    expect(preflight.headers.get("access-control-allow-headers")).toBe("authorization, content-type");
    expect(preflight.headers.get("x-app-options")).toBeNull();

    const answer = await call("PATCH", v4("web", "thing"), { body: "b", headers: { origin: WEB_ORIGIN } });
    expect(answer.status).toBe(200);
    expect(answer.headers.get("access-control-allow-origin")).toBe(WEB_ORIGIN);
    expect(answer.headers.get("vary")).toBe("Origin");
    const stranger = await call("GET", v4("web", "thing"), { headers: { origin: "https://other.example" } });
    expect(stranger.status).toBe(200);
    expect(stranger.headers.get("access-control-allow-origin")).toBeNull();
    // The management API shows the list.
    const app = (await t.management().getApp({ projectId: P, appName: "web" })).app!;
    expect(app.runtime?.corsAllowOrigins).toEqual([WEB_ORIGIN]);
    // An OPTIONS that is no preflight still reaches the app.
    const plainOptions = await call("OPTIONS", v4("web", "thing"));
    expect(plainOptions.headers.get("x-app-options")).toBe("yes");
  });
});

describe("http methods - Cortex apps", () => {
  it("a method other than POST is 405 with Allow: POST, over REST and Connect", async () => {
    for (const method of ["GET", "PUT", "DELETE", "OPTIONS"]) {
      const res = await call(method, v4("py-fn", "predict"));
      expect(res.status).toBe(405);
      expect(res.headers.get("allow")).toBe("POST");
      expect(json(res)).toMatchObject({ code: "unimplemented" });
    }
    const err = await invocation
      .run({ projectId: P, appName: "node-fn", path: "greet", method: "GET" })
      .catch((e) => e);
    expect((err as ConnectError).code).toBe(Code.Unimplemented);
  });

  it.each([
    ["py-fn", "predict", {}, 'missing required parameter "prompt"'],
    ["py-fn", "predict", { prompt: "p", top_k: 3 }, 'unknown parameter "top_k"'],
    ["node-fn", "greet", { greeting: "hi" }, 'missing required parameter "name"'],
    ["node-fn", "greet", { name: "a", shout: true }, 'unknown parameter "shout"'],
    ["node-fn", "keys", { others: 1 }, 'missing required parameter "first"'],
  ])("%s.%s with %j: 400 invalid_argument naming it, the run a failure of the caller", async (app, fn, body, says) => {
    const res = await call("POST", v4(app, fn), {
      body: JSON.stringify(body),
      headers: { "content-type": "application/json" },
    });
    expect(res.status).toBe(400);
    expect(json(res)).toEqual({ code: "invalid_argument", message: expect.stringContaining(says) });
    expect(json(res).message).toContain("the caller's body does not fit");
    const run = await finalRun(app, res.headers.get("x-request-id")!);
    expect(run.status).toBe("failure");
    expect(run.statusCode).toBe(400);
    expect(run.error).toMatchObject({ type: "invalid_argument", message: expect.stringContaining(says) });
  });

  it("bodies that fit go through: defaults, **kwargs, a rest element, a plain parameter", async () => {
    const ok = async (app: string, fn: string, body: unknown) => {
      const res = await call("POST", v4(app, fn), {
        body: JSON.stringify(body),
        headers: { "content-type": "application/json" },
      });
      expect(res.status, res.text).toBe(200);
      return json(res).result;
    };
    expect(await ok("py-fn", "predict", { prompt: "p" })).toEqual({ prompt: "p", max_tokens: 16 });
    expect(await ok("py-fn", "anything", { z: 1, a: 2 })).toEqual(["a", "z"]);
    expect(await ok("node-fn", "greet", { name: "ada" })).toBe("hello ada");
    expect(await ok("node-fn", "keys", { first: 1, x: 2 })).toEqual([1, ["x"]]);
    expect(await ok("node-fn", "loose", { any: 1 })).toEqual(["any"]);
  });

  it("an async call whose body does not fit is accepted, then fails as the caller's error", async () => {
    const res = await call("POST", v4("py-fn", "predict?async=true"), {
      body: JSON.stringify({ prompt: "p", nope: 1 }),
      headers: { "content-type": "application/json" },
    });
    expect(res.status).toBe(202);
    const run = await finalRun("py-fn", res.headers.get("x-request-id")!);
    expect(run.status).toBe("failure");
    expect(run.error).toMatchObject({ type: "invalid_argument", message: expect.stringContaining('"nope"') });
  });
});
