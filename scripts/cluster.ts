// `npm run cluster`: skiff at scale on one machine. A three-node NATS
// JetStream cluster on loopback (file storage, a generated password, every
// stream and bucket with three copies), then ordinary skiff processes, each
// `skiff --roles …` with a data folder of its own:
//
//   gateway-1, gateway-2   invocation,management   ports 8081, 8082
//   runner-1, runner-2     runner
//   webhook-1, webhook-2   webhook
//
// and nginx on port 8080 spreading HTTP/1.1 callers (REST, Connect,
// gRPC-Web, WebSockets) over the two gateways (the config is written to
// <dir>/nginx.conf; without nginx, call a gateway directly; gRPC callers,
// h2c, call a gateway's own port). The run history is shared through PostgreSQL when one answers
// at 127.0.0.1:5432 (a database of this folder's own, skiff_cluster_<hash of the folder>), else each gateway keeps its
// own. The example apps are deployed into p-dev once everything is up;
// <dir>/admin-token and <dir>/dev-token hold the tokens. Ctrl-C stops it all.
//
// Settings: SKIFF_CLUSTER_DIR (default .data/cluster), SKIFF_CLUSTER_PORT
// (default 8080), SKIFF_LOG_LEVEL (default warn), SKIFF_DATABASE_URL.
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdir, readFile, rm, writeFile } from "node:fs/promises";
import net from "node:net";
import path from "node:path";
import pg from "pg";
import { SERVER_NODE_FLAGS } from "../bin/server-flags.js";
import { createLogger } from "../services/config/index.js";
import { deployExamples } from "../services/management/index.js";
import { startNatsCluster, type NatsCluster } from "../services/nats/cluster-process.js";
import { claimClusterDatabase } from "./cluster-database.js";

const ROOT = path.resolve(import.meta.dirname, "..");
const dir = path.resolve(process.env.SKIFF_CLUSTER_DIR ?? path.join(ROOT, ".data", "cluster"));
const publicPort = Number(process.env.SKIFF_CLUSTER_PORT ?? 8080);
const logLevel = process.env.SKIFF_LOG_LEVEL ?? "warn";

const PROCESSES = [
  { name: "gateway-1", roles: "invocation,management", port: publicPort + 1 },
  { name: "gateway-2", roles: "invocation,management", port: publicPort + 2 },
  { name: "runner-1", roles: "runner", port: 0 },
  { name: "runner-2", roles: "runner", port: 0 },
  { name: "webhook-1", roles: "webhook", port: 0 },
  { name: "webhook-2", roles: "webhook", port: 0 },
];

const children: { name: string; child: ChildProcess }[] = [];
let stopping = false;
let cluster: NatsCluster | undefined;

function say(text: string): void {
  console.log(`[cluster] ${text}`);
}

/** Prefixes each line a child writes with its name. */
function relay(name: string, stream: NodeJS.ReadableStream | null): void {
  let partial = "";
  stream?.setEncoding("utf8");
  stream?.on("data", (chunk: string) => {
    const lines = (partial + chunk).split("\n");
    partial = lines.pop() ?? "";
    for (const line of lines) if (line !== "") console.log(`[${name}] ${line}`);
  });
}

/**
 * The run history's database: PostgreSQL at 127.0.0.1:5432 when it answers, in
 * a database of this cluster folder's own (cluster-database.ts).
 */
async function databaseUrl(): Promise<string | undefined> {
  if (process.env.SKIFF_DATABASE_URL) return process.env.SKIFF_DATABASE_URL;
  const admin = new pg.Client({ host: "127.0.0.1", port: 5432, user: "postgres", database: "postgres" });
  try {
    await admin.connect();
  } catch {
    await admin.end().catch(() => undefined);
    return undefined;
  }
  try {
    return `postgres://postgres@127.0.0.1:5432/${await claimClusterDatabase(admin, dir)}`;
  } finally {
    await admin.end().catch(() => undefined);
  }
}

async function waitForPort(port: number, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const open = await new Promise<boolean>((resolve) => {
      const socket = net.connect(port, "127.0.0.1", () => {
        socket.destroy();
        resolve(true);
      });
      socket.on("error", () => resolve(false));
    });
    if (open) return;
    if (Date.now() > deadline) throw new Error(`nothing listens on port ${port} after ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

function nginxConfig(home: string): string {
  const upstreams = PROCESSES.filter((p) => p.port !== 0)
    .map((p) => `    server 127.0.0.1:${p.port} max_fails=1 fail_timeout=2s;`)
    .join("\n");
  return `# skiff's gateways behind one port: requests go to the gateway with the fewest in flight;
# a gateway that fails is skipped (its requests are retried on the other when nothing was sent yet).
worker_processes auto;
daemon off;
pid ${home}/nginx.pid;
error_log ${home}/nginx-error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_max_body_size 0;          # skiff enforces its own limits (SKIFF_MAX_BODY_BYTES, bundles)
  proxy_request_buffering off;
  proxy_buffering off;             # streamed answers and server-sent events pass as they come
  proxy_read_timeout 3600s;        # sync runs may take response_grace_period; skiff times them out
  map $http_upgrade $connection_upgrade { default upgrade; '' ""; }
  upstream skiff {
    least_conn;
${upstreams}
    keepalive 64;
  }
  server {
    # HTTP/1.1: REST, Connect and gRPC-Web; gRPC (h2c) callers go to a gateway's own port.
    listen 127.0.0.1:${publicPort};
    location / {
      proxy_pass http://skiff;
      proxy_http_version 1.1;
      proxy_set_header Host $host;
      proxy_set_header Upgrade $http_upgrade;          # WebSockets
      proxy_set_header Connection $connection_upgrade;
      proxy_next_upstream error timeout;
    }
  }
}
`;
}

async function stopAll(code: number): Promise<never> {
  if (!stopping) {
    stopping = true;
    say("stopping every process (SIGTERM), then the NATS cluster");
    await Promise.all(
      children.map(
        ({ child }) =>
          new Promise<void>((resolve) => {
            if (child.exitCode !== null || child.signalCode !== null) return resolve();
            child.once("exit", () => resolve());
            child.kill("SIGTERM");
          }),
      ),
    );
    await cluster?.stop();
  }
  process.exit(code);
}

process.on("SIGINT", () => void stopAll(0));
process.on("SIGTERM", () => void stopAll(0));
// Whatever ends this process ends its children too: none is left holding a port.
process.on("exit", () => {
  for (const { child } of children) if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
});

/** Refuses to start on ports something else holds (an earlier cluster still running, say). */
async function portsFree(): Promise<void> {
  for (const port of [publicPort, ...PROCESSES.filter((p) => p.port !== 0).map((p) => p.port)]) {
    const taken = await new Promise<boolean>((resolve) => {
      const socket = net.connect(port, "127.0.0.1", () => {
        socket.destroy();
        resolve(true);
      });
      socket.on("error", () => resolve(false));
    });
    if (taken) throw new Error(`port ${port} is taken (an earlier cluster still running?); set SKIFF_CLUSTER_PORT`);
  }
}

try {
  await main();
} catch (err) {
  console.error(`[cluster] ${err instanceof Error ? err.message : String(err)}`);
  await stopAll(1);
}

async function main(): Promise<void> {
  await portsFree();
  await mkdir(dir, { recursive: true, mode: 0o700 });
  await rm(path.join(dir, "nats"), { recursive: true, force: true });
  say(`starting a three-node NATS JetStream cluster in ${path.join(dir, "nats")}`);
  cluster = await startNatsCluster({ dir: path.join(dir, "nats") });
  say(`NATS: ${cluster.url} (user ${cluster.user}, password in ${path.join(dir, "nats", "n1", "nats.conf")})`);
  const database = await databaseUrl();
  say(
    database ? `run history: ${database}` : "run history: no PostgreSQL at 127.0.0.1:5432, each gateway keeps its own",
  );
  const adminToken =
    (await readFile(path.join(dir, "admin-token"), "utf8").catch(() => "")).trim() ||
    `skiff_admin_${randomBytes(24).toString("base64url")}`;
  await writeFile(path.join(dir, "admin-token"), adminToken + "\n", { mode: 0o600 });

  /** Starts one process; like systemd's Restart=on-failure, one that exits unasked is started again after a pause. */
  function launch(p: (typeof PROCESSES)[number], attempt = 1): void {
    const argv = [...SERVER_NODE_FLAGS, path.join(ROOT, "bin", "skiff-server.js"), "--roles", p.roles];
    const child = spawn(process.execPath, argv, {
      cwd: ROOT,
      env: {
        ...process.env,
        SKIFF_PORT: String(p.port),
        SKIFF_DATA_DIR: path.join(dir, p.name),
        SKIFF_NATS_URL: cluster!.url,
        SKIFF_NATS_USER: cluster!.user,
        SKIFF_NATS_PASSWORD: cluster!.password,
        SKIFF_NATS_REPLICAS: process.env.SKIFF_NATS_REPLICAS ?? "3",
        SKIFF_ADMIN_TOKEN: adminToken,
        SKIFF_LOG_LEVEL: logLevel,
        ...(database ? { SKIFF_DATABASE_URL: database } : {}),
      },
      stdio: ["ignore", "pipe", "pipe"],
    });
    relay(p.name, child.stdout);
    relay(p.name, child.stderr);
    const started = Date.now();
    child.once("exit", (code, signal) => {
      if (stopping) return;
      // A process that ran a while before it failed starts over from the first pause.
      const next = Date.now() - started > 60_000 ? 1 : attempt + 1;
      const pauseMs = Math.min(30_000, 1000 * 2 ** (next - 1));
      say(`${p.name} exited (${signal ?? code}); starting it again in ${pauseMs / 1000} s`);
      setTimeout(() => stopping || launch(p, next), pauseMs);
    });
    const entry = children.find((c) => c.name === p.name);
    if (entry) entry.child = child;
    else children.push({ name: p.name, child });
  }

  // The first gateway provisions every stream and bucket (three copies each) before the others start:
  // a cluster that has just formed answers nine processes provisioning at once slowly, past their timeouts.
  for (const p of PROCESSES) {
    launch(p);
    say(`${p.name}: --roles ${p.roles}${p.port ? ` on 127.0.0.1:${p.port}` : ""}`);
    if (p === PROCESSES[0]) await waitForPort(p.port, 120_000);
  }
  for (const p of PROCESSES.filter((q) => q.port !== 0)) await waitForPort(p.port);

  const nginxHome = path.join(dir, "nginx");
  await mkdir(nginxHome, { recursive: true });
  await writeFile(path.join(dir, "nginx.conf"), nginxConfig(nginxHome));
  const hasNginx = spawnSync("sh", ["-c", "command -v nginx"]).status === 0;
  if (hasNginx) {
    const nginx = spawn("nginx", ["-c", path.join(dir, "nginx.conf"), "-p", nginxHome], { stdio: "inherit" });
    children.push({ name: "nginx", child: nginx });
    await waitForPort(publicPort);
    say(`nginx: 127.0.0.1:${publicPort} spreads callers over the gateways (${path.join(dir, "nginx.conf")})`);
  } else {
    say(`no nginx (apt-get install nginx): call a gateway directly, 127.0.0.1:${publicPort + 1} or :${publicPort + 2}`);
  }

  const gateway = `http://127.0.0.1:${publicPort + 1}`;
  await deployExamples({ url: gateway, dataDir: path.join(dir, "gateway-1"), logger: createLogger(logLevel) });
  const devToken = (await readFile(path.join(dir, "gateway-1", "dev-token"), "utf8")).trim();
  await writeFile(path.join(dir, "dev-token"), devToken + "\n", { mode: 0o600 });
  const down = children.filter(({ child }) => child.exitCode !== null || child.signalCode !== null);
  if (down.length > 0) say(`not all is up: ${down.map((c) => c.name).join(", ")} exited (their log lines are above)`);
  const shown = (file: string) => (file.startsWith(ROOT + path.sep) ? path.relative(ROOT, file) : file);
  say(`ready. Tokens: ${shown(path.join(dir, "admin-token"))}, ${shown(path.join(dir, "dev-token"))}. Try:`);
  say(
    `  curl -X POST -H "Authorization: Bearer $(cat ${shown(path.join(dir, "dev-token"))})" ` +
      `-d '{"name":"Ada"}' http://127.0.0.1:${hasNginx ? publicPort : publicPort + 1}/v4/p-dev/hello-python/run`,
  );
}
