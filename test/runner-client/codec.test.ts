// Frames between gateway and runner (runner-client/codec.ts) whose metadata
// is not of the declared shape are refused with an Error, rather than
// decoded into a request or answer with missing or mistyped fields (found by
// test/fuzz/wire.test.ts); a streamed answer whose end is malformed fails.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ByteStream } from "../../services/runner-client/byte-stream.js";
import {
  decodeReply,
  decodeRequest,
  encodeErrorReply,
  encodeRequest,
  encodeStreamFrame,
  frame,
  requestMeta,
  StreamKind,
} from "../../services/runner-client/codec.js";
import { answerStream } from "../../services/runner-client/nats.js";
import { BodyTransfer } from "../../services/runs/transfer.js";
import { InvalidArguments } from "../../services/runs/errors.js";
import { startProvisionedNats } from "../helpers/nats-server.js";

const none = new Uint8Array(0);

describe("runner client frames: malformed metadata", () => {
  let nats: Awaited<ReturnType<typeof startProvisionedNats>>;
  let transfer: BodyTransfer;
  beforeAll(async () => {
    nats = await startProvisionedNats();
    transfer = new BodyTransfer(nats.nc, () => nats.nc.jetstream().views.os("skiff-results"));
  });
  afterAll(() => nats?.stop());

  const request = { run_id: "r-1", method: "POST", path: "/fn", query: "", headers: { "content-type": "a/b" } };
  const reply = { status: 200, headers: { a: ["1", "2"] }, run_time_ms: 3, replica_id: "x" };

  it("a request frame decodes when its metadata is right, and is refused when a field is missing or mistyped", async () => {
    expect(await decodeRequest(transfer, frame(request, new Uint8Array([1])))).toMatchObject({ runId: "r-1" });
    expect(
      await decodeRequest(transfer, frame({ ...request, stream: "abc123", accept_stream: true }, none)),
    ).toMatchObject({ acceptStream: true });
    for (const meta of [
      {},
      null,
      5,
      [],
      { ...request, run_id: 7 },
      { ...request, headers: { a: 1 } },
      { ...request, stream: "a.b" }, // a stream id becomes a subject token
      { ...request, stream: ">" },
      { ...request, accept_stream: true }, // an answer that streams needs a stream
      { ...request, body_follows: {} },
      { ...request, stream: "abc", body_follows: { length: -1 } },
    ]) {
      await expect(decodeRequest(transfer, frame(meta as object, none))).rejects.toThrow(/^malformed run frame: /);
      expect(() => requestMeta(frame(meta as object, none))).toThrow(/^malformed run frame: /);
    }
  });

  it("a reply frame decodes when its metadata is right, and is refused when a field is missing or mistyped", async () => {
    expect(await decodeReply(transfer, frame(reply, none))).toMatchObject({ status: 200, runTimeMs: 3 });
    for (const meta of [{}, null, { ...reply, status: "200" }, { ...reply, status: 42 }, { ...reply, streams: 1 }]) {
      await expect(decodeReply(transfer, frame(meta as object, none))).rejects.toThrow(/^malformed run frame: /);
    }
    await expect(decodeReply(transfer, frame({ error: "Cancelled", message: 5 }, none))).rejects.toThrow(
      /^malformed run frame: message/,
    );
  });

  it("a request keeps its method and query as written; a Cortex body that does not fit comes back as InvalidArguments", async () => {
    const req = { runId: "r-2", method: "PATCH", path: "/a", query: "b=%2F&c=1+2&d", headers: {}, body: none };
    const decoded = await decodeRequest(transfer, (await encodeRequest(transfer, req)).data);
    expect(decoded).toMatchObject({ method: "PATCH", path: "/a", query: "b=%2F&c=1+2&d" });
    const misfit = new InvalidArguments('the caller\'s body does not fit f(a): missing required parameter "a"');
    const err = await decodeReply(transfer, encodeErrorReply(misfit)).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(InvalidArguments);
    expect((err as Error).message).toBe(misfit.message);
  });

  it("a streamed answer whose END has no run_time_ms fails instead of ending with undefined", async () => {
    const stream = new ByteStream({ nc: nats.nc, send: "test.codec.up", receive: "test.codec.down" });
    const answer = answerStream(stream, () => undefined);
    await nats.nc.flush();
    nats.nc.publish("test.codec.down", encodeStreamFrame(StreamKind.End, 1, none));
    const read = async () => {
      for await (const chunk of answer.chunks) void chunk;
    };
    await expect(read()).rejects.toThrow(/lost/);
    await expect(answer.ended).rejects.toThrow();
    stream.destroy();
  });
});
