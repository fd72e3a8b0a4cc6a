// KV keys taken out of their bucket whole, at once (kvPurgeKey) or a while
// later (KvPurger), so that nats-server holds nothing for them: a subject
// costs it about 240 bytes of memory on every node for as long as the
// subject has a message, and at a few hundred async runs a second a record
// per run kept for days grows each node without end (ARCHITECTURE.md, "Run
// history").
//
// kvRemoveKey deletes a key's revisions one by one, by their sequences,
// which its latest entry lists (the writers keep them): nats-server 2.9 does
// that in constant time, where a stream purge filtered on the key's subject
// (kvPurgeKey, for entries that do not list them) walks every block of the
// stream, so on a large bucket it falls behind the runs of a busy cluster
// (bench/README.md has both rates).
// Neither leaves a marker (kv.purge() writes one, which keeps the subject,
// and its memory, until the bucket's age).
//
// KvPurger holds keys due for purging in memory, in the order they were
// scheduled (one delay for all, so due times only rise): a process that dies
// leaves its pending keys to the bucket's age, as a purge that keeps failing
// does. Its users schedule a key once the message it belongs to is acked
// with a confirmed ack (afterAck, kept keepAfterAckMs): a runner an async
// run's record (runner/run-worker.ts), the webhook role a run's delivery
// entry once its deliveries are over and in the run history (webhook/role.ts).
// Both values list their earlier revisions (allRevisions).
import type { JsMsg, NatsConnection } from "nats";
import type { Logger } from "../config/index.js";
import { apiFailure, apiRequest } from "./acked-publish.js";
import { kvGetLatest, type KvGetEntry } from "./kv-get.js";

/**
 * How long an ended run's record, or a run's deliveries once over, stay in KV
 * after their message was acked, by default (SKIFF_FINAL_RECORD_KEEP_MS).
 */
export const ENDED_KEEP_MS = 60_000;
/**
 * How long a key stays once the message it belongs to was acked: the
 * setting (default ENDED_KEEP_MS), and twice the consumer's ack_wait at
 * least, since a consumer whose leader changed before the ack was replicated
 * may deliver the message once more within it, and that delivery must find
 * the key as it was left.
 */
export function keepAfterAckMs(keepMs: number | undefined, ackWaitMs: number): number {
  return Math.max(keepMs ?? ENDED_KEEP_MS, 2 * ackWaitMs);
}

/**
 * Every revision of a key whose value lists its earlier ones (`prior`, as the
 * writers keep them), with `revision`, its own; undefined when it lists none
 * (written before the lists were kept).
 */
export function allRevisions(prior: unknown, revision: number): number[] | undefined {
  return Array.isArray(prior) ? [...(prior as number[]), revision] : undefined;
}

/** Purges in flight at once. */
const MAX_IN_FLIGHT = 128;
/** How often due keys are looked for. */
const TICK_MS = 1_000;
/** Tries at one key before leaving it to the bucket's age, this far apart (or keptMs, when shorter). */
const MAX_TRIES = 3;
const RETRY_MS = 5_000;

interface Pending {
  due: number;
  key: string;
  /** Every revision of the key, when the scheduler knew them (no read before deleting them then). */
  revisions: number[] | undefined;
  tries: number;
}

export class KvPurger {
  private queue: Pending[] = [];
  private head = 0;
  private inFlight = 0;
  private readonly timer: ReturnType<typeof setInterval>;
  private failures = 0;
  /** Keys purged, and keys given up on, since start. */
  purged = 0;
  abandoned = 0;

  constructor(
    /** Purges one key (its revisions when the scheduler gave them); a rejection is tried again. */
    private readonly purge: (key: string, revisions: number[] | undefined) => Promise<unknown>,
    private readonly logger: Logger,
    /** How long a key stays after it was scheduled. */
    readonly keptMs: number,
    /** What the keys are, for the log. */
    private readonly what: string,
  ) {
    this.timer = setInterval(() => this.drain(), Math.min(TICK_MS, keptMs));
    this.timer.unref();
  }

  /** Keys waiting for their time or being purged. */
  get pending(): number {
    return this.queue.length - this.head + this.inFlight;
  }

  /** Purges `key` keptMs from now; `revisions`: all it has, when known (nothing may write it again). */
  schedule(key: string, revisions?: number[]): void {
    this.queue.push({ due: Date.now() + this.keptMs, key, revisions, tries: 0 });
  }

  /**
   * Acks `msg` with a confirmed ack and, once the server has confirmed it
   * (the message will not come again), schedules `key`; an ack that is not
   * confirmed leaves the key to the bucket's age.
   */
  afterAck(msg: JsMsg, key: string, revisions?: number[]): void {
    msg.ackAck().then(
      (confirmed) => confirmed && this.schedule(key, revisions),
      () => undefined,
    );
  }

  /** Purges what is due, up to MAX_IN_FLIGHT at once; more on the next tick or as purges end. */
  drain(now = Date.now()): void {
    while (this.inFlight < MAX_IN_FLIGHT && this.head < this.queue.length && this.queue[this.head].due <= now) {
      const item = this.queue[this.head++];
      this.inFlight++;
      this.purge(item.key, item.revisions).then(
        () => {
          this.purged++;
          this.settled();
        },
        (err: unknown) => {
          if (++item.tries < MAX_TRIES) this.queue.push({ ...item, due: Date.now() + Math.min(RETRY_MS, this.keptMs) });
          else this.abandoned++;
          if (this.failures++ === 0)
            this.logger.warn(
              { err, key: item.key },
              `cannot take ${this.what} out of KV; trying again later (more such failures are counted, not logged)`,
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
    // A retried key went to the back with a later due time; the rest keep their order.
    if (this.head < this.queue.length && this.queue[this.head].due <= Date.now()) this.drain();
  }

  /**
   * Stops. Keys not yet due stay in KV until the bucket's age: purging them
   * now could take one from under a redelivery still to come.
   */
  close(): void {
    clearInterval(this.timer);
    if (this.failures > 0)
      this.logger.info({ failures: this.failures, abandoned: this.abandoned }, `${this.what}: purges that failed`);
    this.queue = [];
    this.head = 0;
  }
}

/** Removes every revision of `key` from `bucket`, leaving no marker; resolves with how many messages went. */
export async function kvPurgeKey(nc: NatsConnection, bucket: string, key: string): Promise<number> {
  const what = `purge ${key} of KV ${bucket}`;
  const subject = `$JS.API.STREAM.PURGE.KV_${bucket}`;
  const answer = await apiRequest<{ success?: boolean; purged?: number }>(
    nc,
    subject,
    { filter: `$KV.${bucket}.${key}` },
    what,
  );
  if (answer.error || answer.success !== true)
    throw apiFailure(what, answer.error, "JetStream did not say it was done");
  return answer.purged ?? 0;
}

/**
 * Removes `key` from `bucket`: its `known` revisions when the caller has
 * them (nothing is read then), else as `revisionsOf` its latest entry says:
 * every stream sequence the key has (deleted one by one), false to keep the
 * key, or undefined when the entry does not say (a filtered purge then).
 * Resolves with how many messages went.
 */
export async function kvRemoveKey(
  nc: NatsConnection,
  bucket: string,
  key: string,
  revisionsOf: (entry: KvGetEntry) => number[] | false | undefined,
  known?: number[],
): Promise<number> {
  if (known) return kvDeleteRevisions(nc, bucket, known);
  const entry = await kvGetLatest(nc, bucket, key);
  if (!entry) return 0;
  const revisions = revisionsOf(entry);
  if (revisions === false) return 0;
  if (revisions === undefined) return kvPurgeKey(nc, bucket, key);
  return kvDeleteRevisions(nc, bucket, revisions);
}

/** Deletes one message by its sequence (not erased: nothing secret is in it); false when it was not there. */
async function deleteMessage(nc: NatsConnection, stream: string, seq: number): Promise<boolean> {
  const what = `delete message ${seq} of ${stream}`;
  const answer = await apiRequest<{ success?: boolean }>(
    nc,
    `$JS.API.STREAM.MSG.DELETE.${stream}`,
    { seq, no_erase: true },
    what,
  );
  if (answer.success === true) return true;
  // Gone already: an earlier removal, or the bucket's history limit.
  if (/no message found|sequence .*not found/i.test(answer.error?.description ?? "")) return false;
  throw apiFailure(what, answer.error, "JetStream did not say it was done");
}

/** Deletes the given revisions of a key by sequence (its removal when they are all it has); how many went. */
async function kvDeleteRevisions(nc: NatsConnection, bucket: string, revisions: number[]): Promise<number> {
  const deleted = await Promise.all(revisions.map((seq) => deleteMessage(nc, `KV_${bucket}`, seq)));
  return deleted.filter(Boolean).length;
}
