// What the benchmarks run besides skiff: wrk as the load, nginx as the
// reference proxy, a plain echo server as the app behind both, and skiff
// itself as a separate process (so its memory is its own). Installs wrk and
// nginx from Debian when they are missing.
import { execFile, execFileSync, spawn, type ChildProcess } from "node:child_process";
import { promisify } from "node:util";
import { existsSync } from "node:fs";
import { mkdir, readFile, rm, writeFile } from "node:fs/promises";
import net from "node:net";
import path from "node:path";

export interface Latency {
  rps: number;
  p50_ms: number;
  p99_ms: number;
}

export interface WrkResult extends Latency {
  requests: number;
  /** Answers with another status than expected, socket errors and timeouts. */
  errors: number;
}

const execFileAsync = promisify(execFile);

const has = (cmd: string) => {
  try {
    execFileSync("sh", ["-c", `command -v ${cmd}`], { stdio: "ignore" });
    return true;
  } catch {
    return false;
  }
};

/** wrk and nginx from Debian's packages, installed when missing (needs root, as on CI). */
export function ensureTools(): void {
  const missing = ["wrk", "nginx"].filter((c) => !has(c));
  if (missing.length === 0) return;
  console.log(`installing ${missing.join(" ")} (apt-get)`);
  const env = { ...process.env, DEBIAN_FRONTEND: "noninteractive" };
  execFileSync("apt-get", ["update", "-qq"], { stdio: "inherit", env });
  execFileSync("apt-get", ["install", "-y", "-qq", ...missing], { stdio: "inherit", env });
}

export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(port));
    });
  });
}

export async function stop(child: ChildProcess | undefined): Promise<void> {
  if (!child || child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((r) => child.once("exit", r));
  child.kill("SIGTERM");
  const timer = setTimeout(() => child.kill("SIGKILL"), 5000);
  await exited;
  clearTimeout(timer);
}

/** The app behind every case (OpenFaaS's function too): a POST to any path answers a small JSON body; GET /health for skiff. */
export const ECHO_SERVER = `
import http from "node:http";
const server = http.createServer((req, res) => {
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    const path = (req.url ?? "/").split("?", 1)[0];
    let status = 404;
    let body = '{"error":"not found"}';
    if (path === "/health") [status, body] = [200, '{"status":"ok"}'];
    else if (req.method === "POST") [status, body] = [200, JSON.stringify({ ok: true, bytes: Buffer.concat(chunks).length })];
    res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(body) });
    res.end(body);
  });
});
server.keepAliveTimeout = 60_000;
process.on("SIGTERM", () => server.close(() => process.exit(0)));
server.listen(Number(process.env.PORT), "127.0.0.1", () => console.log("port " + server.address().port));
`;

/**
 * The floor of any proxy written for Node.js: node:http in front of the same echo server (TARGET), with a
 * keep-alive agent, the body read whole and the answer written whole, and nothing else. skiff does all of this
 * and more (auth, a run id, the replica's slot, a recorded run) on every sync call.
 */
export const NODE_PROXY = `
import http from "node:http";
const agent = new http.Agent({ keepAlive: true, maxSockets: 128 });
const target = Number(process.env.TARGET);
const server = http.createServer((req, res) => {
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    const body = Buffer.concat(chunks);
    const headers = { "content-type": req.headers["content-type"] ?? "application/octet-stream", "content-length": body.length };
    const up = http.request({ host: "127.0.0.1", port: target, method: req.method, path: req.url, agent, headers }, (r) => {
      const out = [];
      r.on("data", (c) => out.push(c));
      r.on("end", () => {
        const answer = Buffer.concat(out);
        res.writeHead(r.statusCode, { "content-type": r.headers["content-type"] ?? "application/octet-stream", "content-length": answer.length });
        res.end(answer);
      });
    });
    up.on("error", () => { res.statusCode = 502; res.end(); });
    up.end(body);
  });
});
server.keepAliveTimeout = 60_000;
process.on("SIGTERM", () => server.close(() => process.exit(0)));
server.listen(Number(process.env.PORT), "127.0.0.1", () => console.log("port " + server.address().port));
`;

/** The ready-to-run OpenFaaS CE (gateway, provider, of-watchdog) beside the repository, or SKIFF_OPENFAAS_DIR. */
export const OPENFAAS_DIR =
  process.env.SKIFF_OPENFAAS_DIR ?? path.resolve(import.meta.dirname, "..", "..", "shared", "peers", "openfaas");

/**
 * OpenFaaS CE in front of the echo server (`code`) as its function: caller → gateway → provider → of-watchdog →
 * function, without per-request logs or the provider lookup per call (OF_QUIET=1, OF_SCALE_FROM_ZERO=false).
 * Undefined when it is not there (OPENFAAS_DIR). The URL takes any path after it, as the function's own.
 */
export async function startOpenFaas(
  dir: string,
  code: string,
): Promise<{ url: string; child: ChildProcess } | undefined> {
  const script = path.join(OPENFAAS_DIR, "run-openfaas.sh");
  if (!existsSync(script)) return undefined;
  await mkdir(dir, { recursive: true });
  const fn = path.join(dir, "echo.mjs");
  await writeFile(fn, code);
  const child = spawn("bash", [script], {
    env: { ...process.env, OF_QUIET: "1", OF_SCALE_FROM_ZERO: "false", ECHO_JS: fn, OF_RUNS_DIR: dir },
    stdio: ["ignore", "pipe", "inherit"],
  });
  return new Promise((resolve, reject) => {
    let out = "";
    child.once("exit", (c) => reject(new Error(`run-openfaas.sh exited (${c}) before it was ready:\n${out}`)));
    child.stdout!.on("data", (d: Buffer) => {
      out += d.toString();
      const m = /^URL=(\S+)$/m.exec(out);
      if (m) resolve({ url: m[1], child });
    });
  });
}

/** Starts a Node module given as text that prints "port N" once listening; `nodeArgs` go to node first. */
export function serveNode(
  code: string,
  env: Record<string, string> = {},
  nodeArgs: string[] = [],
): Promise<{ port: number; child: ChildProcess }> {
  const child = spawn(process.execPath, [...nodeArgs, "--input-type=module", "-e", code], {
    env: { ...process.env, PORT: "0", ...env },
    stdio: ["ignore", "pipe", "inherit"],
  });
  return new Promise((resolve, reject) => {
    let out = "";
    child.once("exit", (c) => reject(new Error(`server exited (${c}) before listening`)));
    child.stdout!.on("data", (d: Buffer) => {
      out += d.toString();
      const m = /port (\d+)/.exec(out);
      if (m) resolve({ port: Number(m[1]), child });
    });
  });
}

/** nginx as a keep-alive reverse proxy to 127.0.0.1:target, one worker (one event loop, as skiff has). */
export async function startNginx(dir: string, target: number): Promise<{ port: number; child: ChildProcess }> {
  const port = await freePort();
  await mkdir(path.join(dir, "logs"), { recursive: true });
  const conf = `
worker_processes 1;
daemon off;
pid ${dir}/nginx.pid;
error_log ${dir}/logs/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path ${dir}/body;
  proxy_temp_path ${dir}/proxy;
  fastcgi_temp_path ${dir}/fastcgi;
  uwsgi_temp_path ${dir}/uwsgi;
  scgi_temp_path ${dir}/scgi;
  upstream echo { server 127.0.0.1:${target}; keepalive 128; }
  server {
    listen 127.0.0.1:${port};
    keepalive_requests 1000000;
    location / { proxy_pass http://echo; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
`;
  const file = path.join(dir, "nginx.conf");
  await writeFile(file, conf);
  const child = spawn("nginx", ["-p", dir, "-c", file], { stdio: ["ignore", "ignore", "inherit"] });
  for (let i = 0; i < 100; i++) {
    if (await canConnect(port)) return { port, child };
    if (child.exitCode !== null) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  await stop(child);
  throw new Error(
    `nginx did not start: ${await readFile(path.join(dir, "logs", "error.log"), "utf8").catch(() => "")}`,
  );
}

function canConnect(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.connect(port, "127.0.0.1");
    s.once("connect", () => {
      s.destroy();
      resolve(true);
    });
    s.once("error", () => resolve(false));
  });
}

export interface WrkJob {
  url: string;
  /** Default POST, with `body`; a GET sends none. */
  method?: "GET" | "POST";
  body?: string;
  headers?: Record<string, string>;
  /** The status the answers should have (for the reader); wrk counts answers outside 2xx and 3xx as errors. */
  status: number;
  connections: number;
  seconds: number;
}

const UNITS: Record<string, number> = { us: 0.001, ms: 1, s: 1000, m: 60_000 };
const ms = (text: string) => {
  const m = /^([\d.]+)(us|ms|s|m)$/.exec(text.trim());
  if (!m) throw new Error(`wrk: cannot read the latency "${text}"`);
  return Number(m[1]) * UNITS[m[2]];
};

/** Runs wrk (one thread) against a POST endpoint; answers outside 2xx and 3xx, and socket errors, count as errors. */
export async function wrk(job: WrkJob, dir: string): Promise<WrkResult> {
  const script = path.join(dir, `wrk-${job.status}-${Math.random().toString(36).slice(2)}.lua`);
  const headers = { "Content-Type": "application/json", ...job.headers };
  await writeFile(
    script,
    [
      `wrk.method = "${job.method ?? "POST"}"`,
      ...(job.body === undefined ? [] : [`wrk.body = ${JSON.stringify(job.body)}`]),
      ...Object.entries(headers).map(([k, v]) => `wrk.headers[${JSON.stringify(k)}] = ${JSON.stringify(v)}`),
    ].join("\n"),
  );
  // Not execFileSync: the soak runs several at once.
  const { stdout: out } = await execFileAsync(
    "wrk",
    ["-t1", `-c${job.connections}`, `-d${job.seconds}s`, "--latency", "--timeout", "10s", "-s", script, job.url],
    { encoding: "utf8" },
  );
  const num = (re: RegExp) => Number(re.exec(out)?.[1] ?? 0);
  const pct = (p: string) => {
    const m = new RegExp(`^\\s+${p}%\\s+(\\S+)`, "m").exec(out);
    if (!m) throw new Error(`wrk printed no ${p}th percentile:\n${out}`);
    return ms(m[1]);
  };
  const requests = num(/(\d+) requests in/);
  const socketErrors = /Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)/.exec(out);
  // wrk counts answers outside 2xx and 3xx itself (a Lua counter would live in each thread's own state).
  const errors =
    num(/Non-2xx or 3xx responses: (\d+)/) +
    (socketErrors ? socketErrors.slice(1).reduce((a, b) => a + Number(b), 0) : 0);
  return { rps: Math.round(num(/Requests\/sec:\s+([\d.]+)/)), p50_ms: pct("50"), p99_ms: pct("99"), requests, errors };
}

/** Resident memory of a process, in MB (Linux). */
export async function rssMb(pid: number): Promise<number> {
  const status = await readFile(`/proc/${pid}/status`, "utf8");
  const kb = Number(/VmRSS:\s+(\d+)/.exec(status)?.[1] ?? NaN);
  return Math.round(kb / 1024);
}

/** CPU time (user + system) a process has used so far, from /proc. */
export async function cpuSeconds(pid: number): Promise<number> {
  const fields = (await readFile(`/proc/${pid}/stat`, "utf8")).replace(/^.*\) /, "").split(" ");
  return (Number(fields[11]) + Number(fields[12])) / 100;
}

/**
 * Waits (up to `maxMs`) until a process uses less than a tenth of a core over half a second: the work a load
 * left behind (projecting its runs into the run history) is done before the next measurement.
 */
export async function quiet(pid: number, maxMs = 30_000): Promise<void> {
  const deadline = Date.now() + maxMs;
  while (Date.now() < deadline) {
    const before = await cpuSeconds(pid);
    await new Promise((r) => setTimeout(r, 500));
    if ((await cpuSeconds(pid)) - before < 0.05) return;
  }
}

/**
 * What a process spends over `work`: CPU time of all its threads (from /proc) and, when it runs with
 * bench/alloc-probe.mjs (ALLOC_PROBE and SKIFF_BENCH_ALLOC_FILE = `allocFile`), the bytes its main thread
 * allocated on the JS heap (null without the probe).
 */
export async function processCost<T>(
  pid: number,
  allocFile: string | undefined,
  work: () => Promise<T>,
): Promise<{ result: T; cpuSeconds: number; heapBytes: number | null }> {
  if (allocFile) await rm(allocFile, { force: true });
  const cpuBefore = await cpuSeconds(pid);
  if (allocFile) process.kill(pid, "SIGUSR2");
  const result = await work();
  if (allocFile) process.kill(pid, "SIGUSR2");
  const cpu = (await cpuSeconds(pid)) - cpuBefore;
  let heapBytes: number | null = null;
  for (let i = 0; allocFile && heapBytes === null && i < 100; i++) {
    const text = await readFile(allocFile, "utf8").catch(() => undefined);
    if (text) heapBytes = (JSON.parse(text) as { bytes: number }).bytes;
    else await new Promise((r) => setTimeout(r, 20));
  }
  return { result, cpuSeconds: cpu, heapBytes };
}

/** The probe that counts a process's heap allocations (see processCost). */
export const ALLOC_PROBE = path.join(import.meta.dirname, "alloc-probe.mjs");

export function percentile(xs: number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? NaN : s[Math.min(s.length - 1, Math.floor(p * s.length))];
}

export const round = (x: number, digits = 2) => Number(x.toFixed(digits));
