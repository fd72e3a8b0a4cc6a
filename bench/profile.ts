// `npx tsx bench/profile.ts [sync|async|custom] [seconds]`: runs skiff under
// `node --cpu-prof` with one kind of load from wrk, then prints where its
// main thread spent its time (self time by function and by file), for the
// profile that should come before an optimisation.
import { mkdtemp, readdir, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { startNatsServer } from "../test/helpers/nats-server.js";
import { deployFolder } from "./deploy.js";
import { startSkiffProcess } from "./skiff-process.js";
import { ECHO_SERVER, ensureTools, wrk } from "./tools.js";

const kind = process.argv[2] ?? "async";
const seconds = Number(process.argv[3] ?? 8);
ensureTools();
const tmp = await mkdtemp(path.join(tmpdir(), "skiff-profile-"));
const profDir = path.join(tmp, "prof");
const nats = await startNatsServer();
const skiff = await startSkiffProcess({
  natsUrl: nats.url,
  dataDir: path.join(tmp, "data"),
  env: { SKIFF_MAX_QUEUED_RUNS: "10000000" },
  nodeArgs: ["--cpu-prof", `--cpu-prof-dir=${profDir}`],
});
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
    custom: `${skiff.url}/v4/p-dev/p-echo/echo`,
  }[kind]!;
  const status = kind === "async" ? 202 : 200;
  const job = {
    url,
    body: '{"a":1,"b":2}',
    headers: { Authorization: `Bearer ${skiff.devToken}` },
    status,
    connections: 32,
  };
  await wrk({ ...job, seconds: 3 }, tmp);
  const r = await wrk({ ...job, seconds }, tmp);
  console.log(`${kind}: ${r.rps} req/s, p50 ${r.p50_ms} ms, p99 ${r.p99_ms} ms, errors ${r.errors}`);
} finally {
  await skiff.stop();
  await nats.stop();
}

interface Node {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  hitCount: number;
}
const files = (await readdir(profDir)).filter((f) => f.endsWith(".cpuprofile"));
// skiff's main thread is the profile that worked most (the module loader's thread idles).
const busy = (p: { nodes: Node[] }) =>
  p.nodes.reduce((a, n) => a + (n.callFrame.functionName === "(idle)" ? 0 : n.hitCount), 0);
let best: { nodes: Node[]; samples: number[] } | undefined;
for (const f of files) {
  const p = JSON.parse(await readFile(path.join(profDir, f), "utf8")) as { nodes: Node[]; samples: number[] };
  if (!best || busy(p) > busy(best)) best = p;
}
const total = best!.nodes.reduce((a, n) => a + n.hitCount, 0);
const byFn = new Map<string, number>();
const byFile = new Map<string, number>();
for (const n of best!.nodes) {
  const file = n.callFrame.url
    .replace(/^file:\/\//, "")
    .replace(/.*node_modules\//, "npm:")
    .replace(/.*\/main\//, "");
  const fn = `${n.callFrame.functionName || "(anonymous)"} ${file}:${n.callFrame.lineNumber + 1}`;
  byFn.set(fn, (byFn.get(fn) ?? 0) + n.hitCount);
  const key = file.startsWith("npm:")
    ? file
        .split("/")
        .slice(0, file.startsWith("npm:@") ? 2 : 1)
        .join("/")
    : file || n.callFrame.functionName;
  byFile.set(key, (byFile.get(key) ?? 0) + n.hitCount);
}
const top = (m: Map<string, number>, n: number) =>
  [...m]
    .sort((a, b) => b[1] - a[1])
    .slice(0, n)
    .map(([k, v]) => `  ${((100 * v) / total).toFixed(1).padStart(5)}%  ${k}`)
    .join("\n");
console.log(`self time by file or package:\n${top(byFile, 25)}\n\nself time by function:\n${top(byFn, 25)}`);
await rm(tmp, { recursive: true, force: true });
