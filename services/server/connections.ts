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
//
// In a worker of SKIFF_WORKERS the cap per address is the machine's: the
// supervisor, which hands each new connection to a worker, counts them all
// (workers.ts). Node's cluster hands a connection over without a word to
// the supervisor's code, so the worker asks: a new connection stays paused
// (nothing read from it reaches HTTP) until the supervisor says it fits, and
// the worker tells it when an admitted one closes. A refused one is closed
// as a lone process closes it, having served nothing.
import cluster from "node:cluster";
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

/** A worker's word to the supervisor about a connection from `address` (normalized). */
export type AddressReport =
  { skiff: "address-open"; id: number; address: string } | { skiff: "address-closed"; address: string };

/** The supervisor's answer to an "address-open" report: whether the connection fits its address's cap. */
export interface AddressVerdict {
  skiff: "address-verdict";
  id: number;
  admitted: boolean;
}

/** Counts connections per address beyond this process. */
export interface AddressLedger {
  /** Whether one more connection from the address fits; an admitted one counts until closed(address). */
  open(address: string, verdict: (admitted: boolean) => void): void;
  closed(address: string): void;
}

/** The ledger of a cluster worker: the supervisor's count, over IPC. */
class SupervisorLedger implements AddressLedger {
  private nextId = 0;
  private readonly waiting = new Map<number, (admitted: boolean) => void>();

  constructor(private readonly proc: NodeJS.Process) {
    proc.on("message", (m: unknown) => {
      if (!isVerdict(m)) return;
      const verdict = this.waiting.get(m.id);
      this.waiting.delete(m.id);
      verdict?.(m.admitted);
    });
    // No supervisor, no word: the worker is ending (cluster's disconnect); it takes no more connections.
    proc.on("disconnect", () => this.refuseWaiting());
  }

  open(address: string, verdict: (admitted: boolean) => void): void {
    const id = ++this.nextId;
    this.waiting.set(id, verdict);
    this.send({ skiff: "address-open", id, address }, () => {
      this.waiting.delete(id);
      verdict(false);
    });
  }

  closed(address: string): void {
    this.send({ skiff: "address-closed", address }, () => undefined);
  }

  private send(report: AddressReport, failed: () => void): void {
    if (!this.proc.connected || !this.proc.send) return failed();
    this.proc.send(report, undefined, {}, (err: Error | null) => {
      if (err) failed();
    });
  }

  private refuseWaiting(): void {
    const verdicts = [...this.waiting.values()];
    this.waiting.clear();
    for (const verdict of verdicts) verdict(false);
  }
}

function isVerdict(m: unknown): m is AddressVerdict {
  return typeof m === "object" && m !== null && (m as { skiff?: unknown }).skiff === "address-verdict";
}

function isReport(m: unknown): m is AddressReport {
  if (typeof m !== "object" || m === null) return false;
  const r = m as Partial<Record<string, unknown>>;
  if (typeof r.address !== "string") return false;
  return r.skiff === "address-closed" || (r.skiff === "address-open" && typeof r.id === "number");
}

/**
 * The supervisor's end: connections per address over every worker, as the
 * workers report them. A worker's "address-open" is counted and admitted
 * while its address is under the cap; its "address-closed" uncounts one.
 */
export class AddressCounts<W extends object> {
  private readonly all = new Map<string, number>();
  private readonly byWorker = new Map<W, Map<string, number>>();
  private readonly ended = new WeakSet<W>();

  constructor(readonly cap: number) {}

  /** A worker's message: the verdict to send it back for an "address-open", else undefined (not a report, or a close). */
  report(worker: W, message: unknown): AddressVerdict | undefined {
    if (!isReport(message)) return undefined;
    const { address } = message;
    if (message.skiff === "address-closed") {
      const own = this.byWorker.get(worker);
      if ((own?.get(address) ?? 0) > 0) this.add(worker, address, -1);
      return undefined;
    }
    const admitted = !this.ended.has(worker) && this.open(address) < this.cap;
    if (admitted) this.add(worker, address, 1);
    return { skiff: "address-verdict", id: message.id, admitted };
  }

  /** A worker ended: its connections ended with it. */
  forget(worker: W): void {
    this.ended.add(worker);
    for (const [address, n] of this.byWorker.get(worker) ?? []) this.add(worker, address, -n);
    this.byWorker.delete(worker);
  }

  /** Open connections from the address, over every worker. */
  open(address: string): number {
    return this.all.get(address) ?? 0;
  }

  private add(worker: W, address: string, n: number): void {
    let own = this.byWorker.get(worker);
    if (!own) this.byWorker.set(worker, (own = new Map()));
    for (const counts of [this.all, own]) {
      const left = (counts.get(address) ?? 0) + n;
      if (left > 0) counts.set(address, left);
      else counts.delete(address);
    }
  }
}

let workerLedger: AddressLedger | undefined;

/** In a cluster worker, the supervisor's count (one for the process); elsewhere none. */
export function supervisorLedger(): AddressLedger | undefined {
  if (!cluster.isWorker || process.send === undefined) return undefined;
  return (workerLedger ??= new SupervisorLedger(process));
}

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
  /** What waits for the requests in progress to end (an upgrade offer declined behind them). */
  whenIdle: (() => void)[] | undefined;
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
  /** Connections held paused until the ledger's verdict. */
  private readonly waiting = new Set<Connection>();
  private readonly lastLogged = new Map<string, number>();
  private stopping = false;

  constructor(
    private readonly limits: ConnectionLimits,
    private readonly logger: Logger,
    /** Where the cap per address is counted beyond this process too: by default, the supervisor of a cluster worker. */
    private readonly ledger: AddressLedger | undefined = supervisorLedger(),
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
   *
   * With a ledger (a cluster worker), the connection is returned paused and
   * counted once the ledger admits it: then it reads on, or it is closed
   * unread when the ledger finds its address at the cap (or the total cap
   * refuses it then). Its first-bytes deadline runs from now.
   */
  admit(socket: net.Socket): Connection | undefined {
    const address = normalizeAddress(socket.remoteAddress);
    if (address === undefined || this.stopping) {
      socket.destroy();
      return undefined;
    }
    if ((this.perAddress.get(address) ?? 0) >= this.limits.maxConnectionsPerAddress) {
      this.refusedAddress(socket, address);
      return undefined;
    }
    const conn = new Connection(socket, address);
    const ledger = this.ledger;
    if (ledger === undefined) {
      if (!this.count(conn)) return undefined;
      this.deadline(conn, this.limits.firstBytesTimeoutMs);
      return conn;
    }
    // Paused before the server's "data" listener comes: adding it does not resume a socket paused so.
    socket.pause();
    this.waiting.add(conn);
    this.deadline(conn, this.limits.firstBytesTimeoutMs);
    let closed = false;
    let counted = false;
    socket.once("close", () => {
      closed = true;
      if (counted) ledger.closed(address);
    });
    ledger.open(address, (admitted) => {
      this.waiting.delete(conn);
      if (closed) {
        this.clear(conn);
        if (admitted) ledger.closed(address);
        return;
      }
      // From here the close of an admitted connection is reported.
      counted = admitted;
      if (!admitted) {
        this.clear(conn);
        if (!socket.destroyed) this.refusedAddress(socket, address);
        return;
      }
      if (this.stopping || !this.count(conn)) {
        this.clear(conn);
        socket.destroy();
        return;
      }
      socket.resume();
    });
    return conn;
  }

  /** Counts an admitted connection, making room at the total cap; false (the socket destroyed) when there is none. */
  private count(conn: Connection): boolean {
    if (this.all.size >= this.maxConnections) {
      const oldest = this.idle.values().next().value;
      if (!oldest) {
        this.refused("total", { cap: this.maxConnections });
        conn.socket.destroy();
        return false;
      }
      this.refused("evicted", { cap: this.maxConnections });
      this.drop(oldest);
      oldest.socket.destroy();
    }
    this.all.set(conn.socket, conn);
    this.idle.add(conn);
    this.perAddress.set(conn.address, (this.perAddress.get(conn.address) ?? 0) + 1);
    conn.socket.once("close", () => this.drop(conn));
    return true;
  }

  private refusedAddress(socket: net.Socket, address: string): void {
    this.refused("address", { address, cap: this.limits.maxConnectionsPerAddress });
    socket.destroy();
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

  /**
   * Runs `then` once the HTTP/1.1 requests in progress on the socket have ended, at once when there are none;
   * never when the socket closes first.
   */
  afterRequests(socket: net.Socket, then: () => void): void {
    const conn = this.all.get(socket);
    if (!conn) return;
    if (conn.busy === 0) return then();
    (conn.whenIdle ??= []).push(then);
  }

  /** Shutting down: no new connections; idle HTTP/1.1 and sniffing ones close now, HTTP/2 sessions get GOAWAY. */
  stop(): void {
    this.stopping = true;
    for (const conn of this.waiting) conn.socket.destroy();
    for (const conn of [...this.all.values()]) {
      if (conn.phase === "http2") conn.session?.close();
      else if (conn.busy === 0) conn.socket.destroy();
    }
  }

  /** Closes every connection, busy or not. */
  destroyAll(): void {
    for (const conn of this.waiting) conn.socket.destroy();
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
    const waiting = conn.whenIdle;
    conn.whenIdle = undefined;
    if (waiting) for (const then of waiting) then();
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

/**
 * What connections are counted under, per SKIFF_MAX_CONNECTIONS_PER_ADDRESS:
 * an IPv4 address ("::ffff:10.0.0.1" and "10.0.0.1" are one), or an IPv6
 * address's /64 ("2001:db8:1:2::/64"), which is what one machine or one
 * customer of an ISP is given: counted per address, a client with a /64 would
 * have 2^64 caps.
 */
export function normalizeAddress(address: string | undefined): string | undefined {
  if (address === undefined) return undefined;
  if (address.startsWith("::ffff:") && address.includes(".")) return address.slice(7);
  return address.includes(":") ? ipv6Prefix64(address) : address;
}

/** The /64 of an IPv6 address in any spelling (a zone, "::", an IPv4 tail), as its first four groups. */
function ipv6Prefix64(address: string): string {
  const bare = address.split("%", 1)[0].toLowerCase();
  const split = bare.indexOf("::");
  const groups = (text: string) => (text === "" ? [] : text.split(":"));
  // An IPv4 tail ("::1.2.3.4") stands for two groups.
  const width = (parts: string[]) => parts.reduce((n, p) => n + (p.includes(".") ? 2 : 1), 0);
  let full: string[];
  if (split < 0) full = groups(bare);
  else {
    const head = groups(bare.slice(0, split));
    const tail = groups(bare.slice(split + 2));
    full = [...head, ...Array<string>(Math.max(0, 8 - width(head) - width(tail))).fill("0"), ...tail];
  }
  const first = full.slice(0, 4).map((g) => (/^[0-9a-f]{1,4}$/.test(g) ? parseInt(g, 16).toString(16) : "0"));
  while (first.length < 4) first.push("0");
  return `${first.join(":")}::/64`;
}
