// Stores at their budget under load: one skiff process whose event stream and
// run history have small byte budgets, driven with sync and async calls until
// both are far past what they hold. Calls go on succeeding: SKIFF_EVENTS drops
// its oldest events and the run history its oldest runs, each staying within
// its budget, and every accepted async run still runs and ends (its terminal
// event, seen live on NATS): nothing accepted is lost.
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { fromBinary } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { connect, type NatsConnection, type Subscription } from "nats";
import { afterAll, beforeAll, expect, it, vi } from "vitest";
import { RunEventSchema } from "../../gen/skiff/events/v1/events_pb.js";
import { ManagementService } from "../../gen/skiff/management/v2/management_pb.js";
import { bearerAuth } from "../../services/auth/bearer.js";
import { streams } from "../../services/nats/layout.js";
import { startNatsServer, type TestNats } from "../helpers/nats-server.js";
import { cortexApp, deploy, P } from "../helpers/run-apps.js";
import { call, callErrors, pool, report, spawnSkiff, transportErrors, type Call, type SkiffProcess } from "./fleet.js";

const MiB = 2 ** 20;
const EVENTS_BUDGET = 2 * MiB;
const HISTORY_BUDGET = 3 * MiB;
const SYNC_CALLS = 6000;
const ASYNC_CALLS = 1500;

let tmp: string;
let nats: TestNats;
let nc: NatsConnection;
let skiff: SkiffProcess;
let devToken: string;
let adminToken: string;
let management: ReturnType<typeof createClient<typeof ManagementService>>;

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-faults-budget-"));
  nats = await startNatsServer();
  nc = await connect({ servers: nats.url });
  skiff = await spawnSkiff({
    name: "skiff",
    dataDir: path.join(tmp, "data"),
    env: {
      SKIFF_NATS_URL: nats.url,
      SKIFF_EVENTS_MAX_BYTES: String(EVENTS_BUDGET),
      SKIFF_HISTORY_MAX_BYTES: String(HISTORY_BUDGET),
      SKIFF_MAX_QUEUED_RUNS: "100000",
      SKIFF_LOG_LEVEL: "info",
    },
  });
  await skiff.start();
  adminToken = (await readFile(path.join(tmp, "data", "admin-token"), "utf8")).trim();
  devToken = (await readFile(path.join(tmp, "data", "dev-token"), "utf8")).trim();
  management = createClient(
    ManagementService,
    createConnectTransport({ baseUrl: skiff.url, httpVersion: "1.1", interceptors: [bearerAuth(adminToken)] }),
  );
  await deploy(tmp, management, cortexApp("full", { min_replicas: 1, max_replicas: 2 }));
  await vi.waitUntil(
    async () => (await call(`${skiff.url}/v4/${P}/full/add`, devToken, '{"a":1,"b":2}')).status === 200,
    {
      timeout: 120_000,
      interval: 500,
    },
  );
}, 300_000);

afterAll(async () => {
  await skiff?.kill();
  await nc?.close();
  await nats?.stop();
  await rm(tmp, { recursive: true, force: true });
}, 60_000);

async function storeFigure(name: string, store: string): Promise<number> {
  const text = await (
    await fetch(`${skiff.url}/metrics`, { headers: { authorization: `Bearer ${adminToken}` } })
  ).text();
  const line = text.split("\n").find((l) => l.startsWith(`${name}{`) && l.includes(`store="${store}"`));
  return line === undefined ? NaN : Number(line.slice(line.lastIndexOf(" ") + 1));
}

it("event stream and run history filled past their budgets under load: calls succeed, the oldest go, no accepted run is lost", async () => {
  const started = Date.now();
  // Every run that ends, seen live (a plain subscription: what the stream drops later does not matter).
  const ended = new Map<string, string>();
  const sub: Subscription = nc.subscribe(`skiff.events.runs.${P}.full.*`, {
    callback: (err, m) => {
      if (err) return;
      const status = m.subject.split(".").pop()!;
      if (["success", "failure", "cancelled"].includes(status))
        ended.set(fromBinary(RunEventSchema, m.data).runId, status);
    },
  });
  const first = await call(`${skiff.url}/v4/${P}/full/add`, devToken, '{"a":0,"b":0}');
  expect(first.status).toBe(200);

  // Sync and async calls together, 16 at a time.
  const kinds = [
    ...Array.from({ length: SYNC_CALLS }, () => "sync" as const),
    ...Array.from({ length: ASYNC_CALLS }, () => "async" as const),
  ].sort(() => Math.random() - 0.5);
  const calls: (Call & { kind: "sync" | "async" })[] = await pool(kinds, 16, async (kind, i) => ({
    kind,
    ...(await call(
      `${skiff.url}/v4/${P}/full/add${kind === "async" ? "?async=true" : ""}`,
      devToken,
      JSON.stringify({ a: i, b: 1 }),
    )),
  }));
  const sync = calls.filter((c) => c.kind === "sync");
  const accepted = calls.filter((c) => c.kind === "async" && c.status === 202).map((c) => c.runId!);

  // Every accepted run runs and ends.
  await vi.waitUntil(() => accepted.every((id) => ended.has(id)), { timeout: 180_000, interval: 500 });
  sub.unsubscribe();
  const jsm = await nc.jetstreamManager();
  const events = (await jsm.streams.info(streams.events.name)).state;
  const queue = (await jsm.streams.info(streams.runs.name)).state;
  // The history keeps itself within its budget every 2 s; the watch measures every 5 s.
  await new Promise((r) => setTimeout(r, 8_000));
  const historyBytes = await storeFigure("skiff_store_bytes", "run-history");
  const historyBudget = await storeFigure("skiff_store_budget_bytes", "run-history");
  const firstRun = await management.getRun({ projectId: P, appName: "full", runId: first.requestId! }).then(
    () => "found",
    (err: unknown) => (err instanceof ConnectError && err.code === Code.NotFound ? "not found" : String(err)),
  );
  const newest = await management.listRuns({ projectId: P, appName: "full", pageSize: 5 });
  const lastAccepted = await management.getRun({ projectId: P, appName: "full", runId: accepted.at(-1)! });
  const prunes = skiff.tail.filter((l) => /oldest runs deleted to stay within its budget/.test(l)).length;

  report("store budgets: event stream and run history past their budgets under load", {
    budgets: { SKIFF_EVENTS_MAX_BYTES: EVENTS_BUDGET, SKIFF_HISTORY_MAX_BYTES: HISTORY_BUDGET },
    calls: { sync: sync.length, async: ASYNC_CALLS, accepted: accepted.length },
    syncStatuses: Object.fromEntries(
      [...new Set(sync.map((c) => c.status))].map((s) => [s, sync.filter((c) => c.status === s).length]),
    ),
    callErrors: callErrors(calls),
    transportErrors: transportErrors(calls),
    acceptedNotEnded: accepted.filter((id) => !ended.has(id)).length,
    acceptedNotSuccess: accepted.filter((id) => ended.get(id) !== "success").length,
    events: { bytes: events.bytes, budget: EVENTS_BUDGET, first_seq: events.first_seq, last_seq: events.last_seq },
    queueLeft: queue.messages,
    history: { bytes: historyBytes, budget: historyBudget, pruneLogLines: prunes },
    firstRunAfterwards: firstRun,
    durationMs: Date.now() - started,
  });
  // Calls succeed throughout.
  expect(callErrors(calls)).toEqual({});
  expect(transportErrors(calls)).toEqual({});
  expect(accepted).toHaveLength(ASYNC_CALLS);
  // Nothing accepted is lost: every accepted run ended, and well.
  expect(accepted.filter((id) => ended.get(id) !== "success")).toEqual([]);
  expect(queue.messages).toBe(0);
  // The events: at their budget, the oldest gone.
  expect(events.bytes).toBeLessThanOrEqual(EVENTS_BUDGET);
  expect(events.first_seq).toBeGreaterThan(1);
  // The history: within its budget, its oldest runs gone, its newest there.
  expect(historyBudget).toBe(HISTORY_BUDGET);
  expect(historyBytes).toBeLessThanOrEqual(HISTORY_BUDGET);
  expect(prunes).toBeGreaterThan(0);
  expect(firstRun).toBe("not found");
  expect(newest.runs).toHaveLength(5);
  expect(lastAccepted.run?.status).toBe("success");
}, 600_000);
