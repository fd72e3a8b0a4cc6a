// Large bodies between a caller and a Custom app stream both ways instead of
// being held whole: a REST body larger than STREAM_BODIES_ABOVE (or
// chunked) reaches the replica as the caller sends it, and an answer larger
// than that reaches the caller as the app writes it. The size limit still
// holds for a streamed body (413), a caller gone mid-body cancels the run,
// and the paths that need a body whole (a Cortex app, a queued run) still
// get it whole. The request bodies' cases run twice: on the runner of the
// process that took the call, and through a gateway without a runner, whose
// runs go to a runner process over NATS (runner-client/nats.ts).
import { createHash } from "node:crypto";
import http from "node:http";
import http2 from "node:http2";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { STREAM_BODIES_ABOVE } from "../../services/runs/index.js";
import { startTestRunner, startTestSkiff, type TestSkiff } from "../helpers/skiff.js";
import { P, cortexApp, deploy, post } from "../helpers/run-apps.js";
import { followRunRecords, type RunRecords } from "../helpers/run-records.js";
import { skiffToml } from "../helpers/apps.js";

const LIMIT = 4 * 1024 * 1024;
const APP = "bodies";
const SERVER = `
import http from "node:http";
import http2 from "node:http2";
import { createHash } from "node:crypto";
let gate;
http.createServer((req, res) => serve(req, res).catch(() => res.destroy())).listen(Number(process.env.PORT), "127.0.0.1");
async function serve(req, res) {
  const url = new URL(req.url, "http://x");
  if (url.pathname === "/health") return res.end("ok");
  if (url.pathname === "/interactive") {
    // One line back per chunk, as each arrives: only a body that streams both ways gets an answer before its end.
    res.writeHead(200, { "content-type": "text/plain" });
    for await (const chunk of req) res.write("got " + chunk.length + "\\n");
    return res.end("end\\n");
  }
  if (url.pathname === "/digest") {
    const hash = createHash("sha256");
    let size = 0;
    for await (const chunk of req) { hash.update(chunk); size += chunk.length; }
    res.setHeader("content-type", "application/json");
    return res.end(JSON.stringify({ size, sha256: hash.digest("hex"), length: req.headers["content-length"] ?? null, chunked: req.headers["transfer-encoding"] === "chunked" }));
  }
  if (url.pathname === "/early") return res.end("early");
  if (url.pathname === "/headers") {
    res.setHeader("content-type", "text/csv");
    res.setHeader("content-disposition", 'attachment; filename="runs.csv"');
    res.setHeader("content-language", "de");
    res.setHeader("set-cookie", ["a=1", "b=2"]);
    res.setHeader("x-app", "bodies");
    res.setHeader("x-request-id", "the app's own");
    return res.end("a,b\\n");
  }
  if (url.pathname === "/big") {
    // Half now, the rest once /open is called: only an answer that streams shows its head before /open.
    const half = Buffer.alloc(Number(url.searchParams.get("n")) / 2, 97);
    res.writeHead(200, { "content-type": "application/octet-stream", "content-length": String(half.length * 2) });
    res.write(half);
    await new Promise((resolve) => (gate = resolve));
    return res.end(half);
  }
  if (url.pathname === "/open") { gate?.(); return res.end("opened"); }
  if (url.pathname === "/status") { res.writeHead(Number(url.searchParams.get("s"))); return res.end("odd"); }
  res.statusCode = 404;
  res.end();
}
`;

let t: TestSkiff;
let records: RunRecords;
const url = (rest: string, app = APP) => `${t.url}/v4/${P}/${app}/${rest}`;

/**
 * Skiff with the apps deployed: one process with every role, or (`remote`)
 * a gateway without a runner whose runs go to a runner process over NATS.
 */
async function setUp(remote: boolean): Promise<() => Promise<void>> {
  const env = { SKIFF_MAX_BODY_BYTES: String(LIMIT), ...(remote ? { SKIFF_ROLES: "invocation,management" } : {}) };
  t = await startTestSkiff({ env });
  const runner = remote ? await startTestRunner(t) : undefined;
  records = await followRunRecords(t.skiff.nats.nc);
  const tmp = await mkdtemp(path.join(tmpdir(), "skiff-bodies-"));
  await deploy(tmp, t.management(), {
    "skiff.toml": skiffToml({
      name: APP,
      runtime: { kind: "custom", command: ["node", "server.mjs"] },
      scaling: { max_replicas: 1, replica_concurrency: 8 },
    }),
    "server.mjs": SERVER,
  });
  await deploy(tmp, t.management(), cortexApp("calc", { max_replicas: 1 }));
  await rm(tmp, { recursive: true, force: true });
  const hosts = (runner?.skiff ?? t.skiff).runner!;
  await vi.waitUntil(() => hosts.version(P, APP) === 1 && hosts.version(P, "calc") === 1, { timeout: 60_000 });
  return async () => {
    records.stop();
    await runner?.close();
    await t.close();
  };
}

describe.each([
  ["on this process's runner", false],
  ["through a runner over NATS", true],
])("%s", (_where, remote) => {
  let tearDown: (() => Promise<void>) | undefined;
  beforeAll(async () => {
    tearDown = await setUp(remote);
  }, 90_000);
  afterAll(async () => {
    await tearDown?.();
  });
  requestBodies();
  if (!remote) answers();
  it("an app's status outside HTTP's 100-599 is answered 502 bad_status, on every path alike", async () => {
    for (const status of [600, 999]) {
      const res = await post(url(`status?s=${status}`), t.devToken, "{}");
      expect(res.status, res.text).toBe(502);
      expect(res.json.error).toMatchObject({ type: "bad_status" });
      expect(res.json.error.message).toContain(String(status));
    }
    expect((await post(url("status?s=599"), t.devToken, "{}")).status).toBe(599);
  });
});

/** A REST call whose body the test writes piece by piece (chunked unless `length` is given). */
function upload(rest: string, length?: number, app = APP) {
  const agent = new http.Agent({ keepAlive: false });
  const req = http.request(url(rest, app), {
    method: "POST",
    agent,
    headers: {
      authorization: `Bearer ${t.devToken}`,
      "content-type": "application/octet-stream",
      ...(length === undefined ? {} : { "content-length": String(length) }),
    },
  });
  req.on("error", () => {});
  const response = new Promise<http.IncomingMessage>((resolve) => req.once("response", resolve));
  return { req, response };
}

/** Reads lines of a streamed answer one at a time. */
function lines(res: http.IncomingMessage) {
  let buffered = "";
  const waiting: ((line: string) => void)[] = [];
  const ready: string[] = [];
  res.setEncoding("utf8");
  res.on("data", (text: string) => {
    buffered += text;
    let i;
    while ((i = buffered.indexOf("\n")) >= 0) {
      const line = buffered.slice(0, i);
      buffered = buffered.slice(i + 1);
      const w = waiting.shift();
      if (w) w(line);
      else ready.push(line);
    }
  });
  return () =>
    ready.length > 0 ? Promise.resolve(ready.shift()!) : new Promise<string>((resolve) => waiting.push(resolve));
}

async function readAll(res: http.IncomingMessage): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const chunk of res) parts.push(chunk as Buffer);
  return Buffer.concat(parts);
}

function requestBodies() {
  describe("a request body streams to a Custom app", () => {
    it("reaches the app chunk by chunk while the caller is still sending it", async () => {
      const { req, response } = upload("interactive");
      req.write(Buffer.alloc(1000, 1));
      const res = await response;
      expect(res.statusCode).toBe(200);
      const next = lines(res);
      // Each line answers a chunk the caller sent after it read the line before: a body read whole would wait forever.
      expect(await next()).toBe("got 1000");
      req.write(Buffer.alloc(2000, 2));
      expect(await next()).toBe("got 2000");
      req.write(Buffer.alloc(3000, 3));
      expect(await next()).toBe("got 3000");
      req.end();
      expect(await next()).toBe("end");
      const runId = res.headers["x-request-id"] as string;
      expect(await records.final(runId)).toMatchObject({ status: "success", status_code: 200 });
    });

    it("over HTTP/2 too, and a stream reset cancels the run", async () => {
      const session = http2.connect(t.url);
      try {
        const stream = session.request({
          ":method": "POST",
          ":path": `/v4/${P}/${APP}/interactive`,
          authorization: `Bearer ${t.devToken}`,
          "content-type": "application/octet-stream",
        });
        const head = new Promise<http2.IncomingHttpHeaders>((resolve) => stream.once("response", resolve));
        stream.write(Buffer.alloc(1000, 1));
        const headers = await head;
        expect(headers[":status"]).toBe(200);
        const next = lines(stream as unknown as http.IncomingMessage);
        expect(await next()).toBe("got 1000");
        stream.write(Buffer.alloc(2000, 2));
        expect(await next()).toBe("got 2000");
        stream.close(http2.constants.NGHTTP2_CANCEL);
        const rec = await records.final(headers["x-request-id"] as string);
        expect(rec).toMatchObject({ status: "cancelled" });
      } finally {
        session.close();
      }
    });

    it.each([
      ["with a Content-Length", true],
      ["chunked", false],
    ])("arrives whole and in order, %s", async (_name, declared) => {
      const body = Buffer.alloc(3 * 1024 * 1024);
      for (let i = 0; i < body.length; i += 4) body.writeUInt32LE(i, i);
      const { req, response } = upload("digest", declared ? body.length : undefined);
      for (let i = 0; i < body.length; i += 256 * 1024) req.write(body.subarray(i, i + 256 * 1024));
      req.end();
      const res = await response;
      expect(res.statusCode).toBe(200);
      expect(JSON.parse((await readAll(res)).toString())).toEqual({
        size: body.length,
        sha256: createHash("sha256").update(body).digest("hex"),
        length: declared ? String(body.length) : null,
        chunked: !declared,
      });
    });

    it("a small body still goes whole, with its length", async () => {
      const res = await post(url("digest"), t.devToken, "hello", { "content-type": "text/plain" });
      expect(res.status).toBe(200);
      expect(res.json).toMatchObject({ size: 5, length: "5", chunked: false });
    });

    it("an app that answers before reading the body: the caller gets the answer, the next call works", async () => {
      const body = Buffer.alloc(2 * 1024 * 1024, 7);
      const res = await fetch(url("early"), {
        method: "POST",
        headers: { authorization: `Bearer ${t.devToken}`, "content-type": "application/octet-stream" },
        body,
      });
      expect(res.status).toBe(200);
      expect(await res.text()).toBe("early");
      const again = await post(url("digest"), t.devToken, "x", { "content-type": "text/plain" });
      expect(again.json).toMatchObject({ size: 1 });
    });

    it("a chunked body past SKIFF_MAX_BODY_BYTES is refused with 413 midway, and the run says so", async () => {
      const { req, response } = upload("digest");
      const piece = Buffer.alloc(512 * 1024, 5);
      let sent = 0;
      const write = (): void => {
        if (sent > LIMIT + piece.length * 2) return void req.end();
        sent += piece.length;
        if (req.write(piece)) setImmediate(write);
        else req.once("drain", write);
      };
      write();
      const res = await response;
      expect(res.statusCode).toBe(413);
      expect(JSON.parse((await readAll(res)).toString())).toEqual({
        code: "resource_exhausted",
        message: `request body larger than ${LIMIT} bytes`,
      });
      const runId = res.headers["x-request-id"] as string;
      expect(await records.final(runId)).toMatchObject({
        status: "failure",
        status_code: 413,
        error: { type: "request_too_large" },
      });
    });

    it("a declared length past the limit is refused before the app is called", async () => {
      const { req, response } = upload("digest", LIMIT + 1);
      req.write(Buffer.alloc(1000));
      const res = await response;
      expect(res.statusCode).toBe(413);
      req.destroy();
    });

    it("a caller gone in the middle of its body cancels the run", async () => {
      const { req, response } = upload("interactive");
      req.write(Buffer.alloc(1000, 1));
      const res = await response;
      const next = lines(res);
      expect(await next()).toBe("got 1000");
      const runId = res.headers["x-request-id"] as string;
      req.destroy();
      expect(await records.final(runId)).toMatchObject({ status: "cancelled" });
      // The replica is still there for the next call.
      const again = await post(url("digest"), t.devToken, "x", { "content-type": "text/plain" });
      expect(again.json).toMatchObject({ size: 1 });
    });

    it("a Cortex app still gets its large arguments whole", async () => {
      const a = "1".repeat(400 * 1024);
      expect(a.length).toBeGreaterThan(STREAM_BODIES_ABOVE);
      const { req, response } = upload("add", undefined, "calc");
      req.write(`{"a": ${JSON.stringify(a)},`);
      req.end(`"b": "2"}`);
      const res = await response;
      expect(res.statusCode).toBe(200);
      const json = JSON.parse((await readAll(res)).toString()) as { result: string };
      expect(json.result).toBe(`${a}2`);
    }, 20_000);

    it("a queued run keeps its large body whole", async () => {
      const body = Buffer.alloc(STREAM_BODIES_ABOVE * 2, 9);
      const { req, response } = upload("digest?async=true");
      req.end(body);
      const res = await response;
      expect(res.statusCode).toBe(202);
      const { run_id: runId } = JSON.parse((await readAll(res)).toString()) as { run_id: string };
      const final = await records.final(runId, 30_000);
      expect(final).toMatchObject({ status: "success" });
      const got = await fetch(`${t.url}/v2/projects/${P}/apps/${APP}/runs/${runId}`, {
        headers: { authorization: `Bearer ${t.devToken}` },
      });
      const { run } = (await got.json()) as { run: { result: { size: number; chunked: boolean } } };
      expect(run.result).toMatchObject({ size: body.length, chunked: false });
    }, 40_000);
  });
}

function answers() {
  describe("an app's answer headers", () => {
    it("reach a REST caller as the app sent them, Content-* and repeated Set-Cookie included", async () => {
      const res = await fetch(url("headers"), { method: "POST", headers: { authorization: `Bearer ${t.devToken}` } });
      expect(res.status).toBe(200);
      expect(res.headers.get("content-type")).toBe("text/csv");
      expect(res.headers.get("content-disposition")).toBe('attachment; filename="runs.csv"');
      expect(res.headers.get("content-language")).toBe("de");
      expect(res.headers.getSetCookie()).toEqual(["a=1", "b=2"]);
      expect(res.headers.get("x-app")).toBe("bodies");
      // skiff's own: the run id.
      expect(res.headers.get("x-request-id")).not.toBe("the app's own");
      expect(await res.text()).toBe("a,b\n");
    });
  });

  describe("a large answer streams to the caller", () => {
    it("its head and first part arrive before the app has written the rest", async () => {
      const n = 2 * 1024 * 1024;
      const res = await fetch(url(`big?n=${n}`), {
        method: "POST",
        headers: { authorization: `Bearer ${t.devToken}` },
      });
      expect(res.status).toBe(200);
      const reader = res.body!.getReader();
      let got = 0;
      // Half the body arrives while the app still holds the rest: an answer read whole would not have a head yet.
      while (got < n / 2) got += (await reader.read()).value!.byteLength;
      expect(got).toBe(n / 2);
      const open = await post(url("open"), t.devToken, "");
      expect(open.text).toBe("opened");
      for (let r = await reader.read(); !r.done; r = await reader.read()) got += r.value.byteLength;
      expect(got).toBe(n);
      const runId = res.headers.get("x-request-id")!;
      expect(await records.final(runId)).toMatchObject({ status: "success", response_bytes: n });
    });
  });

  describe("a caller gone during a streamed answer", () => {
    it("over HTTP/2 (a stream reset) cancels the run", async () => {
      const session = http2.connect(t.url);
      try {
        const n = 2 * 1024 * 1024;
        const stream = session.request({
          ":method": "POST",
          ":path": `/v4/${P}/${APP}/big?n=${n}`,
          authorization: `Bearer ${t.devToken}`,
        });
        stream.end();
        const headers = await new Promise<http2.IncomingHttpHeaders>((resolve) => stream.once("response", resolve));
        let got = 0;
        await new Promise<void>((resolve) =>
          stream.on("data", (chunk: Buffer) => {
            got += chunk.byteLength;
            if (got >= n / 2) resolve();
          }),
        );
        // The app holds the rest of its answer: only the reset can end this run.
        stream.close(http2.constants.NGHTTP2_CANCEL);
        const runId = headers["x-request-id"] as string;
        expect(await records.final(runId)).toMatchObject({ status: "cancelled" });
      } finally {
        session.close();
      }
    });
  });
}
