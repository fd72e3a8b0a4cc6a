// The sandbox's cost, measured on the runner alone (no NATS, no HTTP front):
//
//   cold start: deploy with no replica, then the first call, until its answer
//     (spawn, the app's own start, the first healthcheck), sandbox off, on,
//     and on with outbound network (slirp4netns, when installed), with a
//     cgroup per sandbox where the host allows it, as skiff does;
//   per call: sequential calls on a warm replica, and 32 at once, sandbox on
//     (Unix socket channel; a Custom app behind the in-sandbox relay) and off
//     (127.0.0.1:port).
//
//   npx tsx bench/sandbox.ts [--quick] [--only <case>[,<case>]]
//
// Writes bench/results/sandbox.json (with --only: sandbox-<cases>.json); the
// ratios (on / off) are the result.
import { cp, mkdtemp, rm, writeFile, mkdir } from "node:fs/promises";
import { cpus, loadavg, tmpdir } from "node:os";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { parseAppConfig, type AppConfig } from "../services/apps/app-config.js";
import { silentLogger } from "../services/config/logger.js";
import type { InvokeRequest } from "../services/runs/invoke.js";
import { prepareDeployment } from "../services/runner/prepare.js";
import { Runner } from "../services/runner/runner.js";
import { defaultSandbox, type SandboxOptions } from "../services/runner/sandbox.js";
import { slirpPath } from "../services/runner/sandbox-network.js";

const quick = process.argv.includes("--quick");
const onlyAt = process.argv.indexOf("--only");
const only = onlyAt > 0 ? process.argv[onlyAt + 1]?.split(",") : undefined;
const COLD_ROUNDS = quick ? 5 : 15;
const CALLS = quick ? 1000 : 5000;
const ROOT = path.resolve(import.meta.dirname, "..");
const ON: SandboxOptions = defaultSandbox();
const OFF: SandboxOptions = { ...ON, enabled: false };
const NET: SandboxOptions = { ...ON, network: "slirp4netns" };

interface Case {
  name: string;
  fixture: string;
  config: AppConfig;
  fn: string;
  body: unknown;
}

const CASES: Case[] = [
  {
    name: "cortex-node",
    fixture: "examples/hello-node",
    config: parseAppConfig(`[app]\nname = "n"\n[runtime]\nkind = "cortex"\nlanguage = "node"\nentry = "index.mjs"\n`),
    fn: "/run",
    body: { name: "bench" },
  },
  {
    name: "cortex-python",
    fixture: "examples/hello-python",
    config: parseAppConfig(`[app]\nname = "p"\n[runtime]\nkind = "cortex"\nlanguage = "python"\nentry = "main.py"\n`),
    fn: "/run",
    body: { name: "bench" },
  },
  {
    name: "custom-node",
    fixture: "test/fixtures/apps/behave",
    config: parseAppConfig(
      `[app]\nname = "c"\n[runtime]\nkind = "custom"\ncommand = ["node", "server.mjs"]\nhealthcheck = "/health"\n`,
    ),
    fn: "/health",
    body: undefined,
  },
];

let seq = 0;
function request(c: Case): InvokeRequest {
  const custom = c.config.runtime.kind === "custom";
  return {
    runId: `bench-${++seq}`,
    method: custom ? "GET" : "POST",
    path: c.fn,
    query: "",
    headers: {},
    body: custom ? new Uint8Array() : new TextEncoder().encode(JSON.stringify(c.body)),
  };
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const pct = (xs: number[], p: number) =>
  [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(xs.length * p))];
const r3 = (n: number) => Math.round(n * 1000) / 1000;

async function fixture(tmp: string, c: Case, tag: string, sandbox: SandboxOptions) {
  const dir = path.join(tmp, `${c.name}-${tag}`);
  await cp(path.join(ROOT, c.fixture), dir, { recursive: true });
  const prepared = await prepareDeployment(dir, c.config, silentLogger, { sandbox });
  return { dir, prepared };
}

async function coldStart(tmp: string, c: Case, sandbox: SandboxOptions): Promise<number[]> {
  const { dir, prepared } = await fixture(tmp, c, `cold-${sandbox.enabled}`, sandbox);
  const times: number[] = [];
  for (let i = 0; i < COLD_ROUNDS; i++) {
    const runner = new Runner({ workDir: path.join(tmp, "work"), logger: silentLogger, sandbox });
    await runner.deploy({
      projectId: "p-bench",
      appName: c.config.app.name,
      version: 1,
      dir,
      config: c.config,
      prepared,
    });
    const t = performance.now();
    const res = await runner.invoke("p-bench", c.config.app.name, request(c));
    times.push(performance.now() - t);
    if (res.status !== 200) throw new Error(`${c.name}: ${res.status} ${Buffer.from(res.body).toString()}`);
    await runner.close();
  }
  return times;
}

async function perCall(tmp: string, c: Case, sandbox: SandboxOptions) {
  const { dir, prepared } = await fixture(tmp, c, `warm-${sandbox.enabled}`, sandbox);
  const config = parseAppConfig(
    `[app]\nname = "${c.config.app.name}"\n[runtime]\n` +
      (c.config.runtime.kind === "custom"
        ? `kind = "custom"\ncommand = ["node", "server.mjs"]\n`
        : `kind = "cortex"\nlanguage = "${c.config.runtime.language}"\nentry = "${c.config.runtime.entry}"\n`) +
      `[scaling]\nmin_replicas = 1\nmax_replicas = 1\nreplica_concurrency = 32\n`,
  );
  const runner = new Runner({ workDir: path.join(tmp, "work"), logger: silentLogger, sandbox });
  await runner.deploy({ projectId: "p-bench", appName: config.app.name, version: 1, dir, config, prepared });
  const call = () => runner.invoke("p-bench", config.app.name, request(c));
  for (let i = 0; i < 200; i++) await call(); // warm-up
  const seqTimes: number[] = [];
  for (let i = 0; i < CALLS; i++) {
    const t = performance.now();
    await call();
    seqTimes.push(performance.now() - t);
  }
  const t0 = performance.now();
  let done = 0;
  await Promise.all(
    Array.from({ length: 32 }, async () => {
      while (done < CALLS) {
        done++;
        await call();
      }
    }),
  );
  const rps32 = CALLS / ((performance.now() - t0) / 1000);
  await runner.close();
  return { p50_ms: r3(median(seqTimes)), p99_ms: r3(pct(seqTimes, 0.99)), rps_c32: Math.round(rps32) };
}

const tmp = await mkdtemp(path.join(tmpdir(), "skiff-bench-sandbox-"));
// As skiff at start (configureSandbox): a cgroup per sandbox where the host allows it.
const cgroups = ON.host.enableCgroups();
const results: Record<string, unknown> = {
  machine: {
    cores: cpus().length,
    node: process.version,
    quick,
    date: new Date().toISOString(),
    cgroups: cgroups === true ? "per sandbox" : `none: ${cgroups}`,
    // Other work on the machine skews every figure: the 1-minute load average before and after.
    load: [loadavg()[0]],
  },
};
const ratios: Record<string, number> = {};
try {
  for (const c of CASES.filter((c) => !only || only.includes(c.name))) {
    console.log(`${c.name}: cold starts`);
    const coldOff = median(await coldStart(tmp, c, OFF));
    const coldOn = median(await coldStart(tmp, c, ON));
    console.log(`${c.name}: per call`);
    const coldNet = slirpPath() ? median(await coldStart(tmp, c, NET)) : undefined;
    const callOff = await perCall(tmp, c, OFF);
    const callOn = await perCall(tmp, c, ON);
    results[c.name] = {
      cold_start_ms: { off: r3(coldOff), on: r3(coldOn), on_slirp4netns: coldNet && r3(coldNet) },
      per_call: { off: callOff, on: callOn },
    };
    ratios[`${c.name}_cold_start_on_vs_off`] = r3(coldOn / coldOff);
    if (coldNet) ratios[`${c.name}_cold_start_slirp4netns_vs_off`] = r3(coldNet / coldOff);
    ratios[`${c.name}_call_p50_on_vs_off`] = r3(callOn.p50_ms / callOff.p50_ms);
    ratios[`${c.name}_rps_c32_on_vs_off`] = r3(callOn.rps_c32 / callOff.rps_c32);
    console.log(c.name, JSON.stringify(results[c.name]));
  }
} finally {
  await rm(tmp, { recursive: true, force: true });
}
results.ratios = ratios;
(results.machine as { load: number[] }).load.push(loadavg()[0]);
const out = path.join(import.meta.dirname, "results", only ? `sandbox-${only.join("-")}.json` : "sandbox.json");
await mkdir(path.dirname(out), { recursive: true });
await writeFile(out, JSON.stringify(results, null, 2) + "\n");
console.log(JSON.stringify(ratios, null, 2));
