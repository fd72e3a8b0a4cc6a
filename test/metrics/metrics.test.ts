// GET /metrics: Prometheus text for an admin token or SKIFF_METRICS_TOKEN,
// counting requests by route, runs by app, status and mode, webhook attempts,
// queue depth, replicas, NATS reconnects and the process itself.
import http from "node:http";
import type { AddressInfo } from "node:net";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { cortexApp, deploy, P, post } from "../helpers/run-apps.js";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";

const METRICS_TOKEN = "metrics-token-0123456789abcdefghijklmnop";
let t: TestSkiff;
let tmp: string;

async function scrape(token: string | undefined): Promise<{ status: number; text: string; type: string | null }> {
  const res = await fetch(`${t.url}/metrics`, { headers: token ? { authorization: `Bearer ${token}` } : {} });
  return { status: res.status, text: await res.text(), type: res.headers.get("content-type") };
}

/** The value of one sample, by metric name and labels (all given labels must match). */
function sample(text: string, name: string, labels: Record<string, string> = {}): number | undefined {
  for (const line of text.split("\n")) {
    if (!line.startsWith(`${name}{`) && !line.startsWith(`${name} `)) continue;
    const wanted = Object.entries(labels).every(([k, v]) => line.includes(`${k}="${v}"`));
    if (wanted) return Number(line.slice(line.lastIndexOf(" ") + 1));
  }
  return undefined;
}

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-metrics-"));
  t = await startTestSkiff({ env: { SKIFF_METRICS_TOKEN: METRICS_TOKEN } });
  await deploy(tmp, t.management(), cortexApp("measured", { min_replicas: 1, max_replicas: 2 }));
  await vi.waitUntil(() => t.skiff.runner!.version(P, "measured") === 1, { timeout: 60_000 });
}, 60_000);
afterAll(async () => {
  await t?.close();
  await rm(tmp, { recursive: true, force: true });
});

describe("metrics", () => {
  it("answers only an admin token or SKIFF_METRICS_TOKEN; a project's token and none get 401", async () => {
    expect((await scrape(undefined)).status).toBe(401);
    expect((await scrape(t.devToken)).status).toBe(401);
    expect((await scrape("x".repeat(40))).status).toBe(401);
    const admin = await scrape(t.adminToken);
    expect(admin.status).toBe(200);
    expect(admin.type).toMatch(/^text\/plain; version=0\.0\.4/);
    expect((await scrape(METRICS_TOKEN)).status).toBe(200);
    expect(sample(admin.text, "skiff_process_resident_memory_bytes")).toBeGreaterThan(0);
  });

  it("counts requests by route and code, and runs by app, status and mode with their durations", async () => {
    const ok = await post(`${t.url}/v4/${P}/measured/add`, t.devToken, JSON.stringify({ a: 1, b: 2 }));
    expect(ok.status).toBe(200);
    const failed = await post(`${t.url}/v4/${P}/measured/fail`, t.devToken, "{}");
    expect(failed.status).toBe(500);
    const accepted = await post(`${t.url}/v4/${P}/measured/add?async=true`, t.devToken, JSON.stringify({ a: 1, b: 1 }));
    expect(accepted.status).toBe(202);
    expect((await post(`${t.url}/v4/${P}/nope/add`, t.devToken, "{}")).status).toBe(404);

    const text = await vi.waitUntil(
      async () => {
        const { text } = await scrape(METRICS_TOKEN);
        return (sample(text, "skiff_runs_total", { app: "measured", mode: "async" }) ?? 0) >= 1 ? text : undefined;
      },
      { timeout: 60_000 },
    );
    const run = "POST /v4/{project_id}/{app_name}/{path=**}";
    expect(sample(text, "skiff_http_requests_total", { route: run, code: "200" })).toBeGreaterThanOrEqual(1);
    expect(sample(text, "skiff_http_requests_total", { route: run, code: "500" })).toBeGreaterThanOrEqual(1);
    expect(sample(text, "skiff_http_requests_total", { route: run, code: "202" })).toBeGreaterThanOrEqual(1);
    expect(sample(text, "skiff_http_requests_total", { route: run, code: "404" })).toBeGreaterThanOrEqual(1);
    // The raw path never becomes a label.
    expect(text).not.toContain("/v4/p-dev/measured");
    expect(sample(text, "skiff_runs_total", { app: "measured", status: "success", mode: "sync" })).toBe(1);
    expect(sample(text, "skiff_runs_total", { app: "measured", status: "failure", mode: "sync" })).toBe(1);
    expect(sample(text, "skiff_runs_total", { app: "measured", status: "success", mode: "async" })).toBe(1);
    expect(sample(text, "skiff_run_duration_seconds_count", { app: "measured", mode: "sync" })).toBe(2);
    expect(sample(text, "skiff_replicas", { app: "measured", state: "ready" })).toBeGreaterThanOrEqual(1);
  });

  it("shows an app's queue depth while its async runs wait or run, and 0 once its queue is empty", async () => {
    const depth = async () =>
      sample((await scrape(METRICS_TOKEN)).text, "skiff_queue_depth", { project: P, app: "measured" });
    for (let i = 0; i < 3; i++) {
      const res = await post(`${t.url}/v4/${P}/measured/sleep?async=true`, t.devToken, JSON.stringify({ ms: 1000 }));
      expect(res.status).toBe(202);
    }
    expect(await depth()).toBeGreaterThanOrEqual(1);
    // An emptied queue still has its series, reading 0, so a graph or an alert sees it drain.
    await vi.waitUntil(async () => (await depth()) !== undefined && (await depth()) === 0, { timeout: 60_000 });
  }, 30_000);

  it("counts webhook attempts by outcome", async () => {
    const receiver = http.createServer((req, res) => {
      req.resume();
      req.on("end", () => res.end("ok"));
    });
    await new Promise<void>((r) => receiver.listen(0, "127.0.0.1", r));
    try {
      const hook = encodeURIComponent(`http://127.0.0.1:${(receiver.address() as AddressInfo).port}/hook`);
      const res = await post(`${t.url}/v4/${P}/measured/add?webhookEndpoint=${hook}`, t.devToken, '{"a":1,"b":1}');
      expect(res.status).toBe(200);
      await vi.waitUntil(
        async () =>
          (sample((await scrape(METRICS_TOKEN)).text, "skiff_webhook_attempts_total", { outcome: "delivered" }) ?? 0) >=
          1,
        { timeout: 60_000 },
      );
    } finally {
      receiver.close();
    }
  });

  it("counts NATS reconnects", async () => {
    const before = sample((await scrape(METRICS_TOKEN)).text, "skiff_nats_reconnects_total") ?? 0;
    await t.nats.restart();
    await vi.waitUntil(
      async () => (sample((await scrape(METRICS_TOKEN)).text, "skiff_nats_reconnects_total") ?? 0) > before,
      { timeout: 60_000 },
    );
  });
});
