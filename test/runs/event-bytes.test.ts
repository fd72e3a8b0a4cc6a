// The hand-written RunEvent encoder (runs/event-bytes.ts) gives the bytes that
// @bufbuild/protobuf gives for the same event, for records in every state.
import { fromBinary, toBinary } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { RunEventSchema } from "../../gen/skiff/events/v1/events_pb.js";
import { runEvent } from "../../services/runs/convert.js";
import { runEventBytes, type EventResponse } from "../../services/runs/event-bytes.js";
import type { RunRecord } from "../../services/runs/store.js";

const base: RunRecord = {
  run_id: "019a4c2e-7b1d-7c3a-9f10-2b3c4d5e6f70",
  project_id: "p-dev",
  app_name: "hello",
  path: "add",
  async: false,
  status: "queued",
  queued_at: "2026-11-23T14:00:00.123Z",
  attempts: 0,
};

const cases: [string, RunRecord, EventResponse][] = [
  ["queued, nothing optional", base, undefined],
  [
    "running async",
    { ...base, async: true, status: "running", started_at: "2026-11-23T14:00:01.999Z", attempts: 2, runner: "r1" },
    undefined,
  ],
  [
    "success with a JSON body",
    {
      ...base,
      status: "success",
      finished_at: "2026-11-23T14:00:02.000Z",
      run_time_ms: 1.25,
      status_code: 200,
      attempts: 1,
    },
    { contentType: "application/json", data: new TextEncoder().encode('{"hello":"wörld","n":42}') },
  ],
  [
    "failure with an error and a webhook",
    {
      ...base,
      status: "failure",
      finished_at: "2026-11-23T14:00:03.500Z",
      run_time_ms: 30000,
      status_code: 500,
      error: { type: "timeout", message: "the run took longer than 30 s — ✂" },
      webhook_endpoint: "https://example.com/hook?x=1",
      webhook_signed: true,
      attempts: 3,
    },
    { contentType: "text/plain", data: new Uint8Array(0) },
  ],
  [
    "cancelled with a large body by object name, negative status",
    {
      ...base,
      status: "cancelled",
      finished_at: "2026-11-23T14:00:04.001Z",
      run_time_ms: 0.001,
      status_code: -1,
      attempts: 1,
    },
    { object: "019a4c2e-7b1d-7c3a-9f10-2b3c4d5e6f70" },
  ],
  [
    "a body of 40 KB",
    {
      ...base,
      status: "success",
      finished_at: "2026-11-23T14:00:05.000Z",
      run_time_ms: 12,
      status_code: 201,
      attempts: 1,
    },
    { contentType: "application/octet-stream", data: new Uint8Array(40_000).map((_, i) => i % 251) },
  ],
];

describe("runEventBytes", () => {
  it.each(cases)("%s: the bytes of @bufbuild/protobuf", (_name, record, response) => {
    const expected = toBinary(RunEventSchema, runEvent(record, response));
    const got = runEventBytes(record, response);
    expect(Buffer.from(got).equals(Buffer.from(expected))).toBe(true);
    expect(fromBinary(RunEventSchema, got)).toEqual(runEvent(record, response));
  });
});
