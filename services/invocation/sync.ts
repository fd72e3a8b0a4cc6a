// Sync runs. The caller waits for the app's answer and gets it as it is.
// When this process's runner hosts the app the call goes to it directly;
// otherwise it is a NATS request on `skiff.invoke.{project}.{app}`, answered
// by one runner of the queue group (services/runner/dispatch.ts), or on
// `skiff.invoke-body.{project}.{app}` when its body follows it (see remote()). The run
// record and events are written without waiting for them: the caller's
// latency is the app's, and a failed write is logged. A run that ends within
// SYNC_RUNNING_RECORD_AFTER_MS is written once, when it ends; a longer one
// shows as `running` from then on.
import { create } from "@bufbuild/protobuf";
import { type HandlerContext } from "@connectrpc/connect";
import { ErrorCode, NatsError } from "nats";
import { RunResponseSchema, type RunResponse } from "../../gen/skiff/invocation/v4/invocation_pb.js";
import {
  AppNotFound,
  ReplicaCrashed,
  type InvokeRequest,
  type InvokeResponse,
  broadcastAbort,
  publishRunEventUnacked,
  finishSync,
  contentTypeOf,
  NoRunner,
  outcomeOfAnswer,
  outcomeOfError,
  requestBodyFailed,
  runFailure,
  type RunOutcome,
  type RunRecord,
  type StreamEnd,
  decodeReply,
  encodeRequest,
  StreamReceiver,
  BodySender,
  type AnswerStream,
} from "../runs/index.js";
import type { AppRecord } from "../apps/index.js";
import { httpExchange, setHttpStatus } from "../server/index.js";
import { subjects } from "../nats/index.js";
import { storeWebhookSecret } from "../webhooks/index.js";
import type { InvocationDeps } from "./deps.js";
import { streamTo, takesStream } from "./streamed.js";

/** How long after a deploy a sync call waits for a runner to have the app, rather than answering 503. */
const FRESH_DEPLOY_MS = 2 * 60_000;
const FRESH_DEPLOY_WAIT_MS = 30_000;

/**
 * Right after a deploy, this process's runner is still fetching and preparing
 * the new app: a call then waits for it instead of failing at once. (A
 * gateway without a runner of its own cannot know whether one is coming.)
 */
function freshDeployWait(app: AppRecord): number {
  const age = Date.now() - Date.parse(app.deployment.created_at);
  return age < FRESH_DEPLOY_MS ? FRESH_DEPLOY_WAIT_MS : 0;
}

/** Whether this process's runner has the app: waiting (bounded) for a deployment it is still preparing. */
export async function localRunnerHas(deps: InvocationDeps, app: AppRecord, signal: AbortSignal): Promise<boolean> {
  const runner = deps.runner;
  if (runner === undefined) return false;
  const end = Date.now() + freshDeployWait(app);
  for (;;) {
    const version = runner.version(app.project_id, app.app_name);
    if ((version ?? 0) >= app.deployment.version) return true;
    if (signal.aborted || Date.now() >= end) return version !== undefined;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/**
 * A sync run still going after this long is recorded as `running` (record
 * and event); a faster one is written once, when it ends: most sync runs
 * cost one record and one event.
 */
export const SYNC_RUNNING_RECORD_AFTER_MS = 1_000;

/** Beyond response_grace_period, how long a gateway waits for a runner's answer (the runner times the run out first). */
const REPLY_MARGIN_MS = 5_000;

export async function runSync(
  deps: InvocationDeps,
  app: AppRecord,
  record: RunRecord,
  invoke: InvokeRequest,
  secret: string | undefined,
  ctx: HandlerContext,
): Promise<RunResponse> {
  // The secret must be stored before the terminal event asks the webhook role to sign.
  if (secret !== undefined) await storeWebhookSecret(deps.secrets, deps.box, record.run_id, secret);
  // Bookkeeping of a sync run is not awaited, nor acknowledged (see finishSync);
  // a run that ends quickly is written only once it ended.
  const announce = setTimeout(() => publishRunEventUnacked(deps.nc, record), SYNC_RUNNING_RECORD_AFTER_MS);

  // What stops the run: a REST call's own signal, which aborts only when its caller goes away (or by
  // exchange.abort, a cancel); a Connect call's aborts when the handler returns too, which a streamed
  // answer outlives, so such a run has a controller of its own.
  const exchange = httpExchange(ctx);
  const controller = exchange ? undefined : new AbortController();
  const onGone = () => controller?.abort(ctx.signal.reason);
  if (controller) ctx.signal.addEventListener("abort", onGone, { once: true });
  const signal = controller?.signal ?? ctx.signal;
  const local = await localRunnerHas(deps, app, ctx.signal);
  invoke.signal = signal;
  // A REST caller and RunStream take a streamed answer as it comes; a Connect or gRPC caller of Run gets it whole.
  const streamed = takesStream(ctx);
  invoke.acceptStream = true;
  const started = performance.now();
  const work = (
    local ? deps.runner!.invoke(record.project_id, record.app_name, invoke) : remote(deps, app, invoke, signal)
  ).then((res): Answer =>
    res.stream ? keepStreamed(res, !streamed || record.webhook_endpoint !== undefined) : { res },
  );
  const end = (outcome: RunOutcome) => {
    clearTimeout(announce);
    finishSync(deps, record, outcome);
  };
  const failed = (err: unknown) => end(outcomeOfError(err, Math.round(performance.now() - started)));
  const finished = work.then(
    ({ res, kept, streamed }) =>
      kept
        ? res.stream!.ended.then((streamEnd) => end(outcomeOfStream(res, streamEnd, kept(), streamed!())), failed)
        : end(outcomeOfAnswer(res)),
    failed,
  );
  deps.control.track(record.run_id, controller ?? exchange!, finished);
  try {
    const { res, kept } = await work;
    if (!kept) return answer(ctx, record, res, app.config.runtime.kind === "custom");
    if (streamTo(ctx, res.stream!)) return answer(ctx, record, res, true);
    // Run over Connect or gRPC: the whole body, once it has ended (RunStream streams it).
    for await (const chunk of res.stream!.chunks) void chunk;
    return answer(ctx, record, { ...res, body: kept() }, true);
  } catch (err) {
    throw runFailure(err).connect;
  } finally {
    if (controller) ctx.signal.removeEventListener("abort", onGone);
  }
}

/** A streamed answer's outcome: the app's status, unless the app reported a failure after the head went out. */
function outcomeOfStream(res: InvokeResponse, end: StreamEnd, body: Uint8Array, bytes: number): RunOutcome {
  const outcome = { ...outcomeOfAnswer({ ...res, body, runTimeMs: end.runTimeMs }), responseBytes: bytes };
  return end.error ? { ...outcome, status: "failure", error: end.error } : outcome;
}

/** The app's answer; `kept` gives what was kept of a streamed body once it ended, `streamed` its whole size. */
interface Answer {
  res: InvokeResponse;
  kept?: () => Uint8Array;
  streamed?: () => number;
}

/** Most of a streamed body kept for the run's final event (its webhook, or a caller that takes it whole). */
const MAX_KEPT_STREAM_BYTES = 64 * 1024 * 1024;

/**
 * A streamed answer whose chunks are also kept (up to MAX_KEPT_STREAM_BYTES)
 * when `keep`, for the terminal event: a webhook gets the whole body once
 * it ended, as it gets any other.
 */
function keepStreamed(res: InvokeResponse, keep: boolean): Required<Answer> {
  const source = res.stream!;
  const parts: Uint8Array[] = [];
  let size = 0;
  let total = 0;
  async function* chunks(): AsyncGenerator<Uint8Array> {
    for await (const chunk of source.chunks) {
      total += chunk.byteLength;
      if (keep && size + chunk.byteLength <= MAX_KEPT_STREAM_BYTES) {
        parts.push(chunk);
        size += chunk.byteLength;
      }
      yield chunk;
    }
  }
  return {
    res: { ...res, stream: { chunks: chunks(), cancel: source.cancel, ended: source.ended } },
    kept: () => (parts.length === 1 ? parts[0] : Buffer.concat(parts, size)),
    streamed: () => total,
  };
}

/** No runner takes a request whose body follows it: the ones there are of an earlier version, or none is. */
class NoBodyStreamRunner extends Error {
  override name = "NoBodyStreamRunner";
}

async function remote(
  deps: InvocationDeps,
  app: AppRecord,
  invoke: InvokeRequest,
  signal: AbortSignal,
): Promise<InvokeResponse> {
  if (invoke.bodyStream === undefined) return ask(deps, app, invoke, signal);
  try {
    return await ask(deps, app, invoke, signal);
  } catch (err) {
    if (!(err instanceof NoBodyStreamRunner)) throw err;
  }
  // Runners of an earlier version read a body only whole (a request carrying one that follows would reach the
  // app empty), and do not listen where such requests go: they get the body whole, as they always did.
  const body = invoke.bodyStream;
  invoke.bodyStream = undefined;
  invoke.body = await body.read().catch((err: unknown) => {
    throw requestBodyFailed(err);
  });
  deps.logger.debug({ runId: invoke.runId }, "no runner takes a body as it comes: sending it whole");
  return ask(deps, app, invoke, signal);
}

/** The request to one runner of the app over NATS, and its answer. */
async function ask(
  deps: InvocationDeps,
  app: AppRecord,
  invoke: InvokeRequest,
  signal: AbortSignal,
): Promise<InvokeResponse> {
  // A large body follows the request as the caller sends it (runs/body-wire.ts), at the runner's pace.
  const sender = invoke.bodyStream && new BodySender(deps.nc, invoke.bodyStream, deps.transfer.limit);
  // A caller that takes a stream gets a streamed answer's body through an inbox of this gateway.
  const receiver = invoke.acceptStream ? new StreamReceiver(deps.nc) : undefined;
  const { data, object } = await encodeRequest(deps.transfer, invoke, {
    streamTo: receiver?.inbox,
    bodyStream: sender?.meta,
  });
  // A cancel or a caller gone reaches the runner that has the run, until its body has ended.
  const onAbort = () => broadcastAbort(deps.nc, invoke.runId);
  signal.addEventListener("abort", onAbort, { once: true });
  // Once the answer has ended: what the app did not read of the body is not sent.
  const release = () => {
    sender?.stop();
    receiver?.close();
    signal.removeEventListener("abort", onAbort);
  };
  try {
    const timeout = app.config.scaling.responseGracePeriod * 1000 + REPLY_MARGIN_MS;
    const subject = (sender ? subjects.invokeBodyFollows : subjects.invoke)(app.project_id, app.app_name);
    const request = async () => {
      const reply = await deps.nc.request(subject, data, { timeout }).catch((err: unknown) => {
        if (err instanceof NatsError && err.code === ErrorCode.NoResponders) {
          // Nobody took the request, so nobody asked for its body either.
          if (sender) throw new NoBodyStreamRunner();
          throw new NoRunner(`no runner hosts app ${app.project_id}/${app.app_name} right now`);
        }
        if (err instanceof NatsError && err.code === ErrorCode.Timeout)
          throw new ReplicaCrashed(`the runner of app ${app.app_name} did not answer`, { cause: err });
        throw err;
      });
      return decodeReply(deps.transfer, reply.data);
    };
    // A runner that answers it no longer has the app (it is stopping, or the app moved) ran nothing: another
    // runner of the queue group may have it. Asked once more, unless the body went through the object store
    // (the first runner took it) or began to stream to the first runner.
    const { creditTo, ...res } = await request().catch((err: unknown) => {
      if (err instanceof AppNotFound && object === undefined && !sender?.started) return request();
      throw err;
    });
    if (creditTo === undefined || receiver === undefined) {
      release();
      return res;
    }
    // A streamed answer may go on reading the body as it writes.
    const stream = sender
      ? failingWithBody(receiver.stream(creditTo, onAbort), sender)
      : receiver.stream(creditTo, onAbort);
    void stream.ended.finally(release).catch(() => undefined);
    return { ...res, stream };
  } catch (err) {
    release();
    await deps.transfer.drop(object);
    // The caller's body broke here (gone, too large): that, not how the runner saw it, is why the run ended.
    if (sender?.failure !== undefined) throw requestBodyFailed(sender.failure);
    throw err;
  }
}

/** A streamed answer whose errors are the caller's body's when that broke at this gateway (see remote). */
function failingWithBody(stream: AnswerStream, sender: BodySender): AnswerStream {
  const why = (err: unknown) => (sender.failure !== undefined ? requestBodyFailed(sender.failure) : err);
  async function* chunks(): AsyncGenerator<Uint8Array> {
    try {
      yield* stream.chunks;
    } catch (err) {
      throw why(err);
    }
  }
  const ended = stream.ended.catch((err: unknown) => Promise.reject(why(err)));
  ended.catch(() => undefined); // the reader, or whoever records the run, sees it
  return { chunks: chunks(), cancel: stream.cancel, ended };
}

/**
 * The app's answer, for REST (status, headers, raw body: a Custom app's
 * headers go to the REST answer as they are) and for Connect and gRPC (the
 * message, its headers also those of the RPC's answer).
 */
function answer(ctx: HandlerContext, record: RunRecord, res: InvokeResponse, custom: boolean): RunResponse {
  if (res.status !== 200) setHttpStatus(ctx, res.status);
  const headers: Record<string, string> = {};
  const exchange = httpExchange(ctx);
  if (custom && exchange) exchange.responseHeaders = res.headers;
  else if (custom) {
    for (const name in res.headers) {
      // Content-Type travels with the body (it is the RPC's own header); the rest were filtered for callers
      // where the answer was read (the runner's pool, or the reply from a remote runner: runs/wire.ts).
      if (name === "content-type") continue;
      const value = res.headers[name];
      if (Array.isArray(value)) for (const each of value) ctx.responseHeader.append(name, each);
      else ctx.responseHeader.set(name, value);
      headers[name] = Array.isArray(value) ? value.join(", ") : value;
    }
  }
  return create(RunResponseSchema, {
    runId: record.run_id,
    statusCode: res.status,
    headers,
    body: { contentType: contentTypeOf(res.headers), data: res.body },
  });
}
