// New project and service account identifiers (their patterns are in
// account-rules.ts), the service account record kept in KV
// `skiff-service-accounts`, and the directory every process uses to decide
// whether a token's service account still exists.
import { randomBytes } from "node:crypto";
import type { KV, KvEntry } from "nats";
import type { Logger } from "../config/index.js";
import { KvView, jsonOf } from "../nats/index.js";

const ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789";

/** n random characters of ALPHABET, without modulo bias. */
function randomId(n: number): string {
  let out = "";
  while (out.length < n) {
    for (const b of randomBytes(n * 2)) {
      // 252 = 7 * 36: bytes above it would favour the first letters.
      if (b < 252 && out.length < n) out += ALPHABET[b % 36];
    }
  }
  return out;
}

export const newProjectId = (): string => `p-${randomId(12)}`;
export const newServiceAccountId = (): string => `sa-${randomId(16)}`;

/** A service account as stored: never its token. Times are RFC 3339 strings. */
export interface ServiceAccountRecord {
  service_account_id: string;
  project_id: string;
  name: string;
  created_at: string;
  expires_at: string;
  /** "admin" or the service account id that created it. */
  created_by: string;
}

/** The KV key of a service account: project first, so one project's accounts share a prefix. */
export const accountKey = (projectId: string, serviceAccountId: string): string => `${projectId}.${serviceAccountId}`;

export function decodeAccount(entry: KvEntry): ServiceAccountRecord | undefined {
  const v = jsonOf(entry) as Partial<ServiceAccountRecord> | undefined;
  if (
    !v ||
    typeof v.service_account_id !== "string" ||
    typeof v.project_id !== "string" ||
    typeof v.created_at !== "string"
  )
    return undefined;
  if (typeof v.name !== "string" || typeof v.expires_at !== "string") return undefined;
  return v as ServiceAccountRecord;
}

/**
 * Service accounts as every process sees them: the watch-fed view first, a KV
 * get when the view does not know the account (created a moment ago in another
 * process, or the view is still loading).
 */
export class AccountDirectory {
  private readonly view: KvView<ServiceAccountRecord>;

  constructor(
    private readonly kv: KV,
    logger: Logger,
  ) {
    this.view = new KvView({ kv, decode: decodeAccount, logger, name: "service accounts" });
  }

  start(): Promise<void> {
    return this.view.start();
  }

  close(): void {
    this.view.close();
  }

  /**
   * An account this process just deleted (the value at `revision`): refused
   * here at once, before the watch brings the delete.
   */
  deleted(projectId: string, serviceAccountId: string, revision: number): void {
    this.view.delete(accountKey(projectId, serviceAccountId), revision);
  }

  /** The account, from memory when possible; a Promise only on a miss. */
  find(
    projectId: string,
    serviceAccountId: string,
  ): ServiceAccountRecord | undefined | Promise<ServiceAccountRecord | undefined> {
    const key = accountKey(projectId, serviceAccountId);
    return this.view.get(key) ?? this.fetch(key);
  }

  private async fetch(key: string): Promise<ServiceAccountRecord | undefined> {
    const entry = await this.kv.get(key);
    // Not added to the view: the watch is the only writer, so a delete it has
    // already applied can never be undone by a late answer here.
    return entry && entry.operation === "PUT" ? decodeAccount(entry) : undefined;
  }
}
