// A Clock (services/config/clock.ts) whose time moves only when a test says:
// timers fire in time order as advance() passes them, so a test asserts on
// what happened after "30 s of cooldown" without waiting for it.
import type { Clock, ClockTimer } from "../../services/config/clock.js";

interface Pending {
  at: number;
  fn: () => void;
  /** Set for an interval: its period. */
  every?: number;
  seq: number;
}

class FakeTimer implements ClockTimer {
  constructor(readonly id: number) {}
  unref(): ClockTimer {
    return this;
  }
}

export class FakeClock implements Clock {
  private time: number;
  private seq = 0;
  private readonly pending = new Map<number, Pending>();

  constructor(start = 1_700_000_000_000) {
    this.time = start;
  }

  now(): number {
    return this.time;
  }

  setTimeout(fn: () => void, ms: number): ClockTimer {
    return this.add(fn, ms, undefined);
  }

  setInterval(fn: () => void, ms: number): ClockTimer {
    return this.add(fn, ms, Math.max(1, ms));
  }

  clearTimeout(timer: ClockTimer | undefined): void {
    if (timer instanceof FakeTimer) this.pending.delete(timer.id);
  }

  clearInterval(timer: ClockTimer | undefined): void {
    this.clearTimeout(timer);
  }

  /** Timers waiting to fire. */
  get timers(): number {
    return this.pending.size;
  }

  private add(fn: () => void, ms: number, every: number | undefined): ClockTimer {
    const id = ++this.seq;
    this.pending.set(id, { at: this.time + Math.max(0, ms), fn, every, seq: id });
    return new FakeTimer(id);
  }

  /**
   * Moves time `ms` forward, firing each timer due on the way at its own
   * time, in order; between two timers, promises that are settled run (what
   * a timer started may set another timer).
   */
  async advance(ms: number): Promise<void> {
    const end = this.time + ms;
    for (;;) {
      await settle();
      let next: [number, Pending] | undefined;
      for (const entry of this.pending)
        if (
          entry[1].at <= end &&
          (!next || entry[1].at < next[1].at || (entry[1].at === next[1].at && entry[1].seq < next[1].seq))
        )
          next = entry;
      if (!next) break;
      const [id, p] = next;
      this.time = Math.max(this.time, p.at);
      if (p.every === undefined) this.pending.delete(id);
      else p.at += p.every;
      p.fn();
    }
    this.time = end;
    await settle();
  }
}

/** Lets promises already settled, and what they chain, run (a few turns of the event loop). */
async function settle(): Promise<void> {
  for (let i = 0; i < 5; i++) await new Promise<void>((resolve) => setImmediate(resolve));
}
