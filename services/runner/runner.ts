// The runner core: hosts deployed apps as child processes ("replicas") on
// this machine, with no knowledge of NATS, so that the runner role (NATS
// subscriptions, the async queue) and an in-process gateway both call it
// directly.
//
//   const runner = new Runner({ workDir, logger, onLog, onReplicaChange });
//   await runner.deploy({ projectId, appName, version, dir, config });
//   const res = await runner.invoke(projectId, appName, { runId, method, path, query, headers, body, signal });
//   runner.replicas(projectId, appName); await runner.remove(projectId, appName); await runner.close();
//
// deploy() runs prepareDeployment (dependencies, Cortex function list)
// unless `prepared` is given, starts max(min_replicas, replicas of the
// running version) replicas of the new version and waits until they are
// ready, then switches: new requests and queued ones go to the new version
// while the old replicas finish their requests and stop. If the new version
// fails to start, deploy() rejects and the old one keeps serving. An app
// with a fixed `port` cannot run two replicas at once: its old replica stops
// first and requests wait for the new one.
//
// invoke() answers with the app's HTTP answer: for a Cortex app the final
// envelope (200 {"run_id","result","run_time_ms"}, or 500 {"run_id",
// "error": {"type","message"}} when the function raised, 400 when the body
// is not a JSON object); for a Custom app the response as it came. It
// rejects with AppNotFound, FunctionNotFound, Overloaded, RunTimeout,
// ReplicaCrashed, Cancelled or StartFailed (see errors.ts).
//
// Replicas see only PATH=/usr/local/bin:/usr/bin:/bin, HOME (their own
// folder), LANG=C.UTF-8, the app's [env] and PORT (see replica-env.ts), and
// run in a sandbox (sandbox.ts) unless it is turned off, as their project's
// uid (uids.ts), which deploy() learns before it starts any replica.
//
// A project's replicas on this runner, of all its apps and versions
// (starting, serving or stopping), are at most projectMaxReplicas, and their
// memory limits together (replicas × the sandbox's memoryMb) at most
// projectMemoryMb: a replica past either is not started (see projectRefusal).
import {
  DEFAULT_MAX_RESULT_BYTES,
  DEFAULT_PROJECT_MAX_REPLICAS,
  DEFAULT_PROJECT_MEMORY_MB,
  DEFAULT_REPLICA_LOG_LINES_PER_SECOND,
  type Clock,
  type Logger,
} from "../config/index.js";
import { AppNotFound, Overloaded, type InvokeRequest, type InvokeResponse } from "../runs/index.js";
import { NetnsConnector, ReplicaAgent } from "./netns-connect.js";
import { AppPool, type PoolOptions } from "./pool.js";
import { PortLeases } from "./ports.js";
import { prepareDeployment } from "./prepare.js";
import { RELAY_PYTHON, type ProcessReplicaOptions } from "./replica-factory.js";
import { REPLICA_IDLE_CONNECTION_MS } from "./replica.js";
import { defaultSandbox, type SandboxOptions } from "./sandbox.js";
import type { AppDeployment, AppLogLine, ReplicaChange, ReplicaInfo } from "./types.js";
import { hashedUids, type ProjectUids } from "./uids.js";
import type { UpgradeAnswer, UpgradeRequest } from "./upgrade.js";

export const DEFAULT_QUEUE_LIMIT = 100;
export const DEFAULT_QUEUE_WAIT_MS = 30_000;
export const DEFAULT_START_TIMEOUT_MS = 60_000;
export const DEFAULT_KILL_GRACE_MS = 5_000;
export const DEFAULT_HEALTH_INTERVAL_MS = 10_000;
export const DEFAULT_UNHEALTHY_AFTER = 3;

export interface RunnerOptions {
  /** Replicas' working folders go under it, one per replica. */
  workDir: string;
  logger: Logger;
  /** Every line a replica writes to stdout or stderr. */
  onLog?: (line: AppLogLine) => void;
  /** A replica was created, got ready, left or rejoined routing, began stopping, or stopped. */
  onReplicaChange?: (change: ReplicaChange) => void;
  /** Requests one app may have waiting for a slot (default 100). */
  queueLimit?: number;
  /** How long a request waits for a slot before Overloaded (default 30 s). */
  queueWaitMs?: number;
  /** How long a replica may take to answer its healthcheck at start (default 60 s). */
  startTimeoutMs?: number;
  /** SIGTERM→SIGKILL grace for a replica stopped as broken: timed out or unhealthy (default 5 s). */
  killGraceMs?: number;
  /** Period of healthchecks and readychecks (default 10 s). */
  healthIntervalMs?: number;
  /** Failed healthchecks in a row that restart a replica (default 3). */
  unhealthyAfter?: number;
  /** The sandbox of replicas and deploy-time steps (skiff passes configureSandbox's; default: on, with default limits and a host of its own). */
  sandbox?: SandboxOptions;
  /**
   * The uids of projects' sandboxes: the runner role's UidRegistry (KV
   * `skiff-uids`). Default: hashed from project ids (hashedUids), which two
   * projects may share; for Runners without NATS (tests, benches).
   */
  uids?: ProjectUids;
  /** SKIFF_PROJECT_MAX_REPLICAS: replicas of one project on this runner (default 20). */
  projectMaxReplicas?: number;
  /** SKIFF_PROJECT_MEMORY_MB: memory limits of one project's replicas together on this runner (default 16384). */
  projectMemoryMb?: number;
  /** SKIFF_REPLICA_LOG_LINES_PER_SECOND: lines each replica may log per second (default 200). */
  logLinesPerSecond?: number;
  /** Lines a replica logged past that rate and were dropped, reported once a second while it drops some. */
  onLogsDropped?: (projectId: string, appName: string, lines: number) => void;
  /** SKIFF_MAX_RESULT_BYTES: the largest answer of a Cortex function read (default 32 MiB). */
  maxResultBytes?: number;
  /** The time of the pools' queue, scaling, cooldown, health and run timers (default the machine's). */
  clock?: Clock;
  /** Project secrets and persistent storage of replicas (replica-factory.ts). */
  projectEnv?: ProcessReplicaOptions["projectEnv"];
  projectStorage?: ProcessReplicaOptions["projectStorage"];
}

/**
 * Keep-alive connections for replicas' health and ready probes (calls go
 * through each replica's own pool, `Replica.send`). An idle one is dropped before the
 * replica's server closes it: reusing a socket at the moment the server
 * closes it fails the run with EPIPE or ECONNRESET (Node's servers, the
 * Cortex shim's included, close after 5 s and say so in `Keep-Alive:
 * timeout=5`). Node's agent heeds that hint only when it has a timeout of
 * its own, which also bounds servers that announce nothing. Requests in
 * progress are not cut by it: a socket timeout ends only idle sockets.
 */
export function replicaAgent(): ReplicaAgent {
  return new ReplicaAgent({ keepAlive: true, timeout: REPLICA_IDLE_CONNECTION_MS });
}

export class Runner {
  private readonly apps = new Map<string, Map<string, AppPool>>();
  /** Versions replaced or removed whose replicas are still stopping. */
  private readonly retiring = new Set<AppPool>();
  /** New versions starting their first replicas, not yet serving. */
  private readonly warming = new Set<AppPool>();
  /** Per app, the deploy under way, so that two deploys of one app run one after the other. */
  private readonly deploys = new Map<string, Promise<unknown>>();
  /** Told at once when an app begins or stops being served here (onAppsChange). */
  private readonly appsListeners = new Set<() => void>();
  private readonly agent = replicaAgent();
  private readonly pool: PoolOptions;
  private readonly uids: ProjectUids;
  private readonly projectMaxReplicas: number;
  private readonly projectMemoryMb: number;
  private closed = false;

  constructor(private readonly opts: RunnerOptions) {
    this.uids = opts.uids ?? hashedUids;
    this.projectMaxReplicas = opts.projectMaxReplicas ?? DEFAULT_PROJECT_MAX_REPLICAS;
    this.projectMemoryMb = opts.projectMemoryMb ?? DEFAULT_PROJECT_MEMORY_MB;
    this.pool = {
      workDir: opts.workDir,
      agent: this.agent,
      logger: opts.logger,
      ports: new PortLeases(),
      onLog: opts.onLog,
      logLinesPerSecond: opts.logLinesPerSecond ?? DEFAULT_REPLICA_LOG_LINES_PER_SECOND,
      onLogsDropped: opts.onLogsDropped,
      maxResultBytes: opts.maxResultBytes ?? DEFAULT_MAX_RESULT_BYTES,
      onReplicaChange: (change) => {
        opts.onReplicaChange?.(change);
        if (change.replica.state === "stopped") this.freed(change.projectId);
      },
      queueLimit: opts.queueLimit ?? DEFAULT_QUEUE_LIMIT,
      queueWaitMs: opts.queueWaitMs ?? DEFAULT_QUEUE_WAIT_MS,
      startTimeoutMs: opts.startTimeoutMs ?? DEFAULT_START_TIMEOUT_MS,
      killGraceMs: opts.killGraceMs ?? DEFAULT_KILL_GRACE_MS,
      healthIntervalMs: opts.healthIntervalMs ?? DEFAULT_HEALTH_INTERVAL_MS,
      unhealthyAfter: opts.unhealthyAfter ?? DEFAULT_UNHEALTHY_AFTER,
      sandbox: opts.sandbox ?? defaultSandbox(),
      projectRefusal: (pool) => this.projectRefusal(pool),
      clock: opts.clock,
      projectEnv: opts.projectEnv,
      projectStorage: opts.projectStorage,
    };
    // Sandboxed Custom apps' requests skip their relay where this process can open connections in their sandbox.
    if (this.pool.sandbox.enabled && this.pool.sandbox.direct !== false && RELAY_PYTHON)
      this.pool.netns = new NetnsConnector(RELAY_PYTHON, opts.logger);
  }

  private current(projectId: string, appName: string): AppPool | undefined {
    return this.apps.get(projectId)?.get(appName);
  }

  private setCurrent(projectId: string, appName: string, pool: AppPool | undefined): void {
    let project = this.apps.get(projectId);
    if (pool) {
      if (!project) this.apps.set(projectId, (project = new Map()));
      project.set(appName, pool);
    } else {
      project?.delete(appName);
      if (project?.size === 0) this.apps.delete(projectId);
    }
    this.appsChanged();
  }

  /**
   * Calls `listener` (synchronously) whenever what version() answers changes:
   * a version deployed, an app removed, the runner closed. Returns a function
   * that stops it. The runner role takes an app's requests from the moment
   * it is served here, not at a later look.
   */
  onAppsChange(listener: () => void): () => void {
    this.appsListeners.add(listener);
    return () => this.appsListeners.delete(listener);
  }

  private appsChanged(): void {
    for (const listener of this.appsListeners) {
      try {
        listener();
      } catch (err) {
        this.opts.logger.error({ err }, "a listener of the runner's apps failed");
      }
    }
  }

  /**
   * Why one more replica of `pool` would pass its project's quota on this
   * runner; undefined when it fits. Every replica of the project's pools
   * counts, but a version warming up does not count the version it replaces
   * (whose replicas stop once it serves).
   */
  private projectRefusal(pool: AppPool): string | undefined {
    const { projectId, appName } = pool.deployment;
    const alive = this.projectAlive(projectId, this.warming.has(pool) ? this.current(projectId, appName) : undefined);
    if (alive >= this.projectMaxReplicas)
      return `project ${projectId} has ${alive} replicas on this runner, the most it may have (SKIFF_PROJECT_MAX_REPLICAS)`;
    const replicaMb = this.pool.sandbox.limits.memoryMb;
    if ((alive + 1) * replicaMb > this.projectMemoryMb)
      return `project ${projectId} has ${alive} replicas of ${replicaMb} MiB (SKIFF_REPLICA_MEMORY_MB) on this runner; one more would pass its ${this.projectMemoryMb} MiB (SKIFF_PROJECT_MEMORY_MB)`;
    return undefined;
  }

  /** Replicas the project may still start on this runner, not counting those of `replaced` (see projectRefusal). */
  private projectRoom(projectId: string, replaced: AppPool | undefined): number {
    const byMemory = Math.floor(this.projectMemoryMb / this.pool.sandbox.limits.memoryMb);
    return Math.max(0, Math.min(this.projectMaxReplicas, byMemory) - this.projectAlive(projectId, replaced));
  }

  /** The project's replicas whose process may be alive on this runner, but those of `except`. */
  private projectAlive(projectId: string, except: AppPool | undefined): number {
    let alive = 0;
    for (const p of this.projectPools(projectId)) if (p !== except) alive += p.aliveCount();
    return alive;
  }

  /** Every pool of the project on this runner: serving, warming up or retiring. */
  private *projectPools(projectId: string): Iterable<AppPool> {
    const current = this.apps.get(projectId);
    if (current) yield* current.values();
    for (const set of [this.warming, this.retiring])
      for (const p of set) if (p.deployment.projectId === projectId) yield p;
  }

  /** A replica of the project stopped: its apps whose requests wait for a replica the quota held back may start one. */
  private freed(projectId: string): void {
    setImmediate(() => {
      for (const pool of this.apps.get(projectId)?.values() ?? []) pool.scale();
    });
  }

  /** Lets an old version finish in the background; close() waits for it. */
  private retire(old: AppPool, stopped: Promise<void>): void {
    this.retiring.add(old);
    void stopped.finally(() => this.retiring.delete(old));
  }

  /** Deploys a version (see the header). Rejects with PrepareFailed or StartFailed, leaving the running version as it was. */
  deploy(d: AppDeployment): Promise<void> {
    const key = `${d.projectId}/${d.appName}`;
    const previous = this.deploys.get(key) ?? Promise.resolve();
    const next = previous.catch(() => undefined).then(() => this.swap(d));
    this.deploys.set(key, next);
    void next
      .finally(() => {
        if (this.deploys.get(key) === next) this.deploys.delete(key);
      })
      .catch(() => undefined);
    return next;
  }

  private async swap(d: AppDeployment): Promise<void> {
    if (this.closed) throw new Overloaded("the runner is shutting down", 1);
    // Known before any replica starts; a failure (NATS unreachable, no uid left) fails the deploy.
    const uid = this.pool.sandbox.enabled ? await this.uids.projectUid(d.projectId) : undefined;
    const prepared =
      d.prepared ??
      (await prepareDeployment(d.dir, d.config, this.opts.logger, {
        sandbox: this.pool.sandbox,
        secrets: this.opts.projectEnv?.(d.projectId),
      }));
    const old = this.current(d.projectId, d.appName);
    const pool = new AppPool(d, prepared, this.pool, uid);
    const fixedPort = d.config.runtime.kind === "custom" && d.config.runtime.port !== undefined;
    if (!fixedPort) {
      this.warming.add(pool);
      try {
        // As many as the old version serves with, as far as the project's quota goes; min_replicas in any case.
        const room = this.projectRoom(d.projectId, old);
        await pool.warm(Math.max(d.config.scaling.minReplicas, Math.min(old?.liveCount() ?? 0, room)));
      } catch (err) {
        await pool.close();
        throw err;
      } finally {
        this.warming.delete(pool);
      }
    }
    if (this.closed) {
      await pool.close(new Overloaded("the runner is shutting down", 1));
      throw new Overloaded("the runner is shutting down", 1);
    }
    this.setCurrent(d.projectId, d.appName, pool);
    if (old) this.retire(old, old.handOver(pool));
    else pool.scale();
    this.opts.logger.info({ app: `${d.projectId}/${d.appName}`, version: d.version }, "app deployed");
  }

  /** Stops the app's replicas gracefully and forgets it; waiting requests fail with AppNotFound. */
  async remove(projectId: string, appName: string): Promise<void> {
    const pool = this.current(projectId, appName);
    if (!pool) return;
    this.setCurrent(projectId, appName, undefined);
    const stopped = pool.close();
    this.retire(pool, stopped);
    await stopped;
  }

  invoke(projectId: string, appName: string, req: InvokeRequest): Promise<InvokeResponse> {
    const pool = this.current(projectId, appName);
    if (!pool) return Promise.reject(new AppNotFound(projectId, appName));
    return pool.invoke(req);
  }

  /** A WebSocket to a Custom app (see upgrade.ts): holds a replica slot while the connection lasts. */
  upgrade(projectId: string, appName: string, req: UpgradeRequest): Promise<UpgradeAnswer> {
    const pool = this.current(projectId, appName);
    if (!pool) return Promise.reject(new AppNotFound(projectId, appName));
    return pool.upgrade(req);
  }

  /** The deployed version of an app, or undefined. */
  version(projectId: string, appName: string): number | undefined {
    return this.current(projectId, appName)?.deployment.version;
  }

  /** Replicas of the app: the current version's and those of older versions still stopping. */
  replicas(projectId: string, appName: string): ReplicaInfo[] {
    const pools = [...this.retiring].filter(
      (p) => p.deployment.projectId === projectId && p.deployment.appName === appName,
    );
    const current = this.current(projectId, appName);
    if (current) pools.push(current);
    return pools.flatMap((p) => p.replicas.map((r) => r.info()));
  }

  /** Stops every replica (gracefully, as remove() does) and waits for them. */
  async close(): Promise<void> {
    this.closed = true;
    await Promise.allSettled([...this.deploys.values()]);
    const pools = [...this.apps.values()].flatMap((project) => [...project.values()]);
    this.apps.clear();
    this.appsChanged();
    const stopping = pools.map((p) => p.close(new Overloaded("the runner is shutting down", 1)));
    const retiring = [...this.retiring].map((p) => p.close(new Overloaded("the runner is shutting down", 1)));
    await Promise.all([...stopping, ...retiring]);
    this.agent.destroy();
    this.pool.netns?.stop();
  }
}
