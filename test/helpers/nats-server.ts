// A real nats-server for tests: its own port (127.0.0.1) and a
// temporary store, started in a few milliseconds. Tests never use the
// machine's shared server on 4222.
import { mkdtemp, readdir, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { connect, type NatsConnection } from "nats";
import { silentLogger } from "../../services/config/logger.js";
import { provision } from "../../services/nats/connect.js";
import { NATS_SERVER_BINARY, spawnNatsServer, type NatsServerProcess } from "../../services/nats/server-process.js";

export interface TestNatsOptions {
  /** Default true; false starts a server without JetStream. */
  jetstream?: boolean;
  /** Extra nats-server arguments. */
  args?: string[];
}

export interface TestNats {
  url: string;
  port: number;
  storeDir: string;
  /** Process id of the running server; changes with restart(). */
  readonly pid: number;
  /** Stops the server (SIGTERM) and removes its store. */
  stop(): Promise<void>;
  /** SIGKILL, keeping the store, as a crash would. */
  kill(): Promise<void>;
  /** Stops the server if it runs, then starts it again on the same port and store. */
  restart(): Promise<void>;
  /**
   * SIGSTOP, resolved once every thread of the server is stopped: until then a thread that was running
   * can still read and answer (a PONG to a PING sent after the signal, seen here). thaw() is SIGCONT.
   */
  freeze(): Promise<void>;
  thaw(): void;
}

export async function startNatsServer(opts: TestNatsOptions = {}): Promise<TestNats> {
  const dir = await mkdtemp(path.join(tmpdir(), "skiff-nats-"));
  const storeDir = path.join(dir, "store");
  const launch = (port: number) =>
    spawnNatsServer({
      binary: NATS_SERVER_BINARY,
      args: [
        "-a",
        "127.0.0.1",
        "-p",
        String(port),
        "--ports_file_dir",
        dir,
        ...(opts.jetstream === false ? [] : ["-js", "-sd", storeDir]),
        ...(opts.args ?? []),
      ],
      portsDir: dir,
    });

  let server: NatsServerProcess;
  try {
    server = await launch(-1);
  } catch (err) {
    await rm(dir, { recursive: true, force: true });
    throw err;
  }
  const port = server.port;
  return {
    url: server.url,
    port,
    storeDir,
    get pid() {
      return server.pid;
    },
    stop: async () => {
      await server.stop();
      await rm(dir, { recursive: true, force: true });
    },
    kill: () => server.kill(),
    freeze: () => frozen(server.pid),
    thaw: () => process.kill(server.pid, "SIGCONT"),
    restart: async () => {
      await server.stop();
      server = await launch(port);
    },
  };
}

/** Sends SIGSTOP to `pid` and waits (5 s at most) until /proc shows each of its threads stopped. */
async function frozen(pid: number): Promise<void> {
  process.kill(pid, "SIGSTOP");
  const until = Date.now() + 5_000;
  for (;;) {
    const threads = await readdir(`/proc/${pid}/task`);
    const states = await Promise.all(
      threads.map(async (tid) => {
        const stat = await readFile(`/proc/${pid}/task/${tid}/stat`, "utf8").catch(() => ") T");
        // The state follows the command name, which may hold spaces and parentheses.
        return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3);
      }),
    );
    if (states.every((state) => state === "T" || state === "t")) return;
    if (Date.now() > until) throw new Error(`nats-server ${pid} not stopped 5 s after SIGSTOP: ${states.join("")}`);
    await new Promise((resolve) => setTimeout(resolve, 1));
  }
}

/** A test server provisioned as skiff provisions it, and a client of it; stop() closes both. */
export async function startProvisionedNats(): Promise<{ nats: TestNats; nc: NatsConnection; stop(): Promise<void> }> {
  const nats = await startNatsServer();
  const nc = await connect({ servers: nats.url });
  await provision(nc, silentLogger);
  return {
    nats,
    nc,
    async stop() {
      await nc.close();
      await nats.stop();
    },
  };
}
