// `npm run soak`: mixed load on one skiff process for SOAK_SECONDS (default
// 600): sync calls of a Custom and a Cortex app, async runs, and sync calls
// with a webhook to a local receiver, each from its own wrk or loop. Prints
// the errors of each kind and skiff's RSS after warm-up and at the end, and
// writes bench/results/soak.json (read by `npm run bench` for rss_mb.after_soak).
import { mkdtemp, rm } from "node:fs/promises";
import http from "node:http";
import { tmpdir } from "node:os";
import path from "node:path";
import { startNatsServer } from "../test/helpers/nats-server.js";
import { deployFolder } from "./deploy.js";
import { writeResults } from "./pipeline.js";
import { startSkiffProcess } from "./skiff-process.js";
import { ECHO_SERVER, ensureTools, rssMb, wrk } from "./tools.js";

const SECONDS = Number(process.env.SOAK_SECONDS ?? 600);
const WARMUP_SECONDS = Math.min(60, Math.max(5, Math.round(SECONDS / 10)));
const P = "p-dev";

ensureTools();
const tmp = await mkdtemp(path.join(tmpdir(), "skiff-soak-"));
const nats = await startNatsServer();
const skiff = await startSkiffProcess({
  natsUrl: nats.url,
  dataDir: path.join(tmp, "data"),
  env: { SKIFF_MAX_QUEUED_RUNS: "10000000" },
});
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
  for (const app of ["soak-echo/echo", "soak-add/add"]) {
    const res = await fetch(`${skiff.url}/v4/${P}/${app}`, {
      method: "POST",
      headers: { ...auth, "content-type": "application/json" },
      body,
    });
    if (res.status !== 200) throw new Error(`${app} answered ${res.status}`);
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
  console.log(`soak: warm-up ${WARMUP_SECONDS} s, then ${SECONDS} s of mixed load`);
  await mix(WARMUP_SECONDS);
  const start = await rssMb(skiff.pid);
  const [sync, cortex, accepted, hooked] = await mix(SECONDS);
  const end = await rssMb(skiff.pid);
  const result = {
    seconds: SECONDS,
    requests: { custom: sync.requests, cortex: cortex.requests, async: accepted.requests, webhook: hooked.requests },
    errors: { custom: sync.errors, cortex: cortex.errors, async: accepted.errors, webhook: hooked.errors },
    rss_mb: { start, end, ratio: Number((end / start).toFixed(2)) },
  };
  console.log(JSON.stringify(result, null, 2));
  await writeResults("soak.json", result);
} finally {
  receiver.close();
  await skiff.stop();
  await nats.stop();
  await rm(tmp, { recursive: true, force: true });
}
