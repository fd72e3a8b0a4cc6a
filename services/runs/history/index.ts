// The run history: every run, projected from its events into a SQL table
// indexed for listing, so that ListRuns, the dashboard and GetAppStats read a
// page from an index instead of any process holding the runs in memory.
// Embedded SQLite under SKIFF_DATA_DIR when SKIFF_DATABASE_URL is unset; a
// PostgreSQL server, shared by every process that names it, when it is set.
// Runs are kept 30 days, and no more than its byte budget holds (budget.ts).
import { access, readdir } from "node:fs/promises";
import path from "node:path";
import type { NatsConnection } from "nats";
import type { Logger } from "../../config/index.js";
import {
  HISTORY_STORE,
  RUN_RETENTION_MS,
  STORE_SPECS,
  derivedBudget,
  freeDiskBytes,
  mib,
  type StoreWatch,
} from "../../nats/index.js";
import { HistoryBudget } from "./budget.js";
import type { RunRecord } from "../store.js";
import type { HistoryBackend, HistoryRun, ListQuery, MinuteStats, RunPage } from "./history.js";
import { openPostgresHistory } from "./postgres.js";
import { FEED_STREAM, RunProjector, type ProjectorOptions } from "./projector.js";
import { DEFAULT_SCHEMA } from "./schema.js";
import { openSqliteHistory, SQLITE_FILE } from "./sqlite.js";

export type { ListQuery, MinuteStats, RunPage } from "./history.js";
export { timeOfId } from "./history.js";
export { FEED_STREAM, RUNS_STREAM } from "./projector.js";
export { HistoryBudget, PRUNE_TO } from "./budget.js";

/** How often runs past RUN_RETENTION_MS are deleted. */
export const PRUNE_EVERY_MS = 60 * 60 * 1000;
/** How often the history's size is checked against its budget. */
export const SIZE_CHECK_EVERY_MS = 2_000;
/** The folder under SKIFF_DATA_DIR that holds the embedded database. */
export const HISTORY_FOLDER = "history";
/** The folder under SKIFF_DATA_DIR of SKIFF_WORKERS' workers, each of which held a history of its own before. */
const WORKERS_FOLDER = "workers";
/** The folder of the embedded PostgreSQL (PGlite) that held the history before: no longer read. */
export const OLD_PGLITE_FOLDER = "run-history";

export interface RunHistory {
  /** Runs of one app, or of every app of the project when `appName` is undefined; newest first. */
  list(projectId: string, appName: string | undefined, q: ListQuery): Promise<RunPage>;
  /** Per-minute figures of one app's runs queued in [fromMs, toMs), minutes with runs only, oldest first. */
  minuteStats(projectId: string, appName: string, fromMs: number, toMs: number): Promise<MinuteStats[]>;
  /** One run of one app, as the history holds it; undefined when it holds none. */
  get(projectId: string, appName: string, runId: string): Promise<RunRecord | undefined>;
  /** The same with `eventSeq`, the SKIFF_EVENTS sequence of the event it was projected from (0: not known). */
  find(projectId: string, appName: string | undefined, runId: string): Promise<HistoryRun | undefined>;
  /** The webhook deliveries of a run that are over and have left KV (records of the webhook role, opaque here). */
  deliveries(projectId: string, appName: string, runId: string): Promise<unknown[]>;
  /** Sync runs recorded `running`, oldest first, at most `limit`. */
  runningSync(limit: number): Promise<RunRecord[]>;
  /** The last sequence of the run stream that the history has applied; 0 before the first. */
  position(): Promise<number>;
  /** Deletes the runs made more than RUN_RETENTION_MS before `now`; says how many. */
  prune(now?: number): Promise<number>;
  /** Bytes its tables and their indexes take. */
  size(): Promise<number>;
  /** Its byte budget; 0: none. */
  readonly budget: number;
  /** Deletes the oldest runs past what its budget holds (done every SIZE_CHECK_EVERY_MS); says how many. */
  pruneToBudget(): Promise<number>;
  /** The projector of this process, when it runs one. */
  readonly projector: RunProjector | undefined;
  readonly kind: HistoryBackend["kind"];
  close(): Promise<void>;
}

export interface RunHistoryOptions {
  nc: NatsConnection;
  logger: Logger;
  /** SKIFF_DATABASE_URL; undefined: SQLite in `dataDir`/history. */
  databaseUrl: string | undefined;
  dataDir: string;
  /** Schema of the tables in PostgreSQL, default "skiff" (tests give each their own). */
  schema?: string;
  /**
   * Whether this process projects the run stream and keeps the history within its retention and budget
   * (default true; with a shared server one process at a time does; of SKIFF_WORKERS' workers, sharing one
   * file, only the first).
   */
  project?: boolean;
  projector?: Pick<ProjectorOptions, "batchSize" | "batchMs" | "leaderRetryMs">;
  pruneEveryMs?: number;
  /** Its byte budget and the watch that reports it; without, it is bounded by age only. */
  budget?: HistoryBudgetOptions;
  sizeCheckEveryMs?: number;
  /** Gives up opening (a process stopping meanwhile). */
  signal?: AbortSignal;
}

export interface HistoryBudgetOptions {
  /** SKIFF_HISTORY_MAX_BYTES; undefined: its share of SKIFF_STORAGE_SHARE of the free disk (and what it takes). */
  maxBytes: number | undefined;
  /** SKIFF_STORAGE_SHARE, percent. */
  storageShare: number;
  /** Measures it with the other stores (/metrics, warnings). */
  watch?: StoreWatch;
}

/** The budget given, or the history's part of the free space of the data folder's disk and of what it takes. */
async function historyBudget(opts: RunHistoryOptions, queries: HistoryBackend): Promise<number> {
  const b = opts.budget;
  if (b === undefined) return 0;
  if (b.maxBytes !== undefined) return b.maxBytes;
  const spec = STORE_SPECS.find((s) => s.store === HISTORY_STORE)!;
  const bytes = derivedBudget(spec, b.storageShare, (await freeDiskBytes(opts.dataDir)) + (await queries.size()));
  opts.logger.info(
    { budget: bytes, setting: spec.setting },
    `run history: budget ${mib(bytes)}, its part of SKIFF_STORAGE_SHARE of the free space on the data folder's disk (${spec.setting} sets another); past it the oldest runs are deleted`,
  );
  return bytes;
}

/** Opens (and creates when missing) the history's tables and starts projecting; does not wait for the projection. */
export async function openRunHistory(opts: RunHistoryOptions): Promise<RunHistory> {
  const queries =
    opts.databaseUrl === undefined
      ? await openEmbedded(opts)
      : await openPostgresHistory(opts.databaseUrl, opts.schema ?? DEFAULT_SCHEMA, opts.logger);
  let budget: number;
  try {
    opts.signal?.throwIfAborted();
    budget = await historyBudget(opts, queries);
  } catch (err) {
    await queries.close();
    throw err;
  }
  const projector =
    opts.project === false
      ? undefined
      : new RunProjector({ ...opts.projector, nc: opts.nc, backend: queries, logger: opts.logger });
  const prune = (now = Date.now()) => queries.prune(now - RUN_RETENTION_MS);
  let pruning: Promise<unknown> = Promise.resolve();
  const sweep = () => {
    pruning = prune().then(
      (n) => n > 0 && opts.logger.info({ runs: n }, "run history: runs past their retention deleted"),
      (err: unknown) => opts.logger.warn({ err }, "run history: cannot delete runs past their retention"),
    );
  };
  const pruner = projector ? setInterval(sweep, opts.pruneEveryMs ?? PRUNE_EVERY_MS) : undefined;
  pruner?.unref();
  const sizeCheckEveryMs = opts.sizeCheckEveryMs ?? SIZE_CHECK_EVERY_MS;
  const sizer = budget > 0 ? new HistoryBudget(queries, budget, opts.logger) : undefined;
  // One check at a time, chained behind the age sweep's deletes.
  let sizing: Promise<number> = Promise.resolve(0);
  const pruneToBudget = () =>
    (sizing = sizing.then(
      () => sizer?.check() ?? 0,
      () => sizer?.check() ?? 0,
    ));
  const sizeTimer =
    sizer && projector
      ? setInterval(
          () =>
            void pruneToBudget().catch((err: unknown) =>
              opts.logger.warn({ err }, "run history: cannot keep it within its budget"),
            ),
          sizeCheckEveryMs,
        )
      : undefined;
  sizeTimer?.unref();
  const unwatch = budget > 0 ? opts.budget?.watch?.addStore(HISTORY_STORE, budget, () => queries.size()) : undefined;
  let closing: Promise<void> | undefined;
  return {
    kind: queries.kind,
    projector,
    list: (projectId, appName, q) => queries.list(projectId, appName, q),
    minuteStats: (projectId, appName, fromMs, toMs) => queries.minuteStats(projectId, appName, fromMs, toMs),
    get: async (projectId, appName, runId) => (await queries.find(projectId, appName, runId))?.record,
    find: (projectId, appName, runId) => queries.find(projectId, appName, runId),
    deliveries: (projectId, appName, runId) => queries.deliveries(projectId, appName, runId),
    runningSync: (limit) => queries.runningSync(limit),
    position: () => queries.position(FEED_STREAM),
    prune,
    size: () => queries.size(),
    budget,
    pruneToBudget,
    close() {
      closing ??= (async () => {
        clearInterval(pruner);
        clearInterval(sizeTimer);
        unwatch?.();
        await sizing.catch(() => undefined);
        await projector?.stop();
        await pruning;
        await queries.close();
      })();
      return closing;
    },
  };
}

/** What a fresh embedded history holds of the runs an old one held. */
const PROJECTED_AGAIN =
  "Runs whose events SKIFF_EVENTS still holds (7 days) are projected again; older ones are not listed";

/** The embedded history in `dataDir`; a PGlite history of an earlier version beside it is left alone, and said so. */
async function openEmbedded(opts: RunHistoryOptions): Promise<HistoryBackend> {
  const old = path.join(opts.dataDir, OLD_PGLITE_FOLDER);
  const dir = path.join(opts.dataDir, HISTORY_FOLDER);
  const fresh = !(await exists(path.join(dir, SQLITE_FILE)));
  if (fresh && (await exists(path.join(old, "PG_VERSION"))))
    opts.logger.warn(
      { old, now: dir },
      "run history: the embedded history is now a SQLite file; the PGlite folder of an earlier version is no longer read " +
        `(delete it to free its room). ${PROJECTED_AGAIN}`,
    );
  if (fresh) {
    // Earlier versions kept one history per worker of SKIFF_WORKERS, in the worker's folder.
    const workers = await readdir(path.join(opts.dataDir, WORKERS_FOLDER)).catch(() => [] as string[]);
    const old = [];
    for (const n of workers)
      if (await exists(path.join(opts.dataDir, WORKERS_FOLDER, n, HISTORY_FOLDER, SQLITE_FILE))) old.push(n);
    if (old.length > 0)
      opts.logger.warn(
        { old: old.map((n) => path.join(opts.dataDir, WORKERS_FOLDER, n, HISTORY_FOLDER)), now: dir },
        "run history: the workers of SKIFF_WORKERS now share one history; their own files of an earlier version are no longer read " +
          `(delete them to free their room). ${PROJECTED_AGAIN}`,
      );
  }
  return openSqliteHistory(dir);
}

const exists = (file: string) =>
  access(file).then(
    () => true,
    () => false,
  );
