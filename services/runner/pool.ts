// The replicas of one deployment version and the requests run on them.
//
// Two parts, with a narrow interface between them: the slot queue
// (slot-queue.ts: replica_concurrency, the bounded queue of waiting
// requests, its wait and cancel) and the replicas' lifecycle
// (replica-set.ts: starting for waiting requests and min_replicas up to
// max_replicas within the project's quota, health, cooldown, crashes,
// stopping), whose replicas are processes made by replica-factory.ts. The
// pool runs each request on its slot: a run past response_grace_period fails
// with RunTimeout and its replica is stopped and replaced; a replica that
// exits unasked fails its requests with ReplicaCrashed. An answer larger than
// the run takes (a Cortex function's past SKIFF_MAX_RESULT_BYTES, an async
// run's past its limit) is cut, and the run gets a result_too_large error in
// its place.
import { finished } from "node:stream";
import { realClock, type Clock, type Logger } from "../config/index.js";
import {
  AppNotFound,
  Cancelled,
  FunctionNotFound,
  InvalidArguments,
  ReplicaCrashed,
  RequestBodyFailed,
  RunTimeout,
  STREAM_BODIES_ABOVE,
  type AnswerLimit,
  type AnswerStream,
  type StreamEnd,
  type InvokeRequest,
  type InvokeResponse,
} from "../runs/index.js";
import { callerHeaders } from "../server/index.js";
import { AnswerTooLarge, type AnswerBody, type Replica, type ReplicaRequest } from "./replica.js";
import { ProcessReplicas, type ProcessReplicaOptions } from "./replica-factory.js";
import { exitsWithin, ReplicaSet } from "./replica-set.js";
import {
  badStatusAnswer,
  cortexEnvelope,
  cortexHeaders,
  forwardHeaders,
  invalidArguments,
  tooLargeAnswer,
} from "./responses.js";
import { SlotQueue, type Slot } from "./slot-queue.js";
import type { AppDeployment, PreparedDeployment, ReplicaChange } from "./types.js";
import { sendUpgrade, UpgradeTimeout, type UpgradeAnswer, type UpgradeRequest } from "./upgrade.js";

/** How long an app may take to answer a WebSocket handshake (bounded by response_grace_period too). */
const UPGRADE_ANSWER_MS = 30_000;
/** How long a broken run waits for its sandboxed replica's exit, whose reason (a limit) is the clearer error. */
const LIMIT_REASON_WAIT_MS = 2_000;

/** An app's pool: how its replicas are made (ProcessReplicaOptions), queued for and kept. */
export interface PoolOptions extends ProcessReplicaOptions {
  /** SKIFF_MAX_RESULT_BYTES: the largest answer of a Cortex function read whole. */
  maxResultBytes: number;
  onReplicaChange?: (change: ReplicaChange) => void;
  queueLimit: number;
  queueWaitMs: number;
  /** SIGTERM→SIGKILL grace for a replica stopped as broken (timeout, failed healthcheck). */
  killGraceMs: number;
  healthIntervalMs: number;
  unhealthyAfter: number;
  /** Why the pool's project may not start one more replica on this runner (its quota); undefined: it may. */
  projectRefusal?: (pool: AppPool) => string | undefined;
  /** The time of the queue's, the lifecycle's and the runs' timers (default the machine's). */
  clock?: Clock;
}

export class AppPool {
  private readonly queue: SlotQueue<Replica, AppPool>;
  private readonly set: ReplicaSet<Replica>;
  private readonly functions: ReadonlySet<string> | undefined;
  private readonly graceMs: number;
  private readonly owner: string;
  private readonly clock: Clock;

  constructor(
    readonly deployment: AppDeployment,
    prepared: PreparedDeployment,
    private readonly o: PoolOptions,
    /** The uid (and gid) of the project's sandboxes (uids.ts); undefined when the sandbox is off. */
    sandboxUid: number | undefined,
  ) {
    const { scaling, runtime } = deployment.config;
    const factory = new ProcessReplicas(deployment, prepared, o, sandboxUid);
    this.functions = runtime.kind === "cortex" ? new Set(prepared.functions ?? []) : undefined;
    this.graceMs = scaling.responseGracePeriod * 1000;
    this.owner = `${deployment.projectId}/${deployment.appName}`;
    this.clock = o.clock ?? realClock;
    const concurrency = scaling.replicaConcurrency;
    this.queue = new SlotQueue<Replica, AppPool>(
      this,
      { owner: this.owner, concurrency, limit: o.queueLimit, waitMs: o.queueWaitMs, clock: this.clock },
      {
        replicas: () => this.set.replicas,
        wanted: () => this.set.scale(),
        blocked: () => this.set.blocked(),
        notReady: () => this.set.notReady(),
      },
    );
    this.set = new ReplicaSet<Replica>(
      {
        deployment,
        cap: runtime.kind === "custom" && runtime.port !== undefined ? 1 : scaling.maxReplicas,
        graceMs: this.graceMs,
        killGraceMs: o.killGraceMs,
        healthIntervalMs: o.healthIntervalMs,
        unhealthyAfter: o.unhealthyAfter,
        logger: o.logger,
        clock: this.clock,
        factory,
        refusal: () => o.projectRefusal?.(this),
        changed: (r) => this.changed(r),
      },
      {
        waiting: () => this.queue.length,
        concurrency,
        ready: (r) => this.queue.dispatch(r),
        noneComing: (err) => this.queue.rejectAll(err),
      },
    );
  }

  /** The replicas of this version, in every state but stopped. */
  get replicas(): readonly Replica[] {
    return this.set.replicas;
  }

  /** Replicas starting or ready: those that count against max_replicas. */
  liveCount(): number {
    return this.set.liveCount();
  }

  /** Replicas whose process may be alive (starting, ready or draining): those the project's quota counts. */
  aliveCount(): number {
    return this.set.aliveCount();
  }

  /** Starts replicas for the waiting requests and for min_replicas, within the cap. */
  scale(): void {
    this.set.scale();
  }

  /** Starts `n` replicas and waits until all are ready (a deploy's warm-up). */
  warm(n: number): Promise<void> {
    return this.set.warm(n);
  }

  async invoke(req: InvokeRequest): Promise<InvokeResponse> {
    let fn: string | undefined;
    if (this.functions) {
      fn = req.path.startsWith("/") ? req.path.slice(1) : req.path;
      if (!this.functions.has(fn)) throw new FunctionNotFound(this.deployment.appName, fn);
    }
    if (req.signal?.aborted) throw new Cancelled({ cause: req.signal.reason });
    const replica = this.queue.take();
    if (replica) return this.exchange(replica, req, fn);
    const slot = await this.queue.wait(req.signal);
    return slot.owner.exchange(slot.replica, req, fn);
  }

  /**
   * A WebSocket (see upgrade.ts) on a replica: it takes a slot as a request
   * does (waiting, and scaling, when none is free) and holds it until the
   * connection closes. The app's handshake must come within
   * UPGRADE_ANSWER_MS; the connection's life is its gateway's to bound.
   */
  async upgrade(req: UpgradeRequest): Promise<UpgradeAnswer> {
    if (this.functions) throw new FunctionNotFound(this.deployment.appName, req.path);
    if (req.signal?.aborted) throw new Cancelled({ cause: req.signal.reason });
    const replica = this.queue.take();
    const slot: Slot<Replica, AppPool> = replica ? { owner: this, replica } : await this.queue.wait(req.signal);
    return slot.owner.connect(slot.replica, req);
  }

  private async connect(r: Replica, req: UpgradeRequest): Promise<UpgradeAnswer> {
    r.startRun(req.runId);
    let held = true;
    const release = () => {
      if (!held) return;
      held = false;
      r.endRun(req.runId);
      this.release(r);
    };
    try {
      const answer = await sendUpgrade(r.address, req, Math.min(this.graceMs, UPGRADE_ANSWER_MS));
      this.set.answered();
      if (answer.kind === "answered") {
        release();
        return { ...answer, replicaId: r.id };
      }
      answer.socket.once("close", release);
      return { ...answer, replicaId: r.id, replicaExited: () => r.whenExited() };
    } catch (err) {
      release();
      if (req.signal?.aborted) throw new Cancelled({ cause: req.signal.reason });
      if (r.stopReason) throw r.stopReason;
      if (!(err instanceof UpgradeTimeout)) this.set.quarantine(r);
      throw new ReplicaCrashed(`replica ${r.id} of app ${this.owner}: ${(err as Error).message}`, { cause: err });
    }
  }

  private release(r: Replica): void {
    this.queue.release(r);
    if (r.state !== "ready") setImmediate(() => r.dropIdleSockets()); // once the request has left its connection
  }

  /**
   * One request on one replica, bounded by response_grace_period and the
   * caller's signal. A streamed answer (see Replica.send) comes back at its
   * head; its run keeps the slot, the timer and the signal until its body
   * has been read to the end or has failed (see answerStream).
   */
  private async exchange(r: Replica, req: InvokeRequest, fn: string | undefined): Promise<InvokeResponse> {
    let request: ReplicaRequest | undefined;
    let failure: Error | undefined;
    const timer = this.clock.setTimeout(() => {
      failure = new RunTimeout(this.deployment.config.scaling.responseGracePeriod);
      request?.destroy(failure);
      this.o.logger.warn(
        { app: this.owner, replica: r.id, runId: req.runId },
        "run passed response_grace_period; replacing its replica",
      );
      this.set.replace(
        r,
        new ReplicaCrashed(`replica ${r.id} was stopped: run ${req.runId} on it passed response_grace_period`),
      );
    }, this.graceMs);
    const onAbort = () => {
      failure = new Cancelled({ cause: req.signal?.reason });
      request?.destroy(failure);
    };
    const done = () => {
      this.clock.clearTimeout(timer);
      req.signal?.removeEventListener("abort", onAbort);
      r.endRun(req.runId);
      this.release(r);
    };
    req.signal?.addEventListener("abort", onAbort, { once: true });
    r.startRun(req.runId);
    const started = performance.now();
    let streaming = false;
    const limit = answerLimit(fn === undefined ? undefined : this.o.maxResultBytes, req.answerLimit);
    try {
      const ex =
        fn === undefined
          ? await r.send(
              req.method,
              req.query === "" ? req.path : `${req.path}?${req.query}`,
              forwardHeaders(req.headers, req.runId, req.bodyStream ? req.bodyStream.length : req.body.byteLength),
              req.bodyStream ?? req.body,
              (c) => (request = c),
              req.acceptStream,
              STREAM_BODIES_ABOVE,
              limit?.bytes,
            )
          : await r.send(
              "POST",
              `/${fn}`,
              cortexHeaders(req.runId, req.body.byteLength, req.acceptStream ? req.headers.accept : undefined),
              req.body,
              (c) => (request = c),
              req.acceptStream,
              Infinity,
              limit?.bytes,
            );
      const runTimeMs = Math.round(performance.now() - started);
      this.set.answered();
      if (ex.status < 100 || ex.status > 599) {
        // Not an HTTP status: no caller could be given it. The answer is not read; the replica goes on.
        ex.stream?.destroy();
        request?.destroy();
        return { ...badStatusAnswer(req.runId, ex.status, this.owner), runTimeMs, replicaId: r.id };
      }
      if (ex.stream) {
        streaming = true;
        const stream = answerStream(ex.stream, started, {
          failure: () => failure,
          cancel: () => {
            failure ??= new Cancelled();
            request?.destroy(failure);
          },
          failed: (err) => this.failed(r, failure, err),
          done,
        });
        return {
          status: ex.status,
          headers: callerHeaders(ex.headers),
          body: ex.body,
          runTimeMs,
          replicaId: r.id,
          stream,
        };
      }
      if (fn === undefined)
        return { status: ex.status, headers: callerHeaders(ex.headers), body: ex.body, runTimeMs, replicaId: r.id };
      if (ex.status === 404) throw new FunctionNotFound(this.deployment.appName, fn);
      const misfit = invalidArguments(ex);
      if (misfit !== undefined) throw new InvalidArguments(misfit);
      return { ...cortexEnvelope(ex, req.runId, runTimeMs), runTimeMs, replicaId: r.id };
    } catch (err) {
      if (err instanceof FunctionNotFound || err instanceof InvalidArguments) throw err;
      // The answer was cut, not broken: the replica goes on serving.
      if (err instanceof AnswerTooLarge && limit && !failure) {
        const what = fn === undefined ? `the answer of app ${this.owner}` : `the result of function ${fn}`;
        const message = `${what} is larger than ${limit.bytes} bytes, the most skiff takes (${limit.setting})`;
        return {
          ...tooLargeAnswer(req.runId, message),
          runTimeMs: Math.round(performance.now() - started),
          replicaId: r.id,
        };
      }
      // The caller's body broke, not the replica.
      if (err instanceof RequestBodyFailed) throw failure ?? err;
      throw await this.failed(r, failure, err);
    } finally {
      if (!streaming) done();
    }
  }

  /**
   * Why a run on `r` broke: its timeout or cancel, the replica's stop, or
   * else a crash (the replica leaves routing until its health says).
   */
  private async failed(r: Replica, failure: Error | undefined, err: unknown): Promise<Error> {
    if (failure || r.stopReason) return failure ?? r.stopReason!;
    this.set.quarantine(r);
    // A sandbox limit that ended the replica is the clearer reason: its exit follows the broken connection closely
    // (on a busy machine, its last stderr lines and its exit may take a while to be read).
    if (r.spec.sandbox && !r.limitNow()) await exitsWithin(r, LIMIT_REASON_WAIT_MS);
    const limit = r.limitNow();
    return new ReplicaCrashed(
      limit
        ? `replica ${r.id} of app ${this.owner} was stopped during the run: ${limit}`
        : `replica ${r.id} of app ${this.owner} failed during the run: ${(err as Error).message}${r.endedWith ? ` (it ended with ${r.endedWith})` : ""}`,
      { cause: err },
    );
  }

  private changed(r: Replica): void {
    this.o.onReplicaChange?.({
      projectId: this.deployment.projectId,
      appName: this.deployment.appName,
      replica: r.info(),
    });
  }

  /**
   * A newer version takes over: waiting requests move to it in order, and
   * this pool's replicas stop gracefully (SIGTERM, up to
   * response_grace_period, SIGKILL). Resolves when all have exited.
   */
  handOver(next: AppPool): Promise<void> {
    this.queue.moveTo(next.queue);
    return this.set.shutDown();
  }

  /** Removal: waiting requests fail, replicas stop gracefully. */
  close(reason: Error = new AppNotFound(this.deployment.projectId, this.deployment.appName)): Promise<void> {
    this.queue.rejectAll(reason);
    return this.set.shutDown();
  }
}

/** The failure a Cortex shim reported in the X-Skiff-Error trailer of a streamed answer. */
function trailerError(value: string | undefined): StreamEnd["error"] {
  if (value === undefined) return undefined;
  try {
    const { type, message } = JSON.parse(value) as { type?: unknown; message?: unknown };
    return { type: typeof type === "string" ? type : "Error", message: typeof message === "string" ? message : "" };
  } catch {
    return { type: "Error", message: "the app reported a failure it could not describe" };
  }
}

/**
 * A streamed answer's body as the run's AnswerStream: its chunks, read at
 * the reader's pace; the run ends (slot released, timer cleared) when the
 * body ends or breaks, and a reader that stops early cancels the run.
 */
function answerStream(
  res: AnswerBody,
  started: number,
  run: {
    failure: () => Error | undefined;
    cancel: () => void;
    failed: (err: unknown) => Promise<Error>;
    done: () => void;
  },
): AnswerStream {
  const ended = new Promise<StreamEnd>((resolve, reject) => {
    finished(res, (err) => {
      const runTimeMs = Math.round(performance.now() - started);
      run.done();
      if (!err && !run.failure()) resolve({ runTimeMs, error: trailerError(res.trailers["x-skiff-error"]) });
      else void run.failed(err).then(reject, reject);
    });
  });
  ended.catch(() => undefined); // the reader, or whoever records the run, sees it
  async function* chunks(): AsyncGenerator<Uint8Array> {
    let settled = false;
    try {
      for await (const chunk of res) yield chunk as Buffer;
      settled = true;
    } catch {
      settled = true;
      await ended; // throws the run's error
    } finally {
      if (!settled) run.cancel();
    }
  }
  return { chunks: chunks(), cancel: run.cancel, ended };
}

/** The smaller of a Cortex answer's limit (SKIFF_MAX_RESULT_BYTES) and the caller's own, if any. */
function answerLimit(cortexBytes: number | undefined, caller: AnswerLimit | undefined): AnswerLimit | undefined {
  const cortex = cortexBytes === undefined ? undefined : { bytes: cortexBytes, setting: "SKIFF_MAX_RESULT_BYTES" };
  if (!cortex || !caller) return cortex ?? caller;
  return caller.bytes < cortex.bytes ? caller : cortex;
}
