// The public run lifecycle events: a `skiff.events.v1.RunEvent` (protobuf
// binary) on `skiff.events.runs.{project}.{app}.{status}` in SKIFF_EVENTS at
// every change of a run's state. An acknowledged publish, which its
// publisher may repeat (a retried completion), carries `Nats-Msg-Id` =
// `{run_id}.{status}.{attempt}` and is deduplicated.
import type { NatsConnection } from "nats";
import { publishAcked, subjects } from "../nats/index.js";
import { runEventBytes } from "./event-bytes.js";
import { isFinal } from "./status.js";
import type { RunRecord } from "./store.js";

/** Largest response carried inside an event; a larger one is named by `response_object`. */
export const MAX_EVENT_RESPONSE_BYTES = 1024 * 1024;
/** Room for the event's other fields and headers within the server's max_payload. */
const EVENT_HEADROOM_BYTES = 16 * 1024;

/** The largest response an event carries on this connection's server. */
export function eventResponseLimit(nc: NatsConnection): number {
  return Math.min(MAX_EVENT_RESPONSE_BYTES, nc.info!.max_payload - EVENT_HEADROOM_BYTES);
}

/** The response body of a terminal event: inline, or an object in `skiff-results`. */
export type EventResponse = { contentType: string; data: Uint8Array } | { object: string } | undefined;

const eventBytes = (record: RunRecord, response: EventResponse) => runEventBytes(record, response);
const eventId = (record: RunRecord) => `${record.run_id}.${record.status}.${Math.max(1, record.attempts)}`;

/**
 * Publishes the event of the record's current state; resolves once JetStream
 * stored it. The terminal event of a run that named a webhook also goes to
 * the webhook role's own subject (SKIFF_WEBHOOKS).
 */
export async function publishRunEvent(nc: NatsConnection, record: RunRecord, response?: EventResponse): Promise<void> {
  const bytes = eventBytes(record, response);
  const msgId = eventId(record);
  await Promise.all([
    publishAcked(nc, subjects.runEvent(record.project_id, record.app_name, record.status), bytes, { msgId }),
    isFinal(record.status) && record.webhook_endpoint
      ? publishAcked(nc, subjects.webhookRun(record.project_id, record.app_name), bytes, { msgId })
      : undefined,
  ]);
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
  nc.publish(subjects.runEvent(record.project_id, record.app_name, record.status), eventBytes(record, response));
}
