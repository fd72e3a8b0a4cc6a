// Projects in KV `skiff-projects`, one key per project id.
import type { KV } from "nats";
import { jsonOf } from "../nats/index.js";

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
  constructor(private readonly kv: KV) {}

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

  async get(projectId: string): Promise<ProjectRecord | undefined> {
    const entry = await this.kv.get(projectId);
    return entry && entry.operation === "PUT" ? decode(jsonOf(entry)) : undefined;
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
