// WebSockets across processes: a gateway that takes a handshake for an app
// its own process does not run asks the runners over NATS, and the bytes
// travel on a subject pair (nats/byte-stream.ts) with flow control.
//
//   gateway                                  runner (queue group "runners")
//   subscribe skiff.ws.stream.{run}.down
//   request skiff.ws.open.{p}.{a} ─────────► runner.upgrade(...) to a replica
//                                            subscribe skiff.ws.stream.{run}.up
//   ◄──────────── {"kind":"upgraded", status, headers, head} (or "answered", or an error)
//   bytes ──► .up ──► replica     replica ──► .down ──► bytes
//
// The gateway keeps the caller's socket, the frame reader, the limits and
// the run record; the runner holds the replica slot until either side ends.
// A side that goes silent (its process died) is given up after three
// heartbeats, which closes the other.
import type { Duplex } from "node:stream";
import type { Msg, NatsConnection } from "nats";
import { ErrorCode, NatsError } from "nats";
import type { Logger } from "../config/index.js";
import { NatsByteStream, subjects } from "../nats/index.js";
import {
  Cancelled,
  errorMeta,
  NoRunner,
  ReplicaCrashed,
  RunnerError,
  runnerError,
  StartFailed,
  type ErrorMeta,
} from "../runs/index.js";
import { AppSubscriptions } from "./app-subscriptions.js";
import type { AppRef } from "./deployed-apps.js";
import type { Runner } from "./runner.js";
import type { UpgradeAnswer, UpgradeRequest } from "./upgrade.js";

/** The handshake as it travels to a runner. */
interface OpenRequest {
  runId: string;
  path: string;
  query: string;
  headers: Record<string, string>;
}

type OpenReply =
  | { kind: "upgraded"; status: number; headers: Record<string, string | string[]>; head: string; replicaId: string }
  | { kind: "answered"; status: number; headers: Record<string, string | string[]>; body: string; replicaId: string }
  | { error: ErrorMeta };

/** How long a gateway waits for a runner's answer to a handshake: the runner's own wait for a slot, and more. */
export const OPEN_TIMEOUT_MS = 65_000;

const encoder = new TextEncoder();
const decoder = new TextDecoder();

function headersOf(h: Record<string, string | string[] | undefined>): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  for (const [name, value] of Object.entries(h)) if (value !== undefined) out[name] = value;
  return out;
}

/** The runners' side: for each app deployed here, takes handshakes in queue group "runners". */
export class WebSocketDispatch {
  private readonly subs: AppSubscriptions;

  constructor(private readonly deps: { nc: NatsConnection; runner: Runner; logger: Logger }) {
    this.subs = new AppSubscriptions(
      deps.nc,
      (app) => [subjects.wsOpen(app.projectId, app.appName)],
      (app, msg) => this.open(app, msg),
    );
  }

  add(app: AppRef): void {
    this.subs.add(app);
  }

  remove(app: AppRef): void {
    this.subs.remove(app);
  }

  /** Takes no more handshakes, answering those already routed here; connections under way go on until they end. */
  close(): Promise<void> {
    return this.subs.close();
  }

  private async open(app: AppRef, msg: Msg): Promise<void> {
    const reply = (r: OpenReply) => void msg.respond(encoder.encode(JSON.stringify(r)));
    let req: OpenRequest;
    try {
      req = JSON.parse(decoder.decode(msg.data)) as OpenRequest;
      if (typeof req.runId !== "string" || !/^[0-9a-f-]{36}$/.test(req.runId)) throw new Error("no run id");
    } catch {
      return reply({ error: errorMeta(new StartFailed("a WebSocket handshake that cannot be read")) });
    }
    let answer: UpgradeAnswer;
    try {
      answer = await this.deps.runner.upgrade(app.projectId, app.appName, req);
    } catch (err) {
      if (!(err instanceof RunnerError))
        this.deps.logger.error({ err, runId: req.runId }, "a WebSocket handshake failed inside the runner");
      const e = err instanceof RunnerError ? err : new StartFailed("the runner could not open the connection");
      return reply({ error: errorMeta(e) });
    }
    if (answer.kind === "answered")
      return reply({
        kind: "answered",
        status: answer.status,
        headers: headersOf(answer.headers),
        body: answer.body.toString("base64"),
        replicaId: answer.replicaId,
      });
    // Listening before the answer goes out: the gateway may send at once.
    const stream = new NatsByteStream({
      nc: this.deps.nc,
      send: subjects.wsStream(req.runId, "down"),
      receive: subjects.wsStream(req.runId, "up"),
    });
    const socket = answer.socket;
    socket.pipe(stream);
    stream.pipe(socket);
    stream.on("error", () => socket.destroy());
    stream.once("close", () => socket.destroy());
    // A connection to the app that broke (not one that ended in order) takes the stream with it.
    socket.once("close", () => stream.writableEnded || stream.destroy());
    reply({
      kind: "upgraded",
      status: answer.status,
      headers: headersOf(answer.headers),
      head: answer.head.toString("base64"),
      replicaId: answer.replicaId,
    });
  }
}

/**
 * The gateway's side: the handshake to a runner that hosts the app, over
 * NATS. Resolves as Runner.upgrade does, the upgraded connection being a
 * NatsByteStream; rejects with NoRunner when no runner hosts the app.
 */
export async function upgradeRemote(nc: NatsConnection, app: AppRef, req: UpgradeRequest): Promise<UpgradeAnswer> {
  const stream = new NatsByteStream({
    nc,
    send: subjects.wsStream(req.runId, "up"),
    receive: subjects.wsStream(req.runId, "down"),
  });
  let reply: OpenReply;
  try {
    const open: OpenRequest = { runId: req.runId, path: req.path, query: req.query, headers: req.headers };
    const msg = await nc.request(subjects.wsOpen(app.projectId, app.appName), encoder.encode(JSON.stringify(open)), {
      timeout: OPEN_TIMEOUT_MS,
    });
    reply = JSON.parse(decoder.decode(msg.data)) as OpenReply;
  } catch (err) {
    stream.destroy();
    if (err instanceof NatsError && err.code === ErrorCode.NoResponders)
      throw new NoRunner(`no runner hosts app ${app.projectId}/${app.appName} right now`);
    if (err instanceof NatsError && err.code === ErrorCode.Timeout)
      throw new ReplicaCrashed(`the runner of app ${app.appName} did not answer the WebSocket handshake`, {
        cause: err,
      });
    throw err;
  }
  if ("error" in reply) {
    stream.destroy();
    throw runnerError(reply.error);
  }
  if (reply.kind === "answered") {
    stream.destroy();
    return { ...reply, body: Buffer.from(reply.body, "base64") };
  }
  if (req.signal?.aborted) {
    stream.destroy();
    throw new Cancelled();
  }
  const socket: Duplex = stream;
  return {
    kind: "upgraded",
    status: reply.status,
    headers: reply.headers,
    socket,
    head: Buffer.from(reply.head, "base64"),
    replicaId: reply.replicaId,
    // Another process's replica: its end shows only as the stream's.
    replicaExited: () => new Promise<void>(() => {}),
  };
}
