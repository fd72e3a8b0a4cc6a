// copyRecord (runs/store.ts): the field-by-field copy an async run's writes start from keeps every field of a
// record, as the spread it replaced did, and is a new object.
import { describe, expect, it } from "vitest";
import { copyRecord, type RunRecord } from "../../services/runs/index.js";

/** A record with every field set, optional ones too. */
const full: Required<RunRecord> = {
  run_id: "01JDZ3Q6V8K2W5X7Y9A1B3C5D7",
  project_id: "p-dev",
  app_name: "hello",
  path: "predict",
  async: true,
  status: "success",
  queued_at: "2026-11-28T01:00:00.000Z",
  started_at: "2026-11-28T01:00:00.010Z",
  finished_at: "2026-11-28T01:00:00.020Z",
  run_time_ms: 10,
  status_code: 200,
  error: { type: "timeout", message: "too slow" },
  webhook_endpoint: "https://example.com/hook",
  webhook_signed: true,
  attempts: 2,
  runner: "runner-1",
  result: { content_type: "application/json", data: "e30=", expires_at: "2026-11-29T01:00:00.000Z" },
  websocket: {
    close_code: 1000,
    close_reason: "bye",
    closed_by: "caller",
    bytes_in: 1,
    bytes_out: 2,
    messages_in: 1,
    messages_out: 1,
  },
  response_bytes: 2,
  prior_revisions: [3, 7],
};

describe("copyRecord", () => {
  it("keeps every field of a record, as a spread would", () => {
    const copy = copyRecord(full);
    expect(copy).not.toBe(full);
    expect(copy).toEqual({ ...full });
    expect(Object.keys(copy).sort()).toEqual(Object.keys(full).sort());
    expect(JSON.parse(JSON.stringify(copy))).toEqual(JSON.parse(JSON.stringify(full)));
  });

  it("leaves out, in JSON, the fields a record lacks", () => {
    const queued: RunRecord = {
      run_id: full.run_id,
      project_id: "p-dev",
      app_name: "hello",
      path: "predict",
      async: true,
      status: "queued",
      queued_at: full.queued_at,
      attempts: 0,
    };
    expect(JSON.parse(JSON.stringify(copyRecord(queued)))).toEqual(queued);
  });
});
