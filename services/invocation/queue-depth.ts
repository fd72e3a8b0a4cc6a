// How many async runs an app has waiting or running, for SKIFF_MAX_QUEUED_RUNS,
// without a JetStream round trip per call. The count of each app's subject
// in the work-queue stream is read once, then again in the background at
// most every REFRESH_MS, and every run this process accepts in between is
// added to it. Accepts made while a read is in flight are added on top of
// what it reads: the stream's answer may predate them, and a count too low
// would let the queue run past its cap (one too high only costs a fresh read).
// A count at the limit is read afresh before a call is refused, so a refusal
// is always right; an acceptance may overshoot by what other gateways
// accepted in the last second: a cap against runaway queues, not an exact
// quota.
import type { JetStreamManager } from "nats";
import { queuedRuns } from "../runs/index.js";

/** An app, by project and name. */
type QueueOf = { project: string; app: string };
const keyOf = (a: QueueOf) => `${a.project}.${a.app}`;

export const QUEUE_DEPTH_REFRESH_MS = 1_000;

interface Depth {
  count: number;
  readAt: number;
  refreshing: Promise<void> | undefined;
  /** Accepts so far, ever: a read adds those made while it was in flight. */
  accepts: number;
}

export class QueueDepths {
  private readonly depths = new Map<string, Depth>();

  constructor(
    private readonly jsm: JetStreamManager,
    private readonly refreshMs = QUEUE_DEPTH_REFRESH_MS,
  ) {}

  /** Runs of `app` waiting or running, as last read plus this process's accepts since. */
  async count(app: QueueOf): Promise<number> {
    const depth = this.depths.get(keyOf(app));
    if (depth === undefined) {
      await this.read(app);
      return this.depths.get(keyOf(app))!.count;
    }
    if (Date.now() - depth.readAt >= this.refreshMs && depth.refreshing === undefined) {
      // In the background: a call never waits for it once the app was read once.
      depth.refreshing = this.read(app)
        .catch(() => undefined)
        .finally(() => (depth.refreshing = undefined));
    }
    return depth.count;
  }

  /** Runs of `app` waiting or running, read now. */
  async fresh(app: QueueOf): Promise<number> {
    await this.read(app);
    return this.depths.get(keyOf(app))!.count;
  }

  /** A run this process queued for `app`. */
  accepted(app: QueueOf): void {
    const depth = this.depths.get(keyOf(app));
    if (depth) {
      depth.count++;
      depth.accepts++;
    }
  }

  private async read(app: QueueOf): Promise<void> {
    const before = this.depths.get(keyOf(app))?.accepts ?? 0;
    const [{ count }] = await queuedRuns(this.jsm, app);
    const depth = this.depths.get(keyOf(app));
    if (depth) Object.assign(depth, { count: count + depth.accepts - before, readAt: Date.now() });
    else this.depths.set(keyOf(app), { count, readAt: Date.now(), refreshing: undefined, accepts: 0 });
  }
}
