// `npm run soak`: mixed load for SOAK_SECONDS (default 600): sync calls of a
// Custom and a Cortex app, async runs, and sync calls with a webhook to a
// local receiver, each from its own wrk. Prints the errors of each kind and
// the RSS of skiff's processes after warm-up and at the end, and writes
// bench/results/soak.json (read by `npm run bench` for rss_mb.after_soak).
//
// `npm run soak -- --cluster` runs the same load on the topology of
// `npm run cluster` (three NATS nodes, two gateways, two runners, two webhook
// processes; started here as `scripts/cluster.ts` is started by hand, on
// ports of its own) through its nginx, and writes bench/results/soak-cluster.json
// with every process's RSS.
//
// Every SOAK_SAMPLE_SECONDS (default 60) it prints, and keeps in the results
// as `samples`, each process's RSS and the state of every JetStream stream
// (messages, bytes, subjects, interior deletes, consumers): what grows, and
// whether it levels off; and every store's bytes against its budget (streams,
// buckets and object stores from NATS, the run history from /metrics). A
// store past its budget at any sample fails the soak, as does an accepted
// async run that never ended (lost), counted once the queue has drained.
//
// SOAK_BUDGET (e.g. `20MB`) sets every store's budget (SKIFF_*_MAX_BYTES) to
// it, so that a short soak runs with every store at its budget; unset, each
// has its default (a share of the free disk).
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtemp, readFile, readdir, rm } from "node:fs/promises";
import http from "node:http";
import { tmpdir } from "node:os";
import path from "node:path";
import { connect, type ConnectionOptions } from "nats";
import { startNatsServer } from "../test/helpers/nats-server.js";
import { deployFolder } from "./deploy.js";
import { writeResults } from "./pipeline.js";
import { startSkiffProcess } from "./skiff-process.js";
import { ECHO_SERVER, ensureTools, freePort, round, rssMb, wrk } from "./tools.js";

const SECONDS = Number(process.env.SOAK_SECONDS ?? 600);
/**
 * Load before the first RSS figure: three minutes for a full soak, because
 * NATS holds state by time window, not by run (two minutes of message ids for
 * deduplication, ended runs' records and deliveries for a minute), so its
 * memory reaches its level only after that much load (SOAK_WARMUP_SECONDS;
 * the samples show the climb).
 */
const WARMUP_SECONDS = Number(
  process.env.SOAK_WARMUP_SECONDS ?? (SECONDS >= 600 ? 180 : Math.max(5, Math.round(SECONDS / 10))),
);
const P = "p-dev";
/** Every store's budget, when SOAK_BUDGET names one. */
const BUDGET_ENV: Record<string, string> = process.env.SOAK_BUDGET
  ? Object.fromEntries(
      [
        "SKIFF_EVENTS_MAX_BYTES",
        "SKIFF_WEBHOOKS_MAX_BYTES",
        "SKIFF_RUN_QUEUE_MAX_BYTES",
        "SKIFF_LOGS_MAX_BYTES",
        "SKIFF_RESULTS_MAX_BYTES",
        "SKIFF_BUNDLES_MAX_BYTES",
        "SKIFF_KV_MAX_BYTES",
        "SKIFF_HISTORY_MAX_BYTES",
      ].map((name) => [name, process.env.SOAK_BUDGET!]),
    )
  : {};
const CLUSTER = process.argv.includes("--cluster");
const ROOT = path.resolve(import.meta.dirname, "..");

/** What the load is aimed at, and the skiff processes whose memory is watched. */
interface Target {
  url: string;
  devToken: string;
  /** How to reach its NATS (one node of the cluster). */
  nats: ConnectionOptions;
  /** A token that may read /metrics. */
  adminToken(): Promise<string>;
  /** Process name to pid, for the RSS figures. */
  processes(): Promise<Record<string, number>>;
  stop(): Promise<void>;
}

async function single(tmp: string): Promise<Target> {
  const nats = await startNatsServer();
  const skiff = await startSkiffProcess({
    natsUrl: nats.url,
    dataDir: path.join(tmp, "data"),
    env: { SKIFF_MAX_QUEUED_RUNS: "10000000", ...BUDGET_ENV },
  });
  return {
    url: skiff.url,
    devToken: skiff.devToken,
    nats: { servers: nats.url },
    adminToken: async () => skiff.adminToken,
    processes: async () => ({ skiff: skiff.pid, "nats-server": nats.pid }),
    async stop() {
      await skiff.stop();
      await nats.stop();
    },
  };
}

/** `scripts/cluster.ts` as `npm run cluster` starts it, in a folder and on ports of its own. */
async function cluster(tmp: string): Promise<Target> {
  const dir = path.join(tmp, "cluster");
  let port = await freePort();
  // The script takes the port and the two after it (the gateways).
  while (port > 65_000) port = await freePort();
  const child: ChildProcess = spawn(process.execPath, ["--import", "tsx", path.join(ROOT, "scripts", "cluster.ts")], {
    cwd: ROOT,
    env: {
      ...process.env,
      SKIFF_CLUSTER_DIR: dir,
      SKIFF_CLUSTER_PORT: String(port),
      SKIFF_MAX_QUEUED_RUNS: "10000000",
      ...BUDGET_ENV,
    },
    stdio: ["ignore", "pipe", "inherit"],
  });
  await new Promise<void>((resolve, reject) => {
    let out = "";
    child.once("exit", (code) => reject(new Error(`npm run cluster exited (${code}):\n${out.slice(-3000)}`)));
    child.stdout!.on("data", (d: Buffer) => {
      out += d.toString();
      process.stdout.write(d);
      if (out.includes("[cluster] ready.")) resolve();
    });
  });
  child.stdout!.removeAllListeners("data");
  child.stdout!.resume();
  // The nodes' configuration names the listen address and the credentials.
  const conf = await readFile(path.join(dir, "nats", "n1", "nats.conf"), "utf8");
  const field = (name: string) => new RegExp(`${name}: ("[^"]*"|\\S+)`).exec(conf)?.[1].replace(/^"|"$/g, "");
  return {
    url: `http://127.0.0.1:${port}`,
    devToken: (await readFile(path.join(dir, "dev-token"), "utf8")).trim(),
    nats: { servers: `nats://${field("listen")}`, user: field("user"), pass: field("password") },
    adminToken: async () => (await readFile(path.join(dir, "admin-token"), "utf8")).trim(),
    processes: () => clusterProcesses(dir),
    async stop() {
      const exited = new Promise((r) => child.once("exit", r));
      child.kill("SIGINT");
      await exited;
    },
  };
}

/** The cluster's skiff processes (by their data folder) and nats-servers, by name. */
async function clusterProcesses(dir: string): Promise<Record<string, number>> {
  const found: Record<string, number> = {};
  for (const pid of await readdir("/proc")) {
    if (!/^\d+$/.test(pid)) continue;
    const env = await readFile(`/proc/${pid}/environ`, "utf8").catch(() => "");
    const cmd = await readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => "");
    const data = /(?:^|\0)SKIFF_DATA_DIR=([^\0]+)/.exec(env)?.[1];
    if (data?.startsWith(dir + path.sep) && cmd.includes("skiff-server.js")) found[path.basename(data)] = Number(pid);
    else if (cmd.startsWith("nats-server") || cmd.includes("/nats-server\0")) {
      const conf = /\0-c\0([^\0]+)/.exec(cmd)?.[1] ?? /--config\0([^\0]+)/.exec(cmd)?.[1];
      if (conf?.startsWith(dir + path.sep)) found[`nats-${path.basename(path.dirname(conf))}`] = Number(pid);
    }
  }
  return found;
}

async function rssOf(target: Target): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const [name, pid] of Object.entries(await target.processes()).sort())
    out[name] = await rssMb(pid).catch(() => NaN);
  return out;
}

interface StreamSample {
  messages: number;
  mb: number;
  subjects: number;
  deleted: number;
  consumers: number;
}

/** Every stream's state, by name. */
async function streamStates(opts: ConnectionOptions): Promise<Record<string, StreamSample>> {
  const nc = await connect({ ...opts, timeout: 5_000 });
  try {
    const jsm = await nc.jetstreamManager({ timeout: 10_000 });
    const out: Record<string, StreamSample> = {};
    for await (const si of jsm.streams.list()) {
      const st = si.state;
      out[si.config.name] = {
        messages: st.messages,
        mb: round(st.bytes / 2 ** 20, 1),
        subjects: st.num_subjects ?? 0,
        deleted: st.num_deleted ?? 0,
        consumers: st.consumer_count,
      };
    }
    return out;
  } finally {
    await nc.close();
  }
}

interface StoreSample {
  mb: number;
  budget_mb: number;
}

/** One /metrics sample of a skiff process: value by metric name and the labels given. */
function metric(text: string, name: string, labels: Record<string, string>): number | undefined {
  for (const line of text.split("\n")) {
    if (!line.startsWith(`${name}{`)) continue;
    if (Object.entries(labels).every(([k, v]) => line.includes(`${k}="${v}"`)))
      return Number(line.slice(line.lastIndexOf(" ") + 1));
  }
  return undefined;
}

async function metricsText(target: Target): Promise<string> {
  const res = await fetch(`${target.url}/metrics`, {
    headers: { authorization: `Bearer ${await target.adminToken()}` },
  });
  return res.ok ? res.text() : "";
}

/**
 * Every store's bytes and budget: the streams (and buckets and object stores,
 * streams too) as NATS says now, the run history as skiff last measured it.
 */
async function storeStates(target: Target): Promise<Record<string, StoreSample>> {
  const out: Record<string, StoreSample> = {};
  const nc = await connect({ ...target.nats, timeout: 5_000 });
  try {
    const jsm = await nc.jetstreamManager({ timeout: 10_000 });
    for await (const si of jsm.streams.list()) {
      const name = si.config.name.replace(/^(KV|OBJ)_/, "");
      out[name] = {
        mb: round(si.state.bytes / 2 ** 20, 2),
        budget_mb: round(Math.max(0, si.config.max_bytes) / 2 ** 20, 2),
      };
    }
  } finally {
    await nc.close();
  }
  const text = await metricsText(target);
  const bytes = metric(text, "skiff_store_bytes", { store: "run-history" });
  const budget = metric(text, "skiff_store_budget_bytes", { store: "run-history" });
  if (bytes !== undefined && budget !== undefined)
    out["run-history"] = { mb: round(bytes / 2 ** 20, 2), budget_mb: round(budget / 2 ** 20, 2) };
  return out;
}

/** Stores past their budget in a sample, as "name mb/budget". */
const overBudget = (stores: Record<string, StoreSample>) =>
  Object.entries(stores)
    .filter(([, s]) => s.budget_mb > 0 && s.mb > s.budget_mb)
    .map(([n, s]) => `${n} ${s.mb}/${s.budget_mb} MB`);

const SAMPLE_SECONDS = Number(process.env.SOAK_SAMPLE_SECONDS ?? 60);
const samples: {
  seconds: number;
  rss_mb: Record<string, number>;
  streams: Record<string, StreamSample>;
  stores: Record<string, StoreSample>;
}[] = [];
/** Every sample in which a store was past its budget. */
const overruns: string[] = [];

/**
 * Samples RSS and streams every SAMPLE_SECONDS until the returned function is
 * called; times count from `startsInSeconds` from now (negative in a warm-up).
 */
function sampleEvery(target: Target, startsInSeconds: number): () => Promise<void> {
  const from = Date.now() + startsInSeconds * 1000;
  let busy: Promise<void> = Promise.resolve();
  const take = () =>
    (busy = busy.then(async () => {
      const sample = {
        seconds: Math.round((Date.now() - from) / 1000),
        rss_mb: await rssOf(target),
        streams: await streamStates(target.nats).catch(() => ({})),
        stores: await storeStates(target).catch(() => ({})),
      };
      samples.push(sample);
      const over = overBudget(sample.stores);
      if (over.length > 0) overruns.push(`${sample.seconds} s: ${over.join(", ")}`);
      const storeText = Object.entries(sample.stores)
        .filter(([, s]) => s.mb >= 0.1)
        .map(([n, s]) => `${n} ${s.mb}/${s.budget_mb}`)
        .join("; ");
      const streamText = Object.entries(sample.streams)
        .filter(([, s]) => s.subjects > 100 || s.mb > 10)
        .map(([n, s]) => `${n} ${s.messages} msgs/${s.subjects} subjects/${s.mb} MB/${s.deleted} deleted`)
        .join("; ");
      console.log(`soak: ${sample.seconds} s rss ${JSON.stringify(sample.rss_mb)} streams: ${streamText}`);
      console.log(`soak: ${sample.seconds} s stores (MB used/budget): ${storeText}`);
    }));
  void take();
  const timer = setInterval(take, SAMPLE_SECONDS * 1000);
  return async () => {
    clearInterval(timer);
    await take();
  };
}

ensureTools();
const tmp = await mkdtemp(path.join(tmpdir(), "skiff-soak-"));
const target = await (CLUSTER ? cluster(tmp) : single(tmp));
const skiff = target;
const receiver = http.createServer((req, res) => {
  req.resume();
  req.on("end", () => res.end("ok"));
});
try {
  const scaling = "min_replicas = 1\nmax_replicas = 2\nreplica_concurrency = 64\ncooldown = 600";
  await deployFolder(skiff, tmp, {
    "skiff.toml": `[app]\nname = "soak-echo"\n[runtime]\nkind = "custom"\ncommand = ["node", "server.mjs"]\n[scaling]\n${scaling}\n`,
    "server.mjs": ECHO_SERVER,
  });
  await deployFolder(skiff, tmp, {
    "skiff.toml": `[app]\nname = "soak-add"\n[runtime]\nkind = "cortex"\nlanguage = "node"\nentry = "index.mjs"\n[scaling]\n${scaling}\n`,
    "index.mjs": "export function add({ a, b }) { return a + b; }\n",
  });
  await new Promise<void>((r) => receiver.listen(0, "127.0.0.1", r));
  const hook = encodeURIComponent(`http://127.0.0.1:${(receiver.address() as { port: number }).port}/hook`);
  const auth = { Authorization: `Bearer ${skiff.devToken}` };
  const body = JSON.stringify({ a: 1, b: 2 });
  // Every runner must have the apps before the load starts (a gateway answers 503 until one does).
  for (const app of ["soak-echo/echo", "soak-add/add"]) {
    const deadline = Date.now() + 60_000;
    for (let ok = 0; ok < 10;) {
      const res = await fetch(`${skiff.url}/v4/${P}/${app}`, {
        method: "POST",
        headers: { ...auth, "content-type": "application/json" },
        body,
      });
      await res.arrayBuffer();
      if (res.status === 200) ok++;
      else if (Date.now() > deadline) throw new Error(`${app} answered ${res.status}`);
      else await new Promise((r) => setTimeout(r, 250));
    }
  }
  const mix = (seconds: number) =>
    Promise.all([
      wrk(
        { url: `${skiff.url}/v4/${P}/soak-echo/echo`, body, headers: auth, status: 200, connections: 8, seconds },
        tmp,
      ),
      wrk({ url: `${skiff.url}/v4/${P}/soak-add/add`, body, headers: auth, status: 200, connections: 8, seconds }, tmp),
      wrk(
        {
          url: `${skiff.url}/v4/${P}/soak-add/add?async=true`,
          body,
          headers: auth,
          status: 202,
          connections: 4,
          seconds,
        },
        tmp,
      ),
      wrk(
        {
          url: `${skiff.url}/v4/${P}/soak-add/add?webhookEndpoint=${hook}`,
          body,
          headers: auth,
          status: 200,
          connections: 2,
          seconds,
        },
        tmp,
      ),
    ]);
  console.log(
    `soak: warm-up ${WARMUP_SECONDS} s (samples from -${WARMUP_SECONDS} s), then ${SECONDS} s of mixed load${CLUSTER ? " on the cluster" : ""}`,
  );
  const sampled = sampleEvery(target, WARMUP_SECONDS);
  const warm = await mix(WARMUP_SECONDS);
  const start = await rssOf(target);
  const [sync, cortex, accepted, hooked] = await mix(SECONDS);
  await sampled();
  const end = await rssOf(target);
  // Lost runs: async runs accepted (202; wrk counts the answers it got) that never ended, once the queue is empty.
  const acceptedRuns = warm[2].requests - warm[2].errors + accepted.requests - accepted.errors;
  // Counted from this process's runs_total: on the cluster, runners record their runs in their own processes.
  const drainDeadline = Date.now() + 120_000;
  let ended = 0;
  for (; !CLUSTER;) {
    const text = await metricsText(target);
    ended = ["success", "failure", "cancelled"]
      .map((status) => metric(text, "skiff_runs_total", { app: "soak-add", status, mode: "async" }) ?? 0)
      .reduce((a, b) => a + b, 0);
    const queued = (await streamStates(target.nats))["SKIFF_RUNS"]?.messages ?? 0;
    if ((queued === 0 && ended >= acceptedRuns) || Date.now() > drainDeadline) break;
    await new Promise((r) => setTimeout(r, 1000));
  }
  const lost = CLUSTER ? 0 : Math.max(0, acceptedRuns - ended);
  const total = (r: Record<string, number>) => Object.values(r).reduce((a, b) => a + b, 0);
  const ratios = Object.fromEntries(Object.keys(end).map((k) => [k, Number((end[k] / start[k]).toFixed(2))]));
  const result = {
    topology: CLUSTER
      ? "cluster: 3 NATS nodes, 2 gateways behind nginx, 2 runners, 2 webhook processes"
      : "one process",
    seconds: SECONDS,
    requests: { custom: sync.requests, cortex: cortex.requests, async: accepted.requests, webhook: hooked.requests },
    errors: { custom: sync.errors, cortex: cortex.errors, async: accepted.errors, webhook: hooked.errors },
    async_runs: CLUSTER ? "not counted on the cluster" : { accepted: acceptedRuns, ended, lost },
    budget: process.env.SOAK_BUDGET ?? "defaults",
    stores_over_budget: overruns,
    rss_mb: CLUSTER
      ? { start, end, ratio_by_process: ratios, ratio: Number((total(end) / total(start)).toFixed(2)) }
      : { start: start.skiff, end: end.skiff, ratio: ratios.skiff },
    samples,
  };
  console.log(JSON.stringify(result, null, 2));
  await writeResults(CLUSTER ? "soak-cluster.json" : "soak.json", result);
  const failures = [
    ...overruns.map((o) => `a store past its budget at ${o}`),
    ...(lost > 0 ? [`${lost} accepted async runs never ended`] : []),
  ];
  if (failures.length > 0) {
    console.error(`soak: FAILED: ${failures.join("; ")}`);
    process.exitCode = 1;
  }
} finally {
  receiver.close();
  await target.stop();
  await rm(tmp, { recursive: true, force: true });
}
