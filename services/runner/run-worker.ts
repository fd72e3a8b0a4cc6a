// The runner's side of async runs: for each app deployed here, the durable
// pull consumer `runs-{project}-{app}` on SKIFF_RUNS (consumers.runQueue of
// the NATS layout, shared by every runner of the app), pulled only for free slots
// (max_replicas × replica_concurrency of the app, less the runs under way).
//
// A message is a run: its record goes `running` (attempt = delivery count;
// its event, for a run still going after RUNNING_EVENT_AFTER_MS, is
// published without awaiting an acknowledgement),
// the runner invokes the app while the message's ack deadline is pushed
// back with working() every third of ack_wait, the final record and event
// are written, and only then is the message acked. A runner killed mid-run
// never acks: JetStream gives the message to another runner after ack_wait.
// A run is started at most MAX_RUN_ATTEMPTS times, counted in its record:
// a delivery past that fails it as runner_lost (as run-advisories.ts does
// when JetStream's max_deliver is reached). A message whose run is already final (cancelled while
// queued, or finished by an earlier attempt whose ack was lost) is acked
// without running, after publishing the terminal event again (deduplicated
// by its message id): that attempt's runner may have died between the final
// record and the event.
//
// A run's result larger than maxResultBytes (SKIFF_MAX_ASYNC_RESULT_BYTES) is
// neither read past that size nor stored: the run fails with error type
// result_too_large.
//
// The message of a final run is acked with a confirmed ack (confirmAck), after
// which its record leaves KV a minute later (KvPurger, nats/kv-purge.ts), so
// that nats-server holds nothing per ended run. By then nothing writes the
// record: a confirmed ack is not redelivered, except by a consumer whose
// leader changed before the ack was replicated, within its ack_wait, hence a
// delay of twice ack_wait at least (the message then finds the record final);
// and the run history has the run (projected a few milliseconds after its
// final event), from which GetRun reads it, with its result from the final
// event (runs/results.ts readFromEvent).
import type { ConsumerMessages, JetStreamClient, JetStreamManager, JsMsg } from "nats";
import type { AppRegistry } from "../apps/index.js";
import {
  confirmAck,
  consumers,
  ensureConsumer,
  inBackgroundIf,
  MAX_RUN_ATTEMPTS,
  type KvPurger,
} from "../nats/index.js";
import {
  type RunControl,
  publishRunEventUnacked,
  finishAsync,
  republishFinal,
  type FinishDeps,
  outcomeOfAnswer,
  outcomeOfError,
  type RunOutcome,
  isFinal,
  type RunStore,
  type BodyTransfer,
  AppNotFound,
  Cancelled,
  Overloaded,
  type InvokeRequest,
  type RunRecord,
  revisionsOf,
  runKey,
  copyRecord,
  RUNNING_EVENT_AFTER_MS,
} from "../runs/index.js";
import { decodeRequestFrame, type RequestMeta } from "../runner-client/index.js";
import { LightSignal } from "../server/index.js";
import type { AppRef } from "./deployed-apps.js";
import { tooLargeAnswer } from "./responses.js";
import type { Runner } from "./runner.js";
import { failLostRun } from "./run-advisories.js";

/**
 * How long one pull waits for messages before pulling again, at most: never
 * longer than ack_wait, so that the pull of a runner that died takes no more
 * than one redelivery meant for a live one (each counts toward max_deliver).
 */
const PULL_EXPIRES_MS = 5_000;
/**
 * The most runs one pull asks for. A pull's messages arrive together, and
 * the runs they start would do their first steps in one turn of the event
 * loop, ahead of the calls waiting on the thread (async accepts when the
 * gateway is this process): smaller pulls, and each run started in a turn
 * of its own, let those in between.
 */
const PULL_BATCH = 32;
const RETRY_AFTER_ERROR_MS = 2_000;
const CLOSE_GRACE_MS = 5_000;

export interface WorkerDeps extends FinishDeps {
  jsm: JetStreamManager;
  js: JetStreamClient;
  runner: Runner;
  registry: AppRegistry;
  runs: RunStore;
  transfer: BodyTransfer;
  control: RunControl;
  /** Ack deadline of the run consumers; the last runner to start sets it. */
  ackWaitMs: number;
  /** Takes the records of runs acked final out of KV; none: they stay for the bucket's age. */
  purger?: KvPurger;
  /** SKIFF_MAX_ASYNC_RESULT_BYTES: the largest result stored; none: no limit. */
  maxResultBytes?: number;
}

/** Put back for another runner: this one cannot run it now (shutting down, app gone from here). */
class Requeue extends Error {
  override name = "Requeue";
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
/** Resolves after the I/O that is waiting now has been handled. */
const nextTurn = () => new Promise<void>((resolve) => setImmediate(resolve));

class AppQueue {
  stopped = false;
  private inflight = 0;
  private freed: (() => void) | undefined;
  private batch: ConsumerMessages | undefined;

  constructor(
    private readonly worker: RunWorker,
    readonly app: AppRef,
  ) {}

  private capacity(): number {
    const scaling = this.worker.deps.registry.get(this.app.projectId, this.app.appName)?.config.scaling;
    return Math.max(1, (scaling?.maxReplicas ?? 1) * (scaling?.replicaConcurrency ?? 1));
  }

  async loop(): Promise<void> {
    const { deps } = this.worker;
    while (!this.stopped) {
      // A deleted app's consumer is deleted with it: never made again here.
      if (deps.registry.get(this.app.projectId, this.app.appName) === undefined) return;
      try {
        const spec = consumers.runQueue(this.app.projectId, this.app.appName);
        await ensureConsumer(deps.jsm, spec, deps.ackWaitMs);
        const consumer = await deps.js.consumers.get(spec.stream, spec.name);
        while (!this.stopped) {
          const free = this.capacity() - this.inflight;
          if (free <= 0) {
            await new Promise<void>((resolve) => (this.freed = resolve));
            continue;
          }
          this.batch = await consumer.fetch({
            max_messages: Math.min(free, PULL_BATCH),
            expires: Math.max(1_000, Math.min(PULL_EXPIRES_MS, deps.ackWaitMs)),
          });
          for await (const msg of this.batch) {
            // A turn of the event loop per run taken: calls waiting on the thread go in between.
            await nextTurn();
            if (this.stopped) {
              msg.nak(); // for another runner, or this one's next start
              continue;
            }
            this.inflight++;
            void this.worker.handle(this, msg).finally(() => {
              this.inflight--;
              this.freed?.();
              this.freed = undefined;
            });
          }
        }
      } catch (err) {
        if (this.stopped) return;
        deps.logger.warn(
          { err, app: `${this.app.projectId}/${this.app.appName}` },
          "pulling async runs failed; pulling again",
        );
        await sleep(RETRY_AFTER_ERROR_MS);
      }
    }
  }

  stop(): void {
    this.stopped = true;
    this.batch?.stop();
    this.freed?.();
  }
}

export class RunWorker {
  private readonly queues = new Map<string, AppQueue>();
  private readonly handling = new Set<Promise<void>>();

  constructor(readonly deps: WorkerDeps) {}

  add(app: AppRef): void {
    const key = `${app.projectId}.${app.appName}`;
    if (this.queues.has(key)) return;
    const queue = new AppQueue(this, app);
    this.queues.set(key, queue);
    void queue.loop();
  }

  remove(app: AppRef): void {
    const key = `${app.projectId}.${app.appName}`;
    this.queues.get(key)?.stop();
    this.queues.delete(key);
  }

  /**
   * Stops pulling and gives the runs under way a moment to finish; one still
   * running when the runner closes goes back to the queue (or, if this
   * process dies, is delivered again after ack_wait).
   */
  async close(): Promise<void> {
    for (const queue of this.queues.values()) queue.stop();
    this.queues.clear();
    const grace = new Promise((resolve) => setTimeout(resolve, CLOSE_GRACE_MS).unref());
    await Promise.race([Promise.allSettled([...this.handling]), grace]);
  }

  /**
   * Whether other runs are under way here besides the caller's: then a run's
   * writes to NATS (its first record, its final record and event, the ack)
   * go with the next write theirs make, WAITED_FLUSH_MS at most, instead of
   * a socket write each (and a wake-up of the server each); a run alone
   * writes at once, having no company to wait for.
   */
  private together(): boolean {
    return this.handling.size > 1;
  }

  /** Calls `publish`; what it publishes waits for company (inBackground) while other runs are under way. */
  private write<T>(publish: () => T): T {
    return inBackgroundIf(this.together(), this.deps.runs.nc, publish);
  }

  handle(queue: AppQueue, msg: JsMsg): Promise<void> {
    const handled = this.run(queue, msg);
    this.handling.add(handled);
    return handled.finally(() => this.handling.delete(handled));
  }

  private async run(queue: AppQueue, msg: JsMsg): Promise<void> {
    const { deps } = this;
    const { projectId, appName } = queue.app;
    const heartbeat = setInterval(() => msg.working(), deps.ackWaitMs / 3);
    let runId = "";
    let announce: NodeJS.Timeout | undefined;
    try {
      const { req, meta } = await decodeRequestFrame(deps.transfer, msg.data, true);
      runId = req.runId;
      const running = await this.start(msg, queue.app, runId, meta);
      if (!running) return; // the message is settled
      // The `running` event is news, not the record (KV holds that, acknowledged): as a sync run's, it goes
      // out only for a run still going after RUNNING_EVENT_AFTER_MS, without an acknowledgement awaited,
      // ahead of the final event on the same connection. It is called off the moment the run's outcome is
      // known (a cancel's included: the abort ends the invoke), before the final record and event are
      // written, so that it never follows them.
      announce = setTimeout(publishRunEventUnacked, RUNNING_EVENT_AFTER_MS, deps.runs.nc, running.record);
      const stop = new LightSignal();
      const done = this.invoke(queue, req, stop).then((outcome) => {
        clearTimeout(announce);
        return finishAsync(deps, running, outcome, this.together());
      });
      deps.control.track(runId, stop, done);
      const final = await done;
      await deps.transfer.drop(meta.body_object);
      // The final record this runner wrote lists every revision; else (a cancel won) they are read at purge time.
      this.ackFinal(msg, running.record, final && revisionsOf(final.record, final.revision));
    } catch (err) {
      if (!(err instanceof Requeue))
        deps.logger.warn(
          { err, runId, app: `${projectId}/${appName}` },
          "async run step failed; the run goes back to the queue",
        );
      msg.nak(RETRY_AFTER_ERROR_MS);
    } finally {
      clearTimeout(announce);
      clearInterval(heartbeat);
    }
  }

  /**
   * Records the run `running` for this attempt and resolves with that record;
   * or settles the message and resolves with nothing: a run already final
   * (cancelled while queued, or finished by an earlier attempt whose ack was
   * lost) is acked, one past its attempts failed and dropped.
   *
   * A first delivery finds no record (the queue message is a queued run's
   * record), so its first record is written `running` from the message,
   * unless a cancel or another delivery wrote one first: one round trip. A
   * redelivery reads the record first.
   */
  private async start(
    msg: JsMsg,
    app: AppRef,
    runId: string,
    meta: RequestMeta,
  ): Promise<{ record: RunRecord; revision: number } | undefined> {
    const { deps } = this;
    const { projectId, appName } = app;
    /** The record of this attempt's start (a copy, field by field: see copyRecord). */
    const startedBy = (record: RunRecord, attempts: number) => {
      const started = copyRecord(record);
      started.status = "running";
      started.started_at = new Date().toISOString();
      started.attempts = attempts;
      started.runner = deps.control.id;
      return started;
    };
    const lost = async () => {
      await failLostRun(deps.runs, deps.logger, { projectId, appName, runId }, meta.record);
      await deps.transfer.drop(meta.body_object);
      msg.term();
      return undefined;
    };
    let cur = msg.info.redeliveryCount > 1 ? await deps.runs.get(projectId, appName, runId) : undefined;
    if (!cur) {
      if (!meta.record) {
        deps.logger.warn({ runId, app: `${projectId}/${appName}` }, "queued run without a record; dropped");
        msg.term();
        return undefined;
      }
      const attempt = Math.max(1, msg.info.redeliveryCount);
      if (attempt > MAX_RUN_ATTEMPTS) return lost();
      // A run starts in a turn of its own: its first record would be a socket write of its own. With other runs
      // under way its publish goes with the connection's next write instead (an accept's, another run's step).
      const record = startedBy(meta.record, attempt);
      const created = await this.write(() => deps.runs.create(record));
      if (created) return created;
      // A cancel, or another delivery of the message, wrote first: go on from theirs.
      cur = await deps.runs.get(projectId, appName, runId);
      if (!cur) throw new Error(`run ${runId}: its record was written and is gone`);
    }
    if (isFinal(cur.record.status)) {
      // An earlier attempt finished it; its runner may have died before publishing the event.
      await republishFinal(deps.runs, cur.record);
      this.ackFinal(msg, cur.record, revisionsOf(cur.record, cur.revision));
      return undefined;
    }
    // JetStream's delivery count is not an attempt count: a delivery to a
    // runner that died can be taken back uncounted (seen with nats-server
    // 2.9), so max_deliver may never be reached. The record counts every
    // start of the run, and caps the attempts itself.
    const attempt = Math.max(msg.info.redeliveryCount, cur.record.attempts + 1);
    if (attempt > MAX_RUN_ATTEMPTS) return lost();
    const running = await deps.runs.updateFrom(cur, (record) =>
      isFinal(record.status) ? undefined : startedBy(record, attempt),
    );
    if (!running) this.ackFinal(msg, cur.record);
    return running;
  }

  /**
   * Acks the message of a run whose record is final; once the server has
   * confirmed the ack, the record is due for its removal (an ack not
   * confirmed leaves it to the bucket's age).
   */
  private ackFinal(msg: JsMsg, run: Pick<RunRecord, "project_id" | "app_name" | "run_id">, revisions?: number[]): void {
    const { purger } = this.deps;
    if (!purger) return msg.ack();
    const key = runKey(run.project_id, run.app_name, run.run_id);
    this.write(() => confirmAck(this.deps.runs.nc, msg)).then(
      () => purger.schedule(key, revisions),
      () => undefined,
    );
  }

  /** The run's outcome; a full app is waited for (the message stays ours through working()). */
  private async invoke(queue: AppQueue, req: InvokeRequest, signal: LightSignal): Promise<RunOutcome> {
    const started = performance.now();
    for (;;) {
      try {
        if (signal.aborted) throw new Cancelled();
        const max = this.deps.maxResultBytes;
        const answerLimit = max === undefined ? undefined : { bytes: max, setting: "SKIFF_MAX_ASYNC_RESULT_BYTES" };
        const res = await this.deps.runner.invoke(queue.app.projectId, queue.app.appName, {
          ...req,
          signal,
          answerLimit,
        });
        // The runner read no more than the limit; a Cortex envelope around the result may still pass it.
        if (max !== undefined && res.body.byteLength > max) {
          const message = `the result of this async run is ${res.body.byteLength} bytes, more than the ${max} bytes skiff stores (SKIFF_MAX_ASYNC_RESULT_BYTES)`;
          return outcomeOfAnswer({ ...res, ...tooLargeAnswer(req.runId, message) });
        }
        return outcomeOfAnswer(res);
      } catch (err) {
        if (err instanceof Overloaded && !queue.stopped) {
          await sleep(err.retryAfterSeconds * 1000);
          continue;
        }
        if (err instanceof Overloaded || err instanceof AppNotFound) throw new Requeue(err.message, { cause: err });
        return outcomeOfError(err, Math.round(performance.now() - started));
      }
    }
  }
}
