// Pipelined acknowledged JetStream publishes (nats/acked-publish.ts) against
// a real nats-server: acknowledgements in any number at once, deduplication
// by Nats-Msg-Id, refusals, no stream, and no answer.
import { connect, type NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AckedPublisher, PublishError, publishAcked } from "../../services/nats/acked-publish.js";
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
});
