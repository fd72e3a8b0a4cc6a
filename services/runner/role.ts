// The runner role of a process: keeps its Runner in step with the app
// registry, and takes runs in for the apps it has deployed (run-intake.ts).
// For each app record it fetches the bundle from object store
// `skiff-bundles` into `<dataDir>/deployments/<digest>/` (once per machine),
// deploys it, and removes the app when its record is deleted. Replicas are
// published to KV `skiff-replicas` and their log lines to SKIFF_LOGS; their
// sandboxes' uids come from KV `skiff-uids` (uids.ts).
//
// Each app has its own queue of reconciliations, so two changes to one app
// apply in order while other apps go on; a reconciliation reads the latest
// record, so a burst of redeploys ends on the newest version without
// deploying each one.
import path from "node:path";
import type { NatsConnection, ObjectStore } from "nats";
import { appKey, type AppRecord, type AppRegistry } from "../apps/index.js";
import type { Logger } from "../config/index.js";
import { buckets, followKv, jsonOf, objectStores } from "../nats/index.js";
import type { RunContext } from "../runs/index.js";
import { ProjectSecretsView } from "../secrets/index.js";
import { createSecretBox } from "../webhooks/index.js";
import { logPublisher } from "./app-logs.js";
import type { DeploymentCache } from "./deployment-cache.js";
import { ProjectStorage } from "./project-storage.js";
import { DEFAULT_REPLICA_REFRESH_MS, ReplicaPublisher } from "./replica-publisher.js";
import { startRunIntake } from "./run-intake.js";
import { Runner, type RunnerOptions } from "./runner.js";
import type { AppLogLine } from "./types.js";
import { UidRegistry } from "./uids.js";

export interface RunnerRoleOptions {
  nc: NatsConnection;
  /** Replica folders go to `<dataDir>/replicas`. */
  dataDir: string;
  logger: Logger;
  /** The process's app registry. */
  registry: AppRegistry;
  /** The process's deployment cache (`<dataDir>/deployments`), shared with its management role. */
  deployments: DeploymentCache;
  /** The process's run helpers. */
  runs: RunContext;
  /** SKIFF_RUN_ACK_WAIT_MS: ack deadline of the run consumers. */
  runAckWaitMs: number;
  /** SKIFF_FINAL_RECORD_KEEP_MS (default ENDED_KEEP_MS): how long a final record stays in KV once acked. */
  finalRecordKeepMs?: number;
  /** SKIFF_MAX_ASYNC_RESULT_BYTES: the largest async result stored; none: no limit. */
  maxAsyncResultBytes?: number;
  /** Tuning of the Runner (timeouts, queue limits); its `uids` default to a UidRegistry on `nc`. */
  runnerOptions?: Omit<RunnerOptions, "workDir" | "logger" | "onLog" | "onReplicaChange">;
  /** How often replicas are re-published to KV (default a third of the bucket's TTL). */
  replicaRefreshMs?: number;
  /** SKIFF_SECRETS_KEY: the platform key that opens project secrets; default the cluster's. */
  secretsKey?: string;
  /** SKIFF_PROJECT_STORAGE_BYTES: the size of each project's persistent storage (default 1 GiB). */
  projectStorageBytes?: number;
}

export interface RunnerRole {
  runner: Runner;
  /**
   * Stops taking runs (those under way finish), stops following the
   * registry, stops every replica gracefully, withdraws the published
   * replicas.
   */
  close(): Promise<void>;
}

const PRUNE_EVERY_MS = 60 * 60 * 1000;
const DEFAULT_STORAGE_BYTES = 1024 * 1024 * 1024;
/** How long a project's secrets must stay unchanged before its replicas are replaced. */
const SECRET_SETTLE_MS = 300;

export const deploymentsDir = (dataDir: string): string => path.join(path.resolve(dataDir), "deployments");

export async function startRunnerRole(opts: RunnerRoleOptions): Promise<RunnerRole> {
  const { nc, logger, registry, deployments } = opts;
  const bundles: ObjectStore = await nc.jetstream().views.os(objectStores.bundles.name);
  const uids = opts.runnerOptions?.uids ?? (await UidRegistry.open(nc));
  const publisher = await ReplicaPublisher.start(nc, logger);
  const publishLog = logPublisher(nc);
  const secrets = await ProjectSecretsView.start(nc, await createSecretBox(nc, { key: opts.secretsKey }), logger);
  // A deploy's import check runs the module as a replica does, with the project's secrets.
  opts.deployments.projectEnv = (projectId) => secrets.env(projectId);
  const storage = new ProjectStorage(opts.dataDir, opts.projectStorageBytes ?? DEFAULT_STORAGE_BYTES, logger);
  // Each project's current incarnation (its record's creation time), from the projects' bucket followed below:
  // a project made again under a deleted one's id while this runner was away gets none of its storage.
  const projectCreated = new Map<string, string>();
  let projectsLoaded!: () => void;
  const projectsReady = new Promise<void>((resolve) => (projectsLoaded = resolve));
  storage.incarnation = async (projectId) => {
    await projectsReady;
    return projectCreated.get(projectId);
  };
  const runner = new Runner({
    ...opts.runnerOptions,
    projectEnv: (projectId) => secrets.env(projectId),
    projectStorage: storage,
    uids,
    workDir: path.join(path.resolve(opts.dataDir), "replicas"),
    logger,
    onLog: publishLog,
    onReplicaChange: (change) => publisher.changed(change),
  });

  /**
   * What this runner has deployed, by app key: a recreated app starts at version 1 again, so the digest counts
   * too. An entry stays as long as the runner holds the app, so that a deletion always finds it; `stale` marks
   * one to deploy again (new secrets) even when its version is the record's.
   */
  const deployed = new Map<
    string,
    { projectId: string; appName: string; version: number; digest: string; stale?: boolean }
  >();
  const queues = new Map<string, Promise<void>>();
  let closed = false;

  publisher.refreshEvery(opts.replicaRefreshMs ?? DEFAULT_REPLICA_REFRESH_MS, () =>
    [...deployed.values()].flatMap(({ projectId, appName }) =>
      runner.replicas(projectId, appName).map((replica) => ({ projectId, appName, replica })),
    ),
  );

  /** A line in the app's own log, so `skiff logs` says why a version is not served. */
  const tellApp = (projectId: string, appName: string, text: string) => {
    const line: AppLogLine = { projectId, appName, replicaId: "runner", stream: "stderr", text, time: new Date() };
    publishLog(line);
  };

  async function fetchBundle(record: AppRecord): Promise<Uint8Array> {
    const data = await bundles.getBlob(record.deployment.object);
    if (!data)
      throw new Error(`bundle ${record.deployment.object} is missing from object store ${objectStores.bundles.name}`);
    return data;
  }

  async function reconcile(projectId: string, appName: string): Promise<void> {
    if (closed) return;
    const key = appKey(projectId, appName);
    const record = registry.get(projectId, appName);
    const have = deployed.get(key);
    if (!record) {
      if (!have) return;
      deployed.delete(key);
      await runner.remove(projectId, appName);
      logger.info({ app: key }, "app removed");
      // Its prepared folder goes now, not at the next hourly prune.
      void prune();
      return;
    }
    const want = record.deployment;
    if (have && !have.stale && have.version === want.version && have.digest === want.digest) return;
    try {
      const ready = await deployments.get(want.digest, () => fetchBundle(record), projectId);
      // A newer record arrived while preparing: its own turn comes next.
      if (closed || registry.get(projectId, appName) !== record) return;
      await runner.deploy({
        projectId,
        appName,
        version: want.version,
        dir: ready.dir,
        config: record.config,
        prepared: ready.prepared,
      });
      deployed.set(key, { projectId, appName, version: want.version, digest: want.digest });
    } catch (err) {
      if (closed) return;
      logger.error({ err, app: key, version: want.version }, `cannot deploy ${key} version ${want.version}`);
      tellApp(
        projectId,
        appName,
        `skiff: version ${want.version} could not be deployed on this runner: ${(err as Error).message}`,
      );
    }
  }

  function schedule(projectId: string, appName: string): void {
    const key = appKey(projectId, appName);
    const next = (queues.get(key) ?? Promise.resolve()).then(() => reconcile(projectId, appName));
    queues.set(key, next);
    void next.finally(() => {
      if (queues.get(key) === next) queues.delete(key);
    });
  }

  /** Prepared folders of bundles no app lists any more go, now and then, so the disk does not fill. */
  const prune = () =>
    deployments
      .prune(new Set(registry.list().flatMap((record) => record.deployments.map((deployment) => deployment.digest))))
      .then((gone) => gone.length > 0 && logger.info({ digests: gone }, "removed prepared deployments no app uses"))
      .catch((err: unknown) => logger.warn({ err }, "cannot prune prepared deployments"));
  const pruner = setInterval(() => void prune(), PRUNE_EVERY_MS).unref();
  void prune();

  const stopWatching = registry.onChange((change) =>
    change.kind === "put"
      ? schedule(change.record.project_id, change.record.app_name)
      : schedule(change.projectId, change.appName),
  );
  for (const record of registry.list()) schedule(record.project_id, record.app_name);

  // A secret set or deleted: the project's apps are deployed again, so new replicas (with the new
  // values) start and take over before the old ones drain, as for a new version. Changes within
  // SECRET_SETTLE_MS of each other (several secrets set at once) make one replacement.
  const settling = new Map<string, NodeJS.Timeout>();
  const replaceProject = (projectId: string) => {
    settling.delete(projectId);
    if (closed) return;
    for (const [key, app] of deployed)
      if (app.projectId === projectId) {
        app.stale = true;
        logger.info({ app: key }, "a project secret changed; replacing the app's replicas");
        schedule(app.projectId, app.appName);
      }
  };
  const unfollowSecrets = secrets.onChange((projectId) => {
    clearTimeout(settling.get(projectId));
    settling.set(
      projectId,
      setTimeout(() => replaceProject(projectId), SECRET_SETTLE_MS),
    );
  });
  const stopFollowingSecrets = () => {
    unfollowSecrets();
    for (const timer of settling.values()) clearTimeout(timer);
    settling.clear();
  };
  logger.info({ apps: registry.list().length }, "runner role follows the app registry");

  // A deleted project: its apps are removed here at once (their records' deletions may come later), then its
  // persistent storage, once no replica of it is left. A deletion made while this runner was away is replayed
  // by the watch at start (the bucket keeps the delete marker), so its storage goes then.
  const removals = new Map<string, Promise<void>>();
  const projectGone = (projectId: string, incarnation: string | undefined) => {
    if (removals.has(projectId)) return;
    const apps = [...deployed.entries()].filter(([, app]) => app.projectId === projectId);
    const removal = (async () => {
      await Promise.allSettled(
        apps.map(([key, app]) => {
          deployed.delete(key);
          return runner.remove(app.projectId, app.appName);
        }),
      );
      // An app whose record went first is being removed by its own turn: wait for it too.
      await Promise.allSettled([...queues.values()]);
      if (closed) return;
      // Only the deleted project's: the id may have been given to a new project meanwhile.
      await storage.remove(projectId, incarnation);
      logger.info({ project: projectId }, "project deleted: its replicas stopped and its persistent storage removed");
    })()
      .catch((err: unknown) => logger.error({ err, project: projectId }, "cannot remove a deleted project's storage"))
      .finally(() => removals.delete(projectId));
    removals.set(projectId, removal);
  };
  const projects = followKv({
    kv: await nc.jetstream().views.kv(buckets.projects.name, { bindOnly: true }),
    name: buckets.projects.name,
    logger,
    shouldStop: () => nc.isClosed(),
    onEntry: (entry) => {
      if (entry.operation !== "PUT") {
        const gone = projectCreated.get(entry.key);
        projectCreated.delete(entry.key);
        projectGone(entry.key, gone);
        return;
      }
      const created = (jsonOf(entry) as { created_at?: unknown } | undefined)?.created_at;
      if (typeof created === "string") projectCreated.set(entry.key, created);
    },
  });
  void projects.ready.then(projectsLoaded);

  const stopDeploying = async () => {
    closed = true;
    clearInterval(pruner);
    stopWatching();
    stopFollowingSecrets();
    secrets.stop();
    projects.stop();
    await Promise.allSettled([...queues.values(), ...removals.values()]);
    await runner.close();
    await storage.close();
    await publisher.close();
  };
  const intake = await startRunIntake({
    nc,
    runner,
    registry,
    runs: opts.runs,
    logger,
    ackWaitMs: opts.runAckWaitMs,
    finalRecordKeepMs: opts.finalRecordKeepMs,
    maxAsyncResultBytes: opts.maxAsyncResultBytes,
  }).catch(async (err: unknown) => {
    await stopDeploying();
    throw err;
  });
  return {
    runner,
    async close() {
      await intake.close();
      await stopDeploying();
    },
  };
}
