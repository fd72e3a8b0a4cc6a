// The run history with N runs (`npm run bench`: 1,000,000; `--quick`:
// 100,000). First the runs' events (each carrying its record) are published
// to SKIFF_EVENTS with no history following them; then a run history (the
// embedded SQLite, or the PostgreSQL of BENCH_DATABASE_URL) is opened in this
// process, with nothing else running, and timed while its one projector turns
// the events into rows: runs a second, and CPU per run (every thread of the
// process). Then a skiff process (`services/main.ts`, management role) is
// started on the same data folder: its start-up time and memory with N runs
// stored, and ListRuns over HTTP, p50 and p99, against a baseline measured in
// the same run (one KV get of a run record, the cheapest thing NATS answers).
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { connect } from "nats";
import { v7 } from "uuid";
import { ManagementService } from "../gen/skiff/management/v2/management_pb.js";
import { bearerAuth } from "../services/auth/bearer.js";
import { silentLogger } from "../services/config/logger.js";
import { coalesceWrites } from "../services/nats/coalesce.js";
import { publishRunEvent } from "../services/runs/events.js";
import { openRunHistory, FEED_STREAM } from "../services/runs/history/index.js";
import { RunStore, type RunRecord } from "../services/runs/store.js";
import { startNatsServer } from "../test/helpers/nats-server.js";
import { startSkiffProcess, type SkiffProcess } from "./skiff-process.js";
import { cpuSeconds, percentile, rssMb, wrk } from "./tools.js";

const SAMPLES = 1000;
const P = "p-dev";
const APP = "bench";
/** Runs written without waiting between acknowledgements. */
const WRITE_WINDOW = 2000;

/** Times `fn` SAMPLES times after a warm-up: p50 and p99, ms. */
async function sample(fn: () => Promise<unknown>): Promise<{ p50: number; p99: number }> {
  for (let i = 0; i < 50; i++) await fn(); // warm up
  const times: number[] = [];
  for (let i = 0; i < SAMPLES; i++) {
    const t0 = performance.now();
    await fn();
    times.push(performance.now() - t0);
  }
  return { p50: percentile(times, 0.5), p99: percentile(times, 0.99) };
}

const cpuMs = () => {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1000;
};

export interface ListingResult {
  runs: number;
  /** The first page of ListRuns over HTTP, median. */
  pageMs: number;
  /** The same, 99th percentile. */
  pageP99Ms: number;
  /** The first page over HTTP from wrk at one connection (the REST path), median and 99th percentile. */
  restPageMs: number;
  restPageP99Ms: number;
  /** The first page read from the history in-process (no HTTP), median and 99th percentile. */
  historyPageMs: number;
  historyPageP99Ms: number;
  /** One KV get of a run record, median: the baseline. */
  kvGetMs: number;
  /** How long a process took to start (serving requests) with that many runs stored. */
  startS: number;
  /** From the process's start to its first page of ListRuns with the newest run. */
  firstPageS: number;
  /** Resident memory of that process after the samples. */
  rssMb: number;
  /** Runs a second projected by one writer from events already in SKIFF_EVENTS, nothing else running. */
  projectedPerS: number;
  /** CPU (all threads of the projecting process) per run projected, µs. */
  projectCpuUs: number;
  /** nats-server's CPU per run projected (its delivery of the events to the projector), µs. */
  projectNatsCpuUs: number;
  /** Resident memory of the projecting process before and after the catch-up, MB. */
  projectRssMb: { before: number; after: number };
}

const managementOf = (s: SkiffProcess) =>
  createClient(
    ManagementService,
    createConnectTransport({ baseUrl: s.url, httpVersion: "1.1", interceptors: [bearerAuth(s.adminToken)] }),
  );

export async function benchRunListing(RUNS = Number(process.env.BENCH_RUNS ?? 100_000)): Promise<ListingResult> {
  const nats = await startNatsServer();
  const dataDir = await mkdtemp(path.join(tmpdir(), "skiff-bench-listing-"));
  const databaseUrl = process.env.BENCH_DATABASE_URL;
  const env: Record<string, string> = { SKIFF_SANDBOX: "off" };
  if (databaseUrl) env.SKIFF_DATABASE_URL = databaseUrl;
  const start = () => startSkiffProcess({ natsUrl: nats.url, dataDir, roles: "management", env });
  const nc = await connect({ servers: nats.url });
  // As skiff's own connection: the records of the events written together go in one message of the feed.
  coalesceWrites(nc);
  let skiff: SkiffProcess | undefined;
  try {
    // A first process provisions the streams and buckets, and is stopped: the events are published with no
    // history following them.
    skiff = await start();
    await skiff.stop();
    skiff = undefined;
    const store = await RunStore.open(nc);
    const statuses = ["success", "failure", "success", "cancelled"] as const;
    const t0 = performance.now();
    let last = "";
    for (let i = 0; i < RUNS; i += WRITE_WINDOW) {
      const batch: Promise<unknown>[] = [];
      for (let j = i; j < Math.min(RUNS, i + WRITE_WINDOW); j++) {
        const now = new Date().toISOString();
        const r: RunRecord = {
          run_id: (last = v7()),
          project_id: P,
          app_name: APP,
          path: "run",
          async: j % 2 === 0,
          status: statuses[j % 4],
          queued_at: now,
          started_at: now,
          finished_at: now,
          attempts: 1,
          run_time_ms: 3,
          status_code: 200,
          runner: "bench-runner",
        };
        batch.push(publishRunEvent(nc, r));
        if (j === RUNS - 1) batch.push(store.create(r)); // the baseline's record
      }
      await Promise.all(batch);
    }
    const writeS = (performance.now() - t0) / 1000;

    // The catch-up: one projector, nothing else running but nats-server.
    const lastSeq = (await (await nc.jetstreamManager()).streams.info(FEED_STREAM)).state.last_seq;
    const rssBefore = await rssMb(process.pid);
    const cpu0 = cpuMs();
    const natsCpu0 = await cpuSeconds(nats.pid);
    const p0 = performance.now();
    const history = await openRunHistory({ nc, logger: silentLogger, databaseUrl, dataDir });
    let rssPeak = rssBefore;
    let historyPage: { p50: number; p99: number };
    let projectedPerS: number;
    let projectCpuUs: number;
    let projectNatsCpuUs: number;
    try {
      while ((await history.position()) < lastSeq) {
        await new Promise((r) => setTimeout(r, 50));
        rssPeak = Math.max(rssPeak, await rssMb(process.pid));
      }
      const projectS = (performance.now() - p0) / 1000;
      const projectCpuMs = cpuMs() - cpu0;
      projectedPerS = Math.round(RUNS / projectS);
      projectCpuUs = (projectCpuMs * 1000) / RUNS;
      projectNatsCpuUs = (((await cpuSeconds(nats.pid)) - natsCpu0) * 1e6) / RUNS;
      // Said at once: what follows takes minutes at 1M runs.
      process.stderr.write(`(the catch-up: ${projectedPerS} runs/s)\n`);
      historyPage = await sample(() => history.list(P, APP, { pageSize: 50 }));
    } finally {
      await history.close();
    }
    const rssAfter = await rssMb(process.pid);

    // A skiff process on the same data folder: how long it takes to start with the runs stored.
    const startedAt = performance.now();
    skiff = await start();
    const startS = (performance.now() - startedAt) / 1000;
    const second = managementOf(skiff);
    const newest = async (c: ReturnType<typeof managementOf>) =>
      (await c.listRuns({ projectId: P, appName: APP, pageSize: 1 })).runs[0]?.runId === last;
    for (;;) {
      try {
        if (await newest(second)) break;
      } catch {
        // the history is still opening
      }
      await new Promise((r) => setTimeout(r, 20));
    }
    const firstPageS = (performance.now() - startedAt) / 1000;
    const first = await second.listRuns({ projectId: P, appName: APP });
    if (first.runs.length !== 50 || first.runs[0].runId !== last)
      throw new Error(`the history is not complete: first page has ${first.runs.length} runs`);

    const kvGet = await sample(() => store.get(P, APP, last));
    const page = await sample(() => second.listRuns({ projectId: P, appName: APP }));
    const filtered = await sample(() =>
      second.listRuns({ projectId: P, appName: APP, status: "cancelled", asyncOnly: false, pageSize: 500 }),
    );
    const deep = await sample(() =>
      second.listRuns({ projectId: P, appName: APP, pageToken: first.nextPageToken, pageSize: 500 }),
    );
    // The same first page from a client that costs next to nothing (wrk, one connection, the REST path):
    // skiff's answer alone, without the Connect client's own work on the page.
    const rest = await wrk(
      {
        url: `${skiff.url}/v2/projects/${P}/apps/${APP}/runs`,
        method: "GET",
        headers: { Authorization: `Bearer ${skiff.adminToken}` },
        status: 200,
        connections: 1,
        seconds: 3,
      },
      dataDir,
    );
    if (rest.errors > 0 || rest.requests === 0) throw new Error(`ListRuns over REST failed: ${JSON.stringify(rest)}`);
    const rss = await rssMb(skiff.pid);
    const kind = databaseUrl ? "PostgreSQL" : "SQLite";
    const ms = (x: { p50: number; p99: number }) =>
      `p50 ${x.p50.toFixed(3)} ms (${(x.p50 / kvGet.p50).toFixed(2)} x baseline), p99 ${x.p99.toFixed(3)} ms`;
    console.log(`run history (${kind}): ${RUNS} runs published in ${writeS.toFixed(1)} s, nothing following them`);
    console.log(
      `  projected by one writer, nothing else running: ${projectedPerS} runs/s, ${projectCpuUs.toFixed(1)} µs CPU a run ` +
        `(all threads; nats-server ${projectNatsCpuUs.toFixed(1)} µs), RSS ${rssBefore} MB before, ${rssPeak} MB at most, ${rssAfter} MB after`,
    );
    console.log(`  first page (50) read in-process:            ${ms(historyPage)}`);
    console.log(
      `  a process with them stored: serving after ${startS.toFixed(2)} s, first page after ${firstPageS.toFixed(2)} s, RSS ${rss} MB`,
    );
    console.log(`  baseline, one KV get of a run record:       p50 ${kvGet.p50.toFixed(3)} ms`);
    console.log(`  ListRuns first page (50), over HTTP:         ${ms(page)}`);
    console.log(
      `  the same from wrk (REST, one connection):   ${ms({ p50: rest.p50_ms, p99: rest.p99_ms })}, ${rest.rps} pages/s`,
    );
    console.log(`  ListRuns status=cancelled, 500 a page:       ${ms(filtered)}`);
    console.log(`  ListRuns second page, 500 a page:            ${ms(deep)}`);
    return {
      runs: RUNS,
      pageMs: page.p50,
      pageP99Ms: page.p99,
      restPageMs: rest.p50_ms,
      restPageP99Ms: rest.p99_ms,
      historyPageMs: historyPage.p50,
      historyPageP99Ms: historyPage.p99,
      kvGetMs: kvGet.p50,
      startS,
      firstPageS,
      rssMb: rss,
      projectedPerS,
      projectCpuUs,
      projectNatsCpuUs,
      projectRssMb: { before: rssBefore, after: rssAfter },
    };
  } finally {
    await skiff?.stop();
    await nc.close();
    await nats.stop();
    await rm(dataDir, { recursive: true, force: true });
  }
}

if (import.meta.url === `file://${process.argv[1]}`) await benchRunListing();
