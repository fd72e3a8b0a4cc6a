// WebSockets across NATS: the gateway here runs no runner, so the handshake
// goes to a runner process over NATS and the bytes travel on the runner
// client's byte stream with flow control (runner-client/nats.ts,
// byte-stream.ts). The same example app as test/invocation/websocket.test.ts.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import WebSocket from "ws";
import { packApp } from "../../services/apps/bundle.js";
import { loadConfig } from "../../services/config/config.js";
import { silentLogger } from "../../services/config/logger.js";
import type { RunRecord } from "../../services/runs/store.js";
import { startSkiff } from "../../services/start.js";
import { P, UUID_V7 } from "../helpers/run-apps.js";
import { followRunRecords, type RunRecords } from "../helpers/run-records.js";
import { startTestRunner, startTestSkiff, type TestRunner, type TestSkiff } from "../helpers/skiff.js";
import { TEST_ROOT } from "../helpers/paths.js";

const ROOT = path.resolve(TEST_ROOT, "..");
const APP = "ws-echo";
const MAX_MESSAGE = 8 * 1024 * 1024;
let gateway: TestSkiff;
let runner: TestRunner;
let runs: RunRecords;
const url = () => `${gateway.url.replace(/^http/, "ws")}/v4/${P}/${APP}/echo`;

function open(): Promise<{ ws: WebSocket; runId: string }> {
  const ws = new WebSocket(url(), { headers: { authorization: `Bearer ${gateway.devToken}` } });
  return new Promise((resolve, reject) => {
    let runId = "";
    ws.once("upgrade", (res) => (runId = String(res.headers["x-request-id"])));
    ws.once("open", () => resolve({ ws, runId }));
    ws.once("unexpected-response", (_req, res) => reject(new Error(`unexpected ${res.statusCode}`)));
    ws.once("error", reject);
  });
}

const nextMessage = (ws: WebSocket) =>
  new Promise<{ data: Buffer; binary: boolean }>((resolve) =>
    ws.once("message", (data: Buffer, binary) => resolve({ data, binary })),
  );
const closed = (ws: WebSocket) =>
  new Promise<{ code: number; reason: string }>((resolve) =>
    ws.once("close", (code, reason) => resolve({ code, reason: reason.toString() })),
  );

async function finalRecord(runId: string): Promise<RunRecord> {
  return runs.final(runId);
}

beforeAll(async () => {
  gateway = await startTestSkiff({
    env: { SKIFF_ROLES: "invocation,management", SKIFF_WEBSOCKET_MAX_MESSAGE_BYTES: String(MAX_MESSAGE) },
  });
  runs = await followRunRecords(gateway.skiff.nats.nc);
  runner = await startTestRunner(gateway);
  const bundle = (await packApp(path.join(ROOT, "examples", APP))).bytes;
  await gateway.management().deployApp({ projectId: P, bundle: { contentType: "application/gzip", data: bundle } });
  // The runner takes handshakes once it has the app.
  const first = await vi.waitUntil(() => open().catch(() => undefined), { timeout: 60_000, interval: 200 });
  first.ws.close();
  await closed(first.ws);
}, 90_000);

afterAll(async () => {
  await runner?.close();
  await gateway?.close();
});

describe("WebSockets across NATS (a gateway without a runner)", () => {
  it("echoes text and binary, and messages larger than the stream's window, byte for byte", async () => {
    const { ws, runId } = await open();
    expect(runId).toMatch(UUID_V7);
    ws.send("hello");
    expect(await nextMessage(ws)).toEqual({ data: Buffer.from("hello"), binary: false });
    // 3 MiB each way: three windows of the subject pair, in 64 KiB messages.
    const big = Buffer.alloc(3 * 1024 * 1024);
    for (let i = 0; i < big.length; i++) big[i] = (i * 31) & 0xff;
    ws.send(big);
    const back = await nextMessage(ws);
    expect(back.binary).toBe(true);
    expect(back.data.equals(big)).toBe(true);
    ws.close(4000, "enough");
    expect(await closed(ws)).toEqual({ code: 4000, reason: "enough" });
    const record = await finalRecord(runId);
    expect(record).toMatchObject({ status: "success", status_code: 101 });
    expect(record.websocket).toMatchObject({ close_code: 4000, closed_by: "caller", messages_in: 2, messages_out: 2 });
    expect(record.websocket!.bytes_out).toBeGreaterThan(big.length);
  });

  it("the app sees X-Request-Id and not the token; its close code comes back", async () => {
    const { ws, runId } = await open();
    ws.send("headers");
    const seen = JSON.parse((await nextMessage(ws)).data.toString()) as { headers: Record<string, string> };
    expect(seen.headers["x-request-id"]).toBe(runId);
    expect(seen.headers.authorization).toBeUndefined();
    const done = closed(ws);
    ws.send("close 4002 bye");
    expect(await done).toEqual({ code: 4002, reason: "bye" });
    expect((await finalRecord(runId)).websocket).toMatchObject({ close_code: 4002, closed_by: "app" });
  });

  it("many connections at once each get their own bytes", async () => {
    const conns = await Promise.all(Array.from({ length: 8 }, () => open()));
    const answers = await Promise.all(
      conns.map(async ({ ws }, i) => {
        const got = nextMessage(ws);
        ws.send(`connection ${i}`);
        return (await got).data.toString();
      }),
    );
    expect(answers).toEqual(conns.map((_, i) => `connection ${i}`));
    await Promise.all(conns.map(({ ws }) => (ws.close(), closed(ws))));
  });

  it("a replica that dies on the runner closes the caller's socket with 1011", async () => {
    const { ws, runId } = await open();
    const done = closed(ws);
    ws.send("crash");
    expect((await done).code).toBe(1011);
    const record = await finalRecord(runId);
    expect(record).toMatchObject({ status: "failure", error: { type: "replica_crashed" } });
    expect(record.websocket).toMatchObject({ close_code: 1006, closed_by: "app" });
  });

  it("a gateway that stops closes its connections with 1001; the run is recorded", async () => {
    const dataDir = await mkdtemp(path.join(tmpdir(), "skiff-gateway-"));
    const second = await startSkiff(
      loadConfig({
        SKIFF_NATS_URL: gateway.nats.url,
        SKIFF_PORT: "0",
        SKIFF_DATA_DIR: dataDir,
        SKIFF_ROLES: "invocation",
      }),
      silentLogger,
    );
    try {
      const ws = new WebSocket(`${second.url.replace(/^http/, "ws")}/v4/${P}/${APP}/echo`, {
        headers: { authorization: `Bearer ${gateway.devToken}` },
      });
      let runId = "";
      ws.once("upgrade", (res) => (runId = String(res.headers["x-request-id"])));
      await new Promise((resolve, reject) => (ws.once("open", resolve), ws.once("error", reject)));
      const done = closed(ws);
      await second.close();
      expect(await done).toEqual({ code: 1001, reason: "skiff is shutting down" });
      const record = await finalRecord(runId);
      expect(record.status).toBe("success");
      expect(record.websocket).toMatchObject({ close_code: 1001, closed_by: "skiff" });
    } finally {
      await rm(dataDir, { recursive: true, force: true });
    }
  });

  it("with the runner gone, open connections close and a handshake gets 503", async () => {
    const { ws } = await vi.waitUntil(() => open().catch(() => undefined), { timeout: 60_000 });
    const done = closed(ws);
    await runner.close();
    // The app, stopped with SIGTERM, says "going away"; its connection ends.
    expect((await done).code).toBe(1001);
    const res = await new Promise<{ status: number; body: string }>((resolve, reject) => {
      const again = new WebSocket(url(), { headers: { authorization: `Bearer ${gateway.devToken}` } });
      again.once("open", () => reject(new Error("accepted")));
      again.once("error", reject);
      again.once("unexpected-response", (_req, r) => {
        let body = "";
        r.on("data", (c: Buffer) => (body += c.toString()));
        r.on("end", () => resolve({ status: r.statusCode!, body }));
      });
    });
    expect(res.status).toBe(503);
    expect(res.body).toContain("no runner hosts app");
  });
});
