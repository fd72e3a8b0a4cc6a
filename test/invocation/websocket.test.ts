// WebSockets to Custom apps through a real skiff (every role, sandboxed
// replicas) with the `ws` client: echo, subprotocols and the token in one,
// close codes both ways, the refusals before the upgrade, the limits
// (message size, idle, response_grace_period, connections per app), a
// replica that dies, and the run record of each connection.
import { cp, mkdtemp, rm, writeFile } from "node:fs/promises";
import { request as httpRequest } from "node:http";
import type http from "node:http";
import { tmpdir } from "node:os";
import path from "node:path";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import WebSocket from "ws";
import { packApp } from "../../services/apps/bundle.js";
import type { RunRecord } from "../../services/runs/store.js";
import { skiffToml } from "../helpers/apps.js";
import { followRunRecords, type RunRecords } from "../helpers/run-records.js";
import { cortexApp, deploy, P, UUID_V7 } from "../helpers/run-apps.js";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";
import { TEST_ROOT } from "../helpers/paths.js";

const ROOT = path.resolve(TEST_ROOT, "..");
const EXAMPLE = path.join(ROOT, "examples", "ws-echo");
const MAX_MESSAGE = 4096;
const IDLE_MS = 3000;

let t: TestSkiff;
let tmp: string;
let runs: RunRecords;
const wsUrl = (app: string, rest = "echo") => `${t.url.replace(/^http/, "ws")}/v4/${P}/${app}/${rest}`;

/** The ws-echo example under another name and scaling. */
async function deployEcho(name: string, scaling: Record<string, number>): Promise<void> {
  const dir = await mkdtemp(path.join(tmp, `${name}-`));
  await cp(EXAMPLE, dir, { recursive: true });
  await writeFile(
    path.join(dir, "skiff.toml"),
    skiffToml({ name, runtime: { kind: "custom", command: ["node", "server.mjs"], healthcheck: "/health" }, scaling }),
  );
  await t
    .management()
    .deployApp({ projectId: P, bundle: { contentType: "application/gzip", data: (await packApp(dir)).bytes } });
}

interface Opened {
  ws: WebSocket;
  runId: string;
  response: http.IncomingMessage;
}

/** Opens a WebSocket; resolves once it is open, with the run id of its 101. */
function open(url: string, opts: { token?: string; protocols?: string[] } = {}): Promise<Opened> {
  const token = opts.token ?? t.devToken;
  const ws = new WebSocket(url, opts.protocols ?? [], {
    headers: token === "" ? {} : { authorization: `Bearer ${token}` },
  });
  return new Promise((resolve, reject) => {
    let response: http.IncomingMessage | undefined;
    ws.once("upgrade", (res) => (response = res));
    ws.once("open", () => resolve({ ws, runId: String(response!.headers["x-request-id"]), response: response! }));
    ws.once("unexpected-response", (_req, res) => reject(new Error(`unexpected ${res.statusCode}`)));
    ws.once("error", reject);
  });
}

interface Refusal {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: { code: string; message: string };
}

/** A handshake that skiff must refuse: its plain HTTP answer. */
function refused(url: string, opts: { headers?: Record<string, string>; protocols?: string[] } = {}): Promise<Refusal> {
  const ws = new WebSocket(url, opts.protocols ?? [], { headers: opts.headers ?? {} });
  return new Promise((resolve, reject) => {
    ws.once("open", () => reject(new Error("the handshake was accepted")));
    ws.once("error", reject);
    ws.once("unexpected-response", (_req, res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () =>
        resolve({ status: res.statusCode!, headers: res.headers, body: JSON.parse(Buffer.concat(chunks).toString()) }),
      );
    });
  });
}

function nextMessage(ws: WebSocket): Promise<{ data: Buffer; binary: boolean }> {
  return new Promise((resolve) => ws.once("message", (data: Buffer, binary) => resolve({ data, binary })));
}

function closed(ws: WebSocket): Promise<{ code: number; reason: string }> {
  return new Promise((resolve) => ws.once("close", (code, reason) => resolve({ code, reason: reason.toString() })));
}

/** The run's final record, once its event is published. */
async function finalRecord(app: string, runId: string): Promise<RunRecord> {
  const record = await runs.final(runId);
  expect(record.app_name).toBe(app);
  return record;
}

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-ws-"));
  t = await startTestSkiff({
    env: {
      SKIFF_WEBSOCKET_MAX_MESSAGE_BYTES: String(MAX_MESSAGE),
      SKIFF_WEBSOCKET_IDLE_TIMEOUT_MS: String(IDLE_MS),
      SKIFF_WEBSOCKET_MAX_CONNECTIONS_PER_APP: "2",
    },
  });
  runs = await followRunRecords(t.skiff.nats.nc);
  await t
    .management()
    .deployApp({ projectId: P, bundle: { contentType: "application/gzip", data: (await packApp(EXAMPLE)).bytes } });
  await deployEcho("ws-short", { response_grace_period: 2, replica_concurrency: 10 });
  await deployEcho("ws-cap", { replica_concurrency: 10 });
  await deploy(tmp, t.management(), cortexApp("calc", {}));
  await vi.waitUntil(
    () => ["ws-echo", "ws-short", "ws-cap", "calc"].every((app) => t.skiff.runner!.version(P, app) === 1),
    { timeout: 60_000 },
  );
}, 90_000);

afterAll(async () => {
  await t?.close();
  await rm(tmp, { recursive: true, force: true });
});

describe("WebSockets - the connection", () => {
  it("echoes text and binary messages; the 101 carries X-Request-Id, the run id", async () => {
    const { ws, runId } = await open(wsUrl("ws-echo"));
    expect(runId).toMatch(UUID_V7);
    ws.send("hello");
    expect(await nextMessage(ws)).toEqual({ data: Buffer.from("hello"), binary: false });
    const bytes = Buffer.from([0, 1, 2, 255, 254]);
    ws.send(bytes);
    expect(await nextMessage(ws)).toEqual({ data: bytes, binary: true });
    const big = Buffer.alloc(MAX_MESSAGE, 7); // exactly the limit passes
    ws.send(big);
    expect((await nextMessage(ws)).data.equals(big)).toBe(true);
    ws.close(1000, "done");
    expect(await closed(ws)).toEqual({ code: 1000, reason: "done" });
    const record = await finalRecord("ws-echo", runId);
    expect(record).toMatchObject({ status: "success", status_code: 101, path: "/echo", async: false });
    expect(record.websocket).toMatchObject({
      close_code: 1000,
      close_reason: "done",
      closed_by: "caller",
      messages_in: 3,
      messages_out: 3,
    });
    // Frames: payloads plus their headers (masked ones from the caller are 4 bytes longer).
    expect(record.websocket!.bytes_in).toBeGreaterThan(5 + 5 + MAX_MESSAGE);
    expect(record.websocket!.bytes_out).toBeGreaterThan(5 + 5 + MAX_MESSAGE);
    expect(record.websocket!.bytes_in).toBeGreaterThan(record.websocket!.bytes_out);
    // GetRun shows the same once the run history has the final event (it follows the events), over REST too.
    const run = await vi.waitUntil(
      async () => {
        const { run } = await t.management().getRun({ projectId: P, appName: "ws-echo", runId });
        return run?.websocket ? run : undefined;
      },
      { timeout: 30_000, interval: 50 },
    );
    expect(run.websocket).toMatchObject({ closeCode: 1000, closeReason: "done", closedBy: "caller", messagesIn: 3n });
    const rest = await fetch(`${t.url}/v2/projects/${P}/apps/ws-echo/runs/${runId}`, {
      headers: { authorization: `Bearer ${t.devToken}` },
    });
    expect(((await rest.json()) as { run: { websocket: unknown } }).run.websocket).toMatchObject({
      close_code: 1000,
      closed_by: "caller",
      bytes_in: String(record.websocket!.bytes_in),
    });
  });

  it("the app gets the headers apps get and X-Request-Id; never the token, in a header or a subprotocol", async () => {
    const { ws, runId, response } = await open(`${wsUrl("ws-echo")}?x=1&async=false`, {
      protocols: ["echo", `bearer.${t.devToken}`],
      token: "",
    });
    expect(response.headers["sec-websocket-protocol"]).toBe("echo");
    expect(ws.protocol).toBe("echo");
    ws.send("headers");
    const seen = JSON.parse((await nextMessage(ws)).data.toString()) as {
      url: string;
      headers: Record<string, string>;
    };
    expect(seen.url).toBe("/echo?x=1");
    expect(seen.headers["x-request-id"]).toBe(runId);
    expect(seen.headers["sec-websocket-protocol"]).toBe("echo");
    expect(seen.headers.upgrade).toBe("websocket");
    expect(JSON.stringify(seen)).not.toContain(t.devToken);
    expect(seen.headers.authorization).toBeUndefined();
    ws.close();
    await closed(ws);
  });

  it("a token in the subprotocol alone is enough (browsers); the answer names that entry", async () => {
    const { ws, response } = await open(wsUrl("ws-echo"), { protocols: [`bearer.${t.devToken}`], token: "" });
    expect(response.headers["sec-websocket-protocol"]).toBe(`bearer.${t.devToken}`);
    ws.send("headers");
    const seen = JSON.parse((await nextMessage(ws)).data.toString()) as { headers: Record<string, string> };
    expect(seen.headers["sec-websocket-protocol"]).toBeUndefined();
    ws.close();
    await closed(ws);
  });

  it("the app's close code and reason reach the caller; the record says the app closed", async () => {
    const { ws, runId } = await open(wsUrl("ws-echo"));
    const done = closed(ws);
    ws.send("close 4002 bye now");
    expect(await done).toEqual({ code: 4002, reason: "bye now" });
    const record = await finalRecord("ws-echo", runId);
    expect(record.status).toBe("success");
    expect(record.websocket).toMatchObject({ close_code: 4002, close_reason: "bye now", closed_by: "app" });
  });

  it("a caller's close code reaches the app (it echoes it); 1011 from the app makes a failed run", async () => {
    const first = await open(wsUrl("ws-echo"));
    first.ws.close(4100, "caller leaves");
    expect(await closed(first.ws)).toEqual({ code: 4100, reason: "caller leaves" });
    expect((await finalRecord("ws-echo", first.runId)).websocket).toMatchObject({
      close_code: 4100,
      closed_by: "caller",
    });

    const second = await open(wsUrl("ws-echo"));
    const done = closed(second.ws);
    second.ws.send("close 1011 broken");
    expect(await done).toEqual({ code: 1011, reason: "broken" });
    const record = await finalRecord("ws-echo", second.runId);
    expect(record).toMatchObject({ status: "failure", error: { type: "internal_error" } });
  });

  it("an open connection shows in the skiff_websocket_connections gauge", async () => {
    const { ws } = await open(wsUrl("ws-echo"));
    const text = await (
      await fetch(`${t.url}/metrics`, { headers: { authorization: `Bearer ${t.adminToken}` } })
    ).text();
    expect(text).toMatch(/skiff_websocket_connections\{project="p-dev",app="ws-echo"\} [1-9]/);
    ws.close();
    await closed(ws);
  });
});

describe("WebSockets - refusals before the upgrade", () => {
  it("no token, a bad token: 401 with X-Request-Id", async () => {
    const none = await refused(wsUrl("ws-echo"));
    expect(none.status).toBe(401);
    expect(none.headers["x-request-id"]).toMatch(UUID_V7);
    expect(none.headers["www-authenticate"]).toBe('Bearer realm="skiff"');
    expect(none.body).toEqual({ code: "unauthenticated", message: expect.stringContaining("bearer.<token>") });
    const bad = await refused(wsUrl("ws-echo"), { headers: { authorization: "Bearer not-a-token" } });
    expect(bad.status).toBe(401);
    const badProtocol = await refused(wsUrl("ws-echo"), { protocols: ["bearer.not-a-token"] });
    expect(badProtocol.status).toBe(401);
  });

  it("a token of another project: 403", async () => {
    const admin = t.management();
    await admin.createProject({ projectId: "p-other" });
    const { token } = await admin.createServiceAccount({
      projectId: "p-other",
      name: "other",
      expiresAt: timestampFromDate(new Date(Date.now() + 86_400_000)),
    });
    const res = await refused(wsUrl("ws-echo"), { headers: { authorization: `Bearer ${token}` } });
    expect(res.status).toBe(403);
    expect(res.body.code).toBe("permission_denied");
    expect(res.headers["x-request-id"]).toMatch(UUID_V7);
  });

  it("an unknown app: 404; a path outside /v4: 404", async () => {
    const auth = { authorization: `Bearer ${t.devToken}` };
    const res = await refused(wsUrl("nope"), { headers: auth });
    expect(res.status).toBe(404);
    expect(res.body.message).toContain('"nope"');
    const elsewhere = await refused(`${t.url.replace(/^http/, "ws")}/v2/projects`, { headers: auth });
    expect(elsewhere.status).toBe(404);
    expect(elsewhere.headers["x-request-id"]).toMatch(UUID_V7);
  });

  it("webhookEndpoint: 400, webhooks work for HTTP requests only; async=true: 400; a Cortex app: 400", async () => {
    const auth = { authorization: `Bearer ${t.devToken}` };
    const hook = await refused(`${wsUrl("ws-echo")}?webhookEndpoint=${encodeURIComponent("http://127.0.0.1:9/x")}`, {
      headers: auth,
    });
    expect(hook.status).toBe(400);
    expect(hook.body.message).toContain("HTTP requests only");
    expect(hook.headers["x-request-id"]).toMatch(UUID_V7);
    const background = await refused(`${wsUrl("ws-echo")}?async=true`, { headers: auth });
    expect(background.status).toBe(400);
    expect(background.body.message).toContain("async=true");
    const cortex = await refused(wsUrl("calc", "add"), { headers: auth });
    expect(cortex.status).toBe(400);
    expect(cortex.body.message).toContain("Custom apps only");
  });

  it("the app's own refusal of the handshake passes through as an HTTP answer", async () => {
    const res = await new Promise<number>((resolve, reject) => {
      const ws = new WebSocket(wsUrl("ws-echo", "no-such-endpoint"), {
        headers: { authorization: `Bearer ${t.devToken}` },
      });
      ws.once("open", () => reject(new Error("accepted")));
      ws.once("error", reject);
      ws.once("unexpected-response", (_req, r) => {
        r.resume();
        resolve(r.statusCode!);
      });
    });
    expect(res).toBe(404);
  });

  it("beyond SKIFF_WEBSOCKET_MAX_CONNECTIONS_PER_APP: 429 with Retry-After", async () => {
    const a = await open(wsUrl("ws-cap"));
    const b = await open(wsUrl("ws-cap"));
    const third = await refused(wsUrl("ws-cap"), { headers: { authorization: `Bearer ${t.devToken}` } });
    expect(third.status).toBe(429);
    expect(third.headers["retry-after"]).toBe("1");
    expect(third.body.message).toContain("SKIFF_WEBSOCKET_MAX_CONNECTIONS_PER_APP");
    for (const { ws } of [a, b]) ws.close();
    await Promise.all([closed(a.ws), closed(b.ws)]);
    // Closed connections make room again.
    await vi.waitUntil(
      async () =>
        open(wsUrl("ws-cap"))
          .then(({ ws }) => (ws.close(), true))
          .catch(() => false),
      {
        timeout: 30_000,
      },
    );
  });
});

describe("upgrade offers that are not WebSockets", () => {
  /** A request with curl --http2's h2c upgrade offer. */
  function h2cOffer(method: string, path: string, body?: string): Promise<{ status: number; text: string }> {
    return new Promise((resolve, reject) => {
      const req = httpRequest(
        `${t.url}${path}`,
        {
          method,
          headers: {
            connection: "Upgrade, HTTP2-Settings",
            upgrade: "h2c",
            "http2-settings": "AAMAAABkAAQCAAAAAAIAAAAA",
            authorization: `Bearer ${t.devToken}`,
            "content-type": "application/json",
          },
        },
        (res) => {
          let text = "";
          res.on("data", (c: Buffer) => (text += c.toString()));
          res.on("end", () => resolve({ status: res.statusCode!, text }));
        },
      );
      req.on("error", reject);
      req.end(body);
    });
  }

  it("an h2c offer (curl --http2) is declined: the request is served over HTTP/1.1, its body included", async () => {
    expect(await h2cOffer("GET", "/healthz")).toEqual({ status: 200, text: '{"status":"ok"}' });
    const run = await h2cOffer("POST", `/v4/${P}/calc/add`, JSON.stringify({ a: 2, b: 3 }));
    expect(run.status).toBe(200);
    expect(JSON.parse(run.text)).toMatchObject({ result: 5 });
  });
});

describe("WebSockets - limits and failures", () => {
  it("a caller's message past SKIFF_WEBSOCKET_MAX_MESSAGE_BYTES closes the connection with 1009", async () => {
    const { ws, runId } = await open(wsUrl("ws-echo"));
    const done = closed(ws);
    ws.send(Buffer.alloc(MAX_MESSAGE + 1));
    const { code, reason } = await done;
    expect(code).toBe(1009);
    expect(reason).toContain("SKIFF_WEBSOCKET_MAX_MESSAGE_BYTES");
    const record = await finalRecord("ws-echo", runId);
    expect(record).toMatchObject({ status: "failure", error: { type: "message_too_big" } });
    expect(record.websocket).toMatchObject({ close_code: 1009, closed_by: "skiff", messages_in: 0 });
  });

  it("a message in fragments counts whole: fragments past the limit together close it with 1009", async () => {
    const { ws } = await open(wsUrl("ws-echo"));
    const done = closed(ws);
    const half = Buffer.alloc(MAX_MESSAGE / 2 + 1, 1);
    ws.send(half, { fin: false });
    ws.send(half, { fin: true });
    expect((await done).code).toBe(1009);
  });

  it("a replica that dies closes the caller's socket with 1011; the run fails with close code 1006", async () => {
    const { ws, runId } = await open(wsUrl("ws-echo"));
    const done = closed(ws);
    ws.send("crash");
    expect((await done).code).toBe(1011);
    const record = await finalRecord("ws-echo", runId);
    expect(record).toMatchObject({ status: "failure", error: { type: "replica_crashed" } });
    expect(record.websocket).toMatchObject({ close_code: 1006, closed_by: "app" });
    // The pool replaces the replica: the next connection works.
    const again = await vi.waitUntil(() => open(wsUrl("ws-echo")).catch(() => undefined), { timeout: 60_000 });
    again.ws.send("still here");
    expect((await nextMessage(again.ws)).data.toString()).toBe("still here");
    again.ws.close();
    await closed(again.ws);
  });

  it("a caller that drops without a close frame: 1006, closed by the caller, not a replica crash", async () => {
    for (const drop of [
      (ws: WebSocket) => ws.terminate(), // its socket destroyed
      (ws: WebSocket) => (ws as unknown as { _socket: { end(): void } })._socket.end(), // a half-close (FIN)
    ]) {
      const { ws, runId } = await open(wsUrl("ws-echo"));
      ws.send("hi");
      await nextMessage(ws);
      drop(ws);
      const record = await finalRecord("ws-echo", runId);
      expect(record).toMatchObject({ status: "failure", error: { type: "connection_dropped" } });
      expect(record.websocket).toMatchObject({ close_code: 1006, closed_by: "caller" });
    }
  });

  it("response_grace_period bounds a connection: 1008 with the reason, and a failed run", async () => {
    const { ws, runId } = await open(wsUrl("ws-short"));
    const done = closed(ws);
    // Traffic keeps it from going idle; the grace period ends it anyway.
    const ping = setInterval(() => ws.readyState === WebSocket.OPEN && ws.ping(), 200);
    const { code, reason } = await done;
    clearInterval(ping);
    expect(code).toBe(1008);
    expect(reason).toContain("response_grace_period (2 s)");
    const record = await finalRecord("ws-short", runId);
    expect(record).toMatchObject({ status: "failure", error: { type: "timeout" } });
    expect(record.websocket).toMatchObject({ close_code: 1008, closed_by: "skiff" });
  });

  it("CancelRun closes the connection with 1000 and the run reads cancelled", async () => {
    const { ws, runId } = await open(wsUrl("ws-echo"));
    const done = closed(ws);
    // The running record is written at the 101; the cancel finds the process that holds the connection.
    await vi.waitUntil(() => runs.latest(runId)?.status === "running", {
      timeout: 30_000,
    });
    const { run } = await t.management().cancelRun({ projectId: P, appName: "ws-echo", runId });
    expect(run?.status).toBe("cancelled");
    expect(await done).toEqual({ code: 1000, reason: "the run was cancelled" });
    expect((await finalRecord("ws-echo", runId)).websocket).toMatchObject({ close_code: 1000, closed_by: "skiff" });
  });

  it("a token revoked while its connection is open closes it with 1008", async () => {
    const admin = t.management();
    const sa = await admin.createServiceAccount({
      projectId: P,
      name: "ws-short-lived",
      expiresAt: timestampFromDate(new Date(Date.now() + 86_400_000)),
    });
    const { ws, runId } = await open(wsUrl("ws-echo"), { token: sa.token });
    const done = closed(ws);
    ws.send("before");
    expect((await nextMessage(ws)).data.toString()).toBe("before");
    await admin.deleteServiceAccount({ projectId: P, serviceAccountId: sa.serviceAccount!.serviceAccountId });
    expect(await done).toEqual({ code: 1008, reason: "the token expired or was revoked" });
    expect(await finalRecord("ws-echo", runId)).toMatchObject({
      status: "failure",
      error: { type: "unauthenticated" },
    });
  });

  it("a connection idle past SKIFF_WEBSOCKET_IDLE_TIMEOUT_MS is closed with 1001", async () => {
    const { ws, runId } = await open(wsUrl("ws-echo"));
    const { code, reason } = await closed(ws);
    expect(code).toBe(1001);
    expect(reason).toContain("SKIFF_WEBSOCKET_IDLE_TIMEOUT_MS");
    const record = await finalRecord("ws-echo", runId);
    expect(record.status).toBe("success");
    expect(record.websocket).toMatchObject({ close_code: 1001, closed_by: "skiff" });
  });
});
