// `npx tsx bench/workers.ts [--quick] [--workers 1,2]`: sync calls to a Custom
// echo app at 32 connections (wrk) against skiff with SKIFF_WORKERS=1, then 2
// (or the counts given), each on a NATS server and data folder of its own.
// Reports calls a second, latency, and the CPU every process spent per call:
// skiff's (the supervisor, its workers, the replicas, everything below it) and
// nats-server's, from /proc. Writes bench/results/workers.json.
import { readdir, readFile, mkdtemp, rm } from "node:fs/promises";
import { cpus, loadavg, tmpdir } from "node:os";
import path from "node:path";
import { startNatsServer, type TestNats } from "../test/helpers/nats-server.js";
import { deployFolder } from "./deploy.js";
import { writeResults } from "./pipeline.js";
import { callOnNewConnection } from "../test/helpers/workers-skiff.js";
import { startSkiffProcess, waitRunHistory, type SkiffProcess } from "./skiff-process.js";
import { ECHO_SERVER, ensureTools, round, wrk } from "./tools.js";

const argv = process.argv.slice(2);
const quick = argv.includes("--quick");
const seconds = quick ? 5 : 15;
const counts = (argv[argv.indexOf("--workers") + 1] ?? "").match(/^\d+(,\d+)*$/)
  ? argv[argv.indexOf("--workers") + 1].split(",").map(Number)
  : [1, 2];
const CONNECTIONS = 32;
const APP = "echo";

/** Every process's parent, from /proc. */
async function parents(): Promise<Map<number, number>> {
  const out = new Map<number, number>();
  for (const name of await readdir("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    const stat = await readFile(`/proc/${name}/stat`, "utf8").catch(() => "");
    if (stat) out.set(Number(name), Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]));
  }
  return out;
}

/** CPU seconds (user + system) of `roots` and every process below them, by pid. */
async function treeCpu(roots: number[]): Promise<Map<number, number>> {
  const ppids = await parents();
  const inTree = (pid: number) => {
    for (let p: number | undefined = pid; p !== undefined && p > 1; p = ppids.get(p))
      if (roots.includes(p)) return true;
    return false;
  };
  const out = new Map<number, number>();
  for (const pid of ppids.keys()) {
    if (!inTree(pid)) continue;
    const stat = await readFile(`/proc/${pid}/stat`, "utf8").catch(() => "");
    if (!stat) continue;
    const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    out.set(pid, (Number(f[11]) + Number(f[12])) / 100);
  }
  return out;
}

/** Waits (up to a minute) until the processes below `roots` use less than a tenth of a core over a second. */
async function quietTree(roots: number[]): Promise<void> {
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline) {
    const before = await treeCpu(roots);
    await new Promise((r) => setTimeout(r, 1000));
    if (spent(before, await treeCpu(roots)) < 0.1) return;
  }
}

/** CPU seconds spent between two snapshots by the processes in both. */
function spent(before: Map<number, number>, after: Map<number, number>): number {
  let total = 0;
  for (const [pid, cpu] of after) total += cpu - (before.get(pid) ?? cpu);
  return total;
}

/** Calls on fresh connections until each worker has answered one (started, with a replica of its own warm). */
async function everyWorkerAnswers(skiff: SkiffProcess, url: string, workers: number): Promise<void> {
  const seen = new Set<string>();
  // Workers after the first start once it serves, each in tens of seconds on a busy machine.
  const deadline = Date.now() + 180_000;
  while (seen.size < workers) {
    if (Date.now() > deadline) throw new Error(`in 3 minutes only workers ${[...seen].join(", ")} answered`);
    const res = await callOnNewConnection(url, skiff.devToken, { data: "{}", contentType: "application/json" }).catch(
      () => undefined,
    );
    if (res?.status === 200) seen.add(res.worker ?? "1");
    await new Promise((r) => setTimeout(r, res?.status === 200 ? 100 : 500));
  }
}

interface Case {
  workers: number;
  rps: number;
  p50_ms: number;
  p99_ms: number;
  errors: number;
  /** CPU of skiff's processes (supervisor, workers, replicas) and nats-server, per call. */
  cpu_us_per_call: number;
  /** The same, skiff's processes only. */
  skiff_cpu_us_per_call: number;
  /** Cores the measured processes kept busy on average. */
  cores_busy: number;
  /** Cores they kept busy with no calls (timers, the run history's upkeep), over 3 s just before. */
  idle_cores_busy: number;
  /** The machine's 1-minute load average when the case ended: above its cores, every figure is slowed by others. */
  load_average: number;
}

async function measure(workers: number, tmp: string): Promise<Case> {
  let nats: TestNats | undefined;
  let skiff: SkiffProcess | undefined;
  try {
    nats = await startNatsServer();
    skiff = await startSkiffProcess({
      natsUrl: nats.url,
      dataDir: path.join(tmp, `data-${workers}`),
      env: { SKIFF_WORKERS: String(workers), SKIFF_MAX_QUEUED_RUNS: "10000000" },
    });
    await deployFolder(skiff, tmp, {
      "skiff.toml": [
        "[app]",
        `name = "${APP}"`,
        "[runtime]",
        'kind = "custom"',
        'command = ["node", "server.mjs"]',
        'healthcheck = "/health"',
        "[scaling]",
        "min_replicas = 1",
        "max_replicas = 2",
        "replica_concurrency = 64",
        "cooldown = 600",
        "",
      ].join("\n"),
      "server.mjs": ECHO_SERVER,
    });
    const url = `${skiff.url}/v4/p-dev/${APP}/echo`;
    await everyWorkerAnswers(skiff, url, workers);
    await waitRunHistory(skiff, APP);
    const job = {
      url,
      body: JSON.stringify({ hello: "world", n: 42 }),
      headers: { Authorization: `Bearer ${skiff.devToken}` },
      status: 200,
      connections: CONNECTIONS,
    };
    await wrk({ ...job, seconds: 3 }, tmp); // warm-up: JIT, pools, replicas
    const roots = [skiff.pid, nats.pid];
    // Every worker's start-up work done (its embedded run history made, the warm-up's runs projected).
    await quietTree(roots);
    const idleFrom = await treeCpu(roots);
    const idleStarted = performance.now();
    await new Promise((r) => setTimeout(r, 3000));
    const idle = spent(idleFrom, await treeCpu(roots)) / ((performance.now() - idleStarted) / 1000);
    const before = await treeCpu(roots);
    const started = performance.now();
    const r = await wrk({ ...job, seconds }, tmp);
    const wall = (performance.now() - started) / 1000;
    const after = await treeCpu(roots);
    const all = spent(before, after);
    const own = all - ((after.get(nats.pid) ?? 0) - (before.get(nats.pid) ?? 0));
    const result: Case = {
      workers,
      rps: r.rps,
      p50_ms: r.p50_ms,
      p99_ms: r.p99_ms,
      errors: r.errors,
      cpu_us_per_call: Math.round((all / r.requests) * 1e6),
      skiff_cpu_us_per_call: Math.round((own / r.requests) * 1e6),
      cores_busy: round(all / wall),
      idle_cores_busy: round(idle),
      load_average: round(loadavg()[0]),
    };
    console.log(
      `  SKIFF_WORKERS=${workers}: ${r.rps} calls/s  p50 ${r.p50_ms.toFixed(3)} ms  p99 ${r.p99_ms.toFixed(3)} ms  ` +
        `errors ${r.errors}  CPU ${result.cpu_us_per_call} µs/call (skiff ${result.skiff_cpu_us_per_call})  ` +
        `${result.cores_busy} cores busy (${result.idle_cores_busy} idle)  load average ${result.load_average}`,
    );
    return result;
  } finally {
    await skiff?.stop();
    await nats?.stop();
  }
}

ensureTools();
const tmp = await mkdtemp(path.join(tmpdir(), "skiff-bench-workers-"));
try {
  console.log(
    `sync Custom echo, ${CONNECTIONS} connections, ${seconds} s a case, ${cpus().length} cores (wrk and nats-server share them)`,
  );
  const cases: Case[] = [];
  for (const n of counts) cases.push(await measure(n, tmp));
  const base = cases.find((c) => c.workers === 1);
  const ratios = Object.fromEntries(
    cases.filter((c) => base && c !== base).map((c) => [`workers_${c.workers}_vs_1_rps`, round(c.rps / base!.rps)]),
  );
  const file = await writeResults("workers.json", { cores: cpus().length, connections: CONNECTIONS, cases, ratios });
  console.log(`${JSON.stringify(ratios)}\nwritten to ${path.relative(process.cwd(), file)}`);
} finally {
  await rm(tmp, { recursive: true, force: true });
}
