// The run history's record feed (runs/record-feed.ts) against a real
// nats-server provisioned as skiff provisions it: the records of the events
// one coalesced connection writes together go in one message of
// `skiff.history.runs` (SKIFF_HISTORY); an acknowledged event resolves
// only once its record (naming the event's sequence) is stored too; a
// connection that is not coalesced sends each record at once; a message
// stays within its size.
import { connect, type NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { coalesceWrites } from "../../services/nats/coalesce.js";
import { streams, subjects } from "../../services/nats/layout.js";
import { publishRunEvent, publishRunEventUnacked, withEventSeq } from "../../services/runs/events.js";
import { RecordFeed } from "../../services/runs/record-feed.js";
import type { RunRecord } from "../../services/runs/store.js";
import { startProvisionedNats } from "../helpers/nats-server.js";
import { finishedRun, storedAfter, type StoredMessage } from "../helpers/run-records.js";

let n: Awaited<ReturnType<typeof startProvisionedNats>>;
/** A connection as skiff's own: coalesced writes. */
let nc: NatsConnection;

beforeAll(async () => {
  n = await startProvisionedNats();
  nc = await connect({ servers: n.nats.url });
  expect(coalesceWrites(nc)).toBe(true);
}, 60_000);
afterAll(async () => {
  await nc?.close();
  await n?.stop();
});

const run = (over: Partial<RunRecord> = {}): RunRecord => finishedRun("p-feed", over);

interface Position {
  events: number;
  feed: number;
}

const position = async (): Promise<Position> => {
  const jsm = await n.nc.jetstreamManager();
  return {
    events: (await jsm.streams.info(streams.events.name)).state.last_seq,
    feed: (await jsm.streams.info(streams.history.name)).state.last_seq,
  };
};

/** The events and the feed's messages stored since `at`. */
async function since(at: Position): Promise<{ events: StoredMessage[]; feed: StoredMessage[] }> {
  return {
    events: await storedAfter(n.nc, streams.events.name, at.events),
    feed: await storedAfter(n.nc, streams.history.name, at.feed),
  };
}

describe("the record feed", () => {
  it("carries the records of the events written together in one message of SKIFF_HISTORY, each as its event's header", async () => {
    const at = await position();
    const runs = Array.from({ length: 5 }, () => run());
    for (const r of runs) publishRunEventUnacked(nc, r);
    // A flush is a barrier for the feed too: its message goes ahead of the PING.
    await nc.flush();
    const { events, feed } = await since(at);
    expect(events.map((m) => m.subject)).toEqual(runs.map(() => subjects.runEvent("p-feed", "a", "success")));
    expect(feed.map((m) => m.subject)).toEqual([subjects.historyRuns]);
    const lines = feed[0].text.split("\n");
    expect(lines).toEqual(events.map((m) => m.header));
    expect(lines.map((l) => (JSON.parse(l) as RunRecord).run_id)).toEqual(runs.map((r) => r.run_id));
  });

  it("an acknowledged event resolves once its record is stored, naming the event's sequence", async () => {
    const at = await position();
    const r = run({ async: true });
    await publishRunEvent(nc, r);
    // Nothing more is written for it after the publish has resolved.
    const { events, feed } = await since(at);
    expect(events).toHaveLength(1);
    expect(feed).toHaveLength(1);
    expect(feed[0].text).toBe(withEventSeq(events[0].header!, events[0].seq));
    expect(JSON.parse(feed[0].text)).toEqual({ event_seq: events[0].seq, ...r });
  });

  it("the acknowledgements of one turn feed their records in one message", async () => {
    const at = await position();
    const runs = Array.from({ length: 4 }, () => run({ async: true, status: "failure" }));
    await Promise.all(runs.map((r) => publishRunEvent(nc, r)));
    const { events, feed } = await since(at);
    expect(events).toHaveLength(runs.length);
    // The events' acknowledgements come back together: their records go out together.
    expect(feed.length).toBeLessThan(runs.length);
    const fed = feed.flatMap((m) => m.text.split("\n")).map((l) => JSON.parse(l) as RunRecord & { event_seq: number });
    expect(fed.map((r) => r.run_id).sort()).toEqual(runs.map((r) => r.run_id).sort());
    expect(fed.map((r) => r.event_seq).sort()).toEqual(events.map((m) => m.seq).sort());
  });

  it("on a connection that is not coalesced, each record goes at once, in a message of its own", async () => {
    const plain = await connect({ servers: n.nats.url });
    try {
      const at = await position();
      const runs = [run(), run()];
      for (const r of runs) publishRunEventUnacked(plain, r);
      await plain.flush();
      const { events, feed } = await since(at);
      expect(events).toHaveLength(2);
      expect(feed.map((m) => m.text)).toEqual(events.map((m) => m.header));
    } finally {
      await plain.close();
    }
  });

  it("an app's line breaks in a record stay inside its one line: no record can be forged by a run", async () => {
    const at = await position();
    const forged = JSON.stringify(run({ project_id: "p-other" }));
    const r = run({
      path: `/a\n${forged}`,
      status: "failure",
      error: { type: "app_error", message: `boom\r\n${forged}\u2028${forged}` },
    });
    publishRunEventUnacked(nc, r);
    await nc.flush();
    const { feed } = await since(at);
    expect(feed).toHaveLength(1);
    const lines = feed[0].text.split("\n");
    expect(lines).toHaveLength(1);
    expect(JSON.parse(lines[0])).toEqual(r);
  });

  it("an acknowledged record that starts a message of its own resolves once that message is stored", async () => {
    const feed = new RecordFeed(nc);
    // On the publishing connection itself: the server sends a message to its subscribers before it
    // acknowledges it, in order, so whatever was acknowledged has been seen here first.
    const seen: string[] = [];
    const sub = nc.subscribe(subjects.historyRuns, { callback: (_err, m) => seen.push(m.string()) });
    await nc.flush();
    try {
      // Pending records close to a message's size (as RecordFeed counts it); the acknowledged one goes in the
      // next message.
      const limit = Math.floor(Math.min(256 * 1024, nc.info!.max_payload - 1024) / 3);
      const texts = Array.from({ length: 10 }, (_, i) =>
        JSON.stringify({ ...run(), path: `p${i}-${"x".repeat(8_000)}` }),
      );
      const pending = texts.reduce((sum, t) => sum + t.length + 1, 0);
      const last = JSON.stringify(run({ path: `the-acknowledged-one-${"y".repeat(6_000)}` }));
      expect(pending).toBeLessThanOrEqual(limit);
      expect(pending + last.length + 1).toBeGreaterThan(limit);
      for (const t of texts) feed.add(t);
      // Other runs under way: its message waits a few milliseconds for company, and the promise with it.
      await feed.addAcked(last, true);
      expect(seen.length).toBeGreaterThan(1);
      expect(seen.some((text) => text.split("\n").includes(last))).toBe(true);
    } finally {
      sub.unsubscribe();
    }
  });

  it("a connection drained right after its events still writes their records", async () => {
    const c = await connect({ servers: n.nats.url });
    expect(coalesceWrites(c)).toBe(true);
    const at = await position();
    const runs = [run(), run()];
    for (const r of runs) publishRunEventUnacked(c, r);
    await c.drain();
    const { events, feed } = await since(at);
    expect(events).toHaveLength(2);
    expect(feed.flatMap((m) => m.text.split("\n"))).toEqual(events.map((m) => m.header));
  });

  it("a message stays within its size: records past it go in the next one, none split", async () => {
    const feed = new RecordFeed(nc);
    const at = await position();
    // 200 records of about 700 characters: more than one message takes.
    const texts = Array.from({ length: 200 }, (_, i) => JSON.stringify({ ...run(), path: `p${i}-${"x".repeat(400)}` }));
    for (const t of texts) feed.add(t);
    await nc.flush();
    const stored = (await since(at)).feed;
    expect(stored.length).toBeGreaterThan(1);
    for (const m of stored) expect(new TextEncoder().encode(m.text).length).toBeLessThanOrEqual(256 * 1024);
    expect(stored.flatMap((m) => m.text.split("\n"))).toEqual(texts);
  });
});
