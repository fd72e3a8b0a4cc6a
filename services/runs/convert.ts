// A run record as the protobuf messages that show it: the management API's
// `Run` and the public `skiff.events.v1.RunEvent`. The fields both carry are
// mapped once, here.
import { create, fromJson, type JsonValue } from "@bufbuild/protobuf";
import { timestampFromDate, ValueSchema, type Timestamp } from "@bufbuild/protobuf/wkt";
import { HttpBodySchema } from "../../gen/google/api/httpbody_pb.js";
import { RunEventSchema, type RunEvent } from "../../gen/skiff/events/v1/events_pb.js";
import { WebSocketSessionSchema, type Run } from "../../gen/skiff/management/v2/management_pb.js";
import type { EventResponse } from "./event-bytes.js";
import type { Body } from "./results.js";
import type { RunRecord } from "./store.js";

const timestamp = (iso: string | undefined) => (iso === undefined ? undefined : timestampFromDate(new Date(iso)));

/**
 * A time of a record as a Timestamp, written as the message object it is
 * (create() by reflection costs several times as much, three times a run of
 * every page listed); undefined for none, or for text that is no time.
 */
function timestampOf(iso: string | undefined): Timestamp | undefined {
  if (iso === undefined) return undefined;
  const ms = Date.parse(iso);
  if (!Number.isFinite(ms)) return undefined;
  const seconds = Math.floor(ms / 1000);
  return { $typeName: "google.protobuf.Timestamp", seconds: BigInt(seconds), nanos: (ms - seconds * 1000) * 1_000_000 };
}
const decoder = new TextDecoder("utf-8", { fatal: true });

/** What a Run and a RunEvent both say of a run. */
function runFields(record: RunRecord) {
  return {
    runId: record.run_id,
    projectId: record.project_id,
    appName: record.app_name,
    path: record.path,
    async: record.async,
    status: record.status,
    runTimeMs: record.run_time_ms ?? 0,
    responseBytes: BigInt(record.response_bytes ?? 0),
    statusCode: record.status_code ?? 0,
    error: record.error,
    webhookEndpoint: record.webhook_endpoint ?? "",
  };
}

/** A kept result: JSON as a google.protobuf.Value, anything else (or JSON that does not parse) raw. */
function resultFields(body: Body | undefined): Pick<Run, "result" | "rawResult"> {
  if (!body) return { result: undefined, rawResult: undefined };
  if (body.contentType.split(";")[0].trim().toLowerCase() === "application/json") {
    try {
      return {
        result: fromJson(ValueSchema, JSON.parse(decoder.decode(body.data)) as JsonValue),
        rawResult: undefined,
      };
    } catch {
      // not JSON after all: returned raw below
    }
  }
  return { result: undefined, rawResult: create(HttpBodySchema, body) };
}

/**
 * The management API's Run, with its result while kept. Written as the
 * message object it is, every field named (the type makes a missing one an
 * error), not by create(): a page of runs makes fifty of them
 * (test/runs/convert.test.ts holds it equal to create()'s).
 */
export function runMessage(record: RunRecord, result?: Body): Run {
  const f = runFields(record);
  const run: Run = {
    $typeName: "skiff.management.v2.Run",
    runId: f.runId ?? "",
    projectId: f.projectId ?? "",
    appName: f.appName ?? "",
    path: f.path ?? "",
    async: f.async === true,
    status: f.status ?? "",
    queuedAt: timestampOf(record.queued_at),
    startedAt: timestampOf(record.started_at),
    finishedAt: timestampOf(record.finished_at),
    runTimeMs: f.runTimeMs,
    statusCode: f.statusCode,
    error: f.error && {
      $typeName: "skiff.management.v2.RunError",
      type: f.error.type ?? "",
      message: f.error.message ?? "",
    },
    webhookEndpoint: f.webhookEndpoint,
    attempts: record.attempts ?? 0,
    result: undefined,
    rawResult: undefined,
    webhookDeliveries: [],
    websocket:
      record.websocket &&
      create(WebSocketSessionSchema, {
        closeCode: record.websocket.close_code,
        closeReason: record.websocket.close_reason,
        closedBy: record.websocket.closed_by,
        bytesIn: BigInt(record.websocket.bytes_in),
        bytesOut: BigInt(record.websocket.bytes_out),
        messagesIn: BigInt(record.websocket.messages_in),
        messagesOut: BigInt(record.websocket.messages_out),
      }),
    responseBytes: f.responseBytes,
  };
  if (result) {
    const kept = resultFields(result);
    run.result = kept.result;
    run.rawResult = kept.rawResult;
  }
  return run;
}

/**
 * The event of the record's current state, carrying the response of a terminal one inline or by object name.
 * Publishers write its bytes with runEventBytes (event-bytes.ts), without the message object; this is the
 * mapping those bytes must equal (test/runs/event-bytes.test.ts).
 */
export function runEvent(record: RunRecord, response: EventResponse): RunEvent {
  const event = create(RunEventSchema, {
    ...runFields(record),
    time: timestampFromDate(new Date(record.finished_at ?? record.started_at ?? record.queued_at)),
    attempt: Math.max(1, record.attempts),
    webhookSigned: record.webhook_signed ?? false,
  });
  if (response && "object" in response) event.responseObject = response.object;
  else if (response) event.response = create(HttpBodySchema, response);
  return event;
}
