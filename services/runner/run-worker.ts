// The runner's side of async runs: for each app deployed here, the durable
// pull consumer `runs-{project}-{app}` on SKIFF_RUNS (consumers.runQueue of
// the NATS layout, shared by every runner of the app), pulled only for free slots
// (max_replicas × replica_concurrency of the app, less the runs under way).
//
// A message is a run: its record goes `running` (attempt = delivery count),
// the runner invokes the app while the message's ack deadline is pushed
// back with working() every third of ack_wait, the final record and event
// are written, and only then is the message acked. A runner killed mid-run
// never acks: JetStream gives the message to another runner after ack_wait,
// at most MAX_RUN_ATTEMPTS (max_deliver) deliveries in all (run-advisories.ts fails the
// run after the last). A message whose run is already final (cancelled while
// queued, or finished by an earlier attempt whose ack was lost) is acked
// without running.
import type { ConsumerMessages, JetStreamClient, JetStreamManager, JsMsg } from "nats";
import type { AppRegistry } from "../apps/index.js";
import type { Logger } from "../config/index.js";
import { consumers, ensureConsumer } from "../nats/index.js";
import {
  type RunControl,
  publishRunEvent,
  finishAsync,
  type FinishDeps,
  outcomeOfAnswer,
  outcomeOfError,
  type RunOutcome,
  isFinal,
  type RunStore,
  decodeRequest,
  requestMeta,
  type BodyTransfer,
  AppNotFound,
  Cancelled,
  Overloaded,
  type InvokeRequest,
} from "../runs/index.js";
import type { AppRef } from "./deployed-apps.js";
import type { Runner } from "./runner.js";

/** How long one pull waits for messages before pulling again. */
const PULL_EXPIRES_MS = 5_000;
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
}

/** Put back for another runner: this one cannot run it now (shutting down, app gone from here). */
class Requeue extends Error {
  override name = "Requeue";
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

class AppQueue {
  stopped = false;
  private inflight = 0;
  private freed: (() => void) | undefined;
  private batch: ConsumerMessages | undefined;

  constructor(
    private readonly w: RunWorker,
    readonly app: AppRef,
  ) {}

  private capacity(): number {
    const scaling = this.w.d.registry.get(this.app.projectId, this.app.appName)?.config.scaling;
    return Math.max(1, (scaling?.maxReplicas ?? 1) * (scaling?.replicaConcurrency ?? 1));
  }

  async loop(): Promise<void> {
    const { d } = this.w;
    while (!this.stopped) {
      try {
        const spec = consumers.runQueue(this.app.projectId, this.app.appName);
        await ensureConsumer(d.jsm, spec, d.ackWaitMs);
        const consumer = await d.js.consumers.get(spec.stream, spec.name);
        while (!this.stopped) {
          const free = this.capacity() - this.inflight;
          if (free <= 0) {
            await new Promise<void>((r) => (this.freed = r));
            continue;
          }
          this.batch = await consumer.fetch({ max_messages: free, expires: PULL_EXPIRES_MS });
          for await (const m of this.batch) {
            this.inflight++;
            void this.w.handle(this, m).finally(() => {
              this.inflight--;
              this.freed?.();
              this.freed = undefined;
            });
          }
        }
      } catch (err) {
        if (this.stopped) return;
        d.logger.warn(
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

  constructor(readonly d: WorkerDeps) {}

  add(app: AppRef): void {
    const key = `${app.projectId}.${app.appName}`;
    if (this.queues.has(key)) return;
    const q = new AppQueue(this, app);
    this.queues.set(key, q);
    void q.loop();
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
    for (const q of this.queues.values()) q.stop();
    this.queues.clear();
    const grace = new Promise((r) => setTimeout(r, CLOSE_GRACE_MS).unref());
    await Promise.race([Promise.allSettled([...this.handling]), grace]);
  }

  handle(q: AppQueue, m: JsMsg): Promise<void> {
    const p = this.run(q, m);
    this.handling.add(p);
    return p.finally(() => this.handling.delete(p));
  }

  private async run(q: AppQueue, m: JsMsg): Promise<void> {
    const { d } = this;
    const { projectId, appName } = q.app;
    const heartbeat = setInterval(() => m.working(), d.ackWaitMs / 3);
    let runId = "";
    try {
      const req = await decodeRequest(d.transfer, m.data, true);
      runId = req.runId;
      const cur = await d.runs.get(projectId, appName, runId);
      if (!cur) {
        d.logger.warn({ runId, app: `${projectId}/${appName}` }, "queued run without a record; dropped");
        return m.term();
      }
      if (isFinal(cur.record.status)) return m.ack();
      const attempt = m.info.redeliveryCount;
      const running = await d.runs.update(projectId, appName, runId, (r) =>
        isFinal(r.status)
          ? undefined
          : { ...r, status: "running", started_at: new Date().toISOString(), attempts: attempt, runner: d.control.id },
      );
      if (!running) return m.ack();
      await publishRunEvent(d.js, running);
      const controller = new AbortController();
      const done = this.invoke(q, req, controller.signal).then((o) => finishAsync(d, running, o));
      d.control.track(runId, controller, done);
      await done;
      await d.transfer.drop(requestMeta(m.data).body_object);
      m.ack();
    } catch (err) {
      if (!(err instanceof Requeue))
        d.logger.warn(
          { err, runId, app: `${projectId}/${appName}` },
          "async run step failed; the run goes back to the queue",
        );
      m.nak(RETRY_AFTER_ERROR_MS);
    } finally {
      clearInterval(heartbeat);
    }
  }

  /** The run's outcome; a full app is waited for (the message stays ours through working()). */
  private async invoke(q: AppQueue, req: InvokeRequest, signal: AbortSignal): Promise<RunOutcome> {
    const started = performance.now();
    for (;;) {
      try {
        if (signal.aborted) throw new Cancelled();
        return outcomeOfAnswer(await this.d.runner.invoke(q.app.projectId, q.app.appName, { ...req, signal }));
      } catch (err) {
        if (err instanceof Overloaded && !q.stopped) {
          await sleep(err.retryAfterSeconds * 1000);
          continue;
        }
        if (err instanceof Overloaded || err instanceof AppNotFound) throw new Requeue(err.message, { cause: err });
        return outcomeOfError(err, Math.round(performance.now() - started));
      }
    }
  }
}
