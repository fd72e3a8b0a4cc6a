// The management role of a process: its stores, the key it signs tokens
// with, and the bootstrap of the admin and dev tokens.
import type { ConnectRouter } from "@connectrpc/connect";
import type { NatsConnection } from "nats";
import type { PrepareBundle } from "../apps/index.js";
import { type Auth, issueToken } from "../auth/index.js";
import type { Logger } from "../config/index.js";
import { buckets, objectStores } from "../nats/index.js";
import { ProjectSecretStore } from "../secrets/index.js";
import { createSecretBox } from "../webhooks/index.js";
import type { HistoryBudgetOptions, RunContext } from "../runs/index.js";
import { ensureAdminToken, ensureDevAccount } from "./bootstrap.js";
import { AppObserver } from "./app-observe.js";
import { AppStore } from "./app-store.js";
import type { AppDeps, ManagementDeps } from "./deps.js";
import { ProjectStore } from "./project-store.js";
import { routes } from "./routes.js";
import { startRunApi } from "./runs.js";
import { ServiceAccountStore } from "./service-account-store.js";

interface ManagementRoleOptions {
  nc: NatsConnection;
  auth: Auth;
  dataDir: string;
  /** SKIFF_DATABASE_URL: the run history's PostgreSQL; undefined, SQLite in `dataDir` (every worker's one). */
  databaseUrl: string | undefined;
  /** Whether this process projects the run events into the history (default true; with SKIFF_WORKERS, worker 1). */
  projectHistory?: boolean;
  /** SKIFF_SIGNING_KEY. */
  signingKey: string | undefined;
  /** SKIFF_ADMIN_TOKEN. */
  adminToken: string | undefined;
  /** SKIFF_HISTORY_MAX_BYTES and how its default is made; without, the run history is bounded by age only. */
  historyBudget?: HistoryBudgetOptions;
  /** SKIFF_MAX_PROJECT_UNPACKED_BYTES. */
  maxProjectUnpackedBytes: number;
  maxAppsPerProject: number;
  /** SKIFF_REPLICA_MEMORY_MB, for the deploy's warning of an app that asks for more. */
  replicaMemoryMb?: number;
  /** SKIFF_MAX_SECRETS_PER_PROJECT. */
  maxSecretsPerProject: number;
  /** SKIFF_SECRETS_KEY: the platform key project secrets are sealed with; default the cluster's. */
  secretsKey: string | undefined;
  /** The process's run helpers. */
  runs: RunContext;
  /**
   * The check a deployment passes (start.ts: in the runner role's cache when
   * this process runs one, so the bundle is not prepared twice).
   */
  prepareBundle: PrepareBundle;
  logger: Logger;
}

interface ManagementRole {
  routes(router: ConnectRouter): void;
  /** Stops projecting run records and sweeping results, and closes the run history. */
  close(): Promise<void>;
}

export async function startManagementRole(opts: ManagementRoleOptions): Promise<ManagementRole> {
  const js = opts.nc.jetstream();
  const key = await opts.auth.keyring.signingKey(opts.signingKey);
  const projects = new ProjectStore(await js.views.kv(buckets.projects.name, { bindOnly: true }), opts.nc);
  const deps: ManagementDeps = {
    projects,
    serviceAccounts: new ServiceAccountStore(
      await js.views.kv(buckets.serviceAccounts.name, { bindOnly: true }),
      await opts.nc.jetstreamManager(),
      (projectId, id, revision) => opts.auth.accounts.deleted(projectId, id, revision),
    ),
    apps: await appDeps(opts),
    secrets: await ProjectSecretStore.open(
      opts.nc,
      await createSecretBox(opts.nc, { key: opts.secretsKey }),
      opts.maxSecretsPerProject,
    ),
    runs: await startRunApi({
      nc: opts.nc,
      logger: opts.logger,
      runs: opts.runs,
      databaseUrl: opts.databaseUrl,
      dataDir: opts.dataDir,
      project: opts.projectHistory,
      historyBudget: opts.historyBudget,
      projectCreatedAt: async (projectId) => {
        const record = await projects.get(projectId);
        return record && (record.runs_since === undefined ? 0 : Date.parse(record.runs_since));
      },
    }),
    issueToken: (subject) => issueToken(key, subject),
    logger: opts.logger,
  };
  const adminToken = await ensureAdminToken({
    dataDir: opts.dataDir,
    configured: opts.adminToken,
    admins: opts.auth.admins,
  });
  const devToken = await ensureDevAccount({
    dataDir: opts.dataDir,
    deps,
    authenticator: opts.auth.authenticator,
    logger: opts.logger,
  });
  opts.logger.info(
    { adminTokenFile: adminToken ?? null, devTokenFile: devToken, kid: key.kid },
    `admin token: ${adminToken ?? "from SKIFF_ADMIN_TOKEN"}; dev token (project p-dev): ${devToken}`,
  );
  return { routes: (router) => routes(router, deps), close: () => deps.runs.close() };
}

async function appDeps(opts: ManagementRoleOptions): Promise<AppDeps> {
  const js = opts.nc.jetstream();
  const store = new AppStore(
    await js.views.kv(buckets.apps.name, { bindOnly: true }),
    await opts.nc.jetstreamManager(),
    await js.views.os(objectStores.bundles.name),
  );
  return {
    store,
    observer: await AppObserver.start(opts.nc),
    maxProjectUnpackedBytes: opts.maxProjectUnpackedBytes,
    maxAppsPerProject: opts.maxAppsPerProject,
    replicaMemoryMb: opts.replicaMemoryMb,
    prepare: opts.prepareBundle,
  };
}
