// The Custom-app relay alone (services/runner/shims/relay.py, relay.mjs), no
// sandbox and no runner: an HTTP app on 127.0.0.1, called directly and
// through each relay's Unix socket, as the runner calls a sandboxed replica.
//
//   sequential calls (p50, p99), 32 concurrent keep-alive callers (req/s),
//   and one 256 MiB download (MiB/s).
//
//   npx tsx bench/relay.ts [--quick] [--rounds N] [relay files…]   (default: relay.py and relay.mjs)
//
// Writes bench/results/relay.json: each figure's median over N rounds
// (default 3), each round measuring every target in turn, and the rounds.
// Relay files given on the command line (e.g. an older relay.py) are
// measured instead of the current ones.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdir, mkdtemp, rename, rm, writeFile } from "node:fs/promises";
import http from "node:http";
import net from "node:net";
import { cpus, loadavg, tmpdir } from "node:os";
import path from "node:path";
import { performance } from "node:perf_hooks";

const quick = process.argv.includes("--quick");
const CALLS = quick ? 2000 : 10000;
const roundsAt = process.argv.indexOf("--rounds");
const ROUNDS = roundsAt > 0 ? Number(process.argv[roundsAt + 1]) : 3;
const BULK_MB = 256;
const SHIMS = path.resolve(import.meta.dirname, "..", "services", "runner", "shims");
const given = process.argv.slice(2).filter((a, i, all) => !a.startsWith("--") && all[i - 1] !== "--rounds");
const relays = given.length ? given : [path.join(SHIMS, "relay.py"), path.join(SHIMS, "relay.mjs")];

const APP = `
import http from "node:http";
const chunk = Buffer.alloc(1 << 20, 120);
http.createServer((req, res) => {
  if (req.url === "/bulk") {
    let left = ${BULK_MB};
    const more = () => { while (left > 0) { left--; if (!res.write(chunk)) return res.once("drain", more); } res.end(); };
    return more();
  }
  res.end("ok");
}).listen(Number(process.argv[1]), "127.0.0.1", () => console.log("up"));
`;

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const pct = (xs: number[], p: number) =>
  [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(xs.length * p))];
const r3 = (n: number) => Math.round(n * 1000) / 1000;

function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const s = net.createServer().listen(0, "127.0.0.1", () => {
      const { port } = s.address() as net.AddressInfo;
      s.close(() => resolve(port));
    });
  });
}

async function startApp(port: number): Promise<ChildProcess> {
  const app = spawn(process.execPath, ["--input-type=module", "-e", APP, String(port)], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  await new Promise((resolve) => app.stdout!.once("data", resolve));
  return app;
}

async function startRelay(file: string, socketPath: string, port: number): Promise<ChildProcess> {
  // As the runner does: the relay alone accepts (libuv removes the path of a socket it closes: bind another name).
  const server = await new Promise<net.Server>((resolve) => {
    const s = net.createServer().listen(`${socketPath}.new`, () => resolve(s));
  });
  const fd = (server as unknown as { _handle: { fd: number } })._handle.fd;
  const command = file.endsWith(".py") ? ["python3", "-I", "-S"] : [process.execPath];
  const relay = spawn(command[0], [...command.slice(1), file, "3", String(port)], {
    stdio: ["ignore", "inherit", "inherit", fd],
  });
  await rename(`${socketPath}.new`, socketPath);
  server.close();
  return relay;
}

async function measure(target: http.RequestOptions) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 32 });
  const get = (p: string, sink?: (n: number) => void) =>
    new Promise<void>((resolve, reject) => {
      http
        .get({ ...target, agent, path: p }, (res) => {
          res.on("data", (c: Buffer) => sink?.(c.length));
          res.on("end", resolve);
          res.on("error", reject);
        })
        .on("error", reject);
    });
  for (let i = 0; i < 200; i++) await get("/");
  const seq: number[] = [];
  for (let i = 0; i < CALLS; i++) {
    const t = performance.now();
    await get("/");
    seq.push(performance.now() - t);
  }
  let started = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: 32 }, async () => {
      while (started < CALLS) {
        started++;
        await get("/");
      }
    }),
  );
  const rps = CALLS / ((performance.now() - t0) / 1000);
  let bytes = 0;
  const t1 = performance.now();
  await get("/bulk", (n) => (bytes += n));
  const mibps = bytes / 1048576 / ((performance.now() - t1) / 1000);
  if (bytes !== BULK_MB * 1048576) throw new Error(`bulk: ${bytes} bytes`);
  agent.destroy();
  return {
    p50_ms: r3(median(seq)),
    p99_ms: r3(pct(seq, 0.99)),
    rps_c32: Math.round(rps),
    bulk_mib_s: Math.round(mibps),
  };
}

const tmp = await mkdtemp(path.join(tmpdir(), "skiff-bench-relay-"));
const results: Record<string, unknown> = {
  machine: { cores: cpus().length, node: process.version, quick, date: new Date().toISOString(), load: [loadavg()[0]] },
};
type Figures = Awaited<ReturnType<typeof measure>>;
/** Every round measures each target once, in turn, so that a busy machine weighs on all of them alike. */
const samples = new Map<string, Figures[]>();
const port = await freePort();
const app = await startApp(port);
let seq = 0;
try {
  for (let round = 0; round < ROUNDS; round++) {
    const direct = await measure({ host: "127.0.0.1", port });
    samples.set("direct", [...(samples.get("direct") ?? []), direct]);
    console.log(`round ${round + 1} direct`, JSON.stringify(direct));
    for (const file of relays) {
      const socketPath = path.join(tmp, `relay-${++seq}.sock`);
      const relay = await startRelay(file, socketPath, port);
      try {
        const name = given.length ? file : path.basename(file);
        const figures = await measure({ socketPath, host: "localhost" });
        samples.set(name, [...(samples.get(name) ?? []), figures]);
        console.log(`round ${round + 1} ${name}`, JSON.stringify(figures));
      } finally {
        relay.kill("SIGKILL");
      }
    }
  }
} finally {
  app.kill("SIGKILL");
  await rm(tmp, { recursive: true, force: true });
}
for (const [name, all] of samples) {
  const mid = (key: keyof Figures) => median(all.map((f) => f[key]));
  results[name] = {
    median: { p50_ms: mid("p50_ms"), p99_ms: mid("p99_ms"), rps_c32: mid("rps_c32"), bulk_mib_s: mid("bulk_mib_s") },
    rounds: all,
  };
}
(results.machine as { load: number[] }).load.push(loadavg()[0]);
const out = path.join(import.meta.dirname, "results", "relay.json");
await mkdir(path.dirname(out), { recursive: true });
await writeFile(out, JSON.stringify(results, null, 2) + "\n");
