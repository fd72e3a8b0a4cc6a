// The run record in an event's `Skiff-Run` header (runs/events.ts), which is
// put in the header's map without nats.js's checks: whatever text a record
// holds (line breaks, quotes, non-ASCII, a header-like line) comes back as
// the same record, and the header holds one line, whether the event goes out
// plainly (a sync run's) or acknowledged with a message id (a terminal one).
import { connect, type Msg, type NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { publishRunEvent, publishRunEventUnacked, recordOfEvent } from "../../services/runs/events.js";
import type { RunRecord } from "../../services/runs/store.js";
import { startNatsServer, type TestNats } from "../helpers/nats-server.js";

let nats: TestNats;
let nc: NatsConnection;

beforeAll(async () => {
  nats = await startNatsServer();
  nc = await connect({ servers: nats.url });
  const jsm = await nc.jetstreamManager();
  await jsm.streams.add({ name: "EVENTS", subjects: ["skiff.events.runs.>"], duplicate_window: 60_000_000_000 });
  // The run history's record feed, which an acknowledged event waits for too.
  await jsm.streams.add({ name: "HISTORY", subjects: ["skiff.history.>"] });
  // A terminal event of a run with a webhook goes to the webhook role's stream too.
  await jsm.streams.add({ name: "WEBHOOKS", subjects: ["skiff.webhooks.runs.>"] });
});
afterAll(async () => {
  await nc?.close();
  await nats?.stop();
});

const record = (runId: string, message: string): RunRecord => ({
  run_id: runId,
  project_id: "p-dev",
  app_name: "echo",
  path: "/a\r\nSkiff-Run: {}",
  async: false,
  status: "failure",
  queued_at: "2026-11-27T10:00:00.000Z",
  started_at: "2026-11-27T10:00:00.000Z",
  finished_at: "2026-11-27T10:00:01.000Z",
  run_time_ms: 1000,
  status_code: 500,
  error: { type: "app_error", message },
  attempts: 1,
});

const next = (subject: string) =>
  new Promise<Msg>((resolve) => {
    const sub = nc.subscribe(subject, { max: 1, callback: (_err, m) => resolve(m) });
    void sub;
  });

describe("the run record in an event's header", () => {
  const text = 'line one\r\nline two\n"quoted" \\ tab\t ünïcödé \u2028 \u0000 end';

  it("comes back as the same record from a plain publish, on one header line", async () => {
    const r = record("0190f0c8-0000-7000-8000-000000000001", text);
    const got = next("skiff.events.runs.p-dev.echo.failure");
    publishRunEventUnacked(nc, r, { contentType: "text/plain", data: new Uint8Array([1, 2, 3]) });
    const m = await got;
    expect(recordOfEvent(m.headers)).toEqual(r);
    expect(m.headers!.keys()).toEqual(["Skiff-Run"]);
    expect(m.headers!.values("Skiff-Run")).toHaveLength(1);
  });

  it("comes back as the same record from an acknowledged publish, beside its message id", async () => {
    const r = { ...record("0190f0c8-0000-7000-8000-000000000002", text), webhook_endpoint: "https://example.com/h" };
    const got = next("skiff.events.runs.p-dev.echo.failure");
    await publishRunEvent(nc, r);
    const m = await got;
    expect(recordOfEvent(m.headers)).toEqual(r);
    expect(m.headers!.get("Nats-Msg-Id")).toBe(`${r.run_id}.failure.1`);
  });
});
