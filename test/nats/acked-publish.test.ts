// Pipelined acknowledged JetStream publishes (nats/acked-publish.ts) against
// a real nats-server: acknowledgements in any number at once, deduplication
// by Nats-Msg-Id, refusals, no stream, and no answer; confirmed acks of
// consumed messages.
import { AckPolicy, RetentionPolicy, connect, headers, type NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AckedPublisher, PublishError, confirmAck, publishAcked } from "../../services/nats/acked-publish.js";
import { JsErrorCode, isJsError } from "../../services/nats/errors.js";
import { startNatsServer, type TestNats } from "../helpers/nats-server.js";

let nats: TestNats;
let nc: NatsConnection;
const bytes = (text: string) => new TextEncoder().encode(text);

beforeAll(async () => {
  nats = await startNatsServer();
  nc = await connect({ servers: nats.url });
  const jsm = await nc.jetstreamManager();
  await jsm.streams.add({ name: "ACKED", subjects: ["acked.>"], duplicate_window: 60_000_000_000 });
  await jsm.streams.add({ name: "SMALL", subjects: ["small.>"], max_msg_size: 8 });
});
afterAll(async () => {
  await nc?.close();
  await nats?.stop();
});

describe("publishAcked", () => {
  it("resolves each of many publishes in flight at once with its own sequence", async () => {
    const acks = await Promise.all(
      Array.from({ length: 500 }, (_, i) => publishAcked(nc, "acked.many", bytes(`${i}`))),
    );
    expect(acks.every((a) => a.stream === "ACKED" && !a.duplicate)).toBe(true);
    const seqs = acks.map((a) => a.seq);
    expect(new Set(seqs).size).toBe(500);
    // Stored in the order they were published.
    const msg = await (await nc.jetstreamManager()).streams.getMessage("ACKED", { seq: seqs[123] });
    expect(new TextDecoder().decode(msg.data)).toBe("123");
  });

  it("stores a repeated Nats-Msg-Id once", async () => {
    const first = await publishAcked(nc, "acked.once", bytes("a"), { msgId: "same-id" });
    const again = await publishAcked(nc, "acked.once", bytes("b"), { msgId: "same-id" });
    expect(first.duplicate).toBe(false);
    expect(again).toEqual({ stream: "ACKED", seq: first.seq, duplicate: true });
  });

  it("stores a compare-and-set only over the expected last message of its subject", async () => {
    const first = await publishAcked(nc, "acked.cas", bytes("1"), { expectedLastSubjectSequence: 0 });
    const second = await publishAcked(nc, "acked.cas", bytes("2"), { expectedLastSubjectSequence: first.seq });
    const lost = await publishAcked(nc, "acked.cas", bytes("3"), { expectedLastSubjectSequence: first.seq }).catch(
      (e: unknown) => e,
    );
    expect(second.seq).toBeGreaterThan(first.seq);
    expect(isJsError(lost, JsErrorCode.WrongLastSequence)).toBe(true);
  });

  it("keeps the caller's headers beside its own, replaces a Nats-Msg-Id the caller set, and refuses CR or LF", async () => {
    const h = headers();
    h.set("Skiff-Test", "kept");
    h.set("Nats-Msg-Id", "the caller's");
    const first = await publishAcked(nc, "acked.headers", bytes("a"), { msgId: "own-id", headers: h });
    const stored = await (await nc.jetstreamManager()).streams.getMessage("ACKED", { seq: first.seq });
    expect(stored.header.get("Skiff-Test")).toBe("kept");
    expect(stored.header.values("Nats-Msg-Id")).toEqual(["own-id"]);
    // Deduplicated by the id given, not the caller's.
    const again = await publishAcked(nc, "acked.headers", bytes("b"), { msgId: "own-id" });
    expect(again).toEqual({ stream: "ACKED", seq: first.seq, duplicate: true });
    expect(() => publishAcked(nc, "acked.headers", bytes("c"), { msgId: "a\r\nEvil: 1" })).toThrow(PublishError);
    const plain = await publishAcked(nc, "acked.headers", bytes("d"), { expectedLastSubjectSequence: first.seq });
    const cas = await (await nc.jetstreamManager()).streams.getMessage("ACKED", { seq: plain.seq });
    expect(cas.header.get("Nats-Expected-Last-Subject-Sequence")).toBe(String(first.seq));
  });

  it("rejects what JetStream refuses, and a subject no stream takes", async () => {
    const refused = await publishAcked(nc, "small.x", bytes("far more than eight bytes")).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(PublishError);
    expect((refused as PublishError).apiCode).toBeGreaterThan(0);
    const nowhere = await publishAcked(nc, "nostream.x", bytes("x")).catch((e: unknown) => e);
    expect(nowhere).toBeInstanceOf(PublishError);
    expect((nowhere as Error).message).toMatch(/no JetStream stream/);
  });

  it("rejects a publish that gets no answer in time", async () => {
    const other = await connect({ servers: nats.url });
    // A plain subscriber takes the message and never answers.
    other.subscribe("silent.x");
    await other.flush();
    const publisher = new AckedPublisher(nc, 200);
    try {
      const err = await publisher.publish("silent.x", bytes("x")).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(PublishError);
      expect((err as Error).message).toMatch(/no acknowledgement/);
    } finally {
      await other.close();
    }
  });

  it("a process stalled past the timeout takes the acknowledgement that came meanwhile, not a timeout", async () => {
    const publisher = new AckedPublisher(nc, 200);
    const ack = publisher.publish("acked.stalled", bytes("x")).catch((e: unknown) => e);
    // The publish goes out; then this process's event loop is blocked past the timeout and the sweep's second,
    // while the acknowledgement comes and waits, unread, in the socket.
    await new Promise((resolve) => setImmediate(resolve));
    const until = Date.now() + 1_300;
    while (Date.now() < until);
    expect(await ack).toMatchObject({ stream: "ACKED", duplicate: false });
  });
});

describe("confirmAck", () => {
  it("resolves once the server has the ack: the message leaves a work queue and is not delivered again", async () => {
    const jsm = await nc.jetstreamManager();
    await jsm.streams.add({ name: "WORK", subjects: ["work.>"], retention: RetentionPolicy.Workqueue });
    await jsm.consumers.add("WORK", { durable_name: "w", ack_policy: AckPolicy.Explicit, ack_wait: 1_000_000_000 });
    for (let i = 0; i < 20; i++) await publishAcked(nc, "work.x", bytes(`${i}`));
    const consumer = await nc.jetstream().consumers.get("WORK", "w");
    const batch = await consumer.fetch({ max_messages: 20, expires: 2_000 });
    const acks: Promise<void>[] = [];
    for await (const m of batch) {
      acks.push(confirmAck(nc, m));
      if (acks.length === 20) break;
    }
    await Promise.all(acks);
    // Confirmed: the stream holds none of them, and ack_wait passing brings none back.
    expect((await jsm.streams.info("WORK")).state.messages).toBe(0);
    await new Promise((r) => setTimeout(r, 1_500));
    const again = await consumer.fetch({ max_messages: 1, expires: 1_000 });
    const redelivered: string[] = [];
    for await (const m of again) redelivered.push(m.string());
    expect(redelivered).toEqual([]);
  });

  it("rejects when no consumer takes the ack", async () => {
    const jsm = await nc.jetstreamManager();
    await jsm.streams.add({ name: "GONE", subjects: ["gone.>"] });
    await jsm.consumers.add("GONE", { durable_name: "g", ack_policy: AckPolicy.Explicit });
    await publishAcked(nc, "gone.x", bytes("x"));
    const m = await (await nc.jetstream().consumers.get("GONE", "g")).next({ expires: 2_000 });
    expect(m).not.toBeNull();
    await jsm.consumers.delete("GONE", "g");
    const err = await confirmAck(nc, m!).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(PublishError);
  });
});
