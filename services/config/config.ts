// Configuration: defaults, overridden by SKIFF_* environment variables,
// validated once at start with a message that names the variable.
import { readFileSync } from "node:fs";
import { parseCidr, parsePrivateKey, parseSecretsKey } from "./parse.js";

export const DEFAULT_HOST = "127.0.0.1";
export const DEFAULT_PORT = 8080;
export const DEFAULT_DATA_DIR = ".data";
/** The file in the data folder where a running skiff writes the URL it serves, for the CLI to read. */
export const ADDRESS_FILE = "address";
export const DEFAULT_MAX_BODY_BYTES = 10 * 1024 * 1024;
export const DEFAULT_MAX_BUNDLE_BYTES = 100 * 1024 * 1024;
export const DEFAULT_MAX_PROJECT_UNPACKED_BYTES = 1024 * 1024 * 1024;
/** Link-local: where clouds serve instance metadata and credentials. */
export const DEFAULT_REPLICA_DENIED_CIDRS = ["169.254.0.0/16"];
const DEFAULT_LOG_LEVEL = "info";
export const DEFAULT_NATS_PROBE_URL = "nats://127.0.0.1:4222";
export const DEFAULT_SHUTDOWN_TIMEOUT_MS = 15_000;
export const DEFAULT_STOP_DEADLINE_MS = 25_000;
export const DEFAULT_FIRST_BYTES_TIMEOUT_MS = 10_000;
export const DEFAULT_HEADERS_TIMEOUT_MS = 20_000;
export const DEFAULT_KEEP_ALIVE_TIMEOUT_MS = 5_000;
export const DEFAULT_HTTP2_IDLE_TIMEOUT_MS = 60_000;
export const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS = 256;
export const DEFAULT_WEBHOOK_TIMEOUT_MS = 10_000;
const DEFAULT_WEBSOCKET_IDLE_TIMEOUT_MS = 5 * 60_000;
const DEFAULT_WEBSOCKET_MAX_MESSAGE_BYTES = 1024 * 1024;
const DEFAULT_WEBSOCKET_MAX_CONNECTIONS_PER_APP = 1000;
export const DEFAULT_PROJECT_MAX_REPLICAS = 20;
export const DEFAULT_PROJECT_MEMORY_MB = 16 * 1024;
export const DEFAULT_REPLICA_LOG_LINES_PER_SECOND = 200;
export const DEFAULT_MAX_RESULT_BYTES = 32 * 1024 * 1024;
const DEFAULT_MAX_ASYNC_RESULT_BYTES = 64 * 1024 * 1024;
/** Longest a run may take (spec section 8: 12 hours). */
export const MAX_RUN_SECONDS = 12 * 60 * 60;

export const ROLES = ["invocation", "management", "webhook", "runner"] as const;
export type Role = (typeof ROLES)[number];

export interface Config {
  host: string;
  port: number;
  dataDir: string;
  /** PostgreSQL server of the run history, shared by every process naming it; undefined: SQLite in the data folder. Secret: never logged. */
  databaseUrl: string | undefined;
  /** NATS server to use; undefined means "probe the local default, else start one". */
  natsUrl: string | undefined;
  /** Path of a NATS .creds file (user JWT and nkey seed); at most one of creds, user+password, token. */
  natsCreds: string | undefined;
  natsUser: string | undefined;
  /** Secret: never logged. */
  natsPassword: string | undefined;
  /** Secret: never logged. */
  natsToken: string | undefined;
  /** Path of a file holding a NATS user's nkey seed (SU…); a fourth way to authenticate, exclusive of the others. */
  natsNkey: string | undefined;
  /** Copies of every stream, bucket and object store in JetStream (SKIFF_NATS_REPLICAS). */
  natsReplicas: number;
  maxBodyBytes: number;
  /** Largest app bundle, gzipped and unpacked alike. */
  maxBundleBytes: number;
  /** Bodies larger than maxBodyBytes (app bundles) read at once, in all and for one project's tokens. */
  maxUploads: number;
  maxProjectUploads: number;
  /** Most bytes the current deployments of one project's apps may unpack to, together. */
  maxProjectUnpackedBytes: number;
  /** A new connection's first bytes (HTTP/1.1 or HTTP/2 preface) must arrive within it. */
  firstBytesTimeoutMs: number;
  /** An HTTP/1.1 request head must be complete within it (from the start, or from the end of keep-alive idling). */
  headersTimeoutMs: number;
  /** HTTP/1.1 idle time between requests. */
  keepAliveTimeoutMs: number;
  /** HTTP/2 time without an open stream. */
  http2IdleTimeoutMs: number;
  /** Open connections in all; undefined: half the open-file limit. */
  maxConnections: number | undefined;
  maxConnectionsPerAddress: number;
  logLevel: string;
  roles: Role[];
  /** Processes that serve the port together (SKIFF_WORKERS); 1: this process serves it alone. */
  workers: number;
  /**
   * This process's number among a supervisor's workers (1 to SKIFF_WORKERS),
   * set by the supervisor when it starts the process; undefined in a process
   * that serves alone. Not a setting.
   */
  worker?: number;
  shutdownTimeoutMs: number;
  /** A graceful stop still under way this long after SIGTERM ends the process with exit code 1. */
  stopDeadlineMs: number;
  /** Ed25519 private key that signs tokens; undefined: the cluster's key in KV skiff-keys. */
  signingKey: string | undefined;
  /** Admin token; undefined: the one in <dataDir>/admin-token, made on first start. */
  adminToken: string | undefined;
  /** Token that may read GET /metrics besides admin tokens; undefined: admin tokens only. */
  metricsToken: string | undefined;
  /** Per-attempt timeout of a webhook delivery. */
  webhookTimeoutMs: number;
  /** Address ranges webhooks may reach despite the SSRF guard; undefined: loopback only when SKIFF_HOST is loopback. */
  webhookAllowedCidrs: string[] | undefined;
  /** AES-256 key (base64) that seals webhook and project secrets; undefined: the cluster's key in KV skiff-keys. */
  secretsKey: string | undefined;
  /** Seconds an async run's result is kept for GetRun; 0 keeps none. */
  resultTtlSeconds: number;
  /** Async runs one app may have queued (running ones included); 429 beyond. */
  maxQueuedRuns: number;
  /** Ack deadline of the async run queue's consumers; a lost runner's run is retried after it. */
  runAckWaitMs: number;
  /** How long an async run's final record, and a run's deliveries once over, stay in KV (twice the ack waits at least). */
  finalRecordKeepMs: number;
  /** "on": apps and deploy-time steps run in a bubblewrap sandbox (skiff refuses to start without one); "off": unconfined. */
  sandbox: "on" | "off";
  /** Path of bubblewrap's `bwrap`; undefined: the first of the usual places that has one. */
  bwrap: string | undefined;
  /** Per replica (and deploy-time step): address space (MiB), processes, largest file (MiB), tmpfs size (MiB), CPU seconds (0: none). */
  replicaMemoryMb: number;
  replicaPids: number;
  replicaFileMb: number;
  replicaTmpMb: number;
  /** Open files (and sockets, pipes, eventfds) per sandboxed process: RLIMIT_NOFILE. */
  replicaOpenFiles: number;
  replicaCpuSeconds: number;
  /**
   * Live replicas of one project's apps together on one runner process; a start beyond waits, then 429. In a
   * worker of SKIFF_WORKERS, its share of the setting (workerQuotas), which is the machine's.
   */
  projectMaxReplicas: number;
  /**
   * Memory limits (replicas × SKIFF_REPLICA_MEMORY_MB) of one project's replicas together on one runner process,
   * MiB. In a worker of SKIFF_WORKERS, its share of the setting (workerQuotas), which is the machine's.
   */
  projectMemoryMb: number;
  /** Lines a replica may log per second (stdout and stderr together); the rest are dropped and counted. */
  replicaLogLinesPerSecond: number;
  /** Largest answer of a Cortex function (not a streamed generator) a runner reads; larger fails result_too_large. */
  maxResultBytes: number;
  /** Largest result of an async run that is stored; larger fails result_too_large. */
  maxAsyncResultBytes: number;
  /** Most entries (files, folders, links) in one bundle. */
  maxBundleFiles: number;
  /** Most bytes a deploy-time install may write (its tmpfs's size when skiff is root) and leave. */
  maxBuildBytes: number;
  /** Most files, folders and links a deploy-time install may leave. */
  maxBuildFiles: number;
  /** Deploy-time installs one process runs at once. */
  maxConcurrentBuilds: number;
  /** The package index of deploy-time pip installs (PIP_INDEX_URL); undefined: pip's own, or /etc/pip.conf's. */
  pipIndexUrl: string | undefined;
  /** More package indexes of deploy-time pip installs (PIP_EXTRA_INDEX_URL). */
  pipExtraIndexUrls: string[];
  /** Most apps one project may have; a deploy of a new app beyond it is refused with 429. */
  maxAppsPerProject: number;
  /** Most secrets one project may have; a new one beyond it is refused with 429. */
  maxSecretsPerProject: number;
  /** Size of each project's persistent storage (its own filesystem where skiff is root), bytes. */
  projectStorageBytes: number;
  /** Network of sandboxes: "auto" (slirp4netns when installed, else none), "slirp4netns" or "none". */
  replicaNetwork: "auto" | "slirp4netns" | "none";
  /** IPv4 ranges replicas with outbound network may not reach, besides the host's own addresses. */
  replicaDeniedCidrs: string[];
  /** Whether requests to sandboxed Custom apps skip their relay where the runner can open connections in their sandbox. */
  replicaDirect: "on" | "off";
  /** A WebSocket connection with no bytes either way for this long is closed (1001). */
  websocketIdleTimeoutMs: number;
  /** Largest WebSocket message a caller may send an app; a larger one closes the connection (1009). */
  websocketMaxMessageBytes: number;
  /** Open WebSocket connections to one app through one process; 429 beyond. */
  websocketMaxConnectionsPerApp: number;
  /** Percent of the free space on SKIFF_DATA_DIR's disk at first start that the stores' default budgets share. */
  storageShare: number;
  /** Byte budget of SKIFF_EVENTS; undefined: its share of the free space at first start (nats/budgets.ts). */
  eventsMaxBytes: number | undefined;
  /** Byte budget of SKIFF_WEBHOOKS; undefined: derived. */
  webhooksMaxBytes: number | undefined;
  /** Byte budget of the async run queue SKIFF_RUNS (a tenth of it more for SKIFF_LOST_RUNS); undefined: derived. */
  runQueueMaxBytes: number | undefined;
  /** Byte budget of SKIFF_LOGS, the replicas' log lines; undefined: derived. */
  logsMaxBytes: number | undefined;
  /** Byte budget of object store skiff-results (large bodies and results); undefined: derived. */
  resultsMaxBytes: number | undefined;
  /** Byte budget of object store skiff-bundles; undefined: derived. */
  bundlesMaxBytes: number | undefined;
  /** Byte budget of each KV bucket; undefined: derived. */
  kvMaxBytes: number | undefined;
  /** Byte budget of the run history's tables and indexes; undefined: derived. */
  historyMaxBytes: number | undefined;
}

export class ConfigError extends Error {
  override name = "ConfigError";
  constructor(
    readonly variable: string,
    message: string,
  ) {
    super(`${variable}: ${message}`);
  }
}

type Env = Record<string, string | undefined>;

interface Setting<K extends keyof Config> {
  key: K;
  env: string;
  doc: string;
  fallback: string;
  parse: (raw: string, variable: string) => Config[K];
}

function integer(min: number, max: number) {
  return (raw: string, variable: string): number => {
    if (!/^\d+$/.test(raw.trim())) throw new ConfigError(variable, `expected a whole number, got "${raw}"`);
    const n = Number(raw);
    if (n < min || n > max) throw new ConfigError(variable, `must be between ${min} and ${max}, got ${n}`);
    return n;
  };
}

/** One of `values` ("must be on or off", "must be auto, slirp4netns or none"). */
function choice<T extends string>(...values: T[]) {
  const said = `${values.slice(0, -1).join(", ")} or ${values.at(-1)}`;
  return (raw: string, variable: string): T => {
    const v = raw.trim();
    if (!(values as string[]).includes(v)) throw new ConfigError(variable, `must be ${said}, got "${raw}"`);
    return v as T;
  };
}

function nonEmpty(raw: string, variable: string): string {
  if (raw.trim() === "") throw new ConfigError(variable, "must not be empty");
  return raw.trim();
}

function optional<T>(parse: (raw: string, variable: string) => T) {
  return (raw: string, variable: string): T | undefined =>
    raw.trim() === "" ? undefined : parse(raw.trim(), variable);
}

function signingKey(raw: string, variable: string): string {
  try {
    parsePrivateKey(raw);
  } catch (err) {
    throw new ConfigError(variable, (err as Error).message);
  }
  return raw;
}

/** Long enough that it cannot be guessed, and sendable in an Authorization header as it is. */
function adminToken(raw: string, variable: string): string {
  if (raw.length < 32 || !/^[\x21-\x7e]+$/.test(raw))
    throw new ConfigError(variable, "must be at least 32 printable ASCII characters without spaces");
  return raw;
}

/** A postgres:// (or postgresql://) URL; its password, if any, never appears in the message. */
function databaseUrl(raw: string, variable: string): string {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw new ConfigError(variable, "expected a URL such as postgres://user:password@host:5432/database");
  }
  if (url.protocol !== "postgres:" && url.protocol !== "postgresql:")
    throw new ConfigError(variable, `expected a postgres:// or postgresql:// URL, got one of ${url.protocol}`);
  return raw;
}

/** A package index: an http(s) URL; its password, if any, never appears in the message. */
function indexUrl(raw: string, variable: string): string {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw new ConfigError(variable, "expected a URL such as https://pypi.example.internal/simple");
  }
  if (url.protocol !== "https:" && url.protocol !== "http:")
    throw new ConfigError(variable, `expected an http:// or https:// URL, got one of ${url.protocol}`);
  // pip's environment is the build's, where the tenant's code runs (its commands, its packages' builds): a user or
  // password in the URL would be every tenant's to read.
  if (url.username !== "" || url.password !== "")
    throw new ConfigError(
      variable,
      "must not carry a user or password: every tenant's build can read the index URL pip is given; " +
        "use an index that needs none from the runner (a proxy or a mirror reachable only from it)",
    );
  return raw;
}

/** Package indexes separated by spaces (as pip reads PIP_EXTRA_INDEX_URL). */
function indexUrls(raw: string, variable: string): string[] {
  return raw
    .split(/\s+/)
    .filter((u) => u !== "")
    .map((u) => indexUrl(u, variable));
}

/** The settings that say how skiff authenticates to NATS. */
export type NatsCredentials = Partial<
  Pick<Config, "natsCreds" | "natsUser" | "natsPassword" | "natsToken" | "natsNkey">
>;

/** How skiff authenticates to NATS, made from NatsCredentials by natsAuth(). */
export type NatsAuth =
  | { kind: "creds"; file: string }
  | { kind: "user"; user: string; password: string }
  | { kind: "token"; token: string }
  | { kind: "nkey"; file: string };

const NATS_AUTH_CHOICES =
  "SKIFF_NATS_CREDS, or SKIFF_NATS_USER with SKIFF_NATS_PASSWORD, or SKIFF_NATS_TOKEN, or SKIFF_NATS_NKEY";

/**
 * The one way of authenticating to NATS that the settings name; undefined when
 * they name none. Throws ConfigError naming the variables when they conflict
 * (never with their values: passwords and tokens are secrets).
 */
export function natsAuth(c: NatsCredentials): NatsAuth | undefined {
  if ((c.natsUser === undefined) !== (c.natsPassword === undefined)) {
    const [set, unset] =
      c.natsUser === undefined
        ? ["SKIFF_NATS_PASSWORD", "SKIFF_NATS_USER"]
        : ["SKIFF_NATS_USER", "SKIFF_NATS_PASSWORD"];
    throw new ConfigError(unset, `${set} is set but ${unset} is not: set both or neither`);
  }
  const given = [
    c.natsCreds !== undefined ? ["SKIFF_NATS_CREDS"] : [],
    c.natsUser !== undefined ? ["SKIFF_NATS_USER", "SKIFF_NATS_PASSWORD"] : [],
    c.natsToken !== undefined ? ["SKIFF_NATS_TOKEN"] : [],
    c.natsNkey !== undefined ? ["SKIFF_NATS_NKEY"] : [],
  ].filter((vars) => vars.length > 0);
  if (given.length > 1) {
    const vars = given.flat();
    throw new ConfigError(
      vars.join(", "),
      `these set more than one way to authenticate to NATS; set only one: ${NATS_AUTH_CHOICES}`,
    );
  }
  if (c.natsCreds !== undefined) return { kind: "creds", file: c.natsCreds };
  if (c.natsUser !== undefined && c.natsPassword !== undefined)
    return { kind: "user", user: c.natsUser, password: c.natsPassword };
  if (c.natsToken !== undefined) return { kind: "token", token: c.natsToken };
  if (c.natsNkey !== undefined) return { kind: "nkey", file: c.natsNkey };
  return undefined;
}

/** A .creds file as nsc writes it: a user JWT block, then an nkey seed block. */
const CREDS_BLOCKS = /-{3,}BEGIN [^\n]*JWT-{3,}\s*\n\s*\S+\s*\n[\s\S]*-{3,}BEGIN [^\n]*SEED-{3,}\s*\n\s*S\S+/;

/** A readable .creds file; its contents (a secret) never appear in the message. */
function credsFile(raw: string, variable: string): string {
  let text: string;
  try {
    text = readFileSync(raw, "utf8");
  } catch (err) {
    throw new ConfigError(variable, `cannot read the NATS credentials file ${raw}: ${(err as Error).message}`);
  }
  if (!CREDS_BLOCKS.test(text))
    throw new ConfigError(
      variable,
      `${raw} is not a NATS credentials file: expected a user JWT block and an nkey seed block, as nsc writes them`,
    );
  return raw;
}

/** A readable file holding a NATS user's nkey seed (SU…); its contents (a secret) never appear in the message. */
function nkeyFile(raw: string, variable: string): string {
  let text: string;
  try {
    text = readFileSync(raw, "utf8");
  } catch (err) {
    throw new ConfigError(variable, `cannot read the NATS nkey seed file ${raw}: ${(err as Error).message}`);
  }
  if (!/^SU[A-Z2-7]{56}$/.test(text.trim()))
    throw new ConfigError(variable, `${raw} does not hold the nkey seed of a NATS user (one line, SU…)`);
  return raw;
}

/** A secret taken as it is (no trimming); empty means unset. Never echoed in messages. */
function secret(raw: string): string | undefined {
  return raw === "" ? undefined : raw;
}

const LOG_LEVELS = ["trace", "debug", "info", "warn", "error", "fatal", "silent"];

export function parseRoles(raw: string, variable: string): Role[] {
  const names = raw
    .split(",")
    .map((s) => s.trim())
    .filter((s) => s !== "");
  if (names.length === 0) throw new ConfigError(variable, `name at least one role of ${ROLES.join(", ")}`);
  for (const n of names) {
    if (!(ROLES as readonly string[]).includes(n)) {
      throw new ConfigError(variable, `unknown role "${n}"; roles are ${ROLES.join(", ")}`);
    }
  }
  return [...new Set(names)] as Role[];
}

/** Powers of 1024, as nats-server reads sizes: `20MB` and `20MiB` are both 20 × 1024². */
const BYTE_UNITS: Record<string, number> = { "": 1, b: 1, k: 2 ** 10, m: 2 ** 20, g: 2 ** 30, t: 2 ** 40 };
/** Smallest budget of a store: room for a few of its largest messages. */
export const MIN_STORE_BUDGET_BYTES = 1024 * 1024;

/** A size in bytes: a whole number, or one with a unit (`512MB`, `20 MiB`, `1.5G`, `2TB`). */
export function parseByteSize(raw: string, variable: string, min = MIN_STORE_BUDGET_BYTES): number {
  const m = /^(\d+(?:\.\d+)?)\s*(?:([kmgt])(?:i?b)?|(b))?$/i.exec(raw.trim());
  if (!m) throw new ConfigError(variable, `expected a size in bytes such as 536870912, 512MB or 20GiB, got "${raw}"`);
  const n = Math.floor(Number(m[1]) * BYTE_UNITS[(m[2] ?? m[3] ?? "").toLowerCase()]);
  if (n < min) throw new ConfigError(variable, `must be at least ${min} bytes (${min / 2 ** 20} MiB), got ${n}`);
  if (!Number.isSafeInteger(n)) throw new ConfigError(variable, `is too large: ${raw}`);
  return n;
}

const BUDGET_DEFAULT =
  'Unset: a share of `SKIFF_STORAGE_SHARE` (see docs/deploy.md, "Storage budgets"), fixed at first start and said in the log.';

/**
 * The byte budget of every store (streams, buckets, object stores, the run
 * history): what each holds and what it drops, or refuses, at its budget.
 */
const STORE_BUDGET_SETTINGS: Setting<keyof Config>[] = [
  {
    key: "storageShare",
    env: "SKIFF_STORAGE_SHARE",
    fallback: "50",
    doc: "Percent of the free space on the disk of `SKIFF_DATA_DIR`, measured when a store is first made, that the stores whose budget is unset share (NATS's streams, buckets and object stores, and the run history), each its fixed part of it. The budget so made is kept in the store (a stream's `max_bytes`) and not made again at later starts, so it does not shrink as the disk fills. Where NATS or PostgreSQL run on other machines, set the budgets below instead.",
    parse: integer(1, 90),
  },
  {
    key: "eventsMaxBytes",
    env: "SKIFF_EVENTS_MAX_BYTES",
    fallback: "",
    doc: `Bytes stream \`SKIFF_EVENTS\` (every run's events, ended async runs' results) may hold (a size such as \`20GB\`), and a quarter of it \`SKIFF_HISTORY\` (the run history's input: the events' records, webhook delivery records); at it the oldest are dropped first, whatever their age. ${BUDGET_DEFAULT}`,
    parse: optional(parseByteSize),
  },
  {
    key: "webhooksMaxBytes",
    env: "SKIFF_WEBHOOKS_MAX_BYTES",
    fallback: "",
    doc: `Bytes stream \`SKIFF_WEBHOOKS\` (terminal events of runs that named a webhook, until delivered) may hold; at it the oldest are dropped first (a delivery that far behind is lost). ${BUDGET_DEFAULT}`,
    parse: optional(parseByteSize),
  },
  {
    key: "runQueueMaxBytes",
    env: "SKIFF_RUN_QUEUE_MAX_BYTES",
    fallback: "",
    doc: `Bytes the async run queue \`SKIFF_RUNS\` may hold (a tenth more for \`SKIFF_LOST_RUNS\`). An accepted run is never dropped: near it a new async call gets 503 with Retry-After, saying the queue is full, until runners take runs out. ${BUDGET_DEFAULT}`,
    parse: optional(parseByteSize),
  },
  {
    key: "logsMaxBytes",
    env: "SKIFF_LOGS_MAX_BYTES",
    fallback: "",
    doc: `Bytes stream \`SKIFF_LOGS\` (replicas' log lines) may hold; at it the oldest lines are dropped first. ${BUDGET_DEFAULT}`,
    parse: optional(parseByteSize),
  },
  {
    key: "resultsMaxBytes",
    env: "SKIFF_RESULTS_MAX_BYTES",
    fallback: "",
    doc: `Bytes object store \`skiff-results\` (large bodies in transit and large results) may hold. From 80 % of it the results of ended runs are removed, oldest first, down to 60 % (GetRun then shows no result, as past \`SKIFF_RESULT_TTL\`); bodies of accepted runs on their way to a runner are never removed, and a body or result that does not fit is refused (the call or run that needed it fails). ${BUDGET_DEFAULT}`,
    parse: optional(parseByteSize),
  },
  {
    key: "bundlesMaxBytes",
    env: "SKIFF_BUNDLES_MAX_BYTES",
    fallback: "",
    doc: `Bytes object store \`skiff-bundles\` (app bundles) may hold; a deploy that does not fit is refused. ${BUDGET_DEFAULT}`,
    parse: optional(parseByteSize),
  },
  {
    key: "kvMaxBytes",
    env: "SKIFF_KV_MAX_BYTES",
    fallback: "",
    doc: `Bytes each KV bucket (\`skiff-runs\`, \`skiff-idempotency\`, \`skiff-webhooks\`, …) may hold; a write past it is refused and the operation that made it fails; nothing in a bucket is dropped to make room. ${BUDGET_DEFAULT}`,
    parse: optional(parseByteSize),
  },
  {
    key: "historyMaxBytes",
    env: "SKIFF_HISTORY_MAX_BYTES",
    fallback: "",
    doc: "Bytes the run history's tables and indexes may take (what ListRuns, the dashboard and app stats read); every 2 s the oldest runs past what 60 % of it holds are deleted (as runs past 30 days are), and their room is reused. Unset: its share of `SKIFF_STORAGE_SHARE` of the free space on the data folder's disk and of what it takes, made at each start and said in the log.",
    parse: optional(parseByteSize),
  },
];

/** Every setting, in the order README's configuration table lists them. */
const SETTINGS: Setting<keyof Config>[] = [
  {
    key: "host",
    env: "SKIFF_HOST",
    fallback: DEFAULT_HOST,
    doc: "Address the HTTP/gRPC port binds to.",
    parse: nonEmpty,
  },
  {
    key: "port",
    env: "SKIFF_PORT",
    fallback: String(DEFAULT_PORT),
    doc: "Port for HTTP/1.1 (REST, Connect, gRPC-Web) and cleartext HTTP/2 (gRPC); 0 picks a free one.",
    parse: integer(0, 65535),
  },
  {
    key: "dataDir",
    env: "SKIFF_DATA_DIR",
    fallback: DEFAULT_DATA_DIR,
    doc: "Folder for local state: the store of a NATS server that skiff starts itself, the token files `admin-token` and `dev-token`, `address` (the URL it serves while it runs, which the `skiff` CLI reads with the admin token: set the same `SKIFF_DATA_DIR` for both), the run history's embedded database (`history/`, when `SKIFF_DATABASE_URL` is unset), a runner's unpacked deployments (`deployments/`) and replica folders (`replicas/`), and the projects' persistent storage (`storage/`); with `SKIFF_WORKERS` above 1, each worker's deployments, replicas and storage go under `workers/<n>/` instead (the run history stays one, in `history/`, which worker 1 keeps).",
    parse: nonEmpty,
  },
  {
    key: "databaseUrl",
    env: "SKIFF_DATABASE_URL",
    fallback: "",
    doc: "PostgreSQL server that holds the run history (what ListRuns, the dashboard and app stats read), e.g. `postgres://skiff:…@db:5432/skiff`; tables in schema `skiff`, created at start. Set it when several processes serve the run API: they share it, and one at a time writes to it. Unset: an embedded SQLite file in `SKIFF_DATA_DIR/history`, for one process. Never logged.",
    parse: optional(databaseUrl),
  },
  {
    key: "natsUrl",
    env: "SKIFF_NATS_URL",
    fallback: "",
    doc: `NATS server(s), comma-separated. Unset: skiff starts \`nats-server\` with JetStream in the data folder, admitting only an nkey that skiff generates (seed in \`SKIFF_DATA_DIR/nats/skiff.nk\`), so that two installs with different data folders share nothing; or, when NATS credentials are set, uses ${DEFAULT_NATS_PROBE_URL} with them if a server answers there.`,
    parse: (raw) => (raw.trim() === "" ? undefined : raw.trim()),
  },
  {
    key: "natsCreds",
    env: "SKIFF_NATS_CREDS",
    fallback: "",
    doc: `Path of a NATS credentials file (\`.creds\`: a user JWT and its nkey seed, as \`nsc\` writes it) that skiff connects with; read again on each reconnect. At most one way to authenticate may be set: \`SKIFF_NATS_CREDS\`, \`SKIFF_NATS_USER\` with \`SKIFF_NATS_PASSWORD\`, \`SKIFF_NATS_TOKEN\`, or \`SKIFF_NATS_NKEY\`. With none, skiff connects without credentials and warns at start when the server lets it in. A \`nats-server\` that skiff starts itself uses its own generated credentials instead.`,
    parse: optional(credsFile),
  },
  {
    key: "natsUser",
    env: "SKIFF_NATS_USER",
    fallback: "",
    doc: "NATS user name; needs `SKIFF_NATS_PASSWORD`.",
    parse: optional((raw) => raw),
  },
  {
    key: "natsPassword",
    env: "SKIFF_NATS_PASSWORD",
    fallback: "",
    doc: "Password of `SKIFF_NATS_USER`, taken as it is; never logged.",
    parse: secret,
  },
  {
    key: "natsToken",
    env: "SKIFF_NATS_TOKEN",
    fallback: "",
    doc: "NATS authorization token, taken as it is; never logged.",
    parse: secret,
  },
  {
    key: "natsNkey",
    env: "SKIFF_NATS_NKEY",
    fallback: "",
    doc: "Path of a file holding a NATS user's nkey seed (one line, `SU…`, as `nsc` and `nk -gen user` write it), for a server whose users are nkeys; read again on each reconnect. The workers of `SKIFF_WORKERS` connect so to the `nats-server` that skiff starts.",
    parse: optional(nkeyFile),
  },
  {
    key: "natsReplicas",
    env: "SKIFF_NATS_REPLICAS",
    fallback: "1",
    doc: "Copies of every stream, KV bucket and object store skiff keeps in JetStream: 3 on a cluster of three or more servers (a node can fail without losing an accepted run), 1 on a single server. Existing ones are scaled to it at start.",
    parse: integer(1, 5),
  },
  {
    key: "maxBodyBytes",
    env: "SKIFF_MAX_BODY_BYTES",
    fallback: String(DEFAULT_MAX_BODY_BYTES),
    doc: "Largest request body accepted (413 above it); app bundles have their own limit, `SKIFF_MAX_BUNDLE_BYTES`.",
    parse: integer(1, 1024 * 1024 * 1024),
  },
  {
    key: "maxBundleBytes",
    env: "SKIFF_MAX_BUNDLE_BYTES",
    fallback: String(DEFAULT_MAX_BUNDLE_BYTES),
    doc: "Largest app bundle, both the gzipped upload and the tar inside it; a larger one is refused and nothing is deployed.",
    parse: integer(1024, 16 * 1024 * 1024 * 1024),
  },
  {
    key: "maxUploads",
    env: "SKIFF_MAX_UPLOADS",
    fallback: "8",
    doc: "Request bodies larger than `SKIFF_MAX_BODY_BYTES` (app bundles) one process reads at once; one more is refused with 429 before its body is read. Each is read whole and parsed before its handler runs, which takes a few times its size in memory: keep this × `SKIFF_MAX_BUNDLE_BYTES` × 3 within what the process may use. A body taken in must arrive within 30 s and its size at 256 KiB/s, else its call ends.",
    parse: integer(1, 1024),
  },
  {
    key: "maxProjectUploads",
    env: "SKIFF_MAX_PROJECT_UPLOADS",
    fallback: "2",
    doc: "Of `SKIFF_MAX_UPLOADS`, those one project's tokens may have under way (the admin token's count only in all): one tenant cannot take every slot.",
    parse: integer(1, 1024),
  },
  {
    key: "maxProjectUnpackedBytes",
    env: "SKIFF_MAX_PROJECT_UNPACKED_BYTES",
    fallback: String(DEFAULT_MAX_PROJECT_UNPACKED_BYTES),
    doc: "Most bytes the current deployments of all of one project's apps may take together (each bundle's files, or what its build left when dependencies were installed); a deployment that would take the project past it is refused with 429 and nothing is deployed.",
    parse: integer(1024, 1024 * 1024 * 1024 * 1024),
  },
  {
    key: "firstBytesTimeoutMs",
    env: "SKIFF_FIRST_BYTES_TIMEOUT_MS",
    fallback: String(DEFAULT_FIRST_BYTES_TIMEOUT_MS),
    doc: "How long a new connection may take to send the first bytes of HTTP/1.1 or of the HTTP/2 preface; a connection still silent then is closed.",
    parse: integer(1, 3_600_000),
  },
  {
    key: "headersTimeoutMs",
    env: "SKIFF_HEADERS_TIMEOUT_MS",
    fallback: String(DEFAULT_HEADERS_TIMEOUT_MS),
    doc: "How long an HTTP/1.1 request head (request line and headers) may take to arrive in full, counted from the connection's start or, between keep-alive requests, from the end of the previous answer; a slower connection is closed. A request whose head has arrived is never cut by a timeout, however long it runs.",
    parse: integer(1, 3_600_000),
  },
  {
    key: "keepAliveTimeoutMs",
    env: "SKIFF_KEEP_ALIVE_TIMEOUT_MS",
    fallback: String(DEFAULT_KEEP_ALIVE_TIMEOUT_MS),
    doc: "How long an HTTP/1.1 connection may stay silent between requests before it is closed.",
    parse: integer(1, 3_600_000),
  },
  {
    key: "http2IdleTimeoutMs",
    env: "SKIFF_HTTP2_IDLE_TIMEOUT_MS",
    fallback: String(DEFAULT_HTTP2_IDLE_TIMEOUT_MS),
    doc: "How long an HTTP/2 connection may go without an open stream (a call in progress) before it is closed with GOAWAY; a stream whose headers never complete is not open, so this also bounds slow headers.",
    parse: integer(1, 3_600_000),
  },
  {
    key: "maxConnections",
    env: "SKIFF_MAX_CONNECTIONS",
    fallback: "",
    doc: "Open connections in all. At the cap a new connection closes the longest-idle one (no request in progress), or is refused when none is idle. Unset: half the process's open-file limit (`ulimit -n`), or 4096 where it cannot be read.",
    parse: optional(integer(1, 1_000_000)),
  },
  {
    key: "maxConnectionsPerAddress",
    env: "SKIFF_MAX_CONNECTIONS_PER_ADDRESS",
    fallback: String(DEFAULT_MAX_CONNECTIONS_PER_ADDRESS),
    doc: "Open connections from one remote address (an IPv6 address's /64 counts as one address: a client holds a /64); a new one beyond it is closed at once. With `SKIFF_WORKERS` above 1 it holds for all workers together: the supervisor counts them. Behind a proxy or load balancer every connection comes from its address: raise it there.",
    parse: integer(1, 1_000_000),
  },
  {
    key: "logLevel",
    env: "SKIFF_LOG_LEVEL",
    fallback: DEFAULT_LOG_LEVEL,
    doc: `Log level: ${LOG_LEVELS.join(", ")}.`,
    parse: (raw, variable) => {
      if (!LOG_LEVELS.includes(raw.trim()))
        throw new ConfigError(variable, `must be one of ${LOG_LEVELS.join(", ")}, got "${raw}"`);
      return raw.trim();
    },
  },
  {
    key: "roles",
    env: "SKIFF_ROLES",
    fallback: ROLES.join(","),
    doc: "Roles this process runs (also `--roles`).",
    parse: parseRoles,
  },
  {
    key: "workers",
    env: "SKIFF_WORKERS",
    fallback: "1",
    doc: "Processes that serve the port together, each running the roles above: a supervisor process starts them (and the `nats-server` of the data folder, when skiff starts one), restarts one that dies, and stops them all on SIGTERM. Each worker has its own replicas, deployments and projects' persistent storage under `SKIFF_DATA_DIR/workers/<n>/`; the embedded run history is one file for all, which worker 1 projects the runs into and every worker reads; sandbox uids come from NATS, shared. 1: one process, no supervisor. Raise it to the machine's cores when one process's CPU is the limit (its main thread near 100 %, see docs/deploy.md); each worker costs about 300 MB more. Needs `SKIFF_SANDBOX=on`. Limits hold for the machine: the supervisor counts `SKIFF_MAX_CONNECTIONS_PER_ADDRESS` over all workers (a worker serves a new connection once the supervisor has counted it), and each worker runs its share of `SKIFF_PROJECT_MAX_REPLICAS` and `SKIFF_PROJECT_MEMORY_MB` (the shares sum to the setting and differ by one replica at most, the larger to the lower worker numbers; the supervisor logs them at start); both must leave every worker room for one replica (at least `SKIFF_WORKERS` replicas, and `SKIFF_WORKERS` × `SKIFF_REPLICA_MEMORY_MB`), else skiff refuses to start. `SKIFF_MAX_CONNECTIONS` counts per worker, as it guards each process's open files.",
    parse: integer(1, 256),
  },
  {
    key: "shutdownTimeoutMs",
    env: "SKIFF_SHUTDOWN_TIMEOUT_MS",
    fallback: String(DEFAULT_SHUTDOWN_TIMEOUT_MS),
    doc: "On SIGTERM, how long in-flight requests may finish before connections are closed; less than `SKIFF_STOP_DEADLINE_MS`.",
    parse: integer(0, MAX_RUN_SECONDS * 1000),
  },
  {
    key: "stopDeadlineMs",
    env: "SKIFF_STOP_DEADLINE_MS",
    fallback: String(DEFAULT_STOP_DEADLINE_MS),
    doc: "On SIGTERM or SIGINT, how long the whole graceful stop may take (in-flight requests, then the roles, then NATS); a stop still under way then ends the process with exit code 1, after a log line naming what it was still waiting for. Under the grace of systemd (90 s) and Kubernetes (30 s), so that skiff, not their SIGKILL, says why.",
    parse: integer(1000, MAX_RUN_SECONDS * 1000),
  },
  {
    key: "signingKey",
    env: "SKIFF_SIGNING_KEY",
    fallback: "",
    doc: 'Ed25519 private key that signs service account tokens: a JWK as JSON (`{"kty":"OKP","crv":"Ed25519","d":…,"x":…}`) or PKCS#8 PEM (newlines may be written `\\n`). Unset: a key made once and kept in KV `skiff-keys`.',
    parse: optional(signingKey),
  },
  {
    key: "adminToken",
    env: "SKIFF_ADMIN_TOKEN",
    fallback: "",
    doc: "Admin token (32+ printable characters), accepted by every process. Unset: one is made on first start and written to `SKIFF_DATA_DIR/admin-token`.",
    parse: optional(adminToken),
  },
  {
    key: "metricsToken",
    env: "SKIFF_METRICS_TOKEN",
    fallback: "",
    doc: "Token (32+ printable characters) that may read `GET /metrics` (Prometheus text) besides admin tokens, for a scraper that should hold nothing more. Unset: admin tokens only.",
    parse: optional(adminToken),
  },
  {
    key: "webhookTimeoutMs",
    env: "SKIFF_WEBHOOK_TIMEOUT_MS",
    fallback: String(DEFAULT_WEBHOOK_TIMEOUT_MS),
    doc: "How long one webhook attempt may take before it counts as a network error (and is retried).",
    parse: integer(100, 10 * 60_000),
  },
  {
    key: "webhookAllowedCidrs",
    env: "SKIFF_WEBHOOK_ALLOWED_CIDRS",
    fallback: "",
    doc: "Comma-separated address ranges (e.g. `10.0.0.0/8,::1/128`) that webhooks may reach although they are loopback, private, link-local or reserved. Unset: none, except loopback when `SKIFF_HOST` is a loopback address (the local default of `npm start`, said at start).",
    parse: optional((raw, variable) =>
      raw
        .split(",")
        .map((c) => c.trim())
        .filter((c) => c !== "")
        .map((c) => {
          try {
            parseCidr(c);
          } catch (err) {
            throw new ConfigError(variable, (err as Error).message);
          }
          return c;
        }),
    ),
  },
  {
    key: "secretsKey",
    env: "SKIFF_SECRETS_KEY",
    fallback: "",
    doc: "32-byte AES-256 key, base64, that seals webhook secrets and project secrets; every process must have the same (changing it leaves the project secrets sealed before unreadable: set them again). Unset: a key made once and kept in KV `skiff-keys`.",
    parse: optional((raw, variable) => {
      try {
        parseSecretsKey(raw);
      } catch (err) {
        throw new ConfigError(variable, (err as Error).message);
      }
      return raw.trim();
    }),
  },
  {
    key: "resultTtlSeconds",
    env: "SKIFF_RESULT_TTL",
    fallback: String(24 * 60 * 60),
    doc: "Seconds an async run's result stays readable through `GET …/runs/{run_id}`; 0 keeps no results.",
    parse: integer(0, 365 * 24 * 60 * 60),
  },
  {
    key: "maxQueuedRuns",
    env: "SKIFF_MAX_QUEUED_RUNS",
    fallback: "10000",
    doc: "Async runs one app may have waiting or running; a call beyond it gets 429 with Retry-After.",
    parse: integer(1, 10_000_000),
  },
  {
    key: "maxResultBytes",
    env: "SKIFF_MAX_RESULT_BYTES",
    fallback: String(DEFAULT_MAX_RESULT_BYTES),
    doc: "Largest answer of a Cortex function (a generator's streamed items are not counted) that a runner reads: a larger one is read no further and its run fails with 502 and error type `result_too_large`, naming this setting; the replica goes on serving.",
    parse: integer(1024, 2 * 1024 * 1024 * 1024),
  },
  {
    key: "maxAsyncResultBytes",
    env: "SKIFF_MAX_ASYNC_RESULT_BYTES",
    fallback: String(DEFAULT_MAX_ASYNC_RESULT_BYTES),
    doc: "Largest result of an async run (a Cortex envelope or a Custom app's answer): a runner reads an answer no further than this, and stores none larger; such a run ends `failure` with error type `result_too_large`, naming this setting.",
    parse: integer(1024, 2 * 1024 * 1024 * 1024),
  },
  {
    key: "runAckWaitMs",
    env: "SKIFF_RUN_ACK_WAIT_MS",
    fallback: "30000",
    doc: "How long a runner may go silent on an async run before the run is given to another runner (runners check in every third of it); at most 3 attempts in all.",
    parse: integer(1000, 10 * 60_000),
  },
  {
    key: "finalRecordKeepMs",
    env: "SKIFF_FINAL_RECORD_KEEP_MS",
    fallback: "60000",
    doc: "How long an ended async run's record stays in KV `skiff-runs` after its runner acked the run (twice SKIFF_RUN_ACK_WAIT_MS at least), and a run's webhook deliveries stay in KV `skiff-webhooks` once they are over; then GetRun reads them from the run history (the result from the run's final event), and NATS holds nothing for the run but its events.",
    parse: integer(0, 24 * 60 * 60_000),
  },
  {
    key: "sandbox",
    env: "SKIFF_SANDBOX",
    fallback: "on",
    doc: "`on`: every replica and every deploy-time step (dependency install, import check) runs in a bubblewrap sandbox (see docs/security.md); a runner or management process that cannot make one (no `bwrap`, or its probe fails) refuses to start. `off`: apps run unconfined as skiff's own user, said loudly at start and on `/readyz` (its answer then carries `sandbox: off`); only for code you trust.",
    parse: choice("on", "off"),
  },
  {
    key: "bwrap",
    env: "SKIFF_BWRAP",
    fallback: "",
    doc: "Path of bubblewrap's `bwrap`, for a host that has it elsewhere; empty: the first of `/usr/bin/bwrap`, `/usr/local/bin/bwrap`, `/bin/bwrap` that exists. With the sandbox on, a `bwrap` that is missing or fails its probe stops skiff at start with the reason.",
    parse: optional((raw, variable) => {
      if (!raw.startsWith("/")) throw new ConfigError(variable, `must be an absolute path, got "${raw}"`);
      return raw;
    }),
  },
  {
    key: "replicaMemoryMb",
    env: "SKIFF_REPLICA_MEMORY_MB",
    fallback: "2048",
    doc: "Memory of a sandbox, MiB: the address space of each of its processes (RLIMIT_AS; an allocation beyond it fails: Python raises MemoryError, Node stops) and, where skiff can make cgroups (said at start), the memory of all its processes together, its tmpfs pages included (the kernel ends a process past it; a replica ended so fails its runs with this setting's name).",
    parse: integer(256, 1024 * 1024),
  },
  {
    key: "replicaPids",
    env: "SKIFF_REPLICA_PIDS",
    fallback: "512",
    doc: "Processes and threads of one project's sandboxes (RLIMIT_NPROC of its uid) and, where skiff can make cgroups, of each sandbox (pids.max); a fork beyond it fails.",
    parse: integer(16, 1_000_000),
  },
  {
    key: "replicaFileMb",
    env: "SKIFF_REPLICA_FILE_MB",
    fallback: "100",
    doc: "Largest file a sandboxed process may write (RLIMIT_FSIZE), MiB; writing past it ends the process (SIGXFSZ).",
    parse: integer(1, 1024 * 1024),
  },
  {
    key: "replicaOpenFiles",
    env: "SKIFF_REPLICA_OPEN_FILES",
    fallback: "4096",
    doc: "Files, sockets, pipes and eventfds each sandboxed process may hold open (RLIMIT_NOFILE); one more fails with EMFILE.",
    parse: integer(64, 1_048_576),
  },
  {
    key: "replicaTmpMb",
    env: "SKIFF_REPLICA_TMP_MB",
    fallback: "100",
    doc: "Size of each of a replica's two memory-backed writable folders, `/app` (its working folder and HOME, over the read-only deployment) and `/tmp`, MiB; a write beyond it fails with ENOSPC. Deploy-time installs get at least 1024 for their package cache.",
    parse: integer(1, 1024 * 1024),
  },
  {
    key: "replicaCpuSeconds",
    env: "SKIFF_REPLICA_CPU_SECONDS",
    fallback: "0",
    doc: "CPU seconds each sandboxed process may use in its life (RLIMIT_CPU; a replica past it is ended and replaced); 0: no limit.",
    parse: integer(0, 365 * 24 * 60 * 60),
  },
  {
    key: "projectMaxReplicas",
    env: "SKIFF_PROJECT_MAX_REPLICAS",
    fallback: String(DEFAULT_PROJECT_MAX_REPLICAS),
    doc: "Replicas of one project's apps together (starting, serving or stopping) on one runner process, or on one machine's workers together with `SKIFF_WORKERS` above 1, where each worker runs its share (at least 1: the setting must be at least `SKIFF_WORKERS`; a project's calls reach the workers in turn, so one at its share answers 429 while another may have room). A replica that would pass it is not started: requests wait for a free one as they do at an app's `max_replicas`, then get 429 naming this setting; a deploy whose `min_replicas` cannot start fails.",
    parse: integer(1, 100_000),
  },
  {
    key: "projectMemoryMb",
    env: "SKIFF_PROJECT_MEMORY_MB",
    fallback: String(DEFAULT_PROJECT_MEMORY_MB),
    doc: "Memory of one project's replicas together on one runner process, MiB, counted as replicas × `SKIFF_REPLICA_MEMORY_MB` (each replica's own bound); a replica that would pass it is not started, as with `SKIFF_PROJECT_MAX_REPLICAS`. At least `SKIFF_REPLICA_MEMORY_MB`. With `SKIFF_WORKERS` above 1 it is the machine's, and each worker runs its share, in whole replicas (at least `SKIFF_WORKERS` × `SKIFF_REPLICA_MEMORY_MB`).",
    parse: integer(256, 1024 * 1024 * 1024),
  },
  {
    key: "replicaLogLinesPerSecond",
    env: "SKIFF_REPLICA_LOG_LINES_PER_SECOND",
    fallback: String(DEFAULT_REPLICA_LOG_LINES_PER_SECOND),
    doc: "Lines a replica may write per second, stdout and stderr together (each cut at 16 KiB); the lines past it are dropped, counted in `skiff_app_log_lines_dropped_total`, and said in the app's log by one line a second, `[skiff] N lines dropped (SKIFF_REPLICA_LOG_LINES_PER_SECOND)`.",
    parse: integer(1, 1_000_000),
  },
  {
    key: "maxBundleFiles",
    env: "SKIFF_MAX_BUNDLE_FILES",
    fallback: "20000",
    doc: "Most entries (files, folders, links) in one app bundle; a bundle with more is refused (400).",
    parse: integer(1, 10_000_000),
  },
  {
    key: "maxBuildBytes",
    env: "SKIFF_MAX_BUILD_BYTES",
    fallback: String(2 * 1024 * 1024 * 1024),
    doc: "Most bytes a deploy-time install (`pip install`, `npm ci`) may write: where skiff runs as root it writes into a tmpfs of this size, so it cannot fill the host's disk; what it leaves is copied into the deployment only when it is under this size (else the deploy is refused, 400).",
    parse: integer(1024 * 1024, 1024 * 1024 * 1024 * 1024),
  },
  {
    key: "maxConcurrentBuilds",
    env: "SKIFF_MAX_CONCURRENT_BUILDS",
    fallback: "2",
    doc: "Deploy-time installs one process runs at once (each in a tmpfs of up to `SKIFF_MAX_BUILD_BYTES`, with a sandbox's processes); later deploys wait their turn.",
    parse: integer(1, 64),
  },
  {
    key: "maxBuildFiles",
    env: "SKIFF_MAX_BUILD_FILES",
    fallback: "200000",
    doc: "Most files, folders and links a deploy-time install may leave; more and the deploy is refused (400).",
    parse: integer(1, 10_000_000),
  },
  {
    key: "pipIndexUrl",
    env: "SKIFF_PIP_INDEX_URL",
    fallback: "",
    doc: "The package index (an http:// or https:// URL) of deploy-time `pip install`s, given to pip as `PIP_INDEX_URL`; empty: pip's default or the machine's `/etc/pip.conf`, which builds also read. Packages the machine has (Debian's `python3-*`) are never fetched: the venv sees them. Without a user or password: every tenant's build can read the URL (and `/etc/pip.conf`, which every sandbox sees).",
    parse: optional(indexUrl),
  },
  {
    key: "pipExtraIndexUrls",
    env: "SKIFF_PIP_EXTRA_INDEX_URL",
    fallback: "",
    doc: "More package indexes for deploy-time `pip install`s, separated by spaces, given to pip as `PIP_EXTRA_INDEX_URL`; without a user or password, as `SKIFF_PIP_INDEX_URL`.",
    parse: indexUrls,
  },
  {
    key: "maxAppsPerProject",
    env: "SKIFF_MAX_APPS_PER_PROJECT",
    fallback: "100",
    doc: "Most apps one project may have; deploying a new app beyond it is refused with 429 (a new version of an existing app is not).",
    parse: integer(1, 1_000_000),
  },
  {
    key: "maxSecretsPerProject",
    env: "SKIFF_MAX_SECRETS_PER_PROJECT",
    fallback: "100",
    doc: "Most secrets one project may have; setting a new one beyond it is refused with 429 (a new value for an existing one is not).",
    parse: integer(1, 10_000),
  },
  {
    key: "projectStorageBytes",
    env: "SKIFF_PROJECT_STORAGE_BYTES",
    fallback: String(1024 * 1024 * 1024),
    doc: "Size of each project's persistent storage (`/persistent-storage` in its replicas), bytes. Where skiff runs as root the folder is a filesystem of its own of this size, made on first use, so a write past it fails with `No space left on device` (ENOSPC); a larger setting applies to projects whose storage is made after it. Without root, or where the machine cannot make such a filesystem (no loop devices or `mkfs.ext4`), it is a plain folder and is not bounded (the log says so once).",
    parse: integer(16 * 1024 * 1024, 1024 * 1024 * 1024 * 1024 * 1024),
  },
  {
    key: "replicaNetwork",
    env: "SKIFF_REPLICA_NETWORK",
    fallback: "auto",
    doc: "Network of replicas and dependency installs, each in a network namespace of its own: `slirp4netns` gives it the outside world through Debian's `slirp4netns` (never the host's loopback nor any other address of the host, so not NATS nor skiff's port wherever they listen on this host, nor `SKIFF_REPLICA_DENIED_CIDRS`; see docs/security.md); `none` gives it loopback only (dependencies must then be vendored); `auto`: `slirp4netns` when it is installed, else `none`, said at start.",
    parse: choice("auto", "slirp4netns", "none"),
  },
  {
    key: "replicaDirect",
    env: "SKIFF_REPLICA_DIRECT",
    fallback: "on",
    doc: "`on`: where skiff runs as root, requests to a sandboxed Custom app go straight to it, over connections a helper opens inside its sandbox's network namespace (see docs/security.md), instead of through the relay in its sandbox: about 0.09 ms less per request at one connection, but the runner's main thread does the TCP work the relay did on another core (about 4% fewer requests a second when that thread is saturated). `off`: always through the relay.",
    parse: choice("on", "off"),
  },
  {
    key: "replicaDeniedCidrs",
    env: "SKIFF_REPLICA_DENIED_CIDRS",
    fallback: DEFAULT_REPLICA_DENIED_CIDRS.join(","),
    doc: "Comma-separated IPv4 ranges that replicas and dependency installs with outbound network (`slirp4netns`) may not reach (connections fail with EACCES), besides every address of the host itself, which is always refused: e.g. the private network of the machines that run NATS and skiff. The default refuses link-local addresses, where clouds serve instance metadata and credentials. Empty: only the host's addresses.",
    parse: (raw, variable) =>
      raw
        .split(",")
        .map((c) => c.trim())
        .filter((c) => c !== "")
        .map((c) => {
          let cidr;
          try {
            cidr = parseCidr(c);
          } catch (err) {
            throw new ConfigError(variable, (err as Error).message);
          }
          if (cidr.family !== "ipv4")
            throw new ConfigError(variable, `"${c}": IPv4 only (replicas have no IPv6 route)`);
          return `${cidr.address}/${cidr.prefix}`;
        }),
  },
  {
    key: "websocketIdleTimeoutMs",
    env: "SKIFF_WEBSOCKET_IDLE_TIMEOUT_MS",
    fallback: String(DEFAULT_WEBSOCKET_IDLE_TIMEOUT_MS),
    doc: "A WebSocket connection to an app with no frame either way (pings count) for this long is closed by skiff with code 1001; send pings to keep a quiet connection open. Its life is bounded by the app's `response_grace_period` too (code 1008).",
    parse: integer(1000, MAX_RUN_SECONDS * 1000),
  },
  {
    key: "websocketMaxMessageBytes",
    env: "SKIFF_WEBSOCKET_MAX_MESSAGE_BYTES",
    fallback: String(DEFAULT_WEBSOCKET_MAX_MESSAGE_BYTES),
    doc: "Largest WebSocket message a caller may send to an app (the payloads of its frames together, as they travel); a larger one closes the connection with code 1009 before any of it reaches the app.",
    parse: integer(125, 1024 * 1024 * 1024),
  },
  {
    key: "websocketMaxConnectionsPerApp",
    env: "SKIFF_WEBSOCKET_MAX_CONNECTIONS_PER_APP",
    fallback: String(DEFAULT_WEBSOCKET_MAX_CONNECTIONS_PER_APP),
    doc: "Open WebSocket connections to one app through one skiff process; a handshake beyond it is refused with 429. Each connection also holds one of the app's replica slots while it lasts (`replica_concurrency` per replica, up to `max_replicas`).",
    parse: integer(1, 1_000_000),
  },
  ...STORE_BUDGET_SETTINGS,
];

/** Reads and validates the configuration. Throws ConfigError naming the variable at fault. */
export function loadConfig(env: Env = process.env, overrides: Partial<Config> = {}): Config {
  const out: Record<string, unknown> = {};
  for (const s of SETTINGS) {
    const raw = env[s.env];
    out[s.key] = s.parse(raw === undefined ? s.fallback : raw, s.env);
  }
  const config = { ...(out as unknown as Config), ...overrides };
  if (config.projectMemoryMb < config.replicaMemoryMb)
    throw new ConfigError(
      "SKIFF_PROJECT_MEMORY_MB",
      `must be at least SKIFF_REPLICA_MEMORY_MB (${config.replicaMemoryMb}), got ${config.projectMemoryMb}: no replica could start`,
    );
  if (config.stopDeadlineMs <= config.shutdownTimeoutMs)
    throw new ConfigError(
      "SKIFF_STOP_DEADLINE_MS",
      `must be more than SKIFF_SHUTDOWN_TIMEOUT_MS (${config.shutdownTimeoutMs}), got ${config.stopDeadlineMs}: the stop would end before in-flight requests had their time`,
    );
  if (config.workers > 1 && config.sandbox === "off")
    throw new ConfigError(
      "SKIFF_WORKERS",
      `must be 1 with SKIFF_SANDBOX=off, got ${config.workers}: unsandboxed replicas of several workers would share this machine's ports`,
    );
  if (config.projectMaxReplicas < config.workers)
    throw new ConfigError(
      "SKIFF_PROJECT_MAX_REPLICAS",
      `must be at least SKIFF_WORKERS (${config.workers}), got ${config.projectMaxReplicas}: it is the machine's, shared among the workers, and a worker without room for one replica could not serve a project's calls`,
    );
  if (Math.floor(config.projectMemoryMb / config.replicaMemoryMb) < config.workers)
    throw new ConfigError(
      "SKIFF_PROJECT_MEMORY_MB",
      `must be at least SKIFF_WORKERS (${config.workers}) × SKIFF_REPLICA_MEMORY_MB (${config.replicaMemoryMb}) = ${config.workers * config.replicaMemoryMb}, got ${config.projectMemoryMb}: it is the machine's, shared among the workers, and a worker without room for one replica could not serve a project's calls`,
    );
  // A worker runs its share of the machine's quotas.
  if (config.worker !== undefined) Object.assign(config, workerQuotas(config, config.worker));
  natsAuth(config); // conflicting NATS credentials stop skiff here, before it connects anywhere
  return config;
}

/**
 * Worker `worker`'s share (1 to `workers`) of a quota the workers of a
 * machine hold together: the shares sum to `quota`, differ by 1 at most, and
 * the larger go to the lower worker numbers (20 among 3: 7, 7, 6).
 */
export function workerShare(quota: number, workers: number, worker: number): number {
  return Math.floor((quota + workers - worker) / workers);
}

/**
 * What one worker of SKIFF_WORKERS holds of the per-project quotas, which are
 * the machine's. The memory is shared in whole replicas (SKIFF_REPLICA_MEMORY_MB
 * each), so that no replica's worth is lost to rounding; worker 1 takes what
 * is left over (less than a replica), so the shares sum to the setting.
 */
export function workerQuotas(
  config: Pick<Config, "workers" | "projectMaxReplicas" | "projectMemoryMb" | "replicaMemoryMb">,
  worker: number,
): Pick<Config, "projectMaxReplicas" | "projectMemoryMb"> {
  const { workers, replicaMemoryMb } = config;
  const replicas = Math.floor(config.projectMemoryMb / replicaMemoryMb);
  const rest = config.projectMemoryMb - replicas * replicaMemoryMb;
  return {
    projectMaxReplicas: workerShare(config.projectMaxReplicas, workers, worker),
    projectMemoryMb: workerShare(replicas, workers, worker) * replicaMemoryMb + (worker === 1 ? rest : 0),
  };
}

/** The configuration table README shows, made from SETTINGS so it cannot drift. */
export function settingsTable(): string {
  const rows = SETTINGS.map(
    (s) => `| \`${s.env}\` | ${s.fallback === "" ? "(unset)" : `\`${s.fallback}\``} | ${s.doc} |`,
  );
  return ["| variable | default | meaning |", "| --- | --- | --- |", ...rows].join("\n");
}
