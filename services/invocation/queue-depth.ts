// How many async runs an app has waiting or running, for SKIFF_MAX_QUEUED_RUNS,
// without a JetStream round trip per call. The count of each app's subject
// in the work-queue stream is read once, then again in the background at
// most every REFRESH_MS, and every run this process accepts in between is
// added to it. A count at the limit is read afresh before a call is refused,
// so a refusal is always right; an acceptance may overshoot by what other
// gateways accepted in the last second: a cap against runaway queues, not
// an exact quota.
import type { JetStreamManager } from "nats";
import { streams } from "../nats/index.js";

export const QUEUE_DEPTH_REFRESH_MS = 1_000;

interface Depth {
  count: number;
  readAt: number;
  refreshing: Promise<void> | undefined;
}

export class QueueDepths {
  private readonly depths = new Map<string, Depth>();

  constructor(
    private readonly jsm: JetStreamManager,
    private readonly refreshMs = QUEUE_DEPTH_REFRESH_MS,
  ) {}

  /** Runs waiting or running on `subject`, as last read plus this process's accepts since. */
  async count(subject: string): Promise<number> {
    const depth = this.depths.get(subject);
    if (depth === undefined) {
      await this.read(subject);
      return this.depths.get(subject)!.count;
    }
    if (Date.now() - depth.readAt >= this.refreshMs && depth.refreshing === undefined) {
      // In the background: a call never waits for it once the app was read once.
      depth.refreshing = this.read(subject)
        .catch(() => undefined)
        .finally(() => (depth.refreshing = undefined));
    }
    return depth.count;
  }

  /** Runs waiting or running on `subject`, read now. */
  async fresh(subject: string): Promise<number> {
    await this.read(subject);
    return this.depths.get(subject)!.count;
  }

  /** A run this process queued on `subject`. */
  accepted(subject: string): void {
    const depth = this.depths.get(subject);
    if (depth) depth.count++;
  }

  private async read(subject: string): Promise<void> {
    const info = await this.jsm.streams.info(streams.runs.name, { subjects_filter: subject });
    const count = info.state.subjects?.[subject] ?? 0;
    const depth = this.depths.get(subject);
    if (depth) Object.assign(depth, { count, readAt: Date.now() });
    else this.depths.set(subject, { count, readAt: Date.now(), refreshing: undefined });
  }
}
