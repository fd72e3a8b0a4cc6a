// Requests to a sandboxed Custom app go straight to it, over connections made
// inside its network namespace (services/runner/netns-connect.ts), not through
// the relay in its sandbox: with the relay killed, new connections still reach
// the app; with direct connections turned off, the same kill cuts it off.
// Real bwrap sandboxes, real processes.
import { spawn } from "node:child_process";
import { mkdir, mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import http from "node:http";
import net from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parseAppConfig } from "../../services/apps/app-config.js";
import { silentLogger } from "../../services/config/logger.js";
import type { InvokeRequest } from "../../services/runs/invoke.js";
import { NetnsConnector, ReplicaAgent } from "../../services/runner/netns-connect.js";
import { RELAY_PYTHON } from "../../services/runner/replica-factory.js";
import { Runner } from "../../services/runner/runner.js";
import { defaultSandbox } from "../../services/runner/sandbox.js";
import { skiffToml } from "../helpers/apps.js";
import { machineCan } from "../helpers/machine.js";

const SANDBOX = defaultSandbox();
const SERVER = `
import http from "node:http";
http.createServer((req, res) => {
  req.resume();
  req.on("end", () => res.end(JSON.stringify({ path: req.url, pid: process.pid })));
}).listen(Number(process.env.PORT), "127.0.0.1");
`;
const asRoot = machineCan("sandbox-direct", process.getuid?.() === 0 ? undefined : "skiff is not root");
const relayPython = machineCan(
  "sandbox-direct NetnsConnector",
  RELAY_PYTHON ? undefined : "no python3 on the replica PATH",
);

let tmp: string;
let seq = 0;

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-direct-"));
});
afterAll(async () => {
  await rm(tmp, { recursive: true, force: true });
});

function request(p: string): InvokeRequest {
  return { runId: `run-${++seq}`, method: "GET", path: p, query: "", headers: {}, body: new Uint8Array(0) };
}

/** Processes below `pid` (its children, theirs, ...) running `comm` with `text` in their command line. */
async function descendants(pid: number, comm: string, text: string): Promise<number[]> {
  const parent = new Map<number, number>();
  const cmd = new Map<number, string>();
  for (const entry of await readdir("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = await readFile(`/proc/${entry}/stat`, "utf8");
      parent.set(Number(entry), Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]));
      if ((await readFile(`/proc/${entry}/comm`, "utf8")).trim() !== comm) continue;
      cmd.set(Number(entry), (await readFile(`/proc/${entry}/cmdline`, "utf8")).replaceAll("\0", " "));
    } catch {
      // gone meanwhile
    }
  }
  const below = (p: number): boolean => {
    for (let up = parent.get(p); up !== undefined && up > 1; up = parent.get(up)) if (up === pid) return true;
    return false;
  };
  return [...cmd].filter(([p, c]) => c.includes(text) && below(p)).map(([p]) => p);
}

async function startApp(directToApps: boolean): Promise<{ runner: Runner; call: () => Promise<number> }> {
  const name = `direct-${directToApps ? "on" : "off"}`;
  const dir = path.join(tmp, name);
  await mkdir(dir, { recursive: true });
  await writeFile(path.join(dir, "server.mjs"), SERVER);
  const config = parseAppConfig(
    skiffToml({
      name,
      runtime: { kind: "custom", command: ["node", "server.mjs"] },
      scaling: { max_replicas: 1, replica_concurrency: 32 },
    }),
  );
  const runner = new Runner({
    workDir: path.join(tmp, `work-${name}`),
    logger: silentLogger,
    sandbox: { ...SANDBOX, direct: directToApps },
  });
  await runner.deploy({ projectId: "p-direct", appName: name, version: 1, dir, config });
  const call = async () => {
    const res = await runner.invoke("p-direct", name, request("/hello"));
    expect(res.status).toBe(200);
    return (JSON.parse(Buffer.from(res.body).toString()) as { pid: number }).pid;
  };
  return { runner, call };
}

/** Kills the relay of the app's one replica; the app itself keeps running. */
async function killRelay(runner: Runner, app: string): Promise<void> {
  const [replica] = runner.replicas("p-direct", app);
  const relays = await descendants(replica.pid!, "python3", "relay.py");
  expect(relays).toHaveLength(1);
  process.kill(relays[0], "SIGKILL");
  for (let i = 0; i < 100 && (await descendants(replica.pid!, "python3", "relay.py")).length > 0; i++)
    await new Promise((r) => setTimeout(r, 20));
}

describe.skipIf(!asRoot)("sandboxed Custom apps: requests skip the relay", () => {
  it("with the relay killed, new connections still reach the app, which answers as before", async () => {
    const { runner, call } = await startApp(true);
    try {
      const pid = await call();
      await killRelay(runner, "direct-on");
      // Concurrent calls open new connections beside the pooled one.
      const pids = await Promise.all(Array.from({ length: 16 }, () => call()));
      expect(new Set(pids)).toEqual(new Set([pid]));
    } finally {
      await runner.close();
    }
  });

  it("with direct connections off, the same kill cuts the app off: its requests went through the relay", async () => {
    const { runner, call } = await startApp(false);
    try {
      await call();
      await killRelay(runner, "direct-off");
      const outcomes = await Promise.allSettled(Array.from({ length: 16 }, () => call()));
      expect(outcomes.some((o) => o.status === "rejected")).toBe(true);
    } finally {
      await runner.close();
    }
  });
});

describe("ReplicaAgent", () => {
  it("takes a routed replica's new connections from its route, with the agent's idle timeout; a failing route falls back to the channel", async () => {
    const servers = ["channel", "direct"].map((name) =>
      http.createServer((req, res) => {
        req.resume();
        res.end(name);
      }),
    );
    const socketPath = path.join(tmp, "agent.sock");
    await new Promise<void>((r) => servers[0].listen(socketPath, r));
    await new Promise<void>((r) => servers[1].listen(0, "127.0.0.1", r));
    const port = (servers[1].address() as net.AddressInfo).port;
    const agent = new ReplicaAgent({ keepAlive: true, timeout: 1234 });
    const get = () =>
      new Promise<{ body: string; timeout: number | undefined }>((resolve, reject) => {
        const req = http.get({ socketPath, path: "/", agent }, (res) => {
          // While the request holds it: the agent sets its timeout again only once the socket is free.
          const timeout = (req.socket as net.Socket).timeout;
          let body = "";
          res.setEncoding("utf8");
          res.on("data", (c: string) => (body += c));
          res.on("end", () => resolve({ body, timeout }));
        });
        req.on("error", reject);
      });
    try {
      expect((await get()).body).toBe("channel");
      agent.destroy();
      agent.route(
        socketPath,
        () =>
          new Promise((resolve) => {
            const s = net.connect(port, "127.0.0.1", () => resolve(s));
          }),
      );
      const direct = await get();
      expect(direct.body).toBe("direct");
      expect(direct.timeout).toBe(1234);
      agent.destroy();
      agent.route(socketPath, () => Promise.reject(new Error("no way in")));
      expect((await get()).body).toBe("channel");
    } finally {
      agent.destroy();
      for (const server of servers) server.close();
    }
  });
});

describe.skipIf(!asRoot || !relayPython)("NetnsConnector", () => {
  it("hands over connected, non-blocking sockets made inside another network namespace; refuses its own", async () => {
    // A server on 127.0.0.1 of a network namespace of its own (unshare execs it: its pid is the namespace's).
    const inside = spawn(
      "unshare",
      [
        "-n",
        "sh",
        "-c",
        `ip link set lo up && exec ${RELAY_PYTHON} -c "
import http.server as h
class A(h.BaseHTTPRequestHandler):
    def do_GET(s):
        s.send_response(200); s.send_header('content-length', '6'); s.end_headers(); s.wfile.write(b'inside')
    def log_message(*a): pass
s = h.HTTPServer(('127.0.0.1', 8123), A)
print('ready', flush=True)
s.serve_forever()"`,
      ],
      { stdio: ["ignore", "pipe", "inherit"] },
    );
    const netns = new NetnsConnector(RELAY_PYTHON!, silentLogger);
    try {
      await new Promise<void>((resolve, reject) => {
        inside.stdout!.on("data", (d: Buffer) => d.toString().includes("ready") && resolve());
        inside.once("exit", (code) => reject(new Error(`the server in its namespace exited (${code})`)));
      });
      expect(await netns.open("own", process.pid)).toMatch(/shares this network namespace/);
      expect(await netns.open("inside", inside.pid!)).toBeUndefined();
      await expect(netns.connect("inside", 8124)).rejects.toThrow(/refused/i);
      const socket = await netns.connect("inside", 8123);
      // O_NONBLOCK (04000) on the descriptor: the event loop never waits in a read or a write of it.
      const fd = (socket as unknown as { _handle: { fd: number } })._handle.fd;
      const flags = parseInt(/flags:\s+(\d+)/.exec(await readFile(`/proc/self/fdinfo/${fd}`, "utf8"))![1], 8);
      expect(flags & 0o4000).toBe(0o4000);
      const answer = await new Promise<string>((resolve, reject) => {
        let text = "";
        socket.setEncoding("utf8");
        socket.on("data", (c: string) => (text += c));
        socket.on("end", () => resolve(text));
        socket.on("error", reject);
        socket.end("GET / HTTP/1.0\r\n\r\n");
      });
      expect(answer).toMatch(/^HTTP\/1\.0 200[\s\S]*inside$/);
    } finally {
      netns.stop();
      inside.kill("SIGKILL");
    }
  });
});
