// One replica: a child process serving HTTP. Sandboxed (the default, see
// sandbox.ts), it runs in its own namespaces and the runner reaches it only
// through a Unix socket that the runner creates in the replica's folder and
// hands over as fd 3 (its channel); unsandboxed (SKIFF_SANDBOX=off), it runs
// in its own working folder and process group, serving 127.0.0.1:port. It
// knows how to start (until its healthcheck answers 200), answer one HTTP
// exchange, be probed, and stop (SIGTERM, then SIGKILL after a grace; in a
// sandbox SIGKILL ends every process inside). Scheduling is the pool's.
import { spawn, type ChildProcess } from "node:child_process";
import { closeSync, existsSync, openSync, realpathSync } from "node:fs";
import http from "node:http";
import { createHash } from "node:crypto";
import { lstat, mkdir, rename, rm } from "node:fs/promises";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { Readable } from "node:stream";
import { Client, Pool, util as undiciUtil, type buildConnector, type Dispatcher } from "undici";
import type { Logger } from "../config/index.js";
import { requestBodyFailed, StartFailed } from "../runs/index.js";
import type { StreamedRequestBody } from "../server/index.js";
import { readLines } from "./log-lines.js";
import { ReplicaAgent, type NetnsConnector } from "./netns-connect.js";
import { makeWorkDir, REPLICA_PATH, replicaEnv } from "./replica-env.js";
import { exitSignal, signalSandbox, spawnSandboxed, type SandboxedProcess } from "./sandbox.js";
import { APP_MOUNT, type SandboxLimits, type SandboxNetwork } from "./sandbox-argv.js";
import type { SandboxHost } from "./sandbox-host.js";
import type { AppLogLine, ReplicaInfo, ReplicaState } from "./types.js";

/** How long after a run's answer a line of the replica still counts as that run's. */
const LATE_LINE_MS = 250;

export interface ReplicaSpec {
  projectId: string;
  appName: string;
  version: number;
  replicaId: string;
  /** Deployment folder: shared read-only in a sandbox, else copied to workDir. */
  source: string;
  /** The replica's own folder: its channel in a sandbox, else its working folder. */
  workDir: string;
  command: string;
  args: string[];
  env: Record<string, string>;
  port: number;
  healthcheck: string;
  startTimeoutMs: number;
  /** Set: run in a sandbox with this uid and these limits. */
  sandbox?: { host: SandboxHost; uid: number; limits: SandboxLimits; network?: SandboxNetwork; storage?: string };
  /** The program a sandboxed command finally runs (a Custom app's, behind the relay), checked before starting. */
  commandCheck?: string;
  /** Where commandCheck is looked for on this machine: the replicas' PATH, after the app's venv when it has one. */
  commandPath?: string[];
  /** A sandboxed Custom app: it listens on `port` in the sandbox's network namespace, behind the relay. */
  relayed?: boolean;
  /** Connections the runner keeps to it for requests: the requests it runs at once (replica_concurrency). */
  connections?: number;
}

/** The channel's socket in a replica's folder. */
/** Output a replica may make the runner read in a second (characters); past it, reading waits for the next one. */
export const LOG_BYTES_PER_SECOND = 4 * 1024 * 1024;
export const CHANNEL_SOCKET = "channel.sock";
/** How long a sandboxed replica taken out of routing gets before SIGTERM, for requests already on their way. */
const DRAIN_SETTLE_MS = 50;
/** What runtimes write when an allocation fails (V8's fatal OOM, Python's MemoryError, malloc, C++'s new). */
const OUT_OF_MEMORY = /out of memory|MemoryError|Allocation failed|Cannot allocate memory|std::bad_alloc/i;
/** Longest Unix socket path with room for the ".new" of its binding (sun_path holds 107 bytes). */
const MAX_SOCKET_PATH = 100;

/**
 * Where a replica's channel socket goes: its own folder, or, when that path
 * is too long for a Unix socket, a private folder of this user under the
 * system's temporary folder (0700, checked to be ours).
 */
export function channelPath(workDir: string, replicaId: string): string {
  const inFolder = path.join(workDir, CHANNEL_SOCKET);
  if (Buffer.byteLength(inFolder) <= MAX_SOCKET_PATH) return inFolder;
  const short = createHash("sha256").update(workDir).update(replicaId).digest("hex").slice(0, 16);
  return path.join(os.tmpdir(), `skiff-channels-${process.getuid?.() ?? 0}`, `${short}.sock`);
}

async function privateFolder(dir: string): Promise<void> {
  await mkdir(dir, { recursive: true, mode: 0o700 });
  const st = await lstat(dir);
  if (!st.isDirectory() || st.uid !== process.getuid?.() || (st.mode & 0o077) !== 0)
    throw new StartFailed(`${dir} is not a private folder of this user; cannot place replica channels there`);
}

/** The system folders a sandbox sees as the host has them (read-only): the only host paths worth looking at. */
const SYSTEM_ROOTS = ["/usr/", "/bin/", "/sbin/", "/lib/", "/lib64/"];

/**
 * Whether a command would be found in a sandbox: on the replica PATH, a file
 * of the app, or a program of the system folders. Paths are taken as the
 * sandbox sees them: anything else is "not found" without looking at the
 * host, whose other files an app must not learn of.
 */
export function commandExists(
  command: string,
  appDir: string,
  /** The folders of the PATH it is looked for in, on this machine: a venv's first, then the replicas'. */
  searchPath: readonly string[] = REPLICA_PATH.split(":"),
): boolean {
  const system = (p: string) => SYSTEM_ROOTS.some((root) => p.startsWith(root));
  const root = realpathSync(appDir);
  // Links are followed on the host here, where a link of the app's or of the system folders may lead out of what
  // a sandbox sees (/usr/share/x/conf -> /etc/x): only a real path that stays in the app folder or the system
  // folders counts, whether it exists or not.
  const seen = (host: string) => {
    try {
      const real = realpathSync(host);
      return real.startsWith(root + "/") || system(real);
    } catch {
      return false;
    }
  };
  if (!command.includes("/"))
    // The app's own folder on the PATH (its venv's bin, made by its build) is the app's: looked at as its files are.
    return searchPath.some((dir) =>
      dir === appDir || dir.startsWith(appDir + "/")
        ? seen(path.join(dir, command))
        : existsSync(path.join(dir, command)),
    );
  const inside = path.posix.resolve(APP_MOUNT, command);
  const app = inside.startsWith(APP_MOUNT + "/");
  if (!app && !system(inside)) return false;
  return seen(app ? path.join(appDir, inside.slice(APP_MOUNT.length)) : inside);
}

/** Listens on a Unix socket and gives back its fd; the runner's own copy is closed once the child has it. */
function listenChannel(socketPath: string): Promise<net.Server> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.on("error", reject);
    // Exclusive: in a worker of SKIFF_WORKERS, a plain listen would be made by the supervisor, in its own process.
    server.listen({ path: socketPath, exclusive: true }, () => resolve(server));
  });
}

export interface ReplicaHooks {
  /** The runner's keep-alive agent, for health probes; requests go through the replica's own pool (see send). */
  agent: http.Agent;
  /** Makes connections inside sandboxes, for a relayed app's requests to go straight to it. */
  netns?: NetnsConnector;
  logger: Logger;
  onLog?: (line: AppLogLine) => void;
  /** Lines it may log per second (SKIFF_REPLICA_LOG_LINES_PER_SECOND); those past it are dropped. Default: no limit. */
  logLinesPerSecond?: number;
  /** Lines dropped, counted once a second while it drops some. */
  onLogsDropped?: (projectId: string, appName: string, lines: number) => void;
  /** The process ended, whoever ended it. */
  onExit: (replica: Replica, code: number | null, signal: NodeJS.Signals | null) => void;
}

export interface Exchange {
  status: number;
  headers: http.IncomingHttpHeaders;
  /** The whole body; empty when it streams. */
  body: Buffer;
  /** The answer's body still being read, when it streams. */
  stream?: AnswerBody;
}

const EMPTY = Buffer.alloc(0);

/**
 * An answer larger than the most the caller reads whole: the connection is
 * closed at once, before more of it arrives. `bytes` is its Content-Length,
 * or what had arrived.
 */
export class AnswerTooLarge extends Error {
  override name = "AnswerTooLarge";
  constructor(
    readonly bytes: number,
    readonly limit: number,
  ) {
    super(`the answer is ${bytes} bytes or more, more than ${limit}`);
  }
}

/**
 * Whether an answer streams: its length is not known in advance (chunked,
 * or until the connection closes), it is server-sent events, or it is
 * larger than `above`. Any other answer arrives whole first, the fast path
 * of small answers.
 */
export function streams(status: number | undefined, headers: http.IncomingHttpHeaders, above = Infinity): boolean {
  if (status === 204 || status === 304) return false;
  const length = headers["content-length"];
  return (
    length === undefined ||
    Number(length) > above ||
    (headers["content-type"]?.startsWith("text/event-stream") ?? false)
  );
}

/**
 * Longest a connection to a replica stays idle in its pool; shorter still
 * when the replica announces less (`Keep-Alive: timeout=5`, less a margin).
 * Reusing a connection at the moment the replica's server closes it would
 * fail the run.
 */
export const REPLICA_IDLE_CONNECTION_MS = 4_000;

/** A request to a replica, as its caller holds it: destroying it aborts the exchange and closes its connection. */
export interface ReplicaRequest {
  destroy(err?: Error): void;
}

/** An answer's body as it streams from the replica, read at its reader's pace; its trailers once it has ended. */
export class AnswerBody extends Readable {
  trailers: NodeJS.Dict<string> = {};

  constructor(private readonly call: ReplicaCall) {
    super();
  }

  override _read(): void {
    this.call.resume();
  }

  override _destroy(err: Error | null, callback: (err?: Error | null) => void): void {
    // A reader that goes away before the end: nothing more of the answer is read, its connection is closed.
    this.call.destroy(err ?? undefined);
    callback(err);
  }
}

/** Header fields of which Node's parser keeps the first only, as the runner did when it read answers with it. */
const SINGLE_FIELDS = new Set([
  "age",
  "authorization",
  "content-length",
  "content-type",
  "etag",
  "expires",
  "from",
  "host",
  "if-modified-since",
  "if-unmodified-since",
  "last-modified",
  "location",
  "max-forwards",
  "proxy-authorization",
  "referer",
  "retry-after",
  "server",
  "user-agent",
]);

/** Raw header lines as Node's IncomingMessage gives them: lower-case names, repeats joined by ", " (Set-Cookie's kept apart). */
function answerHeaders(raw: readonly (Buffer | string)[] | null): http.IncomingHttpHeaders {
  const out: Record<string, string | string[]> = {};
  if (raw === null) return out;
  for (let i = 0; i < raw.length; i += 2) {
    const name = undiciUtil.headerNameToString(raw[i]);
    const field = raw[i + 1];
    const value = typeof field === "string" ? field : field.toString("latin1");
    const had = out[name];
    if (had === undefined) out[name] = name === "set-cookie" ? [value] : value;
    else if (Array.isArray(had)) had.push(value);
    else if (!SINGLE_FIELDS.has(name)) out[name] = `${had}, ${value}`;
  }
  return out;
}

const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
const FIELD_VALUE = /^[\t\x20-\x7e\x80-\xff]*$/;
const REQUEST_PATH = /^\/[\u0021-\u00ff]*$/;
/** Request header fields undici sets itself or refuses to send. */
const UNDICI_FIELDS = new Set(["connection", "expect", "host", "keep-alive", "transfer-encoding", "upgrade"]);

/**
 * Why undici would refuse to send this request (a method, path or header it
 * does not write), or undefined when it sends it.
 */
export function unsendableRequest(method: string, path: string, headers: http.OutgoingHttpHeaders): string | undefined {
  if (!TOKEN.test(method)) return "the method is not an HTTP token";
  if (!REQUEST_PATH.test(path)) return "the path has a character a request line cannot carry";
  for (const name in headers) {
    const value = headers[name];
    if (value === undefined) continue;
    if (!TOKEN.test(name)) return "a header name is not an HTTP token";
    if (UNDICI_FIELDS.has(name.toLowerCase())) return `header ${name} is the connection's`;
    if (Array.isArray(value) ? !value.every(isFieldValue) : !isFieldValue(value))
      return `header ${name} has a character a field value cannot carry`;
  }
  return undefined;
}

function isFieldValue(value: string | number): boolean {
  return FIELD_VALUE.test(String(value));
}

/** Connects to a replica's channel socket or 127.0.0.1:port; `connected` has the socket once it is connected. */
function connectPlain(
  endpoint: { socketPath?: string; host: string; port: number },
  connected: (socket: net.Socket) => void,
  callback: buildConnector.Callback,
): void {
  const socket =
    endpoint.socketPath !== undefined
      ? net.connect(endpoint.socketPath)
      : net.connect({ host: endpoint.host, port: endpoint.port, noDelay: true });
  const failed = (err: Error) => callback(err, null);
  socket.once("error", failed);
  socket.once("connect", () => {
    socket.off("error", failed);
    connected(socket);
  });
}

const CANCELLED = "the request to the replica was cancelled";
/**
 * Informational (1xx) heads an answer may have before its final one: a few
 * 103 Early Hints or 102 Processing are what servers send; past this many the
 * exchange fails.
 */
export const MAX_INFORMATIONAL_ANSWERS = 32;

/**
 * What a pooled connection may read for an answer beyond its body, its heads
 * (each counted as the most undici takes of one) and FRAMING_BYTES_PER_CHUNK
 * a piece of body: chunk framing and trailers, and what the socket has read
 * ahead of the parser. undici parses framing on the runner's thread and hands
 * none of it on, so an answer of framing without end (a chunk extension that
 * never ends) would hold the thread until the run's response_grace_period;
 * past this bound the exchange fails and its connection is closed.
 */
export const MAX_FRAMING_BYTES = 1024 * 1024;
/**
 * What each piece of body delivered adds to what its connection may read, on
 * top of the piece itself: its chunk's size line, extensions and line ends.
 * Answers of many small chunks, extensions of a few dozen bytes or not, stay
 * far from MAX_FRAMING_BYTES however long they are; a piece that carries more
 * framing than this uses up the bound. What pieces leave unused is not saved
 * beyond MAX_FRAMING_BYTES ahead of what the connection has read, so many
 * pieces never buy one long run of framing.
 */
export const FRAMING_BYTES_PER_CHUNK = 256;
/**
 * What a pooled connection may read while no exchange runs on it: an HTTP/1.1
 * server sends nothing between answers, and line ends there are skipped by
 * the parser without a word, so an app sending them without end held the
 * runner's thread until the connection's idle timeout. Past it the
 * connection is closed.
 */
export const MAX_IDLE_BYTES = 4 * 1024;

/** The exchange a pooled socket runs now, for the check of what the socket reads (see ReplicaClient). */
const EXCHANGE = Symbol("exchange");
/** The socket's bytesRead when its last exchange ended. */
const IDLE_FROM = Symbol("idleFrom");
type ReplicaSocket = net.Socket & { [EXCHANGE]?: ReplicaCall; [IDLE_FROM]?: number };

/**
 * Each time a pooled socket has read more: its exchange checks that it has
 * not read more than it may; with no exchange on it, more than
 * MAX_IDLE_BYTES since the last one ends it.
 */
function onSocketReadable(this: ReplicaSocket): void {
  const exchange = this[EXCHANGE];
  if (exchange !== undefined) exchange.socketHasRead(this.bytesRead);
  else if (this.bytesRead - (this[IDLE_FROM] ?? 0) > MAX_IDLE_BYTES)
    this.destroy(new Error(`the app sent more than ${MAX_IDLE_BYTES} bytes on an idle connection`));
}

/**
 * One exchange with a replica, as the handler undici's pool calls while it
 * runs (see Replica.send): it collects a whole answer, or hands over a
 * streamed one as an AnswerBody at its head.
 */
class ReplicaCall implements Dispatcher.DispatchHandler, ReplicaRequest {
  private abort: ((err: Error) => void) | undefined;
  /** Why the exchange was destroyed before undici gave it a way to abort. */
  private early: Error | undefined;
  private resumeAnswer: (() => void) | undefined;
  /** The exchange has ended: answered whole, streamed to its end, or failed. */
  private ended = false;
  /** The caller has its answer (or its error). */
  private settled = false;
  private status = 0;
  /** Informational (1xx) heads of the answer so far. */
  private informational = 0;
  private headers: http.IncomingHttpHeaders = {};
  private chunks: Buffer[] = [];
  private size = 0;
  private stream: AnswerBody | undefined;
  /** Why the caller's streamed body broke: the run's error rather than the failed request's. */
  private broke: Error | undefined;
  /** The pooled connection undici runs the exchange on (set as it is dispatched there). */
  connection: ReplicaClient | undefined;
  /** The connection's socket while the exchange runs on it. */
  private socket: ReplicaSocket | undefined;
  /** The socket's bytesRead when the exchange was written on it. */
  private readFrom = 0;
  /** What the socket may read for the exchange: MAX_FRAMING_BYTES, and more for each head and piece of body delivered. */
  private mayRead = MAX_FRAMING_BYTES;

  constructor(
    private readonly resolve: (ex: Exchange) => void,
    private readonly reject: (err: Error) => void,
    private readonly mayStream: boolean,
    private readonly streamAbove: number,
    private readonly maxBody: number,
  ) {}

  /** The caller's streamed body, whose failure is the run's (RequestBodyFailed). */
  async *requestBody(body: StreamedRequestBody): AsyncGenerator<Uint8Array> {
    try {
      yield* body.chunks();
    } catch (err) {
      throw (this.broke = requestBodyFailed(err));
    }
  }

  destroy(err: Error = new Error(CANCELLED)): void {
    if (this.ended) return;
    if (this.abort) this.abort(err);
    else {
      this.early = err;
      this.onError(err);
    }
  }

  resume(): void {
    this.resumeAnswer?.();
  }

  onConnect(abort: (err?: Error) => void): void {
    if (this.early) return abort(this.early);
    this.abort = abort;
    // Called as undici writes the request on the connection's current socket (one exchange at a time on it).
    const socket = this.connection?.currentSocket;
    if (socket === undefined) return;
    this.socket = socket;
    this.readFrom = socket.bytesRead;
    socket[EXCHANGE] = this;
  }

  /**
   * Its socket has read `bytesRead` bytes in all: more for the exchange
   * than its body, its heads and their allowances (see MAX_FRAMING_BYTES),
   * and it fails at once, its connection closed.
   */
  socketHasRead(bytesRead: number): void {
    if (bytesRead - this.readFrom <= this.mayRead) return;
    this.fail(
      new Error(
        `the app sent more than ${MAX_FRAMING_BYTES} bytes of chunk framing (sizes, extensions) beyond what its answer's body and heads allow`,
      ),
    );
  }

  /** The exchange has ended: what its socket reads from here on is no longer its. */
  private unwatch(): void {
    const socket = this.socket;
    if (socket?.[EXCHANGE] !== this) return;
    socket[EXCHANGE] = undefined;
    socket[IDLE_FROM] = socket.bytesRead;
  }

  /** Raises what the socket may read by `bytes`, saving no more than MAX_FRAMING_BYTES ahead of what it has read. */
  private allow(bytes: number): void {
    const read = this.socket === undefined ? 0 : this.socket.bytesRead - this.readFrom;
    this.mayRead = Math.min(this.mayRead + bytes, read + MAX_FRAMING_BYTES);
  }

  onHeaders(status: number, raw: Buffer[], resume: () => void): boolean {
    this.allow(http.maxHeaderSize); // the most undici takes of a head
    if (status < 200 && status >= 100) {
      // Informational: the answer follows. Each head costs the runner's thread a parse and a call while the app's
      // writes never wait for a reader, so an app sending them without end is stopped here, not at its grace period.
      if (++this.informational <= MAX_INFORMATIONAL_ANSWERS) return true;
      return this.fail(
        new Error(`the app sent more than ${MAX_INFORMATIONAL_ANSWERS} informational (1xx) heads before its answer`),
      );
    }
    this.status = status;
    this.headers = answerHeaders(raw);
    if (this.mayStream && streams(status, this.headers, this.streamAbove)) {
      this.resumeAnswer = resume;
      const stream = (this.stream = new AnswerBody(this));
      stream.on("error", () => {}); // its reader sees the error; an unread one is no crash of the runner
      this.settle({ status, headers: this.headers, body: EMPTY, stream });
      return true;
    }
    const length = Number(this.headers["content-length"]);
    if (length > this.maxBody) return this.tooLarge(length);
    return true;
  }

  onData(chunk: Buffer): boolean {
    this.allow(chunk.byteLength + FRAMING_BYTES_PER_CHUNK);
    if (this.stream) return this.stream.push(chunk);
    if (this.settled) return false;
    this.size += chunk.byteLength;
    if (this.size > this.maxBody) return this.tooLarge(this.size);
    this.chunks.push(chunk);
    return true;
  }

  onComplete(rawTrailers: (Buffer | string)[] | null): void {
    this.ended = true;
    this.unwatch();
    if (this.stream) {
      this.stream.trailers = answerHeaders(rawTrailers) as NodeJS.Dict<string>; // no Set-Cookie in trailers
      this.stream.push(null);
      return;
    }
    const chunks = this.chunks;
    const answer = {
      status: this.status,
      headers: this.headers,
      body: chunks.length === 1 ? chunks[0] : chunks.length === 0 ? EMPTY : Buffer.concat(chunks),
    };
    // What the app printed before answering is already in its stdout pipe: let the next poll of the
    // event loop read it while the run is still in flight, so the line names this run, not the next.
    setImmediate(() => setImmediate(() => this.settle(answer)));
  }

  onError(err: Error): void {
    this.ended = true;
    this.unwatch();
    const why = this.broke ?? err;
    if (this.stream) this.stream.destroy(why);
    else if (!this.settled) {
      this.settled = true;
      this.chunks.length = 0;
      this.reject(why);
    }
  }

  private settle(ex: Exchange): void {
    if (this.settled) return;
    this.settled = true;
    this.resolve(ex);
  }

  /** An answer larger than the caller takes: rejected at once, and its connection closed before more of it comes. */
  private tooLarge(bytes: number): false {
    return this.fail(new AnswerTooLarge(bytes, this.maxBody));
  }

  /** Rejects the exchange with `err` and closes its connection: nothing more of the answer is read. */
  private fail(err: Error): false {
    this.onError(err);
    this.abort?.(err);
    return false;
  }
}

/**
 * One pooled connection to a replica, which undici runs one exchange at a
 * time on (pipelining 1): it knows its current socket, and each exchange
 * dispatched to it learns the connection it runs on, so that what the socket
 * reads is counted against what the exchange delivers (see ReplicaCall.socketHasRead).
 */
class ReplicaClient extends Client {
  currentSocket: ReplicaSocket | undefined;

  /** A new socket of the connection: watched while it reads. */
  watch(socket: net.Socket): void {
    socket.on("readable", onSocketReadable);
    this.currentSocket = socket;
  }

  override dispatch(options: Dispatcher.DispatchOptions, handler: Dispatcher.DispatchHandler): boolean {
    if (handler instanceof ReplicaCall) handler.connection = this;
    return super.dispatch(options, handler);
  }
}

/** How many stderr lines a StartFailed quotes. */
const START_ERROR_LINES = 20;
const PROBE_INTERVAL_MS = 25;

export class Replica {
  state: ReplicaState = "starting";
  /** False while a readycheck fails. */
  routable = true;
  inFlight = 0;
  /** When the last request ended, for the cooldown. */
  idleSince = Date.now();
  /** Consecutive failed healthchecks. */
  healthFailures = 0;
  /** Set by stop(): an exit after it is no crash. */
  stopping = false;
  /** Why the replica is being stopped, for the requests that it still runs. */
  stopReason: Error | undefined;
  /** When start() succeeded; undefined for a replica that never got ready. */
  readyAt: number | undefined;
  readonly startedAt = new Date();
  /** A health probe is under way. */
  probing = false;
  /** Gives back a fixed port when the process has ended. */
  releasePort: (() => void) | undefined;
  /** Run ids in flight, so a log line can name its run when there is one. */
  private readonly runs = new Set<string>();
  /** The run that ended last while no other ran, and when: its last lines may come after its answer. */
  private lastRun: { id: string; endedAt: number } | undefined;
  /** When the current second of logging began (Date.now()) and the lines logged in it. */
  private logSecond = 0;
  private logLines = 0;
  /** Characters of output read in the current second, and whether reading waits for the next one. */
  private logBytes = 0;
  private outputPaused = false;
  /** Lines dropped since the last report, which a timer makes at the end of the second that dropped them. */
  private droppedLines = 0;
  private dropReport: NodeJS.Timeout | undefined;
  private child: ChildProcess | undefined;
  private sandboxed: SandboxedProcess | undefined;
  /** The channel's socket path, when sandboxed. */
  private readonly channel: string | undefined;
  /** New connections go straight to the app (see goDirect). */
  private direct = false;
  /** Keep-alive connections for requests (see dispatcher). */
  private pool: Pool | undefined;

  /**
   * Where requests go: the channel's socket, or 127.0.0.1:port (the port may
   * be chosen after construction). With a socket, host and port are those
   * http.request fills in, so that the agent's pool name matches getName(endpoint).
   */
  private get endpoint(): { socketPath?: string; host: string; port: number } {
    return this.channel
      ? { socketPath: this.channel, host: "localhost", port: 80 }
      : { host: "127.0.0.1", port: this.spec.port };
  }
  private closed = false;
  private readonly stderrTail: string[] = [];
  /** A line of its stderr said it ran out of memory. */
  private outOfMemory = false;
  /** Why the process ended on its own when a sandbox limit ended it, once it has ended. */
  limitReason: string | undefined;
  /** How the process ended ("exit code 1", "signal SIGSEGV"), once it has. */
  endedWith: string | undefined;
  private readonly exited: Promise<void>;
  private markExited!: () => void;

  constructor(
    readonly spec: ReplicaSpec,
    private readonly hooks: ReplicaHooks,
  ) {
    this.exited = new Promise((resolve) => (this.markExited = resolve));
    this.channel = spec.sandbox ? channelPath(spec.workDir, spec.replicaId) : undefined;
  }

  get id(): string {
    return this.spec.replicaId;
  }

  get pid(): number | undefined {
    return this.child?.pid;
  }

  get alive(): boolean {
    return this.child !== undefined && this.child.exitCode === null && this.child.signalCode === null;
  }

  info(): ReplicaInfo {
    return {
      replicaId: this.id,
      state: this.state,
      routable: this.routable,
      inFlight: this.inFlight,
      deploymentVersion: this.spec.version,
      startedAt: this.startedAt,
      pid: this.pid,
    };
  }

  /** Spawns the command in its sandbox, with its channel as fd 3. */
  private async spawnSandboxed(): Promise<ChildProcess> {
    const s = this.spec;
    const program = s.commandCheck ?? s.command;
    if (!commandExists(program, s.source, s.commandPath))
      throw new StartFailed(`cannot start ${program}: spawn ${program} ENOENT`);
    await rm(s.workDir, { recursive: true, force: true });
    await mkdir(s.workDir, { recursive: true, mode: 0o700 });
    const socketPath = this.endpoint.socketPath!;
    if (path.dirname(socketPath) !== s.workDir) await privateFolder(path.dirname(socketPath));
    // libuv removes a listening socket's path when it closes: bind a name, then move the socket to its own. The
    // name is bound through a descriptor of its folder, because the socket keeps the name it was bound with and
    // the app may read it (getsockname): /proc/self/fd/<n>/…, not the data folder's path.
    const folder = openSync(path.dirname(socketPath), "r");
    const name = `${path.basename(socketPath)}.new`;
    const binding = path.join(path.dirname(socketPath), name);
    let server: net.Server;
    try {
      server = await listenChannel(`/proc/self/fd/${folder}/${name}`);
    } catch (err) {
      closeSync(folder);
      throw err;
    }
    try {
      const fd = (server as unknown as { _handle: { fd: number } })._handle.fd;
      this.sandboxed = spawnSandboxed(s.sandbox!.host, {
        appDir: s.source,
        uid: s.sandbox!.uid,
        limits: s.sandbox!.limits,
        network: s.sandbox!.network,
        storage: s.sandbox!.storage,
        command: s.command,
        args: s.args,
        env: replicaEnv(s.env, APP_MOUNT, s.port),
        fds: [fd],
      });
      await rename(binding, socketPath);
    } finally {
      server.close(); // unlinks the bound name at once, through the folder's descriptor, still open
      closeSync(folder);
    }
    return this.sandboxed.child;
  }

  /** Spawns the command in a copy of the folder, in its own process group. */
  private async spawnPlain(): Promise<ChildProcess> {
    const s = this.spec;
    await makeWorkDir(s.source, s.workDir);
    return spawn(s.command, s.args, {
      cwd: s.workDir,
      env: replicaEnv(s.env, s.workDir, s.port),
      stdio: ["ignore", "pipe", "pipe"],
      detached: true, // its own process group: stop() reaches the app's children too
    });
  }

  /** Spawns the command (in its sandbox, or in a copy of the folder) and waits for the healthcheck. */
  async start(): Promise<void> {
    const s = this.spec;
    if (this.stopping) throw new StartFailed("the replica was stopped during start");
    const child = s.sandbox ? await this.spawnSandboxed() : await this.spawnPlain();
    this.child = child;
    let spawnError: Error | undefined;
    child.on("error", (err) => (spawnError = err));
    readLines(child.stdout!, (text) => this.log("stdout", text));
    readLines(child.stderr!, (text) => {
      this.stderrTail.push(text);
      if (s.sandbox && !this.outOfMemory && OUT_OF_MEMORY.test(text)) this.outOfMemory = true;
      if (this.stderrTail.length > START_ERROR_LINES) this.stderrTail.shift();
      this.log("stderr", text);
    });
    child.on("close", (code, signal) => {
      this.closed = true;
      this.reportDropped();
      this.state = "stopped";
      // A sandbox's signal comes as bwrap's exit code 128 + n.
      const sig = s.sandbox ? ((exitSignal(code, signal) ?? null) as NodeJS.Signals | null) : signal;
      this.endedWith = sig ? `signal ${sig}` : `exit code ${code}`;
      if (s.sandbox) this.limitReason = this.limitHit(sig ?? undefined);
      if (this.direct) {
        (this.hooks.agent as ReplicaAgent).route(this.channel!, undefined);
        this.hooks.netns?.close(this.channel!);
      }
      this.closePool();
      this.hooks.onExit(this, code, sig);
      // Stopped means its folder is gone too, so that a caller that waited may remove what holds it.
      const socket = this.endpoint.socketPath;
      const removeSocket = socket && path.dirname(socket) !== s.workDir ? rm(socket, { force: true }) : undefined;
      void Promise.all([rm(s.workDir, { recursive: true, force: true }), removeSocket]).finally(() =>
        this.markExited(),
      );
    });

    const deadline = Date.now() + s.startTimeoutMs;
    while (true) {
      if (spawnError) throw new StartFailed(`cannot start ${s.command}: ${spawnError.message}`, { cause: spawnError });
      if (!this.alive) {
        const sig = s.sandbox ? exitSignal(child.exitCode, child.signalCode) : undefined;
        const setup = this.sandboxed?.setupError?.();
        throw new StartFailed(
          `the replica exited during start (${sig ? `signal ${sig}` : `code ${child.exitCode ?? child.signalCode}`})${setup ? `: ${setup}` : ""}${this.stderrQuote()}`,
        );
      }
      if (this.stopping) throw new StartFailed("the replica was stopped during start");
      if ((await this.probe(s.healthcheck, 1000)) === 200) break;
      if (Date.now() > deadline) {
        this.kill();
        // A Custom app's own port is where it is asked: an app listening on another one never answers.
        const where = s.relayed ? ` on port ${s.port} (the app's port)` : "";
        throw new StartFailed(
          `${s.healthcheck}${where} did not answer 200 within ${s.startTimeoutMs} ms${this.stderrQuote()}`,
        );
      }
      await new Promise((r) => setTimeout(r, PROBE_INTERVAL_MS));
    }
    if (s.relayed) await this.goDirect();
    this.state = "ready";
    this.readyAt = this.idleSince = Date.now();
  }

  /**
   * A relayed app, once it answers: new connections go straight to it, made
   * inside its network namespace (netns-connect.ts), when this runner can;
   * through the relay otherwise. The probes' connection, made through the
   * relay (which waits for the app to listen), is dropped.
   */
  private async goDirect(): Promise<void> {
    const { netns, agent } = this.hooks;
    const pid = this.sandboxed?.initPid();
    const channel = this.channel;
    if (netns === undefined || !(agent instanceof ReplicaAgent) || channel === undefined || pid === undefined) return;
    if ((await netns.open(channel, pid)) !== undefined) return;
    if (this.closed) return netns.close(channel);
    const port = this.spec.port;
    agent.route(channel, () => netns.connect(channel, port));
    this.direct = true;
    this.dropIdleSockets();
  }

  /** Which sandbox limit most likely ended the process, from its signal and its last words. */
  /** The kernel ended a process of its cgroup for memory: known at once, before the replica has exited. */
  private cgroupOutOfMemory(): string | undefined {
    const l = this.spec.sandbox?.limits;
    // Evidence of its own, whoever else was stopping the replica (a quarantine that found it unresponsive).
    if (!l || !this.sandboxed?.oomKilled?.()) return undefined;
    return `it ran out of memory: its processes together used more than ${l.memoryMb} MiB (SKIFF_REPLICA_MEMORY_MB)`;
  }

  /** Why a sandbox limit ended it, or is ending it when that is known before its exit. */
  limitNow(): string | undefined {
    return this.limitReason ?? this.cgroupOutOfMemory();
  }

  private limitHit(sig: string | undefined): string | undefined {
    const l = this.spec.sandbox?.limits;
    // Each sign below is the limit's own (skiff stops replicas with SIGTERM and SIGKILL), so it holds even when
    // skiff was stopping the replica too: a quarantined replica dying of its memory limit still says so.
    if (!l) return undefined;
    if (sig === "SIGXFSZ") return `it wrote a file past the limit of ${l.fileMb} MiB (SKIFF_REPLICA_FILE_MB)`;
    if (sig === "SIGXCPU") return `it used its ${l.cpuSeconds} CPU seconds (SKIFF_REPLICA_CPU_SECONDS)`;
    const together = this.cgroupOutOfMemory();
    if (together) return together;
    if (this.outOfMemory)
      return `it ran out of memory: ${l.memoryMb} MiB of address space per process (SKIFF_REPLICA_MEMORY_MB)`;
    return undefined;
  }

  private stderrQuote(): string {
    return this.stderrTail.length > 0 ? `; its stderr ends with:\n${this.stderrTail.join("\n")}` : "";
  }

  startRun(runId: string): void {
    this.runs.add(runId);
    this.lastRun = undefined;
  }

  endRun(runId: string): void {
    this.runs.delete(runId);
    this.lastRun = this.runs.size === 0 ? { id: runId, endedAt: performance.now() } : undefined;
  }

  /** The run a line belongs to: the only one in flight, or the one that just ended (its output and its answer travel on different pipes). */
  private runOfLine(): string | undefined {
    if (this.runs.size === 1) for (const id of this.runs) return id;
    if (this.runs.size === 0 && this.lastRun && performance.now() - this.lastRun.endedAt < LATE_LINE_MS)
      return this.lastRun.id;
    return undefined;
  }

  private log(stream: "stdout" | "stderr", text: string): void {
    const now = Date.now();
    if (now - this.logSecond >= 1000) {
      this.logSecond = now;
      this.logLines = 0;
      this.logBytes = 0;
    }
    // Reading a flood costs the runner's thread however few of its lines are kept: past LOG_BYTES_PER_SECOND
    // the app's output is not read again before the second ends, and its writes wait on the full pipe. An app
    // that logs a line a request stays far below it.
    this.logBytes += text.length;
    if (this.logBytes > LOG_BYTES_PER_SECOND && !this.outputPaused) {
      this.outputPaused = true;
      this.readOutput(false);
      setTimeout(
        () => {
          this.outputPaused = false;
          this.readOutput(true);
        },
        this.logSecond + 1000 - now,
      ).unref();
    }
    const limit = this.hooks.logLinesPerSecond;
    if (limit !== undefined) {
      // Past the rate a line costs a comparison and a count: no publish, no record.
      if (this.logLines >= limit) {
        if (this.droppedLines++ === 0)
          this.dropReport = setTimeout(() => this.reportDropped(), this.logSecond + 1000 - now).unref();
        return;
      }
      this.logLines++;
    }
    this.emitLine(stream, text);
  }

  /** Pauses or resumes reading the app's stdout and stderr. */
  private readOutput(on: boolean): void {
    for (const stream of [this.child?.stdout, this.child?.stderr]) {
      if (on) stream?.resume();
      else stream?.pause();
    }
  }

  /** One line in the app's log saying how many were dropped since the last such line, and the count for metrics. */
  private reportDropped(): void {
    clearTimeout(this.dropReport);
    this.dropReport = undefined;
    const n = this.droppedLines;
    if (n === 0) return;
    this.droppedLines = 0;
    this.hooks.onLogsDropped?.(this.spec.projectId, this.spec.appName, n);
    this.emitLine("stderr", `[skiff] ${n} lines dropped (SKIFF_REPLICA_LOG_LINES_PER_SECOND)`);
  }

  private emitLine(stream: "stdout" | "stderr", text: string): void {
    const s = this.spec;
    const runId = this.runOfLine();
    this.hooks.logger.debug({ app: `${s.projectId}/${s.appName}`, replica: s.replicaId, stream, runId }, text);
    this.hooks.onLog?.({
      projectId: s.projectId,
      appName: s.appName,
      replicaId: s.replicaId,
      stream,
      runId,
      text,
      time: new Date(),
    });
  }

  /** Where a connection of its own reaches the app (a WebSocket's): the channel's socket, or 127.0.0.1:port. */
  get address(): { socketPath?: string; host: string; port: number } {
    return this.endpoint;
  }

  /**
   * GET path; the status, or 0 when the replica did not answer in time. On
   * the agent's connections, not the pool's: a replica whose every
   * connection is busy with a long request is still probed.
   */
  probe(path: string, timeoutMs: number): Promise<number> {
    return new Promise((resolve) => {
      // The whole exchange within timeoutMs: the socket's own timeout counts silence only, which an app that
      // answers a byte at a time, or with informational heads without end, never leaves.
      const deadline = setTimeout(() => req.destroy(), timeoutMs);
      const settle = (status: number) => {
        clearTimeout(deadline);
        resolve(status);
      };
      const req = http.get({ ...this.endpoint, path, agent: this.hooks.agent, timeout: timeoutMs }, (res) => {
        res.resume();
        res.on("end", () => settle(res.statusCode ?? 0));
        res.on("error", () => settle(0));
        res.on("close", () => settle(0)); // cut before its end (a settled promise keeps its first status)
      });
      let informational = 0;
      req.on("information", () => {
        if (++informational > MAX_INFORMATIONAL_ANSWERS) req.destroy();
      });
      req.on("timeout", () => req.destroy());
      req.on("error", () => settle(0));
    });
  }

  /**
   * One HTTP exchange with the replica, on its pool of keep-alive
   * connections; `onRequest` receives the request so the caller can abort
   * it. With `mayStream`, an answer that streams (see streams(), larger than
   * `streamAbove` among them) resolves as soon as its head arrives, with its
   * body to read as `stream`; any other answer resolves once it has arrived
   * whole, or rejects with AnswerTooLarge as soon as it is known to be larger
   * than `maxBody` (the request is then aborted: nothing more of it is read).
   * A streamed body is sent as it comes.
   */
  send(
    method: string,
    path: string,
    headers: http.OutgoingHttpHeaders,
    body: Uint8Array | StreamedRequestBody,
    onRequest: (req: ReplicaRequest) => void,
    mayStream = false,
    streamAbove = Infinity,
    maxBody = Infinity,
  ): Promise<Exchange> {
    return new Promise((resolve, reject) => {
      const call = new ReplicaCall(resolve, reject, mayStream, streamAbove, maxBody);
      onRequest(call);
      // Checked here, not by undici: a request it refuses leaves the pool counting a connection as busy until a
      // drain that never comes, and with one connection every later request to the replica waits for good.
      const unsendable = unsendableRequest(method, path, headers);
      if (unsendable !== undefined) return call.onError(new Error(`cannot send the request to the app: ${unsendable}`));
      try {
        this.dispatcher().dispatch(
          {
            method,
            path,
            headers: headers as Record<string, string>,
            // undici sends an async iterable chunked, or with the Content-Length given (its types name streams only).
            body: body instanceof Uint8Array ? body : (call.requestBody(body) as unknown as Readable),
          },
          call,
        );
      } catch (err) {
        call.onError(err as Error);
      }
    });
  }

  /** The replica's pool of keep-alive connections, made at its first request (and again after dropIdleSockets). */
  private dispatcher(): Pool {
    if (this.pool === undefined) {
      const origin = this.channel ? "http://localhost" : `http://127.0.0.1:${this.spec.port}`;
      this.pool = new Pool(origin, {
        connections: this.spec.connections ?? 1,
        pipelining: 1,
        keepAliveTimeout: REPLICA_IDLE_CONNECTION_MS,
        keepAliveMaxTimeout: REPLICA_IDLE_CONNECTION_MS,
        // A run's time is bounded by response_grace_period and its caller (AppPool), a streamed answer's by its reader.
        headersTimeout: 0,
        bodyTimeout: 0,
        factory: (origin, options) => {
          const client: ReplicaClient = new ReplicaClient(origin, {
            ...(options as Client.Options),
            connect: (_options, callback) => this.connectSocket(client, callback),
          });
          return client;
        },
      });
    }
    return this.pool;
  }

  /**
   * A new socket of a pooled connection to the app: made inside its network
   * namespace once it has a direct route (see goDirect), through its channel
   * if that fails or otherwise, or to 127.0.0.1:port.
   */
  private connectSocket(client: ReplicaClient, callback: buildConnector.Callback): void {
    const connected = (socket: net.Socket) => {
      client.watch(socket);
      callback(null, socket);
    };
    const netns = this.hooks.netns;
    if (this.direct && netns !== undefined && this.channel !== undefined)
      netns
        .connect(this.channel, this.spec.port)
        .then(connected, () => connectPlain(this.endpoint, connected, callback));
    else connectPlain(this.endpoint, connected, callback);
  }

  /** Closes the connection pool once its requests have ended; a later request makes a new one. */
  private closePool(): void {
    const pool = this.pool;
    this.pool = undefined;
    pool?.close().catch(() => undefined);
  }

  /** SIGTERM now; SIGKILL when the process is still there after `graceMs`. */
  async stop(graceMs: number): Promise<void> {
    this.stopping = true;
    if (this.state !== "stopped") this.state = "draining";
    if (this.child === undefined || this.closed) return;
    const timer = setTimeout(() => this.signal("SIGKILL"), graceMs);
    if (this.spec.sandbox) {
      // Requests written just before draining began may still be on their way through the channel (and a
      // Custom app's relay); a server that drains closes connections whose request it has not read yet.
      this.dropIdleSockets();
      await Promise.race([this.exited, new Promise((r) => setTimeout(r, DRAIN_SETTLE_MS))]);
    }
    this.signal("SIGTERM");
    this.dropIdleSockets();
    await this.exited;
    clearTimeout(timer);
  }

  /**
   * Closes the runner's idle keep-alive connections to the replica, and
   * those in use once their request ends: a server that drains on SIGTERM
   * waits for every connection to close. The health probes' connections
   * are the agent's.
   */
  dropIdleSockets(): void {
    this.closePool();
    const idle = this.hooks.agent.freeSockets[this.hooks.agent.getName(this.endpoint)];
    for (const socket of idle ?? []) socket.destroy();
  }

  kill(): void {
    this.stopping = true;
    this.signal("SIGKILL");
  }

  /** Waits until the process has ended (at once if it never started). */
  whenExited(): Promise<void> {
    return this.child ? this.exited : Promise.resolve();
  }

  private signal(sig: NodeJS.Signals): void {
    // The whole group: a leader that is gone may leave children behind.
    const pid = this.child?.pid;
    if (pid === undefined || this.closed) return;
    if (this.sandboxed) return signalSandbox(this.sandboxed, sig);
    try {
      process.kill(-pid, sig);
    } catch {
      // already gone
    }
  }
}
