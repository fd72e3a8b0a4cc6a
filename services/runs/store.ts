// Records of async runs in KV `skiff-runs`, one entry per run under
// `{project}.{app}.{run_id}`, so GetRun of a run in flight is a single get.
// Sync runs have none: their record is their events (runs/events.ts), and
// every run's is in the run history. The bucket keeps a record a while
// after its last write (SKIFF_RESULT_TTL plus a day, two days at least: long
// enough for a run that waited and ran 12 h, and for its kept result); the
// run history keeps it SKIFF's 30 days, so what NATS holds per run does not
// grow with the history.
//
// Every state change after the first write is a compare-and-set on the
// entry's revision, and a final record (success, failure, cancelled) is
// never changed again: a runner that finishes late, a redelivered message
// and a cancel racing a completion all end in one final state, decided by
// whichever write lands first.
import { headers, type KV, type KvEntry, type NatsConnection } from "nats";
import { JsErrorCode, buckets, isJsError, kvGetLatest, publishAcked } from "../nats/index.js";

import { isFinal, type RunStatus } from "./status.js";

export { RUN_STATUSES, isFinal, type RunStatus } from "./status.js";

export interface RunErrorInfo {
  /** Exception type of a Cortex function, or a platform reason: timeout, replica_crashed, cancelled, runner_lost... */
  type: string;
  message: string;
}

/** A result kept for GetRun (SKIFF_RESULT_TTL): inline when small, else an object in `skiff-results`. */
export interface StoredResult {
  content_type: string;
  /** base64 of the body, when it is inline. */
  data?: string;
  /** Name in object store `skiff-results`, when it is not. */
  object?: string;
  /** RFC 3339; after it the result reads as gone. */
  expires_at: string;
}

/** A run as stored. Times are RFC 3339. The webhook secret is never here. */
export interface RunRecord {
  run_id: string;
  project_id: string;
  app_name: string;
  /** Function of a Cortex app, or path of a Custom app. */
  path: string;
  async: boolean;
  status: RunStatus;
  queued_at: string;
  started_at?: string;
  finished_at?: string;
  run_time_ms?: number;
  status_code?: number;
  error?: RunErrorInfo;
  webhook_endpoint?: string;
  webhook_signed?: boolean;
  /** Times the run was started (a redelivery after a lost runner counts again). */
  attempts: number;
  /** Process running it now, for cancel and diagnosis. */
  runner?: string;
  result?: StoredResult;
  /** A WebSocket run's connection, once it closed (its status_code is the app's 101). */
  websocket?: WebSocketSummary;
  /** Bytes of the answer's body the caller got (a streamed answer's chunks together); set when the run ends. */
  response_bytes?: number;
}

/** What a WebSocket connection did, written when it closed. */
export interface WebSocketSummary {
  /** The first close frame's code, either way (skiff's own when skiff closed it); 1006 when the connection dropped without one. */
  close_code: number;
  close_reason: string;
  /** Who sent that close frame; for 1006, whose side dropped first. */
  closed_by: "caller" | "app" | "skiff";
  /** Bytes of frames from the caller to the app, and from the app to the caller. */
  bytes_in: number;
  bytes_out: number;
  /** Whole data messages each way. */
  messages_in: number;
  messages_out: number;
}

export const runKey = (projectId: string, appName: string, runId: string): string => `${projectId}.${appName}.${runId}`;

export function decodeRunRecord(entry: Pick<KvEntry, "operation" | "value">): RunRecord | undefined {
  if (entry.operation !== "PUT") return undefined;
  try {
    const record = JSON.parse(decoder.decode(entry.value)) as RunRecord;
    return record && typeof record.run_id === "string" && typeof record.status === "string" ? record : undefined;
  } catch {
    return undefined;
  }
}

const encoder = new TextEncoder();
const decoder = new TextDecoder();
const encode = (record: RunRecord) => encoder.encode(JSON.stringify(record));

/** How many times an update re-reads after losing a compare-and-set before giving up. */
const MAX_CAS_TRIES = 20;

export class RunStore {
  constructor(
    readonly kv: KV,
    /** The connection its writes go out on (and their events with them, in order). */
    readonly nc: NatsConnection,
  ) {}

  static async open(nc: NatsConnection): Promise<RunStore> {
    return new RunStore(await nc.jetstream().views.kv(buckets.runs.name, { bindOnly: true }), nc);
  }

  async get(
    projectId: string,
    appName: string,
    runId: string,
  ): Promise<{ record: RunRecord; revision: number } | undefined> {
    const key = runKey(projectId, appName, runId);
    // From the stream's leader, as kv.get() does on this binding (never a replica's stale copy: see kv-get.ts).
    const entry = await kvGetLatest(this.nc, buckets.runs.name, key);
    const record = entry ? decodeRunRecord(entry) : undefined;
    return record && entry ? { record, revision: entry.revision } : undefined;
  }

  private readonly finalListeners = new Set<(record: RunRecord) => void>();

  /**
   * Calls `listener` with every final record this store writes (a run that
   * ended, counted once: a final record is never written again); returns a
   * function that stops it.
   */
  onFinal(listener: (record: RunRecord) => void): () => void {
    this.finalListeners.add(listener);
    return () => this.finalListeners.delete(listener);
  }

  /**
   * Tells the onFinal listeners of a record written: by this store, or
   * elsewhere (a sync run's final record is its event); one not final is no news.
   */
  ended(record: RunRecord): void {
    if (this.finalListeners.size === 0 || !isFinal(record.status)) return;
    for (const listener of this.finalListeners) listener(record);
  }

  /** Writes the first record of a run; fails if the run id exists. */
  async create(record: RunRecord): Promise<void> {
    await this.kv.create(runKey(record.project_id, record.app_name, record.run_id), encode(record));
    this.ended(record);
  }

  /**
   * The first record of a run as a plain NATS publish that the server stores
   * only if the run has no record yet (an expected last sequence of 0): no
   * acknowledgement is awaited, and a record a runner or a cancel wrote
   * first is never overwritten. For the `queued` record of an async run,
   * whose queue message carries the same record (a runner that finds no
   * record creates it from the message).
   */
  createUnacked(record: RunRecord): void {
    const h = headers();
    h.set("Nats-Expected-Last-Subject-Sequence", "0");
    this.nc.publish(
      `$KV.${buckets.runs.name}.${runKey(record.project_id, record.app_name, record.run_id)}`,
      encode(record),
      { headers: h },
    );
  }

  /**
   * Applies `change` to the current record with compare-and-set, re-reading
   * after a lost race. `change` returns the new record, or undefined to leave
   * it (e.g. it is already final). Resolves with the record written, or
   * undefined when nothing was written (no record, or change declined).
   */
  async update(
    projectId: string,
    appName: string,
    runId: string,
    change: (record: RunRecord) => RunRecord | undefined,
  ): Promise<RunRecord | undefined> {
    const cur = await this.get(projectId, appName, runId);
    return cur && (await this.updateFrom(cur, change))?.record;
  }

  /**
   * update() from a record and revision already read (or written) by the
   * caller: the first compare-and-set goes out without reading again, and
   * only a lost one re-reads. Resolves with the record and revision written.
   */
  async updateFrom(
    known: { record: RunRecord; revision: number },
    change: (record: RunRecord) => RunRecord | undefined,
  ): Promise<{ record: RunRecord; revision: number } | undefined> {
    const { project_id, app_name, run_id } = known.record;
    const subject = `$KV.${buckets.runs.name}.${runKey(project_id, app_name, run_id)}`;
    let cur: { record: RunRecord; revision: number } | undefined = known;
    for (let i = 0; i < MAX_CAS_TRIES && cur; i++) {
      const next = change(cur.record);
      if (!next) return undefined;
      try {
        const ack = await publishAcked(this.nc, subject, encode(next), { expectedLastSubjectSequence: cur.revision });
        this.ended(next);
        return { record: next, revision: ack.seq };
      } catch (err) {
        if (!isWrongRevision(err)) throw err;
      }
      cur = await this.get(project_id, app_name, run_id);
    }
    if (!cur) return undefined;
    throw new Error(`run ${run_id}: record kept changing under ${MAX_CAS_TRIES} updates`);
  }
}

/** JetStream's "wrong last sequence" answer to a compare-and-set that lost. */
export function isWrongRevision(err: unknown): boolean {
  return isJsError(err, JsErrorCode.WrongLastSequence) || /wrong last sequence/i.test((err as Error)?.message ?? "");
}
