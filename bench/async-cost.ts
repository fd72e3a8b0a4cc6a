// `npx tsx bench/async-cost.ts [both|gateway|drain] [seconds] [rounds]`: the
// CPU an async run costs, which varies far less than a rate on a busy machine.
// `both`: one skiff process with every role takes async calls from wrk (32
// connections) and runs them; the figures are its accept rate and p99, the
// queue left when wrk stops and how fast it drains, and the CPU of skiff and
// nats-server per run from the first call to the last run's end (/proc), with
// nats-server's messages and skiff's write and read system calls (all its
// sockets and files: NATS, the replicas, the run history) per run.
// `gateway`: a process without the runner role, so only the accept path
// costs (the runs stay queued).
// `drain`: a gateway alone queues `seconds` of runs and stops; a process with
// every role then starts on its data folder and runs them: the drain's rate
// and CPU per run from the first run taken to the last (its start and its
// replicas' are not counted).
// Each round is a fresh wrk run; the median of the rounds is printed last.
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { connect } from "nats";
import { streams } from "../services/nats/layout.js";
import { startNatsServer, type TestNats } from "../test/helpers/nats-server.js";
import { deployFolder } from "./deploy.js";
import { startSkiffProcess, waitRunHistory, type SkiffProcess } from "./skiff-process.js";
import { cpuSeconds, ensureTools, freePort, quiet, round, wrk } from "./tools.js";

const mode = process.argv[2] ?? "both";
const seconds = Number(process.argv[3] ?? 5);
const rounds = Number(process.argv[4] ?? 3);
if (!["both", "gateway", "drain"].includes(mode)) throw new Error(`unknown mode ${mode}: both, gateway or drain`);
const GATEWAY_ROLES = "invocation,management,webhook";
const SCALING = "[scaling]\nmin_replicas = 1\nmax_replicas = 2\nreplica_concurrency = 64\ncooldown = 600\n";
ensureTools();

const IDLE_SECONDS = 3;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * Fails unless the newest runs succeeded (as the run history shows them, which is a batch or more behind
 * the events on a busy machine: up to 30 s): a drain that dropped or failed runs measures nothing.
 */
async function ranAll(skiff: SkiffProcess): Promise<void> {
  let bad: unknown[] = [];
  for (const deadline = Date.now() + 30_000; Date.now() < deadline; await sleep(500)) {
    const res = await fetch(`${skiff.url}/v2/projects/p-dev/apps/p-add/runs?page_size=20`, {
      headers: { authorization: `Bearer ${skiff.devToken}` },
    });
    const { runs } = (await res.json()) as { runs: { status: string }[] };
    bad = runs.filter((r) => r.status !== "success");
    if (bad.length === 0) return;
  }
  throw new Error(`runs did not succeed: ${JSON.stringify(bad.slice(0, 3))}`);
}

/** CPU seconds of skiff and nats-server, nats-server's message counters and skiff's write and read calls, at one moment. */
interface Sample {
  t: number;
  skiff: number;
  nats: number;
  in: number;
  out: number;
  writes: number;
  reads: number;
  wchar: number;
  inBytes: number;
}

/** The write and read system calls a process has made (/proc/{pid}/io: syscw, syscr). */
async function syscalls(pid: number): Promise<{ writes: number; reads: number; wchar: number }> {
  const text = await readFile(`/proc/${pid}/io`, "utf8");
  const field = (name: string) => Number(new RegExp(`^${name}: (\\d+)$`, "m").exec(text)?.[1] ?? NaN);
  return { writes: field("syscw"), reads: field("syscr"), wchar: field("wchar") };
}

/** One round on a fresh NATS server and data folder; the figures of that round. */
async function round1(): Promise<Record<string, number>> {
  const tmp = await mkdtemp(path.join(tmpdir(), "skiff-async-cost-"));
  const monitor = await freePort();
  const nats: TestNats = await startNatsServer({ args: ["-m", String(monitor)] });
  const nc = await connect({ servers: nats.url });
  const jsm = await nc.jetstreamManager();
  const queued = async () => (await jsm.streams.info(streams.runs.name)).state.messages;
  const start = (roles?: string) =>
    startSkiffProcess({
      natsUrl: nats.url,
      dataDir: path.join(tmp, "data"),
      env: { SKIFF_MAX_QUEUED_RUNS: "10000000" },
      ...(roles ? { roles } : {}),
    });
  let skiff: SkiffProcess | undefined = await start(mode === "both" ? undefined : GATEWAY_ROLES);
  // Messages into nats-server and out of it count the NATS operations of a run, whatever the machine's load.
  const sample = async (): Promise<Sample> => {
    const v = (await (await fetch(`http://127.0.0.1:${monitor}/varz`)).json()) as {
      in_msgs: number;
      out_msgs: number;
      in_bytes: number;
    };
    const [s, n, io] = [await cpuSeconds(skiff!.pid), await cpuSeconds(nats.pid), await syscalls(skiff!.pid)];
    return {
      t: performance.now() / 1000,
      skiff: s,
      nats: n,
      in: v.in_msgs,
      out: v.out_msgs,
      inBytes: v.in_bytes,
      ...io,
    };
  };
  /**
   * Per run from `a` to `b`, less what the process does idle over as long (timers, watches, heartbeats),
   * measured for IDLE_SECONDS once the runs are over: at a few hundred runs a second it is not negligible.
   */
  const idle = async (): Promise<Sample> => {
    await quiet(skiff!.pid, 60_000);
    const a = await sample();
    await sleep(IDLE_SECONDS * 1000);
    const b = await sample();
    const d = b.t - a.t;
    return {
      t: 1,
      skiff: (b.skiff - a.skiff) / d,
      nats: (b.nats - a.nats) / d,
      in: (b.in - a.in) / d,
      out: (b.out - a.out) / d,
      writes: (b.writes - a.writes) / d,
      reads: (b.reads - a.reads) / d,
      wchar: (b.wchar - a.wchar) / d,
      inBytes: (b.inBytes - a.inBytes) / d,
    };
  };
  const cost = (a: Sample, b: Sample, runs: number, rate: Sample) => {
    const d = b.t - a.t;
    const net = (k: keyof Sample) => (b[k] - a[k] - rate[k] * d) / runs;
    return {
      skiff_us_per_run: Math.round(net("skiff") * 1e6),
      nats_us_per_run: Math.round(net("nats") * 1e6),
      nats_in_per_run: round(net("in"), 2),
      nats_out_per_run: round(net("out"), 2),
      skiff_writes_per_run: round(net("writes"), 2),
      skiff_reads_per_run: round(net("reads"), 2),
      skiff_wbytes_per_run: Math.round(net("wchar")),
      nats_in_bytes_per_run: Math.round(net("inBytes")),
    };
  };
  try {
    await deployFolder(skiff, tmp, {
      "skiff.toml": `[app]\nname = "p-add"\n[runtime]\nkind = "cortex"\nlanguage = "node"\nentry = "index.mjs"\n${SCALING}`,
      "index.mjs": "export function add({ a, b }) { return a + b; }\n",
    });
    const job = {
      url: `${skiff.url}/v4/p-dev/p-add/add?async=true`,
      body: '{"a":1,"b":2}',
      headers: { Authorization: `Bearer ${skiff.devToken}` },
      status: 202,
      connections: 32,
    };
    await waitRunHistory(skiff, "p-add");
    const drained = async () => {
      while ((await queued()) > 0) await sleep(20);
    };
    // Warm-up: JIT, replicas, the run history's table.
    await wrk({ ...job, seconds: 2 }, tmp);
    if (mode === "both") await drained();
    await quiet(skiff.pid, 60_000);
    const before = await sample();
    const r = await wrk({ ...job, seconds }, tmp);
    const row: Record<string, number> = {
      accept_per_s: r.rps,
      p50_ms: round(r.p50_ms, 1),
      p99_ms: round(r.p99_ms, 1),
      errors: r.errors,
      runs: r.requests,
    };
    if (mode === "gateway") {
      const after = await sample();
      return { ...row, ...cost(before, after, r.requests, await idle()) };
    }
    if (mode === "both") {
      const acceptEnd = await sample();
      const backlog = await queued();
      await drained();
      const after = await sample();
      await ranAll(skiff);
      const rate = await idle();
      return {
        ...row,
        backlog,
        drain_per_s: backlog > 0 ? Math.round(backlog / (after.t - acceptEnd.t)) : 0,
        ...cost(before, after, r.requests, rate),
        skiff_us_per_run_while_accepting: cost(before, acceptEnd, r.requests, rate).skiff_us_per_run,
      };
    }
    // drain: the gateway's backlog (the warm-up's runs too), run by a process with every role.
    await skiff.stop();
    skiff = undefined;
    const backlog = await queued();
    skiff = await start();
    let left = backlog;
    while (left === backlog) {
      await sleep(5);
      left = await queued();
    }
    const from = await sample();
    await drained();
    const to = await sample();
    await ranAll(skiff);
    return { backlog: left, drain_per_s: Math.round(left / (to.t - from.t)), ...cost(from, to, left, await idle()) };
  } finally {
    await nc.close();
    await skiff?.stop();
    await nats.stop();
    await rm(tmp, { recursive: true, force: true });
  }
}

const results: Record<string, number>[] = [];
for (let i = 0; i < rounds; i++) {
  const row = await round1();
  console.log(JSON.stringify(row));
  results.push(row);
}
const median = (k: string) => results.map((r) => r[k]).sort((a, b) => a - b)[Math.floor(results.length / 2)];
console.log(
  `${mode}, median of ${rounds}: ${JSON.stringify(Object.fromEntries(Object.keys(results[0]).map((k) => [k, median(k)])))}`,
);
