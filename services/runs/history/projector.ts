// The projection of the run records into the history's `runs` table: every
// run event's record also goes into the record feed (runs/record-feed.ts:
// `skiff.history.runs` in stream SKIFF_HISTORY, the records of one write of
// a connection in one message), so an ordered consumer of that stream reads
// each state change of every run, sync or async, many a message. Its webhook
// deliveries that are over (header `Skiff-Delivery`, on
// `skiff.history.delivered.…`) go to table `webhook_deliveries` in the same
// writes. Records are upserted in batches (up to `batchSize` of them, or what
// arrived within `batchMs`), each batch written with the stored cursor (the
// last stream sequence applied), all or nothing. A restart resumes at cursor
// + 1, so it never reads the stream from the start again; start-up does not
// wait for it. A first start reads first the events an earlier version
// published without the feed (SKIFF_EVENTS, each with its record in a
// header), from the cursor that version left, up to the feed's start.
//
// One projector writes at a time: it holds the history's writer
// (HistoryBackend.writer: with a shared PostgreSQL, a session-level advisory
// lock), and processes sharing one database wait for it and take over (from
// the stored cursor) when it is given up. Writes thus keep stream order, and
// an upsert only replaces a row of a lower sequence (and never a final state
// by one that is not), so a batch applied twice is applied once. What the
// projector holds is the batch it is making and the one being written:
// nothing per stored run.
import {
  AckPolicy,
  ConsumerEvents,
  DeliverPolicy,
  nanos,
  type ConsumerMessages,
  type JsMsg,
  type StreamInfo,
  type NatsConnection,
} from "nats";
import type { Logger } from "../../config/index.js";
import { streams, subjects } from "../../nats/index.js";
import { DELIVERY_RECORD_HEADER, RUN_RECORD_HEADER, recordOfText, withoutResult } from "../events.js";
import { isFinal, type RunStatus } from "../status.js";
import type { RunRecord } from "../store.js";
import type { Batch, DeliveryRow, HistoryBackend, HistoryWriter, RunRow } from "./history.js";

/** The events: what earlier versions projected, from each one's header. */
export const RUNS_STREAM = streams.events.name;
/** The record feed and the webhook deliveries: what the history follows. */
export const FEED_STREAM = streams.history.name;
/** The stream projected before the events carried their records (the run bucket's): its cursor is moved once. */
const OLD_STREAM = "KV_skiff-runs";

const DEFAULT_BATCH_SIZE = 500;
const DEFAULT_BATCH_MS = 50;
/** How often a process that does not hold the projector's lock tries for it; also the pause after a failure. */
const DEFAULT_LEADER_RETRY_MS = 2_000;

/**
 * The feed's messages the projector's consumer holds at most (nats.js asks for more once three quarters are
 * read): each carries up to 256 KiB of records, so this bounds a catch-up to 8 MiB of them (a thousand, as for
 * the events, held hundreds of megabytes). Counted in messages, not bytes: a pull by bytes that a message does
 * not fit ends without one, and nats.js waits for that pull's expiry (30 s) before the next.
 */
const FEED_PULL_MESSAGES = 32;

/** How long the server keeps the projector's consumer after its process went silent. */
const CONSUMER_IDLE_MS = 60_000;
/** Events after which the consumer cannot be trusted to deliver every message. */
const LOST = new Set<string>([
  ConsumerEvents.ConsumerDeleted,
  ConsumerEvents.ConsumerNotFound,
  ConsumerEvents.StreamNotFound,
]);

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

export interface ProjectorOptions {
  nc: NatsConnection;
  backend: HistoryBackend;
  logger: Logger;
  batchSize?: number;
  batchMs?: number;
  leaderRetryMs?: number;
}

/** A time as skiff writes them (Date.toISOString), taken as it is. */
const ISO_UTC = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/;

const iso = (v: unknown): string | null | undefined => {
  if (v === undefined || v === null) return null;
  if (typeof v === "string" && ISO_UTC.test(v)) return v;
  const ms = typeof v === "string" ? Date.parse(v) : NaN;
  return Number.isFinite(ms) ? new Date(ms).toISOString() : undefined;
};

/**
 * The row of a run record (an event's `Skiff-Run` header, whose text is `text`) at stream sequence
 * `revision`; undefined when it is not one.
 */
export function rowOf(r: RunRecord, revision: number, text?: string): RunRow | undefined {
  if (!UUID.test(r.run_id) || typeof r.project_id !== "string" || typeof r.app_name !== "string") return undefined;
  const queued = iso(r.queued_at);
  const started = iso(r.started_at);
  const finished = iso(r.finished_at);
  if (!queued || started === undefined || finished === undefined) return undefined;
  const num = (v: unknown) => (typeof v === "number" && Number.isFinite(v) ? v : null);
  const statusCode = num(r.status_code);
  // The listing never shows results: their bytes stay in KV and the object store.
  const slim = withoutResult(r);
  return {
    run_id: r.run_id,
    project_id: r.project_id,
    app_name: r.app_name,
    status: r.status,
    async: r.async === true,
    queued_at: queued,
    started_at: started,
    finished_at: finished,
    run_time_ms: num(r.run_time_ms),
    status_code: statusCode !== null && Number.isInteger(statusCode) ? statusCode : null,
    error_type: typeof r.error?.type === "string" ? r.error.type : null,
    record: slim,
    revision,
    // The header's text is the record's JSON as it is kept, unless something had to be left out of it.
    json: slim === r && text !== undefined && !text.includes("\\u0000") ? text : undefined,
  };
}

/** The delivery of a `Skiff-Delivery` header at stream sequence `revision`; undefined when it is not one. */
function deliveryRowOf(text: string | undefined, revision: number): DeliveryRow | undefined {
  let d: Record<string, unknown>;
  try {
    d = JSON.parse(text ?? "") as Record<string, unknown>;
  } catch {
    return undefined;
  }
  const { run_id, delivery_id, project_id, app_name } = d ?? {};
  if (typeof run_id !== "string" || !UUID.test(run_id) || typeof delivery_id !== "string" || delivery_id === "")
    return undefined;
  if (typeof project_id !== "string" || typeof app_name !== "string") return undefined;
  return { run_id, delivery_id, project_id, app_name, record: d, revision };
}

/** The subjects of webhook deliveries that are over (`skiff.history.delivered.`, in the feed's stream). */
const DELIVERY_PREFIX = subjects.deliveryRecordsAll.slice(0, -1);
/** Where an earlier version put them: `skiff.history.deliveries.` of SKIFF_EVENTS. */
const EARLIER_DELIVERY_PREFIX = subjects.earlierDeliveryRecordsAll.slice(0, -1);

interface Pending {
  /** Last message per run id in this batch: only the newest state of a run is written. */
  byRun: Map<string, RunRow>;
  /** Last record per delivery (run id and delivery id). */
  deliveries: Map<string, DeliveryRow>;
  messages: number;
  /** Run records and deliveries read into it (a message of the feed has many). */
  records: number;
  lastSeq: number;
}

const emptyBatch = (): Pending => ({ byRun: new Map(), deliveries: new Map(), messages: 0, records: 0, lastSeq: 0 });

export class RunProjector {
  /** Stream messages applied by this projector since it started. */
  applied = 0;
  /** Whether this process holds the projector's lock and follows the stream. */
  leading = false;
  /** Batches handed to the writer and not yet written (or failed): one, two for a moment, at most. */
  queued = 0;
  private stopped = false;
  private messages: ConsumerMessages | undefined;
  private readonly loop: Promise<void>;
  private wakeSleep: (() => void) | undefined;
  private readonly batchSize: number;
  private readonly batchMs: number;
  private readonly retryMs: number;

  constructor(private readonly opts: ProjectorOptions) {
    this.batchSize = opts.batchSize ?? DEFAULT_BATCH_SIZE;
    this.batchMs = opts.batchMs ?? DEFAULT_BATCH_MS;
    this.retryMs = opts.leaderRetryMs ?? DEFAULT_LEADER_RETRY_MS;
    this.loop = this.run();
  }

  /** Stops following the stream and gives up the lock; a batch not yet written is left for the next projector. */
  async stop(): Promise<void> {
    this.stopped = true;
    this.messages?.stop();
    this.wakeSleep?.();
    await this.loop;
  }

  private sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(resolve, ms);
      this.wakeSleep = () => {
        clearTimeout(timer);
        resolve();
      };
    });
  }

  private async run(): Promise<void> {
    const { backend, logger } = this.opts;
    while (!this.stopped && !this.opts.nc.isClosed()) {
      let writer: HistoryWriter | undefined;
      let broken = false;
      try {
        writer = await backend.writer();
        if (writer !== undefined) {
          this.leading = true;
          await this.follow(writer);
        }
      } catch (err) {
        broken = true;
        if (!this.stopped) logger.warn({ err }, "run history: projecting the run stream failed; trying again");
      } finally {
        this.leading = false;
        await writer?.release(broken).catch(() => undefined);
      }
      if (!this.stopped) await this.sleep(this.retryMs);
    }
  }

  /** Follows the record feed from the stored cursor until stopped or until something fails. */
  private async follow(writer: HistoryWriter): Promise<void> {
    const { nc, logger } = this.opts;
    const jsm = await nc.jetstreamManager();
    const feed = await jsm.streams.info(FEED_STREAM);
    const cursor = await writer.cursor(FEED_STREAM);
    let from = cursor?.lastSeq ?? 0;
    if (cursor === undefined || cursor.streamCreated !== feed.created) {
      // No cursor of the feed: a first start (or one of a version that projected the events themselves),
      // whose events before the feed began are read that way first; or the feed's stream was made anew (a
      // new NATS store). Either way the rows stay (the history is where runs are kept), and their sequences,
      // of another stream, must not hold back the ones to come: the feed is followed from its start.
      if (cursor === undefined) await this.projectEarlierEvents(writer, feed);
      else
        logger.warn({ stream: FEED_STREAM }, "run history: following a stream new to it from its start; the rows stay");
      if (this.stopped) return;
      // After the earlier events, the rows' revisions are their events' sequences: each row keeps its own.
      await writer.restart(FEED_STREAM, feed.created, cursor === undefined);
      from = 0;
    }
    logger.debug({ from }, "run history: following the record feed");
    await this.project(writer, { stream: FEED_STREAM, from, created: feed.created });
  }

  /**
   * The events of SKIFF_EVENTS that an earlier version published without the record feed: from the cursor
   * it left there (or the stream's start) up to the first message of the feed, read from their headers.
   */
  private async projectEarlierEvents(writer: HistoryWriter, feed: StreamInfo): Promise<void> {
    const { nc, logger } = this.opts;
    const jsm = await nc.jetstreamManager();
    const info = await jsm.streams.info(RUNS_STREAM);
    const cursor = await writer.cursor(RUNS_STREAM);
    let from = cursor?.lastSeq ?? 0;
    const old = cursor ? undefined : await writer.cursor(OLD_STREAM);
    if ((cursor && cursor.streamCreated !== info.created) || old) {
      // The events' stream was made anew, or the history was projected from the run bucket before.
      await writer.restart(RUNS_STREAM, info.created);
      from = 0;
    }
    if (info.state.messages === 0 || info.state.last_seq <= from) return;
    // Events published since the feed began have their records in it: those before it only are read here.
    const feedFrom =
      feed.state.messages > 0
        ? (await jsm.streams.getMessage(FEED_STREAM, { seq: feed.state.first_seq })).time.getTime()
        : Infinity;
    logger.info(
      { from, until: info.state.last_seq },
      "run history: projecting the events stored before the record feed",
    );
    await this.project(writer, {
      stream: RUNS_STREAM,
      from,
      until: info.state.last_seq,
      untilMs: feedFrom,
      created: info.created,
    });
  }

  /**
   * Projects `stream` from `from` + 1: the record feed and the deliveries until stopped or, with `until`,
   * SKIFF_EVENTS's events (their headers, as earlier versions did) up to sequence `until` or the first
   * stored after `untilMs`; each batch is written with the cursor (`stream`, `created`).
   */
  private async project(
    writer: HistoryWriter,
    o: { stream: string; from: number; until?: number; untilMs?: number; created: string },
  ): Promise<void> {
    const { nc } = this.opts;
    const js = nc.jetstream();
    const events = o.until !== undefined;
    // An ordered stream of messages from the cursor on: an ephemeral consumer without acks, whose delivery
    // sequence must go up by one; a gap (or a lost consumer) ends this follow, and the next starts anew from
    // the stored cursor. The events' bodies (a run's response) stay on the server: headers only for them;
    // the feed's records are its messages' bodies.
    const jsm = await nc.jetstreamManager();
    const ci = await jsm.consumers.add(o.stream, {
      ...(o.from === 0
        ? { deliver_policy: DeliverPolicy.All }
        : { deliver_policy: DeliverPolicy.StartSequence, opt_start_seq: o.from + 1 }),
      ...(events ? { headers_only: true } : {}),
      ack_policy: AckPolicy.None,
      inactive_threshold: nanos(CONSUMER_IDLE_MS),
      mem_storage: true,
      num_replicas: 1,
      description: "run history projector",
    });
    const consumer = await js.consumers.get(o.stream, ci.name);
    const messages = (this.messages = await consumer.consume({
      max_messages: events ? this.batchSize * 2 : FEED_PULL_MESSAGES,
    }));
    if (this.stopped) messages.stop();
    void (async () => {
      for await (const s of await messages.status())
        if (LOST.has(s.type)) messages.stop(new Error(`run history: the projector's consumer reported ${s.type}`));
    })().catch(() => undefined);

    let batch = emptyBatch();
    let writing: Promise<void> = Promise.resolve();
    let failure: unknown;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const flush = (): Promise<void> => {
      clearTimeout(timer);
      timer = undefined;
      if (batch.messages === 0) return writing;
      const b = batch;
      batch = emptyBatch();
      this.queued++;
      writing = writing.then(async () => {
        try {
          if (failure !== undefined || this.stopped) return;
          const out: Batch = {
            runs: [...b.byRun.values()],
            deliveries: [...b.deliveries.values()],
            stream: o.stream,
            streamCreated: o.created,
            lastSeq: b.lastSeq,
          };
          await writer.write(out);
          this.applied += b.messages;
        } catch (err) {
          failure = err;
          messages.stop();
        } finally {
          this.queued--;
        }
      });
      return writing;
    };
    // A batch whose time is up goes to the writer when the writer is free; while a write is under way it keeps
    // filling (up to batchSize, when the stream's intake waits), so that a slow or stuck database holds two
    // batches, not one more every batchMs.
    const due = () => {
      timer = undefined;
      if (this.queued === 0) void flush();
      else timer = setTimeout(due, this.batchMs);
    };
    try {
      let delivered = 0;
      for await (const m of messages) {
        if (failure !== undefined || this.stopped) break;
        if (m.info.deliverySequence !== ++delivered)
          throw new Error("run history: a message of the run stream was lost");
        // An event stored after the feed began is in it: the earlier events end there (to the millisecond, as
        // the feed's first message gives its time; one of the same millisecond is read, twice then).
        if (events && Math.floor(m.info.timestampNanos / 1e6) > (o.untilMs ?? Infinity)) break;
        if (events) this.addEvent(batch, m);
        else this.addFed(batch, m);
        if (o.until !== undefined && m.seq >= o.until) break;
        if (batch.records >= this.batchSize) {
          // The writer takes this batch once the one before it is written; meanwhile the next batch fills,
          // so reading the stream and writing the database go on side by side (at most two batches held).
          const before = writing;
          void flush();
          await before;
        } else timer ??= setTimeout(due, this.batchMs);
      }
      await flush();
    } finally {
      clearTimeout(timer);
      messages.stop();
      await writing;
      await jsm.consumers.delete(o.stream, ci.name).catch(() => undefined);
    }
    if (failure !== undefined) throw failure;
  }

  /** A message of the record feed or a webhook delivery. */
  private addFed(batch: Pending, m: JsMsg): void {
    if (m.subject !== subjects.historyRuns) return this.addEvent(batch, m);
    batch.messages++;
    batch.lastSeq = m.seq;
    const lines = m.string().split("\n");
    for (const text of lines) {
      const record = recordOfText(text);
      if (record === undefined) {
        this.opts.logger.warn(
          { subject: m.subject, seq: m.seq },
          "run history: a line of the record feed is not a run record",
        );
        continue;
      }
      this.addRecord(batch, m, record, text);
    }
  }

  /** An event (its header's record) or a webhook delivery. */
  private addEvent(batch: Pending, m: JsMsg): void {
    batch.messages++;
    batch.lastSeq = m.seq;
    if (m.subject.startsWith(DELIVERY_PREFIX) || m.subject.startsWith(EARLIER_DELIVERY_PREFIX)) {
      const row = deliveryRowOf(m.headers?.get(DELIVERY_RECORD_HEADER), m.seq);
      batch.records++;
      if (row) batch.deliveries.set(`${row.run_id}/${row.delivery_id}`, row);
      else this.opts.logger.warn({ subject: m.subject, seq: m.seq }, "run history: not a webhook delivery record");
      return;
    }
    const text = m.headers?.get(RUN_RECORD_HEADER);
    const record = recordOfText(text);
    // Events of versions that did not carry the record were projected from the run bucket then.
    if (record === undefined) return;
    this.addRecord(batch, m, record, text);
  }

  private addRecord(batch: Pending, m: JsMsg, record: RunRecord, text: string | undefined): void {
    batch.records++;
    const row = rowOf(record, m.seq, text);
    if (row === undefined) {
      this.opts.logger.warn({ subject: m.subject, seq: m.seq }, "run history: an event's record is not a run record");
      return;
    }
    // As the statement does it: a final state is never replaced by one that is not.
    const prev = batch.byRun.get(row.run_id);
    if (prev !== undefined && isFinal(prev.status as RunStatus) && !isFinal(row.status as RunStatus)) return;
    batch.byRun.delete(row.run_id); // keeps the map in arrival order
    batch.byRun.set(row.run_id, row);
  }
}
