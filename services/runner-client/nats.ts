// The runner client over NATS, both ends: the gateway's (NatsRunnerClient)
// and the runner's (NatsRunnerServer), speaking the frames of codec.ts.
//
//   gateway                                    runner (queue group "runners", per app it hosts)
//   [opens byte stream {id}: hears .down]
//   request skiff.invoke.{p}.{a} ────────────► runner.invoke(...)
//     {run_id, …, stream: id, accept_stream, body_follows}
//                                               [its side of {id}: hears .up, made when first needed]
//   body ──► .up ──► (when the replica reads it, within the runner's credit)
//   ◄─────────── reply: the answer whole, or its head (`streams`), or an error
//   answer ◄── .down ◄── (within the gateway's credit; END carries run_time_ms and the app's error)
//
//   request skiff.ws.open.{p}.{a} ──────────► runner.upgrade(...)
//   ◄─────────── reply: 101 (`upgraded`, the app's first bytes) or the app's refusal
//   caller's bytes ──► .up ──► app           app ──► .down ──► caller
//
// The gateway writes the run record; the runner holds the replica slot until
// the answer's body (or the connection) has ended. The one byte stream
// (byte-stream.ts) gives both directions flow control, loss and silence
// detection, and cancel: a gateway that stops reading an answer aborts the
// stream, which stops the run on the runner (a cancel also reaches it as
// any cancel does, through RunControl).
import type { Msg, NatsConnection } from "nats";
import { ErrorCode, NatsError, nuid } from "nats";
import type { AppRecord } from "../apps/index.js";
import type { Logger } from "../config/index.js";
import { subjects } from "../nats/index.js";
import {
  AppNotFound,
  broadcastAbort,
  Cancelled,
  ReplicaCrashed,
  RequestBodyFailed,
  requestBodyFailed,
  RunnerError,
  StartFailed,
  type AnswerStream,
  type BodyTransfer,
  type InvokeRequest,
  type InvokeResponse,
  type RunControl,
  type StreamEnd,
} from "../runs/index.js";
import { readWhole, type StreamedRequestBody } from "../server/index.js";
import { AppSubscriptions, type AppRef } from "./app-subscriptions.js";
import { ByteStream, StreamAborted, StreamSilent } from "./byte-stream.js";
import { noRunner, type HostedRunner, type RunnerClient, type UpgradeAnswer, type UpgradeRequest } from "./client.js";
import {
  decodeError,
  decodeReply,
  decodeRequestFrame,
  decodeStreamEnd,
  encodeError,
  encodeErrorReply,
  encodeReply,
  encodeRequest,
  encodeStreamEnd,
  encodeUpgradeReply,
} from "./codec.js";

/** Beyond response_grace_period, how long a gateway waits for a runner's answer (the runner times the run out first). */
const REPLY_MARGIN_MS = 5_000;
/** How long a gateway waits for a runner's answer to a handshake: the runner's own wait for a slot, and more. */
const OPEN_TIMEOUT_MS = 65_000;
const EMPTY = new Uint8Array(0);

/** Tuning of both ends (tests shorten the heartbeat). */
export interface StreamTuning {
  heartbeatMs?: number;
}

/** The gateway's side of the byte stream `id`. */
function gatewayStream(nc: NatsConnection, id: string, tuning: StreamTuning): ByteStream {
  return new ByteStream({
    nc,
    send: subjects.runStream(id, "up"),
    receive: subjects.runStream(id, "down"),
    heartbeatMs: tuning.heartbeatMs,
  });
}

/** The runner's side of the byte stream `id` (the gateway's listens already). */
function runnerStream(nc: NatsConnection, id: string, tuning: StreamTuning): ByteStream {
  return new ByteStream({
    nc,
    send: subjects.runStream(id, "down"),
    receive: subjects.runStream(id, "up"),
    peerListening: true,
    heartbeatMs: tuning.heartbeatMs,
  });
}

/** Resolves when `stream` can take more (drain) or is gone (close). */
function room(stream: ByteStream): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      stream.off("drain", done);
      stream.off("close", done);
      resolve();
    };
    stream.once("drain", done);
    stream.once("close", done);
  });
}

/** The gateway's side: runs and WebSockets on a runner that hosts the app, over NATS. */
export class NatsRunnerClient implements RunnerClient {
  constructor(
    private readonly nc: NatsConnection,
    private readonly transfer: BodyTransfer,
    private readonly tuning: StreamTuning = {},
  ) {}

  async invoke(app: AppRecord, req: InvokeRequest): Promise<InvokeResponse> {
    const body = req.bodyStream;
    // A streamed body goes up, a streamed answer comes down, on one stream of this call.
    const id = req.acceptStream || body ? nuid.next() : undefined;
    const { data, object } = await encodeRequest(this.transfer, req, {
      stream: id,
      acceptStream: req.acceptStream,
      bodyFollows: body && (body.length === undefined ? {} : { length: body.length }),
    });
    // Listening before the request goes out: the runner may answer on the stream at once.
    const stream = id === undefined ? undefined : gatewayStream(this.nc, id, this.tuning);
    const pump = stream && body ? new BodyPump(stream, body) : undefined;
    // A cancel or a caller gone reaches the runner that has the run, until its body has ended.
    const onAbort = () => broadcastAbort(this.nc, req.runId);
    req.signal?.addEventListener("abort", onAbort, { once: true });
    const release = () => {
      stream?.destroy();
      req.signal?.removeEventListener("abort", onAbort);
    };
    try {
      const timeout = app.config.scaling.responseGracePeriod * 1000 + REPLY_MARGIN_MS;
      // Asked once more on AppNotFound unless the body went through the object store (the first runner took
      // it) or began to stream to the first runner.
      const { streams, ...res } = await this.ask(
        app,
        subjects.invoke(app.project_id, app.app_name),
        data,
        timeout,
        "",
        () => object === undefined && !stream?.started,
      );
      delete res.upgraded;
      if (!streams || !stream || !req.acceptStream) {
        release();
        return res;
      }
      stream.expectPeer();
      const answer = answerStream(stream, onAbort, () => pump?.failure);
      void answer.ended.finally(release).catch(() => undefined);
      return { ...res, stream: answer };
    } catch (err) {
      release();
      await this.transfer.drop(object);
      // The caller's body broke here (gone, too large): that, not how the runner saw it, is why the run ended.
      if (pump?.failure !== undefined) throw requestBodyFailed(pump.failure);
      throw err;
    }
  }

  async upgrade(app: AppRecord, req: UpgradeRequest): Promise<UpgradeAnswer> {
    const id = nuid.next();
    const stream = gatewayStream(this.nc, id, this.tuning);
    let res;
    try {
      const { data } = await encodeRequest(this.transfer, { ...req, method: "GET", body: EMPTY }, { stream: id });
      const subject = subjects.wsOpen(app.project_id, app.app_name);
      res = await this.ask(app, subject, data, OPEN_TIMEOUT_MS, " the WebSocket handshake", () => true);
    } catch (err) {
      stream.destroy();
      throw err;
    }
    const head = Buffer.from(res.body.buffer, res.body.byteOffset, res.body.byteLength);
    if (!res.upgraded) {
      stream.destroy();
      return { kind: "answered", status: res.status, headers: res.headers, body: head, replicaId: res.replicaId };
    }
    // The runner's side is there from now on: a destroy tells it, and its silence counts.
    stream.expectPeer();
    if (req.signal?.aborted) {
      stream.destroy();
      throw new Cancelled();
    }
    return {
      kind: "upgraded",
      status: res.status,
      headers: res.headers,
      socket: stream,
      head,
      replicaId: res.replicaId,
      // Another process's replica: its end shows only as the stream's.
      replicaExited: () => new Promise<void>(() => {}),
    };
  }

  /**
   * One request to a runner of the app's queue group, and its decoded reply:
   * no responders is NoRunner, no answer in time ReplicaCrashed. A runner
   * that answers it no longer has the app (it is stopping, or the app moved)
   * ran nothing: another runner of the group may have it, and is asked once
   * more when `retryable()`.
   */
  private async ask(
    app: AppRecord,
    subject: string,
    data: Uint8Array,
    timeout: number,
    what: string,
    retryable: () => boolean,
  ): Promise<Awaited<ReturnType<typeof decodeReply>>> {
    const once = async () => {
      let reply;
      try {
        reply = await this.nc.request(subject, data, { timeout });
      } catch (err) {
        if (err instanceof NatsError && err.code === ErrorCode.NoResponders) throw noRunner(app);
        if (err instanceof NatsError && err.code === ErrorCode.Timeout)
          throw new ReplicaCrashed(`the runner of app ${app.app_name} did not answer${what}`, { cause: err });
        throw err;
      }
      return decodeReply(this.transfer, reply.data);
    };
    return once().catch((err: unknown) => {
      if (err instanceof AppNotFound && retryable()) return once();
      throw err;
    });
  }
}

/**
 * The gateway sends the caller's body up the stream once the runner asks
 * for it (its first credit), at the runner's pace. `failure` holds the
 * body's own error (the caller gone, too large) once it broke; the runner
 * hears why in the stream's ABORT.
 */
class BodyPump {
  failure: unknown;

  constructor(
    private readonly stream: ByteStream,
    body: StreamedRequestBody,
  ) {
    void this.send(body);
  }

  private async send(body: StreamedRequestBody): Promise<void> {
    const stream = this.stream;
    if (!(await stream.contact)) return; // the call ended before a runner asked for the body
    try {
      for await (const chunk of body.chunks()) {
        if (stream.destroyed) return; // the answer came: what the app did not read is not sent
        if (!stream.write(chunk)) await room(stream);
      }
    } catch (err) {
      this.failure = err;
      if (!stream.destroyed) stream.abort(encodeError(requestBodyFailed(err)));
      return;
    }
    if (!stream.destroyed) stream.end();
  }
}

/** Why a streamed answer broke, as the run's error. */
function answerError(err: unknown): Error {
  if (err instanceof StreamAborted)
    return decodeError(err.reason, () => new ReplicaCrashed("the runner stopped the answer for a reason it garbled"));
  if (err instanceof StreamSilent)
    return new ReplicaCrashed(`the runner sent nothing for ${Math.round(err.silentMs / 1000)} s`);
  if (err instanceof RunnerError) return err;
  return new ReplicaCrashed("part of the answer was lost between runner and gateway", { cause: err });
}

/**
 * The body of a streamed answer as it comes down `stream`. cancel() (or a
 * reader that stops early) aborts the stream, which stops the run on the
 * runner, and calls `cancel` too. Its errors are the caller's body's when
 * that broke at this gateway (`bodyFailure`).
 */
export function answerStream(stream: ByteStream, cancel: () => void, bodyFailure?: () => unknown): AnswerStream {
  let resolveEnd!: (end: StreamEnd) => void;
  let rejectEnd!: (err: Error) => void;
  const ended = new Promise<StreamEnd>((resolve, reject) => ([resolveEnd, rejectEnd] = [resolve, reject]));
  ended.catch(() => undefined); // the reader, or whoever records the run, sees it
  let stopped = false;
  let settled = false;
  const stop = () => {
    if (stopped || settled) return;
    stopped = true;
    rejectEnd(new Cancelled());
    stream.destroy();
    cancel();
  };
  const why = (err: unknown): Error => {
    const failure = bodyFailure?.();
    return failure !== undefined ? requestBodyFailed(failure) : answerError(err);
  };
  async function* chunks(): AsyncGenerator<Uint8Array> {
    try {
      for await (const chunk of stream.iterator({ destroyOnReturn: false })) {
        if (stopped) return;
        yield chunk as Uint8Array;
      }
      if (stopped) return;
      const end = decodeStreamEnd(stream.trailer);
      settled = true;
      resolveEnd(end);
    } catch (err) {
      if (stopped) return;
      settled = true;
      const failure = why(err);
      rejectEnd(failure);
      throw failure;
    } finally {
      if (!settled) stop(); // the reader stopped early: the caller went away
    }
  }
  return { chunks: chunks(), cancel: stop, ended };
}

/**
 * The runner's side of a body that follows its request: the replica reads
 * it from the stream, and its first read is what asks the gateway for it
 * (a run refused before it reached a replica asks for none).
 */
class StreamBody implements StreamedRequestBody {
  private taken = false;

  constructor(
    private readonly open: () => ByteStream,
    readonly length: number | undefined,
  ) {}

  async *chunks(): AsyncGenerator<Uint8Array> {
    if (this.taken) throw new Error("the request body was read already");
    this.taken = true;
    try {
      for await (const chunk of this.open().iterator({ destroyOnReturn: false })) yield chunk as Uint8Array;
    } catch (err) {
      throw bodyError(err);
    }
  }

  read(): Promise<Uint8Array> {
    return readWhole(this.chunks());
  }
}

/** Why a body from the gateway broke; the replica is not blamed for any of these. */
function bodyError(err: unknown): RequestBodyFailed {
  const lost = (why: string) => new RequestBodyFailed(`the request body ${why}`, "lost", { cause: err });
  if (err instanceof StreamAborted) {
    const told = decodeError(err.reason, () => lost("was given up by the gateway"));
    return told instanceof RequestBodyFailed ? told : lost("was given up by the gateway");
  }
  if (err instanceof StreamSilent) return lost(`stopped coming for ${Math.round(err.silentMs / 1000)} s`);
  return lost("was cut between gateway and runner");
}

/**
 * The runner sends a streamed answer down the stream within the gateway's
 * credit, then its end (or its error). A gateway that gives up the stream
 * stops the answer.
 */
async function sendAnswer(
  stream: ByteStream,
  answer: AnswerStream,
  failed: (err: unknown) => Uint8Array,
): Promise<void> {
  try {
    for await (const chunk of answer.chunks) {
      if (stream.destroyed) return answer.cancel();
      if (!stream.write(chunk)) await room(stream);
    }
    if (stream.destroyed) return answer.cancel();
    const end = await answer.ended;
    await new Promise<void>((resolve) => {
      stream.once("close", resolve);
      stream.finish(encodeStreamEnd(end), resolve);
    });
  } catch (err) {
    if (!stream.destroyed) stream.abort(failed(err));
  }
}

export interface RunnerServerDeps {
  nc: NatsConnection;
  runner: HostedRunner;
  transfer: BodyTransfer;
  control: RunControl;
  logger: Logger;
  tuning?: StreamTuning;
}

/**
 * The runner's side: for each app it hosts (add/remove), the sync requests
 * and WebSocket handshakes of gateways, in queue group "runners", so one
 * runner hosting the app takes each.
 */
export class NatsRunnerServer {
  private readonly subs: AppSubscriptions;

  constructor(private readonly deps: RunnerServerDeps) {
    this.subs = new AppSubscriptions(deps.nc, (app) => [
      [subjects.invoke(app.projectId, app.appName), (a, msg) => this.answer(a, msg)],
      [subjects.wsOpen(app.projectId, app.appName), (a, msg) => this.open(a, msg)],
    ]);
  }

  add(app: AppRef): void {
    this.subs.add(app);
  }

  /** Drained (see app-subscriptions.ts): requests already routed here are answered. */
  remove(app: AppRef): void {
    this.subs.remove(app);
  }

  /** Takes no more requests, answering those already routed here; streams under way go on until they end. */
  close(): Promise<void> {
    return this.subs.close();
  }

  private asRunnerError(err: unknown, app: AppRef, runId: string): RunnerError {
    if (err instanceof RunnerError) return err;
    // The caller's body broke: the gateway knows why when it broke there; lost on the way, it reads as a crash.
    if (err instanceof RequestBodyFailed) return new ReplicaCrashed(err.message);
    this.deps.logger.error({ err, runId, app: `${app.projectId}/${app.appName}` }, "a run failed inside the runner");
    return new StartFailed("the runner could not run the request");
  }

  private async answer(app: AppRef, msg: Msg): Promise<void> {
    const { nc, runner, transfer, control } = this.deps;
    let runId = "";
    let stream: ByteStream | undefined;
    let finished = false;
    let ended!: () => void;
    const done = new Promise<void>((resolve) => (ended = resolve));
    try {
      const { req, meta } = await decodeRequestFrame(transfer, msg.data);
      runId = req.runId;
      const controller = new AbortController();
      req.signal = controller.signal;
      // This run's side of the stream, made when first needed; the gateway giving it up stops the run.
      const streamOf = () => {
        if (stream) return stream;
        stream = runnerStream(nc, meta.stream!, this.deps.tuning ?? {});
        stream.once("close", () => finished || controller.abort());
        return stream;
      };
      if (meta.body_follows) req.bodyStream = new StreamBody(streamOf, meta.body_follows.length);
      // A cancel reaches the run until its body has gone, a streamed one's too.
      control.track(runId, controller, done);
      const res = await runner.invoke(app.projectId, app.appName, req);
      if (res.stream && meta.accept_stream) {
        const down = streamOf();
        msg.respond(await encodeReply(transfer, runId, { ...res, body: EMPTY }, true));
        await sendAnswer(down, res.stream, (err) => encodeError(this.asRunnerError(err, app, runId)));
        finished = true;
      } else {
        msg.respond(await encodeReply(transfer, runId, res));
      }
    } catch (err) {
      msg.respond(encodeErrorReply(this.asRunnerError(err, app, runId)));
    } finally {
      // Whatever the gateway still sends is not needed: the run has its answer.
      finished = true;
      (stream as ByteStream | undefined)?.detach();
      ended();
    }
  }

  private async open(app: AppRef, msg: Msg): Promise<void> {
    const { nc, runner, transfer, logger } = this.deps;
    let req: UpgradeRequest;
    let id: string;
    try {
      const { req: r, meta } = await decodeRequestFrame(transfer, msg.data);
      if (meta.stream === undefined) throw new Error("a handshake without a stream");
      [req, id] = [{ runId: r.runId, path: r.path, query: r.query, headers: r.headers }, meta.stream];
    } catch {
      return void msg.respond(encodeErrorReply(new StartFailed("a WebSocket handshake that cannot be read")));
    }
    let answer: UpgradeAnswer;
    try {
      answer = await runner.upgrade(app.projectId, app.appName, req);
    } catch (err) {
      if (!(err instanceof RunnerError))
        logger.error({ err, runId: req.runId }, "a WebSocket handshake failed inside the runner");
      const e = err instanceof RunnerError ? err : new StartFailed("the runner could not open the connection");
      return void msg.respond(encodeErrorReply(e));
    }
    const reply = { status: answer.status, headers: defined(answer.headers), replicaId: answer.replicaId };
    if (answer.kind === "answered")
      return void msg.respond(encodeUpgradeReply({ ...reply, upgraded: false, body: answer.body }));
    // Listening before the answer goes out: the gateway may send at once.
    const stream = runnerStream(nc, id, this.deps.tuning ?? {});
    const socket = answer.socket;
    socket.pipe(stream);
    stream.pipe(socket);
    stream.once("close", () => socket.destroy());
    // A connection to the app that broke (not one that ended in order) takes the stream with it.
    socket.once("close", () => stream.writableEnded || stream.destroy());
    msg.respond(encodeUpgradeReply({ ...reply, upgraded: true, body: answer.head }));
  }
}

function defined(h: Record<string, string | string[] | undefined>): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  for (const [name, value] of Object.entries(h)) if (value !== undefined) out[name] = value;
  return out;
}
