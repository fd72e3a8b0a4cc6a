// The public run lifecycle events: a `skiff.events.v1.RunEvent` (protobuf
// binary) on `skiff.events.runs.{project}.{app}.{status}` in SKIFF_EVENTS at
// every change of a run's state. An acknowledged terminal event, which may
// be published again (republishFinal: its runner may have died before
// publishing it), carries `Nats-Msg-Id` = `{run_id}.{status}.{attempt}` and
// is deduplicated; other events are never repeated and carry none (the
// server holds every id of the duplicate window in memory).
//
// The event is also the run's record: header `Skiff-Run` carries the run
// record as JSON (without its result), which WatchRuns follows, reading
// headers only; the same text goes to the run history in the connection's
// record feed (record-feed.ts), many records a message. A sync run has no other
// record: each of its state changes is this one publish. An async run keeps
// a KV record as well, for the compare-and-set of its state changes
// (runs/store.ts), and publishes this event after each.
import { MsgHdrsImpl, type MsgHdrs, type NatsConnection } from "nats";
import { publishAcked, publishInBackground, subjects } from "../nats/index.js";
import { runEventBytes, type EventResponse } from "./event-bytes.js";
import { recordFeed } from "./record-feed.js";
import { isFinal } from "./status.js";
import { copyRecord, type RunRecord } from "./store.js";

/**
 * A run still going after this long has its `running` event published; a faster one has none, only its
 * terminal event (a sync run not even a `running` record). Most runs end well within it, so each costs the
 * server one message in and its consumers one delivery less.
 */
export const RUNNING_EVENT_AFTER_MS = 1_000;

/** The header of a run event that holds the run record (JSON, without its result). */
export const RUN_RECORD_HEADER = "Skiff-Run";
/**
 * The header of a message on `skiff.history.delivered.{project}.{app}` (in
 * SKIFF_HISTORY, not a public event) that holds a webhook delivery that is
 * over, as the webhook role recorded it (JSON): the run history keeps it.
 */
export const DELIVERY_RECORD_HEADER = "Skiff-Delivery";

/** Largest response carried inside an event; a larger one is named by `response_object`. */
const MAX_EVENT_RESPONSE_BYTES = 1024 * 1024;
/** Room for the event's other fields and headers within the server's max_payload. */
const EVENT_HEADROOM_BYTES = 16 * 1024;

/** The largest response an event carries on this connection's server. */
export function eventResponseLimit(nc: NatsConnection): number {
  return Math.min(MAX_EVENT_RESPONSE_BYTES, nc.info!.max_payload - EVENT_HEADROOM_BYTES);
}

const eventBytes = (record: RunRecord, response: EventResponse) => runEventBytes(record, response);
const eventId = (record: RunRecord) => `${record.run_id}.${record.status}.${Math.max(1, record.attempts)}`;

/**
 * The record as the event's header carries it: JSON, without the result's
 * bytes. Put in the header's map as it is: nats.js's set() looks for the key
 * twice and checks the value for CR and LF, which JSON.stringify never
 * writes (it escapes them), on every event.
 */
function recordHeader(text: string): MsgHdrs {
  const h = new MsgHdrsImpl();
  h.headers.set(RUN_RECORD_HEADER, [text]);
  return h;
}

/** The record's JSON as its event's header and the run history's feed carry it. */
const recordText = (record: RunRecord) => JSON.stringify(withoutResult(record));

/** The record without its result and KV revisions (the record itself when it has neither, as an event's has). */
export function withoutResult(record: RunRecord): RunRecord {
  if (!record.result && !record.prior_revisions) return record;
  // A copy with both unset (JSON leaves them out), not a rest spread: see copyRecord.
  const slim = copyRecord(record);
  slim.result = undefined;
  slim.prior_revisions = undefined;
  return slim;
}

/** The record an event carries in its header; undefined when it has none or it is not a run record. */
export function recordOfEvent(h: MsgHdrs | undefined): RunRecord | undefined {
  return recordOfText(h?.get(RUN_RECORD_HEADER));
}

/** The record of a `Skiff-Run` header's text; undefined when there is none or it is not a run record. */
export function recordOfText(text: string | undefined): RunRecord | undefined {
  if (!text) return undefined;
  try {
    const r = JSON.parse(text) as RunRecord;
    return r && typeof r === "object" && typeof r.run_id === "string" && typeof r.status === "string" ? r : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Publishes the event of the record's current state; resolves once JetStream
 * stored it (a terminal one deduplicated by its message id). The terminal
 * event of a run that named a webhook also goes to the webhook role's own
 * subject (SKIFF_WEBHOOKS).
 */
export async function publishRunEvent(
  nc: NatsConnection,
  record: RunRecord,
  response?: EventResponse,
  /** Other runs are under way on the connection: the record's message may wait for their writes. */
  together = false,
): Promise<void> {
  const bytes = eventBytes(record, response);
  const msgId = isFinal(record.status) ? eventId(record) : undefined;
  const text = recordText(record);
  const [stored] = await Promise.all([
    publishAcked(nc, subjects.runEvent(record.project_id, record.app_name, record.status), bytes, {
      msgId,
      headers: recordHeader(text),
    }),
    isFinal(record.status) && record.webhook_endpoint
      ? publishAcked(nc, subjects.webhookRun(record.project_id, record.app_name), bytes, { msgId })
      : undefined,
  ]);
  await recordFeed(nc).addAcked(withEventSeq(text, stored.seq), together);
}

/**
 * The record's JSON with `event_seq`, its event's sequence in SKIFF_EVENTS, first: spliced into the text
 * (a record's JSON is an object with its run id in it), which the event's header carries without it.
 */
export function withEventSeq(text: string, seq: number): string {
  return `{"event_seq":${seq},${text.slice(1)}`;
}

/**
 * The same event as a plain NATS publish, no acknowledgement awaited: for
 * the events of sync runs that ask for no webhook, whose callers already
 * have their answer. An event that a webhook depends on is always published
 * with publishRunEvent. Such a publish is never repeated, so it carries no
 * Nats-Msg-Id: the server keeps no deduplication entry (two minutes of them
 * at thousands of runs a second) for it.
 */
export function publishRunEventUnacked(nc: NatsConnection, record: RunRecord, response?: EventResponse): void {
  // Nothing waits for it: it goes with the connection's next write, a few milliseconds later at most.
  const text = recordText(record);
  publishInBackground(
    nc,
    subjects.runEvent(record.project_id, record.app_name, record.status),
    eventBytes(record, response),
    { headers: recordHeader(text) },
  );
  recordFeed(nc).add(text);
}
