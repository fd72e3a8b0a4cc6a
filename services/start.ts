// Composes a skiff process from its configuration: NATS, provisioning, the
// roles it runs (one table, ROLES, says what each starts, serves and
// closes) and the one port that serves them.
import { mkdir, mkdtemp, readFile, rename, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { randomBytes } from "node:crypto";
import path from "node:path";
import type { DescService } from "@bufbuild/protobuf";
import type { ConnectRouter } from "@connectrpc/connect";
import { InvocationService } from "../gen/skiff/invocation/v4/invocation_pb.js";
import { ManagementService } from "../gen/skiff/management/v2/management_pb.js";
import { startInvocationRole } from "./invocation/index.js";
import { startManagementRole } from "./management/index.js";
import {
  configureSandbox,
  deploymentsDir,
  prepareBundle,
  startRunnerRole,
  DeploymentCache,
  logPublisher,
  type Runner,
  type SandboxOptions,
} from "./runner/index.js";
import { newRunId, openRunContext, queuedRuns, STREAM_BODIES_ABOVE, type RunContext } from "./runs/index.js";
import { AppRegistry, type PrepareBundle } from "./apps/index.js";
import { sameToken, startAuth, type Auth } from "./auth/index.js";
import { startWebhookRole } from "./webhook/index.js";
import { ADDRESS_FILE, type Config, type Role, type Logger } from "./config/index.js";
import {
  HealthState,
  healthRoutes,
  openapiDocuments,
  startServer,
  createStaticFiles,
  type UpgradeHandler,
  type Cors,
} from "./server/index.js";
import { connectNats, provision, StoreWatch, type NatsHandle } from "./nats/index.js";
import { Metrics } from "./metrics/index.js";
import { SKIFF_APIS } from "./apis.js";

export interface Skiff {
  url: string;
  port: number;
  /** This process's number among the workers of SKIFF_WORKERS; undefined when it serves alone. */
  worker: number | undefined;
  nats: NatsHandle;
  health: HealthState;
  /** The runner of the runner role, when this process runs it. */
  runner: Runner | undefined;
  /** Graceful stop: no new requests, in-flight ones finish (up to the shutdown timeout), NATS closes. */
  close(): Promise<void>;
  /** What a close() under way is still waiting for, in words; empty when none is. */
  waitingFor(): string[];
}

/**
 * What the roles of one process share. The registry, the run helpers and
 * auth are built when the first role that uses them starts, and closed once
 * every role has stopped.
 */
interface Shared {
  config: Config;
  nats: NatsHandle;
  logger: Logger;
  /** Address ranges webhooks may reach despite the SSRF guard (resolved once). */
  webhookAllowedCidrs: string[];
  /** The runner role's deployment cache, which the management role uses too when both run here. */
  deployments: DeploymentCache | undefined;
  /** Where replicas and deploy-time steps run (configureSandbox's), for the runner and management roles. */
  sandbox: SandboxOptions | undefined;
  registry(): Promise<AppRegistry>;
  runs(): Promise<RunContext>;
  auth(): Promise<Auth>;
  /** The runner role's runner, once that role started. */
  runner: Runner | undefined;
  metrics: Metrics;
  /** Every store's bytes against its budget. */
  storeWatch: StoreWatch;
}

/** A role once started. */
interface StartedRole {
  /** The handlers of its RPC service. */
  routes?: (router: ConnectRouter) => void;
  /** Takes the port's HTTP/1.1 upgrade requests (the invocation role's WebSockets). */
  upgrade?: UpgradeHandler;
  /** The CORS allow-lists of the resources its REST routes name (the invocation role's apps). */
  cors?: Cors;
  /** Stops it; called once the port is closed, in the reverse of the start order. */
  close?: () => void | Promise<void>;
}

interface RoleSpec {
  /** The RPC service it serves on the port; a role without one works from NATS alone. */
  service?: DescService;
  start(shared: Shared): Promise<StartedRole>;
}

/**
 * Every role, in the order they start; they stop in reverse. The runner
 * comes first: the invocation role hands sync runs to this process's runner
 * directly.
 */
const ROLES: Record<Role, RoleSpec> = {
  // Replicas, deployments, and the runs it takes in (sync over NATS, async
  // queues); closing stops taking runs, then stops the replicas.
  runner: {
    async start(shared) {
      const { config, nats, logger } = shared;
      const runnerRole = await startRunnerRole({
        nc: nats.nc,
        // Replicas and project storage are this process's own: a worker's under its folder.
        dataDir: processDir(config),
        logger,
        registry: await shared.registry(),
        deployments: shared.deployments!,
        runs: await shared.runs(),
        runAckWaitMs: config.runAckWaitMs,
        finalRecordKeepMs: config.finalRecordKeepMs,
        maxAsyncResultBytes: config.maxAsyncResultBytes,
        secretsKey: config.secretsKey,
        projectStorageBytes: config.projectStorageBytes,
        runnerOptions: {
          sandbox: shared.sandbox,
          projectMaxReplicas: config.projectMaxReplicas,
          projectMemoryMb: config.projectMemoryMb,
          logLinesPerSecond: config.replicaLogLinesPerSecond,
          onLogsDropped: (project, app, lines) => shared.metrics.logLinesDropped.inc({ project, app }, lines),
          maxResultBytes: config.maxResultBytes,
        },
      });
      shared.runner = runnerRole.runner;
      const registry = await shared.registry();
      const stopCounting = shared.metrics.replicaCounts(() => replicaCounts(runnerRole.runner, registry));
      return {
        ...runnerRole,
        close: async () => {
          stopCounting();
          await runnerRole.close();
        },
      };
    },
  },
  // Consumes run events and delivers webhooks; closing lets the attempts under way finish.
  webhook: {
    start: ({ config, nats, logger, webhookAllowedCidrs, metrics }) =>
      startWebhookRole({
        nc: nats.nc,
        logger,
        metrics,
        allowedCidrs: webhookAllowedCidrs,
        timeoutMs: config.webhookTimeoutMs,
        secretsKey: config.secretsKey,
        keepMs: config.finalRecordKeepMs,
      }),
  },
  // InvocationService and WebSocket calls; closing waits until the connections the port closed are recorded.
  invocation: {
    service: InvocationService,
    async start(shared) {
      const { config, nats, logger } = shared;
      return startInvocationRole({
        nc: nats.nc,
        logger,
        registry: await shared.registry(),
        runs: await shared.runs(),
        runner: shared.runner,
        maxQueuedRuns: config.maxQueuedRuns,
        storeWatch: shared.storeWatch,
        webhookAllowedCidrs: shared.webhookAllowedCidrs,
        secretsKey: config.secretsKey,
        websocket: {
          authenticator: (await shared.auth()).authenticator,
          limits: {
            idleTimeoutMs: config.websocketIdleTimeoutMs,
            maxMessageBytes: config.websocketMaxMessageBytes,
            maxConnectionsPerApp: config.websocketMaxConnectionsPerApp,
          },
          metrics: shared.metrics,
        },
      });
    },
  },
  // ManagementService (and the dashboard); closing stops its run history and results sweeper.
  management: {
    service: ManagementService,
    async start(shared) {
      const { config, nats, logger } = shared;
      return startManagementRole({
        nc: nats.nc,
        auth: await shared.auth(),
        dataDir: config.dataDir,
        databaseUrl: config.databaseUrl,
        // One embedded history (in dataDir) for every worker of SKIFF_WORKERS: worker 1 projects the events into
        // it (each projector reads every event of the cluster: one per worker cost each call that many times over).
        projectHistory: config.worker === undefined || config.worker === 1,
        signingKey: config.signingKey,
        adminToken: config.adminToken,
        maxProjectUnpackedBytes: config.maxProjectUnpackedBytes,
        maxAppsPerProject: config.maxAppsPerProject,
        replicaMemoryMb: config.replicaMemoryMb,
        maxSecretsPerProject: config.maxSecretsPerProject,
        secretsKey: config.secretsKey,
        historyBudget: {
          maxBytes: config.historyMaxBytes,
          storageShare: config.storageShare,
          watch: shared.storeWatch,
        },
        runs: await shared.runs(),
        prepareBundle: bundleCheck(shared.deployments, shared.sandbox, {
          maxBytes: config.maxBundleBytes,
          maxFiles: config.maxBundleFiles,
          logger,
        }),
        logger,
      });
    },
  },
};

/** A part built on first use; its `close` is queued on `closers` then. */
function onFirstUse<T>(build: () => Promise<T>, close: (part: T) => void, closers: (() => void)[]): () => Promise<T> {
  let part: Promise<T> | undefined;
  return () =>
    (part ??= build().then((built) => {
      closers.push(() => close(built));
      return built;
    }));
}

/**
 * The check of a deployment's bundle that the management role runs: in the
 * runner role's cache when this process runs one (the folder prepared is the
 * one its replicas run), else in a throwaway folder.
 */
function bundleCheck(
  cache: DeploymentCache | undefined,
  sandbox: SandboxOptions | undefined,
  check: { maxBytes: number; maxFiles: number; logger: Logger },
): PrepareBundle {
  return async (digest, bytes, projectId) => {
    if (cache) return cache.get(digest, async () => bytes, projectId);
    const dir = await mkdtemp(path.join(tmpdir(), "skiff-check-"));
    try {
      return await prepareBundle(bytes, path.join(dir, "app"), { ...check, project: projectId, sandbox });
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  };
}

/** Where the dashboard's sign-in page asks where to find the admin token. */
export const SIGN_IN_HINT_PATH = "/sign-in-hint.json";

const isLoopback = (address: string | undefined) =>
  address !== undefined && (address === "::1" || /^(::ffff:)?127\./.test(address));

/**
 * Whether a request's Host (or HTTP/2 :authority) names this machine's
 * loopback: `localhost`, 127.x.x.x or [::1], any port. A page of another
 * site that points its own name at 127.0.0.1 (DNS rebinding) reaches skiff
 * from a loopback peer, but with its own name here.
 */
function loopbackHost(req: { headers: Record<string, string | string[] | undefined> }): boolean {
  const authority = req.headers[":authority"] ?? req.headers.host;
  if (typeof authority !== "string") return false;
  const host = /^(\[[^\]]*\]|[^:]*)(:\d*)?$/.exec(authority.toLowerCase())?.[1];
  return host === "localhost" || host === "[::1]" || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(host ?? "");
}

/**
 * The built dashboard (`npm run build:dashboard`, run by `npm start`), and the
 * sign-in page's hint: the admin token file of this process's data folder, or
 * that SKIFF_ADMIN_TOKEN holds it. The file's path is told to a browser on
 * this machine only (a loopback peer that asked for a loopback name); others
 * hear where it is in general.
 */
function dashboardSite(config: Config): ReturnType<typeof createStaticFiles> {
  const files = createStaticFiles({
    root: path.join(import.meta.dirname, "dashboard", "dist"),
    buildCommand: "npm run build:dashboard",
  });
  return (req, res) => {
    if ((req.url ?? "").split("?", 1)[0] !== SIGN_IN_HINT_PATH) return files(req, res);
    const hint =
      config.adminToken !== undefined
        ? { adminToken: "SKIFF_ADMIN_TOKEN" }
        : {
            adminToken: "file",
            file:
              isLoopback(req.socket.remoteAddress) && loopbackHost(req) ? adminTokenFile(config.dataDir) : undefined,
          };
    const body = JSON.stringify(hint);
    res.writeHead(200, {
      "content-type": "application/json",
      "content-length": Buffer.byteLength(body),
      "cache-control": "no-store",
      "x-content-type-options": "nosniff",
    });
    if (req.method === "HEAD") res.end();
    else res.end(body);
  };
}

const adminTokenFile = (dataDir: string) => path.resolve(dataDir, "admin-token");

/**
 * The folder of what is this process's alone (replicas, deployments, the
 * projects' persistent storage, the embedded run history): a worker's
 * `workers/<n>` in the data folder, so that no two workers attach one
 * storage image or open one embedded database; the data folder itself for a
 * process that serves alone.
 */
export function processDir(config: Pick<Config, "dataDir" | "worker">): string {
  return config.worker === undefined ? config.dataDir : path.join(config.dataDir, "workers", String(config.worker));
}

/** Live replicas of this process's runner, by app and state, for the replicas gauge. */
function replicaCounts(runner: Runner, registry: AppRegistry): [Record<string, string>, number][] {
  const out: [Record<string, string>, number][] = [];
  for (const app of registry.list()) {
    const counts = new Map<string, number>();
    for (const r of runner.replicas(app.project_id, app.app_name)) counts.set(r.state, (counts.get(r.state) ?? 0) + 1);
    for (const [state, n] of counts) out.push([{ project: app.project_id, app: app.app_name, state }, n]);
  }
  return out;
}

/**
 * Async runs waiting or running per app, for the queue-depth gauge: every app
 * the registry holds reads 0 when its queue is empty (the stream lists only
 * subjects that hold messages), and an app it does not hold yet still shows.
 */
export async function queueDepths(
  nats: NatsHandle,
  registry: AppRegistry | undefined,
): Promise<[Record<string, string>, number][]> {
  const depths = new Map<string, [Record<string, string>, number]>();
  for (const app of registry?.list() ?? [])
    depths.set(`${app.project_id}.${app.app_name}`, [{ project: app.project_id, app: app.app_name }, 0]);
  for (const { project, app, count } of await queuedRuns(await nats.nc.jetstreamManager()))
    depths.set(`${project}.${app}`, [{ project, app }, count]);
  return [...depths.values()];
}

function watchNats(handle: NatsHandle, health: HealthState, logger: Logger, metrics: Metrics): void {
  void (async () => {
    for await (const status of handle.nc.status()) {
      if (status.type === "disconnect") {
        health.setNatsConnected(false);
        logger.warn({ server: status.data }, "NATS disconnected");
      } else if (status.type === "reconnect") {
        metrics.natsReconnects.inc();
        health.setNatsConnected(true);
        logger.info({ server: status.data }, "NATS reconnected");
      }
    }
  })();
}

/**
 * The URL a client on this machine reaches `url` at: a server bound to every
 * address (0.0.0.0, ::) is reached on loopback.
 */
export function localUrl(url: string): string {
  const u = new URL(url);
  if (u.hostname === "0.0.0.0") u.hostname = "127.0.0.1";
  else if (u.hostname === "[::]") u.hostname = "[::1]";
  return u.origin;
}

/**
 * Writes the URL this process serves into `<dataDir>/address`, where the CLI
 * finds it (with the admin token); the returned function removes it, unless
 * another process has written its own meanwhile.
 */
async function writeAddressFile(dataDir: string, url: string): Promise<() => Promise<void>> {
  const file = path.join(dataDir, ADDRESS_FILE);
  const text = `${localUrl(url)}\n`;
  await mkdir(dataDir, { recursive: true });
  // Written aside and renamed: a CLI never reads half of it.
  // Named apart per write: two skiffs of one process (tests) may start on one folder at once.
  const aside = `${file}.${process.pid}.${randomBytes(4).toString("hex")}.tmp`;
  await writeFile(aside, text);
  await rename(aside, file);
  return async () => {
    if ((await readFile(file, "utf8").catch(() => "")) === text) await rm(file, { force: true });
  };
}

const LOOPBACK_CIDRS = ["127.0.0.0/8", "::1/128"];

/**
 * Ranges webhooks may reach despite the SSRF guard. With none configured, a
 * skiff bound to loopback (the local default of `npm start`) is a developer's
 * machine: its webhooks may reach loopback receivers, and it says so.
 */
export function webhookAllowedCidrs(config: Config, logger: Logger): string[] {
  if (config.webhookAllowedCidrs !== undefined) return config.webhookAllowedCidrs;
  const loopbackHost = config.host === "localhost" || config.host === "::1" || config.host.startsWith("127.");
  if (!loopbackHost) return [];
  logger.info(
    { allowedCidrs: LOOPBACK_CIDRS },
    "webhooks may reach loopback addresses (SKIFF_HOST is loopback and SKIFF_WEBHOOK_ALLOWED_CIDRS is unset)",
  );
  return LOOPBACK_CIDRS;
}

export async function startSkiff(config: Config, logger: Logger): Promise<Skiff> {
  const health = new HealthState();
  const metrics = new Metrics();
  // App code (replicas, deploy-time steps) runs only in a sandbox unless SKIFF_SANDBOX=off.
  const sandbox =
    config.roles.includes("runner") || config.roles.includes("management")
      ? configureSandbox(config, logger)
      : undefined;
  health.sandbox = sandbox?.enabled;
  const nats = await connectNats({
    url: config.natsUrl,
    credentials: config,
    dataDir: config.dataDir,
    logger,
    name: `skiff ${config.roles.join(",")}`,
  });
  const started: [Role, StartedRole][] = [];
  const closeShared: (() => void)[] = [];
  // The steps of a stop under way, for a stop that overruns SKIFF_STOP_DEADLINE_MS to name.
  const waiting = new Set<string>();
  const step = async (what: string, run: () => void | Promise<void>) => {
    waiting.add(what);
    try {
      await run();
    } finally {
      waiting.delete(what);
    }
  };
  const stopRoles = async () => {
    for (const [name, role] of started.splice(0).reverse())
      await step(`stopping the ${name} role`, () => role.close?.());
    await step("closing the app registry, run helpers and auth", () => {
      for (const close of closeShared.splice(0).reverse()) close();
    });
  };
  try {
    health.setNatsConnected(true);
    health.natsAuth = nats.authRequired;
    watchNats(nats, health, logger, metrics);
    let registry: AppRegistry | undefined;
    const stopQueueDepths = metrics.queueDepths(() => queueDepths(nats, registry));
    closeShared.push(stopQueueDepths);
    await provision(nats.nc, logger, {
      replicas: config.natsReplicas,
      resultTtlSeconds: config.resultTtlSeconds,
      budgets: { settings: config, dataDir: config.dataDir },
    });
    health.setProvisioned();
    // Every store's bytes against its budget: /metrics, a warning at 80 %, /readyz names the full ones.
    const storeWatch = new StoreWatch(nats.nc, logger);
    storeWatch.onFull = (full) => (health.fullStores = full);
    const stopStoreFigures = metrics.storeFigures(() => storeWatch.snapshot());
    storeWatch.start();
    closeShared.push(() => {
      stopStoreFigures();
      void storeWatch.stop();
    });

    const shared: Shared = {
      config,
      nats,
      logger,
      webhookAllowedCidrs: webhookAllowedCidrs(config, logger),
      sandbox,
      deployments: config.roles.includes("runner")
        ? new DeploymentCache(deploymentsDir(processDir(config)), {
            maxBytes: config.maxBundleBytes,
            maxFiles: config.maxBundleFiles,
            logger,
            sandbox,
            // What a deploy says (warnings, build commands' output) goes to the app's log too.
            onLog: logPublisher(nats.nc),
          })
        : undefined,
      registry: onFirstUse(
        async () => (registry = await AppRegistry.start(nats.nc, logger)),
        (registry) => registry.close(),
        closeShared,
      ),
      runs: onFirstUse(
        async () => {
          const runs = await openRunContext(nats.nc, { resultTtlSeconds: config.resultTtlSeconds });
          // Every final record this process writes is a run that ended here.
          runs.store.onFinal((r) => metrics.runEnded(r.project_id, r.app_name, r.status, r.async, r.run_time_ms ?? 0));
          return runs;
        },
        (runs) => runs.close(),
        closeShared,
      ),
      auth: onFirstUse(
        () => startAuth(nats.nc, logger),
        (auth) => auth.close(),
        closeShared,
      ),
      runner: undefined,
      metrics,
      storeWatch,
    };
    const rpc: { service: DescService; routes: (router: ConnectRouter) => void }[] = [];
    for (const name of Object.keys(ROLES) as Role[]) {
      if (!config.roles.includes(name)) continue;
      const spec = ROLES[name];
      const role = await spec.start(shared).catch((err: unknown) => {
        throw new Error(`cannot start the ${name} role: ${err instanceof Error ? err.message : String(err)}`, {
          cause: err,
        });
      });
      started.push([name, role]);
      if (spec.service && role.routes) rpc.push({ service: spec.service, routes: role.routes });
    }
    // Every RPC is authenticated; the views behind it are loaded before the port opens.
    const auth = rpc.length > 0 ? await shared.auth() : undefined;
    for (const { service } of rpc) health.services.add(service.typeName);
    const server = await startServer({
      host: config.host,
      port: config.port,
      maxBodyBytes: config.maxBodyBytes,
      connections: config,
      // An app bundle may be larger than an ordinary request body.
      bodyLimits: new Map([[ManagementService.method.deployApp, Math.max(config.maxBodyBytes, config.maxBundleBytes)]]),
      // Every answer to an invocation carries X-Request-Id, refusals included.
      requestIds: { methods: new Set([InvocationService.method.run]), make: newRunId },
      // A large body for a Custom app streams to its replica instead of being held whole.
      streamedBodies: { methods: new Set([InvocationService.method.run]), above: STREAM_BODIES_ABOVE },
      logger,
      health,
      restServices: rpc.map(({ service }) => service),
      routes: (router) => {
        healthRoutes(router, health);
        for (const { routes } of rpc) routes(router);
      },
      documents: openapiDocuments(SKIFF_APIS),
      // The dashboard comes with the management role, whose API it uses.
      site: config.roles.includes("management") ? dashboardSite(config) : undefined,
      interceptors: auth ? [auth.interceptor] : [],
      admit: auth?.admit,
      uploads: { maxUploads: config.maxUploads, maxProjectUploads: config.maxProjectUploads },
      upgrade: started.find(([, role]) => role.upgrade)?.[1].upgrade,
      worker: config.worker,
      cors: started.find(([, role]) => role.cors)?.[1].cors,
      metrics: {
        metrics,
        authorize: (token) =>
          (auth?.admins.accepts(token) ?? false) ||
          (config.metricsToken !== undefined && sameToken(token, config.metricsToken)),
      },
    });
    const removeAddressFile = await writeAddressFile(config.dataDir, server.url).catch(async (err: unknown) => {
      await server.close(0);
      throw err;
    });
    logger.info(
      { url: server.url, roles: config.roles, nats: nats.url, worker: config.worker },
      `skiff serves ${server.url} (REST, Connect, gRPC-Web on HTTP/1.1; gRPC on h2c)`,
    );
    return {
      url: server.url,
      port: server.port,
      worker: config.worker,
      nats,
      health,
      runner: shared.runner,
      async close() {
        await step(
          `in-flight requests on the port (up to SKIFF_SHUTDOWN_TIMEOUT_MS, ${config.shutdownTimeoutMs} ms)`,
          () => server.close(config.shutdownTimeoutMs),
        );
        await removeAddressFile().catch(() => undefined);
        await stopRoles();
        await step(
          `NATS: draining the connection to ${nats.url}${nats.embedded ? " and stopping its nats-server" : ""}`,
          () => nats.close(),
        );
      },
      waitingFor: () => [...waiting],
    };
  } catch (err) {
    await stopRoles();
    await nats.close();
    throw err;
  }
}
