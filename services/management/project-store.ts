// Projects in KV `skiff-projects`, one key per project id.
import type { KV, NatsConnection } from "nats";
import { PROJECT_ID } from "../auth/index.js";
import { buckets, jsonOf, kvGetLatest } from "../nats/index.js";

export interface ProjectRecord {
  project_id: string;
  name: string;
  /** RFC 3339. */
  created_at: string;
  /** "admin" or a service account id. */
  created_by: string;
  /**
   * RFC 3339, set when the id was a deleted project's: the runs (and stats)
   * of the project start there, those before are the deleted one's.
   */
  runs_since?: string;
}

function decode(value: unknown): ProjectRecord | undefined {
  const v = value as Partial<ProjectRecord> | undefined;
  return v && typeof v.project_id === "string" && typeof v.name === "string" && typeof v.created_at === "string"
    ? (v as ProjectRecord)
    : undefined;
}

export class ProjectStore {
  constructor(
    private readonly kv: KV,
    /** Reads go through the connection's shared reply subscription (nats/kv-get.ts), not kv.get(). */
    private readonly nc: NatsConnection,
  ) {}

  /** Stores a new project; false when the id is taken (the first writer wins). */
  async create(record: ProjectRecord): Promise<boolean> {
    try {
      // The id was a deleted project's (its delete marker is the key's last entry): what it left is not this one's.
      const before = await this.kv.get(record.project_id);
      const value = before && before.operation !== "PUT" ? { ...record, runs_since: record.created_at } : record;
      await this.kv.create(record.project_id, JSON.stringify(value));
      return true;
    } catch (err) {
      if (await this.get(record.project_id)) return false;
      throw err;
    }
  }

  /**
   * The project's record, read by the bucket's stream leader: every listing of runs asks for it (the time
   * its runs start from), so it is one request on the connection's shared reply subscription, not kv.get()'s
   * own (which makes an error object with a stack to end each).
   */
  async get(projectId: string): Promise<ProjectRecord | undefined> {
    // An id no project can have (a wildcard would name every key's subject) has none.
    if (!PROJECT_ID.test(projectId)) return undefined;
    const entry = await kvGetLatest(this.nc, buckets.projects.name, projectId);
    return entry?.operation === "PUT" ? decode(jsonOf(entry)) : undefined;
  }

  /** Deletes a project's record; false when there was none. */
  async delete(projectId: string): Promise<boolean> {
    const entry = await this.kv.get(projectId);
    if (!entry || entry.operation !== "PUT") return false;
    try {
      await this.kv.delete(projectId, { previousSeq: entry.revision });
      return true;
    } catch (err) {
      if (!(await this.get(projectId))) return false;
      throw err;
    }
  }

  /** Every project, by id. */
  async list(): Promise<ProjectRecord[]> {
    const ids: string[] = [];
    for await (const k of await this.kv.keys()) ids.push(k);
    const records = await Promise.all(ids.map((id) => this.get(id)));
    return records
      .filter((r): r is ProjectRecord => r !== undefined)
      .sort((a, b) => a.project_id.localeCompare(b.project_id));
  }
}
