// The run methods of ManagementService: ListRuns (newest first, a page read
// from the run history's index, so it costs the same however many runs are
// stored), GetRun (an async run's record from KV while it has one, with its
// result while kept, else the history's, with the result from the run's
// terminal event; and its webhook deliveries),
// CancelRun and WatchRuns (the changes of a project's runs from now on: the
// run events, headers only, from now on). It also
// sweeps expired results from object store `skiff-results` once an hour, and
// fails sync runs whose gateway is gone (runs/stale-sync.ts).
//
// CancelRun: a queued run is set `cancelled` (its first KV record, written
// only if a runner has not written one; the runner then acks its message
// without running it).
// A running run's process is asked to abort it (runs/control.ts) and records
// it `cancelled` itself; when that process is gone, the record is set
// `cancelled` here. A final run cannot be cancelled: failed_precondition.
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, type HandlerContext, type ServiceImpl } from "@connectrpc/connect";
import { DeliverPolicy, type NatsConnection } from "nats";
import {
  WatchRunsResponseSchema,
  type ManagementService,
  type WatchRunsResponse,
} from "../../gen/skiff/management/v2/management_pb.js";
import { APP_NAME_PATTERN } from "../apps/index.js";
import type { Logger } from "../config/index.js";
import { objectStores, streams, subjects } from "../nats/index.js";
import {
  recordOfEvent,
  requestCancel,
  publishRunEvent,
  isFinal,
  openRunHistory,
  trimResults,
  RUN_STATUSES,
  sweepStaleSyncRuns,
  timeOfId,
  type RunContext,
  type HistoryBudgetOptions,
  type RunHistory,
  type RunRecord,
  type RunStatus,
  runMessage,
  type Body,
} from "../runs/index.js";
import { listDeliveries, redeliver, RedeliveryError } from "../webhooks/index.js";

type Impl = ServiceImpl<typeof ManagementService>;
type RunMethods = "listRuns" | "getRun" | "cancelRun" | "watchRuns" | "listWebhookDeliveries" | "redeliverWebhook";

/** The app name by which ListRuns lists every app of the project (AIP-159's "-"). */
export const ALL_APPS = "-";
const DEFAULT_PAGE_SIZE = 50;
const MAX_PAGE_SIZE = 500;
/** How long CancelRun waits for an aborted run's final record. */
const CANCEL_SETTLE_MS = 5_000;
/** A run made this recently that is found nowhere may be on its way to the history: looked for again... */
const FRESH_RUN_MS = 60_000;
/** ...for this long. */
const FRESH_RUN_WAIT_MS = 3_000;
/** How far ahead of this clock a run id's time may be and still be a run just made (another machine's clock). */
const CLOCK_SKEW_MS = 5_000;

/** A run made a moment ago, by its id's time: not yet in the history, perhaps. An id from the future is none. */
function fresh(runId: string): boolean {
  const age = Date.now() - timeOfId(runId);
  return age > -CLOCK_SKEW_MS && age < FRESH_RUN_MS;
}

/**
 * What `look()` finds of a run; for a run made a moment ago (its event may not be projected yet: within
 * milliseconds), asked again until it finds it, FRESH_RUN_WAIT_MS at most.
 */
async function lookedFor<T>(runId: string, look: () => Promise<T | undefined>): Promise<T | undefined> {
  let found = await look();
  if (found !== undefined || !fresh(runId)) return found;
  const end = Date.now() + FRESH_RUN_WAIT_MS;
  while (found === undefined && Date.now() < end) {
    await new Promise((res) => setTimeout(res, 25));
    found = await look();
  }
  return found;
}

/** How often objects in `skiff-results` past their keep are removed. */
const SWEEP_EVERY_MS = 60 * 60 * 1000;
/** How often the results' object store is checked against its budget. */
const TRIM_EVERY_MS = 10_000;
/** An app name (APP_NAME_PATTERN) or a project id: either may start with a digit or a letter. */
const NAME = APP_NAME_PATTERN;
const RUN_ID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

interface RunApiOptions {
  nc: NatsConnection;
  logger: Logger;
  /** The process's run helpers: the store of run records and the results. */
  runs: Pick<RunContext, "store" | "results">;
  /** SKIFF_DATABASE_URL: the run history's PostgreSQL; undefined, SQLite in `dataDir`. */
  databaseUrl: string | undefined;
  dataDir: string;
  /** Whether this process projects the run events into the history (default true). */
  project?: boolean;
  /** The run history's byte budget, and the store watch, whose figures of skiff-results its trimming reads too. */
  historyBudget?: HistoryBudgetOptions;
  /**
   * From when the project's runs are its own, ms (0: all; undefined: no such
   * project). A project deleted and made again under its id is another
   * project: runs made before its creation are the deleted one's, never shown.
   */
  projectCreatedAt?: (projectId: string) => Promise<number | undefined>;
}

export interface RunApi {
  handlers: Pick<Impl, RunMethods>;
  /** The run history, once open (it opens in the background: start-up never waits for it). */
  history(): Promise<RunHistory>;
  close(): Promise<void>;
}

/** A run found, with its result read on demand. */
interface FoundRun {
  record: RunRecord;
  result(): Promise<Body | undefined>;
}

function names(projectId: string, appName: string, runId?: string): void {
  if (!NAME.test(appName))
    throw new ConnectError(
      `app ${JSON.stringify(appName.slice(0, 80))} not found in project ${projectId}`,
      Code.NotFound,
    );
  if (runId !== undefined && !RUN_ID.test(runId))
    throw new ConnectError(`run ${JSON.stringify(runId.slice(0, 80))} not found`, Code.NotFound);
}

const token = {
  encode: (runId: string) => Buffer.from(runId).toString("base64url"),
  decode(raw: string): string {
    const runId = Buffer.from(raw, "base64url").toString("utf8");
    if (!RUN_ID.test(runId)) throw new ConnectError("page_token is not one this API gave", Code.InvalidArgument);
    return runId;
  },
};

export async function startRunApi(opts: RunApiOptions): Promise<RunApi> {
  const { nc, logger } = opts;
  const js = nc.jetstream();
  const { store: runs, results } = opts.runs;
  const stopping = new AbortController();
  const opening = openRunHistory({
    nc,
    logger,
    databaseUrl: opts.databaseUrl,
    dataDir: opts.dataDir,
    budget: opts.historyBudget,
    project: opts.project,
    signal: stopping.signal,
  });
  opening.catch((err: unknown) => {
    if (!stopping.signal.aborted) logger.error({ err }, "run history: cannot open its database");
  });
  const history = () =>
    opening.catch((err: unknown) => {
      throw new ConnectError(`the run history is not available: ${(err as Error).message}`, Code.Unavailable);
    });
  const sweeper = setInterval(() => {
    if (!nc.isClosed())
      results.sweep(logger).catch((err: unknown) => logger.warn({ err }, "cannot sweep expired results"));
  }, SWEEP_EVERY_MS);
  sweeper.unref();
  // At its budget, skiff-results makes room by removing the results of ended runs, oldest first.
  const watch = opts.historyBudget?.watch;
  let trimming = false;
  const trimmer = setInterval(() => {
    if (trimming || nc.isClosed() || watch === undefined) return;
    trimming = true;
    trimResults(results, watch.get(objectStores.results.name), logger)
      .catch((err: unknown) => logger.warn({ err }, "cannot make room in the results' object store"))
      .finally(() => (trimming = false));
  }, TRIM_EVERY_MS);
  trimmer.unref();
  // Sync runs left `running` by a gateway that died: failed once it is seen gone (runs/stale-sync.ts).
  const staleSync = sweepStaleSyncRuns({ nc, history: () => opening, logger });

  /**
   * The run, and how to read its result: an async run's KV record while it
   * has one (the result kept in it), else the history's row (sync runs, and
   * async ones ended over a minute ago, whose result is read from their
   * terminal event).
   */
  async function lookUp(projectId: string, appName: string, runId: string): Promise<FoundRun | undefined> {
    const cur = await runs.get(projectId, appName, runId);
    if (cur) return { record: cur.record, result: () => results.read(cur.record) };
    const row = await (await history()).find(projectId, appName, runId);
    return row && { record: row.record, result: () => results.readFromEvent(row.record, row.eventSeq) };
  }

  /** The time from which the project's runs are its own (see RunApiOptions.projectCreatedAt). */
  const since = async (projectId: string): Promise<number | undefined> =>
    opts.projectCreatedAt ? ((await opts.projectCreatedAt(projectId)) ?? 0) : undefined;

  async function findRun(projectId: string, appNamed: string, runId: string): Promise<FoundRun> {
    // App "-" (as ListRuns takes it): the run by its id alone, in whichever app of the project ran it.
    const everyApp = appNamed === ALL_APPS;
    if (!everyApp) names(projectId, appNamed, runId);
    else if (!RUN_ID.test(runId))
      throw new ConnectError(`run ${JSON.stringify(runId.slice(0, 80))} not found`, Code.NotFound);
    const notFound = () =>
      new ConnectError(
        `run ${runId} not found in ${everyApp ? `project ${projectId}` : `app ${appNamed}`}`,
        Code.NotFound,
      );
    // A run of a project deleted before this one of its id was made is not this project's, nor is its app.
    const from = await since(projectId);
    if (from !== undefined && timeOfId(runId) < from) throw notFound();
    const appName = everyApp
      ? await lookedFor(runId, async () => (await (await history()).find(projectId, undefined, runId))?.record.app_name)
      : appNamed;
    if (appName === undefined) throw notFound();
    const found = await lookedFor(runId, () => lookUp(projectId, appName, runId));
    if (!found) throw new ConnectError(`run ${runId} not found in app ${appName}`, Code.NotFound);
    return found;
  }

  /** The run's deliveries that are over and have left KV (none for a run that named no webhook). */
  const keptDeliveries = async (record: RunRecord): Promise<unknown[]> =>
    record.webhook_endpoint && isFinal(record.status)
      ? (await history()).deliveries(record.project_id, record.app_name, record.run_id)
      : [];

  const findRecord = async (projectId: string, appName: string, runId: string): Promise<RunRecord> =>
    (await findRun(projectId, appName, runId)).record;

  /**
   * Sets a run `cancelled` unless it is final; publishes the event when this
   * call did it. An async run by compare-and-set of its KV record; a sync run
   * (whose gateway is gone, so nobody else writes it) by its event alone.
   */
  async function markCancelled(record: RunRecord, from: RunStatus, message: string): Promise<RunRecord | undefined> {
    const cancelled = (cur: RunRecord): RunRecord => ({
      ...cur,
      status: "cancelled",
      finished_at: new Date().toISOString(),
      error: { type: "cancelled", message },
    });
    // A queued async run has no KV record (its queue message is its record): its first is written `cancelled`,
    // unless a runner has just written `running`.
    const final = record.async
      ? await runs.update(
          record.project_id,
          record.app_name,
          record.run_id,
          (r) =>
            r.status !== from || (from === "running" && r.attempts !== record.attempts) ? undefined : cancelled(r),
          from === "queued" ? record : undefined,
        )
      : record.status === from
        ? cancelled(record)
        : undefined;
    if (final) await publishRunEvent(nc, final);
    return final;
  }

  async function settled(record: RunRecord): Promise<RunRecord> {
    const end = Date.now() + CANCEL_SETTLE_MS;
    for (;;) {
      const cur = (await lookUp(record.project_id, record.app_name, record.run_id))?.record ?? record;
      if (isFinal(cur.status) || Date.now() > end) return cur;
      await new Promise((res) => setTimeout(res, 20));
    }
  }

  async function cancel(projectId: string, appName: string, runId: string): Promise<RunRecord> {
    for (;;) {
      const record = await findRecord(projectId, appName, runId);
      if (isFinal(record.status))
        throw new ConnectError(`run ${runId} is already ${record.status}`, Code.FailedPrecondition);
      if (record.status === "queued") {
        const done = await markCancelled(record, "queued", "cancelled while queued");
        if (done) return done;
        continue; // a runner took it meanwhile
      }
      const answer = record.runner ? await requestCancel(nc, record.runner, runId) : "gone";
      if (answer === "aborted") return settled(record);
      // Its process is gone (or no longer has it): nobody else will finish the record.
      const done = await markCancelled(
        record,
        "running",
        answer === "gone" ? "cancelled; the process running it was gone" : "cancelled",
      );
      if (done) return done;
    }
  }

  const handlers: Pick<Impl, RunMethods> = {
    async listRuns(req) {
      const everyApp = req.appName === ALL_APPS;
      if (!everyApp) names(req.projectId, req.appName);
      if (req.status !== "" && !(RUN_STATUSES as readonly string[]).includes(req.status)) {
        throw new ConnectError(
          `status must be one of ${RUN_STATUSES.join(", ")}, got ${JSON.stringify(req.status.slice(0, 40))}`,
          Code.InvalidArgument,
        );
      }
      const pageSize = req.pageSize === 0 ? DEFAULT_PAGE_SIZE : Math.min(req.pageSize, MAX_PAGE_SIZE);
      const runHistory = await history();
      const page = await runHistory.list(req.projectId, everyApp ? undefined : req.appName, {
        pageSize,
        after: req.pageToken === "" ? undefined : token.decode(req.pageToken),
        asyncOnly: req.asyncOnly,
        status: req.status === "" ? undefined : (req.status as RunStatus),
        sinceMs: await since(req.projectId),
      });
      return {
        runs: page.runs.map((record) => runMessage(record)),
        nextPageToken: page.next === undefined ? "" : token.encode(page.next),
      };
    },
    async getRun(req) {
      const { record, result } = await findRun(req.projectId, req.appName, req.runId);
      const run = runMessage(record, await result());
      run.webhookDeliveries = await listDeliveries(nc, record.run_id, await keptDeliveries(record));
      return { run };
    },
    async listWebhookDeliveries(req) {
      const record = await findRecord(req.projectId, req.appName, req.runId);
      return { deliveries: await listDeliveries(nc, record.run_id, await keptDeliveries(record)) };
    },
    async redeliverWebhook(req) {
      const record = await findRecord(req.projectId, req.appName, req.runId);
      if (!isFinal(record.status))
        throw new ConnectError(
          `run ${record.run_id} is ${record.status}: there is no result to deliver yet`,
          Code.FailedPrecondition,
        );
      try {
        const delivery = await redeliver(nc, record.run_id, await keptDeliveries(record));
        logger.info({ runId: record.run_id, deliveryId: delivery.deliveryId }, "webhook redelivery requested");
        return { delivery };
      } catch (err) {
        if (err instanceof RedeliveryError) throw new ConnectError(err.message, Code.FailedPrecondition);
        throw err;
      }
    },
    async cancelRun(req) {
      const record = await cancel(req.projectId, req.appName, req.runId);
      logger.info(
        { runId: record.run_id, app: `${record.project_id}/${record.app_name}`, status: record.status },
        "run cancel requested",
      );
      return { run: runMessage(record) };
    },
    async *watchRuns(req, ctx: HandlerContext): AsyncIterable<WatchRunsResponse> {
      // Every app of the project: an empty app name, or "-" as ListRuns takes it.
      const everyApp = req.appName === "" || req.appName === ALL_APPS;
      if (!everyApp) names(req.projectId, req.appName);
      if (!NAME.test(req.projectId))
        throw new ConnectError(`project ${JSON.stringify(req.projectId.slice(0, 80))} not found`, Code.NotFound);
      // Changes from now on only: the caller lists what is already stored with ListRuns. Every change of a
      // run is an event that carries its record in a header; the events' bodies (responses) stay on the server.
      const consumer = await js.consumers.get(streams.events.name, {
        filterSubjects: subjects.runEvent(req.projectId, everyApp ? "*" : req.appName, "*"),
        deliver_policy: DeliverPolicy.New,
        headers_only: true,
      });
      const messages = await consumer.consume({ max_messages: 256 });
      const onAbort = () => void messages.close();
      ctx.signal.addEventListener("abort", onAbort);
      try {
        for await (const m of messages) {
          if (ctx.signal.aborted) break;
          const record = recordOfEvent(m.headers);
          if (record) yield create(WatchRunsResponseSchema, { run: runMessage(record) });
        }
      } finally {
        await messages.close().catch(() => undefined);
        ctx.signal.removeEventListener("abort", onAbort);
      }
    },
  };
  return {
    handlers,
    history,
    async close() {
      clearInterval(sweeper);
      clearInterval(trimmer);
      staleSync.stop();
      stopping.abort(new Error("the process is stopping"));
      await (await opening.catch(() => undefined))?.close();
    },
  };
}
