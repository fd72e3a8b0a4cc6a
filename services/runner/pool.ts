// The replicas of one deployment version and the requests waiting for them.
//
// A request takes a slot on a ready, routable replica with fewer than
// replica_concurrency requests; when none is free it waits in a bounded
// FIFO queue (Overloaded when the queue is full or the wait passes
// queueWaitMs) while the pool starts replicas, up to max_replicas (one for
// a fixed port), to absorb it, within its project's share of this runner
// (projectRefusal: SKIFF_PROJECT_MAX_REPLICAS, SKIFF_PROJECT_MEMORY_MB),
// which requests wait for as they wait at max_replicas. A replica idle for
// cooldown stops, down to min_replicas. A run past response_grace_period
// fails with RunTimeout and its replica is stopped and replaced. A replica
// that exits unasked is a crash: its requests fail with ReplicaCrashed and
// the next start waits a backoff that grows with consecutive crashes.
// Health (and ready) checks run every healthIntervalMs. An answer larger
// than the run takes (a Cortex function's past SKIFF_MAX_RESULT_BYTES, an
// async run's past its limit) is cut, and the run gets a result_too_large
// error in its place.
import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import type http from "node:http";
import type { NetnsConnector } from "./netns-connect.js";
import path from "node:path";
import { finished } from "node:stream";
import type { Logger } from "../config/index.js";
import {
  AppNotFound,
  Cancelled,
  FunctionNotFound,
  Overloaded,
  ReplicaCrashed,
  RequestBodyFailed,
  RunTimeout,
  StartFailed,
  STREAM_BODIES_ABOVE,
  type AnswerLimit,
  type AnswerStream,
  type StreamEnd,
  type InvokeRequest,
  type InvokeResponse,
} from "../runs/index.js";
import { NODE_SHIM, PYTHON_SHIM, SYSTEM_PYTHON } from "./prepare.js";
import { freePort, type PortLeases } from "./ports.js";
import { AnswerTooLarge, Replica, type ReplicaSpec } from "./replica.js";
import { REPLICA_PATH } from "./replica-env.js";
import { APP_MOUNT, CHANNEL_FD, SHIM_MOUNT, type SandboxOptions } from "./sandbox.js";
import { cortexEnvelope, cortexHeaders, forwardHeaders, tooLargeAnswer } from "./responses.js";
import { callerHeaders } from "../server/index.js";
import type { AppDeployment, AppLogLine, PreparedDeployment, ReplicaChange } from "./types.js";
import { sendUpgrade, UpgradeTimeout, type UpgradeAnswer, type UpgradeRequest } from "./upgrade.js";

/** How long an app may take to answer a WebSocket handshake (bounded by response_grace_period too). */
const UPGRADE_ANSWER_MS = 30_000;

export interface PoolOptions {
  workDir: string;
  agent: http.Agent;
  logger: Logger;
  ports: PortLeases;
  onLog?: (line: AppLogLine) => void;
  /** SKIFF_REPLICA_LOG_LINES_PER_SECOND: lines each replica may log per second; undefined: no limit. */
  logLinesPerSecond?: number;
  /** Lines a replica of the app logged past that rate and were dropped. */
  onLogsDropped?: (projectId: string, appName: string, lines: number) => void;
  /** SKIFF_MAX_RESULT_BYTES: the largest answer of a Cortex function read whole. */
  maxResultBytes: number;
  onReplicaChange?: (change: ReplicaChange) => void;
  queueLimit: number;
  queueWaitMs: number;
  startTimeoutMs: number;
  /** SIGTERM→SIGKILL grace for a replica stopped as broken (timeout, failed healthcheck). */
  killGraceMs: number;
  healthIntervalMs: number;
  unhealthyAfter: number;
  sandbox: SandboxOptions;
  /** Connections made inside sandboxes, for Custom apps' requests to skip their relay. */
  netns?: NetnsConnector;
  /** Why the pool's project may not start one more replica on this runner (its quota); undefined: it may. */
  projectRefusal?: (pool: AppPool) => string | undefined;
}

/** The python3 of the replica PATH, if any: it runs the relay of sandboxed Custom apps. */
export const RELAY_PYTHON = REPLICA_PATH.split(":")
  .map((dir) => path.join(dir, "python3"))
  .find((p) => existsSync(p));

/** The port a sandboxed Custom app listens on inside its own network namespace, unless it names one. */
export const SANDBOX_APP_PORT = 8080;

interface Waiter {
  pool: AppPool;
  resolve: (slot: Slot) => void;
  reject: (err: Error) => void;
  timer: NodeJS.Timeout;
  signal: AbortSignal | undefined;
  onAbort: () => void;
}

interface Slot {
  pool: AppPool;
  replica: Replica;
}

const MAX_BACKOFF_MS = 30_000;
/** How long a broken run waits for its sandboxed replica's exit, whose reason (a limit) is the clearer error. */
const LIMIT_REASON_WAIT_MS = 2_000;
/** How long a health probe that got no answer waits to see whether the replica's process is ending on its own. */
const EXIT_WAIT_MS = 250;
const RETRY_AFTER_SECONDS = 1;

function backoffMs(crashes: number): number {
  return crashes === 0 ? 0 : Math.min(MAX_BACKOFF_MS, 100 * 2 ** (crashes - 1));
}

function detach(w: Waiter): void {
  clearTimeout(w.timer);
  w.signal?.removeEventListener("abort", w.onAbort);
}

export class AppPool {
  readonly replicas: Replica[] = [];
  private readonly queue: Waiter[] = [];
  private readonly functions: ReadonlySet<string> | undefined;
  private readonly concurrency: number;
  private readonly cap: number;
  private readonly graceMs: number;
  private readonly owner: string;
  private crashes = 0;
  private closed = false;
  /** Why the last scale() could not start the replicas its requests wanted: the project's quota. */
  private blocked: string | undefined;
  private readonly timers: NodeJS.Timeout[];

  constructor(
    readonly deployment: AppDeployment,
    private readonly prepared: PreparedDeployment,
    private readonly o: PoolOptions,
    /** The uid (and gid) of the project's sandboxes (uids.ts); undefined when the sandbox is off. */
    private readonly sandboxUid: number | undefined,
  ) {
    if (o.sandbox.enabled && sandboxUid === undefined)
      throw new Error(`a sandboxed pool of ${deployment.projectId}/${deployment.appName} needs its project's uid`);
    const { scaling, runtime } = deployment.config;
    this.functions = runtime.kind === "cortex" ? new Set(prepared.functions ?? []) : undefined;
    this.concurrency = scaling.replicaConcurrency;
    this.cap = runtime.kind === "custom" && runtime.port !== undefined ? 1 : scaling.maxReplicas;
    this.graceMs = scaling.responseGracePeriod * 1000;
    this.owner = `${deployment.projectId}/${deployment.appName}`;
    const sweepMs = Math.min(5000, Math.max(50, (scaling.cooldown * 1000) / 4));
    this.timers = [setInterval(() => this.sweep(), sweepMs), setInterval(() => this.checkHealth(), o.healthIntervalMs)];
    for (const t of this.timers) t.unref();
  }

  /** Replicas starting or ready: those that count against max_replicas. */
  liveCount(): number {
    let n = 0;
    for (const r of this.replicas) if (r.state === "starting" || r.state === "ready") n++;
    return n;
  }

  /** Replicas whose process may be alive (starting, ready or draining): those the project's quota counts. */
  aliveCount(): number {
    let n = 0;
    for (const r of this.replicas) if (r.state !== "stopped") n++;
    return n;
  }

  async invoke(req: InvokeRequest): Promise<InvokeResponse> {
    let fn: string | undefined;
    if (this.functions) {
      fn = req.path.startsWith("/") ? req.path.slice(1) : req.path;
      if (!this.functions.has(fn)) throw new FunctionNotFound(this.deployment.appName, fn);
    }
    if (req.signal?.aborted) throw new Cancelled({ cause: req.signal.reason });
    const replica = this.take();
    if (replica) return this.exchange(replica, req, fn);
    const slot = await this.wait(req.signal);
    return slot.pool.exchange(slot.replica, req, fn);
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
    const replica = this.take();
    const slot: Slot = replica ? { pool: this, replica } : await this.wait(req.signal);
    return slot.pool.connect(slot.replica, req);
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
      this.crashes = 0;
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
      if (!(err instanceof UpgradeTimeout)) this.quarantine(r);
      throw new ReplicaCrashed(`replica ${r.id} of app ${this.owner}: ${(err as Error).message}`, { cause: err });
    }
  }

  /** A free slot on a ready replica, taken; the hot path. */
  private take(): Replica | undefined {
    for (const r of this.replicas) {
      if (r.state === "ready" && r.routable && r.inFlight < this.concurrency) {
        r.inFlight++;
        return r;
      }
    }
    return undefined;
  }

  private wait(signal: AbortSignal | undefined): Promise<Slot> {
    if (this.queue.length >= this.o.queueLimit) {
      throw new Overloaded(
        `app ${this.owner} has ${this.queue.length} requests waiting, the most it queues`,
        RETRY_AFTER_SECONDS,
      );
    }
    return new Promise<Slot>((resolve, reject) => {
      const w: Waiter = {
        pool: this,
        resolve,
        reject,
        signal,
        timer: setTimeout(() => {
          w.pool.unqueue(w);
          const blocked = w.pool.blocked;
          reject(
            new Overloaded(
              `no replica of app ${w.pool.owner} was free within ${this.o.queueWaitMs} ms` +
                (blocked ? ` and no other could start: ${blocked}` : ""),
              RETRY_AFTER_SECONDS,
            ),
          );
        }, this.o.queueWaitMs),
        onAbort: () => {
          w.pool.unqueue(w);
          reject(new Cancelled({ cause: signal?.reason }));
        },
      };
      signal?.addEventListener("abort", w.onAbort, { once: true });
      this.queue.push(w);
      this.scale();
    });
  }

  private unqueue(w: Waiter): void {
    const i = this.queue.indexOf(w);
    if (i !== -1) this.queue.splice(i, 1);
    detach(w);
  }

  /** Gives free slots of `r` to waiting requests, first come first served. */
  private dispatch(r: Replica): void {
    while (r.state === "ready" && r.routable && r.inFlight < this.concurrency && this.queue.length > 0) {
      const w = this.queue[0];
      this.unqueue(w);
      r.inFlight++;
      w.resolve({ pool: this, replica: r });
    }
  }

  private release(r: Replica): void {
    r.inFlight--;
    if (r.inFlight === 0) r.idleSince = Date.now();
    if (r.state === "ready") this.dispatch(r);
    else setImmediate(() => r.dropIdleSockets()); // once the agent has taken the socket back
  }

  /**
   * One request on one replica, bounded by response_grace_period and the
   * caller's signal. A streamed answer (see Replica.send) comes back at its
   * head; its run keeps the slot, the timer and the signal until its body
   * has been read to the end or has failed (see answerStream).
   */
  private async exchange(r: Replica, req: InvokeRequest, fn: string | undefined): Promise<InvokeResponse> {
    let request: http.ClientRequest | undefined;
    let failure: Error | undefined;
    const timer = setTimeout(() => {
      failure = new RunTimeout(this.deployment.config.scaling.responseGracePeriod);
      request?.destroy(failure);
      this.o.logger.warn(
        { app: this.owner, replica: r.id, runId: req.runId },
        "run passed response_grace_period; replacing its replica",
      );
      this.replace(
        r,
        new ReplicaCrashed(`replica ${r.id} was stopped: run ${req.runId} on it passed response_grace_period`),
      );
    }, this.graceMs);
    const onAbort = () => {
      failure = new Cancelled({ cause: req.signal?.reason });
      request?.destroy(failure);
    };
    const done = () => {
      clearTimeout(timer);
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
      this.crashes = 0;
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
      return { ...cortexEnvelope(ex, req.runId, runTimeMs), runTimeMs, replicaId: r.id };
    } catch (err) {
      if (err instanceof FunctionNotFound) throw err;
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
    this.quarantine(r);
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

  /** Starts replicas for the waiting requests and for min_replicas, within the cap. */
  scale(): void {
    if (this.closed) return;
    let live = 0;
    let starting = 0;
    for (const r of this.replicas) {
      if (r.state === "starting") starting++;
      if (r.state === "starting" || r.state === "ready") live++;
    }
    let wanted = Math.max(
      this.deployment.config.scaling.minReplicas - live,
      Math.ceil(this.queue.length / this.concurrency) - starting,
    );
    for (; wanted > 0 && live < this.cap; wanted--, live++) {
      const refusal = this.o.projectRefusal?.(this);
      this.blocked = refusal;
      if (refusal) return;
      void this.startReplica();
    }
  }

  /** Starts `n` replicas and waits until all are ready (a deploy's warm-up). */
  async warm(n: number): Promise<void> {
    const results = await Promise.all(
      Array.from({ length: Math.min(n, this.cap) }, () => {
        const refusal = this.o.projectRefusal?.(this);
        return refusal
          ? Promise.resolve(new StartFailed(`a replica of app ${this.owner} cannot start: ${refusal}`))
          : this.startReplica();
      }),
    );
    const failed = results.find((e) => e !== undefined);
    if (failed) throw failed;
  }

  /** Resolves with the start error, or undefined once the replica is ready. */
  private async startReplica(): Promise<Error | undefined> {
    const d = this.deployment;
    const replicaId = `${d.appName}-v${d.version}-${randomBytes(4).toString("hex")}`;
    const delay = backoffMs(this.crashes);
    // A placeholder in "starting" state counts against the cap during the backoff.
    const replica = await this.makeReplica(replicaId, delay).catch((err: Error) => err);
    if (replica instanceof Error) return this.startFailed(undefined, replica);
    let release: (() => void) | undefined;
    try {
      const { runtime } = d.config;
      if (runtime.kind === "custom" && runtime.port !== undefined) {
        release = await this.o.ports.acquire(runtime.port, this.owner, { sandboxed: this.o.sandbox.enabled });
        replica.releasePort = release;
      }
      await replica.start();
    } catch (err) {
      replica.kill();
      await replica.whenExited();
      release?.();
      return this.startFailed(replica, err as Error);
    }
    if (this.closed) {
      void replica.stop(this.graceMs);
      return undefined;
    }
    this.changed(replica);
    this.o.logger.info({ app: this.owner, replica: replica.id, version: d.version }, "replica ready");
    this.dispatch(replica);
    return undefined;
  }

  /** The command of a sandboxed replica: the shim on its channel, or the app behind the relay. */
  private sandboxedCommand(): [string, string[]] {
    const { runtime } = this.deployment.config;
    const fd = String(CHANNEL_FD);
    if (runtime.kind === "custom") {
      const port = String(runtime.port ?? SANDBOX_APP_PORT);
      // The Python relay starts in a fraction of Node's time; Node's where there is no python3.
      const relay = RELAY_PYTHON
        ? `${RELAY_PYTHON} -I -S ${SHIM_MOUNT}/relay.py ${fd} ${port}`
        : `${process.execPath} ${SHIM_MOUNT}/relay.mjs ${fd} ${port}`;
      const script = `${relay} &\nunset PWD\nexec "$@" ${fd}<&-`;
      return ["/bin/sh", ["-c", script, "sh", ...runtime.command]];
    }
    if (runtime.language === "python") {
      const venv =
        this.prepared.python && path.posix.join(APP_MOUNT, path.relative(this.deployment.dir, this.prepared.python));
      return [venv ?? SYSTEM_PYTHON, ["-u", `${SHIM_MOUNT}/cortex.py`, "--fd", fd, runtime.entry]];
    }
    return [process.execPath, [`${SHIM_MOUNT}/cortex.mjs`, "--fd", fd, runtime.entry]];
  }

  private async makeReplica(replicaId: string, delayMs: number): Promise<Replica> {
    const d = this.deployment;
    const { runtime } = d.config;
    const sandboxed = this.o.sandbox.enabled;
    let command: string;
    let args: string[];
    if (sandboxed) [command, args] = this.sandboxedCommand();
    else if (runtime.kind === "custom") [command, args] = [runtime.command[0], runtime.command.slice(1)];
    else if (runtime.language === "python")
      [command, args] = [this.prepared.python ?? SYSTEM_PYTHON, ["-u", PYTHON_SHIM, runtime.entry]];
    else [command, args] = [process.execPath, [NODE_SHIM, runtime.entry]];
    const fixedPort = runtime.kind === "custom" && runtime.port !== undefined ? runtime.port : undefined;
    const spec: ReplicaSpec = {
      projectId: d.projectId,
      appName: d.appName,
      version: d.version,
      replicaId,
      source: d.dir,
      workDir: path.join(this.o.workDir, d.projectId, d.appName, replicaId),
      command,
      args,
      env: d.config.env,
      port: sandboxed ? (fixedPort ?? SANDBOX_APP_PORT) : (fixedPort ?? 0),
      healthcheck: runtime.kind === "custom" ? runtime.healthcheck : "/health",
      startTimeoutMs: this.o.startTimeoutMs,
      sandbox: sandboxed
        ? { uid: this.sandboxUid!, limits: this.o.sandbox.limits, network: this.o.sandbox.network }
        : undefined,
    };
    if (sandboxed && runtime.kind === "custom")
      Object.assign(spec, { commandCheck: runtime.command[0], relayed: true });
    const replica = new Replica(spec, {
      agent: this.o.agent,
      netns: this.o.netns,
      logger: this.o.logger,
      onLog: this.o.onLog,
      logLinesPerSecond: this.o.logLinesPerSecond,
      onLogsDropped: this.o.onLogsDropped,
      onExit: (r, code, signal) => this.exited(r, code, signal),
    });
    this.replicas.push(replica);
    this.changed(replica);
    if (delayMs > 0) await new Promise((r) => setTimeout(r, delayMs));
    if (replica.spec.port === 0) replica.spec.port = await freePort();
    return replica;
  }

  private startFailed(replica: Replica | undefined, err: Error): Error {
    if (replica) this.forget(replica);
    if (this.closed) return err;
    this.crashes++;
    const error =
      err instanceof StartFailed
        ? err
        : new StartFailed(`replica of app ${this.owner} failed to start: ${err.message}`, { cause: err });
    this.o.logger.warn({ app: this.owner, err: error.message }, "replica failed to start");
    // Requests wait for a replica only while one may still come.
    if (this.liveCount() === 0) this.rejectAll(error);
    if (this.deployment.config.scaling.minReplicas > 0) this.scale();
    return error;
  }

  private rejectAll(err: Error): void {
    for (const w of this.queue.splice(0)) {
      detach(w);
      w.reject(err);
    }
  }

  private forget(r: Replica): void {
    const i = this.replicas.indexOf(r);
    if (i !== -1) this.replicas.splice(i, 1);
    r.state = "stopped";
    this.changed(r);
  }

  private exited(r: Replica, code: number | null, signal: NodeJS.Signals | null): void {
    r.releasePort?.();
    if (r.readyAt === undefined) return; // start() reports it
    this.forget(r);
    if (!r.stopping) {
      this.crashes++;
      this.o.logger.warn(
        { app: this.owner, replica: r.id, code, signal, limit: r.limitReason },
        r.limitReason
          ? `replica stopped by its sandbox: ${r.limitReason}; in-flight requests fail`
          : "replica exited on its own; in-flight requests fail",
      );
    }
    this.scale();
  }

  /**
   * A replica whose connection failed is out of routing at once: it has
   * most likely died, and its exit (counted as a crash) may come a little
   * later. One still running after a second is replaced.
   */
  private quarantine(r: Replica): void {
    if (r.state !== "ready") return;
    r.state = "draining";
    this.changed(r);
    this.scale();
    setTimeout(() => {
      if (r.alive) this.replace(r, new ReplicaCrashed(`replica ${r.id} stopped answering`));
    }, 1000).unref();
  }

  /** Stops a broken replica quickly; scale() starts another when one is needed. */
  private replace(r: Replica, reason: Error): void {
    if (r.stopping) return;
    r.stopReason = reason;
    void r.stop(this.o.killGraceMs);
    this.changed(r);
    this.scale();
  }

  private sweep(): void {
    const cooldownMs = this.deployment.config.scaling.cooldown * 1000;
    const now = Date.now();
    let live = this.liveCount();
    for (const r of this.replicas) {
      if (live <= this.deployment.config.scaling.minReplicas) break;
      if (r.state === "ready" && r.inFlight === 0 && now - r.idleSince >= cooldownMs) {
        live--;
        this.o.logger.info({ app: this.owner, replica: r.id }, "replica idle past cooldown; stopping");
        void r.stop(this.graceMs);
        this.changed(r);
      }
    }
  }

  private checkHealth(): void {
    const { runtime } = this.deployment.config;
    const healthcheck = runtime.kind === "custom" ? runtime.healthcheck : "/health";
    const readycheck = runtime.kind === "custom" ? runtime.readycheck : undefined;
    const timeoutMs = Math.max(100, Math.min(5000, this.o.healthIntervalMs));
    for (const r of this.replicas) {
      if (r.state !== "ready" || r.probing) continue;
      r.probing = true;
      void (async () => {
        const health = await r.probe(healthcheck, timeoutMs);
        if (r.state !== "ready") return;
        r.healthFailures = health === 200 ? 0 : r.healthFailures + 1;
        if (r.healthFailures >= this.o.unhealthyAfter) {
          // No answer from a process that is ending on its own (a crash): its exit says what happened, with its
          // code or signal, to the runs it breaks; a restart for a failed healthcheck would say something else.
          if (health === 0 && (await exitsWithin(r, EXIT_WAIT_MS))) return;
          this.o.logger.warn(
            { app: this.owner, replica: r.id, status: health },
            `${healthcheck} failed; restarting the replica`,
          );
          return this.replace(
            r,
            new ReplicaCrashed(`replica ${r.id} failed its healthcheck ${healthcheck} and was restarted`),
          );
        }
        if (readycheck === undefined) return;
        const ready = (await r.probe(readycheck, timeoutMs)) === 200;
        if (ready === r.routable || r.state !== "ready") return;
        r.routable = ready;
        this.o.logger.info(
          { app: this.owner, replica: r.id, routable: ready },
          ready ? "readycheck passes; replica back in routing" : "readycheck fails; replica out of routing",
        );
        this.changed(r);
        if (ready) this.dispatch(r);
        else this.scale();
      })().finally(() => (r.probing = false));
    }
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
    for (const w of this.queue.splice(0)) {
      w.pool = next;
      next.queue.push(w);
    }
    for (const r of next.replicas) next.dispatch(r);
    next.scale();
    return this.shutDown();
  }

  /** Removal: waiting requests fail, replicas stop gracefully. */
  close(reason: Error = new AppNotFound(this.deployment.projectId, this.deployment.appName)): Promise<void> {
    this.rejectAll(reason);
    return this.shutDown();
  }

  private async shutDown(): Promise<void> {
    this.closed = true;
    for (const t of this.timers) clearInterval(t);
    await Promise.all(
      [...this.replicas].map((r) => {
        const stopped = r.stop(this.graceMs);
        this.changed(r);
        return stopped;
      }),
    );
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
  res: http.IncomingMessage,
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

/** Whether the replica's process ends within `ms` (at once when it has ended). */
function exitsWithin(r: Replica, ms: number): Promise<boolean> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  return Promise.race([
    r.whenExited().then(() => true),
    new Promise<boolean>((res) => (timer = setTimeout(() => res(false), ms))),
  ]).finally(() => clearTimeout(timer));
}
