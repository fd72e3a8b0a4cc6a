// The run API and the life of async runs: events for each state change,
// cancel (queued and running), idempotency, the queue cap, listing.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { fromBinary } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { RunEventSchema, type RunEvent } from "../../gen/skiff/events/v1/events_pb.js";
import { runCli } from "../helpers/cli.js";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";
import { cortexApp, deploy, P, post } from "../helpers/run-apps.js";
import { silentLogger } from "../../services/config/logger.js";
import { buckets } from "../../services/nats/layout.js";
import { recordOfEvent, RUNNING_EVENT_AFTER_MS } from "../../services/runs/events.js";
import type { RunRecord } from "../../services/runs/store.js";

let t: TestSkiff;
let tmp: string;
const v4 = (app: string, rest: string) => `${t.url}/v4/${P}/${app}/${rest}`;
const getRun = async (app: string, runId: string) =>
  (await t.management().getRun({ projectId: P, appName: app, runId })).run!;
const reaches = (app: string, runId: string, status: string) =>
  vi.waitUntil(
    async () => {
      const r = await getRun(app, runId);
      return r.status === status ? r : undefined;
    },
    { timeout: 60_000 },
  );
const sleepAsync = async (app: string, ms: number, headers: Record<string, string> = {}) =>
  (await post(`${v4(app, "sleep")}?async=true`, t.devToken, JSON.stringify({ ms }), headers)).json.run_id as string;

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-runs-"));
  t = await startTestSkiff({ env: { SKIFF_MAX_QUEUED_RUNS: "3" } });
  await deploy(
    tmp,
    t.management(),
    cortexApp("one", { max_replicas: 1, replica_concurrency: 1, min_replicas: 1, response_grace_period: 30 }),
  );
  await deploy(
    tmp,
    t.management(),
    cortexApp("many", { max_replicas: 2, replica_concurrency: 8, response_grace_period: 30 }),
  );
  // The apps on the runner.
  await vi.waitUntil(() => t.skiff.runner!.version(P, "one") === 1 && t.skiff.runner!.version(P, "many") === 1, {
    timeout: 60_000,
  });
}, 60_000);
afterAll(async () => {
  await t?.close();
  await rm(tmp, { recursive: true, force: true });
});

describe("runs - events", () => {
  it("every state change publishes a RunEvent; the terminal one carries the response body byte for byte", async () => {
    const events: RunEvent[] = [];
    const records = new Map<string, RunRecord[]>();
    const sub = t.skiff.nats.nc.subscribe(`skiff.events.runs.${P}.many.>`, {
      callback: (_e, m) => {
        const event = fromBinary(RunEventSchema, m.data);
        events.push(event);
        records.set(event.runId, [...(records.get(event.runId) ?? []), recordOfEvent(m.headers)!]);
      },
    });
    try {
      // Long enough to be announced `running` (RUNNING_EVENT_AFTER_MS); a faster one has no such event.
      const runId = await sleepAsync("many", RUNNING_EVENT_AFTER_MS + 200);
      await reaches("many", runId, "success");
      const mine = await vi.waitUntil(
        () => {
          const e = events.filter((x) => x.runId === runId);
          return e.length >= 3 ? e : undefined;
        },
        { timeout: 60_000 },
      );
      expect(mine.map((e) => [e.status, e.attempt, e.async])).toEqual([
        ["queued", 1, true],
        ["running", 1, true],
        ["success", 1, true],
      ]);
      const body = new TextDecoder().decode(mine[2].response!.data);
      expect(JSON.parse(body)).toMatchObject({ run_id: runId, result: { slept: RUNNING_EVENT_AFTER_MS + 200 } });
      const sync = await post(v4("many", "add"), t.devToken, '{"a":1,"b":2}', {});
      // A sync run that ends quickly is written once, when it ends.
      const syncEvents = await vi.waitUntil(
        () => {
          const e = events.filter((x) => x.runId === sync.json.run_id);
          return e.length >= 1 ? e : undefined;
        },
        { timeout: 60_000 },
      );
      expect(syncEvents.map((e) => e.status)).toEqual(["success"]);
      expect(new TextDecoder().decode(syncEvents[0].response!.data)).toBe(sync.text);
      // That publish is its record: the event carries it in a header, and KV holds none for a sync run.
      expect(records.get(sync.json.run_id)).toEqual([
        expect.objectContaining({ run_id: sync.json.run_id, status: "success", async: false, status_code: 200 }),
      ]);
      const kv = await t.skiff.nats.nc.jetstream().views.kv(buckets.runs.name, { bindOnly: true });
      expect(await kv.get(`${P}.many.${sync.json.run_id}`)).toBeNull();
      expect(await kv.get(`${P}.many.${runId}`)).not.toBeNull(); // an async run has one, for its state changes
      // One that runs longer shows as running while it does.
      const slow = await post(v4("many", "sleep"), t.devToken, '{"ms":1500}', {});
      expect(slow.status).toBe(200);
      const slowEvents = await vi.waitUntil(
        () => {
          const e = events.filter((x) => x.runId === slow.json.run_id);
          return e.length >= 2 ? e : undefined;
        },
        { timeout: 60_000 },
      );
      expect(slowEvents.map((e) => e.status)).toEqual(["running", "success"]);
    } finally {
      sub.unsubscribe();
    }
  });
});

describe("runs - cancel, idempotency, queue cap", () => {
  it("cancel: a queued run never runs; a running one is aborted and its replica keeps serving; a final one is refused", async () => {
    const running = await sleepAsync("one", 20_000);
    await reaches("one", running, "running");
    const replica = t.skiff.runner!.replicas(P, "one").find((r) => r.state === "ready")!;
    const queued = await sleepAsync("one", 10);
    expect((await getRun("one", queued)).status).toBe("queued");

    const q = await t.management().cancelRun({ projectId: P, appName: "one", runId: queued });
    expect(q.run).toMatchObject({ status: "cancelled", attempts: 0 });
    const r = await t.management().cancelRun({ projectId: P, appName: "one", runId: running });
    expect(r.run).toMatchObject({ status: "cancelled", error: { type: "cancelled" } });

    // The same replica answers the next run; the cancelled queued run was never started.
    const next = await post(v4("one", "add"), t.devToken, '{"a":1,"b":1}');
    expect(next.status).toBe(200);
    expect(t.skiff.runner!.replicas(P, "one").map((x) => x.replicaId)).toContain(replica.replicaId);
    const later = await sleepAsync("one", 10);
    await reaches("one", later, "success");
    expect(await getRun("one", queued)).toMatchObject({ status: "cancelled", attempts: 0 });

    const err = await t
      .management()
      .cancelRun({ projectId: P, appName: "one", runId: later })
      .catch((e: unknown) => ConnectError.from(e));
    expect(err).toMatchObject({ code: Code.FailedPrecondition });
  });

  it("cancel of a sync run: its REST caller gets 499 canceled, the run ends cancelled", async () => {
    const call = post(v4("many", "sleep"), t.devToken, JSON.stringify({ ms: 20_000 }));
    // A sync run shows in the history once it has run for a second.
    const running = await vi.waitUntil(
      async () => {
        const page = await t.management().listRuns({ projectId: P, appName: "many", status: "running" });
        return page.runs.find((r) => !r.async)?.runId;
      },
      { timeout: 60_000, interval: 100 },
    );
    const r = await t.management().cancelRun({ projectId: P, appName: "many", runId: running });
    expect(r.run).toMatchObject({ status: "cancelled", error: { type: "cancelled" } });
    const answer = await call;
    expect(answer.status).toBe(499);
    expect(answer.json).toMatchObject({ code: "canceled" });
    expect(answer.headers.get("x-request-id")).toBe(running);
  });

  it("Idempotency-Key: repeats, even concurrent ones, get the first run id and make no second run", async () => {
    const key = { "idempotency-key": `k-${Date.now()}` };
    const answers = await Promise.all(
      [1, 2, 3].map(() => post(`${v4("many", "add")}?async=true`, t.devToken, '{"a":1,"b":2}', key)),
    );
    const ids = new Set(answers.map((a) => a.json.run_id));
    expect(ids.size).toBe(1);
    for (const a of answers) {
      expect(a.status).toBe(202);
      expect(a.text).toBe(answers[0].text);
      expect(a.headers.get("x-request-id")).toBe(answers[0].json.run_id);
    }
    await reaches("many", answers[0].json.run_id, "success");
    const again = await post(`${v4("many", "add")}?async=true`, t.devToken, '{"a":1,"b":2}', key);
    expect(again.text).toBe(answers[0].text);
    const other = await post(`${v4("many", "add")}?async=true`, t.devToken, '{"a":1,"b":2}', {
      "idempotency-key": `${key["idempotency-key"]}-b`,
    });
    expect(other.json.run_id).not.toBe(answers[0].json.run_id);
    const listed = await vi.waitUntil(
      async () => {
        const l = await t.management().listRuns({ projectId: P, appName: "many", asyncOnly: true, pageSize: 500 });
        return l.runs.some((x) => x.runId === other.json.run_id) ? l : undefined;
      },
      { timeout: 60_000 },
    );
    expect(listed.runs.filter((x) => x.runId === answers[0].json.run_id)).toHaveLength(1);
  });

  it("a full queue answers 429 with Retry-After before accepting", async () => {
    const ids = [await sleepAsync("one", 3000)];
    await reaches("one", ids[0], "running");
    ids.push(await sleepAsync("one", 10), await sleepAsync("one", 10));
    const full = await post(`${v4("one", "sleep")}?async=true`, t.devToken, '{"ms":1}');
    expect(full.status).toBe(429);
    expect(full.json).toMatchObject({ code: "resource_exhausted" });
    expect(Number(full.headers.get("retry-after"))).toBeGreaterThan(0);
    for (const id of ids.reverse()) await t.management().cancelRun({ projectId: P, appName: "one", runId: id });
  });
});

describe("runs - listing", () => {
  it("newest first, paginated with an opaque token, filtered by async and status", async () => {
    const sync = await post(v4("many", "fail"), t.devToken, "{}");
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) ids.push(await sleepAsync("many", 1));
    for (const id of ids) await reaches("many", id, "success");
    // The run history has the newest run.
    await vi.waitUntil(
      async () =>
        (await t.management().listRuns({ projectId: P, appName: "many", pageSize: 1 })).runs[0]?.runId === ids[2],
      { timeout: 60_000 },
    );
    const first = await t.management().listRuns({ projectId: P, appName: "many", pageSize: 2, asyncOnly: true });
    expect(first.runs.map((r) => r.runId)).toEqual([ids[2], ids[1]]);
    expect(first.nextPageToken).not.toBe("");
    const second = await t
      .management()
      .listRuns({ projectId: P, appName: "many", pageSize: 2, asyncOnly: true, pageToken: first.nextPageToken });
    expect(second.runs[0].runId).toBe(ids[0]);
    const failures = await t.management().listRuns({ projectId: P, appName: "many", status: "failure" });
    expect(failures.runs.map((r) => r.runId)).toContain(sync.json.run_id);
    expect(failures.runs.every((r) => r.status === "failure")).toBe(true);
    const rest = await fetch(`${t.url}/v2/projects/${P}/apps/many/runs?page_size=1&status=success`, {
      headers: { authorization: `Bearer ${t.devToken}` },
    });
    const body = (await rest.json()) as { runs: { status: string; async: boolean }[]; next_page_token: string };
    expect(body.runs).toEqual([expect.objectContaining({ status: "success", async: true })]);
    const bad = await fetch(`${t.url}/v2/projects/${P}/apps/many/runs?status=done`, {
      headers: { authorization: `Bearer ${t.devToken}` },
    });
    expect(bad.status).toBe(400);
  });

  it('app "-" lists and watches every app of the project, newest first', async () => {
    const controller = new AbortController();
    const seen: string[] = [];
    const watching = (async () => {
      for await (const m of t.management().watchRuns({ projectId: P, appName: "-" }, { signal: controller.signal }))
        seen.push(`${m.run!.appName}:${m.run!.runId}`);
    })().catch(() => undefined);
    await new Promise((r) => setTimeout(r, 200));
    const inMany = (await post(v4("many", "add"), t.devToken, '{"a":1,"b":1}')).json.run_id as string;
    const inOne = (await post(v4("one", "add"), t.devToken, '{"a":1,"b":1}')).json.run_id as string;
    const listed = await vi.waitUntil(
      async () => {
        const page = await t.management().listRuns({ projectId: P, appName: "-", pageSize: 2 });
        return page.runs[0]?.runId === inOne ? page : undefined;
      },
      { timeout: 60_000 },
    );
    expect(listed.runs.map((r) => [r.appName, r.runId])).toEqual([
      ["one", inOne],
      ["many", inMany],
    ]);
    await vi.waitUntil(() => seen.includes(`many:${inMany}`) && seen.includes(`one:${inOne}`), { timeout: 60_000 });
    const rest = await fetch(`${t.url}/v2/projects/${P}/apps/-/runs?page_size=2`, {
      headers: { authorization: `Bearer ${t.devToken}` },
    });
    expect(((await rest.json()) as { runs: { run_id: string }[] }).runs.map((r) => r.run_id)).toEqual([inOne, inMany]);
    controller.abort();
    await watching;
  });

  it("WatchRuns streams the changes of a project's runs from now on, not the runs already stored", async () => {
    const earlier = await sleepAsync("many", 1);
    await reaches("many", earlier, "success");
    const controller = new AbortController();
    const seen: string[] = [];
    const watching = (async () => {
      for await (const m of t.management().watchRuns({ projectId: P, appName: "many" }, { signal: controller.signal }))
        seen.push(`${m.run!.runId}:${m.run!.status}`);
    })().catch(() => undefined);
    await new Promise((r) => setTimeout(r, 200));
    const id = await sleepAsync("many", RUNNING_EVENT_AFTER_MS + 200);
    await vi.waitUntil(() => seen.includes(`${id}:success`), { timeout: 60_000 });
    expect(seen.filter((s) => s.startsWith(id))).toEqual([`${id}:queued`, `${id}:running`, `${id}:success`]);
    expect(seen.filter((s) => s.startsWith(earlier))).toEqual([]);
    controller.abort();
    await watching;
  });
});

describe("runs - CLI", () => {
  const cli = (args: string[]) => runCli(args, { env: { SKIFF_URL: t.url, SKIFF_TOKEN: t.devToken } });

  it("skiff run (sync and --async), skiff runs, skiff run-status", async () => {
    const sync = await cli(["run", "many/add", "--data", '{"a":40,"b":2}']);
    expect(sync.code).toBe(0);
    expect(JSON.parse(sync.stdout)).toMatchObject({ result: 42 });
    const queued = await cli(["run", "many/add", "-d", '{"a":1,"b":2}', "--async"]);
    const runId = queued.stdout.trim();
    expect(runId).toMatch(/^[0-9a-f-]{36}$/);
    await reaches("many", runId, "success");
    const status = await cli(["run-status", runId, "--app", "many"]);
    expect(status.stdout).toMatch(/status: +success/);
    expect(status.stdout).toContain('"result":3');
    // Without --app: looked up in every app of the project.
    expect((await cli(["run-status", runId])).stdout).toBe(status.stdout);
    const list = await vi.waitUntil(
      async () => {
        const r = await cli(["runs", "many", "--async", "--status", "success"]);
        return r.stdout.includes(runId) ? r : undefined;
      },
      { timeout: 60_000 },
    );
    expect(list.stdout).toMatch(new RegExp(`${runId}\\s+success\\s+async\\s+add`));
    const failed = await cli(["run", "many/fail"]);
    expect(failed.code).toBe(1);
    expect(failed.stderr).toMatch(/answered 500/);
  });
});

describe("runs - results retention", () => {
  it("a kept result is readable until SKIFF_RESULT_TTL passes, inline or in the object store, then reads as gone", async () => {
    const { RunResults } = await import("../../services/runs/results.js");
    const { RunStore } = await import("../../services/runs/store.js");
    const nc = t.skiff.nats.nc;
    const small = (await post(`${v4("many", "big")}?async=true`, t.devToken, '{"n":10}')).json.run_id as string;
    const large = (await post(`${v4("many", "big")}?async=true`, t.devToken, '{"n":100000}')).json.run_id as string;
    for (const id of [small, large]) await reaches("many", id, "success");
    const results = new RunResults(nc.jetstream(), nc, 86_400);
    const store = await RunStore.open(nc);
    for (const [id, n] of [
      [small, 10],
      [large, 100_000],
    ] as const) {
      const record = (await store.get(P, "many", id))!.record;
      expect(record.result?.object === undefined).toBe(n === 10);
      const body = await results.read(record);
      expect(JSON.parse(new TextDecoder().decode(body!.data)).result).toHaveLength(n);
      expect(await results.read(record, new Date(Date.now() + 86_401_000))).toBeUndefined();
    }
  });
});

describe("runs - record retention", () => {
  it("an async run's record keeps its revisions: nothing is deleted from the middle of the records' stream", async () => {
    const { REWRITTEN_HISTORY, MAX_RUN_ATTEMPTS } = await import("../../services/nats/layout.js");
    const { runKey } = await import("../../services/runs/store.js");
    // running once per attempt, then final (or a cancel's): every write of a record fits its history.
    expect(REWRITTEN_HISTORY).toBeGreaterThanOrEqual(MAX_RUN_ATTEMPTS + 2);
    const runId = (await post(`${v4("many", "big")}?async=true`, t.devToken, '{"n":3}')).json.run_id as string;
    await reaches("many", runId, "success");
    const jsm = await t.skiff.nats.nc.jetstreamManager();
    const stream = `KV_${buckets.runs.name}`;
    const subject = `$KV.${buckets.runs.name}.${runKey(P, "many", runId)}`;
    const info = await jsm.streams.info(stream, { subjects_filter: subject });
    // Its two writes (running, success) are both there (nats-server 2.9 holds each interior delete in memory,
    // see layout.ts) …
    expect(info.state.subjects?.[subject]).toBe(2);
    // … and no record of this file's runs lost a revision from the middle of the stream.
    expect(info.state.num_deleted ?? 0).toBe(0);
  });

  it("only a terminal event carries a Nats-Msg-Id: the one event that may be published again", async () => {
    const { streams, subjects } = await import("../../services/nats/layout.js");
    const runId = await sleepAsync("many", RUNNING_EVENT_AFTER_MS + 200); // announced `running`
    await reaches("many", runId, "success");
    const jsm = await t.skiff.nats.nc.jetstreamManager();
    const last = async (status: string) => {
      const m = await jsm.streams.getMessage(streams.events.name, {
        last_by_subj: subjects.runEvent(P, "many", status),
      });
      expect(recordOfEvent(m.header)?.run_id).toBe(runId);
      return m.header.get("Nats-Msg-Id");
    };
    // nats-server holds every id of a stream's duplicate window in memory: none for events never repeated.
    expect(await last("running")).toBe("");
    expect(await last("success")).toBe(`${runId}.success.1`);
  });

  it("async run records stay in KV two days, delivery records RUN_RETENTION_MS; the run history deletes runs of that age", async () => {
    const { openRunHistory, publishRunEvent } = await import("../../services/runs/index.js");
    const { buckets, RUN_RETENTION_MS } = await import("../../services/nats/layout.js");
    const { v7 } = await import("uuid");
    const nc = t.skiff.nats.nc;
    const jsm = await nc.jetstreamManager();
    // A runner purges a record a minute after its run ended; the bucket's age is for those whose purge was lost.
    expect((await jsm.streams.info(`KV_${buckets.runs.name}`)).config.max_age).toBe(2 * 86_400_000 * 1_000_000);
    expect((await jsm.streams.info(`KV_${buckets.webhooks.name}`)).config.max_age).toBe(RUN_RETENTION_MS * 1_000_000);
    const now = Date.now();
    const old = v7({ msecs: now - RUN_RETENTION_MS - 60_000 });
    const recent = v7({ msecs: now - RUN_RETENTION_MS + 60_000 });
    for (const id of [old, recent]) {
      await publishRunEvent(nc, {
        run_id: id,
        project_id: P,
        app_name: "aged",
        path: "run",
        async: true,
        status: "success",
        queued_at: new Date().toISOString(),
        attempts: 1,
      });
    }
    // Listed through the run API of the running skiff, which projects the events into its own history.
    await vi.waitUntil(
      async () => (await t.management().listRuns({ projectId: P, appName: "aged" })).runs.length === 2,
      { timeout: 60_000 },
    );
    // A second history of the same events (in a folder of its own) prunes by the time in the run ids.
    const history = await openRunHistory({ nc, logger: silentLogger, databaseUrl: undefined, dataDir: tmp });
    try {
      await vi.waitUntil(async () => (await history.list(P, "aged", { pageSize: 10 })).runs.length === 2, {
        timeout: 60_000,
      });
      expect(await history.prune(now)).toBe(1);
      expect((await history.list(P, "aged", { pageSize: 10 })).runs.map((r) => r.run_id)).toEqual([recent]);
    } finally {
      await history.close();
    }
  });
});
