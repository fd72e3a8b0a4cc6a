// Frames of the run wire format whose metadata is not of the declared shape
// are refused with an Error, rather than decoded into a request or answer
// with missing or mistyped fields (found by test/fuzz/wire.test.ts).
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { BodyTransfer, decodeReply, decodeRequest, frame, requestMeta } from "../services/runs/wire.js";
import { StreamReceiver } from "../services/runs/stream-wire.js";
import { startProvisionedNats } from "./helpers/nats-server.js";

const none = new Uint8Array(0);

describe("run wire format: malformed metadata", () => {
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
    for (const meta of [{}, null, 5, [], { ...request, run_id: 7 }, { ...request, headers: { a: 1 } }]) {
      await expect(decodeRequest(transfer, frame(meta as object, none))).rejects.toThrow(/^malformed run frame: /);
      expect(() => requestMeta(frame(meta as object, none))).toThrow(/^malformed run frame: /);
    }
  });

  it("a reply frame decodes when its metadata is right, and is refused when a field is missing or mistyped", async () => {
    expect(await decodeReply(transfer, frame(reply, none))).toMatchObject({ status: 200, runTimeMs: 3 });
    for (const meta of [{}, null, { ...reply, status: "200" }, { ...reply, status: 42 }, { ...reply, stream: {} }]) {
      await expect(decodeReply(transfer, frame(meta as object, none))).rejects.toThrow(/^malformed run frame: /);
    }
    await expect(decodeReply(transfer, frame({ error: "Cancelled", message: 5 }, none))).rejects.toThrow(
      /^malformed run frame: message/,
    );
  });

  it("a streamed body ending with an end frame without run_time_ms fails instead of ending with undefined", async () => {
    const receiver = new StreamReceiver(nats.nc);
    const stream = receiver.stream("skiff.test.credit", () => undefined);
    nats.nc.publish(receiver.inbox, frame({ seq: 1, kind: "end" }, none));
    const read = async () => {
      for await (const chunk of stream.chunks) void chunk;
    };
    await expect(read()).rejects.toThrow(/lost/);
    await expect(stream.ended).rejects.toThrow();
  });
});
