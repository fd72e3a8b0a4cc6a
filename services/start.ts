// Composes a skiff process from its configuration: NATS, provisioning, the
// roles it runs and the one port that serves them.
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
  startRunnerRole,
  type RunnerRole,
  DeploymentCache,
  type Runner,
} from "./runner/index.js";
import { openRunContext, type RunContext } from "./runs/index.js";
import { AppRegistry } from "./apps/index.js";
import { startAuth, type Auth } from "./auth/index.js";
import { startWebhookRole } from "./webhook/index.js";
import type { Config, Role, Logger } from "./config/index.js";
import { HealthState, healthRoutes, openapiDocuments, startServer, createStaticFiles } from "./server/index.js";
import { connectNats, provision, type NatsHandle } from "./nats/index.js";

export interface Skiff {
  url: string;
  port: number;
  nats: NatsHandle;
  health: HealthState;
  /** The runner of the runner role, when this process runs it. */
  runner: Runner | undefined;
  /** The app registry, when a role of this process follows it. */
  apps: AppRegistry | undefined;
  /** Graceful stop: no new requests, in-flight ones finish (up to the shutdown timeout), NATS closes. */
  close(): Promise<void>;
}

interface RpcRole {
  service: DescService;
  routes: (router: ConnectRouter) => void;
}

interface RoleContext {
  config: Config;
  nats: NatsHandle;
  auth: Auth;
  logger: Logger;
  /** Shared by the management and runner roles of one process. */
  deployments: DeploymentCache | undefined;
  /** The process's app registry and run helpers. */
  apps: AppRegistry;
  runs: RunContext;
  /** The process's runner, when the runner role runs here. */
  runner: Runner | undefined;
  /** Called on close, before NATS closes. */
  onClose: (close: () => void) => void;
  /** Address ranges webhooks may reach despite the SSRF guard (resolved once). */
  webhookAllowedCidrs: string[];
}

/** Roles that serve RPCs on the port; the others work from NATS alone. */
const RPC_ROLES: Partial<Record<Role, (ctx: RoleContext) => Promise<RpcRole>>> = {
  invocation: async ({ config, nats, logger, apps, runs, runner, webhookAllowedCidrs }) => {
    const role = await startInvocationRole({
      nc: nats.nc,
      logger,
      registry: apps,
      runs,
      runner,
      maxQueuedRuns: config.maxQueuedRuns,
      webhookAllowedCidrs,
      secretsKey: config.secretsKey,
    });
    return { service: InvocationService, routes: role.routes };
  },
  management: async ({ config, nats, auth, logger, deployments, runs, onClose }) => {
    const role = await startManagementRole({
      nc: nats.nc,
      auth,
      dataDir: config.dataDir,
      signingKey: config.signingKey,
      adminToken: config.adminToken,
      maxBundleBytes: config.maxBundleBytes,
      runs,
      deployments,
      logger,
    });
    onClose(() => role.close());
    return { service: ManagementService, routes: role.routes };
  },
};

/** The built dashboard (`npm run build:dashboard`, run by `npm start`). */
const dashboardSite = () =>
  createStaticFiles({
    root: path.join(import.meta.dirname, "dashboard", "dist"),
    buildCommand: "npm run build:dashboard",
  });

function watchNats(handle: NatsHandle, health: HealthState, logger: Logger): void {
  void (async () => {
    for await (const s of handle.nc.status()) {
      if (s.type === "disconnect") {
        health.setNatsConnected(false);
        logger.warn({ server: s.data }, "NATS disconnected");
      } else if (s.type === "reconnect") {
        health.setNatsConnected(true);
        logger.info({ server: s.data }, "NATS reconnected");
      }
    }
  })();
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
  // App code (replicas, deploy-time steps) runs only in a sandbox unless SKIFF_SANDBOX=off.
  if (config.roles.includes("runner") || config.roles.includes("management"))
    health.sandbox = configureSandbox(config, logger).enabled;
  const nats = await connectNats({
    url: config.natsUrl,
    credentials: config,
    dataDir: config.dataDir,
    logger,
    name: `skiff ${config.roles.join(",")}`,
  });
  let auth: Auth | undefined;
  let apps: AppRegistry | undefined;
  let runs: RunContext | undefined;
  let runnerRole: RunnerRole | undefined;
  let webhook: { close(): Promise<void> } | undefined;
  const closers: (() => void)[] = [];
  const stopRoles = async () => {
    await webhook?.close();
    for (const close of closers.splice(0)) close();
    await runnerRole?.close();
    runs?.close();
    apps?.close();
    auth?.close();
  };
  try {
    health.setNatsConnected(true);
    health.natsAuth = nats.authRequired;
    watchNats(nats, health, logger);
    await provision(nats.nc, logger);
    health.setProvisioned();

    const runsRunner = config.roles.includes("runner");
    const deployments = runsRunner
      ? new DeploymentCache(deploymentsDir(config.dataDir), { maxBytes: config.maxBundleBytes, logger })
      : undefined;
    // One registry and one set of run helpers for every role of the process that uses them.
    if (config.roles.some((r) => r !== "webhook")) {
      apps = await AppRegistry.start(nats.nc, logger);
      runs = await openRunContext(nats.nc, { resultTtlSeconds: config.resultTtlSeconds });
    }
    if (runsRunner) {
      runnerRole = await startRunnerRole({
        nc: nats.nc,
        dataDir: config.dataDir,
        logger,
        registry: apps!,
        deployments: deployments!,
        runs: runs!,
        runAckWaitMs: config.runAckWaitMs,
      });
    }

    const allowedCidrs = webhookAllowedCidrs(config, logger);
    if (config.roles.includes("webhook")) {
      webhook = await startWebhookRole({
        nc: nats.nc,
        logger,
        allowedCidrs,
        timeoutMs: config.webhookTimeoutMs,
        secretsKey: config.secretsKey,
      });
    }

    const starters = config.roles.map((r) => RPC_ROLES[r]).filter((r) => r !== undefined);
    // Every RPC is authenticated; the views behind it are loaded before the port opens.
    const rpc: RpcRole[] = [];
    if (starters.length > 0) {
      auth = await startAuth(nats.nc, logger);
      for (const start of starters)
        rpc.push(
          await start({
            config,
            nats,
            auth,
            logger,
            deployments,
            apps: apps!,
            runs: runs!,
            runner: runnerRole?.runner,
            onClose: (c) => closers.push(c),
            webhookAllowedCidrs: allowedCidrs,
          }),
        );
    }
    for (const r of rpc) health.services.add(r.service.typeName);
    const server = await startServer({
      host: config.host,
      port: config.port,
      maxBodyBytes: config.maxBodyBytes,
      connections: config,
      // An app bundle may be larger than an ordinary request body.
      bodyLimits: new Map([[ManagementService.method.deployApp, Math.max(config.maxBodyBytes, config.maxBundleBytes)]]),
      logger,
      health,
      restServices: rpc.map((r) => r.service),
      routes: (router) => {
        healthRoutes(router, health);
        for (const r of rpc) r.routes(router);
      },
      documents: openapiDocuments(),
      // The dashboard comes with the management role, whose API it uses.
      site: config.roles.includes("management") ? dashboardSite() : undefined,
      interceptors: auth ? [auth.interceptor] : [],
    });
    logger.info(
      { url: server.url, roles: config.roles, nats: nats.url },
      `skiff serves ${server.url} (REST, Connect, gRPC-Web on HTTP/1.1; gRPC on h2c)`,
    );
    return {
      url: server.url,
      port: server.port,
      nats,
      health,
      runner: runnerRole?.runner,
      apps,
      async close() {
        await server.close(config.shutdownTimeoutMs);
        await stopRoles();
        await nats.close();
      },
    };
  } catch (err) {
    await stopRoles();
    await nats.close();
    throw err;
  }
}
