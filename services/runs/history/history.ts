// What the run history is, whichever database holds it: pages of runs newest
// first (ListRuns, the dashboard), per-minute figures of an app's last hour
// (GetAppStats), one run and its webhook deliveries (GetRun), deleting runs
// past their retention or beyond the newest that fit its byte budget, and the
// projector's writes. Two databases implement it: SQLite embedded in the
// process (sqlite.ts, the default) and a PostgreSQL server that several
// processes share (postgres.ts). Every query walks one index from a known
// point and reads at most a page (or an hour of one app), so what it costs
// does not depend on how many runs are stored.
import type { RunRecord, RunStatus } from "../store.js";

export interface ListQuery {
  pageSize: number;
  /** Run id the previous page ended with (the page token); the page starts below it. */
  after?: string;
  asyncOnly?: boolean;
  status?: RunStatus;
  /** Only runs made at or after this time, ms (the project's creation: a deleted project of that id had the others). */
  sinceMs?: number;
}

/** A run as the history holds it. */
export interface HistoryRun {
  record: RunRecord;
  /** SKIFF_EVENTS sequence of the event the row was last written from; 0 when not known. */
  eventSeq: number;
}

/**
 * The sequence of the event a row was last written from: what its record names (`event_seq`, fed after an
 * acknowledged event: runs/record-feed.ts), else its revision (a row projected from an event's header, as
 * earlier versions did, or after a restart: 0). A row fed after an unacknowledged event (a sync run's) names
 * none, and its revision is its feed message's: no event's (readFromEvent checks what it reads).
 */
export function eventSeqOf(record: RunRecord, revision: number): number {
  const named = (record as { event_seq?: unknown }).event_seq;
  return typeof named === "number" ? named : revision;
}

export interface RunPage {
  /** Newest first, without results. */
  runs: RunRecord[];
  /** The run id to continue after; undefined when there are no more. */
  next: string | undefined;
}

/** The runs of one app queued in one minute. */
export interface MinuteStats {
  /** Start of the minute, ms since the epoch. */
  minuteMs: number;
  runs: number;
  failures: number;
  /** Nearest-rank percentiles of the run times of runs that finished (success or failure); 0 when none did. */
  p50Ms: number;
  p95Ms: number;
  p99Ms: number;
}

/** A row of the runs table, as the projector makes it from an event. */
export interface RunRow {
  run_id: string;
  project_id: string;
  app_name: string;
  status: string;
  async: boolean;
  /** Times as Date.toISOString writes them. */
  queued_at: string;
  started_at: string | null;
  finished_at: string | null;
  run_time_ms: number | null;
  status_code: number | null;
  error_type: string | null;
  record: RunRecord;
  revision: number;
  /** `record` as JSON text, when the event's header carried it as it is kept (saves writing it again). */
  json?: string;
}

/** A webhook delivery that is over, as the projector makes it from its message. */
export interface DeliveryRow {
  run_id: string;
  delivery_id: string;
  project_id: string;
  app_name: string;
  record: unknown;
  revision: number;
}

/** Where the projection of a stream stands. */
export interface Cursor {
  /** The stream's creation time, as its info gives it: a stream made anew is another stream. */
  streamCreated: string;
  lastSeq: number;
}

/** One batch of the projector: the newest state of each run and delivery in it, and the stream position it reaches. */
export interface Batch {
  runs: RunRow[];
  deliveries: DeliveryRow[];
  stream: string;
  streamCreated: string;
  lastSeq: number;
}

/** The right to write the history, held by one projector at a time. */
export interface HistoryWriter {
  cursor(stream: string): Promise<Cursor | undefined>;
  /**
   * Starts `stream` anew from its first message: the rows stay, their revisions (of another
   * stream) are set to 0 so that they hold back nothing, and every other stream's cursor goes.
   * `keepEventSeqs`: the revisions were SKIFF_EVENTS sequences (rows projected from the events
   * themselves): each row's record keeps its own as `event_seq` first (eventSeqOf).
   */
  restart(stream: string, streamCreated: string, keepEventSeqs?: boolean): Promise<void>;
  /** The upserts and the new cursor, all or nothing. An upsert replaces a row only with a later revision, never a final state with one that is not. */
  write(batch: Batch): Promise<void>;
  /** Gives up the right to write; `broken`: its connection failed. */
  release(broken?: boolean): Promise<void>;
}

/** The history's database, with the queries of its dialect. */
export interface HistoryBackend {
  readonly kind: "sqlite" | "postgres";
  list(projectId: string, appName: string | undefined, q: ListQuery): Promise<RunPage>;
  minuteStats(projectId: string, appName: string, fromMs: number, toMs: number): Promise<MinuteStats[]>;
  /** One run; of any app of the project when `appName` is undefined. */
  find(projectId: string, appName: string | undefined, runId: string): Promise<HistoryRun | undefined>;
  deliveries(projectId: string, appName: string, runId: string): Promise<unknown[]>;
  runningSync(limit: number): Promise<RunRecord[]>;
  /** The last sequence of `stream` applied; 0 before the first. */
  position(stream: string): Promise<number>;
  /** Deletes runs made before `beforeMs` (by the time in their ids), and their deliveries; says how many runs. */
  prune(beforeMs: number, batch?: number): Promise<number>;
  /** Deletes every run but the newest `keep` (by run id, which is time), and their deliveries; says how many. */
  pruneToNewest(keep: number, batch?: number): Promise<number>;
  /** Bytes the history's files take: what its budget counts. */
  size(): Promise<number>;
  /** Rows of the runs table (an estimate where counting would cost). */
  rows(): Promise<number>;
  /** Makes the room of deleted rows reusable. */
  vacuum(): Promise<void>;
  /** Rewrites the files compactly, giving their free room back to the disk. */
  compact(): Promise<void>;
  /** How many runs the history holds (a count: for tests and tools, not for requests). */
  count(): Promise<number>;
  /** The right to write, for the projector; undefined while another process holds it. */
  writer(): Promise<HistoryWriter | undefined>;
  close(): Promise<void>;
}

/** Rows deleted by one statement of the retention sweep. */
export const PRUNE_BATCH = 10_000;
export const MINUTE_MS = 60_000;

export const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/** The smallest UUIDv7 of a time: the ids of runs made before it sort below it. */
export function idAt(ms: number): string {
  const hex = Math.max(0, Math.floor(ms)).toString(16).padStart(12, "0").slice(-12);
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-0000-0000-000000000000`;
}

/** The time a UUIDv7 run id was made at, ms: what idAt writes. */
export const timeOfId = (runId: string): number => parseInt(runId.slice(0, 8) + runId.slice(9, 13), 16);

/** Checks a page token: a run id. */
export function pageToken(after: string): string {
  if (!UUID.test(after)) throw new Error(`page token ${JSON.stringify(after)} is not a run id`);
  return after;
}
