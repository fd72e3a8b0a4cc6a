// nats.js writes what a connection has buffered at the first microtask
// checkpoint after a publish: under load that is one socket write (and, on
// loopback, the server's whole receive path inside that write) per request,
// since every request publishes from a task of its own. Writing once per
// turn of the event loop instead sends everything the requests of that turn
// published in one write. The order of messages is unchanged (one buffer),
// a buffer past the client's pending limit is still written at once, and
// flush() still works (its PING goes through the same buffer).
import type { NatsConnection } from "nats";

/** The parts of nats.js's protocol handler (not public API) that this replaces or uses. */
interface Protocol {
  outbound: { fill(buf: Uint8Array, ...payloads: Uint8Array[]): void; size(): number };
  pendingLimit: number;
  sendCommand(cmd: string | Uint8Array, ...payloads: Uint8Array[]): void;
  flushPending(): void;
}

const encoder = new TextEncoder();

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
  const flush = () => {
    scheduled = false;
    protocol.flushPending();
  };
  protocol.sendCommand = (cmd, ...payloads) => {
    protocol.outbound.fill(typeof cmd === "string" ? encoder.encode(cmd) : cmd, ...payloads);
    if (protocol.outbound.size() >= protocol.pendingLimit) protocol.flushPending();
    else if (!scheduled) {
      scheduled = true;
      setImmediate(flush);
    }
  };
  return true;
}
