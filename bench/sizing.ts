// `npx tsx bench/sizing.ts`: bytes each kind of run leaves in each store, for
// the sizing table of docs/deploy.md. One skiff process on a NATS server of
// its own; SIZING_RUNS (default 2000) calls of each kind, one kind after the
// other: a sync call, an async run, a sync call with a webhook (delivered to
// a local receiver), an async run whose result (100 KB) is too large for its
// record. After each kind has settled (queue empty, runs ended, webhooks
// delivered, the run history caught up and measured), every store's bytes
// are read again: from NATS for the streams, buckets and object stores, from
// /metrics for the run history. The difference over the runs is the bytes a
// run takes there. KV `skiff-runs` and `skiff-webhooks` keep a run's entries
// only until a minute after it ended (SKIFF_FINAL_RECORD_KEEP_MS): read at
// once, they show what a run costs while it is recent. Writes
// bench/results/sizing.json.
import http from "node:http";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { connect } from "nats";
import { startNatsServer } from "../test/helpers/nats-server.js";
import { deployFolder } from "./deploy.js";
import { writeResults } from "./pipeline.js";
import { startSkiffProcess, waitRunHistory } from "./skiff-process.js";
import { round } from "./tools.js";

const RUNS = Number(process.env.SIZING_RUNS ?? 2000);
const CONCURRENCY = 16;
const LARGE_RESULT_BYTES = 100_000;
const P = "p-dev";

const tmp = await mkdtemp(path.join(tmpdir(), "skiff-sizing-"));
const nats = await startNatsServer();
const skiff = await startSkiffProcess({
  natsUrl: nats.url,
  dataDir: path.join(tmp, "data"),
  env: { SKIFF_MAX_QUEUED_RUNS: "10000000" },
});
const nc = await connect({ servers: nats.url });
let delivered = 0;
const receiver = http.createServer((req, res) => {
  req.resume();
  req.on("end", () => {
    delivered++;
    res.end("ok");
  });
});

/** Every store's bytes: streams by name (KV_ and OBJ_ taken off), and the run history. */
async function stores(): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  const jsm = await nc.jetstreamManager();
  for await (const si of jsm.streams.list()) out[si.config.name.replace(/^(KV|OBJ)_/, "")] = si.state.bytes;
  out["run-history"] = metric(await metricsText(), "skiff_store_bytes", 'store="run-history"');
  return out;
}

async function metricsText(): Promise<string> {
  const res = await fetch(`${skiff.url}/metrics`, { headers: { authorization: `Bearer ${skiff.adminToken}` } });
  return res.text();
}

function metric(text: string, name: string, ...labels: string[]): number {
  let sum = 0;
  for (const line of text.split("\n"))
    if (line.startsWith(`${name}{`) && labels.every((l) => line.includes(l)))
      sum += Number(line.slice(line.lastIndexOf(" ") + 1));
  return sum;
}

/** `n` calls, CONCURRENCY at a time; throws on an answer other than `status`. */
async function calls(n: number, url: string, body: string, status: number): Promise<void> {
  let next = 0;
  const worker = async () => {
    while (next < n) {
      next++;
      const res = await fetch(url, {
        method: "POST",
        headers: { authorization: `Bearer ${skiff.devToken}`, "content-type": "application/json" },
        body,
      });
      const text = await res.text();
      if (res.status !== status) throw new Error(`${url} answered ${res.status}: ${text.slice(0, 300)}`);
    }
  };
  await Promise.all(Array.from({ length: CONCURRENCY }, worker));
}

async function until(what: string, ok: () => Promise<boolean>, timeoutMs = 300_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await ok())) {
    if (Date.now() > deadline) throw new Error(`sizing: ${what} did not happen in time`);
    await new Promise((r) => setTimeout(r, 500));
  }
}

/** Waits until every run ended (async ones counted by the process) and the history holds them, then a measure. */
async function settle(asyncRuns: number, webhooks: number): Promise<void> {
  await until("the async runs ending", async () => {
    const ended = metric(await metricsText(), "skiff_runs_total", 'mode="async"');
    return ended >= asyncRuns && (await (await nc.jetstreamManager()).streams.info("SKIFF_RUNS")).state.messages === 0;
  });
  await until("the webhooks arriving", async () => delivered >= webhooks);
  // The run history projects within a second or so; the store watch measures every 5 s.
  await new Promise((r) => setTimeout(r, 12_000));
}

try {
  await deployFolder(skiff, tmp, {
    "skiff.toml": `[app]\nname = "sizing"\n[runtime]\nkind = "cortex"\nlanguage = "node"\nentry = "index.mjs"\n[scaling]\nmin_replicas = 1\nmax_replicas = 2\nreplica_concurrency = 32\n`,
    "index.mjs":
      "export function add({ a, b }) { return a + b; }\nexport function big({ n }) { return 'x'.repeat(n); }\n",
  });
  await new Promise<void>((r) => receiver.listen(0, "127.0.0.1", r));
  const hook = encodeURIComponent(`http://127.0.0.1:${(receiver.address() as { port: number }).port}/hook`);
  const base = `${skiff.url}/v4/${P}/sizing`;
  const add = JSON.stringify({ a: 1, b: 2 });
  console.log("sizing: deployed");
  await until("the app serving", async () => {
    const res = await fetch(`${base}/add`, {
      method: "POST",
      headers: { authorization: `Bearer ${skiff.devToken}`, "content-type": "application/json" },
      body: add,
    });
    await res.arrayBuffer();
    return res.status === 200;
  });
  console.log("sizing: the app serves");
  await waitRunHistory(skiff, "sizing");
  await settle(0, 0);
  console.log(`sizing: ${RUNS} runs of each kind`);

  const kinds: { kind: string; run: () => Promise<void>; asyncRuns: number; webhooks: number }[] = [
    { kind: "sync", run: () => calls(RUNS, `${base}/add`, add, 200), asyncRuns: 0, webhooks: 0 },
    { kind: "async", run: () => calls(RUNS, `${base}/add?async=true`, add, 202), asyncRuns: RUNS, webhooks: 0 },
    {
      kind: "sync with webhook",
      run: () => calls(RUNS, `${base}/add?webhookEndpoint=${hook}`, add, 200),
      asyncRuns: 0,
      webhooks: RUNS,
    },
    {
      kind: `async, ${LARGE_RESULT_BYTES / 1000} KB result`,
      run: () => calls(RUNS, `${base}/big?async=true`, JSON.stringify({ n: LARGE_RESULT_BYTES }), 202),
      asyncRuns: RUNS,
      webhooks: 0,
    },
  ];
  const perRun: Record<string, Record<string, number>> = {};
  let asyncRuns = 0;
  let webhooks = 0;
  for (const k of kinds) {
    const before = await stores();
    const started = Date.now();
    await k.run();
    asyncRuns += k.asyncRuns;
    webhooks += k.webhooks;
    await settle(asyncRuns, webhooks);
    const after = await stores();
    const bytes: Record<string, number> = {};
    for (const name of Object.keys(after)) {
      const d = (after[name] - (before[name] ?? 0)) / RUNS;
      if (Math.abs(d) >= 1) bytes[name] = Math.round(d);
    }
    perRun[k.kind] = bytes;
    console.log(
      `sizing: ${k.kind}: ${RUNS} runs in ${((Date.now() - started) / 1000).toFixed(0)} s; bytes per run:`,
      bytes,
    );
  }
  const result = {
    runs_per_kind: RUNS,
    note: "bytes per run, by store; KV skiff-runs and skiff-webhooks hold a run's entries until a minute after it ended",
    bytes_per_run: perRun,
    kb_per_run_kept: Object.fromEntries(
      Object.entries(perRun).map(([kind, b]) => [
        kind,
        round(
          Object.entries(b)
            .filter(([store]) => !["skiff-runs", "skiff-webhooks", "SKIFF_RUNS", "SKIFF_WEBHOOKS"].includes(store))
            .reduce((sum, [, v]) => sum + v, 0) / 1000,
          2,
        ),
      ]),
    ),
  };
  console.log(JSON.stringify(result, null, 2));
  await writeResults("sizing.json", result);
} finally {
  receiver.close();
  await nc.close();
  await skiff.stop();
  await nats.stop();
  await rm(tmp, { recursive: true, force: true });
}
