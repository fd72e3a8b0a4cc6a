// Publishes run events the way skiff does a terminal one: a
// skiff.events.v1.RunEvent in protobuf on skiff.events.runs.{project}.{app}.{status}
// (SKIFF_EVENTS) and on the webhook role's skiff.webhooks.runs.{project}.{app}
// (SKIFF_WEBHOOKS), deduplicated by run id and status.
import { randomUUID } from "node:crypto";
import { create, toBinary } from "@bufbuild/protobuf";
import { timestampNow } from "@bufbuild/protobuf/wkt";
import type { NatsConnection } from "nats";
import { RunEventSchema, type RunEvent } from "../../gen/skiff/events/v1/events_pb.js";
import { subjects } from "../../services/nats/layout.js";

export function newRunId(): string {
  return randomUUID();
}

/** A terminal (success) event of a run called with webhookEndpoint `url`, answering `body`. */
export function terminalEvent(
  url: string,
  body: string | Uint8Array,
  init: Partial<Omit<RunEvent, "$typeName">> = {},
): RunEvent {
  const event = create(RunEventSchema, {
    runId: newRunId(),
    projectId: "p-test",
    appName: "hello",
    path: "predict",
    async: true,
    status: "success",
    time: timestampNow(),
    attempt: 1,
    runTimeMs: 12.5,
    statusCode: 200,
    webhookEndpoint: url,
    response: {
      contentType: "application/json",
      data: typeof body === "string" ? new TextEncoder().encode(body) : body,
    },
  });
  return Object.assign(event, init);
}

/**
 * Publishes the event as skiff does a terminal one: to the public events
 * and to the webhook role's subject. Resolves with its sequence in the
 * webhook stream.
 */
export async function publishRunEvent(nc: NatsConnection, event: RunEvent): Promise<number> {
  const js = nc.jetstream();
  const bytes = toBinary(RunEventSchema, event);
  const msgID = `${event.runId}.${event.status}`;
  const [, ack] = await Promise.all([
    js.publish(subjects.runEvent(event.projectId, event.appName, event.status), bytes, { msgID }),
    js.publish(subjects.webhookRun(event.projectId, event.appName), bytes, { msgID }),
  ]);
  return ack.seq;
}
