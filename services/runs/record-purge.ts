// Takes an async run's record out of KV `skiff-runs` once the run is over,
// so that nats-server holds nothing per finished run: a subject costs it
// about 240 bytes of memory on every node for as long as the subject has a
// message, and at a few hundred async runs a second a record kept for the
// bucket's two days grows each node without end (ARCHITECTURE.md, "Run
// history").
//
// A record is purged (every revision, no marker: nats/kv-get.ts kvPurgeKey)
// by the runner that acked the run's queue message with a confirmed ack
// (ackAck) after finding or making the record final, `keptMs` later. By
// then nothing writes the record: a runner that gets the message again
// reads it final and acks (a confirmed ack is not redelivered, but a
// consumer whose leader changed before the ack was replicated may deliver
// it once more within its ack_wait, hence at least twice ack_wait), and the
// run history has the run (projected a few milliseconds after its final
// event), from which GetRun reads the record, and its result from the final
// event (runs/results.ts readFromEvent).
//
// What is pending lives in memory, in the order it was scheduled (one
// delay for all, so due times only rise): a runner that dies leaves its
// pending records to the bucket's age, as a lost purge does.
import type { Logger } from "../config/index.js";
import type { RunRecord, RunStore } from "./store.js";

/** The least time a final record stays in KV after its queue message was acked. */
export const FINAL_RECORD_KEPT_MS = 60_000;
/** Purges in flight at once. */
const MAX_IN_FLIGHT = 128;
/** How often due records are looked for. */
const TICK_MS = 1_000;
/** Tries at one record before leaving it to the bucket's age, this far apart (or keptMs, when shorter). */
const MAX_TRIES = 3;
const RETRY_MS = 5_000;

interface Pending {
  due: number;
  projectId: string;
  appName: string;
  runId: string;
  tries: number;
}

export class FinalRecordPurger {
  private queue: Pending[] = [];
  private head = 0;
  private inFlight = 0;
  private readonly timer: ReturnType<typeof setInterval>;
  private failures = 0;
  /** Records purged, and records given up on, since start. */
  purged = 0;
  abandoned = 0;

  constructor(
    private readonly store: Pick<RunStore, "purge">,
    private readonly logger: Logger,
    /** How long a final record stays after its run's message was acked. */
    readonly keptMs: number = FINAL_RECORD_KEPT_MS,
  ) {
    this.timer = setInterval(() => this.drain(), Math.min(TICK_MS, keptMs));
    this.timer.unref();
  }

  /** Records waiting for their time. */
  get pending(): number {
    return this.queue.length - this.head + this.inFlight;
  }

  /** Purges the final record of `record`'s run keptMs from now. */
  schedule(record: Pick<RunRecord, "project_id" | "app_name" | "run_id">): void {
    this.queue.push({
      due: Date.now() + this.keptMs,
      projectId: record.project_id,
      appName: record.app_name,
      runId: record.run_id,
      tries: 0,
    });
  }

  /** Purges what is due, up to MAX_IN_FLIGHT at once; more on the next tick or as purges end. */
  drain(now = Date.now()): void {
    while (this.inFlight < MAX_IN_FLIGHT && this.head < this.queue.length && this.queue[this.head].due <= now) {
      const item = this.queue[this.head++];
      this.inFlight++;
      this.store.purge(item.projectId, item.appName, item.runId).then(
        () => {
          this.purged++;
          this.settled();
        },
        (err: unknown) => {
          if (++item.tries < MAX_TRIES) this.queue.push({ ...item, due: Date.now() + Math.min(RETRY_MS, this.keptMs) });
          else this.abandoned++;
          if (this.failures++ === 0)
            this.logger.warn(
              { err, runId: item.runId },
              "cannot take a final run record out of KV; trying again later (more such failures are counted, not logged)",
            );
          this.settled();
        },
      );
    }
    if (this.head > 1024 && this.head * 2 > this.queue.length) {
      this.queue = this.queue.slice(this.head);
      this.head = 0;
    }
  }

  private settled(): void {
    this.inFlight--;
    // A retried record went to the back with a later due time; the rest keep their order.
    if (this.head < this.queue.length && this.queue[this.head].due <= Date.now()) this.drain();
  }

  /**
   * Stops. Records not yet due stay in KV until the bucket's age: purging
   * them now could take one from under a redelivery still to come.
   */
  close(): void {
    clearInterval(this.timer);
    if (this.failures > 0)
      this.logger.info({ failures: this.failures }, "final run records that could not be purged at once");
    this.queue = [];
    this.head = 0;
  }
}
