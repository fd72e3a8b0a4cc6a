// The live replicas of every runner in KV `skiff-replicas`: one key
// `{project}.{app}.{replica}` each, written by the runner that holds it
// (runner/replica-publisher.ts) and read by GetApp in any management process.

/** The stored value, with the field names of the Replica message. */
export interface ReplicaRecord {
  replica_id: string;
  state: string;
  host: string;
  /** The runner process: host and pid. */
  runner: string;
  in_flight: number;
  deployment_version: number;
  started_at: string;
  /** When this value was written. */
  seen_at: string;
}

export const replicaKey = (projectId: string, appName: string, replicaId: string): string =>
  `${projectId}.${appName}.${replicaId}`;

/** The keys of every replica of an app (subject syntax). */
export const appReplicaKeys = (projectId: string, appName: string): string => `${projectId}.${appName}.*`;

export function encodeReplicaRecord(record: ReplicaRecord): string {
  return JSON.stringify(record);
}

/** The record a value holds, or undefined when it is not one. */
export function decodeReplicaRecord(data: Uint8Array): ReplicaRecord | undefined {
  try {
    const v = JSON.parse(new TextDecoder().decode(data)) as Partial<ReplicaRecord> | null;
    return typeof v?.replica_id === "string" ? (v as ReplicaRecord) : undefined;
  } catch {
    return undefined;
  }
}
