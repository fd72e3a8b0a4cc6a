// The app methods of ManagementService: deploy, list, get, delete,
// deployments and logs. A bundle is checked whole (size, paths, links,
// skiff.toml or cerebrium.toml) and prepared (dependencies installed, Cortex module loaded)
// before anything is stored, so a bad one is refused with the reason and
// nothing is deployed. Runners learn of a deployment through KV `skiff-apps`.
import { Code, ConnectError, type HandlerContext, type ServiceImpl } from "@connectrpc/connect";
import type { ManagementService } from "../../gen/skiff/management/v2/management_pb.js";
import { PrepareFailed } from "../runs/index.js";
import {
  APP_CONFIG_FILE,
  APP_NAME_PATTERN,
  AppConfigError,
  BundleError,
  sha256,
  type AppConfig,
} from "../apps/index.js";
import { actorOf, principalOf } from "../auth/index.js";
import { DEFAULT_LOG_LIMIT, MAX_LOG_LIMIT } from "./app-observe.js";
import { audit } from "./audit.js";
import { appMessage, deploymentMessage, logLineMessage } from "./convert.js";
import type { ManagementDeps } from "./deps.js";
import * as valid from "./validation.js";

type Impl = ServiceImpl<typeof ManagementService>;
type AppMethods = "deployApp" | "listApps" | "getApp" | "deleteApp" | "listDeployments" | "listAppLogs" | "tailAppLogs";

/** Why a bundle cannot be deployed, as the caller should read it. */
function refusal(err: unknown): ConnectError | undefined {
  if (err instanceof BundleError) return new ConnectError(`bundle refused: ${err.message}`, Code.InvalidArgument);
  if (err instanceof AppConfigError)
    return new ConnectError(`invalid ${err.file}:\n${err.message}`, Code.InvalidArgument);
  if (err instanceof PrepareFailed)
    return new ConnectError(`the app cannot be prepared: ${err.message}`, Code.FailedPrecondition);
  return undefined;
}

export function appHandlers(deps: ManagementDeps): Pick<Impl, AppMethods> {
  const { store, observer } = deps.apps;

  /**
   * The project, or 404, with when it was made: its apps' log lines stored before are another project's of
   * the same id (one deleted, whose apps that never deployed left their deploy's lines), never shown.
   */
  async function projectOf(id: string): Promise<{ projectId: string; madeMs: number }> {
    const projectId = valid.projectId(id);
    const record = await deps.projects.get(projectId);
    if (!record) throw new ConnectError(`project ${projectId} not found`, Code.NotFound);
    return { projectId, madeMs: Date.parse(record.created_at) };
  }

  const project = async (id: string): Promise<string> => (await projectOf(id)).projectId;

  const appNotFound = (appName: string, projectId: string) =>
    new ConnectError(`app ${JSON.stringify(appName.slice(0, 80))} not found in project ${projectId}`, Code.NotFound);

  /** The app's record; none for a malformed name, which cannot name an app. */
  const recordOf = async (projectId: string, appName: string) =>
    APP_NAME_PATTERN.test(appName) ? await store.get(projectId, appName) : undefined;

  /** The app, or 404. */
  async function app(projectIdRaw: string, appName: string) {
    const projectId = await project(projectIdRaw);
    const record = await recordOf(projectId, appName);
    if (!record) throw appNotFound(appName, projectId);
    return record;
  }

  return {
    async deployApp(req, ctx) {
      const p = principalOf(ctx);
      const projectId = await project(req.projectId);
      const bytes = req.bundle?.data ?? new Uint8Array(0);
      const digest = sha256(bytes);
      let ready;
      try {
        ready = await deps.apps.prepare(digest, bytes, projectId);
      } catch (err) {
        throw refusal(err) ?? err;
      }
      const appName = ready.config.app.name;
      const others = (await store.list(projectId)).filter((r) => r.app_name !== appName);
      if (others.length >= deps.apps.maxAppsPerProject && !(await store.get(projectId, appName)))
        throw new ConnectError(
          `project ${projectId} has ${others.length} apps, the most it may have (SKIFF_MAX_APPS_PER_PROJECT): delete one, or deploy a new version of an existing app`,
          Code.ResourceExhausted,
        );
      // The app's own current deployment is replaced, so it does not count; records from before sizes were
      // kept count with their gzipped size.
      const othersBytes = others.reduce((n, r) => n + (r.deployment.unpacked_bytes ?? r.deployment.bundle_bytes), 0);
      const limit = deps.apps.maxProjectUnpackedBytes;
      if (othersBytes + ready.unpackedBytes > limit)
        throw new ConnectError(
          `this deployment takes ${ready.unpackedBytes} bytes (its files, with the dependencies its build installed) ` +
            `and the current deployments of project ${projectId}'s ` +
            `other apps to ${othersBytes}: together more than the limit of ${limit} bytes ` +
            "(SKIFF_MAX_PROJECT_UNPACKED_BYTES): delete an app, or deploy a smaller bundle",
          Code.ResourceExhausted,
        );
      const record = await store.deploy({
        projectId,
        config: ready.config,
        functions: ready.prepared.functions,
        bytes,
        unpackedBytes: ready.unpackedBytes,
        digest,
        createdBy: actorOf(p),
      });
      const d = record.deployment;
      audit(deps.logger, p, "app.deploy", `${projectId}/${record.app_name}`, {
        version: d.version,
        digest: d.digest,
        bundle_bytes: d.bundle_bytes,
        unpacked_bytes: d.unpacked_bytes,
      });
      return {
        app: appMessage(record, await observer.replicas(projectId, record.app_name)),
        warnings: [...ready.warnings, ...memoryWarning(ready.config, deps.apps.replicaMemoryMb)],
      };
    },

    async listApps(req) {
      const projectId = await project(req.projectId);
      const records = await store.list(projectId);
      return {
        apps: await Promise.all(
          records.map(async (r) => appMessage(r, await observer.replicas(projectId, r.app_name))),
        ),
      };
    },

    async getApp(req) {
      const record = await app(req.projectId, req.appName);
      return { app: appMessage(record, await observer.replicas(record.project_id, record.app_name)) };
    },

    async deleteApp(req, ctx) {
      const p = principalOf(ctx);
      const record = await app(req.projectId, req.appName);
      if (!(await store.delete(record.project_id, record.app_name)))
        throw new ConnectError(`app ${req.appName} not found in project ${record.project_id}`, Code.NotFound);
      audit(deps.logger, p, "app.delete", `${record.project_id}/${record.app_name}`, {
        version: record.deployment.version,
      });
      return {};
    },

    async listDeployments(req) {
      const record = await app(req.projectId, req.appName);
      return { deployments: [...record.deployments].reverse().map(deploymentMessage) };
    },

    async listAppLogs(req) {
      if (req.limit > MAX_LOG_LIMIT)
        throw new ConnectError(`limit must be at most ${MAX_LOG_LIMIT}, got ${req.limit}`, Code.InvalidArgument);
      const { projectId, madeMs } = await projectOf(req.projectId);
      const record = await recordOf(projectId, req.appName);
      if (!record && !APP_NAME_PATTERN.test(req.appName)) throw appNotFound(req.appName, projectId);
      // An app whose first deploy failed has no record, and its deploy's output (a module that did not load, a
      // build step) is in its log: those lines are shown; none, 404.
      const { lines } = await observer.lines(projectId, req.appName, {
        limit: req.limit || DEFAULT_LOG_LIMIT,
        runId: req.runId || undefined,
        sinceMs: madeMs,
      });
      if (!record && lines.length === 0) throw appNotFound(req.appName, projectId);
      return { lines: lines.map((l) => logLineMessage(l.line)) };
    },
    async *tailAppLogs(req, ctx: HandlerContext) {
      const { projectId, madeMs } = await projectOf(req.projectId);
      const record = await recordOf(projectId, req.appName);
      if (!record) throw appNotFound(req.appName, projectId);
      if (req.backlog > MAX_LOG_LIMIT)
        throw new ConnectError(`backlog must be at most ${MAX_LOG_LIMIT}, got ${req.backlog}`, Code.InvalidArgument);
      // Lines written from here on are followed; older ones come from the backlog, never twice.
      const before = await observer.streamLastSeq();
      const backlog =
        req.backlog > 0
          ? await observer.lines(record.project_id, record.app_name, { limit: req.backlog, sinceMs: madeMs })
          : { lines: [], lastSeq: 0 };
      for (const l of backlog.lines) yield { line: logLineMessage(l.line) };
      for await (const line of observer.follow(
        record.project_id,
        record.app_name,
        Math.max(before, backlog.lastSeq),
        ctx.signal,
      )) {
        yield { line: logLineMessage(line) };
      }
    },
  };
}

/** A deploy's warning of an app that asks more memory a replica than replicas here get: the lower one holds. */
function memoryWarning(config: AppConfig, replicaMemoryMb: number | undefined): string[] {
  const asked = config.resources?.memoryMb;
  if (asked === undefined || replicaMemoryMb === undefined || asked <= replicaMemoryMb) return [];
  return [
    `${config.source ?? APP_CONFIG_FILE}: the app asks for ${asked} MiB a replica; a replica here gets at most ${replicaMemoryMb} MiB (SKIFF_REPLICA_MEMORY_MB), which holds`,
  ];
}
