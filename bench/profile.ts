// `npx tsx bench/profile.ts [sync|async|accept|drain|custom] [seconds]`: runs skiff
// under `node --cpu-prof` with one kind of load from wrk (`accept`: async
// calls to a process without the runner role, the accept path alone;
// `drain`: such a process queues `seconds` of async calls and stops, and one
// with every role, profiled, runs them: the measured run is from the first run
// taken to the queue's end, "per request" is per run drained), then
// prints req/s, the CPU that skiff and nats-server used, and where skiff's
// main thread spent its time during the measured run only (self time by
// function and by file), for the profile that should come before an
// optimisation. PROFILE_CALLERS=fn1,fn2 also prints who calls those
// functions (PROFILE_DEPTH frames up, default 6); PROFILE_TOP=n lists n functions
// by self time (default 25); PROFILE_THREAD=n looks at thread n
// (its number in the profile's file name) instead of the main thread.
// It also prints the CPU per request of each of skiff's threads (the main
// thread, the run history's, V8's) and its user and system time, from
// /proc; PROFILE_OFF=1 runs skiff without the profiler, for those figures
// without its overhead, and prints nothing else. PROFILE_KEEP=dir keeps the
// profiles in dir (Chrome's DevTools open them). The bytes skiff's main
// thread allocates on the JS heap per request come from bench/alloc-probe.mjs;
// PROFILE_HEAP=file.heapprofile also keeps where they were allocated
// (sampled) and prints the functions that allocated most.
import { cp, mkdtemp, readdir, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { connect } from "nats";
import { streams } from "../services/nats/layout.js";
import { startNatsServer } from "../test/helpers/nats-server.js";
import { deployFolder } from "./deploy.js";
import { startSkiffProcess, waitRunHistory } from "./skiff-process.js";
import { ALLOC_PROBE, cpuSeconds, ECHO_SERVER, ensureTools, processCost, wrk } from "./tools.js";

const kind = process.argv[2] ?? "async";
/** The checkout's folder, which the profile's file names start with. */
const ROOT = path.resolve(import.meta.dirname, "..");
const seconds = Number(process.argv[3] ?? 8);
ensureTools();
/** The measured run, on the monotonic clock in µs, as V8's profiles time their samples. */
const window = { from: 0, to: 0 };
const microseconds = () => Number(process.hrtime.bigint() / 1000n);
const tmp = await mkdtemp(path.join(tmpdir(), "skiff-profile-"));
const profDir = path.join(tmp, "prof");
const allocFile = path.join(tmp, "alloc.json");
// Not an earlier run's: printAllocations reads it once it parses.
if (process.env.PROFILE_HEAP) await rm(path.resolve(process.env.PROFILE_HEAP), { force: true });
const nats = await startNatsServer();
const GATEWAY_ROLES = "invocation,management,webhook";
/** The process to profile; with `drain`, a gateway alone queues the runs first (not profiled). */
const startProfiled = () =>
  startSkiffProcess({
    natsUrl: nats.url,
    dataDir: path.join(tmp, "data"),
    env: {
      SKIFF_MAX_QUEUED_RUNS: "10000000",
      SKIFF_BENCH_ALLOC_FILE: allocFile,
      ...(process.env.PROFILE_HEAP ? { SKIFF_BENCH_HEAP_PROFILE: path.resolve(process.env.PROFILE_HEAP) } : {}),
    },
    nodeArgs: [
      // PROFILE_NODE_ARGS: more options for skiff's node (V8's, say), space-separated.
      ...(process.env.PROFILE_NODE_ARGS ?? "").split(" ").filter(Boolean),
      "--import",
      ALLOC_PROBE,
      ...(process.env.PROFILE_OFF === "1" ? [] : ["--cpu-prof", `--cpu-prof-dir=${profDir}`]),
    ],
    // `accept`: async calls to a process without the runner role, so the queue only fills: the accept path alone.
    ...(kind === "accept" ? { roles: GATEWAY_ROLES } : {}),
  });
let skiff =
  kind === "drain"
    ? await startSkiffProcess({
        natsUrl: nats.url,
        dataDir: path.join(tmp, "data"),
        env: { SKIFF_MAX_QUEUED_RUNS: "10000000" },
        roles: GATEWAY_ROLES,
      })
    : await startProfiled();
// The server runs bundled (bin/bundle.js): esbuild marks where each source file's code starts in the bundle
// with a `// services/…` line, so a frame of the bundle is named by the file its line came from.
const BUNDLE = path.join(ROOT, "node_modules", ".cache", "skiff", "server.mjs");
const bundleFiles: { line: number; file: string }[] = [];
(await readFile(BUNDLE, "utf8").catch(() => ""))
  .split("\n")
  .forEach(
    (text, i) => /^\/\/ ((services|gen)\/\S+\.ts)$/.test(text) && bundleFiles.push({ line: i, file: text.slice(3) }),
  );
/** The source file (as `services/…`) of a bundle's frame, or the frame's own url less `file://`. */
function sourceOf(n: { callFrame: { url: string; lineNumber: number } }): string {
  const url = n.callFrame.url.replace(/^file:\/\//, "");
  if (url !== BUNDLE) return url;
  let lo = 0;
  let hi = bundleFiles.length - 1;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (bundleFiles[mid].line <= n.callFrame.lineNumber) lo = mid;
    else hi = mid - 1;
  }
  return bundleFiles[lo] ? `${ROOT}/${bundleFiles[lo].file}` : url;
}
try {
  const scaling = "[scaling]\nmin_replicas = 1\nmax_replicas = 2\nreplica_concurrency = 64\ncooldown = 600\n";
  await deployFolder(skiff, tmp, {
    "skiff.toml": `[app]\nname = "p-add"\n[runtime]\nkind = "cortex"\nlanguage = "node"\nentry = "index.mjs"\n${scaling}`,
    "index.mjs": "export function add({ a, b }) { return a + b; }\n",
  });
  await deployFolder(skiff, tmp, {
    "skiff.toml": `[app]\nname = "p-echo"\n[runtime]\nkind = "custom"\ncommand = ["node", "server.mjs"]\n${scaling}`,
    "server.mjs": ECHO_SERVER,
  });
  const url = {
    sync: `${skiff.url}/v4/p-dev/p-add/add`,
    async: `${skiff.url}/v4/p-dev/p-add/add?async=true`,
    drain: `${skiff.url}/v4/p-dev/p-add/add?async=true`,
    accept: `${skiff.url}/v4/p-dev/p-add/add?async=true`,
    custom: `${skiff.url}/v4/p-dev/p-echo/echo`,
  }[kind]!;
  const status = kind === "async" || kind === "accept" || kind === "drain" ? 202 : 200;
  const job = {
    url,
    body: '{"a":1,"b":2}',
    headers: { Authorization: `Bearer ${skiff.devToken}` },
    status,
    // PROFILE_CONNECTIONS=1: the cost of one request with nothing else waiting.
    connections: Number(process.env.PROFILE_CONNECTIONS ?? 32),
  };
  await waitRunHistory(skiff, "p-add");
  await wrk({ ...job, seconds: 3 }, tmp);
  /** `drain`: the gateway's queue (warm-up included) and the wrk figures of the calls that filled it. */
  let work = () => wrk({ ...job, seconds }, tmp);
  if (kind === "drain") {
    const r = await wrk({ ...job, seconds }, tmp);
    await skiff.stop();
    const nc = await connect({ servers: nats.url });
    const jsm = await nc.jetstreamManager();
    const queued = async () => (await jsm.streams.info(streams.runs.name)).state.messages;
    const backlog = await queued();
    skiff = await startProfiled();
    // The measured run starts with the first run taken (the process's start and its replicas' are not in it).
    while ((await queued()) === backlog) await new Promise((res) => setTimeout(res, 5));
    const left = await queued();
    work = async () => {
      while ((await queued()) > 0) await new Promise((res) => setTimeout(res, 20));
      await nc.close();
      return { ...r, requests: left, rps: 0 };
    };
  }
  const threadsBefore = await threadTicks(skiff.pid);
  const ioBefore = await syscalls(skiff.pid);
  const before = [await cpuSeconds(skiff.pid), await cpuSeconds(nats.pid)];
  window.from = microseconds();
  const { result: r, heapBytes } = await processCost(skiff.pid, allocFile, work);
  window.to = microseconds();
  if (kind === "drain") r.rps = Math.round(r.requests / ((window.to - window.from) / 1e6));
  const after = [await cpuSeconds(skiff.pid), await cpuSeconds(nats.pid)];
  const ioAfter = await syscalls(skiff.pid);
  const threadsAfter = await threadTicks(skiff.pid);
  const share = (i: number) => `${Math.round((100 * (after[i] - before[i])) / ((window.to - window.from) / 1e6))}%`;
  console.log(`${kind}: ${r.rps} req/s, p50 ${r.p50_ms} ms, p99 ${r.p99_ms} ms, errors ${r.errors}`);
  // CPU per request varies less than req/s when other work shares the machine.
  const perCall = (i: number) => `${Math.round(((after[i] - before[i]) * 1e6) / r.requests)} µs`;
  console.log(
    `CPU over the run (100% = one core): skiff ${share(0)}, nats-server ${share(1)}; per request: skiff ${perCall(0)}, nats-server ${perCall(1)}`,
  );
  // Writes and reads (sockets included) skiff's threads made, a figure the machine's load does not change.
  const perRequest = (n: number) => (n / r.requests).toFixed(2);
  console.log(
    `system calls per request: ${perRequest(ioAfter.writes - ioBefore.writes)} writes, ${perRequest(ioAfter.reads - ioBefore.reads)} reads`,
  );
  console.log(
    `allocated per request on skiff's main thread's heap: ${Math.round((heapBytes ?? NaN) / r.requests)} bytes`,
  );
  if (process.env.PROFILE_HEAP) await printAllocations(path.resolve(process.env.PROFILE_HEAP), r.requests);
  // Clock ticks are hundredths of a second: µs per request = ticks * 10,000 / requests.
  const us = (ticks: number) => Math.round((ticks * 10_000) / r.requests);
  const threads = [...threadsAfter]
    .map(([id, t]) => ({
      id,
      name: t.name,
      ticks: t.user + t.system - (threadsBefore.get(id)?.user ?? 0) - (threadsBefore.get(id)?.system ?? 0),
    }))
    .filter((t) => us(t.ticks) >= 1)
    .sort((a, b) => b.ticks - a.ticks);
  const sum = (k: "user" | "system") =>
    [...threadsAfter].reduce((n, [id, t]) => n + t[k] - (threadsBefore.get(id)?.[k] ?? 0), 0);
  console.log(
    `skiff's threads, µs per request: ${threads.map((t) => `${t.id === skiff.pid ? "main" : `${t.name}[${t.id}]`} ${us(t.ticks)}`).join(", ")}; user ${us(sum("user"))}, system ${us(sum("system"))}`,
  );
} finally {
  await skiff.stop();
  await nats.stop();
}

interface HeapNode {
  callFrame: { functionName: string; url: string; lineNumber: number };
  selfSize: number;
  children: HeapNode[];
}

/** The functions that allocated most in a sampled heap profile (alloc-probe.mjs), in bytes per request. */
async function printAllocations(file: string, requests: number): Promise<void> {
  // The probe may still be writing it: read until it parses.
  let profile: { head: HeapNode } | undefined;
  for (let i = 0; i < 200 && !profile; i++) {
    try {
      profile = JSON.parse(await readFile(file, "utf8")) as { head: HeapNode };
    } catch {
      await new Promise((r) => setTimeout(r, 100));
    }
  }
  if (!profile) return console.log(`no heap profile in ${file}`);
  const bySite = new Map<string, number>();
  const name = (n: HeapNode) =>
    `${n.callFrame.functionName || "(anonymous)"} ${sourceOf(n)
      .replace(`${ROOT}/`, "")
      .replace(/.*\/node_modules\//, "npm:")}:${n.callFrame.lineNumber + 1}`;
  const walk = (n: HeapNode, caller: string) => {
    const here = name(n);
    const site = `${here} < ${caller}`;
    bySite.set(site, (bySite.get(site) ?? 0) + n.selfSize);
    for (const c of n.children) walk(c, here);
  };
  walk(profile.head, "");
  const top = [...bySite].sort((a, b) => b[1] - a[1]).slice(0, 40);
  console.log(
    `allocations by function (< its caller), bytes per request:\n${top.map(([k, v]) => `  ${String(Math.round(v / requests)).padStart(6)}  ${k}`).join("\n")}`,
  );
}

/** Read and write system calls a process made so far (/proc/<pid>/io: syscr, syscw). */
async function syscalls(pid: number): Promise<{ reads: number; writes: number }> {
  const text = await readFile(`/proc/${pid}/io`, "utf8");
  const field = (name: string) => Number(new RegExp(`^${name}: (\\d+)`, "m").exec(text)?.[1] ?? NaN);
  return { reads: field("syscr"), writes: field("syscw") };
}

/** CPU clock ticks (user, system) of each thread of a process, by thread id. */
async function threadTicks(pid: number): Promise<Map<number, { name: string; user: number; system: number }>> {
  const out = new Map<number, { name: string; user: number; system: number }>();
  for (const id of await readdir(`/proc/${pid}/task`)) {
    const text = await readFile(`/proc/${pid}/task/${id}/stat`, "utf8").catch(() => undefined);
    if (text === undefined) continue; // ended meanwhile
    const fields = text.slice(text.lastIndexOf(")") + 2).split(" ");
    const name = text.slice(text.indexOf("(") + 1, text.lastIndexOf(")"));
    out.set(Number(id), { name, user: Number(fields[11]), system: Number(fields[12]) });
  }
  return out;
}

interface Node {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  children?: number[];
}
interface Profile {
  nodes: Node[];
  startTime: number;
  samples: number[];
  timeDeltas: number[];
}

/** Samples per node id taken within the measured run (V8 and process.hrtime share the monotonic clock). */
function samplesInWindow(p: Profile): Map<number, number> {
  const hits = new Map<number, number>();
  let t = p.startTime;
  for (let i = 0; i < p.samples.length; i++) {
    t += p.timeDeltas[i];
    if (t >= window.from && t <= window.to) hits.set(p.samples[i], (hits.get(p.samples[i]) ?? 0) + 1);
  }
  return hits;
}

if (process.env.PROFILE_OFF === "1") {
  await rm(tmp, { recursive: true, force: true });
  process.exit(0);
}
const byName = new Map<number, Node>();
const parents = new Map<number, number>();
const threads: { name: string; hits: Map<number, number>; busy: number; total: number }[] = [];
for (const f of (await readdir(profDir)).filter((f) => f.endsWith(".cpuprofile"))) {
  const p = JSON.parse(await readFile(path.join(profDir, f), "utf8")) as Profile;
  const hits = samplesInWindow(p);
  const nodes = new Map(p.nodes.map((n) => [n.id, n]));
  let busy = 0;
  let total = 0;
  for (const [id, n] of hits) {
    total += n;
    if (nodes.get(id)!.callFrame.functionName !== "(idle)") busy += n;
  }
  // Node ids are per profile: keep each profile's nodes under ids of their own.
  const offset = threads.length * 1e7;
  const shifted = new Map<number, number>();
  for (const [id, n] of hits) shifted.set(id + offset, n);
  for (const n of p.nodes) {
    byName.set(n.id + offset, n);
    for (const child of n.children ?? []) parents.set(child + offset, n.id + offset);
  }
  threads.push({ name: f, hits: shifted, busy, total });
}
threads.sort((a, b) => b.busy - a.busy);
console.log(
  `threads of skiff in the measured run (busy share of samples): ${threads
    .filter((t) => t.total > 0)
    .map((t) => `${t.name.split(".").slice(-3, -1).join(".")} ${Math.round((100 * t.busy) / t.total)}%`)
    .join(", ")}`,
);
// The main thread's profile is thread 0 in its file name (CPU.{date}.{time}.{pid}.{thread}.{seq}.cpuprofile);
// PROFILE_THREAD=3 looks at thread 3 instead (a worker, such as the run history's writer thread).
const threadId = process.env.PROFILE_THREAD ?? "0";
const main = threads.find((t) => t.name.split(".")[4] === threadId) ?? threads[0];
const total = main.total;
const byFn = new Map<string, number>();
const byFile = new Map<string, number>();
for (const [id, hits] of main.hits) {
  const n = byName.get(id)!;
  const file = sourceOf(n)
    .replace(/.*node_modules\//, "npm:")
    .replace(`${ROOT}/`, "");
  const fn = `${n.callFrame.functionName || "(anonymous)"} ${file}:${n.callFrame.lineNumber + 1}`;
  byFn.set(fn, (byFn.get(fn) ?? 0) + hits);
  const key = file.startsWith("npm:")
    ? file
        .split("/")
        .slice(0, file.startsWith("npm:@") ? 2 : 1)
        .join("/")
    : file || n.callFrame.functionName;
  byFile.set(key, (byFile.get(key) ?? 0) + hits);
}
const top = (m: Map<string, number>, n: number) =>
  [...m]
    .sort((a, b) => b[1] - a[1])
    .slice(0, n)
    .map(([k, v]) => `  ${((100 * v) / total).toFixed(1).padStart(5)}%  ${k}`)
    .join("\n");
console.log(
  `thread ${threadId}, measured run only; self time by file or package:\n${top(byFile, 25)}\n\nself time by function:\n${top(byFn, Number(process.env.PROFILE_TOP ?? 25))}`,
);
// Inclusive time by file of skiff's own: the share of samples with a frame of that file on the stack.
const inclusive = new Map<string, number>();
for (const [id, hits] of main.hits) {
  const files = new Set<string>();
  for (let up: number | undefined = id; up !== undefined; up = parents.get(up)) {
    const url = sourceOf(byName.get(up)!);
    if (url.startsWith(`${ROOT}/services/`)) files.add(url.slice(`${ROOT}/`.length));
    else if (url.includes("/node_modules/")) files.add(`npm:${/node_modules\/((@[^/]+\/)?[^/]+)/.exec(url)![1]}`);
  }
  for (const f of files) inclusive.set(f, (inclusive.get(f) ?? 0) + hits);
}
console.log(
  `\ninclusive time by file of skiff's own and by package (a frame of it on the stack):\n${top(inclusive, 40)}`,
);
// PROFILE_CALLERS=writeBuffer,encode: who calls these functions (six frames up), by self time.
const frame = (n: Node) =>
  `${n.callFrame.functionName}@${n.callFrame.url.replace(`file://${ROOT}/`, "").replace(/.*\/node_modules\//, "")}:${n.callFrame.lineNumber + 1}`;
for (const name of (process.env.PROFILE_CALLERS ?? "").split(",").filter(Boolean)) {
  const chains = new Map<string, number>();
  for (const [id, hits] of main.hits) {
    if (byName.get(id)!.callFrame.functionName !== name) continue;
    const chain: string[] = [];
    for (
      let up = parents.get(id);
      up !== undefined && chain.length < Number(process.env.PROFILE_DEPTH ?? 6);
      up = parents.get(up)
    )
      chain.push(frame(byName.get(up)!));
    chains.set(chain.join(" < "), (chains.get(chain.join(" < ")) ?? 0) + hits);
  }
  console.log(`\ncallers of ${name}:\n${top(chains, 8)}`);
}
if (process.env.PROFILE_KEEP) await cp(profDir, process.env.PROFILE_KEEP, { recursive: true });
await rm(tmp, { recursive: true, force: true });
