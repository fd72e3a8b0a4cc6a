// The fault suite on the cluster topology of `npm run cluster`: a three-node
// JetStream cluster (every stream and bucket with three copies), two
// gateways (invocation,management), two runners and two webhook processes,
// each a real `services/main.ts --roles …` process. Each scenario injects a
// fault under load and prints its counts.
import { randomBytes } from "node:crypto";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { connect, type NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { ManagementService, type WebhookDelivery } from "../../gen/skiff/management/v2/management_pb.js";
import { bearerAuth } from "../../services/auth/bearer.js";
import { startNatsCluster, type NatsCluster } from "../../services/nats/cluster-process.js";
import { kvKeys } from "../../services/nats/kv-view.js";
import { buckets, streams } from "../../services/nats/layout.js";
import type { RunRecord } from "../../services/runs/store.js";
import { cortexApp, deploy, P } from "../helpers/run-apps.js";
import { followRunRecords } from "../helpers/run-records.js";
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

const APP = "faulty";
const ACK_WAIT_MS = 5_000;
let tmp: string;
let cluster: NatsCluster;
let nc: NatsConnection;
let devToken: string;
let rx: Receiver;
const procs: Record<string, SkiffProcess> = {};
const gateways = () => [procs["gateway-1"], procs["gateway-2"]];
const adminToken = `skiff_admin_${randomBytes(24).toString("base64url")}`;
const managementOf = (baseUrl: string) =>
  createClient(
    ManagementService,
    createConnectTransport({ baseUrl, httpVersion: "1.1", interceptors: [bearerAuth(adminToken)] }),
  );

/** GetRun from the first gateway that answers (a scenario may have one down). */
const getRun: GetRun = async (req) => {
  let failure: unknown;
  for (const g of gateways()) {
    try {
      return await managementOf(g.url).getRun(req);
    } catch (err) {
      failure = err;
    }
  }
  throw failure;
};

/** Whether a runner process has a replica of the app (min_replicas 1: it has prepared it). */
async function hasReplica(runner: SkiffProcess): Promise<boolean> {
  const kv = await nc.jetstream().views.kv(buckets.replicas.name, { bindOnly: true });
  for (const key of await kvKeys(await nc.jetstreamManager(), buckets.replicas.name, `${P}.${APP}.*`)) {
    const entry = await kv.get(key);
    if (entry?.operation === "PUT" && entry.json<{ runner: string }>().runner.endsWith(`:${runner.pid}`)) return true;
  }
  return false;
}

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-faults-"));
  cluster = await startNatsCluster({ dir: path.join(tmp, "nats") });
  nc = await connect({ servers: cluster.url.split(","), user: cluster.user, pass: cluster.password });
  const env = {
    SKIFF_NATS_URL: cluster.url,
    SKIFF_NATS_USER: cluster.user,
    SKIFF_NATS_PASSWORD: cluster.password,
    SKIFF_NATS_REPLICAS: "3",
    SKIFF_ADMIN_TOKEN: adminToken,
    SKIFF_RUN_ACK_WAIT_MS: String(ACK_WAIT_MS),
    SKIFF_SHUTDOWN_TIMEOUT_MS: "15000",
  };
  const roles = {
    "gateway-1": "invocation,management",
    "gateway-2": "invocation,management",
    "runner-1": "runner",
    "runner-2": "runner",
    "webhook-1": "webhook",
    "webhook-2": "webhook",
  };
  for (const [name, r] of Object.entries(roles))
    procs[name] = await spawnSkiff({ name, roles: r, dataDir: path.join(tmp, name), env });
  // The first gateway provisions and bootstraps; the others then start together.
  await procs["gateway-1"].start();
  await Promise.all(Object.values(procs).map((p) => p.start()));
  devToken = (await readFile(path.join(tmp, "gateway-1", "dev-token"), "utf8")).trim();
  const management = managementOf(procs["gateway-1"].url);
  await deploy(
    tmp,
    management,
    cortexApp(APP, { min_replicas: 1, max_replicas: 2, replica_concurrency: 8, response_grace_period: 60 }),
  );
  // Both runners have prepared the app once each has its first replica.
  await vi
    .waitUntil(async () => (await hasReplica(procs["runner-1"])) && (await hasReplica(procs["runner-2"])), {
      timeout: 180_000,
      interval: 500,
    })
    .catch(async (err: unknown) => {
      const kv = await nc.jetstream().views.kv(buckets.replicas.name, { bindOnly: true });
      const entries: string[] = [];
      for (const key of await kvKeys(await nc.jetstreamManager(), buckets.replicas.name, ">"))
        entries.push(`${key} ${JSON.stringify((await kv.get(key))?.string())}`);
      console.log(`replicas: ${entries.join("\n")}\npids: ${procs["runner-1"].pid} ${procs["runner-2"].pid}`);
      const tails = ["runner-1", "runner-2"].map(
        (n) => `--- ${n} (exits: ${procs[n].exits.join(",")})\n${procs[n].tail.join("\n")}`,
      );
      throw new Error(`the runners did not both start a replica of ${APP}:\n${tails.join("\n")}`, { cause: err });
    });
  // /flaky/*: 404 (retried) to the first two requests on a path, then 200; anything else 200.
  rx = await startReceiver((p, n) => (p.startsWith("/flaky/") && n <= 2 ? 404 : 200));
}, 300_000);

afterAll(async () => {
  await Promise.all(Object.values(procs).map((p) => p.kill()));
  await nc?.close();
  await cluster?.stop();
  await rx?.close();
  await rm(tmp, { recursive: true, force: true });
}, 60_000);

const asyncUrl = (gateway: SkiffProcess, fn: string, hook: string) =>
  `${gateway.url}/v4/${P}/${APP}/${fn}?async=true&webhookEndpoint=${encodeURIComponent(`${rx.url}${hook}`)}`;

/** Requests that reached the receiver for each run (by X-Request-Id), and which of them got a 2xx. */
function webhookRequests(
  runIds: string[],
  pathPrefix: string,
): Map<string, { requests: number; answered2xx: boolean }> {
  const want = new Set(runIds);
  const out = new Map<string, { requests: number; answered2xx: boolean }>();
  for (const r of rx.requests) {
    const id = String(r.headers["x-request-id"]);
    if (!want.has(id) || !r.path.startsWith(pathPrefix)) continue;
    const got = out.get(id) ?? { requests: 0, answered2xx: false };
    got.requests++;
    got.answered2xx ||= !r.path.startsWith("/flaky/") || rx.to(r.path).indexOf(r) >= 2;
    out.set(id, got);
  }
  return out;
}

/** Every accepted run final exactly once, and its webhook delivered (the delivery records and the receiver agree). */
async function checkRuns(
  scenario: string,
  runIds: string[],
  hookPrefix: string,
  calls: Call[],
  extra: Record<string, unknown> = {},
  timeoutMs = 240_000,
): Promise<Map<string, RunRecord | undefined>> {
  const records = await waitFinal(nc, P, APP, runIds, timeoutMs, getRun);
  // Webhooks: a run's terminal event reaches the webhook role some moments after its record; a killed webhook
  // process's messages go to another after the consumer's ack_wait (30 s).
  let deliveries: (WebhookDelivery | undefined)[] = [];
  await vi
    .waitUntil(
      async () => {
        deliveries = await pool(runIds, 16, (id) => firstDelivery(nc, P, APP, id, getRun));
        return deliveries.every((d) => d !== undefined && d.state !== "pending");
      },
      { timeout: 150_000, interval: 1_000 },
    )
    .catch(() => undefined);
  const events = await terminalEvents(nc, "events", P, APP);
  const hooks = webhookRequests(runIds, hookPrefix);
  const attemptOutcomes: Record<string, number> = {};
  for (const d of deliveries)
    for (const a of d?.attempts ?? []) {
      const k = `${a.outcome || "in flight"} ${a.statusCode}${a.error ? ` ${a.error.slice(0, 80)}` : ""}`;
      attemptOutcomes[k] = (attemptOutcomes[k] ?? 0) + 1;
    }
  const attempts: Record<string, number> = {};
  for (const d of deliveries) attempts[d?.attempts.length ?? 0] = (attempts[d?.attempts.length ?? 0] ?? 0) + 1;
  const finalEvents: Record<string, number> = {};
  for (const id of runIds) {
    const n = events.get(id)?.length ?? 0;
    finalEvents[n] = (finalEvents[n] ?? 0) + 1;
  }
  const receiverRequests: Record<string, number> = {};
  for (const id of runIds) {
    const n = hooks.get(id)?.requests ?? 0;
    receiverRequests[n] = (receiverRequests[n] ?? 0) + 1;
  }
  const runAttempts: Record<string, number> = {};
  for (const r of records.values()) runAttempts[r?.attempts ?? 0] = (runAttempts[r?.attempts ?? 0] ?? 0) + 1;
  report(scenario, {
    calls: calls.length,
    callStatuses: statuses(calls),
    transportErrors: transportErrors(calls),
    fiveHundreds: calls.filter((c) => c.status >= 500).length,
    callErrors: callErrors(calls),
    accepted: runIds.length,
    finalStates: byStatus(records.values()),
    failures: failureTypes(records.values()),
    runsByAttempts: runAttempts,
    runsByTerminalEvents: finalEvents,
    webhooksDelivered: deliveries.filter((d) => d?.state === "delivered").length,
    deliveriesByAttempts: attempts,
    attemptOutcomes,
    runsByReceiverRequests: receiverRequests,
    ...extra,
  });
  for (const id of runIds) {
    const r = records.get(id);
    expect(r?.status, `run ${id}: ${JSON.stringify(r)}`).toMatch(/^(success|failure)$/);
    expect(events.get(id), `terminal events of run ${id}`).toHaveLength(1);
    const d = deliveries[runIds.indexOf(id)];
    const tried = d?.attempts.map((a) => `${a.attempt}: ${a.outcome} ${a.statusCode} ${a.error}`);
    expect(d?.state, `webhook of run ${id}: ${JSON.stringify(tried)}`).toBe("delivered");
    const h = hooks.get(id);
    expect(h?.requests ?? 0, `receiver requests for run ${id}`).toBeGreaterThanOrEqual(1);
    expect(d!.attempts.length).toBeLessThanOrEqual(3);
    // More requests than attempts only when an attempt's 2xx never reached skiff (none is lost here).
    expect(h!.requests, `receiver requests for run ${id}`).toBeLessThanOrEqual(3);
  }
  return records;
}

describe("faults on the cluster topology", () => {
  it("SIGKILL a runner during 500 async runs with webhooks: every run final once, every webhook delivered", async () => {
    const started = Date.now();
    const N = 500;
    const calls: Call[] = [];
    let killedAt = 0;
    const victim = procs["runner-1"];
    const killer = (async () => {
      // Once runs are flowing (a fifth of them delivered): each runner then has all its slots busy.
      await vi.waitUntil(() => rx.requests.filter((q) => q.path === "/s1").length >= N / 5, {
        timeout: 240_000,
        interval: 50,
      });
      await victim.kill();
      killedAt = Date.now();
    })();
    await pool(
      Array.from({ length: N }, (_, i) => i),
      16,
      async (i) => {
        // Long enough that the runners hold 32 runs at any moment.
        const c = await call(asyncUrl(gateways()[i % 2], "sleep", "/s1"), devToken, '{"ms":1500}');
        calls.push(c);
      },
    );
    await killer;
    // As a supervisor would, a while later.
    await new Promise((r) => setTimeout(r, 2_000));
    await procs["runner-1"].start();
    const runIds = calls.filter((c) => c.status === 202).map((c) => c.runId!);
    const records = await checkRuns("1. SIGKILL runner-1 during 500 async runs with webhooks", runIds, "/s1", calls, {
      killedAfterMs: killedAt - started,
    });
    console.log(`[faults] 1. took ${Date.now() - started} ms`);
    expect(statuses(calls)).toEqual({ 202: N });
    // The kill did catch runs mid-way: they ran again elsewhere.
    expect([...records.values()].some((r) => (r?.attempts ?? 0) > 1)).toBe(true);
  }, 600_000);

  it("SIGKILL a webhook process mid-retries: every webhook still delivered, never more than 3 attempts", async () => {
    const started = Date.now();
    const N = 40;
    // /flaky/{i}: 404 (retried by the spec's table; a 5xx is not retried) twice, then 200.
    const calls = await pool(
      Array.from({ length: N }, (_, i) => i),
      8,
      (i) => call(asyncUrl(gateways()[i % 2], "add", `/flaky/${i}`), devToken, '{"a":1,"b":1}'),
    );
    const runIds = calls.filter((c) => c.status === 202).map((c) => c.runId!);
    // Between attempts 1 and 3 of most runs: every run has had its first attempt, none its third.
    await vi.waitUntil(
      () => new Set(rx.requests.filter((r) => r.path.startsWith("/flaky/")).map((r) => r.path)).size === N,
      {
        timeout: 120_000,
        interval: 50,
      },
    );
    const requestsBeforeKill = rx.requests.filter((r) => r.path.startsWith("/flaky/")).length;
    await procs["webhook-1"].kill();
    const killedAt = Date.now();
    await checkRuns("2a. SIGKILL webhook-1 mid-retries", runIds, "/flaky/", calls, {
      receiverRequestsBeforeKill: requestsBeforeKill,
      killedAfterMs: killedAt - started,
    });
    console.log(`[faults] 2a. took ${Date.now() - started} ms`);
    expect(statuses(calls)).toEqual({ 202: N });
    // Each run's third request was its 200: three requests for every run.
    for (let i = 0; i < N; i++) expect(rx.to(`/flaky/${i}`)).toHaveLength(3);
    await procs["webhook-1"].start();
  }, 600_000);

  it("SIGKILL a gateway mid sync calls: its callers get an error, never a hang; its runs end failure (gateway_lost), the other gateway's succeed", async () => {
    const started = Date.now();
    const N = 24;
    // A sync run has no KV record: its states are its events (header Skiff-Run), followed from here on.
    const seen = await followRunRecords(nc);
    const mine = () => [...seen.ids()].filter((id) => seen.latest(id)?.app_name === APP);
    const running = pool(
      Array.from({ length: N }, (_, i) => i),
      N,
      (i) => call(`${gateways()[i % 2].url}/v4/${P}/${APP}/sleep`, devToken, '{"ms":8000}', 180_000),
    );
    // Once the gateways have recorded them running (after a second).
    await vi.waitUntil(() => mine().filter((id) => seen.latest(id)?.status === "running").length >= N, {
      timeout: 120_000,
      interval: 250,
    });
    const gone = procs["gateway-1"];
    const ids = mine();
    // The gateway's RunControl id, which its records name, holds its pid.
    const goneId = ids.map((id) => seen.latest(id)?.runner).find((id) => id?.includes(`-${gone.pid}-`));
    expect(goneId).toBeDefined();
    await gone.kill();
    const killedAt = Date.now();
    const calls = await running;
    const answered = Date.now();
    const finals = new Map<string, RunRecord | undefined>();
    await pool(ids, N, async (id) => finals.set(id, await seen.final(id, 120_000).catch(() => seen.latest(id))));
    seen.stop();
    // What a user reads: GetRun on the surviving gateway (the run history) says the same, once the history
    // has projected the final events just seen (it lags them by a batch; more while its projector takes over).
    const other = managementOf(gateways()[1].url);
    const want = ids.map((id) => finals.get(id)?.status);
    let read: (string | undefined)[] = [];
    const readAll = async () =>
      (read = (
        await pool(ids, 8, async (id) => (await other.getRun({ projectId: P, appName: APP, runId: id })).run)
      ).map((r) => r?.status));
    await vi
      .waitUntil(async () => JSON.stringify(await readAll()) === JSON.stringify(want), { timeout: 15_000 })
      .catch(() => undefined);
    const runners: Record<string, number> = {};
    for (const r of finals.values()) runners[r?.runner ?? "none"] = (runners[r?.runner ?? "none"] ?? 0) + 1;
    const errorTypes: Record<string, number> = {};
    for (const r of finals.values())
      errorTypes[r?.error?.type ?? "none"] = (errorTypes[r?.error?.type ?? "none"] ?? 0) + 1;
    report("2b. SIGKILL gateway-1 mid sync calls", {
      calls: calls.length,
      callStatuses: statuses(calls),
      transportErrors: transportErrors(calls),
      fiveHundreds: calls.filter((c) => c.status >= 500).length,
      slowestCallAfterKillMs: answered - killedAt,
      records: ids.length,
      finalStates: byStatus(finals.values()),
      errorTypes,
      recordsByGateway: runners,
      allFinalAfterKillMs: Date.now() - killedAt,
    });
    console.log(`[faults] 2b. took ${Date.now() - started} ms`);
    await gone.start(); // before any check: the tests after this one need it
    expect(read).toEqual(want);
    // Callers of the killed gateway: no answer (the connection dropped); the other gateway's: the app's answer.
    expect(calls.filter((_, i) => i % 2 === 0).every((c) => c.status === 0)).toBe(true);
    expect(calls.filter((_, i) => i % 2 === 1).every((c) => c.status === 200)).toBe(true);
    expect(ids).toHaveLength(N);
    for (const r of finals.values()) {
      if (r!.runner === goneId) expect(r).toMatchObject({ status: "failure", error: { type: "gateway_lost" } });
      else expect(r!.status).toBe("success");
    }
  }, 600_000);

  /**
   * Sync calls (add) and async calls with webhooks (sleep 50 ms) spread over
   * both gateways by `workers` callers until `stop()`; `send` makes each call
   * (a client that retries, for the rolling restart).
   */
  function mixedLoad(
    hook: string,
    send: (url: string, body: string) => Promise<Call> = (u, b) => call(u, devToken, b),
  ) {
    const calls: (Call & { at: number; kind: "sync" | "async" })[] = [];
    let stopped = false;
    let n = 0;
    const workers = Array.from({ length: 8 }, async (_, w) => {
      while (!stopped) {
        const i = n++;
        const gateway = gateways()[i % 2];
        const at = Date.now();
        const kind = w % 2 === 0 ? "sync" : "async";
        const c =
          kind === "sync"
            ? await send(`${gateway.url}/v4/${P}/${APP}/add`, '{"a":2,"b":3}')
            : await send(asyncUrl(gateway, "sleep", hook), '{"ms":50}');
        calls.push({ ...c, at, kind });
      }
    });
    return {
      calls,
      async stop() {
        stopped = true;
        await Promise.all(workers);
        return calls;
      },
    };
  }

  /** Calls per phase: status counts and 5xx, by when they started. */
  function phases(calls: (Call & { at: number })[], marks: [string, number][]) {
    const out: Record<string, { calls: number; statuses: Record<string, number>; fiveHundreds: number }> = {};
    for (let i = 0; i < marks.length; i++) {
      const [name, from] = marks[i];
      const to = marks[i + 1]?.[1] ?? Infinity;
      const inPhase = calls.filter((c) => c.at >= from && c.at < to);
      out[name] = {
        calls: inPhase.length,
        statuses: statuses(inPhase),
        fiveHundreds: inPhase.filter((c) => c.status >= 500).length,
      };
    }
    return out;
  }

  async function streamsCurrent(): Promise<boolean> {
    const jsm = await nc.jetstreamManager();
    for (const name of [streams.runs.name, streams.events.name, streams.webhooks.name, `KV_${buckets.runs.name}`]) {
      const info = await jsm.streams.info(name).catch(() => undefined);
      const replicas = info?.cluster?.replicas ?? [];
      if (!info?.cluster?.leader || replicas.length !== 2 || !replicas.every((r) => r.current && !r.offline))
        return false;
    }
    return true;
  }

  /** How long after the cut a 5xx may still come: calls caught by it, and skiff's own retries. */
  const CUT_GRACE_MS = 10_000;

  async function nodeOutage(scenario: string, pick: () => Promise<number>) {
    const started = Date.now();
    const hook = `/s3-${scenario.slice(0, 2)}`;
    const load = mixedLoad(hook);
    await new Promise((r) => setTimeout(r, 6_000));
    const index = await pick();
    const node = cluster.nodes[index];
    const cutAt = Date.now();
    await node.stop();
    await new Promise((r) => setTimeout(r, 10_000));
    const backAt = Date.now();
    await node.start();
    await vi.waitUntil(streamsCurrent, { timeout: 120_000, interval: 500 });
    const currentAt = Date.now();
    await new Promise((r) => setTimeout(r, 5_000));
    const calls = await load.stop();
    const accepted = calls.filter((c) => c.kind === "async" && c.status === 202).map((c) => c.runId!);
    const syncCalls = calls.filter((c) => c.kind === "sync");
    await checkRuns(scenario, accepted, hook, calls, {
      node: node.name,
      phases: phases(calls, [
        ["beforeCut", 0],
        [`cut+${CUT_GRACE_MS}ms`, cutAt],
        ["nodeDown", cutAt + CUT_GRACE_MS],
        ["nodeBack", backAt],
        ["caughtUp", currentAt],
      ]),
      syncAnswered: syncCalls.filter((c) => c.status === 200).length,
      nodeCaughtUpAfterMs: currentAt - backAt,
      slowestCall: calls
        .filter((c) => c.ms === Math.max(...calls.map((d) => d.ms)))
        .map((c) => ({ ms: c.ms, kind: c.kind, status: c.status, error: c.error }))[0],
    });
    console.log(`[faults] ${scenario} took ${Date.now() - started} ms`);
    // Errors only for calls under way at the cut or just after it.
    expect(calls.filter((c) => c.at + c.ms < cutAt && c.status !== 200 && c.status !== 202)).toEqual([]);
    expect(calls.filter((c) => c.at >= cutAt + CUT_GRACE_MS && c.status !== 200 && c.status !== 202)).toEqual([]);
    expect(calls.filter((c) => c.status === 0)).toEqual([]);
  }

  it("stop a NATS node (not the leader of SKIFF_RUNS) under mixed load and bring it back: no accepted run lost, calls keep succeeding", async () => {
    await nodeOutage("3a. stop a NATS node under mixed load", async () => {
      const leader = (await (await nc.jetstreamManager()).streams.info(streams.runs.name)).cluster!.leader;
      return cluster.nodes.findIndex((n) => n.name !== leader);
    });
  }, 600_000);

  it("stop the NATS node that leads SKIFF_RUNS under mixed load and bring it back: no accepted run lost, calls keep succeeding", async () => {
    await nodeOutage("3b. stop the SKIFF_RUNS leader under mixed load", async () => {
      const leader = (await (await nc.jetstreamManager()).streams.info(streams.runs.name)).cluster!.leader;
      return cluster.nodes.findIndex((n) => n.name === leader);
    });
  }, 600_000);

  it("rolling restart (SIGTERM each process in turn) under load, behind a client that retries on connection errors only: no 5xx, no lost run", async () => {
    const started = Date.now();
    const hook = "/s5";
    /** Another gateway when a connection fails before any answer; any HTTP answer is final. */
    const retrying = async (url: string, body: string): Promise<Call> => {
      let target = url;
      for (let attempt = 1; ; attempt++) {
        const c = await call(target, devToken, body);
        if (c.status !== 0 || attempt >= 20) return c;
        const [a, b] = gateways().map((g) => g.url);
        target = target.startsWith(a) ? b + target.slice(a.length) : a + target.slice(b.length);
        if (attempt % 2 === 0) await new Promise((r) => setTimeout(r, 250));
      }
    };
    const load = mixedLoad(hook, retrying);
    const order = ["runner-1", "runner-2", "webhook-1", "webhook-2", "gateway-1", "gateway-2"];
    const exitCodes: Record<string, number | null> = {};
    for (const name of order) {
      await new Promise((r) => setTimeout(r, 3_000));
      exitCodes[name] = await procs[name].term();
      await procs[name].start();
      // A runner takes calls again once it has prepared the app and started its replica.
      if (name.startsWith("runner"))
        await vi.waitUntil(() => hasReplica(procs[name]), { timeout: 120_000, interval: 250 });
    }
    await new Promise((r) => setTimeout(r, 3_000));
    const calls = await load.stop();
    const accepted = calls.filter((c) => c.kind === "async" && c.status === 202).map((c) => c.runId!);
    await checkRuns("5. rolling restart under load", accepted, hook, calls, { exitCodes });
    console.log(`[faults] 5. took ${Date.now() - started} ms`);
    expect(Object.values(exitCodes)).toEqual(order.map(() => 0));
    expect(calls.filter((c) => c.status !== 200 && c.status !== 202)).toEqual([]);
  }, 600_000);
});
