// Publishes run events to SKIFF_EVENTS the way the invocation role does: a
// skiff.events.v1.RunEvent in protobuf on skiff.events.runs.{project}.{app}.{status},
// deduplicated by run id and status.
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

export async function publishRunEvent(nc: NatsConnection, event: RunEvent): Promise<number> {
  const ack = await nc
    .jetstream()
    .publish(subjects.runEvent(event.projectId, event.appName, event.status), toBinary(RunEventSchema, event), {
      msgID: `${event.runId}.${event.status}`,
    });
  return ack.seq;
}
