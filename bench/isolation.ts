// One tenant's abuse against another tenant's latency, on one runner with the
// sandbox as skiff configures it (bwrap, a cgroup per sandbox where the host
// allows it, the configured limits): a victim app (a Cortex Python function
// that answers at once) is called in turn while another project's app abuses
// memory, disk, logs, results, processes, connections or CPU as hard as it
// can. The result is the victim's p50 under each abuse against its p50 alone,
// measured in the same run.
//
//   npx tsx bench/isolation.ts [--quick] [--only <abuse>[,<abuse>]]
//
// Writes bench/results/isolation.json.
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { cpus, loadavg, tmpdir } from "node:os";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { parseAppConfig } from "../services/apps/app-config.js";
import { loadConfig } from "../services/config/config.js";
import { silentLogger } from "../services/config/logger.js";
import type { InvokeRequest } from "../services/runs/invoke.js";
import { prepareDeployment } from "../services/runner/prepare.js";
import { Runner } from "../services/runner/runner.js";
import { configureSandbox } from "../services/runner/sandbox-setup.js";

const quick = process.argv.includes("--quick");
const onlyAt = process.argv.indexOf("--only");
const only = onlyAt > 0 ? process.argv[onlyAt + 1]?.split(",") : undefined;
const CALLS = quick ? 200 : 1000;

interface Abuse {
  name: string;
  /** The abusing function's body (Python). */
  code: string;
  /** Calls of it kept in flight while the victim is measured. */
  inFlight: number;
  maxReplicas: number;
  concurrency?: number;
}

const ABUSES: Abuse[] = [
  {
    name: "memory",
    code: "    b = []\n    while True:\n        b.append(bytearray(64 << 20))\n",
    inFlight: 8,
    maxReplicas: 8,
  },
  {
    name: "disk",
    code:
      "    import os\n    try:\n        with open('/tmp/fill', 'wb') as f:\n            while True:\n" +
      "                f.write(b'x' * (1 << 20))\n    except OSError:\n        pass\n    os.remove('/tmp/fill')\n",
    inFlight: 4,
    maxReplicas: 4,
  },
  {
    name: "logs",
    code: "    for i in range(100000):\n        print('x' * 200, flush=True)\n",
    inFlight: 4,
    maxReplicas: 4,
  },
  { name: "results", code: "    return 'x' * (200 << 20)\n", inFlight: 4, maxReplicas: 4 },
  {
    name: "processes",
    code:
      "    import subprocess\n    ps = []\n    try:\n        while True:\n" +
      "            ps.append(subprocess.Popen(['sleep', '3']))\n    except OSError:\n        pass\n" +
      "    for p in ps:\n        p.wait()\n",
    inFlight: 4,
    maxReplicas: 4,
  },
  {
    name: "connections",
    code: "    import time\n    time.sleep(1)\n",
    inFlight: 256,
    maxReplicas: 8,
    concurrency: 16,
  },
  {
    name: "cpu",
    code: "    import time\n    t = time.time()\n    while time.time() - t < 2:\n        pass\n",
    inFlight: 8,
    maxReplicas: 8,
  },
];

let seq = 0;
const request = (fn: string): InvokeRequest => ({
  runId: `iso-${++seq}`,
  method: "POST",
  path: `/${fn}`,
  query: "",
  headers: {},
  body: new TextEncoder().encode("{}"),
});

const toml = (name: string, maxReplicas: number, concurrency = 1, min = 0) =>
  parseAppConfig(
    `[app]\nname = "${name}"\n[runtime]\nkind = "cortex"\nlanguage = "python"\nentry = "main.py"\n` +
      `[scaling]\nmin_replicas = ${min}\nmax_replicas = ${maxReplicas}\nreplica_concurrency = ${concurrency}\n` +
      `response_grace_period = 60\n`,
  );

const pct = (xs: number[], p: number) =>
  [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(xs.length * p))];
const r3 = (n: number) => Math.round(n * 1000) / 1000;

const config = loadConfig(process.env);
const sandbox = configureSandbox(config, silentLogger);
const tmp = await mkdtemp(path.join(tmpdir(), "skiff-bench-isolation-"));
const runner = new Runner({ workDir: path.join(tmp, "work"), logger: silentLogger, sandbox, startTimeoutMs: 30_000 });

async function deploy(project: string, name: string, code: string, scaling: ReturnType<typeof toml>) {
  const dir = path.join(tmp, name);
  await mkdir(dir, { recursive: true });
  await writeFile(path.join(dir, "main.py"), `def ping():\n    return "pong"\n\ndef abuse():\n${code}`);
  const prepared = await prepareDeployment(dir, scaling, silentLogger, { sandbox });
  await runner.deploy({ projectId: project, appName: name, version: 1, dir, config: scaling, prepared });
}

/** The victim's latencies over CALLS calls in turn. */
async function victim(): Promise<number[]> {
  const times: number[] = [];
  for (let i = 0; i < CALLS; i++) {
    const t = performance.now();
    const res = await runner.invoke("p-victim", "victim", request("ping"));
    times.push(performance.now() - t);
    if (res.status !== 200) throw new Error(`the victim answered ${res.status}`);
  }
  return times;
}

const results: Record<string, unknown> = {
  machine: { cores: cpus().length, node: process.version, quick, date: new Date().toISOString(), load: [loadavg()[0]] },
  limits: sandbox.limits,
};
const ratios: Record<string, number> = {};
try {
  await deploy("p-victim", "victim", "    pass\n", toml("victim", 1, 1, 1));
  for (let i = 0; i < 100; i++) await runner.invoke("p-victim", "victim", request("ping"));
  const alone = pct(await victim(), 0.5);
  results.alone_p50_ms = r3(alone);
  console.log(`victim alone: p50 ${r3(alone)} ms`);
  for (const a of ABUSES.filter((x) => !only || only.includes(x.name))) {
    const project = `p-abuse-${a.name}`;
    await deploy(project, a.name, a.code, toml(a.name, a.maxReplicas, a.concurrency ?? 1));
    let stop = false;
    const outcomes: Record<string, number> = {};
    const drivers = Array.from({ length: a.inFlight }, async () => {
      while (!stop) {
        const key = await runner.invoke(project, a.name, request("abuse")).then(
          (res) => String(res.status),
          (err: Error) => err.name,
        );
        outcomes[key] = (outcomes[key] ?? 0) + 1;
        // A refusal comes at once: let the event loop turn, as a caller's network round trip would.
        await new Promise((resolve) => setImmediate(resolve));
      }
    });
    await new Promise((resolve) => setTimeout(resolve, 2000)); // the abuse at full strength
    const times = await victim();
    stop = true;
    await Promise.all(drivers);
    await runner.remove(project, a.name);
    const p50 = pct(times, 0.5);
    results[a.name] = { p50_ms: r3(p50), p99_ms: r3(pct(times, 0.99)), abuser_outcomes: outcomes };
    ratios[`${a.name}_victim_p50_vs_alone`] = r3(p50 / alone);
    console.log(`${a.name}: victim p50 ${r3(p50)} ms (${r3(p50 / alone)}x), abuser ${JSON.stringify(outcomes)}`);
  }
} finally {
  await runner.close();
  await rm(tmp, { recursive: true, force: true });
}
results.ratios = ratios;
(results.machine as { load: number[] }).load.push(loadavg()[0]);
const out = path.join(import.meta.dirname, "results", only ? `isolation-${only.join("-")}.json` : "isolation.json");
await mkdir(path.dirname(out), { recursive: true });
await writeFile(out, JSON.stringify(results, null, 2) + "\n");
console.log(JSON.stringify(ratios, null, 2));
