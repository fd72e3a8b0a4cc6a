// nats.js writes what a connection has buffered at the first microtask
// checkpoint after a publish: under load that is one socket write (and, on
// loopback, the server's whole receive path inside that write) per request,
// since every request publishes from a task of its own. Writing once per
// turn of the event loop instead sends everything the requests of that turn
// published in one write. The order of messages is unchanged (one buffer),
// a buffer past the client's pending limit is still written at once, and
// flush() still works (its PING goes through the same buffer).
//
// Bookkeeping that nothing waits for (a sync run's event, published after its
// caller has the answer) may wait a little longer: publishInBackground()
// puts it in the same buffer but writes it within BACKGROUND_FLUSH_MS, or
// with the next write anything else makes, whichever comes first. Order on
// the connection is still the order of the calls; at a few requests at a
// time each request then costs no write of its own to the server, nor the
// server a wake-up and a delivery to each consumer per event. inBackground()
// does the same for what a function publishes (an acknowledged publish whose
// acknowledgement nobody hurries for: an async run's first record).
import type { NatsConnection, PublishOptions } from "nats";

/** The parts of nats.js's protocol handler (not public API) that this replaces or uses. */
interface Protocol {
  outbound: { fill(buf: Uint8Array, ...payloads: Uint8Array[]): void; size(): number };
  pendingLimit: number;
  sendCommand(cmd: string | Uint8Array, ...payloads: Uint8Array[]): void;
  flushPending(): void;
}

const encoder = new TextEncoder();

/**
 * How long a background publish may wait for company before it is written.
 * Each write costs the writer a system call that runs the server's receive
 * path (loopback) and the server a wake-up: at thousands of sync runs a
 * second, 5 ms made 200 writes a second, 3% of the gateway's thread
 * (bench/profile.ts custom); 20 ms makes a quarter of those, each under
 * nats.js's 32 KiB buffer, which writes at once when full.
 */
export const BACKGROUND_FLUSH_MS = 20;
/** The same for a background publish that something does wait on (inBackground: an acknowledged one). */
export const WAITED_FLUSH_MS = 5;

/**
 * Per coalesced connection: set while a publish whose write may wait (publishInBackground, inBackground)
 * fills the buffer, with how long it may wait.
 */
const backgrounds = new WeakMap<NatsConnection, { on: boolean; waitMs: number }>();
/**
 * Per coalesced connection: what adds its messages to each write just before it goes (beforeWrite), and
 * what says whether an answer is still owed (beforeDrain).
 */
const extras = new WeakMap<NatsConnection, { before: (() => void)[]; owed: (() => boolean)[] }>();

/** How long a drain waits for the answers still owed (DRAIN_ROUNDS times at most). */
const DRAIN_SETTLE_MS = 1_000;
const DRAIN_ROUNDS = 3;
const turn = () => new Promise<void>((resolve) => setImmediate(resolve));

function protocolOf(nc: NatsConnection): Protocol | undefined {
  const protocol = (nc as unknown as { protocol?: Partial<Protocol> }).protocol;
  const usable =
    protocol !== undefined &&
    typeof protocol.sendCommand === "function" &&
    typeof protocol.flushPending === "function" &&
    typeof protocol.pendingLimit === "number" &&
    typeof protocol.outbound?.fill === "function" &&
    typeof protocol.outbound?.size === "function";
  return usable ? (protocol as Protocol) : undefined;
}

/**
 * Makes `nc` write its buffered messages once per event-loop turn. Returns
 * false, changing nothing, when the client's internals are not the ones
 * this was written for (another nats.js version): messages then go as
 * nats.js sends them.
 */
export function coalesceWrites(nc: NatsConnection): boolean {
  const protocol = protocolOf(nc);
  if (protocol === undefined) return false;
  let scheduled = false;
  let timer: NodeJS.Timeout | undefined;
  /** When the timer writes the buffer (performance.now()); Infinity without one. */
  let due = Infinity;
  const background = { on: false, waitMs: BACKGROUND_FLUSH_MS };
  const before: (() => void)[] = [];
  const owed: (() => boolean)[] = [];
  /** Set while the hooks publish: their messages join the write under way. */
  let hooked = false;
  const runHooks = () => {
    if (hooked) return;
    hooked = true;
    try {
      for (const hook of before) hook();
    } finally {
      hooked = false;
    }
  };
  const flush = () => {
    scheduled = false;
    clearTimeout(timer);
    timer = undefined;
    due = Infinity;
    runHooks();
    protocol.flushPending();
  };
  protocol.sendCommand = (cmd, ...payloads) => {
    protocol.outbound.fill(typeof cmd === "string" ? encoder.encode(cmd) : cmd, ...payloads);
    if (hooked) return;
    if (protocol.outbound.size() >= protocol.pendingLimit) flush();
    else if (background.on) {
      // A write already due this turn takes it along; otherwise it waits for one, or the timer, which
      // a publish that may wait less brings forward.
      const at = performance.now() + background.waitMs;
      if (!scheduled && at < due) {
        clearTimeout(timer);
        due = at;
        timer = setTimeout(flush, background.waitMs);
      }
    } else if (!scheduled) {
      scheduled = true;
      setImmediate(flush);
    }
  };
  backgrounds.set(nc, background);
  extras.set(nc, { before, owed });
  // A flush is a barrier (its PING answered once the server has read what came before): what the hooks hold
  // goes ahead of it. So does a drain, after which nothing may be published (its own flush comes too late).
  const flushConnection = nc.flush.bind(nc);
  nc.flush = () => {
    runHooks();
    return flushConnection();
  };
  // nats.js reads no answer once its drain has begun: what still waits for one (an acknowledged event, whose
  // record the feed takes once it is stored) gets it first, a few rounds (an answer may publish more).
  const drainConnection = nc.drain.bind(nc);
  nc.drain = async () => {
    for (let round = 0; round < DRAIN_ROUNDS && !nc.isClosed(); round++) {
      const until = performance.now() + DRAIN_SETTLE_MS;
      flush();
      while (owed.some((waiting) => waiting()) && performance.now() < until && !nc.isClosed())
        await new Promise((resolve) => setTimeout(resolve, 2));
      // What the answers set going (a record added to the feed at the end of their turn).
      await turn();
      await turn();
      if (!owed.some((waiting) => waiting())) break;
    }
    runHooks();
    return drainConnection();
  };
  return true;
}

/**
 * Has a drain of `nc` wait (a second at most, a few times) while `waiting()` says an answer is still owed.
 * False, with nothing registered, on a connection coalesceWrites did not patch.
 */
export function beforeDrain(nc: NatsConnection, waiting: () => boolean): boolean {
  return extras.get(nc)?.owed.push(waiting) !== undefined;
}

/**
 * Calls `hook` before each write of `nc`'s buffer (and before each flush()), so that what it publishes
 * then goes in that write. False, with nothing registered, on a connection coalesceWrites did not patch.
 */
export function beforeWrite(nc: NatsConnection, hook: () => void): boolean {
  return extras.get(nc)?.before.push(hook) !== undefined;
}

/**
 * Publishes without hurrying its write: it goes with the connection's next
 * write, at most BACKGROUND_FLUSH_MS later (at once on a connection that
 * coalesceWrites could not patch). For messages nobody waits on.
 */
export function publishInBackground(
  nc: NatsConnection,
  subject: string,
  data: Uint8Array,
  options?: PublishOptions,
): void {
  inBackground(nc, () => nc.publish(subject, data, options), BACKGROUND_FLUSH_MS);
}

/**
 * Calls `fn`; what it publishes on `nc` before it returns (an async
 * function: before its first await) waits for company as
 * publishInBackground's publishes do, `waitMs` at most (WAITED_FLUSH_MS:
 * for acknowledged publishes whose acknowledgement is awaited, but not
 * hurried for).
 */
export function inBackground<T>(nc: NatsConnection, fn: () => T, waitMs = WAITED_FLUSH_MS): T {
  const background = backgrounds.get(nc);
  if (background === undefined) return fn();
  // Nested: the outer call's flag stays, and the shorter of the two waits holds.
  if (background.on) {
    const outer = background.waitMs;
    background.waitMs = Math.min(outer, waitMs);
    try {
      return fn();
    } finally {
      background.waitMs = outer;
    }
  }
  // nats.js fills the buffer within publish(), synchronously: sendCommand sees the flag.
  background.on = true;
  background.waitMs = waitMs;
  try {
    return fn();
  } finally {
    background.on = false;
  }
}

/**
 * inBackground(nc, fn) when `together` (other work on the connection will
 * write soon: an async run's steps while other runs are under way), else fn()
 * written at once, as there is no company to wait for.
 */
export function inBackgroundIf<T>(together: boolean, nc: NatsConnection, fn: () => T): T {
  return together ? inBackground(nc, fn) : fn();
}
