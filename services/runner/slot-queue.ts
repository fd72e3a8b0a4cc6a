// The slots of one deployment version's replicas and the requests waiting
// for them.
//
// A request takes a slot on a ready, routable replica with fewer than
// replica_concurrency requests; when none is free it waits in a bounded FIFO
// queue: Overloaded when the queue is full or the wait passes queueWaitMs,
// Cancelled when its caller's signal aborts first. The queue asks its
// supply (the replica lifecycle, replica-set.ts) for replicas whenever a
// request starts waiting, and the supply hands it each replica that gets
// ready (dispatch) or tells it none will come (rejectAll).
import type { Clock, ClockTimer } from "../config/index.js";
import { Cancelled, Overloaded } from "../runs/index.js";
import type { CallSignal } from "../server/index.js";

const RETRY_AFTER_SECONDS = 1;

/** What the queue sees of a replica: whether it takes requests, and how many it holds. */
export interface SlotHolder {
  readonly state: string;
  readonly routable: boolean;
  inFlight: number;
  /** When its last request ended (the clock's time), for the cooldown. */
  idleSince: number;
}

/** What the queue asks of the side that runs replicas. */
export interface SlotSupply<R> {
  /** The replicas, in the order free slots are looked for. */
  replicas(): Iterable<R>;
  /** Requests are waiting: start replicas for them, as far as the caps allow. */
  wanted(): void;
  /** Why no further replica may start (its project's quota), if that held the last start back. */
  blocked(): string | undefined;
  /** When no replica is ready: what the others are doing (starting, the last start's failure); else undefined. */
  notReady?(): string | undefined;
}

export interface SlotQueueOptions {
  /** `project/app`, for messages. */
  owner: string;
  /** replica_concurrency. */
  concurrency: number;
  /** Requests that may wait at once. */
  limit: number;
  /** How long a request waits before Overloaded. */
  waitMs: number;
  clock: Clock;
}

/** A slot taken on `replica`; `owner` is the queue's owner that serves it (the newer version after a hand-over). */
export interface Slot<R, O> {
  owner: O;
  replica: R;
}

interface Waiter<R extends SlotHolder, O> {
  queue: SlotQueue<R, O>;
  resolve: (slot: Slot<R, O>) => void;
  reject: (err: Error) => void;
  /** The clock its timer runs on: that of the queue it first waited in. */
  clock: Clock;
  timer: ClockTimer;
  signal: CallSignal | undefined;
  onAbort: () => void;
}

export class SlotQueue<R extends SlotHolder, O> {
  private readonly waiters: Waiter<R, O>[] = [];

  constructor(
    readonly owner: O,
    private readonly o: SlotQueueOptions,
    private readonly supply: SlotSupply<R>,
  ) {}

  /** Requests waiting. */
  get length(): number {
    return this.waiters.length;
  }

  get concurrency(): number {
    return this.o.concurrency;
  }

  /** Whether `r` has a free slot now. */
  private free(r: R): boolean {
    return r.state === "ready" && r.routable && r.inFlight < this.o.concurrency;
  }

  /** A free slot on a ready replica, taken; the hot path. */
  take(): R | undefined {
    for (const r of this.supply.replicas()) {
      if (this.free(r)) {
        r.inFlight++;
        return r;
      }
    }
    return undefined;
  }

  /** Waits for a slot; rejects with Overloaded when the queue is full or the wait too long, Cancelled on abort. */
  wait(signal: CallSignal | undefined): Promise<Slot<R, O>> {
    if (this.waiters.length >= this.o.limit) {
      throw new Overloaded(
        `app ${this.o.owner} has ${this.waiters.length} requests waiting, the most it queues`,
        RETRY_AFTER_SECONDS,
      );
    }
    return new Promise<Slot<R, O>>((resolve, reject) => {
      const w: Waiter<R, O> = {
        queue: this,
        resolve,
        reject,
        signal,
        clock: this.o.clock,
        timer: this.o.clock.setTimeout(() => {
          const { queue } = w;
          queue.remove(w);
          const blocked = queue.supply.blocked();
          const notReady = queue.supply.notReady?.();
          reject(
            new Overloaded(
              `no replica of app ${queue.o.owner} was free within ${this.o.waitMs} ms` +
                (notReady ? `: ${notReady}` : "") +
                (blocked ? `${notReady ? ";" : ""} and no other could start: ${blocked}` : ""),
              RETRY_AFTER_SECONDS,
            ),
          );
        }, this.o.waitMs),
        onAbort: () => {
          w.queue.remove(w);
          reject(new Cancelled({ cause: signal?.reason }));
        },
      };
      signal?.addEventListener("abort", w.onAbort, { once: true });
      this.waiters.push(w);
      this.supply.wanted();
    });
  }

  private remove(w: Waiter<R, O>): void {
    const i = this.waiters.indexOf(w);
    if (i !== -1) this.waiters.splice(i, 1);
    this.detach(w);
  }

  private detach(w: Waiter<R, O>): void {
    w.clock.clearTimeout(w.timer);
    w.signal?.removeEventListener("abort", w.onAbort);
  }

  /** Gives free slots of `r` to waiting requests, first come first served. */
  dispatch(r: R): void {
    while (this.free(r) && this.waiters.length > 0) {
      const w = this.waiters[0];
      this.remove(w);
      r.inFlight++;
      w.resolve({ owner: this.owner, replica: r });
    }
  }

  /** A request on `r` ended: its slot goes to the next waiting request. */
  release(r: R): void {
    r.inFlight--;
    if (r.inFlight === 0) r.idleSince = this.o.clock.now();
    if (r.state === "ready") this.dispatch(r);
  }

  /** Fails every waiting request with `err`. */
  rejectAll(err: Error): void {
    for (const w of this.waiters.splice(0)) {
      this.detach(w);
      w.reject(err);
    }
  }

  /**
   * Moves every waiting request, in order, to `next` (a newer version), each
   * keeping the time it has left, and lets `next` serve them.
   */
  moveTo(next: SlotQueue<R, O>): void {
    for (const w of this.waiters.splice(0)) {
      w.queue = next;
      next.waiters.push(w);
    }
    for (const r of next.supply.replicas()) next.dispatch(r);
    next.supply.wanted();
  }
}
