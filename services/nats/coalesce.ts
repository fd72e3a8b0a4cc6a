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

/** How long a background publish may wait for company before it is written. */
export const BACKGROUND_FLUSH_MS = 5;

/** Per coalesced connection: set while a publish whose write may wait (publishInBackground) fills the buffer. */
const backgrounds = new WeakMap<NatsConnection, { on: boolean }>();

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
  const background = { on: false };
  const flush = () => {
    scheduled = false;
    clearTimeout(timer);
    timer = undefined;
    protocol.flushPending();
  };
  protocol.sendCommand = (cmd, ...payloads) => {
    protocol.outbound.fill(typeof cmd === "string" ? encoder.encode(cmd) : cmd, ...payloads);
    if (protocol.outbound.size() >= protocol.pendingLimit) flush();
    else if (background.on) {
      // A write already due this turn takes it along; otherwise it waits for one, or the timer.
      if (!scheduled) timer ??= setTimeout(flush, BACKGROUND_FLUSH_MS);
    } else if (!scheduled) {
      scheduled = true;
      setImmediate(flush);
    }
  };
  backgrounds.set(nc, background);
  return true;
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
  inBackground(nc, () => nc.publish(subject, data, options));
}

/**
 * Calls `fn`; what it publishes on `nc` before it returns (an async
 * function: before its first await) waits for company as
 * publishInBackground's publishes do. For acknowledged publishes whose
 * acknowledgement nobody hurries for.
 */
export function inBackground<T>(nc: NatsConnection, fn: () => T): T {
  const background = backgrounds.get(nc);
  if (background === undefined || background.on) return fn();
  // nats.js fills the buffer within publish(), synchronously: sendCommand sees the flag.
  background.on = true;
  try {
    return fn();
  } finally {
    background.on = false;
  }
}
