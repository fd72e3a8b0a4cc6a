// The run pipeline against references measured in the same run: the same
// echo server called directly, behind nginx (one worker, keep-alive), behind
// a bare node:http proxy, behind OpenFaaS CE (when ../shared/peers/openfaas
// is there), and as skiff's Custom app, with skiff's CPU and heap allocations
// per sync call; a Node Cortex app; sync at 1 and 32 connections,
// async accept at 32 (wrk is the load). Then webhook latency (a run's end
// to its delivery at a local receiver), cold starts against the bare
// runtime's start, revocation across two processes, and skiff's memory.
// Writes bench/results/latest.json; ratios, not times, are the result.
//
//   --quick: shorter cases (about 2 minutes in all).
import { spawn, type ChildProcess } from "node:child_process";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import http from "node:http";
import { tmpdir } from "node:os";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { connect } from "nats";
import { streams } from "../services/nats/layout.js";
import { startNatsServer, type TestNats } from "../test/helpers/nats-server.js";
import { deployFolder } from "./deploy.js";
import { streamedAnswers } from "./streaming.js";
import { startSkiffProcess, waitRunHistory, type SkiffProcess } from "./skiff-process.js";
import {
  ALLOC_PROBE,
  ECHO_SERVER,
  NODE_PROXY,
  ensureTools,
  percentile,
  processCost,
  quiet,
  round,
  rssMb,
  serveNode,
  startNginx,
  startOpenFaas,
  stop,
  wrk,
  type Latency,
  type WrkResult,
} from "./tools.js";

const P = "p-dev";
/** Interleaved rounds of the sync cases (see syncRounds). */
const SYNC_ROUNDS = 3;
const CUSTOM = "bench-echo";
const CORTEX = "bench-add";

export interface PipelineResults {
  machine: { cores: number; node: string; quick: boolean; date: string };
  /**
   * node_proxy: the same echo server behind a bare node:http proxy (tools.ts NODE_PROXY), the floor of a Node.js
   * proxy; openfaas: behind OpenFaaS CE (gateway → provider → of-watchdog → the echo server), null when it is not
   * there (tools.ts OPENFAAS_DIR).
   */
  sync_c1: SyncCases;
  sync: SyncCases;
  /**
   * What skiff's process spends on a sync call to the Custom app at 32 connections: CPU of all its threads
   * (/proc, user + system) and bytes its main thread allocates on the JS heap (bench/alloc-probe.mjs), per call.
   */
  sync_cost: { cpu_us_per_call: number; heap_bytes_per_call: number | null };
  async_accept: Latency;
  /**
   * The same accepts on a gateway alone (a process without the runner role, on a NATS server of its own), as
   * when runners are other processes: async_accept's process also runs every run it accepts, on the same cores.
   */
  async_accept_gateway: Latency;
  /** The runs accepted by async_accept, run by the same process after it: left in the queue when it ended, and how fast they went. */
  async_drain: { backlog: number; seconds: number; per_second: number };
  webhook: { p50_ms: number; p99_ms: number };
  cold_start_ms: { node: number; python: number; node_floor: number; python_floor: number };
  revocation_ms: { p50: number; p99: number };
  /** A streamed answer (server-sent events): time to its first byte and to its end, direct and through skiff. */
  streamed: Awaited<ReturnType<typeof streamedAnswers>>;
  rss_mb: { idle: number; loaded: number; after_soak: number | null };
  list_runs_ms: number | null;
  /** The first page of ListRuns from wrk at one connection over the REST path (no client's work in it). */
  list_runs_rest: { p50_ms: number; p99_ms: number } | null;
  /** Runs a second the run history projected while ListRuns was measured (run-listing.ts). */
  history_projected_per_s: number | null;
  errors: Record<string, number>;
  ratios: Record<string, number>;
}

interface SyncCases {
  direct: Latency;
  nginx: Latency;
  node_proxy: Latency;
  openfaas: Latency | null;
  skiff: Latency;
  cortex: Latency;
}

const latency = (r: WrkResult): Latency => ({ rps: r.rps, p50_ms: round(r.p50_ms, 3), p99_ms: round(r.p99_ms, 3) });

function appToml(name: string, runtime: string, scaling: string): string {
  return `[app]\nname = "${name}"\n[runtime]\n${runtime}\n[scaling]\n${scaling}\n`;
}

/** Time from the first call to its answer for an app with no replica, and the bare runtime's own start. */
async function coldStarts(skiff: SkiffProcess, tmp: string, rounds: number) {
  const scaling = "min_replicas = 0\nmax_replicas = 1\ncooldown = 1";
  await deployFolder(skiff, tmp, {
    "skiff.toml": appToml("cold-node", 'kind = "cortex"\nlanguage = "node"\nentry = "index.mjs"', scaling),
    "index.mjs": "export function hi() { return 'hi'; }\n",
  });
  await deployFolder(skiff, tmp, {
    "skiff.toml": appToml("cold-python", 'kind = "cortex"\nlanguage = "python"\nentry = "main.py"', scaling),
    "main.py": "def hi():\n    return 'hi'\n",
  });
  const call = async (app: string) => {
    const t0 = performance.now();
    const res = await fetch(`${skiff.url}/v4/${P}/${app}/hi`, {
      method: "POST",
      headers: { authorization: `Bearer ${skiff.devToken}`, "content-type": "application/json" },
      body: "{}",
    });
    await res.text();
    if (res.status !== 200) throw new Error(`${app} answered ${res.status}`);
    return performance.now() - t0;
  };
  const measure = async (app: string) => {
    await call(app); // the deployment is prepared on the first call's runner
    const times: number[] = [];
    for (let i = 0; i < rounds; i++) {
      await waitNoReplica(skiff, app);
      times.push(await call(app));
    }
    return percentile(times, 0.5);
  };
  const floor = async (command: string, args: string[]) => {
    const times: number[] = [];
    for (let i = 0; i < rounds; i++) times.push(await bareStart(command, args));
    return percentile(times, 0.5);
  };
  return {
    node: round(await measure("cold-node"), 1),
    python: round(await measure("cold-python"), 1),
    node_floor: round(
      await floor(process.execPath, [
        "-e",
        "require('http').createServer((q,s)=>s.end('hi')).listen(0,'127.0.0.1',function(){console.log('port '+this.address().port)})",
      ]),
      1,
    ),
    python_floor: round(
      await floor("python3", [
        "-c",
        "import http.server as h\nclass H(h.BaseHTTPRequestHandler):\n def do_GET(s):\n  s.send_response(200);s.end_headers();s.wfile.write(b'hi')\n def log_message(*a): pass\ns=h.HTTPServer(('127.0.0.1',0),H)\nprint('port',s.server_address[1],flush=True)\ns.serve_forever()",
      ]),
      1,
    ),
  };
}

async function waitNoReplica(skiff: SkiffProcess, app: string): Promise<void> {
  for (let i = 0; i < 300; i++) {
    const res = await fetch(`${skiff.url}/v2/projects/${P}/apps/${app}`, {
      headers: { authorization: `Bearer ${skiff.devToken}` },
    });
    const body = (await res.json()) as { app?: { replicas?: unknown[] } };
    if ((body.app?.replicas ?? []).length === 0) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`${app} kept a replica for 30 s after its cooldown`);
}

/** Spawn a runtime with a one-line HTTP server and get its first answer: the floor of any cold start. */
async function bareStart(command: string, args: string[]): Promise<number> {
  const t0 = performance.now();
  const child: ChildProcess = spawn(command, args, { stdio: ["ignore", "pipe", "inherit"] });
  try {
    const port = await new Promise<number>((resolve, reject) => {
      let out = "";
      child.once("exit", (c) => reject(new Error(`${command} exited ${c}`)));
      child.stdout!.on("data", (d: Buffer) => {
        out += d.toString();
        const m = /port (\d+)/.exec(out);
        if (m) resolve(Number(m[1]));
      });
    });
    await (await fetch(`http://127.0.0.1:${port}/`)).text();
    return performance.now() - t0;
  } finally {
    await stop(child);
  }
}

/** Waits until the run queue is empty; how many runs it held when called and how fast they went. */
async function drainQueue(natsUrl: string) {
  const nc = await connect({ servers: natsUrl });
  try {
    const jsm = await nc.jetstreamManager();
    const queued = async () => (await jsm.streams.info(streams.runs.name)).state.messages;
    const started = performance.now();
    const backlog = await queued();
    // Polled often: a drain shorter than a poll would read as taking the whole poll.
    while ((await queued()) > 0) await new Promise((r) => setTimeout(r, 10));
    const seconds = (performance.now() - started) / 1000;
    return { backlog, seconds: round(seconds, 2), per_second: seconds > 0 ? Math.round(backlog / seconds) : 0 };
  } finally {
    await nc.close();
  }
}

/** Sync calls that name a webhook: from the moment the caller has its answer to the receiver's. */
async function webhookLatency(skiff: SkiffProcess, calls: number) {
  const arrivals = new Map<string, number>();
  const receiver = http.createServer((req, res) => {
    const id = String(req.headers["x-request-id"] ?? "");
    req.resume();
    req.on("end", () => {
      if (!arrivals.has(id)) arrivals.set(id, performance.now());
      res.end("ok");
    });
  });
  await new Promise<void>((r) => receiver.listen(0, "127.0.0.1", r));
  const hook = encodeURIComponent(`http://127.0.0.1:${(receiver.address() as { port: number }).port}/hook`);
  const answered = new Map<string, number>();
  try {
    for (let i = 0; i < calls; i++) {
      const res = await fetch(`${skiff.url}/v4/${P}/${CORTEX}/add?webhookEndpoint=${hook}`, {
        method: "POST",
        headers: { authorization: `Bearer ${skiff.devToken}`, "content-type": "application/json" },
        body: JSON.stringify({ a: i, b: 1 }),
      });
      await res.text();
      answered.set(res.headers.get("x-request-id") ?? "", performance.now());
    }
    for (let i = 0; i < 200 && arrivals.size < calls; i++) await new Promise((r) => setTimeout(r, 50));
    const delays = [...answered].filter(([id]) => arrivals.has(id)).map(([id, t]) => arrivals.get(id)! - t);
    if (delays.length < calls) throw new Error(`only ${delays.length} of ${calls} webhooks arrived`);
    return { p50_ms: round(percentile(delays, 0.5)), p99_ms: round(percentile(delays, 0.99)) };
  } finally {
    receiver.close();
  }
}

/** A service account deleted through one process: how long until another process refuses its token. */
async function revocation(skiff: SkiffProcess, other: SkiffProcess, rounds: number) {
  const admin = { authorization: `Bearer ${skiff.adminToken}`, "content-type": "application/json" };
  const times: number[] = [];
  const expires = new Date(Date.now() + 24 * 3600_000).toISOString();
  for (let i = 0; i < rounds; i++) {
    const made = await fetch(`${skiff.url}/v2/projects/${P}/service-accounts`, {
      method: "POST",
      headers: admin,
      body: JSON.stringify({ name: `revoke-${i}`, expires_at: expires }),
    });
    const { token, service_account } = (await made.json()) as {
      token: string;
      service_account: { service_account_id: string };
    };
    const identity = () =>
      fetch(`${other.url}/v2/identity`, { headers: { authorization: `Bearer ${token}` } }).then(async (r) => {
        await r.arrayBuffer();
        return r.status;
      });
    for (let j = 0; (await identity()) !== 200; j++) {
      if (j > 1000) throw new Error("the other process never accepted the new token");
      await new Promise((r) => setTimeout(r, 5));
    }
    const t0 = performance.now();
    const del = await fetch(`${skiff.url}/v2/projects/${P}/service-accounts/${service_account.service_account_id}`, {
      method: "DELETE",
      headers: admin,
    });
    await del.arrayBuffer();
    while ((await identity()) !== 401) {
      if (performance.now() - t0 > 10_000) throw new Error("the token still worked 10 s after its account was deleted");
    }
    times.push(performance.now() - t0);
  }
  return { p50: round(percentile(times, 0.5)), p99: round(percentile(times, 0.99)) };
}

export async function benchPipeline(argv: string[] = process.argv.slice(2)): Promise<PipelineResults> {
  const quick = argv.includes("--quick");
  const seconds = quick ? 3 : 10;
  ensureTools();
  const tmp = await mkdtemp(path.join(tmpdir(), "skiff-bench-"));
  const children: ChildProcess[] = [];
  let nats: TestNats | undefined;
  let skiff: SkiffProcess | undefined;
  let other: SkiffProcess | undefined;
  try {
    const direct = await serveNode(ECHO_SERVER);
    children.push(direct.child);
    const nginx = await startNginx(path.join(tmp, "nginx"), direct.port);
    children.push(nginx.child);
    const nodeProxy = await serveNode(NODE_PROXY, { TARGET: String(direct.port) });
    children.push(nodeProxy.child);
    const openfaas = await startOpenFaas(path.join(tmp, "openfaas"), ECHO_SERVER);
    if (openfaas) children.push(openfaas.child);
    else console.log("OpenFaaS CE is not there (SKIFF_OPENFAAS_DIR): its cases are left out");
    nats = await startNatsServer();
    const allocFile = path.join(tmp, "alloc.json");
    skiff = await startSkiffProcess({
      natsUrl: nats.url,
      dataDir: path.join(tmp, "data"),
      env: { SKIFF_MAX_QUEUED_RUNS: "10000000", SKIFF_BENCH_ALLOC_FILE: allocFile },
      nodeArgs: ["--import", ALLOC_PROBE],
    });
    const scaling = "min_replicas = 1\nmax_replicas = 2\nreplica_concurrency = 64\ncooldown = 600";
    await deployFolder(skiff, tmp, {
      "skiff.toml": appToml(
        CUSTOM,
        'kind = "custom"\ncommand = ["node", "server.mjs"]\nhealthcheck = "/health"',
        scaling,
      ),
      "server.mjs": ECHO_SERVER,
    });
    await deployFolder(skiff, tmp, {
      "skiff.toml": appToml(CORTEX, 'kind = "cortex"\nlanguage = "node"\nentry = "index.mjs"', scaling),
      "index.mjs": "export function add({ a, b }) { return a + b; }\n",
    });
    // The run history's first start (PGlite's initdb, seconds of CPU) is over before anything is measured.
    await waitRunHistory(skiff, CUSTOM);
    const auth = { Authorization: `Bearer ${skiff.devToken}` };
    const echoBody = JSON.stringify({ hello: "world", n: 42 });
    const addBody = JSON.stringify({ a: 1, b: 2 });
    // Both apps answer (the first call waits for the fresh deployment), then a warm-up.
    const urls = {
      direct: `http://127.0.0.1:${direct.port}/echo`,
      nginx: `http://127.0.0.1:${nginx.port}/echo`,
      nodeProxy: `http://127.0.0.1:${nodeProxy.port}/echo`,
      openfaas: openfaas ? `${openfaas.url}/echo` : undefined,
      skiff: `${skiff.url}/v4/${P}/${CUSTOM}/echo`,
      cortex: `${skiff.url}/v4/${P}/${CORTEX}/add`,
    };
    for (const [url, body] of [
      [urls.skiff, echoBody],
      [urls.cortex, addBody],
    ]) {
      const res = await fetch(url, { method: "POST", headers: { ...auth, "content-type": "application/json" }, body });
      if (res.status !== 200) throw new Error(`${url} answered ${res.status}: ${await res.text()}`);
      await res.text();
    }
    await new Promise((r) => setTimeout(r, 2000));
    const idle = await rssMb(skiff.pid);
    const errors: Record<string, number> = {};
    let lastRequests = 0;
    const run = async (name: string, url: string, body: string, connections: number, status = 200, secs = seconds) => {
      const r = await wrk(
        { url, body, headers: url.startsWith(skiff!.url) ? auth : {}, status, connections, seconds: secs },
        tmp,
      );
      errors[name] = r.errors;
      lastRequests = r.requests;
      console.log(
        `  ${name.padEnd(22)} ${String(r.rps).padStart(7)} req/s  p50 ${r.p50_ms.toFixed(3)} ms  p99 ${r.p99_ms.toFixed(3)} ms  errors ${r.errors}`,
      );
      return latency(r);
    };
    // Warm-up of every path (JIT, connection pools, replicas).
    for (const url of [urls.direct, urls.nginx, urls.nodeProxy, urls.openfaas, urls.skiff])
      if (url) await run("warm-up", url, echoBody, 32, 200, 2);
    await run("warm-up", urls.cortex, addBody, 32, 200, 2);

    // The sync cases run in interleaved rounds, and each case's figure is its round of median req/s: a few
    // seconds when a machine shared with others is slow then fall on every case alike, not on the one that
    // happened to run then. skiff's CPU and heap bytes a call are over all its Custom rounds (not its warm-ups).
    const syncRounds = async (connections: number, roundSeconds: number) => {
      const cases: [keyof SyncCases, string, string, string][] = [
        ["direct", "direct", urls.direct, echoBody],
        ["nginx", "nginx", urls.nginx, echoBody],
        ["node_proxy", "node proxy", urls.nodeProxy, echoBody],
        ...(urls.openfaas
          ? [["openfaas", "openfaas", urls.openfaas, echoBody] as [keyof SyncCases, string, string, string]]
          : []),
        ["skiff", "skiff custom", urls.skiff, echoBody],
        ["cortex", "skiff cortex", urls.cortex, addBody],
      ];
      const seen = new Map<keyof SyncCases, Latency[]>();
      const skiffCost = { cpuSeconds: 0, heapBytes: 0 as number | null, calls: 0 };
      for (let round = 1; round <= SYNC_ROUNDS; round++)
        for (const [key, name, url, body] of cases) {
          const label = `${name} c=${connections}`;
          // A second of the same load first, not counted: each case is measured warm (connections that closed
          // while the other cases ran, as skiff's to a replica do after 4 s idle, are open again).
          await wrk(
            { url, body, headers: url.startsWith(skiff!.url) ? auth : {}, status: 200, connections, seconds: 1 },
            tmp,
          );
          let result: Latency;
          if (key === "skiff") {
            // What the earlier cases left for skiff to do (projecting their runs into the run history) is not counted.
            await quiet(skiff!.pid);
            const cost = await processCost(skiff!.pid, allocFile, () =>
              run(label, url, body, connections, 200, roundSeconds),
            );
            skiffCost.cpuSeconds += cost.cpuSeconds;
            skiffCost.heapBytes =
              cost.heapBytes === null || skiffCost.heapBytes === null ? null : skiffCost.heapBytes + cost.heapBytes;
            skiffCost.calls += lastRequests;
            result = cost.result;
          } else result = await run(label, url, body, connections, 200, roundSeconds);
          seen.set(key, [...(seen.get(key) ?? []), result]);
        }
      const median = (key: keyof SyncCases) => {
        const all = [...(seen.get(key) ?? [])].sort((a, b) => a.rps - b.rps);
        return all[Math.floor(all.length / 2)];
      };
      const chosen: SyncCases = {
        direct: median("direct"),
        nginx: median("nginx"),
        node_proxy: median("node_proxy"),
        openfaas: urls.openfaas ? median("openfaas") : null,
        skiff: median("skiff"),
        cortex: median("cortex"),
      };
      return { cases: chosen, skiffCost };
    };
    const roundSeconds = quick ? 2 : 5;
    console.log(`sync, 1 connection, ${SYNC_ROUNDS} interleaved rounds of ${roundSeconds} s a case:`);
    const sync_c1 = (await syncRounds(1, roundSeconds)).cases;
    console.log(`sync, 32 connections, ${SYNC_ROUNDS} interleaved rounds of ${roundSeconds} s a case:`);
    const { cases: sync, skiffCost } = await syncRounds(32, roundSeconds);
    const sync_cost = {
      cpu_us_per_call: Math.round((skiffCost.cpuSeconds * 1e6) / skiffCost.calls),
      heap_bytes_per_call: skiffCost.heapBytes === null ? null : Math.round(skiffCost.heapBytes / skiffCost.calls),
    };

    console.log(
      `  skiff per sync call: ${sync_cost.cpu_us_per_call} µs CPU (all threads), ${sync_cost.heap_bytes_per_call} bytes allocated on the heap`,
    );
    console.log(`async accept, 32 connections:`);
    const async_accept = await run("skiff async c=32", `${urls.cortex}?async=true`, addBody, 32, 202);
    const loaded = await rssMb(skiff.pid);
    // The accepted runs are still being run: the webhook figures are taken on an idle process.
    const async_drain = await drainQueue(nats.url);
    console.log(`  the ${async_drain.backlog} runs left in the queue ran at ${async_drain.per_second}/s`);
    await quiet(skiff.pid);
    const alone = await acceptOnGateway(tmp, addBody, seconds);
    errors["skiff async c=32, gateway alone"] = alone.errors;
    const async_accept_gateway = latency(alone);
    console.log(
      `  skiff async c=32, gateway alone: ${async_accept_gateway.rps} req/s  p50 ${async_accept_gateway.p50_ms} ms  p99 ${async_accept_gateway.p99_ms} ms`,
    );

    console.log("webhook delivery, cold starts, revocation:");
    const webhook = await webhookLatency(skiff, quick ? 50 : 200);
    console.log(`  webhook p50 ${webhook.p50_ms} ms, p99 ${webhook.p99_ms} ms`);
    const cold_start_ms = await coldStarts(skiff, tmp, quick ? 3 : 7);
    console.log(`  cold start ${JSON.stringify(cold_start_ms)}`);
    const streamed = await streamedAnswers(skiff, tmp, quick ? 10 : 30);
    console.log(`  streamed answer ${JSON.stringify(streamed)}`);
    other = await startSkiffProcess({
      natsUrl: nats.url,
      dataDir: path.join(tmp, "data-other"),
      roles: "management",
      env: { SKIFF_ADMIN_TOKEN: skiff.adminToken },
    });
    const revocation_ms = await revocation(skiff, other, quick ? 5 : 20);
    console.log(`  revocation ${JSON.stringify(revocation_ms)}`);

    const results: PipelineResults = {
      machine: {
        cores: (await import("node:os")).cpus().length,
        node: process.version,
        quick,
        date: new Date().toISOString(),
      },
      sync_c1,
      sync,
      sync_cost,
      async_accept,
      async_accept_gateway,
      async_drain,
      webhook,
      cold_start_ms,
      revocation_ms,
      streamed,
      rss_mb: { idle, loaded, after_soak: null },
      list_runs_ms: null,
      list_runs_rest: null,
      history_projected_per_s: null,
      errors,
      ratios: {
        sync_skiff_vs_nginx: round(sync.skiff.rps / sync.nginx.rps),
        sync_cortex_vs_nginx: round(sync.cortex.rps / sync.nginx.rps),
        sync_node_proxy_vs_nginx: round(sync.node_proxy.rps / sync.nginx.rps),
        sync_skiff_vs_node_proxy: round(sync.skiff.rps / sync.node_proxy.rps),
        ...(sync.openfaas && sync_c1.openfaas
          ? {
              sync_skiff_vs_openfaas: round(sync.skiff.rps / sync.openfaas.rps),
              sync_openfaas_c1_added_p50_ms: round(sync_c1.openfaas.p50_ms - sync_c1.direct.p50_ms, 3),
            }
          : {}),
        sync_c1_added_p50_ms: round(sync_c1.skiff.p50_ms - sync_c1.direct.p50_ms, 3),
        cold_start_node_vs_floor: round(cold_start_ms.node / cold_start_ms.node_floor),
        cold_start_python_vs_floor: round(cold_start_ms.python / cold_start_ms.python_floor),
        streamed_added_ttfb_ms: round(streamed.skiff.ttfb_ms - streamed.direct.ttfb_ms, 3),
      },
    };
    return results;
  } finally {
    await other?.stop();
    await skiff?.stop();
    for (const c of children) await stop(c);
    await nats?.stop();
    await rm(tmp, { recursive: true, force: true });
  }
}

/**
 * Async accepts at 32 connections on a gateway alone: a skiff process with every role but the runner's, on a
 * NATS server of its own, so that the accepted runs wait in the queue and nothing else takes the cores.
 */
async function acceptOnGateway(tmp: string, body: string, seconds: number): Promise<WrkResult> {
  const nats = await startNatsServer();
  let gateway: SkiffProcess | undefined;
  try {
    gateway = await startSkiffProcess({
      natsUrl: nats.url,
      dataDir: path.join(tmp, "data-gateway"),
      roles: "invocation,management,webhook",
      env: { SKIFF_MAX_QUEUED_RUNS: "10000000" },
    });
    await deployFolder(gateway, tmp, {
      "skiff.toml": appToml(CORTEX, 'kind = "cortex"\nlanguage = "node"\nentry = "index.mjs"', ""),
      "index.mjs": "export function add({ a, b }) { return a + b; }\n",
    });
    const job = {
      url: `${gateway.url}/v4/${P}/${CORTEX}/add?async=true`,
      body,
      headers: { Authorization: `Bearer ${gateway.devToken}` },
      status: 202,
      connections: 32,
    };
    // Its run history has started before the load, and JIT is warm.
    await waitRunHistory(gateway, CORTEX);
    await wrk({ ...job, seconds: 3 }, tmp);
    return await wrk({ ...job, seconds }, tmp);
  } finally {
    await gateway?.stop();
    await nats.stop();
  }
}

export async function writeResults(name: string, data: unknown): Promise<string> {
  const dir = path.join(import.meta.dirname, "results");
  await mkdir(dir, { recursive: true });
  const file = path.join(dir, name);
  await writeFile(file, `${JSON.stringify(data, null, 2)}\n`);
  return file;
}
