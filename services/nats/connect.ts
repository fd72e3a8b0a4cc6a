// NATS wiring: which server to use, with which credentials, and provisioning
// of every stream, KV bucket and object store that layout.ts lists. The server
// is the one SKIFF_NATS_URL names; else, when NATS credentials are set, the one
// answering at the probe URL (127.0.0.1:4222) with them; else a nats-server
// started here, in the data folder. Without either setting skiff never joins a
// server it finds: two installs on one machine, each with its data folder,
// must never share state (keys, tokens, apps, queues).
//
// A started server admits one user, identified by an nkey that skiff generates
// once and keeps in `<dataDir>/nats/skiff.nk` (the seed, mode 0600); its config
// holds only the public key. A server that accepts clients without credentials
// is used, but skiff warns: anything that reaches it could read the signing
// keys in KV and mint admin tokens.
import { readFileSync } from "node:fs";
import { chmod, link, mkdir, readFile, rm, stat, writeFile } from "node:fs/promises";
import path from "node:path";
import {
  connect,
  credsAuthenticator,
  ErrorCode,
  NatsError,
  nkeyAuthenticator,
  nkeys,
  tokenAuthenticator,
  usernamePasswordAuthenticator,
  type Authenticator,
  type NatsConnection,
} from "nats";
import { DEFAULT_NATS_PROBE_URL, natsAuth, type Logger, type NatsAuth, type NatsCredentials } from "../config/index.js";
import { coalesceWrites } from "./coalesce.js";
import { JetStreamDisabledError, NatsConnectError, NatsStartError, messageOf } from "./errors.js";
import { findOnPath, NATS_SERVER_BINARY, spawnNatsServer, type NatsServerProcess } from "./server-process.js";

export { JetStreamDisabledError, NatsConnectError, NatsProvisionError, NatsStartError } from "./errors.js";
export { provision } from "./provision.js";

/** How long a server at the probe URL has to answer before one is started instead. */
const DEFAULT_NATS_PROBE_TIMEOUT_MS = 500;
const DEFAULT_NATS_CONNECT_TIMEOUT_MS = 5_000;
/** Between reconnect attempts to the same server; the client retries forever. */
const DEFAULT_NATS_RECONNECT_WAIT_MS = 1_000;
/** How long close() lets pending messages flush before it closes the connection anyway. */
const DEFAULT_NATS_DRAIN_TIMEOUT_MS = 5_000;
/** Largest message a started server accepts: app bundles and results are chunked below it. */
export const STARTED_SERVER_MAX_PAYLOAD_BYTES = 8 * 1024 * 1024;
/** The nkey seed of a started server's one user, in `<dataDir>/nats` (as `nats --nkey` reads it). */
export const STARTED_SERVER_SEED_FILE = "skiff.nk";

export interface ConnectNatsOptions {
  /** SKIFF_NATS_URL: one URL or several, comma-separated. */
  url?: string;
  /** Where a server is looked for when credentials are set and `url` is not; default 127.0.0.1:4222. */
  probeUrl?: string;
  /** The started server keeps its config and JetStream store in `<dataDir>/nats`. */
  dataDir: string;
  logger: Logger;
  /** Connection name the server shows in its monitoring. */
  name?: string;
  /** Folders searched for nats-server, in PATH syntax; default the PATH. */
  searchPath?: string;
  /** SKIFF_NATS_CREDS, SKIFF_NATS_USER + SKIFF_NATS_PASSWORD or SKIFF_NATS_TOKEN, checked as loadConfig checks
   * them. Used for SKIFF_NATS_URL and the probe URL; a started server has its own generated ones. */
  credentials?: NatsCredentials;
}

export interface NatsHandle {
  nc: NatsConnection;
  /** The server(s) connected to. */
  url: string;
  /** True when the server was started by this call and stops with close(). */
  embedded: boolean;
  /** Process id of the started server. */
  serverPid?: number;
  /** Resolves when the started server's process ends: at close(), or on its own (a kill, a crash). */
  serverExited?: Promise<void>;
  /** False when the server lets clients in without credentials (its INFO has no auth_required). */
  authRequired: boolean;
  /** Drains the connection, then stops a started server. Safe to call more than once. */
  close(): Promise<void>;
}

export async function connectNats(opts: ConnectNatsOptions): Promise<NatsHandle> {
  const name = opts.name ?? "skiff";
  const auth = natsAuth(opts.credentials ?? {});
  if (opts.url !== undefined) {
    // An empty list would make nats.js fall back to localhost:4222, which is not what was asked.
    if (serverList(opts.url).length === 0) throw new NatsConnectError(`SKIFF_NATS_URL names no server: "${opts.url}"`);
    const nc = await dial(opts.url, name, DEFAULT_NATS_CONNECT_TIMEOUT_MS, authenticator(auth)).catch(
      (err: unknown) => {
        throw new NatsConnectError(
          `cannot connect to the NATS server(s) at ${opts.url} given by SKIFF_NATS_URL: ${messageOf(err)}${authHint(err, auth)}`,
          { cause: err },
        );
      },
    );
    return ready(nc, opts.url, undefined, opts.logger, "SKIFF_NATS_URL");
  }

  const probeUrl = opts.probeUrl ?? DEFAULT_NATS_PROBE_URL;
  if (auth === undefined) return startInDataFolder(opts, name);
  const probed = await dial(probeUrl, name, DEFAULT_NATS_PROBE_TIMEOUT_MS, authenticator(auth)).catch(
    (err: unknown) => {
      // A server answers there but turns skiff away: starting another one would split the cluster's state.
      if (isAuthError(err)) {
        throw new NatsConnectError(
          `the NATS server at ${probeUrl} refused the connection: ${messageOf(err)}${authHint(err, auth)}; or set SKIFF_NATS_URL`,
          { cause: err },
        );
      }
      return undefined;
    },
  );
  if (probed !== undefined) return ready(probed, probeUrl, undefined, opts.logger, "probe");
  opts.logger.warn(
    { probeUrl },
    `NATS credentials are set (SKIFF_NATS_*) but no server answers at ${probeUrl}: starting nats-server with credentials of its own; set SKIFF_NATS_URL to use a particular server`,
  );
  return startInDataFolder(opts, name);
}

/** A nats-server of this data folder's own, admitting only its generated nkey. */
async function startInDataFolder(opts: ConnectNatsOptions, name: string): Promise<NatsHandle> {
  const { server, seed } = await startServer(opts);
  const nc = await dial(server.url, name, DEFAULT_NATS_CONNECT_TIMEOUT_MS, nkeyAuthenticator(seed)).catch(
    async (err: unknown) => {
      await server.stop();
      throw new NatsStartError(`started nats-server at ${server.url} but cannot connect to it: ${messageOf(err)}`, {
        cause: err,
      });
    },
  );
  return ready(nc, server.url, server, opts.logger, "started");
}

async function dial(
  url: string,
  name: string,
  timeout: number,
  authenticator: Authenticator | undefined,
): Promise<NatsConnection> {
  const nc = await connect({
    servers: serverList(url),
    name,
    timeout,
    ...(authenticator === undefined ? {} : { authenticator }),
    maxReconnectAttempts: -1,
    reconnectTimeWait: DEFAULT_NATS_RECONNECT_WAIT_MS,
    // A stack trace captured per request costs ~8% of a sync call's CPU; errors still say what failed.
    noAsyncTraces: true,
  });
  coalesceWrites(nc);
  return nc;
}

function authenticator(auth: NatsAuth | undefined): Authenticator | undefined {
  switch (auth?.kind) {
    case undefined:
      return undefined;
    case "creds":
      // Read at each (re)connect, so a renewed file is picked up without a restart.
      return credsAuthenticator(() => readFileSync(auth.file));
    case "user":
      return usernamePasswordAuthenticator(auth.user, auth.password);
    case "token":
      return tokenAuthenticator(auth.token);
    case "nkey":
      // Read at each (re)connect, as a creds file is.
      return nkeyAuthenticator(() => new TextEncoder().encode(readFileSync(auth.file, "utf8").trim()));
  }
}

function isAuthError(err: unknown): boolean {
  return (
    err instanceof NatsError &&
    (err.code === ErrorCode.AuthorizationViolation ||
      err.code === ErrorCode.AuthenticationExpired ||
      err.code === ErrorCode.BadCreds)
  );
}

/** What to do about a refused connection, naming the variables and never their values. */
function authHint(err: unknown, auth: NatsAuth | undefined): string {
  if (!isAuthError(err)) return "";
  if (auth === undefined) return `; the server requires credentials: set ${NATS_AUTH_VARIABLES}`;
  const given =
    auth.kind === "creds"
      ? `SKIFF_NATS_CREDS (${auth.file})`
      : auth.kind === "user"
        ? "SKIFF_NATS_USER and SKIFF_NATS_PASSWORD"
        : auth.kind === "nkey"
          ? `SKIFF_NATS_NKEY (${auth.file})`
          : "SKIFF_NATS_TOKEN";
  return `; the server does not accept the credentials of ${given}`;
}

const NATS_AUTH_VARIABLES =
  "SKIFF_NATS_CREDS, SKIFF_NATS_USER and SKIFF_NATS_PASSWORD, SKIFF_NATS_TOKEN, or SKIFF_NATS_NKEY";

function serverList(url: string): string[] {
  return url
    .split(",")
    .map((s) => s.trim())
    .filter((s) => s !== "");
}

/** Checks JetStream, logs the choice and builds the handle. */
async function ready(
  nc: NatsConnection,
  url: string,
  server: NatsServerProcess | undefined,
  logger: Logger,
  how: "SKIFF_NATS_URL" | "probe" | "started",
): Promise<NatsHandle> {
  let closing: Promise<void> | undefined;
  const close = () => (closing ??= shutdown(nc, server));
  try {
    await nc.jetstreamManager();
  } catch (err) {
    await close();
    if (err instanceof NatsError && err.code === ErrorCode.JetStreamNotEnabled) {
      throw new JetStreamDisabledError(
        `the NATS server at ${url} has JetStream disabled; skiff keeps its state in JetStream: start nats-server with -js, or point SKIFF_NATS_URL at a server with JetStream`,
        { cause: err },
      );
    }
    throw new NatsConnectError(`cannot reach JetStream on the NATS server at ${url}: ${messageOf(err)}`, {
      cause: err,
    });
  }
  const serverPid = server?.pid;
  const authRequired = nc.info?.auth_required === true;
  const via = {
    SKIFF_NATS_URL: "given by SKIFF_NATS_URL",
    probe: "answering at the probe URL, with the SKIFF_NATS_* credentials",
    started: "started in the data folder",
  }[how];
  logger.info(
    { url, embedded: server !== undefined, serverPid, version: nc.info?.version, authRequired },
    `using NATS server ${url} (${via})`,
  );
  if (!authRequired) {
    logger.warn(
      { url, authRequired },
      `NATS at ${url} accepts connections without credentials: any process that can reach it, app replicas included, can read and write skiff's state (signing keys, tokens, runs); run it with authorization and set ${NATS_AUTH_VARIABLES}`,
    );
  }
  return { nc, url, embedded: server !== undefined, serverPid, serverExited: server?.exited, authRequired, close };
}

async function shutdown(nc: NatsConnection, server: NatsServerProcess | undefined): Promise<void> {
  if (!nc.isClosed()) {
    // drain() waits for a reconnect when the server is gone; do not wait forever.
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<void>((resolve) => {
      timer = setTimeout(resolve, DEFAULT_NATS_DRAIN_TIMEOUT_MS);
    });
    await Promise.race([nc.drain().catch(() => undefined), timeout]);
    // nats.js's drain() resolves at once, neither flushing nor closing, when a subscription of the connection
    // ended on its own (a timeout) and is still listed: the server must still confirm what was published
    // (a PING answered after it), within the same deadline, before the stop calls itself done.
    if (!nc.isClosed()) await Promise.race([nc.flush().catch(() => undefined), timeout]);
    clearTimeout(timer);
    if (!nc.isClosed()) await nc.close();
  }
  await server?.stop();
}

async function startServer(opts: ConnectNatsOptions): Promise<{ server: NatsServerProcess; seed: Uint8Array }> {
  const binary = await findOnPath(NATS_SERVER_BINARY, opts.searchPath);
  if (binary === undefined) {
    throw new NatsStartError(
      `skiff starts a nats-server of its own when SKIFF_NATS_URL is unset, and nats-server is not on the PATH: install it (apt-get install nats-server) or set SKIFF_NATS_URL to a NATS server with JetStream`,
    );
  }
  // The folder holds the seed and the JetStream store (signing keys among it): owner only.
  const dir = path.resolve(opts.dataDir, "nats");
  await mkdir(dir, { recursive: true, mode: 0o700 });
  await chmod(dir, 0o700);
  const seedFile = path.join(dir, STARTED_SERVER_SEED_FILE);
  const seed = await startedServerSeed(seedFile, opts.logger);
  const configFile = path.join(dir, "nats-server.conf");
  await writeFile(configFile, serverConfig(dir, nkeys.fromSeed(seed).getPublicKey()));
  const server = await spawnNatsServer({
    binary,
    args: ["-c", configFile],
    portsDir: dir,
    onLog: (line) => logServerLine(opts.logger, line),
    logger: opts.logger,
  });
  opts.logger.info(
    { serverPid: server.pid, url: server.url, storeDir: dir, seedFile },
    `started nats-server with JetStream; it admits only the nkey in ${seedFile}`,
  );
  return { server, seed };
}

/** The max_payload option and the authorization block exist only in a config file, so the started server gets one. */
function serverConfig(dir: string, userNkey: string): string {
  // JSON string literals are valid quoted strings in the NATS config format.
  return [
    "# Written by skiff each time it starts nats-server; edits are overwritten.",
    "host: 127.0.0.1",
    "port: -1",
    `max_payload: ${STARTED_SERVER_MAX_PAYLOAD_BYTES}`,
    `ports_file_dir: ${JSON.stringify(dir)}`,
    `jetstream { store_dir: ${JSON.stringify(dir)} }`,
    `authorization { users: [ { nkey: ${JSON.stringify(userNkey)} } ] }`,
    "",
  ].join("\n");
}

/**
 * The seed of the started server's user: made on first start, then read back,
 * so a restart on the same data folder admits the same key (and any tool given
 * the file keeps working).
 */
async function startedServerSeed(file: string, logger: Logger): Promise<Uint8Array> {
  const fresh = nkeys.createUser().getSeed();
  // Written aside, then linked into place: the file never exists half-written, and of two
  // processes starting at once, one makes it and both use it.
  const aside = `${file}.${process.pid}.tmp`;
  await rm(aside, { force: true });
  await writeFile(aside, `${new TextDecoder().decode(fresh)}\n`, { mode: 0o600, flag: "wx" });
  try {
    await link(aside, file);
    return fresh;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
  } finally {
    await rm(aside, { force: true });
  }
  if (((await stat(file)).mode & 0o077) !== 0) {
    await chmod(file, 0o600);
    logger.warn({ file }, "the NATS seed file was readable by others; now it is the owner's only (0600)");
  }
  const seed = new TextEncoder().encode((await readFile(file, "utf8")).trim());
  try {
    if (nkeys.fromSeed(seed).getPublicKey().startsWith("U")) return seed;
  } catch {
    // not a seed at all
  }
  throw new NatsStartError(
    `${file} does not hold the nkey seed of a NATS user (SU…) for the server skiff starts; remove it and skiff makes a new one`,
  );
}

function logServerLine(logger: Logger, line: string): void {
  if (line.includes("[ERR]") || line.includes("[FTL]")) logger.error({ nats: line }, "nats-server");
  else if (line.includes("[WRN]")) logger.warn({ nats: line }, "nats-server");
  else logger.debug({ nats: line }, "nats-server");
}
