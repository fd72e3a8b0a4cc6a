// Attacks that held: each request below is sent to a real skiff (node
// bin/skiff-server.js in a child process, so that a crash shows as its
// exit), and skiff must keep serving /healthz and never answer 500.
// Without a token: Connect timeouts (huge, negative, not a number),
// unknown and broken content encodings, odd Accept-Encoding, h2c upgrade
// offers (plain, with a body, chunked, with Expect), WebSocket upgrades with
// odd paths and percent-encoding, odd Hosts, trailers, many query
// parameters, duplicate headers, h2 streams with :path lacking "/", empty or
// odd :authority, HEAD with a body, odd grpc-timeout / grpc-encoding, and
// bodies cut off mid-way on HTTP/1.1 and h2 (RST_STREAM, session gone). With
// the dev token: Idempotency-Key (empty, 8000 bytes, latin1, repeated) on
// async runs, odd webhookEndpoint values, odd percent-encoding in /v4 and
// /v2 paths and query parameters, WebSocket upgrades with odd
// Sec-WebSocket-Key / -Version / -Protocol / Origin and bytes after the head.
import { spawn, type ChildProcess } from "node:child_process";
import http2 from "node:http2";
import net from "node:net";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SKIFF_SERVER, TEST_ROOT } from "../helpers/paths.js";

let child: ChildProcess;
let stderr = "";
let dataDir: string;
let port: number;
let token: string;
let exited: Promise<number | string>;

beforeAll(async () => {
  dataDir = await mkdtemp(join(tmpdir(), "skiff-request-crash-"));
  child = spawn(process.execPath, [SKIFF_SERVER], {
    cwd: join(TEST_ROOT, ".."),
    env: { PATH: process.env.PATH, HOME: process.env.HOME, CI: "1", SKIFF_PORT: "0", SKIFF_DATA_DIR: dataDir },
    stdio: ["ignore", "pipe", "pipe"],
  });
  child.stderr!.on("data", (d: Buffer) => (stderr = (stderr + d.toString()).slice(-4000)));
  exited = new Promise((resolve) => child.once("exit", (code, signal) => resolve(code ?? signal ?? "?")));
  const url = await new Promise<string>((resolve, reject) => {
    createInterface({ input: child.stdout! }).on("line", (text) => {
      const m = /skiff serves (http:\/\/\S+)/.exec(text);
      if (m) resolve(m[1]);
    });
    void exited.then((code) => reject(new Error(`skiff exited with ${code} before it served`)));
  });
  port = Number(new URL(url).port);
  token = (await readFile(join(dataDir, "dev-token"), "utf8")).trim();
}, 60_000);

afterAll(async () => {
  if (child && child.exitCode === null && child.signalCode === null) {
    child.kill("SIGTERM");
    const timer = setTimeout(() => child.kill("SIGKILL"), 15_000);
    await exited;
    clearTimeout(timer);
  }
  await rm(dataDir, { recursive: true, force: true });
});

/** Sends raw bytes (latin1); resolves with the first status line, "closed" or "late" (none within `ms`). */
function send(request: string, ms = 4_000, abortAfterMs?: number): Promise<string> {
  return new Promise((resolve) => {
    const socket = net.connect(port, "127.0.0.1");
    let data = "";
    const first = () => data.split("\r\n")[0];
    const timer = setTimeout(() => (socket.destroy(), resolve(first() || "late")), abortAfterMs ?? ms);
    socket.on("data", (d: Buffer) => {
      data += d.toString("latin1");
      if (abortAfterMs === undefined && data.includes("\r\n")) {
        clearTimeout(timer);
        socket.destroy();
        resolve(first());
      }
    });
    socket.on("error", () => undefined);
    socket.on("close", () => {
      clearTimeout(timer);
      resolve(first() || "closed");
    });
    socket.write(Buffer.from(request, "latin1"));
  });
}

async function fate(): Promise<string> {
  const gone = await Promise.race([exited, new Promise((r) => setTimeout(() => r(undefined), 300))]);
  if (gone !== undefined) return `exited (${String(gone)}): ${stderr.split("\n").slice(0, 3).join(" / ")}`;
  const status = await send("GET /healthz HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n");
  return status.startsWith("HTTP/1.1 200") ? "serving" : `healthz: ${status}`;
}

const HEALTH = "/grpc.health.v1.Health/Check";
const post = (path: string, headers: string, body = "{}") =>
  `POST ${path} HTTP/1.1\r\nhost: x\r\n${headers}content-length: ${Buffer.byteLength(body, "latin1")}\r\n\r\n${body}`;
const json = "content-type: application/json\r\n";

describe("single requests that skiff survives, answering no 500", () => {
  it("without a token, HTTP/1.1", async () => {
    const ws = (path: string, extra = "") =>
      `GET ${path} HTTP/1.1\r\nhost: x\r\nconnection: Upgrade\r\nupgrade: websocket\r\n${extra}\r\n`;
    const attacks = [
      post(HEALTH, json + "connect-timeout-ms: 99999999999999999999\r\n"),
      post(HEALTH, json + "connect-timeout-ms: -5\r\n"),
      post(HEALTH, json + "connect-timeout-ms: abc\r\n"),
      post(HEALTH, json + "content-encoding: gzip\r\n"),
      post(HEALTH, json + "accept-encoding: gzip;q=abc, *, br;;;\r\n"),
      post(HEALTH, "content-type: application/grpc-web+json\r\ngrpc-timeout: -1S\r\n", "\x00\x00\x00\x00\x02{}"),
      post(HEALTH, "content-type: application/grpc-web+json\r\ngrpc-encoding: snappy\r\n", "\x01\x00\x00\x00\x02{}"),
      post(HEALTH, "content-type: application/grpc-web+proto\r\ngrpc-encoding: gzip\r\n", "\x01\x00\x00\x00\x02{}"),
      `GET ${HEALTH}?connect=v1&encoding=json&message=%FF&base64=1&compression=br HTTP/1.1\r\nhost: x\r\n\r\n`,
      post(HEALTH, json + "host: y\r\n"),
      post(HEALTH, json.replace("json", "json\r\ncontent-type: application/proto")),
      `GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: upgrade, http2-settings\r\nupgrade: h2c\r\nhttp2-settings: AAMAAABkAAQAAP__\r\n\r\n`,
      `POST ${HEALTH} HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: h2c\r\n${json}content-length: 2\r\n\r\n{}`,
      `POST /v2/projects HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: foo\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n`,
      `POST /v2/projects HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: h2c\r\nexpect: weird\r\ncontent-length: 2\r\n\r\n{}`,
      `GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: h2c\r\n\r\n`.repeat(20),
      ws("/%FF"),
      ws("/v4/%E0%A4%A/x/y"),
      ws("/v4/p-dev/x/y", "sec-websocket-protocol: bearer., , ,bearer.\r\n"),
      ws(HEALTH).replace("host: x", "host: ["),
      `POST ${HEALTH} HTTP/1.1\r\nhost: x\r\n${json}transfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\nx-a: b\r\n\r\n`,
      `GET /v2/projects?${Array.from({ length: 2000 }, (_, i) => `a${i}=%ff`).join("&")} HTTP/1.1\r\nhost: x\r\n\r\n`,
      `GET /v2/projects/%E0%A4%A HTTP/1.1\r\nhost: [\r\n\r\n`,
      `OPTIONS * HTTP/1.1\r\nhost: x\r\n\r\n`,
      `CONNECT x:1 HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n`,
    ];
    for (const attack of attacks) {
      const status = await send(attack);
      expect(status, attack.slice(0, 120)).not.toMatch(/^HTTP\/1\.1 50[02-9]/);
    }
    expect(await fate()).toBe("serving");
    // Bodies cut off mid-way.
    const cut = [
      `POST ${HEALTH} HTTP/1.1\r\nhost: x\r\n${json}content-length: 100\r\n\r\n{`,
      `POST /grpc.health.v1.Health/Watch HTTP/1.1\r\nhost: x\r\ncontent-type: application/connect+json\r\ncontent-length: 100\r\n\r\n\x00\x00\x00\x00\x50{`,
      `POST ${HEALTH} HTTP/1.1\r\nhost: x\r\ncontent-type: application/grpc-web+json\r\ncontent-length: 100\r\n\r\n\x00\x00\x00\x00\x50{`,
    ];
    for (const attack of cut) await send(attack, 0, 300);
    expect(await fate()).toBe("serving");
  }, 60_000);

  it("with the dev token, HTTP/1.1", async () => {
    const auth = `authorization: Bearer ${token}\r\n`;
    const V = "/v4/p-dev/custom-http/hello";
    const attacks = [
      post(`${V}?async=true`, auth + "idempotency-key: \r\n"),
      post(`${V}?async=true`, auth + `idempotency-key: ${"k".repeat(8000)}\r\n`),
      post(`${V}?async=true`, auth + "idempotency-key: \xff\xfe\x80\r\n"),
      post(`${V}?async=true`, auth + "idempotency-key: a\r\nidempotency-key: b\r\n"),
      post(V, auth + "idempotency-key: \xff\r\nx-idempotency: \xff\r\n"),
      post(`${V}?async=true&webhookEndpoint=http://[`, auth),
      post(`${V}?async=true&webhookEndpoint=http://example.com:99999/x`, auth),
      post(`${V}?async=true&webhookEndpoint=%ff%fe`, auth),
      post(`${V}?async=true&webhookEndpoint=http://xn--/`, auth),
      post(`${V}?async=TRUE&async=1&async=%ff`, auth),
      post("/v4/p-dev/custom-http/%E0%A4%A", auth),
      post("/v4/p-dev/custom-http%2Fx/y", auth),
      post("/v4/p-dev/hello-node/run", auth + json, "[".repeat(100000) + "]".repeat(100000)),
      post("/v4/p-dev/hello-node/run", auth + json, '{"__proto__":{"x":1}}'),
      `GET /v2/projects/p-dev/apps/custom-http/runs?page_size=1e999&page_token=%ff HTTP/1.1\r\nhost: x\r\n${auth}\r\n`,
      `GET /v2/projects/p-dev/apps/custom-http/runs/${"r".repeat(3000)} HTTP/1.1\r\nhost: x\r\n${auth}\r\n`,
    ];
    const key = "sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n";
    const ws = (extra: string, tail = "") =>
      `GET /v4/p-dev/custom-http/ws HTTP/1.1\r\nhost: x\r\nconnection: Upgrade\r\nupgrade: websocket\r\n${extra}\r\n${tail}`;
    attacks.push(
      ws(auth + "sec-websocket-key: \xff\xfe\r\nsec-websocket-version: 999999999999\r\n"),
      ws(auth + key + "origin: \xff://[\r\nsec-websocket-protocol: \xff, ,,, \x80\r\n"),
      ws(key + `sec-websocket-protocol: bearer.${token}, chat\r\nsec-websocket-protocol: x, bearer.y\r\n`),
      ws(auth + key, "\xff".repeat(10000)),
      ws(auth + key + "content-length: 5\r\n", "hello"),
    );
    for (const attack of attacks) {
      const status = await send(attack, 8_000);
      expect(status, attack.slice(0, 120)).not.toMatch(/^HTTP\/1\.1 50[02-9]/);
    }
    const cut = [
      `POST ${V} HTTP/1.1\r\nhost: x\r\n${auth}content-length: 100000\r\n\r\n${"x".repeat(5000)}`,
      `POST ${V}?async=true HTTP/1.1\r\nhost: x\r\n${auth}transfer-encoding: chunked\r\n\r\n10\r\n0123456789abcdef\r\n`,
      `POST /v2/projects/p-dev/apps HTTP/1.1\r\nhost: x\r\n${auth}${json}content-length: 5000000\r\n\r\n{"app_name":"x","bundle":"`,
    ];
    for (const attack of cut) await send(attack, 0, 300);
    expect(await fate()).toBe("serving");
  }, 60_000);

  it("h2c streams: odd pseudo-headers, HEAD with a body, odd grpc headers, streams cut off", async () => {
    const session = http2.connect(`http://127.0.0.1:${port}`);
    session.on("error", () => undefined);
    const stream = (headers: http2.OutgoingHttpHeaders, body?: string | Buffer, cut = false) =>
      new Promise<string>((resolve) => {
        const req = session.request(headers, { endStream: body === undefined });
        let status = "none";
        const timer = setTimeout(() => (req.close(http2.constants.NGHTTP2_CANCEL), resolve(status)), 4_000);
        req.on("response", (h) => (status = String(h[":status"])));
        req.on("error", () => undefined);
        req.on("close", () => (clearTimeout(timer), resolve(status)));
        req.resume();
        if (body === undefined) return;
        if (!cut) return void req.end(body);
        req.write(body);
        setTimeout(() => req.close(http2.constants.NGHTTP2_CANCEL), 200);
      });
    const g = (h: http2.OutgoingHttpHeaders) => ({
      ":method": "POST",
      ":path": HEALTH,
      "content-type": "application/json",
      ...h,
    });
    const env = Buffer.from([0, 0, 0, 0, 2, 0x7b, 0x7d]);
    const cases: [http2.OutgoingHttpHeaders, (string | Buffer)?, boolean?][] = [
      [g({ ":path": "grpc.health.v1.Health/Check" }), "{}"],
      [g({ ":path": "*" }), "{}"],
      [{ ":method": "GET", ":path": "http://[/" }],
      [g({ ":authority": "u:p@h" }), "{}"],
      [g({ ":authority": "a%zz" }), "{}"],
      [{ ":method": "GET", ":path": "/", ":authority": "[" }],
      [{ ":method": "GET", ":path": "/metrics", ":authority": "[" }],
      [g({ host: "[" }), "{}"],
      [g({ ":method": "HEAD" }), "{}"],
      [{ ":method": "HEAD", ":path": "/v2/projects" }, "{}"],
      [g({ "content-type": "application/grpc", "grpc-timeout": "999999999999n" }), env],
      [g({ "content-type": "application/grpc+json", "grpc-encoding": "zstd" }), env],
      [
        g({ "content-type": "application/grpc+json", "grpc-encoding": "gzip" }),
        Buffer.from([1, 0, 0, 0, 2, 0x7b, 0x7d]),
      ],
      [g({ "content-type": "application/grpc", ":path": "/x.Y/Z", ":authority": "[" }), env],
      [g({ "connect-timeout-ms": "1e400" }), "{}"],
      [
        { ":method": "POST", ":path": "/v4/p-dev/custom-http/hello", authorization: `Bearer ${token}` },
        "x".repeat(70000),
        true,
      ],
      [g({ "content-type": "application/grpc" }), Buffer.from([0, 0, 0, 0, 9, 1]), true],
      [g({}), "{", true],
    ];
    for (const [headers, body, cut] of cases) {
      const status = await stream(headers, body, cut);
      expect(status, JSON.stringify(headers)).not.toMatch(/^50[02-9]$/);
    }
    session.destroy();
    expect(await fate()).toBe("serving");
  }, 60_000);
});
