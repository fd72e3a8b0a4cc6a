// Project secrets in KV `skiff-project-secrets`, keyed `<project>.<name>`.
// Each entry holds the secret's name, times and its value sealed under the
// platform key (AES-256-GCM, webhooks/secrets.ts), with the key as the
// sealing context: a sealed value copied under another key does not open.
// Values leave this module only unsealed for a replica's environment
// (ProjectSecretsView.env); listing gives names and times.
import type { JetStreamManager, KV, KvEntry, NatsConnection } from "nats";
import { buckets, isStreamFull, jsonOf, kvKeys } from "../nats/index.js";
import type { SecretBox } from "../webhooks/index.js";

export interface SecretRecord {
  name: string;
  /** RFC 3339. */
  created_at: string;
  updated_at: string;
  /** The value sealed by the platform key, context `secretKey(project, name)`. */
  sealed: string;
}

export const secretKey = (projectId: string, name: string): string => `${projectId}.${name}`;

export function decodeSecret(entry: KvEntry): SecretRecord | undefined {
  if (entry.operation !== "PUT") return undefined;
  const v = jsonOf(entry) as Partial<SecretRecord> | undefined;
  return v &&
    typeof v.name === "string" &&
    typeof v.sealed === "string" &&
    typeof v.created_at === "string" &&
    typeof v.updated_at === "string"
    ? (v as SecretRecord)
    : undefined;
}

/** A secret as listed: never its value. */
export type SecretInfo = Omit<SecretRecord, "sealed">;

/** KV skiff-project-secrets is at its byte budget. */
export class SecretsStoreFull extends Error {
  override name = "SecretsStoreFull";
}

/** The project has as many secrets as it may have. */
export class TooManySecrets extends Error {
  override name = "TooManySecrets";
}

export class ProjectSecretStore {
  constructor(
    private readonly kv: KV,
    private readonly jsm: JetStreamManager,
    private readonly box: SecretBox,
    /** Most secrets of one project. */
    private readonly maxPerProject: number,
  ) {}

  /** Binds to the provisioned bucket. */
  static async open(nc: NatsConnection, box: SecretBox, maxPerProject: number): Promise<ProjectSecretStore> {
    return new ProjectSecretStore(
      await nc.jetstream().views.kv(buckets.projectSecrets.name, { bindOnly: true }),
      await nc.jetstreamManager(),
      box,
      maxPerProject,
    );
  }

  /** The project's secrets by name, without their values. */
  async list(projectId: string): Promise<SecretInfo[]> {
    const keys = await kvKeys(this.jsm, buckets.projectSecrets.name, `${projectId}.*`);
    const records = await Promise.all(keys.map((k) => this.kv.get(k).then((e) => (e ? decodeSecret(e) : undefined))));
    return records
      .filter((r): r is SecretRecord => r !== undefined)
      .map(({ name, created_at, updated_at }) => ({ name, created_at, updated_at }))
      .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  }

  /**
   * Creates the secret or gives it a new value (compare-and-set: of two
   * writers, the later one tries again on the newer revision).
   * Throws TooManySecrets for a new one past the project's limit.
   */
  async set(projectId: string, name: string, value: string): Promise<{ secret: SecretInfo; created: boolean }> {
    const key = secretKey(projectId, name);
    for (let attempt = 0; ; attempt++) {
      const entry = await this.kv.get(key);
      const before = entry ? decodeSecret(entry) : undefined;
      const now = new Date().toISOString();
      const record: SecretRecord = {
        name,
        created_at: before?.created_at ?? now,
        updated_at: now,
        sealed: this.box.seal(value, key),
      };
      if (!before && (await this.list(projectId)).length >= this.maxPerProject)
        throw new TooManySecrets(
          `project ${projectId} has ${this.maxPerProject} secrets, the most it may have (SKIFF_MAX_SECRETS_PER_PROJECT)`,
        );
      try {
        // A deleted key's marker is a revision too: updating over it is how a deleted name is set again.
        if (entry) await this.kv.update(key, JSON.stringify(record), entry.revision);
        else await this.kv.create(key, JSON.stringify(record));
        const { sealed: _, ...secret } = record;
        return { secret, created: !before };
      } catch (err) {
        if (isStreamFull(err))
          throw new SecretsStoreFull(
            `KV ${buckets.projectSecrets.name} is at its byte budget (SKIFF_KV_MAX_BYTES); delete secrets or raise it`,
          );
        // Another writer changed it first: again, over its revision.
        if (attempt >= 5) throw err;
      }
    }
  }

  /** Deletes a secret; false when there was none. */
  async delete(projectId: string, name: string): Promise<boolean> {
    const key = secretKey(projectId, name);
    const entry = await this.kv.get(key);
    if (!entry || !decodeSecret(entry)) return false;
    try {
      await this.kv.delete(key, { previousSeq: entry.revision });
      return true;
    } catch (err) {
      const now = await this.kv.get(key);
      if (!now || !decodeSecret(now)) return false;
      throw err;
    }
  }
}
