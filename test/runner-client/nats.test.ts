// The runner client over NATS (runner-client/nats.ts), both ends against a
// real nats-server: a gateway's NatsRunnerClient on one connection, a
// runner's NatsRunnerServer on another, serving a fake runner (our
// HostedRunner). Whole bodies, bodies through the object store, streamed
// answers with back-pressure, streamed request bodies, WebSocket bytes, a
// silent runner, cancel, and no responders.
import { createHash } from "node:crypto";
import { connect, type NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { silentLogger } from "../../services/config/logger.js";
import { objectStores } from "../../services/nats/layout.js";
import { NatsRunnerClient, NatsRunnerServer } from "../../services/runner-client/nats.js";
import { WINDOW_BYTES } from "../../services/runner-client/byte-stream.js";
import {
  BodyTransfer,
  Cancelled,
  NoRunner,
  Overloaded,
  ReplicaCrashed,
  RequestBodyFailed,
  RunControl,
  type InvokeRequest,
} from "../../services/runs/index.js";
import { ClientGoneError, type StreamedRequestBody } from "../../services/server/index.js";
import { answer, appRecord, ERRORS, FakeRunner, PROJECT, streamedAnswer } from "../helpers/fake-runner.js";
import { startProvisionedNats } from "../helpers/nats-server.js";

// Short, so the silent runner is found in a second; not so short that a loaded machine's pauses look like silence.
const HEARTBEAT_MS = 250;
const APP = appRecord("fake");
let env: Awaited<ReturnType<typeof startProvisionedNats>>;
let runnerNc: NatsConnection;
let gateway: NatsRunnerClient;
let server: NatsRunnerServer;
let transfer: BodyTransfer;
const fake = new FakeRunner().host("fake");
const control = new RunControl();

const transferOn = (nc: NatsConnection) =>
  new BodyTransfer(nc, () => nc.jetstream().views.os(objectStores.results.name));

beforeAll(async () => {
  env = await startProvisionedNats();
  runnerNc = await connect({ servers: env.nats.url });
  transfer = transferOn(env.nc);
  gateway = new NatsRunnerClient(env.nc, transfer, { heartbeatMs: HEARTBEAT_MS });
  server = new NatsRunnerServer({
    nc: runnerNc,
    runner: fake,
    transfer: transferOn(runnerNc),
    control,
    logger: silentLogger,
    tuning: { heartbeatMs: HEARTBEAT_MS },
  });
  server.add({ projectId: PROJECT, appName: "fake" });
  await runnerNc.flush();
});
afterAll(async () => {
  await server?.close();
  await runnerNc?.close();
  await env?.stop();
});

let n = 0;
function request(path: string, extra: Partial<InvokeRequest> = {}): InvokeRequest {
  return {
    runId: `0190a000-0000-7000-8000-${String(n++).padStart(12, "0")}`,
    method: "POST",
    path,
    query: "",
    headers: { "content-type": "text/plain" },
    body: new Uint8Array(0),
    ...extra,
  };
}

/** A caller's body of `pieces`, counting what has been read of it; `fail` breaks it after them. */
function callerBody(pieces: Uint8Array[], fail?: Error) {
  const read = { bytes: 0 };
  const body: StreamedRequestBody = {
    length: fail ? undefined : pieces.reduce((sum, p) => sum + p.byteLength, 0),
    async *chunks() {
      for (const p of pieces) {
        read.bytes += p.byteLength;
        yield p;
      }
      if (fail) throw fail;
    },
    read: () => Promise.reject(new Error("not used")),
  };
  return { body, read };
}

const sha = (data: Uint8Array) => createHash("sha256").update(data).digest("hex");

async function readStreamed(chunks: AsyncIterable<Uint8Array>): Promise<Buffer> {
  const parts: Uint8Array[] = [];
  for await (const chunk of chunks) parts.push(chunk);
  return Buffer.concat(parts);
}

fake
  .on("/echo", async (req) => {
    const body = req.bodyStream ? await req.bodyStream.read() : req.body;
    return answer(200, body, { "x-app": "fake", connection: "close" });
  })
  .on("/digest", async (req) => {
    const body = await req.bodyStream!.read();
    return answer(200, JSON.stringify({ size: body.byteLength, sha: sha(body), length: req.bodyStream!.length }));
  })
  .on("/big-answer", async () => answer(200, new Uint8Array(3 * 1024 * 1024).fill(9)))
  .on("/overloaded", async () => Promise.reject(ERRORS.overloaded()));

describe("runner client over NATS: whole bodies", () => {
  it("a request and its answer pass whole; the app's headers that callers never get are dropped", async () => {
    const res = await gateway.invoke(APP, request("/echo", { body: new TextEncoder().encode("hello") }));
    expect(res.status).toBe(200);
    expect(new TextDecoder().decode(res.body)).toBe("hello");
    expect(res.headers).toMatchObject({ "x-app": "fake", "content-type": "text/plain" });
    expect(res.headers.connection).toBeUndefined();
    expect(res.stream).toBeUndefined();
  });

  it("bodies too large for a NATS message go through the object store, both ways, and are removed", async () => {
    const big = new Uint8Array(3 * 1024 * 1024).map((_, i) => i & 0xff);
    const res = await gateway.invoke(APP, request("/echo", { body: big }));
    expect(sha(res.body)).toBe(sha(big));
    const whole = await gateway.invoke(APP, request("/big-answer"));
    expect(whole.body.byteLength).toBe(3 * 1024 * 1024);
    const os = await env.nc.jetstream().views.os(objectStores.results.name);
    const left = (await os.list()).filter((o) => o.name.startsWith("transfer.") && !o.deleted);
    expect(left).toEqual([]);
  });

  it("a runner error comes back as the same error", async () => {
    const err = await gateway.invoke(APP, request("/overloaded")).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Overloaded);
    expect(err).toMatchObject({ retryAfterSeconds: 2 });
  });

  it("no runner hosting the app is NoRunner", async () => {
    const err = await gateway.invoke(appRecord("nobody"), request("/echo")).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(NoRunner);
    expect((err as Error).message).toBe(`no runner hosts app ${PROJECT}/nobody right now`);
    const ws = await gateway
      .upgrade(appRecord("nobody"), { runId: "r", path: "/echo", query: "", headers: {} })
      .catch((e: unknown) => e);
    expect(ws).toBeInstanceOf(NoRunner);
  });
});

describe("runner client over NATS: streamed answers", () => {
  it("an answer that streams comes as its head, then its chunks within the gateway's credit, then its end", async () => {
    const chunk = new Uint8Array(256 * 1024).fill(1);
    const { stream, produced } = streamedAnswer(async function* () {
      for (let i = 0; i < 32; i++) yield chunk;
    });
    fake.on("/stream", async () => ({ ...answer(200, ""), stream }));
    const res = await gateway.invoke(APP, request("/stream", { acceptStream: true }));
    expect(res.stream).toBeDefined();
    const chunks = res.stream!.chunks[Symbol.asyncIterator]();
    let got = (await chunks.next()).value!.byteLength;
    // The gateway reads no further: the runner's app is held at a window's worth (and what it holds ready).
    await new Promise((resolve) => setTimeout(resolve, 500));
    expect(produced.bytes).toBeLessThanOrEqual(WINDOW_BYTES + 3 * chunk.byteLength);
    expect(produced.chunks).toBeLessThan(32);
    for (let next = await chunks.next(); !next.done; next = await chunks.next()) got += next.value.byteLength;
    expect(got).toBe(32 * chunk.byteLength);
    expect(await res.stream!.ended).toEqual({ runTimeMs: 7 });
  });

  it("an answer the app fails after its head ends with the runner's error", async () => {
    const { stream } = streamedAnswer(async function* () {
      yield new Uint8Array([1]);
      throw ERRORS.crashed();
    });
    fake.on("/stream-fails", async () => ({ ...answer(200, ""), stream }));
    const res = await gateway.invoke(APP, request("/stream-fails", { acceptStream: true }));
    await expect(readStreamed(res.stream!.chunks)).rejects.toBeInstanceOf(ReplicaCrashed);
    await expect(res.stream!.ended).rejects.toThrow("the replica exited");
  });

  it("a caller that stops reading cancels the answer on the runner and aborts the run there", async () => {
    let runSignal: InvokeRequest["signal"];
    const { stream, cancelled } = streamedAnswer(async function* () {
      for (;;) {
        yield new Uint8Array(1024);
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    });
    fake.on("/forever", async (req) => ((runSignal = req.signal), { ...answer(200, ""), stream }));
    const res = await gateway.invoke(APP, request("/forever", { acceptStream: true }));
    const chunks = res.stream!.chunks[Symbol.asyncIterator]();
    await chunks.next();
    await chunks.return!(undefined);
    await expect(res.stream!.ended).rejects.toBeInstanceOf(Cancelled);
    await cancelled;
    await vi.waitUntil(() => runSignal?.aborted, { timeout: 30_000 });
  });

  it("a runner that goes silent fails the answer after three heartbeats", async () => {
    const silentNc = await connect({ servers: env.nats.url });
    const silent = new FakeRunner().host("silent");
    const { stream } = streamedAnswer(async function* () {
      yield new Uint8Array([1]);
      await new Promise(() => {}); // never more
    });
    silent.on("/stream", async () => ({ ...answer(200, ""), stream }));
    const other = new NatsRunnerServer({
      nc: silentNc,
      runner: silent,
      transfer: transferOn(silentNc),
      control: new RunControl(),
      logger: silentLogger,
      tuning: { heartbeatMs: HEARTBEAT_MS },
    });
    other.add({ projectId: PROJECT, appName: "silent" });
    await silentNc.flush();
    const res = await gateway.invoke(appRecord("silent"), request("/stream", { acceptStream: true }));
    const chunks = res.stream!.chunks[Symbol.asyncIterator]();
    await chunks.next();
    await silentNc.close(); // as if the runner's process died: no ABORT
    const err = await chunks.next().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ReplicaCrashed);
    expect((err as Error).message).toMatch(/^the runner sent nothing for \d+ s$/);
  });
});

describe("runner client over NATS: streamed request bodies", () => {
  it("a body that follows its request arrives byte for byte, with its declared length", async () => {
    const pieces = Array.from({ length: 12 }, (_, i) => new Uint8Array(300 * 1024).fill(i));
    const { body } = callerBody(pieces);
    const res = await gateway.invoke(APP, request("/digest", { bodyStream: body }));
    const whole = Buffer.concat(pieces);
    expect(JSON.parse(new TextDecoder().decode(res.body))).toEqual({
      size: whole.byteLength,
      sha: sha(whole),
      length: whole.byteLength,
    });
  });

  it("is read from the caller no further than the runner's credit allows, and not at all before it is asked", async () => {
    const pieces = Array.from({ length: 64 }, () => new Uint8Array(128 * 1024));
    const { body, read } = callerBody(pieces);
    let release!: () => void;
    const asked = new Promise<void>((resolve) => (release = resolve));
    let readFirst!: () => void;
    const firstRead = new Promise<void>((resolve) => (readFirst = resolve));
    fake.on("/slow-reader", async (req) => {
      await asked;
      const chunks = req.bodyStream!.chunks()[Symbol.asyncIterator]();
      let total = (await chunks.next()).value!.byteLength;
      readFirst();
      await new Promise((resolve) => setTimeout(resolve, 300));
      for (let next = await chunks.next(); !next.done; next = await chunks.next()) total += next.value.byteLength;
      return answer(200, String(total));
    });
    const call = gateway.invoke(APP, request("/slow-reader", { bodyStream: body }));
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(read.bytes).toBe(0);
    release();
    await firstRead;
    await new Promise((resolve) => setTimeout(resolve, 200));
    // The window, and the piece the gateway holds while it waits, at most.
    expect(read.bytes).toBeLessThanOrEqual(WINDOW_BYTES + 2 * 128 * 1024);
    expect(new TextDecoder().decode((await call).body)).toBe(String(64 * 128 * 1024));
  });

  it("a body and an answer stream at once: the app answers each piece as it comes", async () => {
    fake.on("/interactive", async (req) => {
      const { stream } = streamedAnswer(async function* () {
        for await (const chunk of req.bodyStream!.chunks()) yield new TextEncoder().encode(`got ${chunk.byteLength}\n`);
      });
      return { ...answer(200, ""), stream };
    });
    let more!: () => void;
    const gate = new Promise<void>((resolve) => (more = resolve));
    const body: StreamedRequestBody = {
      length: undefined,
      async *chunks() {
        yield new Uint8Array(10);
        await gate; // the second piece only once the first one's answer came back
        yield new Uint8Array(20);
      },
      read: () => Promise.reject(new Error("not used")),
    };
    const res = await gateway.invoke(APP, request("/interactive", { bodyStream: body, acceptStream: true }));
    const chunks = res.stream!.chunks[Symbol.asyncIterator]();
    expect(new TextDecoder().decode((await chunks.next()).value)).toBe("got 10\n");
    more();
    expect(new TextDecoder().decode((await chunks.next()).value)).toBe("got 20\n");
    expect((await chunks.next()).done).toBe(true);
  });

  it.each([
    ["the caller gone", new ClientGoneError("client closed the request"), "gone"],
    ["too large", new Error("request body larger than 10 bytes"), "too_large"],
  ])("a body that breaks at the gateway (%s) fails the run with why, on both sides", async (_name, cause, reason) => {
    let seen: unknown;
    fake.on("/breaks", async (req) => {
      seen = await req.bodyStream!.read().catch((e: unknown) => e);
      throw seen;
    });
    const { body } = callerBody([new Uint8Array(5)], cause);
    const err = await gateway.invoke(APP, request("/breaks", { bodyStream: body })).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(RequestBodyFailed);
    expect(err).toMatchObject({ reason, message: cause.message });
    expect(seen).toBeInstanceOf(RequestBodyFailed);
    expect(seen).toMatchObject({ reason, message: cause.message });
  });
});

describe("runner client over NATS: WebSockets", () => {
  it("a connection's bytes pass both ways in order, larger than the window; its end closes both sides", async () => {
    const up = await gateway.upgrade(APP, { runId: "ws-1", path: "/echo", query: "", headers: { a: "b" } });
    if (up.kind !== "upgraded") throw new Error("not upgraded");
    expect(up.status).toBe(101);
    expect(up.headers["sec-websocket-accept"]).toBe("yes");
    expect(up.head.toString()).toBe("hello");
    expect(fake.upgrades.at(-1)).toMatchObject({ runId: "ws-1", path: "/echo", headers: { a: "b" } });
    const data = Buffer.alloc(3 * WINDOW_BYTES + 5).map((_, i) => (i * 31) & 0xff);
    const back: Buffer[] = [];
    up.socket.on("data", (c: Buffer) => back.push(c));
    // The echo ends when its input ended; a socket that closes without its end fails at once, with why.
    const ended = new Promise<void>((resolve, reject) => {
      up.socket.once("end", resolve);
      up.socket.once("error", (err) => reject(new Error(`the socket failed before its end: ${String(err)}`)));
      up.socket.once("close", () => reject(new Error(`the socket closed before its end (${back.length} chunks back)`)));
    });
    up.socket.end(data);
    await ended;
    expect(Buffer.concat(back).equals(data)).toBe(true);
    await vi.waitUntil(() => up.socket.destroyed, { timeout: 30_000 });
  });

  it("an app that refuses the handshake answers over NATS as an HTTP answer", async () => {
    const res = await gateway.upgrade(APP, { runId: "ws-2", path: "/nope", query: "", headers: {} });
    expect(res).toMatchObject({ kind: "answered", status: 403, headers: { "x-app": "fake" } });
    if (res.kind === "answered") expect(res.body.toString()).toBe("no");
  });
});
