// Service accounts in KV `skiff-service-accounts`, keyed `<project>.<id>`.
// Deletes leave a DEL marker: the watches of every process see it and stop
// accepting the account's tokens.
import type { JetStreamManager, KV } from "nats";
import { accountKey, decodeAccount, type ServiceAccountRecord } from "../auth/index.js";
import { buckets, kvKeys } from "../nats/index.js";

export class ServiceAccountStore {
  /**
   * `onDeleted`: told of each delete this store made, with the revision it
   * removed, so that this process's own token checks refuse the account at
   * once rather than when its watch brings the DEL marker.
   */
  constructor(
    private readonly kv: KV,
    private readonly jsm: JetStreamManager,
    private readonly onDeleted: (projectId: string, serviceAccountId: string, revision: number) => void = () => {},
  ) {}

  /** Stores a new account; false when the key exists. */
  async create(record: ServiceAccountRecord): Promise<boolean> {
    try {
      await this.kv.create(accountKey(record.project_id, record.service_account_id), JSON.stringify(record));
      return true;
    } catch (err) {
      if (await this.get(record.project_id, record.service_account_id)) return false;
      throw err;
    }
  }

  async get(projectId: string, serviceAccountId: string): Promise<ServiceAccountRecord | undefined> {
    return (await this.entry(projectId, serviceAccountId))?.record;
  }

  /** Replaces an account only if it is still at `revision`; false when someone changed it first. */
  async update(record: ServiceAccountRecord, revision: number): Promise<boolean> {
    try {
      await this.kv.update(accountKey(record.project_id, record.service_account_id), JSON.stringify(record), revision);
      return true;
    } catch {
      return false;
    }
  }

  async entry(
    projectId: string,
    serviceAccountId: string,
  ): Promise<{ record: ServiceAccountRecord; revision: number } | undefined> {
    const entry = await this.kv.get(accountKey(projectId, serviceAccountId));
    const record = entry && entry.operation === "PUT" ? decodeAccount(entry) : undefined;
    return record && entry ? { record, revision: entry.revision } : undefined;
  }

  /** The accounts of one project, oldest first. */
  async list(projectId: string): Promise<ServiceAccountRecord[]> {
    const keys = await kvKeys(this.jsm, buckets.serviceAccounts.name, `${projectId}.*`);
    const records = await Promise.all(
      keys.map((k) => this.kv.get(k).then((e) => (e && e.operation === "PUT" ? decodeAccount(e) : undefined))),
    );
    return records
      .filter((r): r is ServiceAccountRecord => r !== undefined)
      .sort(
        (a, b) => a.created_at.localeCompare(b.created_at) || a.service_account_id.localeCompare(b.service_account_id),
      );
  }

  /** Deletes an account; false when there was none. */
  async delete(projectId: string, serviceAccountId: string): Promise<boolean> {
    const found = await this.entry(projectId, serviceAccountId);
    if (!found) return false;
    try {
      // Only the revision we saw: of two concurrent deletes, one answers 404.
      await this.kv.delete(accountKey(projectId, serviceAccountId), { previousSeq: found.revision });
      this.onDeleted(projectId, serviceAccountId, found.revision);
      return true;
    } catch (err) {
      if (!(await this.get(projectId, serviceAccountId))) return false;
      throw err;
    }
  }
}
