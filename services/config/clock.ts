// The time of timers that decide behaviour (scaling, cooldown, retry waits):
// code that takes a Clock can be driven by a test that advances time itself
// instead of waiting for it. `realClock` is the machine's.

/** A timer's handle, as the clock that made it knows it. */
export interface ClockTimer {
  /** Lets the process exit while the timer is pending (Node's unref). */
  unref(): ClockTimer;
}

export interface Clock {
  /** Milliseconds since the epoch, as Date.now(). */
  now(): number;
  setTimeout(fn: () => void, ms: number): ClockTimer;
  clearTimeout(timer: ClockTimer | undefined): void;
  setInterval(fn: () => void, ms: number): ClockTimer;
  clearInterval(timer: ClockTimer | undefined): void;
}

export const realClock: Clock = {
  now: () => Date.now(),
  setTimeout: (fn, ms) => setTimeout(fn, ms),
  clearTimeout: (timer) => clearTimeout(timer as NodeJS.Timeout | undefined),
  setInterval: (fn, ms) => setInterval(fn, ms),
  clearInterval: (timer) => clearInterval(timer as NodeJS.Timeout | undefined),
};

/** Resolves after `ms` of the clock's time. */
export function sleep(clock: Clock, ms: number): Promise<void> {
  return new Promise((resolve) => clock.setTimeout(resolve, ms));
}
