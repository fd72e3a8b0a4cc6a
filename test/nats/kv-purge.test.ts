// An ended async run's record leaves KV `skiff-runs` (nats/kv-purge.ts),
// so that nats-server holds nothing per finished run; GetRun then answers
// from the run history, with the result read from the run's terminal event.
// A run's webhook deliveries leave KV `skiff-webhooks` once over, and GetRun
// reads them from the history too.
// Against real nats-servers and a real skiff process.
import { toJson } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { connect, type KV, type NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { silentLogger } from "../../services/config/logger.js";
import { kvGetLatest } from "../../services/nats/kv-get.js";
import { KvPurger, kvPurgeKey, kvRemoveKey } from "../../services/nats/kv-purge.js";
import { RunStore } from "../../services/runs/store.js";
import { capturingLogger } from "../helpers/logs.js";
import { startNatsServer, type TestNats } from "../helpers/nats-server.js";
import { cortexApp, deploy, P, post } from "../helpers/run-apps.js";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";
import { startReceiver, type Receiver } from "../helpers/webhook-receiver.js";
import { startWebhookRole, type WebhookRole } from "../../services/webhook/role.js";

describe("kvPurgeKey and KvPurger", () => {
  let nats: TestNats;
  let nc: NatsConnection;
  let kv: KV;
  const subjectsOf = async (filter: string) =>
    (await (await nc.jetstreamManager()).streams.info("KV_purge-test", { subjects_filter: filter })).state.subjects ??
    {};

  beforeAll(async () => {
    nats = await startNatsServer();
    nc = await connect({ servers: nats.url });
    kv = await nc.jetstream().views.kv("purge-test", { history: 8 });
  });
  afterAll(async () => {
    await nc?.close();
    await nats?.stop();
  });

  it("takes every revision of one key out, leaves no marker and no subject, and touches no other key", async () => {
    for (const v of ["queued", "running", "success"]) await kv.put("p.a.one", v);
    await kv.put("p.a.two", "queued");
    expect(await kvPurgeKey(nc, "purge-test", "p.a.one")).toBe(3);
    expect(await kvGetLatest(nc, "purge-test", "p.a.one")).toBeUndefined();
    expect(await subjectsOf("$KV.purge-test.p.a.>")).toEqual({ "$KV.purge-test.p.a.two": 1 });
    // A key with nothing, or already purged: nothing to do, no error.
    expect(await kvPurgeKey(nc, "purge-test", "p.a.one")).toBe(0);
    await expect(kvPurgeKey(nc, "no-such-bucket", "x")).rejects.toThrow(/cannot purge x of KV no-such-bucket/);
  });

  it("kvRemoveKey deletes the revisions an entry lists one by one (no stream purge), keeps one it is told to, and purges one that lists none", async () => {
    const revisions: number[] = [];
    for (const v of ["a", "b", "c"]) revisions.push(await kv.put("r.a.listed", v));
    await kv.put("r.a.kept", "x");
    await kv.put("r.a.unlisted", "y");
    const asked: string[] = [];
    const watch = nc.subscribe("$JS.API.STREAM.>", { callback: (_err, m) => asked.push(m.subject) });
    await nc.flush();
    expect(await kvRemoveKey(nc, "purge-test", "r.a.listed", (e) => [...revisions.slice(0, 2), e.revision])).toBe(3);
    // The server may answer a request before it hands this connection its own copy of it: a round trip
    // after the requests brings every copy in.
    await nc.flush();
    expect(asked.filter((a) => a.includes(".PURGE."))).toEqual([]);
    expect(asked.filter((a) => a.includes(".MSG.DELETE."))).toHaveLength(3);
    expect(await kvRemoveKey(nc, "purge-test", "r.a.kept", () => false)).toBe(0);
    expect(await kvRemoveKey(nc, "purge-test", "r.a.unlisted", () => undefined)).toBe(1);
    await nc.flush();
    expect(asked.filter((a) => a.includes(".PURGE."))).toHaveLength(1);
    // A revision gone already (the bucket's history limit, an earlier removal) is no error.
    expect(await kvRemoveKey(nc, "purge-test", "r.a.kept", (e) => [1, e.revision])).toBe(1);
    watch.unsubscribe();
    expect(await subjectsOf("$KV.purge-test.r.>")).toEqual({});
    expect(await kvRemoveKey(nc, "purge-test", "r.a.never", () => [1])).toBe(0);
  });

  it("purges a scheduled record once its time has come, not before, many at once", async () => {
    const purger = new KvPurger((key) => kvPurgeKey(nc, "purge-test", key), silentLogger, 400, "test keys");
    try {
      const ids = Array.from({ length: 300 }, (_, i) => `r${i}`);
      await Promise.all(ids.map((id) => kv.put(`many.a.${id}`, "success")));
      for (const id of ids) purger.schedule(`many.a.${id}`);
      expect(purger.pending).toBe(300);
      await new Promise((r) => setTimeout(r, 150));
      purger.drain();
      expect(Object.keys(await subjectsOf("$KV.purge-test.many.>"))).toHaveLength(300);
      await vi.waitUntil(() => purger.purged === 300, { timeout: 30_000, interval: 50 });
      expect(await subjectsOf("$KV.purge-test.many.>")).toEqual({});
      expect(purger.pending).toBe(0);
    } finally {
      purger.close();
    }
  });

  it("tries a failed purge again, gives up after three tries with one warning, and drops what is pending at close", async () => {
    const tries: string[] = [];
    const purge = async (key: string) => {
      tries.push(key);
      throw new Error("JetStream is away");
    };
    const { logger, lines } = capturingLogger();
    const purger = new KvPurger(purge, logger, 1, "test keys");
    purger.schedule("failing");
    await vi.waitUntil(() => purger.abandoned === 1, { timeout: 60_000, interval: 50 });
    expect(tries).toEqual(["failing", "failing", "failing"]);
    expect(lines.filter((l) => l.level === 40).map((l) => l.msg)).toEqual([
      expect.stringMatching(/cannot take test keys out of KV/),
    ]);
    purger.close();
    const later = new KvPurger(purge, silentLogger, 60_000, "test keys");
    later.schedule("left");
    later.close();
    later.drain(Date.now() + 120_000);
    expect(tries).not.toContain("left");
  }, 30_000);
});

describe("an async run after its record left KV", () => {
  let t: TestSkiff;
  let tmp: string;
  let store: RunStore;

  beforeAll(async () => {
    tmp = await mkdtemp(path.join(tmpdir(), "skiff-purge-"));
    // Records leave KV 2 s (twice the ack wait) after their runs were acked.
    t = await startTestSkiff({ env: { SKIFF_RUN_ACK_WAIT_MS: "1000", SKIFF_FINAL_RECORD_KEEP_MS: "0" } });
    await deploy(tmp, t.management(), cortexApp("pur", { max_replicas: 1 }));
    store = await RunStore.open(t.skiff.nats.nc);
    // The run history opens in the background: a first GetRun would wait for it longer than a record stays.
    await t.management().listRuns({ projectId: P, appName: "pur" });
  }, 60_000);
  afterAll(async () => {
    await t?.close();
    await rm(tmp, { recursive: true, force: true });
  });

  const getRun = async (runId: string) => (await t.management().getRun({ projectId: P, appName: "pur", runId })).run!;

  async function runAsync(fn: string, body: string): Promise<string> {
    const res = await post(`${t.url}/v4/${P}/pur/${fn}?async=true`, t.devToken, body);
    expect(res.status).toBe(202);
    return res.json.run_id as string;
  }

  it("GetRun answers the same run and result from the history and the terminal event as it did from KV; NATS keeps no subject for it", async () => {
    const small = await runAsync("add", '{"a":40,"b":2}');
    const failed = await runAsync("fail", "{}");
    // Past the events' inline limit: the result is an object in skiff-results, named by the event.
    const large = await runAsync("big", JSON.stringify({ n: 1_200_000 }));
    const ids = [small, failed, large];
    const before = new Map<string, Awaited<ReturnType<typeof getRun>>>();
    for (const id of ids) {
      await vi.waitUntil(async () => ["success", "failure"].includes((await getRun(id)).status), {
        timeout: 60_000,
        interval: 100,
      });
      // Read while the record is still in KV (it stays 2 s after the run's ack).
      expect(await store.get(P, "pur", id)).toBeDefined();
      before.set(id, await getRun(id));
    }
    for (const id of ids)
      await vi.waitUntil(async () => (await store.get(P, "pur", id)) === undefined, { timeout: 45_000, interval: 100 });
    const jsm = await t.skiff.nats.nc.jetstreamManager();
    const left = (await jsm.streams.info("KV_skiff-runs", { subjects_filter: `$KV.skiff-runs.${P}.pur.>` })).state;
    expect(left.subjects ?? {}).toEqual({});
    for (const id of ids) {
      const after = await getRun(id);
      expect(after).toEqual(before.get(id));
    }
    const resultOf = (id: string) => toJson(ValueSchema, before.get(id)!.result!);
    expect(resultOf(small)).toMatchObject({ run_id: small, result: 42 });
    expect(before.get(failed)).toMatchObject({ status: "failure", error: { type: "TypeError" } });
    expect(resultOf(large)).toMatchObject({ run_id: large, result: "x".repeat(1_200_000) });
    // A final run cannot be cancelled, whichever store answers.
    await expect(t.management().cancelRun({ projectId: P, appName: "pur", runId: small })).rejects.toThrow(
      /already success/,
    );
  }, 90_000);
});

describe("a run's webhook deliveries after they left KV", () => {
  let t: TestSkiff;
  let tmp: string;
  let rx: Receiver;
  let role: WebhookRole;

  beforeAll(async () => {
    tmp = await mkdtemp(path.join(tmpdir(), "skiff-purge-wh-"));
    rx = await startReceiver((p) => (p === "/down" ? 404 : 200));
    t = await startTestSkiff({ env: { SKIFF_ROLES: "invocation,management,runner" } });
    // A webhook role whose entries leave KV 2 s (twice its ack wait) after their deliveries are over.
    role = await startWebhookRole({
      nc: t.skiff.nats.nc,
      logger: silentLogger,
      allowedCidrs: ["127.0.0.0/8"],
      ackWaitMs: 1_000,
      keepMs: 0,
    });
    await deploy(tmp, t.management(), cortexApp("hook", { max_replicas: 1 }));
  }, 60_000);
  afterAll(async () => {
    await role?.close();
    await t?.close();
    await rx?.close();
    await rm(tmp, { recursive: true, force: true });
  });

  const deliveriesOf = async (runId: string) =>
    (await t.management().getRun({ projectId: P, appName: "hook", runId })).run!.webhookDeliveries;
  const inKv = async (runId: string) => (await kvGetLatest(t.skiff.nats.nc, "skiff-webhooks", runId)) !== undefined;
  const settledIn = async (runId: string, n: number) =>
    vi.waitUntil(
      async () => {
        const d = await deliveriesOf(runId);
        return d.length === n && d.every((x) => x.state !== "pending") && d;
      },
      { timeout: 60_000, interval: 100 },
    );

  it("GetRun shows the same deliveries from the history; a redelivery numbers on from them and leaves KV in turn", async () => {
    const hooked = async (target: string) => {
      const url = encodeURIComponent(`${rx.url}${target}`);
      const res = await post(
        `${t.url}/v4/${P}/hook/add?async=true&webhookEndpoint=${url}`,
        t.devToken,
        '{"a":1,"b":2}',
      );
      expect(res.status).toBe(202);
      return res.json.run_id as string;
    };
    const ok = await hooked("/ok");
    const down = await hooked("/down");
    const before = new Map([
      [ok, await settledIn(ok, 1)],
      [down, await settledIn(down, 1)],
    ]);
    expect(before.get(ok)![0]).toMatchObject({ deliveryId: "1", state: "delivered" });
    expect(before.get(down)![0]).toMatchObject({ deliveryId: "1", state: "failed" });
    expect(before.get(down)![0].attempts).toHaveLength(3);
    for (const id of [ok, down]) {
      await vi.waitUntil(async () => !(await inKv(id)), { timeout: 45_000, interval: 100 });
      expect(await deliveriesOf(id)).toEqual(before.get(id));
    }
    const again = await t.management().redeliverWebhook({ projectId: P, appName: "hook", runId: ok });
    expect(again.delivery).toMatchObject({ deliveryId: "2", state: "pending" });
    const both = await settledIn(ok, 2);
    expect(both.map((d) => [d.deliveryId, d.state])).toEqual([
      ["1", "delivered"],
      ["2", "delivered"],
    ]);
    expect(rx.to("/ok")).toHaveLength(2);
    await vi.waitUntil(async () => !(await inKv(ok)), { timeout: 45_000, interval: 100 });
    expect(await deliveriesOf(ok)).toEqual(both);
    const jsm = await t.skiff.nats.nc.jetstreamManager();
    const left = (await jsm.streams.info("KV_skiff-webhooks", { subjects_filter: ">" })).state;
    expect(left.subjects ?? {}).toEqual({});
  }, 120_000);
});
