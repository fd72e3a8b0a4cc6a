// The hop to a replica through its pool of keep-alive connections
// (Replica.send): a connection is reused across calls, one the replica
// closes between calls is replaced without failing the next, a streamed
// answer larger than any buffer arrives whole at its reader's pace (the app's
// writes wait while nobody reads), a cancel mid-answer closes the connection,
// an answer past the cap is cut, trailers and every method and query reach
// their side. A real app process, unsandboxed, on 127.0.0.1.
import { createHash } from "node:crypto";
import { describe, expect, it, vi } from "vitest";
import { AnswerTooLarge, type Exchange, type ReplicaRequest } from "../../services/runner/replica.js";
import { nodeReplicaForFile } from "../helpers/node-replica.js";

const BIG = 64 * 1024 * 1024;

// The app: its connections by remote port, how much of /big it has written, and the responses cut before their end.
const APP = `
import http from "node:http";
import { createHash } from "node:crypto";
let written = 0, cut = 0, closedSockets = 0;
const block = Buffer.alloc(64 * 1024, 7);
const server = http.createServer((req, res) => {
  const url = new URL(req.url, "http://x");
  req.socket.on("close", () => closedSockets++);
  if (url.pathname === "/health") return res.end("ok");
  if (url.pathname === "/port") return res.end(String(req.socket.remotePort));
  if (url.pathname === "/stats") return res.end(JSON.stringify({ written, cut, closedSockets }));
  if (url.pathname === "/close-after") {
    res.end(String(req.socket.remotePort));
    // The connection is closed once the answer is out, without saying so in the answer.
    return res.on("finish", () => setTimeout(() => req.socket.destroy(), 20));
  }
  if (url.pathname === "/echo") {
    const hash = createHash("sha256");
    let size = 0;
    req.on("data", (c) => { size += c.length; hash.update(c); });
    req.on("end", () => {
      const body = JSON.stringify({ method: req.method, url: req.url, size, sha256: hash.digest("hex"), headers: req.headers });
      res.setHeader("x-method", req.method);
      res.setHeader("set-cookie", ["a=1", "b=2"]);
      res.end(req.method === "HEAD" ? undefined : body);
    });
    return;
  }
  if (url.pathname === "/big") {
    const total = Number(url.searchParams.get("bytes"));
    if (url.searchParams.has("length")) res.setHeader("content-length", total);
    if (url.searchParams.has("trailer")) res.addTrailers({ "x-skiff-error": '{"type":"E","message":"m"}' });
    written = 0;
    res.on("close", () => { if (!res.writableFinished) cut++; });
    const more = () => {
      while (written < total) {
        const n = Math.min(block.length, total - written);
        written += n;
        if (!res.write(n === block.length ? block : block.subarray(0, n))) return res.once("drain", more);
      }
      res.end();
    };
    return more();
  }
  res.statusCode = 404;
  res.end();
});
server.listen(Number(process.env.PORT), "127.0.0.1");
`;

const held = nodeReplicaForFile(APP, "pool", 2);

function send(
  method: string,
  target: string,
  opts: { body?: Uint8Array; mayStream?: boolean; maxBody?: number; onRequest?: (r: ReplicaRequest) => void } = {},
): Promise<Exchange> {
  const body = opts.body ?? new Uint8Array(0);
  return held.replica.send(
    method,
    target,
    { "content-length": body.byteLength, "x-request-id": "run-1" },
    body,
    opts.onRequest ?? (() => undefined),
    opts.mayStream ?? false,
    Infinity,
    opts.maxBody ?? Infinity,
  );
}

const text = async (target: string) => (await send("GET", target)).body.toString();
const stats = async () => JSON.parse(await text("/stats")) as { written: number; cut: number; closedSockets: number };

describe("the pooled hop to a replica", () => {
  it("reuses one keep-alive connection across calls", async () => {
    const ports = new Set<string>();
    for (let i = 0; i < 5; i++) ports.add(await text("/port"));
    expect(ports.size).toBe(1);
  });

  it("replaces a connection the replica closed between calls, and the next call is answered", async () => {
    const before = await text("/close-after");
    await vi.waitUntil(async () => (await stats()).closedSockets > 0, { timeout: 5_000 });
    const after = await send("GET", "/port");
    expect(after.status).toBe(200);
    expect(after.body.toString()).not.toBe(before);
  });

  it("passes every method with its query and headers, HEAD and OPTIONS included, and the answer's headers", async () => {
    const payload = Buffer.from("hello replica");
    for (const method of ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]) {
      const ex = await send(method, "/echo?a=1&b=%20x", { body: method === "GET" ? undefined : payload });
      const seen = JSON.parse(ex.body.toString());
      expect(seen).toMatchObject({ method, url: "/echo?a=1&b=%20x", size: method === "GET" ? 0 : payload.length });
      expect(seen.headers["x-request-id"]).toBe("run-1");
      expect(ex.headers["x-method"]).toBe(method);
      expect(ex.headers["set-cookie"]).toEqual(["a=1", "b=2"]);
    }
    const head = await send("HEAD", "/echo?q=1");
    expect(head.status).toBe(200);
    expect(head.headers["x-method"]).toBe("HEAD");
    expect(head.body.byteLength).toBe(0);
  });

  it("streams an answer larger than any buffer at its reader's pace, whole, with its trailers", async () => {
    const ex = await send("GET", `/big?bytes=${BIG}&trailer`, { mayStream: true });
    expect(ex.stream).toBeDefined();
    // Nobody reads yet: the app's writes wait on the full connection, far short of the whole answer.
    await new Promise((r) => setTimeout(r, 300));
    expect((await stats()).written).toBeLessThan(BIG / 2);
    const hash = createHash("sha256");
    let size = 0;
    for await (const chunk of ex.stream!) {
      size += (chunk as Buffer).byteLength;
      hash.update(chunk as Buffer);
    }
    expect(size).toBe(BIG);
    expect(hash.digest("hex")).toBe(createHash("sha256").update(Buffer.alloc(BIG, 7)).digest("hex"));
    expect(ex.stream!.trailers["x-skiff-error"]).toBe('{"type":"E","message":"m"}');
  });

  it("a cancel mid-answer ends the stream with its reason and closes the connection; the next call is answered", async () => {
    let request: ReplicaRequest | undefined;
    const ex = await send("GET", `/big?bytes=${BIG}`, { mayStream: true, onRequest: (r) => (request = r) });
    const { cut } = await stats();
    const reader = ex.stream![Symbol.asyncIterator]();
    expect((await reader.next()).done).toBe(false);
    request!.destroy(new Error("the caller went away"));
    await expect(reader.next()).rejects.toThrow("the caller went away");
    await vi.waitUntil(async () => (await stats()).cut === cut + 1, { timeout: 5_000 });
    expect((await send("GET", "/port")).status).toBe(200);
  });

  it("cuts an answer past the cap as soon as it is known to be too large, by its length or by what arrived", async () => {
    const { cut } = await stats();
    await expect(send("GET", `/big?bytes=${BIG}&length`, { maxBody: 1024 })).rejects.toBeInstanceOf(AnswerTooLarge);
    await expect(send("GET", `/big?bytes=${BIG}`, { maxBody: 1024 * 1024 })).rejects.toMatchObject({
      name: "AnswerTooLarge",
      limit: 1024 * 1024,
    });
    await vi.waitUntil(async () => (await stats()).cut === cut + 2, { timeout: 5_000 });
    expect((await send("GET", "/port")).status).toBe(200);
  });

  it("a request destroyed before its answer rejects with its reason", async () => {
    let request: ReplicaRequest | undefined;
    const pending = send("GET", `/big?bytes=${BIG}&length`, { onRequest: (r) => (request = r) });
    request!.destroy(new Error("run timed out"));
    await expect(pending).rejects.toThrow("run timed out");
    expect((await send("GET", "/port")).status).toBe(200);
  });
});
