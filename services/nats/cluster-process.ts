// A JetStream cluster of local nats-server processes on loopback, for
// `npm run cluster` (scripts/cluster.ts) and the fault tests: each node has
// its own client and route port (chosen once, so a node comes back on the
// same ones), its own file store, and admits one user with a generated
// password. Streams and buckets get their copies on it with
// SKIFF_NATS_REPLICAS=3.
import { randomBytes } from "node:crypto";
import { mkdir, rm, writeFile } from "node:fs/promises";
import net from "node:net";
import path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { connect } from "nats";
import { NATS_SERVER_BINARY, spawnNatsServer, type NatsServerProcess } from "./server-process.js";

interface ClusterNode {
  readonly name: string;
  /** nats://127.0.0.1:port */
  readonly url: string;
  readonly pid: number;
  readonly running: boolean;
  /** SIGTERM (a clean stop), keeping its store. */
  stop(): Promise<void>;
  /** SIGKILL, keeping its store, as a crash would. */
  kill(): Promise<void>;
  /** Starts it again on its ports and store. */
  start(): Promise<void>;
}

export interface NatsCluster {
  nodes: ClusterNode[];
  /** Every node's client URL, comma-separated (SKIFF_NATS_URL). */
  url: string;
  user: string;
  password: string;
  /** Stops every node. */
  stop(): Promise<void>;
}

/** A port free right now on 127.0.0.1. */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.on("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
  });
}

type ClusterOptions = { dir: string; size?: number; onLog?: (node: string, line: string) => void };

/** Starts of a cluster made with ports chosen anew when another process took one of them first. */
const PORT_ATTEMPTS = 3;

/**
 * Starts `size` nodes under `dir` (one folder each) and waits until
 * JetStream can place a stream on all of them, so that skiff can provision at once.
 * Its ports are chosen free before the nodes listen on them; when another
 * process took one meanwhile, the nodes started are stopped, their folders
 * removed, and the cluster is made again on other ports.
 */
export async function startNatsCluster(opts: ClusterOptions) {
  for (let attempt = 1; ; attempt++) {
    try {
      return await startOnce(opts);
    } catch (err) {
      if (attempt >= PORT_ATTEMPTS || !String((err as Error)?.message).includes("address already in use")) throw err;
    }
  }
}

async function startOnce(opts: ClusterOptions) {
  const size = opts.size ?? 3;
  const user = "skiff";
  const password = randomBytes(18).toString("base64url");
  const ports = await Promise.all(Array.from({ length: size * 2 }, freePort));
  const routes = Array.from({ length: size }, (_, i) => `nats-route://127.0.0.1:${ports[size + i]}`);
  const nodes: ClusterNode[] = [];
  try {
    for (let i = 0; i < size; i++) {
      const name = `n${i + 1}`;
      const home = path.join(opts.dir, name);
      const conf = [
        `server_name: ${name}`,
        `listen: 127.0.0.1:${ports[i]}`,
        `ports_file_dir: ${JSON.stringify(home)}`,
        `jetstream { store_dir: ${JSON.stringify(path.join(home, "store"))} }`,
        `authorization { user: ${JSON.stringify(user)}, password: ${JSON.stringify(password)} }`,
        `cluster {`,
        `  name: skiff`,
        `  listen: 127.0.0.1:${ports[size + i]}`,
        `  routes: [${routes.filter((_, j) => j !== i).join(", ")}]`,
        `}`,
      ];
      nodes.push(await startNode(name, home, ports[i], conf, opts.onLog));
    }
  } catch (err) {
    await Promise.all(nodes.map((n) => n.stop()));
    await Promise.all(
      Array.from({ length: size }, (_, i) => rm(path.join(opts.dir, `n${i + 1}`), { recursive: true, force: true })),
    );
    throw err;
  }
  const url = nodes.map((n) => n.url).join(",");
  await waitForPlacement(url, user, password, size);
  return {
    nodes,
    url,
    user,
    password,
    stop: async () => {
      await Promise.all(nodes.map((n) => n.stop()));
    },
  } satisfies NatsCluster;
}

/** Writes a node's configuration into `home` and starts it; the node can be stopped, killed and started again. */
async function startNode(
  name: string,
  home: string,
  port: number,
  conf: string[],
  onLog: ClusterOptions["onLog"],
): Promise<ClusterNode> {
  await mkdir(home, { recursive: true, mode: 0o700 });
  const file = path.join(home, "nats.conf");
  await writeFile(file, conf.join("\n") + "\n", { mode: 0o600 });
  let server: NatsServerProcess | undefined;
  const launch = async () => {
    server = await spawnNatsServer({
      binary: NATS_SERVER_BINARY,
      args: ["-c", file],
      portsDir: home,
      onLog: (line) => onLog?.(name, line),
    });
  };
  await launch();
  return {
    name,
    url: `nats://127.0.0.1:${port}`,
    get pid() {
      return server?.pid ?? 0;
    },
    get running() {
      return server !== undefined;
    },
    stop: async () => {
      await server?.stop();
      server = undefined;
    },
    kill: async () => {
      await server?.kill();
      server = undefined;
    },
    start: async () => {
      if (!server) await launch();
    },
  };
}

/**
 * JetStream in a cluster places a stream on `size` nodes only once they have
 * all joined its meta group: a probe stream with that many copies is made
 * (and removed) to know it can.
 */
async function waitForPlacement(
  servers: string,
  user: string,
  pass: string,
  size: number,
  timeoutMs = 30_000,
): Promise<void> {
  const nc = await connect({ servers: servers.split(","), user, pass });
  try {
    const deadline = Date.now() + timeoutMs;
    const name = `cluster-probe-${randomBytes(4).toString("hex")}`;
    for (;;) {
      try {
        const jsm = await nc.jetstreamManager({ timeout: 2_000 });
        await jsm.streams.add({ name, subjects: [`${name}.>`], num_replicas: size });
        await jsm.streams.delete(name);
        return;
      } catch (err) {
        if (Date.now() > deadline)
          throw new Error(`the NATS cluster could not place ${size} copies within ${timeoutMs} ms`, { cause: err });
      }
      await sleep(200);
    }
  } finally {
    await nc.close();
  }
}
