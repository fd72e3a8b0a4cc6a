// Writes of a NATS connection coalesced per event-loop turn (nats/coalesce.ts),
// against a real nats-server: fewer socket writes, the same messages in the
// same order, requests and flush() unchanged; background publishes wait for
// the next write, or a few milliseconds.
import { connect, type NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import {
  BACKGROUND_FLUSH_MS,
  coalesceWrites,
  inBackground,
  publishInBackground,
  WAITED_FLUSH_MS,
} from "../../services/nats/coalesce.js";
import { startNatsServer, type TestNats } from "../helpers/nats-server.js";

let nats: TestNats;
beforeAll(async () => {
  nats = await startNatsServer({ jetstream: false });
});
afterAll(async () => {
  await nats?.stop();
});

/** Counts the writes the connection's transport makes (the one place nats.js writes to its socket). */
function countWrites(nc: NatsConnection): { readonly count: number } {
  const transport = (nc as unknown as { protocol: { transport: { send(frame: Uint8Array): void } } }).protocol
    .transport;
  const send = transport.send.bind(transport);
  const counter = { count: 0 };
  transport.send = (frame) => {
    counter.count++;
    send(frame);
  };
  return counter;
}

const bytes = (s: string) => new TextEncoder().encode(s);
const turn = () => new Promise((resolve) => setImmediate(resolve));

/**
 * A coalesced connection, the count of its socket writes and a second connection to read with, for `test`;
 * both connections are closed after it.
 */
async function withCoalesced(
  test: (nc: NatsConnection, reader: NatsConnection, counter: { readonly count: number }) => Promise<void>,
): Promise<void> {
  const nc = await connect({ servers: nats.url });
  const reader = await connect({ servers: nats.url });
  try {
    coalesceWrites(nc);
    await test(nc, reader, countWrites(nc));
  } finally {
    await Promise.all([nc.close(), reader.close()]);
  }
}

/** Publishes `n` messages, one per microtask, all within one turn of the event loop. */
async function publishAcrossMicrotasks(nc: NatsConnection, subject: string, n: number): Promise<void> {
  for (let i = 0; i < n; i++) {
    await Promise.resolve();
    nc.publish(subject, new TextEncoder().encode(String(i)));
  }
}

async function received(nc: NatsConnection, subject: string, n: number): Promise<() => Promise<string[]>> {
  const sub = nc.subscribe(subject, { max: n });
  await nc.flush();
  return async () => {
    const got: string[] = [];
    for await (const msg of sub) got.push(msg.string());
    return got;
  };
}

describe("coalesced writes", () => {
  it("apply to this nats.js", async () => {
    const nc = await connect({ servers: nats.url });
    try {
      expect(coalesceWrites(nc)).toBe(true);
    } finally {
      await nc.close();
    }
  });

  it("send what one turn published in one write, in order", async () => {
    const plain = await connect({ servers: nats.url });
    const coalesced = await connect({ servers: nats.url });
    const reader = await connect({ servers: nats.url });
    try {
      coalesceWrites(coalesced);
      const expected = Array.from({ length: 100 }, (_, i) => String(i));
      for (const [nc, writes] of [
        [plain, 100],
        [coalesced, 1],
      ] as const) {
        const subject = `coalesce.${writes}`;
        const all = await received(reader, subject, 100);
        const counter = countWrites(nc);
        await publishAcrossMicrotasks(nc, subject, 100);
        await new Promise((resolve) => setImmediate(resolve));
        expect(counter.count).toBe(writes);
        expect(await all()).toEqual(expected);
      }
    } finally {
      await Promise.all([plain.close(), coalesced.close(), reader.close()]);
    }
  });

  it("leave requests, flush and large messages working", async () => {
    const nc = await connect({ servers: nats.url });
    const server = await connect({ servers: nats.url });
    try {
      coalesceWrites(nc);
      coalesceWrites(server);
      const sub = server.subscribe("coalesce.echo");
      void (async () => {
        for await (const msg of sub) msg.respond(msg.data);
      })();
      await server.flush();
      const big = new Uint8Array(256 * 1024).fill(7);
      const replies = await Promise.all([
        nc.request("coalesce.echo", new TextEncoder().encode("hi")),
        nc.request("coalesce.echo", big),
      ]);
      expect(replies[0].string()).toBe("hi");
      expect(replies[1].data).toEqual(big);
      await nc.flush();
    } finally {
      await Promise.all([nc.close(), server.close()]);
    }
  });

  it("write a background publish with the next write, or within BACKGROUND_FLUSH_MS, in the order of the calls", async () => {
    await withCoalesced(async (nc, reader, counter) => {
      // Alone, it waits out a turn of the event loop, and is written by the timer.
      const alone = await received(reader, "coalesce.background.alone", 1);
      publishInBackground(nc, "coalesce.background.alone", bytes("late"));
      await turn();
      expect(counter.count).toBe(0);
      await new Promise((resolve) => setTimeout(resolve, BACKGROUND_FLUSH_MS * 4));
      expect(counter.count).toBe(1);
      expect(await alone()).toEqual(["late"]);
      // Followed by a plain publish, both go in that one's write, in the order they were made.
      const both = await received(reader, "coalesce.background.both", 3);
      publishInBackground(nc, "coalesce.background.both", bytes("a"));
      nc.publish("coalesce.background.both", bytes("b"));
      publishInBackground(nc, "coalesce.background.both", bytes("c"));
      await turn();
      expect(counter.count).toBe(2);
      expect(await both()).toEqual(["a", "b", "c"]);
    });
  });

  it("hold what a function publishes before its first await as background publishes, and no more", async () => {
    await withCoalesced(async (nc, reader, counter) => {
      // Alone, what it publishes waits for the timer.
      const alone = await received(reader, "coalesce.held.alone", 2);
      const result = inBackground(nc, () => {
        nc.publish("coalesce.held.alone", bytes("a"));
        // Nested: still held, and the outer call's flag stays set.
        inBackground(nc, () => nc.publish("coalesce.held.alone", bytes("b")));
        return 42;
      });
      expect(result).toBe(42);
      await turn();
      expect(counter.count).toBe(0);
      await new Promise((resolve) => setTimeout(resolve, BACKGROUND_FLUSH_MS * 4));
      expect(counter.count).toBe(1);
      expect(await alone()).toEqual(["a", "b"]);
      // An async function: held until its first await; a publish after it is written in the turn's write.
      const split = await received(reader, "coalesce.held.split", 2);
      const done = inBackground(nc, async () => {
        nc.publish("coalesce.held.split", bytes("held"));
        await Promise.resolve();
        nc.publish("coalesce.held.split", bytes("urgent"));
      });
      await done;
      await turn();
      expect(counter.count).toBe(2);
      expect(await split()).toEqual(["held", "urgent"]);
    });
  });
  it("write a background publish that something waits on within WAITED_FLUSH_MS, bringing the timer forward, never back", async () => {
    await withCoalesced(async (nc, reader, counter) => {
      const got = await received(reader, "coalesce.waited", 4);
      vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout", "performance"] });
      try {
        // Nothing waits on the first: it may wait BACKGROUND_FLUSH_MS; the second, awaited, brings it forward.
        publishInBackground(nc, "coalesce.waited", bytes("a"));
        vi.advanceTimersByTime(1);
        inBackground(nc, () => nc.publish("coalesce.waited", bytes("b")));
        vi.advanceTimersByTime(WAITED_FLUSH_MS - 1);
        expect(counter.count).toBe(0);
        vi.advanceTimersByTime(1);
        expect(counter.count).toBe(1);
        // An awaited one first: one that may wait longer does not put its write off.
        inBackground(nc, () => nc.publish("coalesce.waited", bytes("c")));
        publishInBackground(nc, "coalesce.waited", bytes("d"));
        vi.advanceTimersByTime(WAITED_FLUSH_MS);
        expect(counter.count).toBe(2);
        expect(WAITED_FLUSH_MS).toBeLessThan(BACKGROUND_FLUSH_MS);
      } finally {
        vi.useRealTimers();
      }
      expect(await got()).toEqual(["a", "b", "c", "d"]);
    });
  });
});
