// Per-tenant quotas on what tenants share, attacked as a tenant would: one
// project's replicas across its apps on a runner (SKIFF_PROJECT_MAX_REPLICAS)
// and their memory (SKIFF_PROJECT_MEMORY_MB); a replica flooding its log
// (SKIFF_REPLICA_LOG_LINES_PER_SECOND); a Cortex function answering hundreds
// of megabytes (SKIFF_MAX_RESULT_BYTES); async results stored without bound
// (SKIFF_MAX_ASYNC_RESULT_BYTES). Real replicas, a real nats-server.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import type { Subscription } from "nats";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { parseAppConfig } from "../../services/apps/app-config.js";
import { silentLogger } from "../../services/config/logger.js";
import { objectStores } from "../../services/nats/layout.js";
import { decodeLogLine, type LogLineRecord } from "../../services/apps/log-lines.js";
import { Runner, type RunnerOptions } from "../../services/runner/runner.js";
import { DEFAULT_SANDBOX_LIMITS } from "../../services/runner/sandbox.js";
import { Overloaded, StartFailed } from "../../services/runs/errors.js";
import type { InvokeRequest } from "../../services/runs/invoke.js";
import { skiffToml, type Scaling } from "../helpers/apps.js";
import { cortexApp, deploy, P, post } from "../helpers/run-apps.js";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";

const BEHAVE = path.resolve(import.meta.dirname, "../fixtures/apps/behave");
let tmp: string;

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-quotas-"));
});
afterAll(() => rm(tmp, { recursive: true, force: true }));

describe("a project's share of a runner", () => {
  let runner: Runner | undefined;
  const start = (opts: Partial<RunnerOptions>) =>
    (runner = new Runner({
      workDir: path.join(tmp, "work"),
      logger: silentLogger,
      startTimeoutMs: 10_000,
      killGraceMs: 500,
      ...opts,
    }));
  afterAll(() => runner?.close());

  const deployBehave = (r: Runner, projectId: string, appName: string, scaling: Scaling, version = 1) =>
    r.deploy({
      projectId,
      appName,
      version,
      dir: BEHAVE,
      config: parseAppConfig(
        skiffToml({ name: appName, runtime: { kind: "custom", command: ["node", "server.mjs"] }, scaling }),
      ),
    });
  let seq = 0;
  const sleep = (ms: number, more: Partial<InvokeRequest> = {}): InvokeRequest => ({
    runId: `run-${++seq}`,
    method: "GET",
    path: "/sleep",
    query: `ms=${ms}`,
    headers: {},
    body: new Uint8Array(),
    ...more,
  });

  it("SKIFF_PROJECT_MAX_REPLICAS: a replica of another app of the project is not started; its call gets the 429 of a full app, naming the setting, until one of the project's replicas stops", async () => {
    await runner?.close();
    const r = start({ projectMaxReplicas: 2, queueWaitMs: 5_000 });
    await deployBehave(r, "p", "a", { max_replicas: 3, replica_concurrency: 1 });
    await deployBehave(r, "p", "b", { max_replicas: 2 });
    await deployBehave(r, "q", "c", { max_replicas: 2 });
    // App a holds two replicas, all its project may have here.
    const hold = new AbortController();
    const held = [1, 2].map(() => r.invoke("p", "a", sleep(600_000, { signal: hold.signal })).catch((e: unknown) => e));
    await vi.waitUntil(() => r.replicas("p", "a").filter((x) => x.state === "ready" && x.inFlight === 1).length === 2, {
      timeout: 60_000,
    });

    const refused = await r.invoke("p", "b", sleep(0)).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(Overloaded);
    expect((refused as Error).message).toMatch(
      /^no replica of app p\/b was free within 5000 ms and no other could start: project p has 2 replicas on this runner, the most it may have \(SKIFF_PROJECT_MAX_REPLICAS\)$/,
    );
    expect(r.replicas("p", "b")).toEqual([]);
    // App a's own third replica (under its max_replicas of 3) is not started either.
    const third = await r.invoke("p", "a", sleep(0)).catch((e: unknown) => e);
    expect((third as Error).message).toMatch(/SKIFF_PROJECT_MAX_REPLICAS/);
    expect(r.replicas("p", "a")).toHaveLength(2);
    // Another project is not held back.
    expect((await r.invoke("q", "c", sleep(0))).status).toBe(200);

    // A call that waits gets a replica once one of the project's stops.
    const waiting = r.invoke("p", "b", sleep(0));
    hold.abort();
    await Promise.all(held);
    await r.remove("p", "a");
    expect((await waiting).status).toBe(200);
  });

  it("SKIFF_PROJECT_MEMORY_MB: replicas × SKIFF_REPLICA_MEMORY_MB; a deploy whose min_replicas would pass it fails naming it, a new version of a running app does not count the one it replaces", async () => {
    await runner?.close();
    const replicaMb = DEFAULT_SANDBOX_LIMITS.memoryMb; // a Runner given no sandbox has the default limits
    const r = start({ projectMemoryMb: 2 * replicaMb, queueWaitMs: 2_000 });
    await deployBehave(r, "p", "a", { min_replicas: 2, max_replicas: 3 });
    expect(r.replicas("p", "a").map((x) => x.state)).toEqual(["ready", "ready"]);

    const failed = await deployBehave(r, "p", "b", { min_replicas: 1 }).catch((e: unknown) => e);
    expect(failed).toBeInstanceOf(StartFailed);
    expect((failed as Error).message).toBe(
      `a replica of app p/b cannot start: project p has 2 replicas of ${replicaMb} MiB (SKIFF_REPLICA_MEMORY_MB) on this runner; one more would pass its ${2 * replicaMb} MiB (SKIFF_PROJECT_MEMORY_MB)`,
    );
    expect(r.version("p", "b")).toBeUndefined();
    // Another project has its own share.
    await deployBehave(r, "q", "c", { min_replicas: 2 });

    await deployBehave(r, "p", "a", { min_replicas: 2, max_replicas: 3 }, 2);
    expect(r.version("p", "a")).toBe(2);
  });
});

describe("log floods and large results", () => {
  let t: TestSkiff;
  const LOG_RATE = 20;
  const MAX_RESULT = 200_000;
  const MAX_ASYNC_RESULT = 100_000;
  const v4 = (app: string, rest: string) => `${t.url}/v4/${P}/${app}/${rest}`;

  beforeAll(async () => {
    t = await startTestSkiff({
      env: {
        SKIFF_REPLICA_LOG_LINES_PER_SECOND: String(LOG_RATE),
        SKIFF_MAX_RESULT_BYTES: String(MAX_RESULT),
        SKIFF_MAX_ASYNC_RESULT_BYTES: String(MAX_ASYNC_RESULT),
      },
    });
    const floods = cortexApp("flood", { max_replicas: 1 });
    floods["index.mjs"] +=
      "\nexport function flood({ n }) { for (let i = 0; i < n; i++) console.log(`line ${i}`); return n; }\n";
    await deploy(tmp, t.management(), floods);
    await deploy(tmp, t.management(), cortexApp("results", { max_replicas: 1, replica_concurrency: 4 }));
    await deploy(tmp, t.management(), {
      "skiff.toml": skiffToml({
        name: "answers",
        runtime: { kind: "custom", command: ["node", "server.mjs"] },
        scaling: { max_replicas: 1, replica_concurrency: 4 },
      }),
      // n bytes, chunked: no Content-Length to refuse it by.
      "server.mjs": [
        'import http from "node:http";',
        "http.createServer((req, res) => {",
        '  const url = new URL(req.url, "http://app");',
        '  if (url.pathname === "/health") return res.end("ok");',
        '  const n = Number(url.searchParams.get("n"));',
        '  res.writeHead(200, { "content-type": "application/octet-stream" });',
        "  for (let i = 0; i < n; i += 65536) res.write(Buffer.alloc(Math.min(65536, n - i), 120));",
        "  res.end();",
        "}).listen(Number(process.env.PORT));",
      ].join("\n"),
    });
    await vi.waitUntil(() => ["flood", "results", "answers"].every((app) => t.skiff.runner!.version(P, app) === 1), {
      timeout: 60_000,
    });
  }, 60_000);
  afterAll(() => t?.close());

  const getRun = async (app: string, runId: string) =>
    (await t.management().getRun({ projectId: P, appName: app, runId })).run!;
  const ended = (app: string, runId: string) =>
    vi.waitUntil(
      async () => {
        const r = await getRun(app, runId);
        return r.status === "success" || r.status === "failure" ? r : undefined;
      },
      { timeout: 60_000, interval: 250 },
    );
  const stored = async (runId: string) =>
    (await (await t.skiff.nats.nc.jetstream().views.os(objectStores.results.name)).info(runId)) !== null;

  it("SKIFF_REPLICA_LOG_LINES_PER_SECOND: lines past the rate are dropped, said in one line a second and counted in /metrics", async () => {
    const lines: LogLineRecord[] = [];
    const sub: Subscription = t.skiff.nats.nc.subscribe(`skiff.logs.${P}.flood`, {
      callback: (_err, msg) => {
        const line = decodeLogLine(msg.data);
        if (line) lines.push(line);
      },
    });
    const N = 5000;
    const REPORT = /^\[skiff\] (\d+) lines dropped \(SKIFF_REPLICA_LOG_LINES_PER_SECOND\)$/;
    const dropped = () => lines.reduce((sum, l) => sum + Number(REPORT.exec(l.text)?.[1] ?? 0), 0);
    const kept = () => lines.filter((l) => /^line \d+$/.test(l.text)).length;
    try {
      const res = await post(v4("flood", "flood"), t.devToken, JSON.stringify({ n: N }));
      expect(res.status).toBe(200);
      // Every line is either published or counted in a report line.
      await vi.waitUntil(() => kept() + dropped() === N, { timeout: 60_000 });
    } finally {
      sub.unsubscribe();
    }
    const reports = lines.filter((l) => REPORT.test(l.text));
    expect(reports.length).toBeGreaterThan(0);
    // Each report follows a second in which at most LOG_RATE lines went out.
    expect(kept()).toBeLessThanOrEqual(LOG_RATE * (reports.length + 1));
    expect(reports.every((l) => l.stream === "stderr")).toBe(true);

    const res = await fetch(`${t.url}/metrics`, { headers: { authorization: `Bearer ${t.adminToken}` } });
    const metric = (await res.text())
      .split("\n")
      .find((l) => l.startsWith("skiff_app_log_lines_dropped_total{") && l.includes(`app="flood"`));
    expect(metric).toBe(`skiff_app_log_lines_dropped_total{project="${P}",app="flood"} ${dropped()}`);
  });

  it("SKIFF_MAX_RESULT_BYTES: a larger Cortex result is not read; the run fails with 502 result_too_large and the replica goes on", async () => {
    const under = await post(v4("results", "big"), t.devToken, JSON.stringify({ n: MAX_RESULT - 100 }));
    expect(under.status).toBe(200);
    expect(under.json.result).toHaveLength(MAX_RESULT - 100);
    const replicas = t.skiff.runner!.replicas(P, "results").map((r) => r.replicaId);

    for (const n of [MAX_RESULT, 50 * 1024 * 1024]) {
      const res = await post(v4("results", "big"), t.devToken, JSON.stringify({ n }));
      expect(res.status).toBe(502);
      expect(res.json).toEqual({
        run_id: res.headers.get("x-request-id"),
        error: {
          type: "result_too_large",
          message: `the result of function big is larger than ${MAX_RESULT} bytes, the most skiff takes (SKIFF_MAX_RESULT_BYTES)`,
        },
      });
    }
    // The same replica answers: the cut answer was no crash.
    expect((await post(v4("results", "add"), t.devToken, '{"a":1,"b":2}')).json.result).toBe(3);
    expect(t.skiff.runner!.replicas(P, "results").map((r) => r.replicaId)).toEqual(replicas);
  });

  it("SKIFF_MAX_ASYNC_RESULT_BYTES: a larger async result is not stored; the run ends failure with result_too_large naming the setting", async () => {
    const async = async (app: string, rest: string, body = "{}") =>
      (await post(`${v4(app, rest)}${rest.includes("?") ? "&" : "?"}async=true`, t.devToken, body)).json
        .run_id as string;

    const fits = await async("results", "big", JSON.stringify({ n: 50_000 }));
    expect((await ended("results", fits)).status).toBe("success");
    expect(await stored(fits)).toBe(true); // past the inline size: the object store holds it

    // A Cortex result under SKIFF_MAX_RESULT_BYTES but over this limit, one whose envelope passes it, and a
    // Custom app's chunked answer.
    const cases: [string, string, string][] = [
      ["results", "big", JSON.stringify({ n: 150_000 })],
      ["results", "big", JSON.stringify({ n: MAX_ASYNC_RESULT - 10 })],
      ["answers", "data?n=3000000", "{}"],
    ];
    for (const [app, rest, body] of cases) {
      const runId = await async(app, rest, body);
      const run = await ended(app, runId);
      expect(run.status).toBe("failure");
      expect(run.statusCode).toBe(502);
      expect(run.error?.type).toBe("result_too_large");
      expect(run.error?.message).toMatch(/SKIFF_MAX_ASYNC_RESULT_BYTES/);
      expect(await stored(runId)).toBe(false);
    }
    // Sync answers of a Custom app stream to their caller: this limit is not theirs.
    const res = await fetch(v4("answers", "data?n=3000000"), {
      method: "POST",
      headers: { authorization: `Bearer ${t.devToken}` },
    });
    expect(res.status).toBe(200);
    expect((await res.arrayBuffer()).byteLength).toBe(3_000_000);
  });
});
