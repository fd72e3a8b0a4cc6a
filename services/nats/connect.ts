// NATS wiring: which server to use (SKIFF_NATS_URL, else one answering at the
// probe URL, else a nats-server started here) and provisioning of every
// stream, KV bucket and object store that nats-layout.ts lists.
import { mkdir, writeFile } from "node:fs/promises";
import path from "node:path";
import { connect, ErrorCode, NatsError, type NatsConnection } from "nats";
import { DEFAULT_NATS_PROBE_URL, type Logger } from "../config/index.js";
import { JetStreamDisabledError, NatsConnectError, NatsStartError, messageOf } from "./errors.js";
import { findOnPath, NATS_SERVER_BINARY, spawnNatsServer, type NatsServerProcess } from "./server-process.js";

export { JetStreamDisabledError, NatsConnectError, NatsProvisionError, NatsStartError } from "./errors.js";
export { provision } from "./provision.js";

/** How long a server at the probe URL has to answer before one is started instead. */
export const DEFAULT_NATS_PROBE_TIMEOUT_MS = 500;
export const DEFAULT_NATS_CONNECT_TIMEOUT_MS = 5_000;
/** Between reconnect attempts to the same server; the client retries forever. */
export const DEFAULT_NATS_RECONNECT_WAIT_MS = 1_000;
/** How long close() lets pending messages flush before it closes the connection anyway. */
export const DEFAULT_NATS_DRAIN_TIMEOUT_MS = 5_000;
/** Largest message a started server accepts: app bundles and results are chunked below it. */
export const STARTED_SERVER_MAX_PAYLOAD_BYTES = 8 * 1024 * 1024;

export interface ConnectNatsOptions {
  /** SKIFF_NATS_URL: one URL or several, comma-separated. */
  url?: string;
  probeUrl?: string;
  /** The started server keeps its config and JetStream store in `<dataDir>/nats`. */
  dataDir: string;
  logger: Logger;
  /** Connection name the server shows in its monitoring. */
  name?: string;
  /** Folders searched for nats-server, in PATH syntax; default the PATH. */
  searchPath?: string;
}

export interface NatsHandle {
  nc: NatsConnection;
  /** The server(s) connected to. */
  url: string;
  /** True when the server was started by this call and stops with close(). */
  embedded: boolean;
  /** Process id of the started server. */
  serverPid?: number;
  /** Drains the connection, then stops a started server. Safe to call more than once. */
  close(): Promise<void>;
}

export async function connectNats(opts: ConnectNatsOptions): Promise<NatsHandle> {
  const name = opts.name ?? "skiff";
  if (opts.url !== undefined) {
    // An empty list would make nats.js fall back to localhost:4222, which is not what was asked.
    if (serverList(opts.url).length === 0) throw new NatsConnectError(`SKIFF_NATS_URL names no server: "${opts.url}"`);
    const nc = await dial(opts.url, name, DEFAULT_NATS_CONNECT_TIMEOUT_MS).catch((err: unknown) => {
      throw new NatsConnectError(
        `cannot connect to the NATS server(s) at ${opts.url} given by SKIFF_NATS_URL: ${messageOf(err)}`,
        { cause: err },
      );
    });
    return ready(nc, opts.url, undefined, opts.logger, "SKIFF_NATS_URL");
  }

  const probeUrl = opts.probeUrl ?? DEFAULT_NATS_PROBE_URL;
  const probed = await dial(probeUrl, name, DEFAULT_NATS_PROBE_TIMEOUT_MS).catch(() => undefined);
  if (probed !== undefined) return ready(probed, probeUrl, undefined, opts.logger, "probe");

  const server = await startServer(opts, probeUrl);
  const nc = await dial(server.url, name, DEFAULT_NATS_CONNECT_TIMEOUT_MS).catch(async (err: unknown) => {
    await server.stop();
    throw new NatsStartError(`started nats-server at ${server.url} but cannot connect to it: ${messageOf(err)}`, {
      cause: err,
    });
  });
  return ready(nc, server.url, server, opts.logger, "started");
}

function dial(url: string, name: string, timeout: number): Promise<NatsConnection> {
  return connect({
    servers: serverList(url),
    name,
    timeout,
    maxReconnectAttempts: -1,
    reconnectTimeWait: DEFAULT_NATS_RECONNECT_WAIT_MS,
    // A stack trace captured per request costs ~8% of a sync call's CPU; errors still say what failed.
    noAsyncTraces: true,
  });
}

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
  const via = {
    SKIFF_NATS_URL: "given by SKIFF_NATS_URL",
    probe: "answering at the probe URL",
    started: "started in the data folder",
  }[how];
  logger.info(
    { url, embedded: server !== undefined, serverPid, version: nc.info?.version },
    `using NATS server ${url} (${via})`,
  );
  return { nc, url, embedded: server !== undefined, serverPid, close };
}

async function shutdown(nc: NatsConnection, server: NatsServerProcess | undefined): Promise<void> {
  if (!nc.isClosed()) {
    // drain() waits for a reconnect when the server is gone; do not wait forever.
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<void>((resolve) => {
      timer = setTimeout(resolve, DEFAULT_NATS_DRAIN_TIMEOUT_MS);
    });
    await Promise.race([nc.drain().catch(() => undefined), timeout]);
    clearTimeout(timer);
    if (!nc.isClosed()) await nc.close();
  }
  await server?.stop();
}

async function startServer(opts: ConnectNatsOptions, probeUrl: string): Promise<NatsServerProcess> {
  const binary = await findOnPath(NATS_SERVER_BINARY, opts.searchPath);
  if (binary === undefined) {
    throw new NatsStartError(
      `no NATS server answers at ${probeUrl} and nats-server is not on the PATH: install it (apt-get install nats-server) or set SKIFF_NATS_URL to a NATS server with JetStream`,
    );
  }
  const dir = path.resolve(opts.dataDir, "nats");
  await mkdir(dir, { recursive: true });
  const configFile = path.join(dir, "nats-server.conf");
  await writeFile(configFile, serverConfig(dir));
  const server = await spawnNatsServer({
    binary,
    args: ["-c", configFile],
    portsDir: dir,
    onLog: (line) => logServerLine(opts.logger, line),
  });
  opts.logger.info({ serverPid: server.pid, url: server.url, storeDir: dir }, "started nats-server with JetStream");
  return server;
}

/** The max_payload option exists only in a config file, so the started server gets one. */
function serverConfig(dir: string): string {
  // JSON string literals are valid quoted strings in the NATS config format.
  return [
    "# Written by skiff each time it starts nats-server; edits are overwritten.",
    "host: 127.0.0.1",
    "port: -1",
    `max_payload: ${STARTED_SERVER_MAX_PAYLOAD_BYTES}`,
    `ports_file_dir: ${JSON.stringify(dir)}`,
    `jetstream { store_dir: ${JSON.stringify(dir)} }`,
    "",
  ].join("\n");
}

function logServerLine(logger: Logger, line: string): void {
  if (line.includes("[ERR]") || line.includes("[FTL]")) logger.error({ nats: line }, "nats-server");
  else if (line.includes("[WRN]")) logger.warn({ nats: line }, "nats-server");
  else logger.debug({ nats: line }, "nats-server");
}
