// SKIFF_WORKERS=2 attacked from outside, as `npm start` runs it (a
// supervisor with the data folder's nats-server and two workers on one
// port). From inside a tenant's sandbox: the workers' NATS nkey (environment,
// the seed file's path, the nats-server's port through every address a
// sandbox might reach) and the workers' own descriptors (the supervisor's IPC
// channel) stay out of reach. From an app's answer: the Skiff-Worker header
// is skiff's, never the app's. Between tenants: a project's replicas have one
// uid in both workers, another project's another. From the network: one
// address gets SKIFF_MAX_CONNECTIONS_PER_ADDRESS connections, not that many
// per worker. From a tenant: a project runs SKIFF_PROJECT_MAX_REPLICAS
// replicas on the machine, each worker its share.
import type { ChildProcess } from "node:child_process";
import net from "node:net";
import { mkdtemp, readdir, readFile, readlink, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { packApp } from "../../services/apps/bundle.js";
import { skiffToml, writeApp } from "../helpers/apps.js";
import { callOnNewConnection, Logs, serves, startWorkersSkiff, stopWorkersSkiff } from "../helpers/workers-skiff.js";

const OTHER = "p-workersother";
/** Starting a worker on a busy 2-core machine takes up to a minute; the supervisor starts them one after another. */
const START_MS = 300_000;
const PER_ADDRESS = 8;
const QUOTA = "p-workersquota";
/** SKIFF_PROJECT_MAX_REPLICAS: one replica for each of the two workers. */
const PROJECT_MAX_REPLICAS = 2;

/** The hostile app: reports what its sandbox shows, tries connections, and answers with a Skiff-Worker of its own. */
const PROBE = `
import http from "node:http";
import net from "node:net";
import fs from "node:fs";
const fds = () => {
  const out = {};
  for (const f of fs.readdirSync("/proc/self/fd")) {
    try { out[f] = fs.readlinkSync("/proc/self/fd/" + f); } catch (e) { out[f] = e.code; }
  }
  return out;
};
const tryConnect = (host, port) => new Promise((resolve) => {
  const s = net.connect({ host, port });
  const t = setTimeout(() => { s.destroy(); resolve("timeout"); }, 2000);
  s.on("connect", () => { clearTimeout(t); s.destroy(); resolve("connected"); });
  s.on("error", (e) => { clearTimeout(t); resolve(e.code); });
});
http.createServer(async (req, res) => {
  const u = new URL(req.url, "http://x");
  if (u.pathname === "/health") return res.end("ok");
  if (u.pathname === "/worker") { res.setHeader("skiff-worker", "99"); return res.end("w"); }
  if (u.pathname === "/self") return res.end(JSON.stringify({ env: process.env, uid: process.getuid(), fds: fds() }));
  if (u.pathname === "/connect") return res.end(await tryConnect(u.searchParams.get("host"), Number(u.searchParams.get("port"))));
  if (u.pathname === "/read") {
    try { return res.end("READ " + fs.readFileSync(u.searchParams.get("path"), "latin1").slice(0, 200)); } catch (e) { return res.end(e.code); }
  }
  res.statusCode = 404;
  res.end();
}).listen(Number(process.env.PORT), "127.0.0.1");
`;

const probeApp = {
  "skiff.toml": skiffToml({
    name: "probe",
    runtime: { kind: "custom", command: ["node", "server.mjs"], healthcheck: "/health" },
    scaling: { min_replicas: 0, max_replicas: 1, replica_concurrency: 8, cooldown: 600 },
  }),
  "server.mjs": PROBE,
};

/** An app whose every replica runs `node server.mjs quota-marker` (found in /proc), answering after ?ms. */
const slowApp = {
  "skiff.toml": skiffToml({
    name: "slow",
    runtime: { kind: "custom", command: ["node", "server.mjs", "quota-marker"], healthcheck: "/health" },
    scaling: { min_replicas: 0, max_replicas: 4, replica_concurrency: 1, cooldown: 600 },
  }),
  "server.mjs": [
    "import http from 'node:http';",
    "http.createServer((req, res) => {",
    "  if (req.url === '/health') return res.end('ok');",
    "  setTimeout(() => res.end('slept'), Number(new URL(req.url, 'http://x').searchParams.get('ms')));",
    "}).listen(Number(process.env.PORT), '127.0.0.1');",
  ].join("\n"),
};

/** Live processes whose command line is exactly `argv`. */
async function processesRunning(argv: string[]): Promise<number[]> {
  const want = argv.join("\0") + "\0";
  const pids: number[] = [];
  for (const name of await readdir("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    const cmdline = await readFile(`/proc/${name}/cmdline`, "latin1").catch(() => "");
    if (cmdline === want) pids.push(Number(name));
  }
  return pids;
}

/** The socket inodes a process holds open. */
async function socketsOf(pid: number): Promise<Set<string>> {
  const out = new Set<string>();
  for (const fd of await readdir(`/proc/${pid}/fd`).catch(() => [] as string[])) {
    const link = await readlink(`/proc/${pid}/fd/${fd}`).catch(() => "");
    const m = /^socket:\[(\d+)\]$/.exec(link);
    if (m) out.add(m[1]);
  }
  return out;
}

/** Listening TCP sockets (IPv4 and IPv6): inode to port. */
async function tcpListeners(): Promise<Map<string, number>> {
  const out = new Map<string, number>();
  for (const file of ["/proc/net/tcp", "/proc/net/tcp6"]) {
    const lines = (await readFile(file, "utf8").catch(() => "")).split("\n").slice(1);
    for (const line of lines) {
      const f = line.trim().split(/\s+/);
      if (f[3] === "0A") out.set(f[9], parseInt(f[1].split(":").pop()!, 16));
    }
  }
  return out;
}

/** Inodes of Unix sockets bound to a replica's channel path. */
async function channelSockets(): Promise<Set<string>> {
  const out = new Set<string>();
  for (const line of (await readFile("/proc/net/unix", "utf8")).split("\n").slice(1)) {
    const f = line.trim().split(/\s+/);
    if (f[7]?.includes("channel.sock") || f[7]?.includes("skiff-channels-")) out.add(f[6]);
  }
  return out;
}

describe("SKIFF_WORKERS=2 against an outsider", () => {
  let dataDir: string;
  let tmp: string;
  let child: ChildProcess;
  let logs: Logs;
  let url: string;
  let devToken: string;
  let adminToken: string;

  beforeAll(async () => {
    tmp = await mkdtemp(join(tmpdir(), "skiff-sec-workers-apps-"));
    const started = await startWorkersSkiff({
      SKIFF_MAX_CONNECTIONS_PER_ADDRESS: String(PER_ADDRESS),
      SKIFF_PROJECT_MAX_REPLICAS: String(PROJECT_MAX_REPLICAS),
    });
    ({ child, logs, dataDir, url, devToken, adminToken } = started);
    const admin = started.admin;
    await admin.createProject({ projectId: OTHER, name: "other" });
    await admin.createProject({ projectId: QUOTA, name: "quota" });
    const slow = await writeApp(tmp, slowApp);
    await admin.deployApp({
      projectId: QUOTA,
      bundle: { contentType: "application/gzip", data: (await packApp(slow)).bytes },
    });
    for (const project of ["p-dev", OTHER]) {
      const dir = await writeApp(tmp, probeApp);
      await admin.deployApp({
        projectId: project,
        bundle: { contentType: "application/gzip", data: (await packApp(dir)).bytes },
      });
    }
  }, START_MS);

  afterAll(async () => {
    await stopWorkersSkiff(child ? { child, dataDir } : undefined);
    await rm(tmp, { recursive: true, force: true });
  }, 60_000);

  /** Calls `path` of a project's probe on fresh connections until both workers have answered; the answers by worker. */
  async function fromBothWorkers(project: string, token: string, path: string): Promise<Map<string, string>> {
    const byWorker = new Map<string, string>();
    for (let i = 0; i < 20 && byWorker.size < 2; i++) {
      const answer = await callOnNewConnection(`${url}/v4/${project}/probe${path}`, token);
      expect(answer.status).toBe(200);
      byWorker.set(String(answer.worker), answer.body);
    }
    return byWorker;
  }

  it("an app's Skiff-Worker never replaces skiff's own", async () => {
    const seen = new Set<string>();
    for (let i = 0; i < 6; i++) {
      const answer = await callOnNewConnection(`${url}/v4/p-dev/probe/worker`, devToken);
      expect(answer.status).toBe(200);
      seen.add(String(answer.worker));
    }
    expect([...seen].sort()).toEqual(["1", "2"]);
  });

  it("a sandbox in either worker has no NATS nkey, no seed file, no inherited descriptor of its worker", async () => {
    // Each worker's IPC channel to the supervisor, as /proc tells it (NODE_CHANNEL_FD of its first environment).
    const channels: string[] = [];
    for (const n of [1, 2]) {
      const pid = Number(logs.lines.findLast(serves(n))!.pid);
      const environ = (await readFile(`/proc/${pid}/environ`, "latin1")).split("\0");
      const fd = environ.find((e) => e.startsWith("NODE_CHANNEL_FD="))?.split("=")[1];
      expect(fd).toBeDefined();
      channels.push(await readlink(`/proc/${pid}/fd/${fd}`));
    }
    const seedFile = join(dataDir, "nats", "skiff.nk");
    const selves = await fromBothWorkers("p-dev", devToken, "/self");
    expect(selves.size).toBe(2);
    for (const body of selves.values()) {
      const self = JSON.parse(body) as { env: Record<string, string>; fds: Record<string, string> };
      expect(Object.keys(self.env).filter((name) => /^(SKIFF_|NODE_)/.test(name))).toEqual([]);
      expect(JSON.stringify(self.env)).not.toMatch(/SU[A-Z0-9]{50,}/);
      for (const link of Object.values(self.fds)) expect(channels).not.toContain(link);
    }
    const read = await callOnNewConnection(`${url}/v4/p-dev/probe/read?path=${encodeURIComponent(seedFile)}`, devToken);
    expect(read.body).not.toMatch(/^READ/);
  });

  it("no descriptor of a sandbox is held by skiff's processes or by another project's sandbox", async () => {
    const links = async (project: string, token: string) => {
      const out: string[] = [];
      for (const body of (await fromBothWorkers(project, token, "/self")).values())
        out.push(...Object.values((JSON.parse(body) as { fds: Record<string, string> }).fds));
      return out.filter((l) => /^(socket|pipe):\[\d+\]$/.test(l));
    };
    const dev = await links("p-dev", devToken);
    const other = await links(OTHER, adminToken);
    expect(dev.length).toBeGreaterThan(0);
    const natsPid = Number(logs.lines.find((l) => l.msg.startsWith("started nats-server"))?.serverPid);
    const workers = [1, 2].map((n) => Number(logs.lines.findLast(serves(n))!.pid));
    const held = new Set<string>();
    for (const pid of [child.pid!, natsPid, ...workers])
      for (const fd of await readdir(`/proc/${pid}/fd`).catch(() => [] as string[]))
        held.add(await readlink(`/proc/${pid}/fd/${fd}`).catch(() => ""));
    expect(dev.filter((l) => held.has(l))).toEqual([]);
    expect(other.filter((l) => held.has(l))).toEqual([]);
    expect(dev.filter((l) => other.includes(l))).toEqual([]);
  });

  it("no sandbox reaches the nats-server, by any address", async () => {
    const natsUrl = String(logs.lines.find((l) => l.msg.startsWith("started nats-server"))?.url);
    const port = Number(new URL(natsUrl).port);
    expect(port).toBeGreaterThan(0);
    const hosts = ["127.0.0.1", "10.0.2.2", "::1"];
    for (const iface of Object.values((await import("node:os")).networkInterfaces()))
      for (const a of iface ?? []) if (!a.internal && a.family === "IPv4") hosts.push(a.address);
    for (const host of hosts) {
      const answer = await callOnNewConnection(`${url}/v4/p-dev/probe/connect?host=${host}&port=${port}`, devToken);
      expect({ host, result: answer.body }).not.toEqual({ host, result: "connected" });
    }
  });

  it("a project has one uid in both workers, and another project another", async () => {
    const uids = async (project: string, token: string) =>
      new Set([...(await fromBothWorkers(project, token, "/self")).values()].map((b) => JSON.parse(b).uid as number));
    const dev = await uids("p-dev", devToken);
    const other = await uids(OTHER, adminToken);
    expect(dev.size).toBe(1);
    expect(other.size).toBe(1);
    expect([...dev][0]).not.toBe([...other][0]);
  });

  it("the supervisor holds no replica's port or channel: it listens on skiff's port alone", async () => {
    // Replicas of both projects run in both workers by now (the calls above).
    const channels = await channelSockets();
    expect(channels.size).toBeGreaterThan(0);
    const held = await socketsOf(child.pid!);
    expect([...held].filter((inode) => channels.has(inode))).toEqual([]);
    const listeners = await tcpListeners();
    const ports = [...held].flatMap((inode) => (listeners.has(inode) ? [listeners.get(inode)] : []));
    expect(ports).toEqual([Number(new URL(url).port)]);
  });

  // Each worker is a runner of its own, with its own count of a project's replicas: it holds its share of
  // SKIFF_PROJECT_MAX_REPLICAS (and of SKIFF_PROJECT_MEMORY_MB), and the shares sum to the setting, so the machine
  // runs no more replicas of a project than the setting says. Here 2 = 1 + 1: with two calls at a time to each
  // worker, each starts one replica (with the whole setting each, each started two).
  it("a project runs SKIFF_PROJECT_MAX_REPLICAS replicas on the machine, not that many per worker", async () => {
    const marker = ["node", "server.mjs", "quota-marker"];
    // Each on a connection of its own: two to each worker. Their answers do not matter (some wait for a replica).
    const calls = Array.from({ length: 4 }, () =>
      callOnNewConnection(`${url}/v4/${QUOTA}/slow/x?ms=4000`, adminToken).catch((err: unknown) => err),
    );
    try {
      let most = 0;
      for (let i = 0; i < 30; i++) {
        most = Math.max(most, (await processesRunning(marker)).length);
        await new Promise((r) => setTimeout(r, 200));
      }
      expect(most).toBeGreaterThan(0);
      expect(most).toBeLessThanOrEqual(PROJECT_MAX_REPLICAS);
    } finally {
      await Promise.allSettled(calls);
    }
  }, 60_000);

  // The supervisor hands each new connection to the next worker in turn, and counts the connections of every worker
  // per address: a worker holds a new connection, unread, until the supervisor says that it fits, and tells it when
  // one closes. One past the limit is closed at once, as a lone process closes it, whichever worker it went to.
  it("one address holds SKIFF_MAX_CONNECTIONS_PER_ADDRESS connections in all, not that many per worker", async () => {
    const port = Number(new URL(url).port);
    const sockets: net.Socket[] = [];
    const closed = new Set<net.Socket>();
    /** Opens `n` connections one after another; after a second, those still open. */
    const openMany = async (n: number) => {
      const mine: net.Socket[] = [];
      for (let i = 0; i < n; i++) {
        const s = net.connect(port, "127.0.0.1");
        s.on("error", () => undefined);
        s.on("end", () => closed.add(s));
        s.on("close", () => closed.add(s));
        await new Promise<void>((resolve) => s.once("connect", () => resolve()));
        sockets.push(s);
        mine.push(s);
      }
      // Those past the limit are closed at once.
      await new Promise((r) => setTimeout(r, 1_000));
      return mine.filter((s) => !closed.has(s));
    };
    try {
      const open = await openMany(PER_ADDRESS * 3);
      expect(open.length).toBeGreaterThan(0);
      expect(open.length).toBeLessThanOrEqual(PER_ADDRESS);
      // Their closes are counted: the address has its connections again, in both workers.
      for (const s of open) s.destroy();
      await new Promise((r) => setTimeout(r, 500));
      expect((await openMany(PER_ADDRESS / 2)).length).toBe(PER_ADDRESS / 2);
    } finally {
      for (const s of sockets) s.destroy();
    }
  });
});
