// Records of async runs in KV `skiff-runs`, one entry per run under
// `{project}.{app}.{run_id}`, from the moment a runner takes the run (or a
// cancel ends it while queued) until a minute after it ended: a queued run's
// record is its queue message, and its `queued` event in the run history.
// Sync runs have none: their record is their events (runs/events.ts), and
// every run's is in the run history, so what NATS holds per run does not
// grow with the history, nor with the queue.
//
// The first write creates the entry only if the run has none, and every
// state change after it is a compare-and-set on the entry's revision; a
// final record (success, failure, cancelled) is never changed again: a
// runner that finishes late, a redelivered message and a cancel racing a
// start or a completion all end in one final state, decided by whichever
// write lands first.
import type { KvEntry, NatsConnection } from "nats";
import { JsErrorCode, allRevisions, buckets, isJsError, kvGetLatest, publishAcked } from "../nats/index.js";

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
  /**
   * The stream sequences of the record's earlier revisions in KV, oldest
   * first: with the latest one's, every message of the run's key, which the
   * record's removal deletes one by one (nats/kv-purge.ts). Not shown.
   */
  prior_revisions?: number[];
}

/** What a WebSocket connection did, written when it closed. */
interface WebSocketSummary {
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

/** Every revision of a record in KV: its earlier ones', then its own (undefined: not known, for a record written before they were kept). */
export function revisionsOf(record: RunRecord, revision: number): number[] | undefined {
  return allRevisions(record.prior_revisions, revision);
}

export function decodeRunRecord(entry: Pick<KvEntry, "operation" | "value">): RunRecord | undefined {
  if (entry.operation !== "PUT") return undefined;
  try {
    const record = JSON.parse(decoder.decode(entry.value)) as RunRecord;
    return record && typeof record.run_id === "string" && typeof record.status === "string" ? record : undefined;
  } catch {
    return undefined;
  }
}

/**
 * A copy of a record to change, written field by field: a spread of a parsed
 * record costs about 5 µs (bench/README.md), and an async run's record is
 * copied for each of its writes. Every field is named (the type makes a new
 * one an error here); those the record lacks stay undefined, which JSON
 * leaves out.
 */
export function copyRecord(r: RunRecord): RunRecord {
  const copy: { [K in keyof Required<RunRecord>]: RunRecord[K] } = {
    run_id: r.run_id,
    project_id: r.project_id,
    app_name: r.app_name,
    path: r.path,
    async: r.async,
    status: r.status,
    queued_at: r.queued_at,
    started_at: r.started_at,
    finished_at: r.finished_at,
    run_time_ms: r.run_time_ms,
    status_code: r.status_code,
    error: r.error,
    webhook_endpoint: r.webhook_endpoint,
    webhook_signed: r.webhook_signed,
    attempts: r.attempts,
    runner: r.runner,
    result: r.result,
    websocket: r.websocket,
    response_bytes: r.response_bytes,
    prior_revisions: r.prior_revisions,
  };
  return copy;
}

const encoder = new TextEncoder();
const decoder = new TextDecoder();
const encode = (record: RunRecord) => encoder.encode(JSON.stringify(record));

/** How many times an update re-reads after losing a compare-and-set before giving up. */
const MAX_CAS_TRIES = 20;

export class RunStore {
  constructor(
    /** The connection its reads and writes go out on (and their events with them, in order). */
    readonly nc: NatsConnection,
  ) {}

  /** The store on `nc`: every read and write is a JetStream request of its own, so nothing is bound first. */
  static async open(nc: NatsConnection): Promise<RunStore> {
    return new RunStore(nc);
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

  /**
   * Writes the first record of a run, only if the run has none (a
   * compare-and-set on "no message yet"): resolves with its revision, or
   * undefined when the run has a record already (a runner or a cancel wrote
   * first).
   */
  async create(record: RunRecord): Promise<{ record: RunRecord; revision: number } | undefined> {
    const subject = `$KV.${buckets.runs.name}.${runKey(record.project_id, record.app_name, record.run_id)}`;
    try {
      const ack = await publishAcked(this.nc, subject, encode(record), { expectedLastSubjectSequence: 0 });
      this.ended(record);
      return { record, revision: ack.seq };
    } catch (err) {
      if (isWrongRevision(err)) return undefined;
      throw err;
    }
  }

  /**
   * Applies `change` to the current record with compare-and-set, re-reading
   * after a lost race. `change` returns the new record, or undefined to leave
   * it (e.g. it is already final). A run with no record yet (a queued run:
   * its queue message holds it) gets `change(queued)` as its first, when
   * `queued` is given, unless another writer came first. Resolves with the
   * record written, or undefined when nothing was written (no record, or
   * change declined).
   */
  async update(
    projectId: string,
    appName: string,
    runId: string,
    change: (record: RunRecord) => RunRecord | undefined,
    queued?: RunRecord,
  ): Promise<RunRecord | undefined> {
    const cur = await this.get(projectId, appName, runId);
    if (cur) return (await this.updateFrom(cur, change))?.record;
    const first = queued && change(queued);
    return first && (await this.create(first))?.record;
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
      const changed = change(cur.record);
      if (!changed) return undefined;
      const next = copyRecord(changed);
      next.prior_revisions = [...(cur.record.prior_revisions ?? []), cur.revision];
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
