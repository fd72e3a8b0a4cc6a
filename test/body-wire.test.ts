// A request body across NATS (runs/body-wire.ts) against a real nats-server:
// the gateway's BodySender and the runner's BodyReceiver, byte for byte,
// within the runner's credit, and what a receiver makes of frames that are
// lost or say the body broke.
import { connect, type NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { BodyReceiver, BodySender } from "../services/runs/body-wire.js";
import { RequestBodyFailed } from "../services/runs/errors.js";
import { WINDOW_BYTES } from "../services/runs/stream-wire.js";
import { frame } from "../services/runs/wire.js";
import { ClientGoneError, type StreamedRequestBody } from "../services/server/index.js";
import { startNatsServer, type TestNats } from "./helpers/nats-server.js";

let nats: TestNats;
let nc: NatsConnection;

beforeAll(async () => {
  nats = await startNatsServer();
  nc = await connect({ servers: nats.url });
});
afterAll(async () => {
  await nc?.close();
  await nats?.stop();
});

/** A caller's body of `pieces`, counting what has been read of it; `fail` breaks it after them. */
function callerBody(pieces: Uint8Array[], fail?: Error) {
  const read = { bytes: 0 };
  const body: StreamedRequestBody = {
    length: fail ? undefined : pieces.reduce((n, p) => n + p.byteLength, 0),
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

async function failureOf(receiver: BodyReceiver): Promise<unknown> {
  try {
    for await (const chunk of receiver.chunks()) void chunk;
  } catch (err) {
    return err;
  }
  return undefined;
}

describe("a request body across NATS", () => {
  it("arrives byte for byte in pieces no larger than a message, with its declared length", async () => {
    const pieces = Array.from({ length: 12 }, (_, i) => new Uint8Array(300 * 1024).fill(i));
    const { body } = callerBody(pieces);
    const sender = new BodySender(nc, body, 100 * 1024);
    const receiver = new BodyReceiver(nc, sender.meta);
    expect(receiver.length).toBe(12 * 300 * 1024);
    const got: Uint8Array[] = [];
    for await (const chunk of receiver.chunks()) got.push(chunk);
    await sender.done;
    expect(Math.max(...got.map((c) => c.byteLength))).toBe(100 * 1024);
    expect(Buffer.concat(got).equals(Buffer.concat(pieces))).toBe(true);
    sender.stop();
  });

  it("is read from the caller no further than the runner's credit allows", async () => {
    const pieces = Array.from({ length: 64 }, () => new Uint8Array(128 * 1024));
    const { body, read } = callerBody(pieces);
    const sender = new BodySender(nc, body, 128 * 1024);
    const chunks = new BodyReceiver(nc, sender.meta).chunks();
    await chunks.next();
    await new Promise((resolve) => setTimeout(resolve, 300));
    // One piece handed on: the window, and the piece the sender holds while it waits, at most.
    expect(read.bytes).toBeLessThanOrEqual(WINDOW_BYTES + 2 * 128 * 1024);
    let total = 128 * 1024;
    for (let next = await chunks.next(); !next.done; next = await chunks.next()) total += next.value.byteLength;
    expect(total).toBe(64 * 128 * 1024);
    sender.stop();
  });

  it("a sender nobody asks sends nothing, and stops when told", async () => {
    const { body, read } = callerBody([new Uint8Array(10)]);
    const sender = new BodySender(nc, body, 1024);
    await new Promise((resolve) => setTimeout(resolve, 100));
    sender.stop();
    await sender.done;
    expect(read.bytes).toBe(0);
    expect(sender.started).toBe(false);
  });

  it.each([
    ["the caller gone", new ClientGoneError("client closed the request"), "gone"],
    ["too large", new Error("request body larger than 10 bytes"), "too_large"],
  ])("a body that breaks at the gateway (%s) fails the runner's read with why", async (_name, cause, reason) => {
    const { body } = callerBody([new Uint8Array(5)], cause);
    const sender = new BodySender(nc, body, 1024);
    const err = await failureOf(new BodyReceiver(nc, sender.meta));
    await sender.done;
    expect(sender.failure).toBe(cause);
    expect(err).toBeInstanceOf(RequestBodyFailed);
    expect(err).toMatchObject({ reason, message: cause.message });
    sender.stop();
  });

  it("a frame lost on the way fails the body as lost", async () => {
    // A gateway by hand: it answers the first credit with frames 1 and 3.
    const creditTo = `test.credit.${Date.now()}`;
    const sub = nc.subscribe(creditTo, {
      max: 1,
      callback: (_err, msg) => {
        const { to } = JSON.parse(new TextDecoder().decode(msg.data)) as { to: string };
        nc.publish(to, frame({ seq: 1, kind: "chunk" }, new Uint8Array([1])));
        nc.publish(to, frame({ seq: 3, kind: "chunk" }, new Uint8Array([3])));
      },
    });
    const err = await failureOf(new BodyReceiver(nc, { credit_to: creditTo }));
    expect(err).toBeInstanceOf(RequestBodyFailed);
    expect(err).toMatchObject({ reason: "lost" });
    sub.unsubscribe();
  });
});
