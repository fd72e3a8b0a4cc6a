// `npx tsx bench/cluster.ts [--quick]`: throughput across processes. The
// same loads against (a) one skiff process with every role on one
// nats-server and (b) two gateways and two runners on a three-node
// JetStream cluster with three copies of everything: sync (Cortex Node
// `add`) and async accept at 32 connections (split over the two gateways
// in b), and the async backlog drain rate (runs queued while no runner is
// up, then the time until the queue is empty). Writes
// bench/results/cluster.json. Ratios, not absolute figures, are what
// compare: the machine is shared.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { connect } from "nats";
import { startNatsCluster } from "../services/nats/cluster-process.js";
import { streams } from "../services/nats/layout.js";
import { startNatsServer } from "../test/helpers/nats-server.js";
import { deployFolder } from "./deploy.js";
import { writeResults } from "./pipeline.js";
import { startSkiffProcess, waitRunHistory, type SkiffProcess } from "./skiff-process.js";
import { ensureTools, round, wrk, type WrkResult } from "./tools.js";

const quick = process.argv.includes("--quick");
const seconds = quick ? 4 : 10;
const BACKLOG = quick ? 2000 : 10_000;
const APP = "b-add";
const ADD = {
  "skiff.toml": `[app]\nname = "${APP}"\n[runtime]\nkind = "cortex"\nlanguage = "node"\nentry = "index.mjs"\n[scaling]\nmin_replicas = 1\nmax_replicas = 2\nreplica_concurrency = 64\ncooldown = 600\n`,
  "index.mjs": "export function add({ a, b }) { return a + b; }\n",
};
const BODY = '{"a":1,"b":2}';

interface Topology {
  gateways: SkiffProcess[];
  /** Starts the runners (after a backlog was queued, for the drain). */
  startRunners(): Promise<void>;
  queued(): Promise<number>;
  stop(): Promise<void>;
}

/** wrk on every gateway at once, connections split between them; rps summed, latencies of the first. */
async function load(gateways: SkiffProcess[], url: (g: SkiffProcess) => string, status: number, tmp: string) {
  const runs = await Promise.all(
    gateways.map((g) =>
      wrk(
        {
          url: url(g),
          body: BODY,
          headers: { Authorization: `Bearer ${gateways[0].devToken}` },
          status,
          connections: 32 / gateways.length,
          seconds,
        },
        tmp,
      ),
    ),
  );
  const sum = (f: (r: WrkResult) => number) => runs.reduce((a, r) => a + f(r), 0);
  return {
    rps: sum((r) => r.rps),
    p50_ms: round(Math.max(...runs.map((r) => r.p50_ms)), 3),
    p99_ms: round(Math.max(...runs.map((r) => r.p99_ms)), 3),
    errors: sum((r) => r.errors),
  };
}

/** Queues `n` async runs (16 in flight), then starts the runners and times the queue's emptying. */
async function drain(t: Topology, n: number) {
  let accepted = 0;
  let failures = 0;
  const auth = { Authorization: `Bearer ${t.gateways[0].devToken}`, "content-type": "application/json" };
  await Promise.all(
    Array.from({ length: 16 }, async (_, w) => {
      while (accepted < n) {
        const g = t.gateways[w % t.gateways.length];
        const status = await fetch(`${g.url}/v4/p-dev/${APP}/add?async=true`, {
          method: "POST",
          headers: auth,
          body: BODY,
        })
          .then(async (res) => (await res.arrayBuffer(), res.status))
          .catch(() => 0);
        if (status === 202) accepted++;
        else if (++failures > 100) throw new Error(`async accept failed 100 times (last status ${status})`);
      }
    }),
  );
  const started = performance.now();
  await t.startRunners();
  while ((await t.queued()) > 0) await new Promise((r) => setTimeout(r, 100));
  const secs = (performance.now() - started) / 1000;
  return {
    runs: accepted,
    seconds: round(secs, 2),
    per_second: Math.round(accepted / secs),
    accept_failures: failures,
  };
}

async function measure(name: string, t: Topology, tmp: string) {
  console.log(`${name}: warm-up`);
  await t.startRunners();
  await deployFolder(t.gateways[0], tmp, ADD);
  for (const g of t.gateways) {
    for (;;) {
      const res = await fetch(`${g.url}/v4/p-dev/${APP}/add`, {
        method: "POST",
        headers: { Authorization: `Bearer ${t.gateways[0].devToken}`, "content-type": "application/json" },
        body: BODY,
      });
      await res.arrayBuffer();
      if (res.status === 200) break;
      await new Promise((r) => setTimeout(r, 200));
    }
    await waitRunHistory(g, APP);
  }
  const sync = await load(t.gateways, (g) => `${g.url}/v4/p-dev/${APP}/add`, 200, tmp);
  console.log(`  sync c=32: ${sync.rps} req/s, p50 ${sync.p50_ms} ms, p99 ${sync.p99_ms} ms, errors ${sync.errors}`);
  const accept = await load(t.gateways, (g) => `${g.url}/v4/p-dev/${APP}/add?async=true`, 202, tmp);
  console.log(`  async accept c=32: ${accept.rps}/s, p50 ${accept.p50_ms} ms, errors ${accept.errors}`);
  while ((await t.queued()) > 0) await new Promise((r) => setTimeout(r, 200));
  return { sync, async_accept: accept };
}

async function single(tmp: string, runnersLater: boolean): Promise<Topology> {
  const nats = await startNatsServer();
  let skiff = await startSkiffProcess({
    natsUrl: nats.url,
    dataDir: path.join(tmp, "single"),
    env: { SKIFF_MAX_QUEUED_RUNS: "10000000" },
    roles: runnersLater ? "invocation,management,webhook" : undefined,
  });
  const nc = await connect({ servers: nats.url });
  return {
    gateways: [skiff],
    startRunners: async () => {
      if (!runnersLater) return;
      // The drain's runner: the same process again, with every role.
      await skiff.stop();
      skiff = await startSkiffProcess({
        natsUrl: nats.url,
        dataDir: path.join(tmp, "single"),
        env: { SKIFF_MAX_QUEUED_RUNS: "10000000" },
      });
      runnersLater = false;
    },
    queued: async () => (await (await nc.jetstreamManager()).streams.info(streams.runs.name)).state.messages,
    stop: async () => {
      await nc.close();
      await skiff.stop();
      await nats.stop();
    },
  };
}

async function clustered(tmp: string): Promise<Topology> {
  const cluster = await startNatsCluster({ dir: path.join(tmp, "nats") });
  const env = {
    SKIFF_NATS_USER: cluster.user,
    SKIFF_NATS_PASSWORD: cluster.password,
    SKIFF_NATS_REPLICAS: "3",
    SKIFF_ADMIN_TOKEN: "skiff_admin_bench_cluster_token_0000000000",
    SKIFF_MAX_QUEUED_RUNS: "10000000",
  };
  const gateways: SkiffProcess[] = [];
  for (const name of ["gateway-1", "gateway-2"])
    gateways.push(
      await startSkiffProcess({
        natsUrl: cluster.url,
        dataDir: path.join(tmp, name),
        roles: "invocation,management",
        env,
      }),
    );
  const runners: SkiffProcess[] = [];
  const nc = await connect({ servers: cluster.url.split(","), user: cluster.user, pass: cluster.password });
  return {
    gateways,
    startRunners: async () => {
      if (runners.length > 0) return;
      for (const name of ["runner-1", "runner-2"])
        runners.push(
          await startSkiffProcess({ natsUrl: cluster.url, dataDir: path.join(tmp, name), roles: "runner", env }),
        );
    },
    queued: async () => (await (await nc.jetstreamManager()).streams.info(streams.runs.name)).state.messages,
    stop: async () => {
      await nc.close();
      for (const p of [...gateways, ...runners]) await p.stop();
      await cluster.stop();
    },
  };
}

ensureTools();
const tmp = await mkdtemp(path.join(tmpdir(), "skiff-bench-cluster-"));
try {
  const one = await single(path.join(tmp, "a"), false);
  const singleLoad = await measure("one process, one nats-server", one, tmp).finally(() => one.stop());
  const oneDrain = await single(path.join(tmp, "a2"), true);
  await deployFolder(oneDrain.gateways[0], tmp, ADD);
  const singleDrain = await drain(oneDrain, BACKLOG).finally(() => oneDrain.stop());
  console.log(`  drain: ${JSON.stringify(singleDrain)}`);

  const many = await clustered(path.join(tmp, "b"));
  let clusterResult;
  try {
    await many.startRunners();
    clusterResult = await measure("2 gateways + 2 runners, 3-node cluster, 3 copies", many, tmp);
  } finally {
    await many.stop();
  }
  const manyDrain = await clustered(path.join(tmp, "c"));
  let clusterDrain;
  try {
    await deployFolder(manyDrain.gateways[0], tmp, ADD);
    clusterDrain = await drain(manyDrain, BACKLOG);
  } finally {
    await manyDrain.stop();
  }
  console.log(`  drain: ${JSON.stringify(clusterDrain)}`);
  const results = {
    machine: {
      cores: (await import("node:os")).cpus().length,
      node: process.version,
      quick,
      date: new Date().toISOString(),
    },
    single: { ...singleLoad, drain: singleDrain },
    cluster: { ...clusterResult, drain: clusterDrain },
    ratios: {
      sync_cluster_vs_single: round(clusterResult.sync.rps / singleLoad.sync.rps),
      async_accept_cluster_vs_single: round(clusterResult.async_accept.rps / singleLoad.async_accept.rps),
      drain_cluster_vs_single: round(clusterDrain.per_second / singleDrain.per_second),
    },
  };
  const file = await writeResults("cluster.json", results);
  console.log(`${JSON.stringify(results.ratios, null, 2)}\nwritten to ${path.relative(process.cwd(), file)}`);
} finally {
  await rm(tmp, { recursive: true, force: true });
}
