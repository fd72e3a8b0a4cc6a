// A skiff for one test file: its own nats-server (unless one is given), a
// temporary data folder, every role, a free port, and the admin token the
// bootstrap wrote. Later issues' tests start theirs the same way.
import { spawn, type ChildProcess } from "node:child_process";
import http from "node:http";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { createClient, type Client } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { ManagementService } from "../../gen/skiff/management/v2/management_pb.js";
import { bearerAuth as bearer } from "../../services/auth/bearer.js";
import { loadConfig } from "../../services/config/config.js";
import { silentLogger, type Logger } from "../../services/config/logger.js";
import { startSkiff, type Skiff } from "../../services/start.js";
import { startNatsServer, type TestNats } from "./nats-server.js";
import { SKIFF_SERVER, TEST_ROOT } from "./paths.js";

/**
 * The management clients' calls each on a connection of their own. Reusing an idle keep-alive socket races the
 * server's closing of it (5 s idle; Node's agent lets a socket go after 4 s, by the server's Keep-Alive hint): a
 * test process stalled past that second on a loaded machine sent a call on a socket the server had just closed
 * and got ECONNRESET.
 */
const NEW_CONNECTIONS = new http.Agent({ keepAlive: false });

export interface TestSkiffOptions {
  /** Share a server between several skiffs; default a new one, stopped with this skiff. */
  nats?: TestNats;
  /** Reuse a data folder (a restart); default a new one, removed with this skiff. */
  dataDir?: string;
  /** Extra SKIFF_* settings. */
  env?: Record<string, string>;
  logger?: Logger;
}

export { bearer };

export interface TestSkiff {
  skiff: Skiff;
  url: string;
  nats: TestNats;
  dataDir: string;
  adminToken: string;
  /** The token of p-dev's service account sa-dev. */
  devToken: string;
  /** A Connect client (HTTP/1.1) sending the given token, default the admin token. */
  management(token?: string): Client<typeof ManagementService>;
  /** A REST call with the given token (default the admin token) and JSON body; `body` is the answer's JSON, if any. */
  api(method: string, path: string, body?: unknown, token?: string): Promise<ApiAnswer>;
  close(): Promise<void>;
}

export interface ApiAnswer {
  status: number;
  text: string;
  body: Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any
}

async function api(url: string, method: string, token: string, body: unknown): Promise<ApiAnswer> {
  const res = await fetch(url, {
    method,
    headers: {
      authorization: `Bearer ${token}`,
      ...(body === undefined ? {} : { "content-type": "application/json" }),
    },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  let json: ApiAnswer["body"];
  try {
    json = JSON.parse(text) as ApiAnswer["body"];
  } catch {
    json = {};
  }
  return { status: res.status, text, body: json };
}

export async function startTestSkiff(opts: TestSkiffOptions = {}): Promise<TestSkiff> {
  const nats = opts.nats ?? (await startNatsServer());
  const dataDir = opts.dataDir ?? (await mkdtemp(path.join(tmpdir(), "skiff-data-")));
  const cleanUp = async () => {
    if (!opts.nats) await nats.stop();
    if (!opts.dataDir) await rm(dataDir, { recursive: true, force: true });
  };
  try {
    const config = loadConfig({ SKIFF_NATS_URL: nats.url, SKIFF_PORT: "0", SKIFF_DATA_DIR: dataDir, ...opts.env });
    const skiff = await startSkiff(config, opts.logger ?? silentLogger);
    const adminToken = config.adminToken ?? (await readFile(path.join(dataDir, "admin-token"), "utf8")).trim();
    const devToken = (await readFile(path.join(dataDir, "dev-token"), "utf8")).trim();
    return {
      skiff,
      url: skiff.url,
      nats,
      dataDir,
      adminToken,
      devToken,
      management: (token = adminToken) =>
        createClient(
          ManagementService,
          createConnectTransport({
            baseUrl: skiff.url,
            httpVersion: "1.1",
            interceptors: [bearer(token)],
            nodeOptions: { agent: NEW_CONNECTIONS },
          }),
        ),
      api: (method, p, body, token = adminToken) => api(skiff.url + p, method, token, body),
      async close() {
        await skiff.close();
        await cleanUp();
      },
    };
  } catch (err) {
    await cleanUp();
    throw err;
  }
}

export interface TestRunner {
  skiff: Skiff;
  /** Stops it (once) and removes its data folder. */
  close(): Promise<void>;
}

/**
 * A process with only the runner role, on the NATS server of `of`: a
 * gateway started with SKIFF_ROLES=invocation,management sends its runs to it.
 */
export async function startTestRunner(of: TestSkiff): Promise<TestRunner> {
  const dataDir = await mkdtemp(path.join(tmpdir(), "skiff-runner-"));
  const config = loadConfig({
    SKIFF_NATS_URL: of.nats.url,
    SKIFF_PORT: "0",
    SKIFF_DATA_DIR: dataDir,
    SKIFF_ROLES: "runner",
  });
  const skiff = await startSkiff(config, silentLogger).catch(async (err: unknown) => {
    await rm(dataDir, { recursive: true, force: true });
    throw err;
  });
  let closed: Promise<void> | undefined;
  return {
    skiff,
    close: () => (closed ??= skiff.close().finally(() => rm(dataDir, { recursive: true, force: true }))),
  };
}

/**
 * A runner process (`bin/skiff-server.js --roles runner`) on `natsUrl` with its own data folder, as a second
 * machine would run one: PATH, HOME, the settings given and nothing else of the test's environment; its stderr
 * goes to the test's.
 */
export function spawnRunnerProcess(natsUrl: string, dataDir: string, env: Record<string, string> = {}): ChildProcess {
  return spawn(process.execPath, [SKIFF_SERVER, "--roles", "runner"], {
    cwd: path.resolve(TEST_ROOT, ".."),
    env: {
      PATH: process.env.PATH,
      HOME: process.env.HOME,
      SKIFF_NATS_URL: natsUrl,
      SKIFF_PORT: "0",
      SKIFF_DATA_DIR: dataDir,
      ...env,
    },
    stdio: ["ignore", "ignore", "inherit"],
  });
}

/** A new project of `t` and the token of a service account of it (an hour): a tenant of its own. */
export async function projectWithToken(t: Pick<TestSkiff, "management">, projectId: string): Promise<string> {
  await t.management().createProject({ projectId });
  const made = await t.management().createServiceAccount({
    projectId,
    name: "tenant",
    expiresAt: { seconds: BigInt(Math.floor(Date.now() / 1000) + 3600) },
  });
  return made.token;
}
