// The supervisor of SKIFF_WORKERS > 1: a process that serves nothing itself.
// It starts the data folder's nats-server (when skiff starts one), so that
// the server outlives any worker, then forks the workers with node:cluster;
// they share the one listening port, which the supervisor holds and hands
// each new connection to the next worker in turn. Every worker is a whole
// skiff process (main.ts, start.ts) running the configured roles, with its
// own folder for what must not be shared (start.ts processDir). Worker 1
// starts first (it makes the admin and dev tokens and deploys the examples),
// the others once it serves. A worker that dies is started again under the
// same number; SIGTERM or SIGINT stops every worker gracefully, then NATS.
//
// Limits hold for the machine, not per worker: the supervisor counts every
// worker's connections per address (SKIFF_MAX_CONNECTIONS_PER_ADDRESS; a
// worker serves a new connection once the supervisor has counted it, and
// reports its close, server/connections.ts), and each worker runs its share
// of a project's replicas (SKIFF_PROJECT_MAX_REPLICAS, SKIFF_PROJECT_MEMORY_MB;
// config workerQuotas), the shares summing to the settings.
import cluster, { type Worker } from "node:cluster";
import path from "node:path";
import { workerQuotas, type Config, type Logger } from "./config/index.js";
import { connectNats, STARTED_SERVER_SEED_FILE, type NatsHandle } from "./nats/index.js";
import { AddressCounts } from "./server/index.js";

/** The variable that tells a forked process its worker number (not a setting: the supervisor sets it). */
export const WORKER_NUMBER_VARIABLE = "SKIFF_WORKER_NUMBER";

/** A worker that dies within this long of its start is restarted after a pause that doubles each time. */
const QUICK_DEATH_MS = 10_000;
const FIRST_RESTART_PAUSE_MS = 500;
const MAX_RESTART_PAUSE_MS = 30_000;
/** After SIGTERM, how much longer than SKIFF_STOP_DEADLINE_MS a worker has before it is killed. */
const STOP_MARGIN_MS = 5_000;

/** The worker number a forked process was given; undefined in a process that was not forked by the supervisor. */
export function workerNumber(env: NodeJS.ProcessEnv = process.env): number | undefined {
  if (!cluster.isWorker) return undefined;
  const n = Number(env[WORKER_NUMBER_VARIABLE]);
  if (!Number.isInteger(n) || n < 1) throw new Error(`${WORKER_NUMBER_VARIABLE} is not a worker number`);
  return n;
}

/**
 * How workers reach NATS: the supervisor's server (started in the data
 * folder, admitting the nkey of its seed file; or found at the probe URL)
 * named by SKIFF_NATS_URL, so that no worker starts one of its own.
 */
function natsEnv(config: Config, nats: NatsHandle): Record<string, string | undefined> {
  if (config.natsUrl !== undefined) return {};
  if (!nats.embedded) return { SKIFF_NATS_URL: nats.url };
  return {
    SKIFF_NATS_URL: nats.url,
    SKIFF_NATS_NKEY: path.join(path.resolve(config.dataDir), "nats", STARTED_SERVER_SEED_FILE),
    SKIFF_NATS_CREDS: undefined,
    SKIFF_NATS_USER: undefined,
    SKIFF_NATS_PASSWORD: undefined,
    SKIFF_NATS_TOKEN: undefined,
  };
}

interface Slot {
  n: number;
  worker: Worker | undefined;
  startedAt: number;
  pause: number;
}

/** Runs the supervisor until a stop; the process exits at its end (0: every worker stopped cleanly). */
export async function superviseWorkers(config: Config, logger: Logger): Promise<void> {
  let stopping = false;
  let stopRequested: string | undefined;
  let requestStop: (signal: string) => void = (signal) => void (stopRequested ??= signal);
  process.on("SIGTERM", () => requestStop("SIGTERM"));
  process.on("SIGINT", () => requestStop("SIGINT"));

  let nats: NatsHandle;
  try {
    nats = await connectNats({
      url: config.natsUrl,
      credentials: config,
      dataDir: config.dataDir,
      logger,
      name: "skiff supervisor",
    });
  } catch (err) {
    logger.fatal({ err }, err instanceof Error ? err.message : String(err));
    process.exit(1);
  }
  if (stopRequested !== undefined) {
    await nats.close();
    process.exit(0);
  }
  const env = natsEnv(config, nats);
  const slots: Slot[] = Array.from({ length: config.workers }, (_, i) => ({
    n: i + 1,
    worker: undefined,
    startedAt: 0,
    pause: FIRST_RESTART_PAUSE_MS,
  }));
  const exitCodes = new Map<number, number | null>();
  const addresses = new AddressCounts<Worker>(config.maxConnectionsPerAddress);
  const shares = slots.map((s) => workerQuotas(config, s.n));
  const listed = (key: "projectMaxReplicas" | "projectMemoryMb") => shares.map((q) => q[key]).join(" + ");
  logger.info(
    {
      maxConnectionsPerAddress: config.maxConnectionsPerAddress,
      projectMaxReplicas: shares.map((q) => q.projectMaxReplicas),
      projectMemoryMb: shares.map((q) => q.projectMemoryMb),
    },
    `limits of the machine: SKIFF_MAX_CONNECTIONS_PER_ADDRESS=${config.maxConnectionsPerAddress} over all workers; ` +
      `each worker runs its share of a project's replicas, workers 1 to ${config.workers}: ` +
      `SKIFF_PROJECT_MAX_REPLICAS=${config.projectMaxReplicas} as ${listed("projectMaxReplicas")}, ` +
      `SKIFF_PROJECT_MEMORY_MB=${config.projectMemoryMb} as ${listed("projectMemoryMb")}`,
  );

  const fork = (slot: Slot): Worker => {
    const worker = cluster.fork({ ...process.env, ...env, [WORKER_NUMBER_VARIABLE]: String(slot.n) });
    slot.worker = worker;
    slot.startedAt = Date.now();
    logger.info({ worker: slot.n, workerPid: worker.process.pid }, `started worker ${slot.n}`);
    // A new connection's word from the supervisor; a worker that ended cannot hear it (its connection ended with it).
    worker.on("message", (message: unknown) => {
      const verdict = addresses.report(worker, message);
      if (verdict) worker.send(verdict, undefined, {}, () => undefined);
    });
    worker.once("exit", (code, signal) => {
      addresses.forget(worker);
      if (slot.worker === worker) slot.worker = undefined;
      if (stopping) {
        exitCodes.set(slot.n, code);
        return;
      }
      const quick = Date.now() - slot.startedAt < QUICK_DEATH_MS;
      const pause = quick ? slot.pause : FIRST_RESTART_PAUSE_MS;
      slot.pause = quick ? Math.min(slot.pause * 2, MAX_RESTART_PAUSE_MS) : FIRST_RESTART_PAUSE_MS;
      logger.error(
        { worker: slot.n, workerPid: worker.process.pid, code, signal, restartInMs: pause },
        `worker ${slot.n} ended (${signal ?? `exit code ${code}`}); starting it again`,
      );
      setTimeout(() => {
        if (!stopping && slot.worker === undefined) fork(slot);
      }, pause).unref();
    });
    return worker;
  };

  /** Resolves once the slot's worker serves the port; rejects when it ends first. */
  const serving = (worker: Worker) =>
    new Promise<void>((resolve, reject) => {
      worker.once("listening", () => resolve());
      worker.once("exit", (code, signal) => reject(new Error(`worker ended (${signal ?? `exit code ${code}`})`)));
    });

  const stop = async (signal: string, startFailed = false) => {
    if (stopping) return;
    stopping = true;
    logger.info({ signal, workers: config.workers }, "stopping: every worker finishes its in-flight requests");
    const live = slots.flatMap((s) => (s.worker ? [s.worker] : []));
    const ends = live.map((w) => new Promise<void>((resolve) => (w.isDead() ? resolve() : w.once("exit", resolve))));
    // SIGTERM itself, not worker.kill(), which would cut the IPC channel first: each worker stops as a lone skiff does.
    for (const w of live) w.process.kill("SIGTERM");
    const deadline = setTimeout(() => {
      for (const w of live)
        if (!w.isDead()) {
          logger.error({ workerPid: w.process.pid }, "a worker did not stop in time: killing it");
          w.process.kill("SIGKILL");
        }
    }, config.stopDeadlineMs + STOP_MARGIN_MS);
    await Promise.all(ends);
    clearTimeout(deadline);
    await nats.close().catch((err: unknown) => logger.error({ err }, "closing NATS"));
    const failed = [...exitCodes].filter(([, code]) => code !== 0);
    if (failed.length > 0) logger.error({ workers: failed.map(([n]) => n) }, "some workers did not stop cleanly");
    else logger.info("stopped");
    process.exit(failed.length > 0 || startFailed ? 1 : 0);
  };

  // Worker 1 first: it makes the tokens, which the others then read. One that cannot start is
  // what a lone skiff would stop at; a later worker that ends is started again, as at any time.
  try {
    await serving(fork(slots[0]));
  } catch (err) {
    if (stopRequested === undefined) {
      logger.fatal({ err }, `worker 1 could not start: ${(err as Error).message}; see its log above`);
      return stop("start failure", true);
    }
  }
  requestStop = (signal) => void stop(signal);
  if (stopRequested !== undefined) return stop(stopRequested);
  // As a lone skiff does (main.ts): the workers cannot go on without the nats-server the supervisor started.
  void nats.serverExited?.then(() => {
    if (stopping) return;
    logger.fatal(
      { serverPid: nats.serverPid },
      `the nats-server the supervisor started (pid ${nats.serverPid}) ended on its own; stopping every worker: start skiff again`,
    );
    void stop("nats-server ended", true);
  });
  for (const slot of slots.slice(1)) fork(slot);
  // The workers' IPC channels hold the supervisor open from here.
  logger.info({ workers: config.workers, nats: nats.url }, `${config.workers} workers started`);
}
