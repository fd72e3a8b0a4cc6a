// Fuzzing the run wire format (runs/wire.ts, runs/stream-wire.ts): arbitrary
// bytes, and frames around arbitrary or almost-right JSON metadata, given to
// decodeRequest and decodeReply; arbitrary frames sent to a StreamReceiver's
// inbox. Each either decodes to values of the declared types or throws an
// Error (a stream: rejects with one), and none hangs. A real nats-server
// holds the object store that frames naming a body object are read from.
import assert from "node:assert/strict";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "nats";
import { BodyTransfer, decodeReply, decodeRequest, frame, requestMeta } from "../../services/runs/wire.js";
import { StreamReceiver } from "../../services/runs/stream-wire.js";
import { RunnerError } from "../../services/runs/errors.js";
import { startProvisionedNats } from "../helpers/nats-server.js";
import { FUZZ_RUNS, fuzzTimeout } from "./runs.js";

const encoder = new TextEncoder();

/** A frame whose metadata is the given bytes (any length field, any JSON or none). */
const rawFrame = (meta: Uint8Array, body: Uint8Array, length = meta.byteLength): Uint8Array => {
  const out = new Uint8Array(4 + meta.byteLength + body.byteLength);
  new DataView(out.buffer).setUint32(0, length >>> 0);
  out.set(meta, 4);
  out.set(body, 4 + meta.byteLength);
  return out;
};

const body = fc.uint8Array({ maxLength: 64 });
const json = fc.jsonValue({ maxDepth: 3 });
/** Values of the wrong type for any field. */
const wrong = fc.oneof(fc.constantFrom(null, 0, -1, 1.5, true, "", "x", [], {}, ["a"], { a: 1 }), json);
const field = <T>(right: fc.Arbitrary<T>) =>
  fc.oneof(
    { weight: 6, arbitrary: right },
    { weight: 1, arbitrary: wrong },
    { weight: 1, arbitrary: fc.constant(undefined) },
  );
const headers = fc.dictionary(fc.string({ maxLength: 10 }), fc.string({ maxLength: 10 }), { maxKeys: 3 });

const requestMetaArb = fc.record({
  run_id: field(fc.uuid()),
  method: field(fc.constantFrom("GET", "POST", "PUT")),
  path: field(fc.string({ maxLength: 20 })),
  query: field(fc.string({ maxLength: 20 })),
  headers: field(fc.oneof(headers, fc.dictionary(fc.string({ maxLength: 5 }), wrong, { maxKeys: 2 }))),
  body_object: fc.oneof(
    { weight: 8, arbitrary: fc.constant(undefined) },
    { weight: 1, arbitrary: fc.oneof(fc.constantFrom("transfer.none", "", ".", "a b", "transfer.>"), fc.string()) },
    { weight: 1, arbitrary: wrong },
  ),
  stream_to: fc.oneof({ weight: 6, arbitrary: fc.constant(undefined) }, { weight: 1, arbitrary: field(fc.string()) }),
  record: fc.oneof({ weight: 6, arbitrary: fc.constant(undefined) }, { weight: 1, arbitrary: wrong }),
});
const replyMetaArb = fc.oneof(
  fc.record({
    status: field(fc.integer({ min: 100, max: 599 })),
    headers: field(
      fc.dictionary(
        fc.string({ maxLength: 10 }),
        fc.oneof(fc.string(), fc.array(fc.string(), { maxLength: 2 }), wrong),
        {
          maxKeys: 3,
        },
      ),
    ),
    run_time_ms: field(fc.nat()),
    replica_id: field(fc.string({ maxLength: 10 })),
    body_object: fc.oneof(
      { weight: 8, arbitrary: fc.constant(undefined) },
      { weight: 1, arbitrary: field(fc.string()) },
    ),
    stream: fc.oneof(
      { weight: 6, arbitrary: fc.constant(undefined) },
      { weight: 1, arbitrary: field(fc.record({ credit_to: field(fc.string()) })) },
    ),
  }),
  fc.record({
    error: field(
      fc.constantFrom(
        "Overloaded",
        "RunTimeout",
        "Cancelled",
        "ReplicaCrashed",
        "FunctionNotFound",
        "AppNotFound",
        "X",
      ),
    ),
    message: field(fc.string()),
    retry_after: field(fc.nat()),
    seconds: field(fc.nat()),
    app: field(fc.string()),
    function: field(fc.string()),
  }),
);
/** Bytes given to a decoder: anything, a frame of any metadata bytes, or a frame of near-valid metadata. */
const data = (meta: fc.Arbitrary<unknown>) =>
  fc.oneof(
    fc.uint8Array({ maxLength: 80 }),
    fc
      .tuple(fc.uint8Array({ maxLength: 40 }), body, fc.option(fc.nat(), { nil: undefined }))
      .map(([m, b, n]) => rawFrame(m, b, n)),
    fc.tuple(json, body).map(([m, b]) => frame(m as object, b)),
    fc.tuple(json, body).map(([m, b]) => rawFrame(encoder.encode(JSON.stringify(m)), b)),
    fc.tuple(meta, body).map(([m, b]) => frame(m as object, b)),
    fc.tuple(meta, body).map(([m, b]) => frame(m as object, b)),
  );

const isStringRecord = (v: unknown, item: (x: unknown) => boolean) =>
  typeof v === "object" && v !== null && !Array.isArray(v) && Object.values(v).every(item);
const isString = (x: unknown) => typeof x === "string";

describe("fuzz: run wire format", () => {
  let nats: Awaited<ReturnType<typeof startProvisionedNats>>;
  let nc: NatsConnection;
  let transfer: BodyTransfer;
  beforeAll(async () => {
    nats = await startProvisionedNats();
    nc = nats.nc;
    transfer = new BodyTransfer(nc, () => nc.jetstream().views.os("skiff-results"));
  });
  afterAll(() => nats?.stop());

  it(
    `decodeRequest: a request of the declared types or an Error (${FUZZ_RUNS} cases)`,
    async () => {
      let decoded = 0;
      await fc.assert(
        fc.asyncProperty(data(requestMetaArb), async (bytes) => {
          let req;
          try {
            req = await decodeRequest(transfer, bytes, true);
          } catch (err) {
            assert.ok(err instanceof Error, `threw a non-Error: ${String(err)}`);
            return;
          }
          decoded++;
          assert.equal(typeof req.runId, "string");
          assert.equal(typeof req.method, "string");
          assert.equal(typeof req.path, "string");
          assert.equal(typeof req.query, "string");
          assert.ok(isStringRecord(req.headers, isString), `headers ${JSON.stringify(req.headers)}`);
          assert.ok(req.body instanceof Uint8Array);
          assert.ok(req.streamTo === undefined || typeof req.streamTo === "string");
          // requestMeta reads the same frame without failing.
          const meta = requestMeta(bytes);
          assert.equal(meta.run_id, req.runId);
          assert.ok(meta.record === undefined || (typeof meta.record === "object" && meta.record !== null));
        }),
        { numRuns: FUZZ_RUNS },
      );
      expect(decoded).toBeGreaterThan(0);
    },
    fuzzTimeout(20),
  );

  it(
    `decodeReply: an answer of the declared types, a runner error, or an Error (${FUZZ_RUNS} cases)`,
    async () => {
      let decoded = 0;
      await fc.assert(
        fc.asyncProperty(data(replyMetaArb), async (bytes) => {
          let res;
          try {
            res = await decodeReply(transfer, bytes);
          } catch (err) {
            assert.ok(err instanceof Error, `threw a non-Error: ${String(err)}`);
            if (err instanceof RunnerError) assert.equal(typeof err.message, "string");
            return;
          }
          decoded++;
          assert.ok(Number.isInteger(res.status) && res.status >= 100 && res.status <= 599, `status ${res.status}`);
          assert.ok(
            isStringRecord(res.headers, (v) => isString(v) || (Array.isArray(v) && v.every(isString))),
            `headers ${JSON.stringify(res.headers)}`,
          );
          assert.ok(Number.isFinite(res.runTimeMs) && res.runTimeMs >= 0, `run_time_ms ${res.runTimeMs}`);
          assert.equal(typeof res.replicaId, "string");
          assert.ok(res.body instanceof Uint8Array);
          assert.ok(res.creditTo === undefined || typeof res.creditTo === "string");
        }),
        { numRuns: FUZZ_RUNS },
      );
      expect(decoded).toBeGreaterThan(0);
    },
    fuzzTimeout(20),
  );

  const streamMeta = fc.oneof(
    fc.record({ seq: fc.nat(4), kind: field(fc.constantFrom("chunk", "beat", "end", "fail", "other")) }),
    fc.record({
      seq: fc.nat(4),
      kind: fc.constant("end"),
      run_time_ms: field(fc.nat()),
      error: fc.option(field(fc.record({ type: field(fc.string()), message: field(fc.string()) })), { nil: undefined }),
    }),
    fc.record({ seq: fc.nat(4), kind: fc.constant("fail"), error: field(fc.string()), message: field(fc.string()) }),
    json,
  );
  const streamFrame = fc.oneof(
    { weight: 4, arbitrary: fc.tuple(streamMeta, body).map(([m, b]) => frame(m as object, b)) },
    { weight: 1, arbitrary: fc.uint8Array({ maxLength: 40 }) },
  );

  it(
    `StreamReceiver: arbitrary frames give chunks and an end of the declared types, or an Error; never a hang (${FUZZ_RUNS} cases)`,
    async () => {
      let ended = 0;
      await fc.assert(
        fc.asyncProperty(fc.array(streamFrame, { maxLength: 5 }), async (frames) => {
          const receiver = new StreamReceiver(nc);
          const stream = receiver.stream("skiff.fuzz.credit", () => undefined);
          // The fuzzed frames, then a proper end: whatever came before, the stream finishes.
          for (const f of frames) nc.publish(receiver.inbox, f);
          nc.publish(receiver.inbox, frame({ seq: frames.length + 1, kind: "end", run_time_ms: 1 }, new Uint8Array()));
          let failure: unknown;
          try {
            for await (const chunk of stream.chunks) assert.ok(chunk instanceof Uint8Array);
          } catch (err) {
            failure = err;
          }
          if (failure !== undefined) {
            assert.ok(failure instanceof Error, `threw a non-Error: ${String(failure)}`);
            const settled = await stream.ended.then(
              () => "resolved",
              (e: unknown) => e,
            );
            assert.ok(settled instanceof Error, "the body failed but its end did not reject with an Error");
            receiver.close();
            return;
          }
          try {
            const end = await stream.ended;
            ended++;
            assert.ok(Number.isFinite(end.runTimeMs) && end.runTimeMs >= 0, `run_time_ms ${end.runTimeMs}`);
            if (end.error !== undefined) {
              assert.equal(typeof end.error.type, "string");
              assert.equal(typeof end.error.message, "string");
            }
          } finally {
            receiver.close();
          }
        }),
        { numRuns: FUZZ_RUNS },
      );
      expect(ended).toBeGreaterThan(0);
    },
    fuzzTimeout(20),
  );
});
