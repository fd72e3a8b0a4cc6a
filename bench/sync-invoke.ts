// Throughput and latency of calls through skiff, against baselines measured
// in the same run: the same app server called directly (the ceiling), and
// behind a bare Node reverse proxy (the cost of one Node hop, the reference a
// gateway should come near). The load comes from a separate Node process:
// N requests in flight on keep-alive connections for a fixed time. Prints
// requests/s, p50/p99 latency and errors per case, ratios to both baselines,
// and skiff's RSS before and after the load; a ratio, not a time, is the result.
//
//   BENCH_SECONDS (default 5) per case, BENCH_CONCURRENCY (default 32) in flight.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { deploy, P, post } from "../test/helpers/run-apps.js";
import { startTestSkiff, type TestSkiff } from "../test/helpers/skiff.js";

const SECONDS = Number(process.env.BENCH_SECONDS ?? 5);
const CONCURRENCY = Number(process.env.BENCH_CONCURRENCY ?? 32);
const WARMUP_SECONDS = 1;
const CUSTOM = "bench-echo";
const CORTEX = "bench-add";
const SCALING = `min_replicas = 1\nmax_replicas = 2\nreplica_concurrency = ${Math.max(64, 2 * CONCURRENCY)}\ncooldown = 300`;

/** The Custom app, and the baseline server: POST /echo answers a small JSON body. */
const ECHO_SERVER = `
import http from "node:http";
const server = http.createServer((req, res) => {
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    const path = (req.url ?? "/").split("?", 1)[0];
    let status = 404;
    let body = '{"error":"not found"}';
    if (path === "/health") [status, body] = [200, '{"status":"ok"}'];
    else if (path === "/echo" && req.method === "POST") [status, body] = [200, JSON.stringify({ ok: true, bytes: Buffer.concat(chunks).length })];
    res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(body) });
    res.end(body);
  });
});
process.on("SIGTERM", () => server.close(() => process.exit(0)));
server.listen(Number(process.env.PORT), "127.0.0.1", () => console.log("port " + server.address().port));
`;

/** A bare reverse proxy: http.request piping through a keep-alive agent. */
const PROXY = `
import http from "node:http";
const target = Number(process.env.TARGET);
const agent = new http.Agent({ keepAlive: true, maxSockets: 256 });
const server = http.createServer((req, res) => {
  const up = http.request({ host: "127.0.0.1", port: target, method: req.method, path: req.url, headers: req.headers, agent }, (r) => {
    res.writeHead(r.statusCode ?? 502, r.headers);
    r.pipe(res);
  });
  up.on("error", () => { res.writeHead(502); res.end(); });
  req.pipe(up);
});
server.listen(0, "127.0.0.1", () => console.log("port " + server.address().port));
`;

/**
 * The load generator, run in its own process so that it takes no CPU from
 * the event loop under test. argv: a JSON job; stdout: a JSON result.
 */
const LOAD = `
import http from "node:http";
const job = JSON.parse(process.argv[1]);
const agent = new http.Agent({ keepAlive: true, maxSockets: job.concurrency });
const url = new URL(job.url);
const body = Buffer.from(job.body);
const headers = { ...job.headers, "content-type": "application/json", "content-length": body.length };
const one = () => new Promise((resolve) => {
  const req = http.request({ host: url.hostname, port: url.port, path: url.pathname + url.search, method: "POST", headers, agent }, (res) => {
    const chunks = [];
    res.on("data", (c) => chunks.push(c));
    res.on("end", () => resolve(res.statusCode === job.status ? null : res.statusCode + " " + Buffer.concat(chunks).toString().slice(0, 200)));
    res.on("error", (e) => resolve(String(e)));
  });
  req.on("error", (e) => resolve(String(e)));
  req.end(body);
});
const latencies = [];
let errors = 0;
const samples = [];
let measuring = false;
const start = performance.now();
const measureFrom = start + job.warmupMs;
const end = measureFrom + job.durationMs;
async function loop() {
  for (;;) {
    const t0 = performance.now();
    if (t0 >= end) return;
    const err = await one();
    const t1 = performance.now();
    if (t0 < measureFrom) continue;
    if (err === null) latencies.push(t1 - t0);
    else if (++errors <= 5) samples.push(err);
  }
}
await Promise.all(Array.from({ length: job.concurrency }, loop));
latencies.sort((a, b) => a - b);
const q = (p) => latencies.length === 0 ? NaN : latencies[Math.min(latencies.length - 1, Math.floor(p * latencies.length))];
agent.destroy();
process.stdout.write(JSON.stringify({ rps: (latencies.length + errors) / (job.durationMs / 1000), ok: latencies.length, errors, samples, p50: q(0.5), p99: q(0.99) }));
`;

interface LoadResult {
  rps: number;
  ok: number;
  errors: number;
  samples: string[];
  p50: number;
  p99: number;
}

interface Job {
  url: string;
  body: string;
  headers: Record<string, string>;
  status: number;
}

function node(code: string, args: string[], env: Record<string, string> = {}): ChildProcess {
  return spawn(process.execPath, ["--input-type=module", "-e", code, ...args], {
    env: { ...process.env, ...env },
    stdio: ["ignore", "pipe", "inherit"],
  });
}

/** Starts a server script that prints "port N" once listening. */
function serve(code: string, env: Record<string, string>): Promise<{ port: number; child: ChildProcess }> {
  const child = node(code, [], env);
  return new Promise((resolve, reject) => {
    let out = "";
    child.once("exit", (c) => reject(new Error(`server exited (${c}) before listening`)));
    child.stdout!.on("data", (d: Buffer) => {
      out += d.toString();
      const m = /port (\d+)/.exec(out);
      if (m) resolve({ port: Number(m[1]), child });
    });
  });
}

function load(job: Job): Promise<LoadResult> {
  const child = node(LOAD, [
    JSON.stringify({ ...job, concurrency: CONCURRENCY, warmupMs: WARMUP_SECONDS * 1000, durationMs: SECONDS * 1000 }),
  ]);
  let out = "";
  child.stdout!.on("data", (d: Buffer) => (out += d.toString()));
  return new Promise((resolve, reject) => {
    child.once("exit", (code) =>
      code === 0 ? resolve(JSON.parse(out) as LoadResult) : reject(new Error(`the load generator exited ${code}`)),
    );
  });
}

async function stop(child: ChildProcess | undefined): Promise<void> {
  if (!child || child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((r) => child.once("exit", r));
  child.kill("SIGTERM");
  const timer = setTimeout(() => child.kill("SIGKILL"), 3000);
  await exited;
  clearTimeout(timer);
}

const mb = (bytes: number) => `${(bytes / 1024 / 1024).toFixed(0)} MB`;

export async function benchSyncInvoke(): Promise<void> {
  const tmp = await mkdtemp(path.join(tmpdir(), "skiff-bench-"));
  const children: ChildProcess[] = [];
  let t: TestSkiff | undefined;
  try {
    const direct = await serve(ECHO_SERVER, { PORT: "0" });
    children.push(direct.child);
    const proxy = await serve(PROXY, { TARGET: String(direct.port) });
    children.push(proxy.child);

    // Enough room in the queue for every async call of the run.
    t = await startTestSkiff({ env: { SKIFF_MAX_QUEUED_RUNS: "10000000" } });
    const client = t.management();
    await deploy(tmp, client, {
      "skiff.toml": `[app]\nname = "${CUSTOM}"\n[runtime]\nkind = "custom"\ncommand = ["node", "server.mjs"]\nhealthcheck = "/health"\n[scaling]\n${SCALING}\n`,
      "server.mjs": ECHO_SERVER,
    });
    await deploy(tmp, client, {
      "skiff.toml": `[app]\nname = "${CORTEX}"\n[runtime]\nkind = "cortex"\nlanguage = "node"\nentry = "index.mjs"\n[scaling]\n${SCALING}\n`,
      "index.mjs": "export function add({ a, b }) { return a + b; }\n",
    });
    const auth = { authorization: `Bearer ${t.devToken}` };
    const echoBody = JSON.stringify({ hello: "world", n: 42 });
    const addBody = JSON.stringify({ a: 1, b: 2 });
    // Each app answers once (the first call waits for the fresh deployment) before any load.
    const first = await post(`${t.url}/v4/${P}/${CUSTOM}/echo`, t.devToken, echoBody);
    if (first.status !== 200 || first.json?.ok !== true)
      throw new Error(`${CUSTOM} answered ${first.status} ${first.text}`);
    const sum = await post(`${t.url}/v4/${P}/${CORTEX}/add`, t.devToken, addBody);
    if (sum.status !== 200 || sum.json?.result !== 3) throw new Error(`${CORTEX} answered ${sum.status} ${sum.text}`);
    for (let i = 0; i < 200; i++) {
      await post(`${t.url}/v4/${P}/${CUSTOM}/echo`, t.devToken, echoBody);
      await post(`${t.url}/v4/${P}/${CORTEX}/add`, t.devToken, addBody);
    }
    const replicas = [CUSTOM, CORTEX].map(
      (a) => t!.skiff.runner!.replicas(P, a).filter((r) => r.state === "ready").length,
    );

    const before = process.memoryUsage();
    const rssBefore = before.rss;
    const cases: [string, Job][] = [
      [
        "(a) app server, direct",
        { url: `http://127.0.0.1:${direct.port}/echo`, body: echoBody, headers: {}, status: 200 },
      ],
      ["(b) bare Node proxy", { url: `http://127.0.0.1:${proxy.port}/echo`, body: echoBody, headers: {}, status: 200 }],
      [
        "(c) skiff sync, Custom",
        { url: `${t.url}/v4/${P}/${CUSTOM}/echo`, body: echoBody, headers: auth, status: 200 },
      ],
      ["(d) skiff sync, Cortex", { url: `${t.url}/v4/${P}/${CORTEX}/add`, body: addBody, headers: auth, status: 200 }],
      [
        "(e) skiff async (202)",
        { url: `${t.url}/v4/${P}/${CORTEX}/add?async=true`, body: addBody, headers: auth, status: 202 },
      ],
    ];
    const results: [string, LoadResult][] = [];
    let rssPeak = rssBefore;
    for (const [name, job] of cases) {
      const sampler = setInterval(() => (rssPeak = Math.max(rssPeak, process.memoryUsage().rss)), 200);
      try {
        results.push([name, await load(job)]);
      } finally {
        clearInterval(sampler);
      }
    }
    const after = process.memoryUsage();
    const rssAfter = after.rss;

    const base = results[0][1].rps;
    const ref = results[1][1].rps;
    console.log(
      `sync invoke: ${CONCURRENCY} requests in flight, ${SECONDS} s a case (after ${WARMUP_SECONDS} s of warm-up), keep-alive; ready replicas: ${CUSTOM} ${replicas[0]}, ${CORTEX} ${replicas[1]}`,
    );
    console.log(
      `  ${"case".padEnd(26)} ${"req/s".padStart(8)} ${"p50 ms".padStart(8)} ${"p99 ms".padStart(8)} ${"errors".padStart(7)} ${"x direct".padStart(9)} ${"x proxy".padStart(8)}`,
    );
    for (const [name, r] of results) {
      console.log(
        `  ${name.padEnd(26)} ${r.rps.toFixed(0).padStart(8)} ${r.p50.toFixed(2).padStart(8)} ${r.p99.toFixed(2).padStart(8)} ${String(r.errors).padStart(7)} ${(r.rps / base).toFixed(2).padStart(9)} ${(r.rps / ref).toFixed(2).padStart(8)}`,
      );
    }
    console.log(
      `  skiff RSS: ${mb(rssBefore)} before the load, ${mb(rssAfter)} after (peak ${mb(rssPeak)}) = ${(rssAfter / rssBefore).toFixed(2)} x before; JS heap used ${mb(before.heapUsed)} -> ${mb(after.heapUsed)}`,
    );
    for (const [name, r] of results) {
      if (r.errors > 0) console.log(`  errors in ${name}:\n    ${r.samples.join("\n    ")}`);
    }
  } finally {
    await t?.close();
    await Promise.all(children.map(stop));
    await rm(tmp, { recursive: true, force: true });
  }
}

if (import.meta.url === `file://${process.argv[1]}`) await benchSyncInvoke();
