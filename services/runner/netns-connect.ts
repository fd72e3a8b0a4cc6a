// Direct connections to sandboxed Custom apps. Such an app listens on
// 127.0.0.1:$PORT inside its sandbox's network namespace, which this process
// cannot enter (Node has no setns): by default every request goes through the
// sandbox's channel to the relay in it (shims/relay.py), two more processes
// on each request's path. netns-connect.py, a helper outside every sandbox,
// makes connections from inside the namespace and hands their sockets over
// the helper's IPC channel, so requests go straight to the app.
//
// Entering another network namespace needs CAP_SYS_ADMIN: skiff as root.
// Where the helper cannot (or there is no python3), `open` says so and the
// replica keeps the relay; a connection that fails falls back to it too.
import { spawn, type ChildProcess } from "node:child_process";
import http from "node:http";
import net from "node:net";
import type { Duplex } from "node:stream";
import path from "node:path";
import type { Logger } from "../config/index.js";

const HELPER = path.join(import.meta.dirname, "netns-connect.py");
/**
 * How long the helper tries a connect before it answers with an error. The
 * helper never waits on one app: an app that accepts no connection (its
 * listen backlog is full) costs only its own callers this long, after which
 * they go through its channel.
 */
export const CONNECT_DEADLINE_MS = 2_000;
/**
 * Connects the helper has under way in one sandbox at a time; further ones
 * wait for a slot of that sandbox, within the deadline, so one app holds at
 * most this many of the helper's sockets.
 */
export const CONNECTS_PER_NAMESPACE = 32;
/** How long an open or a connect may take the helper before it is given up (past its own deadline, whose error says more). */
const ANSWER_MS = 5_000;

type Reply = { op: "opened"; ns: string; error?: string } | { op: "connected"; id: number; error?: string };

interface Waiter {
  resolve(value: { error?: string; socket?: net.Socket }): void;
  timer: NodeJS.Timeout;
}

export class NetnsConnector {
  private child: ChildProcess | undefined;
  private next = 1;
  private readonly waiting = new Map<string, Waiter>();
  private stopped = false;
  /** Whether a namespace that could not be entered has been logged (once is enough). */
  private said = false;

  constructor(
    private readonly python: string,
    private readonly logger: Logger,
  ) {}

  private helper(): ChildProcess {
    if (this.child) return this.child;
    const args = ["-I", "-S", HELPER, String(CONNECT_DEADLINE_MS), String(CONNECTS_PER_NAMESPACE)];
    const child = spawn(this.python, args, { stdio: ["ignore", "ignore", "pipe", "ipc"], serialization: "json" });
    child.stderr!.setEncoding("utf8");
    child.stderr!.on("data", (text: string) => this.logger.warn({ helper: "netns-connect" }, text.trim()));
    child.on("message", (m: Reply, handle: unknown) => {
      const key = m?.op === "opened" ? `ns:${m.ns}` : m?.op === "connected" ? `id:${m.id}` : undefined;
      const waiter = key === undefined ? undefined : this.waiting.get(key);
      // A socket nobody asked for (or asked for too late) is closed, never used.
      const socket = handle instanceof net.Socket ? handle : undefined;
      if (waiter === undefined) return void socket?.destroy();
      this.waiting.delete(key!);
      clearTimeout(waiter.timer);
      waiter.resolve({ error: m.error, socket });
    });
    child.on("error", (err) => this.logger.warn({ err }, "netns-connect helper failed"));
    child.on("exit", (code, signal) => {
      if (this.child === child) this.child = undefined;
      for (const [key, w] of this.waiting) {
        clearTimeout(w.timer);
        w.resolve({ error: `the helper ended (${signal ?? `exit code ${code}`})` });
        this.waiting.delete(key);
      }
      if (!this.stopped) this.logger.warn({ code, signal }, "netns-connect helper ended; started again when needed");
    });
    this.child = child;
    return child;
  }

  private ask(key: string, message: object): Promise<{ error?: string; socket?: net.Socket }> {
    if (this.stopped) return Promise.resolve({ error: "stopped" });
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.waiting.delete(key);
        resolve({ error: `no answer within ${ANSWER_MS} ms` });
      }, ANSWER_MS);
      this.waiting.set(key, { resolve, timer });
      const child = this.helper();
      if (!child.connected) return;
      child.send(message, (err) => {
        if (!err) return;
        const w = this.waiting.get(key);
        if (w === undefined) return;
        this.waiting.delete(key);
        clearTimeout(w.timer);
        resolve({ error: err.message });
      });
    });
  }

  /**
   * Holds the network namespace of `pid` (a sandbox's first process, just
   * started) under `ns`; resolves with why connections cannot be made there,
   * or undefined when they can.
   */
  async open(ns: string, pid: number): Promise<string | undefined> {
    const { error } = await this.ask(`ns:${ns}`, { op: "open", ns, pid });
    if (error !== undefined && !this.said) {
      this.said = true;
      this.logger.info({ why: error }, "requests to sandboxed Custom apps go through their relay");
    }
    return error;
  }

  /** A socket connected to 127.0.0.1:`port` in namespace `ns`. */
  async connect(ns: string, port: number): Promise<net.Socket> {
    const id = this.next++;
    const { error, socket } = await this.ask(`id:${id}`, { op: "connect", id, ns, port });
    if (socket === undefined) throw new Error(`cannot connect to port ${port} in the sandbox: ${error ?? "no socket"}`);
    return socket;
  }

  close(ns: string): void {
    if (this.child?.connected) this.child.send({ op: "close", ns }, () => undefined);
  }

  stop(): void {
    this.stopped = true;
    this.child?.kill();
    this.child = undefined;
  }
}

/**
 * The agent of the runner's keep-alive connections to replicas. A replica
 * with a direct route (see NetnsConnector) gets its new connections from it;
 * any other, or one whose route fails, connects to its socket path (its
 * channel) as a plain agent does. Pooled connections are kept by socket path
 * either way.
 */
/**
 * A free kept socket that reads anything is ended: an HTTP/1.1 server sends
 * nothing between answers, and the agent's free socket, with no parser,
 * would read and drop what an app sends without end (each read putting off
 * its idle timeout).
 */
function endOnData(this: Duplex): void {
  this.destroy();
}

export class ReplicaAgent extends http.Agent {
  private readonly routes = new Map<string, () => Promise<net.Socket>>();

  constructor(options?: http.AgentOptions) {
    super(options);
    // A socket whose exchange ended ("free"), kept or about to be closed, watched until its next exchange.
    this.on("free", (socket: Duplex) => socket.on("data", endOnData));
  }

  override reuseSocket(socket: Duplex, request: http.ClientRequest): void {
    socket.off("data", endOnData);
    super.reuseSocket(socket, request);
  }

  /** New connections to the replica of channel `socketPath` come from `open` (undefined: through the channel). */
  route(socketPath: string, open: (() => Promise<net.Socket>) | undefined): void {
    if (open) this.routes.set(socketPath, open);
    else this.routes.delete(socketPath);
  }

  override createConnection(
    options: http.ClientRequestArgs,
    callback?: (err: Error | null, stream: Duplex) => void,
  ): Duplex | null | undefined {
    const open = options.socketPath === undefined ? undefined : this.routes.get(options.socketPath);
    if (open === undefined || callback === undefined) return net.createConnection(options as net.NetConnectOpts);
    open().then(
      (socket) => {
        // As net.createConnection does with the agent's timeout: an idle pooled socket is dropped before the app
        // closes it (see replicaAgent).
        if (options.timeout) socket.setTimeout(options.timeout);
        callback(null, socket);
      },
      // The channel (and the relay behind it) still leads to the app.
      () => callback(null, net.createConnection(options as net.NetConnectOpts)),
    );
    return undefined;
  }
}
