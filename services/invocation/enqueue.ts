// Async runs: the run is durably queued before the caller hears of it. In
// order: the Idempotency-Key is claimed, only when given (a repeat answers
// the first run id); the app's queue must have room (SKIFF_MAX_QUEUED_RUNS,
// else 429; counted without a round trip, see queue-depth.ts); the webhook
// secret is sealed and stored, only when given; the `queued` event goes out
// unacknowledged, and the request, carrying the `queued` record, is
// published to JetStream on `skiff.runs.queue.{project}.{app}` with
// Nats-Msg-Id = run id. That publish is the one round trip: once JetStream
// has acknowledged it, the caller gets 202 {"run_id":"…"} with X-Request-Id.
// No KV record is written: the queue message is the queued run's record
// (a backlog of queued runs costs NATS no subject per run), and the runner
// that takes the run writes the first one, `running`.
// The queue is never made to drop an accepted run: SKIFF_RUNS refuses new
// messages at its byte budget (discard new), and before it would, a call
// gets 503 with Retry-After saying the queue is full.
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, type HandlerContext } from "@connectrpc/connect";
import { RunResponseSchema, type RunResponse } from "../../gen/skiff/invocation/v4/invocation_pb.js";
import { type InvokeRequest, publishRunEvent, publishRunEventUnacked, type RunRecord } from "../runs/index.js";
import { encodeRequest } from "../runner-client/index.js";
import type { AppRecord } from "../apps/index.js";
import { setHttpStatus } from "../server/index.js";
import { isStreamFull, mib, publishAcked, streams, subjects } from "../nats/index.js";
import { storeWebhookSecret } from "../webhooks/index.js";
import type { InvocationDeps } from "./deps.js";
import { claimIdempotencyKey, releaseIdempotencyKey } from "./idempotency.js";

const QUEUE_FULL_RETRY_AFTER_SECONDS = 5;
/** What a queue message takes in SKIFF_RUNS besides its data: subject, headers, JetStream's framing. */
const QUEUE_MESSAGE_OVERHEAD_BYTES = 256;

/** 503: SKIFF_RUNS is at its byte budget; an accepted run is never dropped to make room. */
function queueFullError(deps: InvocationDeps): ConnectError {
  const u = deps.storeWatch?.get(streams.runs.name);
  const held = u && u.budget > 0 ? ` (it holds ${mib(u.bytes)} of its ${mib(u.budget)} budget)` : "";
  return new ConnectError(
    `the async run queue ${streams.runs.name} is full${held}, set by SKIFF_RUN_QUEUE_MAX_BYTES; no run is dropped to make room: try again once runners have taken runs from it`,
    Code.Unavailable,
    { "retry-after": String(QUEUE_FULL_RETRY_AFTER_SECONDS) },
  );
}

export interface AsyncCall {
  /** The id the run gets when accepted (already the call's X-Request-Id). */
  runId: string;
  app: AppRecord;
  /** The record to write, without run id. */
  record: RunRecord;
  invoke: InvokeRequest;
  secret: string | undefined;
  idempotencyKey: string | undefined;
}

const encoder = new TextEncoder();

function accepted(ctx: HandlerContext, runId: string): RunResponse {
  ctx.responseHeader.set("x-request-id", runId);
  setHttpStatus(ctx, 202);
  const data = encoder.encode(JSON.stringify({ run_id: runId }));
  return create(RunResponseSchema, { runId, statusCode: 202, body: { contentType: "application/json", data } });
}

export async function enqueue(deps: InvocationDeps, call: AsyncCall, ctx: HandlerContext): Promise<RunResponse> {
  const { app, record, invoke, runId } = call;
  if (call.idempotencyKey !== undefined) {
    const first = await claimIdempotencyKey(deps.nc, app, call.idempotencyKey, runId);
    if (first !== runId) return accepted(ctx, first);
  }
  record.run_id = invoke.runId = runId;
  const subject = subjects.runQueue(app.project_id, app.app_name);
  const queue = { project: app.project_id, app: app.app_name };
  let written = false;
  try {
    const full = async () =>
      (await deps.queueDepths.count(queue)) >= deps.maxQueuedRuns &&
      (await deps.queueDepths.fresh(queue)) >= deps.maxQueuedRuns;
    if (await full()) {
      throw new ConnectError(
        `app ${app.app_name} has ${deps.maxQueuedRuns} runs queued, the most it may have (SKIFF_MAX_QUEUED_RUNS); try again later`,
        Code.ResourceExhausted,
        { "retry-after": String(QUEUE_FULL_RETRY_AFTER_SECONDS) },
      );
    }
    // Checked before anything is stored for the run; a body past a NATS message travels in the object store.
    const size = Math.min(invoke.body.length, deps.nc.info?.max_payload ?? Infinity) + QUEUE_MESSAGE_OVERHEAD_BYTES;
    if (deps.storeWatch?.hasRoom(streams.runs.name, size) === false) throw queueFullError(deps);
    if (call.secret !== undefined) await storeWebhookSecret(deps.secrets, deps.box, runId, call.secret);
    // One acknowledged publish: the queue message, which carries the `queued`
    // record (a run has no KV record until a runner takes it, or a cancel
    // ends it). Its event goes ahead on the same connection without waiting:
    // the run history shows the run queued from it.
    publishRunEventUnacked(deps.nc, record);
    written = true;
    const { data } = await encodeRequest(deps.transfer, invoke, { record });
    await publishAcked(deps.nc, subject, data, { msgId: runId });
    deps.storeWatch?.add(streams.runs.name, data.length + QUEUE_MESSAGE_OVERHEAD_BYTES);
    deps.queueDepths.accepted(queue);
  } catch (err) {
    if (call.idempotencyKey !== undefined)
      await releaseIdempotencyKey(deps.idempotency, app, call.idempotencyKey, runId);
    if (written) await markUnqueued(deps, record, err);
    if (err instanceof ConnectError) throw err;
    if (isStreamFull(err)) {
      deps.logger.debug({ runId }, `an async run was refused: ${streams.runs.name} is at its budget`);
      throw queueFullError(deps);
    }
    deps.logger.error({ err, runId }, "cannot queue an async run");
    throw new ConnectError("the run could not be queued; try again", Code.Unavailable);
  }
  return accepted(ctx, runId);
}

/**
 * A run announced `queued` that never reached the queue must not read so
 * forever: its record is written `failure` (only if it has none: a queue
 * publish whose acknowledgement was lost may still have landed and been
 * taken by a runner), with its event.
 */
async function markUnqueued(deps: InvocationDeps, record: RunRecord, cause: unknown): Promise<void> {
  try {
    const final = await deps.runs.create({
      ...record,
      status: "failure",
      finished_at: new Date().toISOString(),
      error: { type: "not_queued", message: "the run could not be queued" },
    });
    if (final) await publishRunEvent(deps.nc, final.record);
  } catch (err) {
    deps.logger.error({ err, cause, runId: record.run_id }, "cannot record that a run was not queued");
  }
}
