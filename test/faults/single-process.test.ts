// kill -9 of the single-process skiff (every role, as `npm start`) mid async
// runs with webhooks, against a nats-server whose store survives it; started
// again on the same data folder and port, it completes every accepted run
// and delivers every webhook.
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { createClient, type Client } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { connect, type NatsConnection } from "nats";
import { afterAll, beforeAll, expect, it, vi } from "vitest";
import { ManagementService, type WebhookDelivery } from "../../gen/skiff/management/v2/management_pb.js";
import { bearerAuth } from "../../services/auth/bearer.js";
import { startNatsServer, type TestNats } from "../helpers/nats-server.js";
import { cortexApp, deploy, P } from "../helpers/run-apps.js";
import { startReceiver, type Receiver } from "../helpers/webhook-receiver.js";
import {
  byStatus,
  call,
  pool,
  report,
  spawnSkiff,
  statuses,
  terminalEvents,
  transportErrors,
  callErrors,
  failureTypes,
  waitFinal,
  firstDelivery,
  type Call,
  type GetRun,
  type SkiffProcess,
} from "./fleet.js";

const APP = "single";
const countBy = (keys: (string | number)[]) => {
  const out: Record<string, number> = {};
  for (const k of keys) out[k] = (out[k] ?? 0) + 1;
  return out;
};
let tmp: string;
let nats: TestNats;
let nc: NatsConnection;
let rx: Receiver;
let skiff: SkiffProcess;
let devToken: string;
let management: Client<typeof ManagementService>;

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-faults-single-"));
  nats = await startNatsServer();
  nc = await connect({ servers: nats.url });
  rx = await startReceiver(() => 200);
  skiff = await spawnSkiff({
    name: "skiff",
    dataDir: path.join(tmp, "data"),
    env: { SKIFF_NATS_URL: nats.url, SKIFF_RUN_ACK_WAIT_MS: "5000" },
  });
  await skiff.start();
  const adminToken = (await readFile(path.join(tmp, "data", "admin-token"), "utf8")).trim();
  devToken = (await readFile(path.join(tmp, "data", "dev-token"), "utf8")).trim();
  management = createClient(
    ManagementService,
    createConnectTransport({ baseUrl: skiff.url, httpVersion: "1.1", interceptors: [bearerAuth(adminToken)] }),
  );
  await deploy(tmp, management, cortexApp(APP, { max_replicas: 2, replica_concurrency: 8, response_grace_period: 60 }));
  await vi.waitUntil(
    async () => (await call(`${skiff.url}/v4/${P}/${APP}/add`, devToken, '{"a":1,"b":2}')).status === 200,
    { timeout: 120_000, interval: 500 },
  );
}, 300_000);

afterAll(async () => {
  await skiff?.kill();
  await nc?.close();
  await nats?.stop();
  await rx?.close();
  await rm(tmp, { recursive: true, force: true });
}, 60_000);

it("kill -9 of the single process mid async runs, started again on the same data: every accepted run completes and is delivered", async () => {
  const started = Date.now();
  const N = 300;
  const calls: Call[] = [];
  const url = `${skiff.url}/v4/${P}/${APP}/sleep?async=true&webhookEndpoint=${encodeURIComponent(`${rx.url}/single`)}`;
  let killedAt = 0;
  const killer = (async () => {
    await vi.waitUntil(() => rx.requests.length >= N / 4, { timeout: 240_000, interval: 50 });
    await skiff.kill();
    killedAt = Date.now();
  })();
  // Calls made while it is down get no answer (status 0): nothing was accepted for them.
  await pool(
    Array.from({ length: N }, (_, i) => i),
    16,
    async () => {
      calls.push(await call(url, devToken, '{"ms":300}'));
    },
  );
  await killer;
  const accepted = calls.filter((c) => c.status === 202).map((c) => c.runId!);
  await skiff.start();
  const restartedAt = Date.now();
  const getRun: GetRun = (req) => management.getRun(req);
  const records = await waitFinal(nc, P, APP, accepted, 240_000, getRun);
  // Every delivery settled: one whose attempt the kill interrupted goes on after the webhook consumer's ack_wait (30 s).
  let deliveries: (WebhookDelivery | undefined)[] = [];
  await vi
    .waitUntil(
      async () => {
        deliveries = await pool(accepted, 16, (id) => firstDelivery(nc, P, APP, id, getRun));
        return deliveries.every((d) => d !== undefined && d.state !== "pending");
      },
      { timeout: 150_000, interval: 1_000 },
    )
    .catch(() => undefined);
  const events = await terminalEvents(nc, "events", P, APP);
  const perRun = new Map<string, number>();
  for (const r of rx.requests) {
    const id = String(r.headers["x-request-id"]);
    perRun.set(id, (perRun.get(id) ?? 0) + 1);
  }
  const receiverRequests: Record<string, number> = {};
  for (const id of accepted) receiverRequests[perRun.get(id) ?? 0] = (receiverRequests[perRun.get(id) ?? 0] ?? 0) + 1;
  const attempts: Record<string, number> = {};
  for (const r of records.values()) attempts[r?.attempts ?? 0] = (attempts[r?.attempts ?? 0] ?? 0) + 1;
  report("4. kill -9 the single process mid async runs, start it on the same data", {
    calls: calls.length,
    callStatuses: statuses(calls),
    transportErrors: transportErrors(calls),
    fiveHundreds: calls.filter((c) => c.status >= 500).length,
    accepted: accepted.length,
    killedAfterMs: killedAt - started,
    callErrors: callErrors(calls),
    finalStates: byStatus(records.values()),
    failures: failureTypes(records.values()),
    runsByAttempts: attempts,
    webhooksDelivered: deliveries.filter((d) => d?.state === "delivered").length,
    deliveriesByAttempts: countBy(deliveries.map((d) => d?.attempts.length ?? 0)),
    attemptOutcomes: countBy(
      deliveries.flatMap((d) => d?.attempts ?? []).map((a) => `${a.outcome} ${a.statusCode} ${a.error.slice(0, 80)}`),
    ),
    runsByReceiverRequests: receiverRequests,
    allDoneAfterRestartMs: Date.now() - restartedAt,
    durationMs: Date.now() - started,
  });
  expect(calls.filter((c) => c.status !== 202 && c.status !== 0)).toEqual([]);
  for (const id of accepted) {
    expect(records.get(id)?.status, `run ${id}`).toMatch(/^(success|failure)$/);
    expect(events.get(id), `terminal events of run ${id}`).toHaveLength(1);
    expect(deliveries[accepted.indexOf(id)]?.state, `webhook of run ${id}`).toBe("delivered");
    expect(perRun.get(id) ?? 0).toBeGreaterThanOrEqual(1);
    expect(perRun.get(id) ?? 0).toBeLessThanOrEqual(3);
  }
  // The kill caught runs mid-way, which ran again after the restart.
  expect([...records.values()].some((r) => (r?.attempts ?? 0) > 1)).toBe(true);
}, 600_000);
