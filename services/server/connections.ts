// Connections of the one-port server, from accept to close: the caps (in
// all and per remote address) and the deadlines of a connection that is not
// serving a request. Sockets reach the HTTP servers by emit("connection"),
// so Node's own headersTimeout never starts (its checks run only for a
// server that listens itself): this module keeps every deadline instead.
//
//   sniffing    first bytes (HTTP/1.1 or the HTTP/2 preface) within firstBytesTimeoutMs
//   HTTP/1.1    a complete request head within headersTimeoutMs of the start, and
//               within keepAliveTimeoutMs + headersTimeoutMs of the end of the
//               previous answer (Node closes a silent keep-alive socket after
//               keepAliveTimeoutMs; this deadline catches one that dribbles)
//   HTTP/2      an open stream within http2IdleTimeoutMs, else GOAWAY and close
//
// A connection with a request (or stream) in progress has no deadline: a
// sync run may last 12 hours.
import { readFileSync } from "node:fs";
import type http2 from "node:http2";
import type net from "node:net";
import type { Config, Logger } from "../config/index.js";

/** The settings of the same names (config.ts says what each means). */
export type ConnectionLimits = Pick<
  Config,
  | "firstBytesTimeoutMs"
  | "headersTimeoutMs"
  | "keepAliveTimeoutMs"
  | "http2IdleTimeoutMs"
  | "maxConnections"
  | "maxConnectionsPerAddress"
>;

/** Used when the open-file limit cannot be read. */
export const FALLBACK_MAX_CONNECTIONS = 4096;

/** After GOAWAY, how long an HTTP/2 peer has to close before the socket is destroyed. */
const GOAWAY_GRACE_MS = 1_000;
/** At most one log line per kind of refusal in this interval. */
const REFUSAL_LOG_INTERVAL_MS = 10_000;

/** The soft open-file limit of this process (`ulimit -n`), from /proc on Linux; undefined elsewhere. */
export function openFileLimit(limits = "/proc/self/limits"): number | undefined {
  try {
    const line = readFileSync(limits, "utf8")
      .split("\n")
      .find((l) => l.startsWith("Max open files"));
    const soft = line?.slice("Max open files".length).trim().split(/\s+/)[0];
    if (soft === undefined || !/^\d+$/.test(soft)) return undefined; // "unlimited"
    return Number(soft);
  } catch {
    return undefined;
  }
}

/** The cap on open connections: the setting, else half the open-file limit (the rest is for NATS, replicas, files). */
export function connectionCap(setting: number | undefined): number {
  if (setting !== undefined) return setting;
  const files = openFileLimit();
  return files === undefined ? FALLBACK_MAX_CONNECTIONS : Math.max(1, Math.floor(files / 2));
}

export type Phase = "sniffing" | "http1" | "http2";

export class Connection {
  phase: Phase = "sniffing";
  /** Requests (HTTP/1.1) or streams (HTTP/2) in progress. */
  busy = 0;
  session: http2.ServerHttp2Session | undefined;
  timer: NodeJS.Timeout | undefined;
  constructor(
    readonly socket: net.Socket,
    readonly address: string,
  ) {}
}

export class ConnectionGuard {
  readonly maxConnections: number;
  private readonly all = new Map<net.Socket, Connection>();
  /** Connections without a request in progress, longest idle first (a Set keeps insertion order). */
  private readonly idle = new Set<Connection>();
  private readonly perAddress = new Map<string, number>();
  private readonly lastLogged = new Map<string, number>();
  private stopping = false;

  constructor(
    private readonly limits: ConnectionLimits,
    private readonly logger: Logger,
  ) {
    this.maxConnections = connectionCap(limits.maxConnections);
  }

  get size(): number {
    return this.all.size;
  }

  /**
   * A new socket: counted and given its first-bytes deadline, or refused
   * (destroyed; undefined) when its address is at its cap, or when every
   * connection is busy at the total cap. At the total cap, the longest-idle
   * connection is closed to make room.
   */
  admit(socket: net.Socket): Connection | undefined {
    const address = normalizeAddress(socket.remoteAddress);
    if (address === undefined || this.stopping) {
      socket.destroy();
      return undefined;
    }
    if ((this.perAddress.get(address) ?? 0) >= this.limits.maxConnectionsPerAddress) {
      this.refused("address", { address, cap: this.limits.maxConnectionsPerAddress });
      socket.destroy();
      return undefined;
    }
    if (this.all.size >= this.maxConnections) {
      const oldest = this.idle.values().next().value;
      if (!oldest) {
        this.refused("total", { cap: this.maxConnections });
        socket.destroy();
        return undefined;
      }
      this.refused("evicted", { cap: this.maxConnections });
      this.drop(oldest);
      oldest.socket.destroy();
    }
    const conn = new Connection(socket, address);
    this.all.set(socket, conn);
    this.idle.add(conn);
    this.perAddress.set(address, (this.perAddress.get(address) ?? 0) + 1);
    socket.once("close", () => this.drop(conn));
    this.deadline(conn, this.limits.firstBytesTimeoutMs);
    return conn;
  }

  /** The sniff decided HTTP/1.1: the first request head is due. */
  startHttp1(conn: Connection): void {
    conn.phase = "http1";
    this.deadline(conn, this.limits.headersTimeoutMs);
  }

  /** The sniff decided HTTP/2 and the http2 server made a session for the socket. */
  startHttp2(conn: Connection, session: http2.ServerHttp2Session): void {
    conn.phase = "http2";
    conn.session = session;
    this.deadline(conn, this.limits.http2IdleTimeoutMs);
    session.on("stream", (stream: http2.ServerHttp2Stream) => {
      this.begin(conn);
      stream.once("close", () => this.end(conn, this.limits.http2IdleTimeoutMs));
    });
  }

  /** An HTTP/1.1 request whose head has arrived, on the given socket; its end starts the next deadline. */
  http1Request(socket: net.Socket, response: { once(event: "close", listener: () => void): unknown }): void {
    const conn = this.all.get(socket);
    if (!conn) return;
    this.begin(conn);
    response.once("close", () => this.end(conn, this.limits.keepAliveTimeoutMs + this.limits.headersTimeoutMs));
  }

  /** Shutting down: no new connections; idle HTTP/1.1 and sniffing ones close now, HTTP/2 sessions get GOAWAY. */
  stop(): void {
    this.stopping = true;
    for (const conn of [...this.all.values()]) {
      if (conn.phase === "http2") conn.session?.close();
      else if (conn.busy === 0) conn.socket.destroy();
    }
  }

  /** Closes every connection, busy or not. */
  destroyAll(): void {
    for (const conn of [...this.all.values()]) {
      conn.session?.destroy();
      conn.socket.destroy();
    }
  }

  private begin(conn: Connection): void {
    if (conn.busy++ === 0) {
      this.idle.delete(conn);
      this.clear(conn);
    }
  }

  private end(conn: Connection, deadlineMs: number): void {
    if (--conn.busy > 0 || !this.all.has(conn.socket)) return;
    this.idle.add(conn);
    this.deadline(conn, deadlineMs);
  }

  /** Closes the connection unless a request starts (or the phase changes) within ms. */
  private deadline(conn: Connection, ms: number): void {
    this.clear(conn);
    conn.timer = setTimeout(() => this.expire(conn), ms);
    conn.timer.unref();
  }

  private expire(conn: Connection): void {
    conn.timer = undefined;
    if (conn.busy > 0) return;
    if (conn.session && !conn.session.closed && !conn.session.destroyed) {
      conn.session.close(); // GOAWAY; no stream is open, so the session ends now
      setTimeout(() => conn.socket.destroy(), GOAWAY_GRACE_MS).unref();
      return;
    }
    conn.socket.destroy();
  }

  private clear(conn: Connection): void {
    if (conn.timer) clearTimeout(conn.timer);
    conn.timer = undefined;
  }

  private drop(conn: Connection): void {
    if (!this.all.delete(conn.socket)) return;
    this.clear(conn);
    this.idle.delete(conn);
    const left = (this.perAddress.get(conn.address) ?? 1) - 1;
    if (left > 0) this.perAddress.set(conn.address, left);
    else this.perAddress.delete(conn.address);
  }

  private refused(kind: "address" | "total" | "evicted", details: Record<string, unknown>): void {
    const now = Date.now();
    if (now - (this.lastLogged.get(kind) ?? -Infinity) < REFUSAL_LOG_INTERVAL_MS) return;
    this.lastLogged.set(kind, now);
    const message = {
      address: "connection refused: its address is at SKIFF_MAX_CONNECTIONS_PER_ADDRESS",
      total: "connection refused: SKIFF_MAX_CONNECTIONS reached and every connection is busy",
      evicted: "SKIFF_MAX_CONNECTIONS reached: closing the longest-idle connection",
    }[kind];
    this.logger.warn({ ...details, open: this.all.size }, message);
  }
}

/** "::ffff:10.0.0.1" and "10.0.0.1" are one address. */
function normalizeAddress(address: string | undefined): string | undefined {
  if (address === undefined) return undefined;
  return address.startsWith("::ffff:") && address.includes(".") ? address.slice(7) : address;
}
