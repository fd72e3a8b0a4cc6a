// Fuzzing the frames between gateway and runner (runner-client/codec.ts):
// arbitrary bytes, and frames around arbitrary or almost-right JSON
// metadata, given to decodeRequest and decodeReply; arbitrary stream frames
// sent to the gateway's side of a streamed answer (runner-client/nats.ts
// answerStream). Each either decodes to values of the declared types or
// throws an Error (a stream: rejects with one), and none hangs. A real nats-server
// holds the object store that frames naming a body object are read from.
import assert from "node:assert/strict";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "nats";
import { ByteStream } from "../../services/runner-client/byte-stream.js";
import {
  decodeReply,
  decodeRequest,
  encodeStreamFrame,
  frame,
  requestMeta,
  StreamKind,
} from "../../services/runner-client/codec.js";
import { answerStream } from "../../services/runner-client/nats.js";
import { BodyTransfer } from "../../services/runs/transfer.js";
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
  stream: fc.oneof(
    { weight: 6, arbitrary: fc.constant(undefined) },
    { weight: 1, arbitrary: field(fc.oneof(fc.stringMatching(/^[A-Za-z0-9]{1,22}$/), fc.string())) },
  ),
  accept_stream: fc.oneof({ weight: 6, arbitrary: fc.constant(undefined) }, { weight: 1, arbitrary: wrong }),
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
    streams: fc.oneof({ weight: 6, arbitrary: fc.constant(undefined) }, { weight: 1, arbitrary: field(fc.boolean()) }),
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
          // requestMeta reads the same frame without failing.
          const meta = requestMeta(bytes);
          assert.ok(meta.stream === undefined || /^[A-Za-z0-9]+$/.test(meta.stream), `stream ${meta.stream}`);
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
          assert.ok(res.streams === undefined || res.streams === true);
        }),
        { numRuns: FUZZ_RUNS },
      );
      expect(decoded).toBeGreaterThan(0);
    },
    fuzzTimeout(20),
  );

  const endTrailer = fc.oneof(
    fc.record({
      run_time_ms: field(fc.nat()),
      error: fc.option(field(fc.record({ type: field(fc.string()), message: field(fc.string()) })), { nil: undefined }),
    }),
    fc.record({ error: field(fc.string()), message: field(fc.string()) }),
    json,
  );
  const payload = fc.oneof(
    body,
    endTrailer.map((t) => encoder.encode(JSON.stringify(t))),
    fc.uint8Array({ minLength: 4, maxLength: 4 }),
  );
  const streamFrame = fc.oneof(
    {
      weight: 4,
      arbitrary: fc
        .tuple(fc.integer({ min: 0, max: 7 }), fc.option(fc.nat(6), { nil: undefined }), payload)
        .map(([kind, seq, p]) => ({ kind, seq, p })),
    },
    { weight: 1, arbitrary: fc.uint8Array({ maxLength: 40 }).map((raw) => ({ raw })) },
  );
  let streams = 0;

  it(
    `a streamed answer: arbitrary frames give chunks and an end of the declared types, or an Error; never a hang (${FUZZ_RUNS} cases)`,
    async () => {
      let ended = 0;
      await fc.assert(
        fc.asyncProperty(fc.array(streamFrame, { maxLength: 5 }), async (frames) => {
          const id = `fuzz.stream.${streams++}`;
          const stream = new ByteStream({ nc, send: `${id}.up`, receive: `${id}.down`, heartbeatMs: 200 });
          const answer = answerStream(stream, () => undefined);
          await nc.flush();
          // The fuzzed frames (a frame's seq, when not given, counts on from the last), then a proper end:
          // whatever came before, the stream finishes or fails.
          let seq = 0;
          for (const f of frames) {
            if ("raw" in f) nc.publish(`${id}.down`, f.raw);
            else nc.publish(`${id}.down`, encodeStreamFrame(f.kind as StreamKind, (seq = f.seq ?? seq + 1), f.p));
          }
          nc.publish(`${id}.down`, encodeStreamFrame(StreamKind.End, seq + 1, encoder.encode('{"run_time_ms":1}')));
          let failure: unknown;
          try {
            for await (const chunk of answer.chunks) assert.ok(chunk instanceof Uint8Array);
          } catch (err) {
            failure = err;
          }
          stream.destroy();
          if (failure !== undefined) {
            assert.ok(failure instanceof Error, `threw a non-Error: ${String(failure)}`);
            const settled = await answer.ended.then(
              () => "resolved",
              (e: unknown) => e,
            );
            assert.ok(settled instanceof Error, "the body failed but its end did not reject with an Error");
            return;
          }
          const end = await answer.ended;
          ended++;
          assert.ok(Number.isFinite(end.runTimeMs) && end.runTimeMs >= 0, `run_time_ms ${end.runTimeMs}`);
          if (end.error !== undefined) {
            assert.equal(typeof end.error.type, "string");
            assert.equal(typeof end.error.message, "string");
          }
        }),
        { numRuns: FUZZ_RUNS },
      );
      expect(ended).toBeGreaterThan(0);
    },
    fuzzTimeout(20),
  );
});
