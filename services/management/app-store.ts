// Apps in KV `skiff-apps` (key `{project}.{app}`) and their bundles in
// object store `skiff-bundles` (name `{project}/{app}/{digest}`: content
// addressed, so two deploys racing for one version number never overwrite
// each other's bundle). A new version is recorded with compare-and-set on
// the app's entry and retried on a lost race, so versions never repeat.
import type { JetStreamManager, KV, ObjectStore } from "nats";
import { type AppConfig, appKey, decodeAppRecord, type AppRecord, type DeploymentRecord } from "../apps/index.js";
import { buckets, consumers, isJsError, JsErrorCode, jsonOf, kvKeys, streams, subjects } from "../nats/index.js";

/** Deployments (and their bundles) kept per app, the current one included. */
const KEPT_DEPLOYMENTS = 10;

interface NewDeployment {
  projectId: string;
  config: AppConfig;
  functions: string[] | undefined;
  bytes: Uint8Array;
  /** What the bundle unpacks to (its tar), bytes. */
  unpackedBytes: number;
  digest: string;
  createdBy: string;
}

const bundleObject = (projectId: string, appName: string, digest: string): string =>
  `${projectId}/${appName}/${digest}`;

export class AppStore {
  constructor(
    private readonly kv: KV,
    private readonly jsm: JetStreamManager,
    private readonly bundles: ObjectStore,
  ) {}

  async entry(projectId: string, appName: string): Promise<{ record: AppRecord; revision: number } | undefined> {
    const e = await this.kv.get(appKey(projectId, appName));
    const record = e && e.operation === "PUT" ? decodeAppRecord(jsonOf(e)) : undefined;
    return record && e ? { record, revision: e.revision } : undefined;
  }

  async get(projectId: string, appName: string): Promise<AppRecord | undefined> {
    return (await this.entry(projectId, appName))?.record;
  }

  /** The apps of one project, by name. */
  async list(projectId: string): Promise<AppRecord[]> {
    const names = (await kvKeys(this.jsm, buckets.apps.name, `${projectId}.*`)).map((k) =>
      k.slice(projectId.length + 1),
    );
    const records = await Promise.all(names.map((n) => this.get(projectId, n)));
    return records.filter((r): r is AppRecord => r !== undefined).sort((a, b) => a.app_name.localeCompare(b.app_name));
  }

  /** Stores the bundle, then records it as the app's next version. */
  async deploy(d: NewDeployment): Promise<AppRecord> {
    const appName = d.config.app.name;
    const object = bundleObject(d.projectId, appName, d.digest);
    await this.bundles.putBlob({ name: object }, d.bytes);
    for (;;) {
      const now = new Date().toISOString();
      const found = await this.entry(d.projectId, appName);
      const previous = found?.record;
      const deployment: DeploymentRecord = {
        version: (previous?.deployment.version ?? 0) + 1,
        created_at: now,
        bundle_bytes: d.bytes.length,
        unpacked_bytes: d.unpackedBytes,
        digest: d.digest,
        created_by: d.createdBy,
        object,
      };
      const history = [...(previous?.deployments ?? []), deployment];
      const record: AppRecord = {
        project_id: d.projectId,
        app_name: appName,
        config: d.config,
        deployment,
        deployments: history.slice(-KEPT_DEPLOYMENTS),
        ...(d.functions ? { functions: d.functions } : {}),
        created_at: previous?.created_at ?? now,
        updated_at: now,
      };
      if (!(await this.write(record, found?.revision))) continue; // another deploy won: number after it
      await this.dropBundles(history.slice(0, -KEPT_DEPLOYMENTS), record.deployments);
      return record;
    }
  }

  /** Removes the app and its bundles; undefined when there was no such app. */
  async delete(projectId: string, appName: string): Promise<AppRecord | undefined> {
    for (;;) {
      const found = await this.entry(projectId, appName);
      if (!found) return undefined;
      try {
        await this.kv.delete(appKey(projectId, appName), { previousSeq: found.revision });
      } catch {
        continue; // changed meanwhile (a deploy): delete what is there now
      }
      await this.dropBundles(found.record.deployments, []);
      await this.dropRunQueue(projectId, appName);
      return found.record;
    }
  }

  private async write(record: AppRecord, revision: number | undefined): Promise<boolean> {
    const key = appKey(record.project_id, record.app_name);
    try {
      if (revision === undefined) await this.kv.create(key, JSON.stringify(record));
      else await this.kv.update(key, JSON.stringify(record), revision);
      return true;
    } catch (err) {
      // A lost race shows as a changed revision; anything else is a real failure.
      const now = await this.entry(record.project_id, record.app_name);
      if (now?.revision !== revision) return false;
      throw err;
    }
  }

  /**
   * Deletes the app's durable consumer on SKIFF_RUNS (runners make it again
   * for an app deployed anew), then the runs still queued for it: a work
   * queue keeps them without a consumer, and the next app of that name (a
   * project re-created under the same id is another tenant) would get them
   * all, bodies included, from the new consumer.
   */
  private async dropRunQueue(projectId: string, appName: string): Promise<void> {
    const spec = consumers.runQueue(projectId, appName);
    await this.jsm.consumers.delete(spec.stream, spec.name).catch((err: unknown) => {
      if (!isJsError(err, JsErrorCode.ConsumerNotFound)) throw err;
    });
    await this.jsm.streams.purge(spec.stream, { filter: spec.filterSubject });
    // Its log lines too: the next app of that name shows only its own.
    await this.jsm.streams.purge(streams.logs.name, { filter: subjects.appLogs(projectId, appName) });
  }

  /** Deletes the bundles of `dropped` that no kept deployment still uses. */
  private async dropBundles(dropped: DeploymentRecord[], kept: DeploymentRecord[]): Promise<void> {
    const used = new Set(kept.map((d) => d.object));
    const names = new Set(dropped.map((d) => d.object).filter((o) => !used.has(o)));
    await Promise.all([...names].map((name) => this.bundles.delete(name).catch(() => undefined)));
  }
}
