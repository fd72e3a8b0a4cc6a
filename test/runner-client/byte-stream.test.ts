// The one byte stream between a gateway and a runner
// (runner-client/byte-stream.ts), between two NATS connections to a real
// nats-server: bytes arrive whole and in order, nothing goes out before the
// peer listens, a reader that stops holds the writer at one window,
// half-closes pass with their trailer, an abort carries its reason, a lost
// message breaks the stream, and a side that is destroyed or falls silent
// ends the other.
import { connect, type NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import {
  ByteStream,
  StreamAborted,
  StreamBroken,
  StreamSilent,
  WINDOW_BYTES,
} from "../../services/runner-client/byte-stream.js";
import { encodeStreamFrame, StreamKind } from "../../services/runner-client/codec.js";
import { startNatsServer, type TestNats } from "../helpers/nats-server.js";

let nats: TestNats;
let a: NatsConnection;
let b: NatsConnection;
let n = 0;

function end(nc: NatsConnection, id: string, side: "left" | "right", heartbeatMs?: number): ByteStream {
  const [send, receive] = side === "left" ? [`${id}.up`, `${id}.down`] : [`${id}.down`, `${id}.up`];
  return new ByteStream({ nc, send, receive, heartbeatMs, peerListening: side === "right" });
}

/** Two ends of one stream, on two connections, both listening once it resolves. */
async function pair(heartbeatMs?: number): Promise<[ByteStream, ByteStream]> {
  const id = `test.stream.${n++}`;
  const ends: [ByteStream, ByteStream] = [end(a, id, "left", heartbeatMs), end(b, id, "right", heartbeatMs)];
  await Promise.all([a.flush(), b.flush()]);
  return ends;
}

const closedOf = (s: ByteStream) =>
  new Promise<Error | undefined>((resolve) => {
    let error: Error | undefined;
    s.on("error", (err: Error) => (error = err));
    s.once("close", () => resolve(error));
  });

const readAll = async (s: ByteStream) => {
  const got: Buffer[] = [];
  for await (const chunk of s.iterator({ destroyOnReturn: false })) got.push(chunk as Buffer);
  return Buffer.concat(got);
};

beforeAll(async () => {
  nats = await startNatsServer({ jetstream: false });
  a = await connect({ servers: nats.url });
  b = await connect({ servers: nats.url });
});
afterAll(async () => {
  await a?.close().catch(() => undefined);
  await b?.close().catch(() => undefined);
  await nats?.stop();
});

describe("byte stream", () => {
  it("passes bytes whole and in order both ways, with the END's trailer; ends in order close both sides", async () => {
    const [left, right] = await pair();
    const data = Buffer.alloc(5 * 1024 * 1024 + 17);
    for (let i = 0; i < data.length; i++) data[i] = (i * 7 + (i >> 13)) & 0xff;
    const received = readAll(right);
    left.write(data);
    left.finish(new TextEncoder().encode("how it ended"));
    expect((await received).equals(data)).toBe(true);
    expect(new TextDecoder().decode(right.trailer)).toBe("how it ended");
    const back = readAll(left);
    const closes = Promise.all([closedOf(left), closedOf(right)]);
    right.end("and back");
    expect((await back).toString()).toBe("and back");
    expect(await closes).toEqual([undefined, undefined]);
  });

  it("sends nothing before its peer asks: bytes and the end written first arrive once the peer listens", async () => {
    const id = `test.stream.${n++}`;
    const left = end(a, id, "left");
    left.end("written before anyone listened");
    await new Promise((resolve) => setTimeout(resolve, 100));
    expect(left.started).toBe(false);
    const right = end(b, id, "right");
    expect((await readAll(right)).toString()).toBe("written before anyone listened");
    expect(left.started).toBe(true);
    left.destroy();
    right.destroy();
  });

  it("a reader that stops reading holds the writer at one window; reading on lets it finish", async () => {
    const [left, right] = await pair();
    const first = new Promise<void>((resolve) =>
      right.once("data", () => {
        right.pause();
        resolve();
      }),
    );
    let written = false;
    left.write(Buffer.alloc(3 * WINDOW_BYTES), () => (written = true));
    await first;
    await vi.waitUntil(() => right.readableLength >= WINDOW_BYTES / 2, { timeout: 30_000 });
    // Give credit in flight, if any was sent, time to land: none may release the write.
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(written).toBe(false);
    expect(right.readableLength).toBeLessThanOrEqual(WINDOW_BYTES);
    right.resume();
    await vi.waitUntil(() => written, { timeout: 30_000 });
    left.destroy();
    right.destroy();
  });

  it("destroying one side closes the other without an error; abort(reason) gives the reason", async () => {
    const [left, right] = await pair();
    const closed = closedOf(right);
    right.resume();
    left.write("x");
    await left.contact; // it knows the other side is there
    left.destroy();
    expect(await closed).toBeUndefined();

    const [up, down] = await pair();
    const failed = closedOf(down);
    down.resume();
    up.write("y");
    up.abort(new TextEncoder().encode("the reason"));
    const err = await failed;
    expect(err).toBeInstanceOf(StreamAborted);
    expect(new TextDecoder().decode((err as StreamAborted).reason)).toBe("the reason");
  });

  it("a message lost on the way breaks the stream", async () => {
    const id = `test.stream.${n++}`;
    const right = end(b, id, "right");
    const closed = closedOf(right);
    right.resume();
    await b.flush();
    a.publish(`${id}.up`, encodeStreamFrame(StreamKind.Data, 1, new Uint8Array([1])));
    a.publish(`${id}.up`, encodeStreamFrame(StreamKind.Data, 3, new Uint8Array([3])));
    expect(await closed).toBeInstanceOf(StreamBroken);
  });

  it("a side whose process went silent is given up after three heartbeats", async () => {
    const c = await connect({ servers: nats.url });
    const id = `test.stream.${n++}`;
    const gone = end(c, id, "left", 50);
    const left = end(a, id, "right", 50);
    await Promise.all([a.flush(), c.flush()]);
    left.resume();
    gone.write("hello");
    const closed = closedOf(left);
    await c.close(); // no ABORT: as if its process died
    expect(await closed).toBeInstanceOf(StreamSilent);
    gone.destroy();
  });

  it("a side whose own process stalled for many heartbeats does not give up a peer that is there", async () => {
    const [left, right] = await pair(50);
    const parts: Buffer[] = [];
    right.on("data", (chunk: Buffer) => parts.push(chunk));
    const ended = new Promise((resolve) => right.once("end", resolve));
    left.resume();
    const closes = Promise.all([closedOf(left), closedOf(right)]);
    left.write("before ");
    await vi.waitUntil(() => parts.length > 0, { timeout: 30_000, interval: 10 });
    // Both ends' event loop blocked for ten heartbeats, as under a heavy load or a long GC.
    const until = Date.now() + 500;
    while (Date.now() < until);
    // Three heartbeats and more after it, the peer talking (pings) again.
    await new Promise((resolve) => setTimeout(resolve, 400));
    expect([left.destroyed, right.destroyed]).toEqual([false, false]);
    left.end("after");
    await ended;
    expect(Buffer.concat(parts).toString()).toBe("before after");
    right.end();
    expect(await closes).toEqual([undefined, undefined]);
  });
});
