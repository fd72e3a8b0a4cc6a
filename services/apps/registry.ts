// The deployed apps as every process sees them: an in-memory view of KV
// `skiff-apps` fed by a watch, so that a runner learns of a new deployment
// and the invocation gateway answers 404 for an unknown app or Cortex
// function without a network hop. Writes go through the management role
// (compare-and-set on the KV entry); this module only defines the record
// and reads it.
import type { KV, KvEntry, NatsConnection } from "nats";
import type { AppConfig } from "./app-config.js";
import { followKv, jsonOf, type KvFollower, buckets } from "../nats/index.js";
import type { Logger } from "../config/index.js";

/** How long start() waits for the current apps before going on (the watch keeps filling the view). */
const DEFAULT_REGISTRY_INIT_TIMEOUT_MS = 5_000;

/** One deployment of an app. Times are RFC 3339. */
export interface DeploymentRecord {
  version: number;
  created_at: string;
  bundle_bytes: number;
  /** What the deployment takes on disk: its bundle's tar, or what its build left (dependencies included), bytes. */
  unpacked_bytes?: number;
  /** sha256 of the bundle, hex: the cache key of unpacked deployments. */
  digest: string;
  /** "admin" or a service account id. */
  created_by: string;
  /** Name of the bundle in object store `skiff-bundles`. */
  object: string;
}

/** An app as stored in KV `skiff-apps` under appKey(project, app). */
export interface AppRecord {
  project_id: string;
  app_name: string;
  /** skiff.toml of the current deployment, defaults applied. */
  config: AppConfig;
  /** The current deployment. */
  deployment: DeploymentRecord;
  /** Earlier deployments whose bundles are kept, oldest first, then the current one. */
  deployments: DeploymentRecord[];
  /** Cortex: the public functions of the current deployment; absent for a Custom app. */
  functions?: string[];
  created_at: string;
  updated_at: string;
}

export const appKey = (projectId: string, appName: string): string => `${projectId}.${appName}`;

export function decodeAppRecord(value: unknown): AppRecord | undefined {
  const v = value as Partial<AppRecord> | undefined;
  if (
    !v ||
    typeof v.project_id !== "string" ||
    typeof v.app_name !== "string" ||
    typeof v.config !== "object" ||
    v.config === null
  )
    return undefined;
  if (
    typeof v.deployment?.version !== "number" ||
    typeof v.deployment.digest !== "string" ||
    typeof v.deployment.object !== "string"
  )
    return undefined;
  if (!Array.isArray(v.deployments) || typeof v.created_at !== "string" || typeof v.updated_at !== "string")
    return undefined;
  return v as AppRecord;
}

type AppChange = { kind: "put"; record: AppRecord } | { kind: "delete"; projectId: string; appName: string };

export class AppRegistry {
  private readonly apps = new Map<string, AppRecord>();
  private readonly listeners = new Set<(change: AppChange) => void>();
  private follower: KvFollower | undefined;

  private constructor(
    private readonly logger: Logger,
    private readonly kv: KV,
  ) {}

  /** Binds KV `skiff-apps` and resolves once the current apps are loaded (or the wait timed out). */
  static async start(
    nc: NatsConnection,
    logger: Logger,
    timeoutMs = DEFAULT_REGISTRY_INIT_TIMEOUT_MS,
  ): Promise<AppRegistry> {
    const kv = await nc.jetstream().views.kv(buckets.apps.name, { bindOnly: true });
    const registry = new AppRegistry(logger, kv);
    registry.follower = followKv({
      kv,
      name: "apps",
      logger,
      initTimeoutMs: timeoutMs,
      onEntry: (e) => registry.apply(e),
    });
    await registry.follower.ready;
    return registry;
  }

  get(projectId: string, appName: string): AppRecord | undefined {
    return this.apps.get(appKey(projectId, appName));
  }

  /**
   * The app as get() has it or, when the view does not have it yet, as KV has it now: a call right after its
   * app's deploy finds it even while the watch is behind (a loaded process, another process's deploy). The
   * watch, in order, then brings the view to KV's latest as it does for every entry.
   */
  async lookup(projectId: string, appName: string): Promise<AppRecord | undefined> {
    const known = this.get(projectId, appName);
    if (known) return known;
    let entry: KvEntry | null;
    try {
      entry = await this.kv.get(appKey(projectId, appName));
    } catch {
      return undefined; // a name no key can have (KV refuses it), or NATS unreachable: not found
    }
    if (entry) this.apply(entry);
    return this.get(projectId, appName);
  }

  /** Every app, or those of one project. */
  list(projectId?: string): AppRecord[] {
    const all = [...this.apps.values()];
    return projectId === undefined ? all : all.filter((a) => a.project_id === projectId);
  }

  /** Calls `listener` on every change seen from now on; returns a function that stops it. */
  onChange(listener: (change: AppChange) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  close(): void {
    this.listeners.clear();
    this.follower?.stop();
  }

  private apply(entry: KvEntry): void {
    const record = entry.operation === "PUT" ? decodeAppRecord(jsonOf(entry)) : undefined;
    if (entry.operation === "PUT" && !record) this.logger.warn({ key: entry.key }, "unreadable app record ignored");
    const had = this.apps.get(entry.key);
    let change: AppChange | undefined;
    if (record) {
      if (had?.deployment.version === record.deployment.version && had.updated_at === record.updated_at) return;
      this.apps.set(entry.key, record);
      change = { kind: "put", record };
    } else if (had) {
      this.apps.delete(entry.key);
      change = { kind: "delete", projectId: had.project_id, appName: had.app_name };
    }
    if (!change) return;
    for (const listener of this.listeners) {
      try {
        listener(change);
      } catch (err) {
        this.logger.error({ err, key: entry.key }, "app change listener failed");
      }
    }
  }
}
