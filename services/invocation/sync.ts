// Sync runs. The caller waits for the app's answer and gets it as it is.
// The runner client (runner-client/) takes the run to the app: this
// process's runner when it hosts the app, else one over NATS. The run
// record and events are written without waiting for them: the caller's
// latency is the app's, and a failed write is logged. A run that ends within
// RUNNING_EVENT_AFTER_MS is written once, when it ends; a longer one
// shows as `running` from then on.
import { type HandlerContext } from "@connectrpc/connect";
import type { RunResponse } from "../../gen/skiff/invocation/v4/invocation_pb.js";
import {
  type InvokeRequest,
  type InvokeResponse,
  contentTypeOf,
  outcomeOfAnswer,
  outcomeOfError,
  runFailure,
  type RunOutcome,
  type RunRecord,
  RUNNING_EVENT_AFTER_MS,
  type StreamEnd,
} from "../runs/index.js";
import type { AppRecord } from "../apps/index.js";
import { httpExchange, LightSignal, setHttpStatus } from "../server/index.js";
import { storeWebhookSecret } from "../webhooks/index.js";
import type { InvocationDeps } from "./deps.js";
import { streamTo, takesStream } from "./streamed.js";

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
  const books = new SyncBooks(deps, record);

  // What stops the run: a REST call's own signal, which aborts only when its caller goes away (or by
  // exchange.abort, a cancel); a Connect call's aborts when the handler returns too, which a streamed
  // answer outlives, so such a run has a signal of its own.
  const exchange = httpExchange(ctx);
  const own = exchange ? undefined : new LightSignal();
  const onGone = own && (() => own.abort(ctx.signal.reason));
  if (onGone) ctx.signal.addEventListener("abort", onGone, { once: true });
  invoke.signal = own ?? exchange!.signal;
  // A REST caller and RunStream take a streamed answer as it comes; a Connect or gRPC caller of Run gets it whole.
  const streamed = takesStream(ctx);
  invoke.acceptStream = true;
  const work = deps.runners
    .invoke(app, invoke)
    .then((res): Answer =>
      res.stream ? keepStreamed(res, !streamed || record.webhook_endpoint !== undefined) : { res },
    );
  const finished = work.then(
    (answer) => books.answered(answer),
    (err: unknown) => books.failed(err),
  );
  deps.control.track(record.run_id, own ?? exchange!, finished);
  let streaming = false;
  try {
    const { res, kept } = await work;
    if (!kept) return answer(ctx, record, res, app.config.runtime.kind === "custom");
    if (streamTo(ctx, res.stream!)) {
      // A RunStream caller that goes away while the body streams stops the run, as a REST caller does.
      if (onGone) void finished.finally(() => ctx.signal.removeEventListener("abort", onGone));
      streaming = true;
      return answer(ctx, record, res, true);
    }
    // Run over Connect or gRPC: the whole body, once it has ended (RunStream streams it).
    for await (const chunk of res.stream!.chunks) void chunk;
    return answer(ctx, record, { ...res, body: kept() }, true);
  } catch (err) {
    throw runFailure(err).connect;
  } finally {
    if (onGone && !streaming) ctx.signal.removeEventListener("abort", onGone);
  }
}

/**
 * A sync run's record keeping: its `running` announcement after
 * RUNNING_EVENT_AFTER_MS and its end, as one object whose methods are
 * its class's (a run makes no closures for them).
 */
class SyncBooks {
  private readonly started = performance.now();
  private readonly announce: NodeJS.Timeout;

  constructor(
    private readonly deps: InvocationDeps,
    private readonly record: RunRecord,
  ) {
    this.announce = setTimeout(announceRunning, RUNNING_EVENT_AFTER_MS, this);
  }

  announceRunning(): void {
    this.deps.syncRuns.running(this.record);
  }

  end(outcome: RunOutcome): void {
    clearTimeout(this.announce);
    this.deps.syncRuns.finished(this.record, outcome);
  }

  /** Its end could not be recorded (a bug: finishing logs its own failures). */
  lost(err: unknown): void {
    this.deps.logger.error({ err, runId: this.record.run_id }, "cannot record a sync run's end");
  }

  failed(err: unknown): void {
    this.end(outcomeOfError(err, Math.round(performance.now() - this.started)));
  }

  /** The app answered: the run ends once its answer is written (see endings), or when a streamed body has ended. */
  answered({ res, kept, streamed }: Answer): void | Promise<void> {
    if (!kept) return endings.add(this, res);
    return res.stream!.ended.then(
      (streamEnd) => this.end(outcomeOfStream(res, streamEnd, kept(), streamed!())),
      (err: unknown) => this.failed(err),
    );
  }
}

/**
 * The sync runs whose apps answered in this turn of the event loop, ended
 * after it (setImmediate): the answers to their callers are written first,
 * and each run's end (its record, its event, its metrics) after, so a
 * caller's latency does not include them. At one connection, three pairs in
 * turn on a 2-core machine: p50 0.61 / 0.55 / 0.52 ms against 0.69 / 0.76 /
 * 0.65 (bench/README.md). What `add` returns settles once the turn's runs
 * have ended (a run is tracked until then: see RunControl.track).
 */
class Endings {
  private books: SyncBooks[] = [];
  private answers: InvokeResponse[] = [];
  private ended: Promise<void> | undefined;
  private settle: (() => void) | undefined;

  add(books: SyncBooks, res: InvokeResponse): Promise<void> {
    this.books.push(books);
    this.answers.push(res);
    if (this.ended === undefined) {
      this.ended = new Promise((resolve) => (this.settle = resolve));
      setImmediate(endTurn, this);
    }
    return this.ended;
  }

  end(): void {
    const { books, answers, settle } = this;
    this.books = [];
    this.answers = [];
    this.ended = this.settle = undefined;
    for (let i = 0; i < books.length; i++) {
      try {
        books[i].end(outcomeOfAnswer(answers[i]));
      } catch (err) {
        books[i].lost(err);
      }
    }
    settle!();
  }
}

const endings = new Endings();

function endTurn(e: Endings): void {
  e.end();
}

function announceRunning(books: SyncBooks): void {
  books.announceRunning();
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
      // where the answer was read (the runner's pool, or the reply from a remote runner: runner-client/codec.ts).
      if (name === "content-type") continue;
      const value = res.headers[name];
      if (Array.isArray(value)) for (const each of value) ctx.responseHeader.append(name, each);
      else ctx.responseHeader.set(name, value);
      headers[name] = Array.isArray(value) ? value.join(", ") : value;
    }
  }
  // The message object as create() would make it, without its reflection on every sync call.
  return {
    $typeName: "skiff.invocation.v4.RunResponse",
    runId: record.run_id,
    statusCode: res.status,
    headers,
    body: { $typeName: "google.api.HttpBody", contentType: contentTypeOf(res.headers), data: res.body, extensions: [] },
  };
}
