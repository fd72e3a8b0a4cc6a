// Listing runs with 100,000 stored: the first page of ListRuns, served from
// the in-memory run index, against a baseline measured in the same run (one
// KV get of a run record, the cheapest thing NATS answers). Prints medians
// and ratios; a ratio, not a time, is the result.
import { performance } from "node:perf_hooks";
import { v7 } from "uuid";
import { RunStore, type RunRecord } from "../services/runs/store.js";
import { startNatsServer } from "../test/helpers/nats-server.js";
import { startTestSkiff } from "../test/helpers/skiff.js";

const SAMPLES = 200;
const P = "p-dev";
const APP = "bench";

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
  /** How long a process took to start with that many runs stored. */
  startS: number;
}

export async function benchRunListing(RUNS = Number(process.env.BENCH_RUNS ?? 100_000)): Promise<ListingResult> {
  const nats = await startNatsServer();
  let t: Awaited<ReturnType<typeof startTestSkiff>> | undefined;
  try {
    // A first skiff provisions the buckets; runs are written, then a second one loads them at start.
    t = await startTestSkiff({ nats, env: { SKIFF_ROLES: "management" } });
    const runs = await RunStore.open(t.skiff.nats.nc);
    const statuses = ["success", "failure", "success", "cancelled"] as const;
    const t0 = performance.now();
    let last = "";
    for (let i = 0; i < RUNS; i += 1000) {
      const batch: Promise<unknown>[] = [];
      for (let j = i; j < Math.min(RUNS, i + 1000); j++) {
        const now = new Date().toISOString();
        const r: RunRecord = {
          run_id: (last = v7()),
          project_id: P,
          app_name: APP,
          path: "run",
          async: j % 2 === 0,
          status: statuses[j % 4],
          queued_at: now,
          finished_at: now,
          attempts: 1,
          run_time_ms: 3,
          status_code: 200,
        };
        batch.push(runs.put(r));
      }
      await Promise.all(batch);
    }
    const writeS = (performance.now() - t0) / 1000;
    await t.close();
    const loadStart = performance.now();
    t = await startTestSkiff({ nats, env: { SKIFF_ROLES: "management" } });
    const loadS = (performance.now() - loadStart) / 1000;
    const client = t.management();
    const store = await RunStore.open(t.skiff.nats.nc);
    const first = await client.listRuns({ projectId: P, appName: APP });
    if (first.runs.length !== 50 || first.runs[0].runId !== last)
      throw new Error(`the index is not loaded: first page has ${first.runs.length} runs`);

    const kvGet = await sample(() => store.get(P, APP, last));
    const page = await sample(() => client.listRuns({ projectId: P, appName: APP }));
    const filtered = await sample(() =>
      client.listRuns({ projectId: P, appName: APP, status: "cancelled", asyncOnly: false, pageSize: 500 }),
    );
    const deep = await sample(() =>
      client.listRuns({ projectId: P, appName: APP, pageToken: first.nextPageToken, pageSize: 500 }),
    );
    console.log(
      `run listing: ${RUNS} runs stored in ${writeS.toFixed(1)} s; a process loads them at start in ${loadS.toFixed(1)} s`,
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
    return { runs: RUNS, pageMs: page, kvGetMs: kvGet, startS: loadS };
  } finally {
    await t?.close();
    await nats.stop();
  }
}

if (import.meta.url === `file://${process.argv[1]}`) await benchRunListing();
