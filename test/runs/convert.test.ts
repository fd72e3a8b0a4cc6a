// runMessage (runs/convert.ts) writes a Run as the message object it is,
// without create(): it must be the message create() makes from the same
// record, field for field, whatever the record holds or lacks.
import { create, equals, fromJson, toJson, type JsonValue } from "@bufbuild/protobuf";
import { timestampFromDate, ValueSchema } from "@bufbuild/protobuf/wkt";
import { describe, expect, it } from "vitest";
import { RunSchema, type Run } from "../../gen/skiff/management/v2/management_pb.js";
import { runMessage } from "../../services/runs/convert.js";
import type { RunRecord } from "../../services/runs/store.js";

/** The mapping as create() makes it: the oracle. */
function byCreate(r: RunRecord, result?: { contentType: string; data: Uint8Array }): Run {
  const ts = (iso: string | undefined) => (iso === undefined ? undefined : timestampFromDate(new Date(iso)));
  return create(RunSchema, {
    runId: r.run_id,
    projectId: r.project_id,
    appName: r.app_name,
    path: r.path,
    async: r.async,
    status: r.status,
    runTimeMs: r.run_time_ms ?? 0,
    responseBytes: BigInt(r.response_bytes ?? 0),
    statusCode: r.status_code ?? 0,
    error: r.error,
    webhookEndpoint: r.webhook_endpoint ?? "",
    queuedAt: ts(r.queued_at),
    startedAt: ts(r.started_at),
    finishedAt: ts(r.finished_at),
    attempts: r.attempts,
    result: result && fromJson(ValueSchema, JSON.parse(new TextDecoder().decode(result.data)) as JsonValue),
    websocket: r.websocket && {
      closeCode: r.websocket.close_code,
      closeReason: r.websocket.close_reason,
      closedBy: r.websocket.closed_by,
      bytesIn: BigInt(r.websocket.bytes_in),
      bytesOut: BigInt(r.websocket.bytes_out),
      messagesIn: BigInt(r.websocket.messages_in),
      messagesOut: BigInt(r.websocket.messages_out),
    },
  });
}

const base: RunRecord = {
  run_id: "0190f0c8-0000-7000-8000-000000000001",
  project_id: "p-dev",
  app_name: "echo",
  path: "/echo",
  async: false,
  status: "queued",
  queued_at: "2026-11-27T10:00:00.000Z",
  attempts: 0,
};

const records: [string, RunRecord][] = [
  ["queued, nothing else", base],
  [
    "ended, every field",
    {
      ...base,
      async: true,
      status: "failure",
      started_at: "2026-11-27T10:00:00.123Z",
      finished_at: "2026-11-27T10:00:07.999Z",
      run_time_ms: 7876.5,
      status_code: 500,
      error: { type: "app_error", message: "it broke" },
      webhook_endpoint: "https://example.com/hook",
      webhook_signed: true,
      attempts: 3,
      runner: "gateway-1",
      response_bytes: 12345,
    },
  ],
  [
    "a WebSocket session",
    {
      ...base,
      status: "success",
      started_at: "2026-11-27T10:00:00.000Z",
      finished_at: "2026-11-27T10:01:00.000Z",
      websocket: {
        close_code: 1000,
        close_reason: "bye",
        closed_by: "caller",
        bytes_in: 10,
        bytes_out: 20,
        messages_in: 1,
        messages_out: 2,
      },
    },
  ],
  ["before 1970", { ...base, queued_at: "1969-12-31T23:59:59.250Z" }],
];

describe("runMessage", () => {
  it.each(records)("is create()'s message: %s", (_, r) => {
    const run = runMessage(r);
    const expected = byCreate(r);
    expect(equals(RunSchema, run, expected)).toBe(true);
    expect(toJson(RunSchema, run)).toEqual(toJson(RunSchema, expected));
  });

  it("carries a kept JSON result as create() does", () => {
    const r = { ...base, status: "success" as const };
    const result = { contentType: "application/json", data: new TextEncoder().encode('{"a":[1,"x",null]}') };
    expect(equals(RunSchema, runMessage(r, result), byCreate(r, result))).toBe(true);
  });

  it("shows no time for text that is none, where create() failed the whole page", () => {
    const r = { ...base, started_at: "not a time" };
    expect(() => byCreate(r)).toThrow();
    expect(runMessage(r).startedAt).toBeUndefined();
  });
});
