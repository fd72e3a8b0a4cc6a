// The public run lifecycle events: a `skiff.events.v1.RunEvent` (protobuf
// binary) on `skiff.events.runs.{project}.{app}.{status}` in SKIFF_EVENTS at
// every change of a run's state. `Nats-Msg-Id` = `{run_id}.{status}.{attempt}`,
// so a publisher that repeats itself (a retried completion) is deduplicated.
import { create, toBinary } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { headers, type JetStreamClient, type NatsConnection } from "nats";
import { HttpBodySchema } from "../../gen/google/api/httpbody_pb.js";
import { RunEventSchema } from "../../gen/skiff/events/v1/events_pb.js";
import { subjects } from "../nats/index.js";
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

export function runEventBytes(r: RunRecord, response: EventResponse): Uint8Array {
  const event = create(RunEventSchema, {
    runId: r.run_id,
    projectId: r.project_id,
    appName: r.app_name,
    path: r.path,
    async: r.async,
    status: r.status,
    time: timestampFromDate(new Date(r.finished_at ?? r.started_at ?? r.queued_at)),
    attempt: Math.max(1, r.attempts),
    runTimeMs: r.run_time_ms ?? 0,
    statusCode: r.status_code ?? 0,
    error: r.error,
    webhookEndpoint: r.webhook_endpoint ?? "",
    webhookSigned: r.webhook_signed ?? false,
  });
  if (response && "object" in response) event.responseObject = response.object;
  else if (response) event.response = create(HttpBodySchema, response);
  return toBinary(RunEventSchema, event);
}

/** Publishes the event of the record's current state; resolves once JetStream stored it. */
const eventId = (r: RunRecord) => `${r.run_id}.${r.status}.${Math.max(1, r.attempts)}`;

export async function publishRunEvent(js: JetStreamClient, r: RunRecord, response?: EventResponse): Promise<void> {
  await js.publish(subjects.runEvent(r.project_id, r.app_name, r.status), runEventBytes(r, response), {
    msgID: eventId(r),
  });
}

/**
 * The same event as a plain NATS publish, no acknowledgement awaited: for
 * the events of sync runs that ask for no webhook, whose callers already
 * have their answer. An event that a webhook depends on is always published
 * with publishRunEvent.
 */
export function publishRunEventUnacked(nc: NatsConnection, r: RunRecord, response?: EventResponse): void {
  const h = headers();
  h.set("Nats-Msg-Id", eventId(r));
  nc.publish(subjects.runEvent(r.project_id, r.app_name, r.status), runEventBytes(r, response), { headers: h });
}
