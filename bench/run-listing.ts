// Listing runs with N stored (`npm run bench`: 1,000,000; `--quick`:
// 100,000), through the real path: run events (each carrying its record)
// published to SKIFF_EVENTS, a skiff process (`services/main.ts`, management
// role) projecting them into
// its run history (embedded PGlite, or the PostgreSQL of BENCH_DATABASE_URL),
// and ListRuns over HTTP. Then that process is stopped and a second one
// started on the same data folder: its start-up time and memory with N runs
// stored, and the first page of ListRuns against a baseline measured in the
// same run (one KV get of a run record, the cheapest thing NATS answers).
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
import { publishRunEvent } from "../services/runs/events.js";
import { RunStore, type RunRecord } from "../services/runs/store.js";
import { startNatsServer } from "../test/helpers/nats-server.js";
import { startSkiffProcess, type SkiffProcess } from "./skiff-process.js";
import { rssMb } from "./tools.js";

const SAMPLES = 200;
const P = "p-dev";
const APP = "bench";
/** Runs written without waiting between acknowledgements. */
const WRITE_WINDOW = 2000;

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

async function sample(fn: () => Promise<unknown>): Promise<number> {
  for (let i = 0; i < 20; i++) await fn(); // warm up
  const times: number[] = [];
  for (let i = 0; i < SAMPLES; i++) {
    const t0 = performance.now();
    await fn();
    times.push(performance.now() - t0);
  }
  return median(times);
}

export interface ListingResult {
  runs: number;
  /** The first page of ListRuns over HTTP, median. */
  pageMs: number;
  /** One KV get of a run record, median: the baseline. */
  kvGetMs: number;
  /** How long a process took to start (serving requests) with that many runs stored. */
  startS: number;
  /** From the process's start to its first page of ListRuns with the newest run. */
  firstPageS: number;
  /** Resident memory of that process after the samples. */
  rssMb: number;
  /** How long publishing the runs' events and projecting them took, in runs a second. */
  projectedPerS: number;
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
  let skiff: SkiffProcess | undefined;
  try {
    // A first process provisions the buckets and projects the runs as they are written.
    skiff = await start();
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
    const client = managementOf(skiff);
    const newest = async (c: ReturnType<typeof managementOf>) =>
      (await c.listRuns({ projectId: P, appName: APP, pageSize: 1 })).runs[0]?.runId === last;
    // The projection keeps stream order: once the newest run is listed, every run is.
    while (!(await newest(client))) await new Promise((r) => setTimeout(r, 100));
    const projectedS = (performance.now() - t0) / 1000;
    await skiff.stop();
    skiff = undefined;

    // A second process on the same data folder: how long it takes to start with the runs stored.
    const startedAt = performance.now();
    skiff = await start();
    const startS = (performance.now() - startedAt) / 1000;
    const second = managementOf(skiff);
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
    const rss = await rssMb(skiff.pid);
    const kind = databaseUrl ? "PostgreSQL" : "PGlite";
    console.log(
      `run listing (${kind}): ${RUNS} runs written in ${writeS.toFixed(1)} s, projected by ${projectedS.toFixed(1)} s ` +
        `(${Math.round(RUNS / projectedS)} runs/s)`,
    );
    console.log(
      `  a process with them stored: serving after ${startS.toFixed(2)} s, first page after ${firstPageS.toFixed(2)} s, RSS ${rss} MB`,
    );
    console.log(`  baseline, one KV get of a run record:      ${kvGet.toFixed(3)} ms`);
    console.log(
      `  ListRuns first page (50), over HTTP:        ${page.toFixed(3)} ms  = ${(page / kvGet).toFixed(2)} x baseline`,
    );
    console.log(
      `  ListRuns status=cancelled, 500 a page:      ${filtered.toFixed(3)} ms  = ${(filtered / kvGet).toFixed(2)} x baseline`,
    );
    console.log(
      `  ListRuns second page, 500 a page:           ${deep.toFixed(3)} ms  = ${(deep / kvGet).toFixed(2)} x baseline`,
    );
    return {
      runs: RUNS,
      pageMs: page,
      kvGetMs: kvGet,
      startS,
      firstPageS,
      rssMb: rss,
      projectedPerS: Math.round(RUNS / projectedS),
    };
  } finally {
    await skiff?.stop();
    await nc.close();
    await nats.stop();
    await rm(dataDir, { recursive: true, force: true });
  }
}

if (import.meta.url === `file://${process.argv[1]}`) await benchRunListing();
