// The life of one deployment version's replicas: starting them (for waiting
// requests and for min_replicas, up to max_replicas, within the project's
// share of this runner), health and ready checks, the cooldown that stops
// idle ones down to min_replicas, crashes, and stopping.
//
// A replica that exits unasked is a crash; the next start waits a backoff
// that grows with consecutive crashes (any answered request resets it). A
// start that fails while no replica is live fails every waiting request:
// they wait only while a replica may still come. Health (and ready) checks
// run every healthIntervalMs; unhealthyAfter failed healthchecks in a row
// restart a replica, a failing readycheck takes it out of routing until it
// passes again. Every timer here runs on the set's Clock.
//
// The set knows requests only through SlotDemand (how many wait, a replica
// is ready for them, none will come), and replicas through ReplicaFactory
// and ManagedReplica, so that it can be driven by fake replicas and a fake
// clock.
import { randomBytes } from "node:crypto";
import type { Clock, ClockTimer, Logger } from "../config/index.js";
import { sleep } from "../config/index.js";
import { ReplicaCrashed, StartFailed } from "../runs/index.js";
import type { Replica } from "./replica.js";
import type { AppDeployment } from "./types.js";

const MAX_BACKOFF_MS = 30_000;
/** How long a health probe that got no answer waits to see whether the replica's process is ending on its own. */
const EXIT_WAIT_MS = 250;
/** How long a replica out of routing after a broken connection may go on running before it is replaced. */
const QUARANTINE_MS = 1000;

/** The wait before a start after `crashes` consecutive crashes. */
export function backoffMs(crashes: number): number {
  return crashes === 0 ? 0 : Math.min(MAX_BACKOFF_MS, 100 * 2 ** (crashes - 1));
}

/** What the lifecycle uses of a replica (Replica; a fake one in tests). */
export type ManagedReplica = Pick<
  Replica,
  | "id"
  | "state"
  | "routable"
  | "inFlight"
  | "idleSince"
  | "readyAt"
  | "stopping"
  | "stopReason"
  | "alive"
  | "probing"
  | "healthFailures"
  | "limitReason"
  | "releasePort"
  | "start"
  | "stop"
  | "kill"
  | "whenExited"
  | "probe"
>;

/** Makes the replicas of one version. */
export interface ReplicaFactory<R> {
  /** A new replica, not started; `onExit` is called when its process ends. */
  create(replicaId: string, onExit: (r: R, code: number | null, signal: NodeJS.Signals | null) => void): R;
  /** What it needs before it starts, after the crash backoff (a free port); no process yet. */
  prepare(r: R): Promise<void>;
  /** Starts it (port lease, process, first healthcheck); rejects when it cannot. */
  start(r: R): Promise<void>;
}

/** What the lifecycle tells, and asks of, the requests' side (slot-queue.ts). */
export interface SlotDemand<R> {
  /** Requests waiting for a slot. */
  waiting(): number;
  /** Slots per replica (replica_concurrency). */
  concurrency: number;
  /** `r` is ready or back in routing: its free slots go to waiting requests. */
  ready(r: R): void;
  /** No replica will come for now: waiting requests fail with `err`. */
  noneComing(err: Error): void;
}

export interface ReplicaSetOptions<R> {
  deployment: AppDeployment;
  /** Most replicas starting or ready at once: max_replicas, 1 for a fixed port. */
  cap: number;
  /** response_grace_period, ms: how long a replica stopped gracefully has. */
  graceMs: number;
  /** SIGTERM→SIGKILL grace for a replica stopped as broken. */
  killGraceMs: number;
  healthIntervalMs: number;
  unhealthyAfter: number;
  logger: Logger;
  clock: Clock;
  factory: ReplicaFactory<R>;
  /** Why the project may not start one more replica on this runner (its quota); undefined: it may. */
  refusal: () => string | undefined;
  /** A replica was created, got ready, left or rejoined routing, began stopping, or stopped. */
  changed: (r: R) => void;
}

export class ReplicaSet<R extends ManagedReplica> {
  readonly replicas: R[] = [];
  private readonly owner: string;
  private crashes = 0;
  private closed = false;
  /** Why the last scale() could not start the replicas its requests wanted: the project's quota. */
  private blockedBy: string | undefined;
  /** Why the last start of a replica failed, until one is ready. */
  private lastStartFailure: string | undefined;
  private readonly timers: ClockTimer[];

  constructor(
    private readonly o: ReplicaSetOptions<R>,
    private readonly demand: SlotDemand<R>,
  ) {
    const { deployment, clock } = o;
    this.owner = `${deployment.projectId}/${deployment.appName}`;
    const sweepMs = Math.min(5000, Math.max(50, (deployment.config.scaling.cooldown * 1000) / 4));
    this.timers = [
      clock.setInterval(() => this.sweep(), sweepMs),
      clock.setInterval(() => this.checkHealth(), o.healthIntervalMs),
    ];
    for (const t of this.timers) t.unref();
  }

  /** Why the last scale() could not start what was wanted, if the project's quota held it back. */
  blocked(): string | undefined {
    return this.blockedBy;
  }

  /**
   * For a request that waited in vain while no replica was ready: how many are still starting (a replica is
   * ready once its health check answers), and why the last start failed; undefined when one is ready (they
   * were busy) or none is starting and none failed.
   */
  notReady(): string | undefined {
    let starting = 0;
    for (const r of this.replicas) {
      if (r.state === "ready") return undefined;
      if (r.state === "starting") starting++;
    }
    const parts = [];
    if (starting > 0)
      parts.push(
        `none is ready, ${starting === 1 ? "1 is" : `${starting} are`} still starting (ready once its health check answers 200)`,
      );
    if (this.lastStartFailure) parts.push(`the last start failed: ${this.lastStartFailure}`);
    return parts.length > 0 ? parts.join("; ") : undefined;
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

  /** A request was answered: the replicas work, and the next start after a crash need not wait. */
  answered(): void {
    this.crashes = 0;
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
      this.o.deployment.config.scaling.minReplicas - live,
      Math.ceil(this.demand.waiting() / this.demand.concurrency) - starting,
    );
    for (; wanted > 0 && live < this.o.cap; wanted--, live++) {
      const refusal = this.o.refusal();
      this.blockedBy = refusal;
      if (refusal) return;
      void this.startReplica();
    }
  }

  /** Starts `n` replicas and waits until all are ready (a deploy's warm-up). */
  async warm(n: number): Promise<void> {
    const results = await Promise.all(
      Array.from({ length: Math.min(n, this.o.cap) }, () => {
        const refusal = this.o.refusal();
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
    const d = this.o.deployment;
    const replicaId = `${d.appName}-v${d.version}-${randomBytes(4).toString("hex")}`;
    const delay = backoffMs(this.crashes);
    // It counts against the cap in "starting" state during the backoff.
    const replica = this.o.factory.create(replicaId, (r, code, signal) => this.exited(r, code, signal));
    this.replicas.push(replica);
    this.o.changed(replica);
    try {
      if (delay > 0) await sleep(this.o.clock, delay);
      await this.o.factory.prepare(replica);
    } catch (err) {
      return this.startFailed(replica, err as Error);
    }
    try {
      await this.o.factory.start(replica);
    } catch (err) {
      replica.kill();
      await replica.whenExited();
      replica.releasePort?.();
      return this.startFailed(replica, err as Error);
    }
    replica.idleSince = this.o.clock.now();
    if (this.closed) {
      void replica.stop(this.o.graceMs);
      return undefined;
    }
    this.o.changed(replica);
    this.lastStartFailure = undefined;
    this.o.logger.info({ app: this.owner, replica: replica.id, version: d.version }, "replica ready");
    this.demand.ready(replica);
    return undefined;
  }

  private startFailed(replica: R, err: Error): Error {
    this.forget(replica);
    if (this.closed) return err;
    this.crashes++;
    const error =
      err instanceof StartFailed
        ? err
        : new StartFailed(`replica of app ${this.owner} failed to start: ${err.message}`, { cause: err });
    this.lastStartFailure = error.message;
    this.o.logger.warn({ app: this.owner, err: error.message }, "replica failed to start");
    // Requests wait for a replica only while one may still come.
    if (this.liveCount() === 0) this.demand.noneComing(error);
    if (this.o.deployment.config.scaling.minReplicas > 0) this.scale();
    return error;
  }

  private forget(r: R): void {
    const i = this.replicas.indexOf(r);
    if (i !== -1) this.replicas.splice(i, 1);
    r.state = "stopped";
    this.o.changed(r);
  }

  private exited(r: R, code: number | null, signal: NodeJS.Signals | null): void {
    r.releasePort?.();
    if (r.readyAt === undefined) return; // startReplica reports it
    this.forget(r);
    if (!r.stopping) {
      this.crashes++;
      const limit = r.limitReason;
      this.o.logger.warn(
        { app: this.owner, replica: r.id, code, signal, limit },
        limit
          ? `replica stopped by its sandbox: ${limit}; in-flight requests fail`
          : "replica exited on its own; in-flight requests fail",
      );
    }
    this.scale();
  }

  /**
   * A replica whose connection failed is out of routing at once: it has
   * most likely died, and its exit (counted as a crash) may come a little
   * later. One still running after QUARANTINE_MS is replaced.
   */
  quarantine(r: R): void {
    if (r.state !== "ready") return;
    r.state = "draining";
    this.o.changed(r);
    this.scale();
    this.o.clock
      .setTimeout(() => {
        if (r.alive) this.replace(r, new ReplicaCrashed(`replica ${r.id} stopped answering`));
      }, QUARANTINE_MS)
      .unref();
  }

  /** Stops a broken replica quickly; scale() starts another when one is needed. */
  replace(r: R, reason: Error): void {
    if (r.stopping) return;
    r.stopReason = reason;
    void r.stop(this.o.killGraceMs);
    this.o.changed(r);
    this.scale();
  }

  /** Stops the replicas idle for cooldown, down to min_replicas. */
  private sweep(): void {
    const { scaling } = this.o.deployment.config;
    const cooldownMs = scaling.cooldown * 1000;
    const now = this.o.clock.now();
    let live = this.liveCount();
    for (const r of this.replicas) {
      if (live <= scaling.minReplicas) break;
      if (r.state === "ready" && r.inFlight === 0 && now - r.idleSince >= cooldownMs) {
        live--;
        this.o.logger.info({ app: this.owner, replica: r.id }, "replica idle past cooldown; stopping");
        void r.stop(this.o.graceMs);
        this.o.changed(r);
      }
    }
  }

  private checkHealth(): void {
    const { runtime } = this.o.deployment.config;
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
        this.o.changed(r);
        if (ready) this.demand.ready(r);
        else this.scale();
      })().finally(() => (r.probing = false));
    }
  }

  /** Stops the timers and every replica gracefully (SIGTERM, up to response_grace_period, SIGKILL). */
  async shutDown(): Promise<void> {
    this.closed = true;
    for (const t of this.timers) this.o.clock.clearInterval(t);
    await Promise.all(
      [...this.replicas].map((r) => {
        const stopped = r.stop(this.o.graceMs);
        this.o.changed(r);
        return stopped;
      }),
    );
  }
}

/**
 * Whether the replica's process ends within `ms` (at once when it has
 * ended). Real time: it waits on a real process.
 */
export function exitsWithin(r: Pick<ManagedReplica, "whenExited">, ms: number): Promise<boolean> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  return Promise.race([
    r.whenExited().then(() => true),
    new Promise<boolean>((res) => (timer = setTimeout(() => res(false), ms))),
  ]).finally(() => clearTimeout(timer));
}
