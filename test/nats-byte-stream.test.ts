// The byte stream a cross-process WebSocket travels on (nats/byte-stream.ts),
// between two NATS connections to a real nats-server: bytes arrive whole
// and in order, a reader that does not read holds the writer at one window,
// half-closes pass, and a side that is destroyed or falls silent ends the other.
import { connect, type NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { NatsByteStream, WINDOW_BYTES } from "../services/nats/byte-stream.js";
import { startNatsServer, type TestNats } from "./helpers/nats-server.js";

let nats: TestNats;
let a: NatsConnection;
let b: NatsConnection;
let n = 0;

/**
 * Two ends of one stream, on two connections, both listening once it
 * resolves (skiff orders this through the handshake's request and reply).
 */
async function pair(heartbeatMs?: number): Promise<[NatsByteStream, NatsByteStream]> {
  const id = `test.stream.${n++}`;
  const ends: [NatsByteStream, NatsByteStream] = [
    new NatsByteStream({ nc: a, send: `${id}.up`, receive: `${id}.down`, heartbeatMs }),
    new NatsByteStream({ nc: b, send: `${id}.down`, receive: `${id}.up`, heartbeatMs }),
  ];
  await Promise.all([a.flush(), b.flush()]);
  return ends;
}

const closedOf = (s: NatsByteStream) =>
  new Promise<Error | undefined>((resolve) => {
    let error: Error | undefined;
    s.on("error", (err) => (error = err));
    s.once("close", () => resolve(error));
  });

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

describe("nats byte stream", () => {
  it("passes bytes whole and in order both ways; ends in order close both sides", async () => {
    const [left, right] = await pair();
    const data = Buffer.alloc(5 * 1024 * 1024 + 17);
    for (let i = 0; i < data.length; i++) data[i] = (i * 7 + (i >> 13)) & 0xff;
    const got: Buffer[] = [];
    right.on("data", (c: Buffer) => got.push(c));
    const rightEnded = new Promise((resolve) => right.once("end", resolve));
    left.end(data);
    await rightEnded;
    expect(Buffer.concat(got).equals(data)).toBe(true);
    const back: Buffer[] = [];
    left.on("data", (c: Buffer) => back.push(c));
    const closes = Promise.all([closedOf(left), closedOf(right)]);
    right.end("and back");
    expect(await closes).toEqual([undefined, undefined]);
    expect(Buffer.concat(back).toString()).toBe("and back");
  });

  it("a reader that does not read holds the writer at one window; reading lets it go on", async () => {
    const [left, right] = await pair();
    right.pause();
    let written = false;
    left.write(Buffer.alloc(3 * WINDOW_BYTES), () => (written = true));
    // Everything has arrived at the reader, unread.
    await vi.waitUntil(() => right.readableLength >= 3 * WINDOW_BYTES, { timeout: 10_000 });
    // Give acknowledgements in flight, if any were sent, time to land: none may release the write.
    await new Promise((resolve) => setTimeout(resolve, 100));
    expect(written).toBe(false);
    right.resume();
    await vi.waitUntil(() => written, { timeout: 10_000 });
    left.destroy();
    right.destroy();
  });

  it("destroying one side closes the other", async () => {
    const [left, right] = await pair();
    const closed = closedOf(right);
    left.write("x");
    left.destroy();
    expect(await closed).toBeUndefined();
  });

  it("a side whose process went silent is given up after three heartbeats", async () => {
    const c = await connect({ servers: nats.url });
    const id = `test.stream.${n++}`;
    const gone = new NatsByteStream({ nc: c, send: `${id}.up`, receive: `${id}.down`, heartbeatMs: 50 });
    const left = new NatsByteStream({ nc: a, send: `${id}.down`, receive: `${id}.up`, heartbeatMs: 50 });
    await Promise.all([a.flush(), c.flush()]);
    gone.on("error", () => {}); // its own connection is closed below: its next heartbeat fails
    gone.write("hello");
    const closed = closedOf(left);
    await c.close(); // no ABORT: as if its process died
    expect((await closed)?.message).toBe("the other end of the stream went silent");
    gone.destroy();
  });
});
