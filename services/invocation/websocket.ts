// WebSockets to Custom apps: `GET /v4/{project}/{app}/{path}` with
// `Upgrade: websocket`. skiff checks the call as it checks a REST call (the
// token, the project, the app), takes a slot of one of the app's replicas,
// sends the upgrade request on (the headers apps get, plus X-Request-Id =
// the run id), passes the app's 101 answer back, and from then on relays
// bytes both ways (server/websocket-relay.ts): the app speaks WebSocket
// itself. Every refusal is a plain HTTP answer before the upgrade, with
// X-Request-Id and a `{"code","message"}` body.
//
// The token comes in `Authorization: Bearer <token>` or, for browsers (which
// cannot set headers on a WebSocket), as the subprotocol `bearer.<token>`
// beside the app's own: `new WebSocket(url, ["bearer." + token, "chat"])`.
// That entry never reaches the app. When the caller offered no subprotocol
// but that entry, and the app chose none, skiff's 101 names that entry, since
// a browser fails a handshake whose answer names none of those it offered.
//
// The connection is a run: recorded `running` at the 101, and final when it
// closes, with its duration, close code and bytes (RunRecord.websocket).
// The runner client takes the connection to a replica of this process's
// runner when it hosts the app, else, over NATS, to a runner that does
// (runner-client/).
import { STATUS_CODES } from "node:http";
import type http from "node:http";
import type net from "node:net";
import { Code, ConnectError } from "@connectrpc/connect";
import type { AppRecord } from "../apps/index.js";
import type { Authenticator } from "../auth/index.js";
import type { Metrics } from "../metrics/index.js";
import type { UpgradeAnswer } from "../runner-client/index.js";
import {
  Cancelled,
  newRunId,
  outcomeOfAnswer,
  outcomeOfError,
  runFailure,
  type RunOutcome,
  type RunRecord,
} from "../runs/index.js";
import {
  appRequestHeaders,
  CLOSE,
  codeHttpStatus,
  errorBody,
  isPassedToCaller,
  WebSocketRelay,
  type RelayEnd,
  type UpgradeHandler,
} from "../server/index.js";
import { findApp } from "./checks.js";
import type { InvocationDeps } from "./deps.js";
import { forwardedQuery } from "./run.js";

export interface WebSocketLimits {
  /** SKIFF_WEBSOCKET_IDLE_TIMEOUT_MS */
  idleTimeoutMs: number;
  /** SKIFF_WEBSOCKET_MAX_MESSAGE_BYTES */
  maxMessageBytes: number;
  /** SKIFF_WEBSOCKET_MAX_CONNECTIONS_PER_APP */
  maxConnectionsPerApp: number;
}

export interface WebSocketOptions {
  authenticator: Pick<Authenticator, "authenticate">;
  limits: WebSocketLimits;
  metrics?: Metrics;
}

/** The subprotocol entry that carries a browser's token. */
export const TOKEN_PROTOCOL_PREFIX = "bearer.";
/** How often an open connection's token is checked again: a revoked or expired one closes it (1008). */
const TOKEN_RECHECK_MS = 1_000;
const CHALLENGE = { "www-authenticate": 'Bearer realm="skiff"' };
const PATH = /^\/v4\/([^/?]+)\/([^/?]+)(\/[^?]*)?$/;

const quoted = (text: string) => JSON.stringify(text.length > 80 ? `${text.slice(0, 80)}...` : text);

/** How long a stopping process waits for its closed connections' runs to be recorded. */
const RECORD_WAIT_MS = 5_000;

export interface WebSockets {
  /** Takes every HTTP/1.1 upgrade request of the port. */
  upgrade: UpgradeHandler;
  /** Waits (bounded) until the connections that were open are recorded; call after the port has closed them. */
  close(): Promise<void>;
}

export function webSockets(deps: InvocationDeps, opts: WebSocketOptions): WebSockets {
  const open = new Map<string, number>();
  const live = new Set<Promise<unknown>>();
  return {
    upgrade(req, socket, head, draining) {
      socket.on("error", () => socket.destroy());
      const runId = newRunId();
      accept(deps, opts, open, { req, socket, head, draining, runId, live }).catch((err: unknown) => {
        if (!(err instanceof ConnectError)) deps.logger.error({ err, runId }, "a WebSocket call failed inside skiff");
        refuse(socket, runId, err instanceof ConnectError ? err : new ConnectError("internal error", Code.Internal));
      });
    },
    async close() {
      if (live.size === 0) return;
      const waited = new Promise((resolve) => setTimeout(resolve, RECORD_WAIT_MS).unref());
      await Promise.race([Promise.allSettled([...live]), waited]);
    },
  };
}

interface Call {
  req: http.IncomingMessage;
  socket: net.Socket;
  head: Buffer;
  draining: AbortSignal;
  runId: string;
  /** The open connections, each until its run is recorded. */
  live: Set<Promise<unknown>>;
}

/** A plain HTTP answer before any upgrade: the error's status, its metadata as headers, X-Request-Id. */
function refuse(socket: net.Socket, runId: string, err: ConnectError): void {
  if (socket.destroyed) return;
  const headers: Record<string, string> = { "content-type": "application/json" };
  err.metadata.forEach((value, name) => (headers[name] = value));
  writeAnswer(socket, codeHttpStatus(err.code), headers, Buffer.from(errorBody(err.code, err.rawMessage)), runId);
}

function writeAnswer(
  socket: net.Socket,
  status: number,
  headers: Record<string, string | string[]>,
  body: Buffer,
  runId: string,
): void {
  const lines = [`HTTP/1.1 ${status} ${STATUS_CODES[status] ?? "Unknown"}`];
  for (const [name, value] of Object.entries(headers))
    for (const v of Array.isArray(value) ? value : [value]) lines.push(`${name}: ${v}`);
  lines.push(`content-length: ${body.length}`, `x-request-id: ${runId}`, "connection: close", "", "");
  socket.end(Buffer.concat([Buffer.from(lines.join("\r\n"), "latin1"), body]));
}

function header(req: http.IncomingMessage, name: string): string | undefined {
  const value = req.headers[name];
  return Array.isArray(value) ? value.join(", ") : value;
}

/** The token of the call, and the subprotocols left for the app. */
function credentials(req: http.IncomingMessage): { token?: string; protocols: string[]; tokenOnly: boolean } {
  const offered = (header(req, "sec-websocket-protocol") ?? "")
    .split(",")
    .map((p) => p.trim())
    .filter((p) => p !== "");
  const entry = offered.find((p) => p.startsWith(TOKEN_PROTOCOL_PREFIX));
  const protocols = offered.filter((p) => !p.startsWith(TOKEN_PROTOCOL_PREFIX));
  const bearer = /^Bearer +(\S+) *$/i.exec(header(req, "authorization") ?? "")?.[1];
  const fromProtocol = entry?.slice(TOKEN_PROTOCOL_PREFIX.length);
  return {
    token: bearer ?? (fromProtocol === "" ? undefined : fromProtocol),
    protocols,
    tokenOnly: entry !== undefined && protocols.length === 0,
  };
}

function target(req: http.IncomingMessage): { projectId: string; appName: string; path: string; query: string } {
  const url = req.url ?? "/";
  const q = url.indexOf("?");
  const pathPart = q < 0 ? url : url.slice(0, q);
  const m = PATH.exec(pathPart);
  if (!m)
    throw new ConnectError(
      `no WebSocket endpoint at ${quoted(pathPart)}: WebSockets are served at /v4/{project}/{app}/{path}`,
      Code.NotFound,
    );
  try {
    return {
      projectId: decodeURIComponent(m[1]),
      appName: decodeURIComponent(m[2]),
      path: m[3] ?? "/",
      query: q < 0 ? "" : url.slice(q + 1),
    };
  } catch {
    throw new ConnectError("the path is not valid percent-encoding", Code.InvalidArgument);
  }
}

/** The refusals of skiff's own query parameters: a WebSocket has neither a webhook nor a background run. */
function appQuery(raw: string): string {
  const query = new URLSearchParams(raw);
  if ((query.get("webhookEndpoint") ?? "") !== "")
    throw new ConnectError(
      "webhookEndpoint works for HTTP requests only, not WebSockets: a WebSocket has no single response body to forward",
      Code.InvalidArgument,
    );
  const async = query.get("async");
  if (async !== null && async !== "false" && async !== "0" && async !== "")
    throw new ConnectError(
      "async=true works for HTTP requests only: a WebSocket is a connection, not a run in the background",
      Code.InvalidArgument,
    );
  return forwardedQuery(raw);
}

async function principalFor(opts: WebSocketOptions, token: string | undefined, projectId: string): Promise<void> {
  if (token === undefined)
    throw new ConnectError(
      `missing bearer token: send Authorization: Bearer <token>, or (browsers) the subprotocol ${TOKEN_PROTOCOL_PREFIX}<token>`,
      Code.Unauthenticated,
      CHALLENGE,
    );
  let principal;
  try {
    principal = await opts.authenticator.authenticate(token);
  } catch {
    throw new ConnectError("cannot check the token right now; try again", Code.Unavailable);
  }
  if (!principal) throw new ConnectError("invalid bearer token", Code.Unauthenticated, CHALLENGE);
  if (principal.kind === "service_account" && principal.projectId !== projectId)
    throw new ConnectError("this token does not grant access to that project", Code.PermissionDenied);
}

async function accept(deps: InvocationDeps, opts: WebSocketOptions, open: Map<string, number>, call: Call) {
  const { req, socket, runId } = call;
  const { projectId, appName, path, query: rawQuery } = target(req);
  if (req.method !== "GET") throw new ConnectError("a WebSocket handshake is a GET request", Code.InvalidArgument);
  if (header(req, "upgrade")?.toLowerCase() !== "websocket")
    throw new ConnectError(
      `cannot upgrade to ${quoted(header(req, "upgrade") ?? "")}: only WebSocket upgrades are served`,
      Code.InvalidArgument,
    );
  const { token, protocols, tokenOnly } = credentials(req);
  await principalFor(opts, token, projectId);
  const app = await findApp(deps.registry, projectId, appName);
  if (app.config.runtime.kind !== "custom")
    throw new ConnectError(
      `app ${app.app_name} is a Cortex app: WebSockets reach Custom apps only, which answer the handshake themselves; call a Cortex function with POST`,
      Code.InvalidArgument,
    );
  const query = appQuery(rawQuery);
  if (call.draining.aborted) throw new ConnectError("skiff is shutting down", Code.Unavailable);
  const key = `${projectId}/${appName}`;
  const count = open.get(key) ?? 0;
  if (count >= opts.limits.maxConnectionsPerApp)
    throw new ConnectError(
      `app ${appName} has ${count} WebSocket connections open through this process, the most it takes (SKIFF_WEBSOCKET_MAX_CONNECTIONS_PER_APP)`,
      Code.ResourceExhausted,
      { "retry-after": "1" },
    );
  open.set(key, count + 1);
  let counted = true;
  const uncount = () => {
    if (!counted) return;
    counted = false;
    const left = (open.get(key) ?? 1) - 1;
    if (left > 0) open.set(key, left);
    else open.delete(key);
  };

  const setup = new AbortController();
  const started = performance.now();
  const onGone = () => setup.abort(new Cancelled());
  socket.once("close", onGone);
  let answer: UpgradeAnswer;
  const now = new Date().toISOString();
  const record: RunRecord = {
    run_id: runId,
    project_id: projectId,
    app_name: appName,
    path,
    async: false,
    status: "running",
    queued_at: now,
    started_at: now,
    attempts: 1,
    runner: deps.control.id,
  };
  try {
    const offered: [string, string][] = [];
    for (const [name, value] of Object.entries(req.headers))
      if (value !== undefined && name !== "sec-websocket-protocol")
        offered.push([name, Array.isArray(value) ? value.join(", ") : value]);
    // The headers apps get (never the token), and the app's own subprotocols.
    const headers = appRequestHeaders(offered);
    if (protocols.length > 0) headers["sec-websocket-protocol"] = protocols.join(", ");
    const upgrade = { runId, path, query, headers, signal: setup.signal };
    answer = await deps.runners.upgrade(app, upgrade);
  } catch (err) {
    uncount();
    if (err instanceof ConnectError) throw err;
    if (setup.signal.aborted) return void socket.destroy();
    const failure = runFailure(err);
    if (failure.type === "internal") deps.logger.error({ err, runId }, "a WebSocket handshake failed inside skiff");
    throw failure.connect;
  } finally {
    socket.off("close", onGone);
  }

  if (answer.kind === "answered") {
    uncount();
    const headers = passed(answer.headers);
    writeAnswer(call.socket, answer.status, headers, answer.body, runId);
    deps.syncRuns.finished(
      record,
      outcomeOfAnswer({
        status: answer.status,
        headers,
        body: answer.body,
        runTimeMs: Math.round(performance.now() - started),
        replicaId: answer.replicaId,
      }),
    );
    return;
  }
  if (socket.destroyed) {
    uncount();
    answer.socket.destroy();
    deps.syncRuns.finished(record, outcomeOfError(new Cancelled(), 0));
    return;
  }
  connected(deps, opts, call, app, record, answer, { token: token!, tokenOnly, uncount });
}

/** The app's headers that the caller gets (as an HTTP answer's). */
function passed(headers: http.IncomingHttpHeaders): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  for (const [name, value] of Object.entries(headers))
    if (value !== undefined && isPassedToCaller(name)) out[name] = value;
  return out;
}

/** The app answered 101: the caller gets it, then the bytes flow until either side closes. */
function connected(
  deps: InvocationDeps,
  opts: WebSocketOptions,
  call: Call,
  app: AppRecord,
  record: RunRecord,
  answer: Extract<UpgradeAnswer, { kind: "upgraded" }>,
  auth: { token: string; tokenOnly: boolean; uncount: () => void },
): void {
  const { socket, runId } = call;
  const headers: Record<string, string | string[]> = { upgrade: "websocket", connection: "Upgrade" };
  Object.assign(headers, passed(answer.headers));
  // A browser fails a handshake whose answer names none of the subprotocols it offered.
  const echo = `${TOKEN_PROTOCOL_PREFIX}${auth.token}`;
  if (auth.tokenOnly && headers["sec-websocket-protocol"] === undefined && /^[\x21-\x7e]+$/.test(echo))
    headers["sec-websocket-protocol"] = echo;
  const lines = ["HTTP/1.1 101 Switching Protocols", `x-request-id: ${runId}`];
  for (const [name, value] of Object.entries(headers))
    for (const v of Array.isArray(value) ? value : [value]) lines.push(`${name}: ${v}`);
  socket.setNoDelay(true);
  socket.write(lines.join("\r\n") + "\r\n\r\n");

  const graceSeconds = app.config.scaling.responseGracePeriod;
  const relay = new WebSocketRelay(socket, answer.socket, {
    maxMessageBytes: opts.limits.maxMessageBytes,
    idleTimeoutMs: opts.limits.idleTimeoutMs,
    lifetimeMs: graceSeconds * 1000,
    reasons: {
      idle: `idle for ${Math.round(opts.limits.idleTimeoutMs / 1000)} s (SKIFF_WEBSOCKET_IDLE_TIMEOUT_MS)`,
      lifetime: `the connection passed the app's response_grace_period (${graceSeconds} s)`,
      too_large: `message larger than ${opts.limits.maxMessageBytes} bytes (SKIFF_WEBSOCKET_MAX_MESSAGE_BYTES)`,
    },
    callerHead: call.head,
    appHead: answer.head,
  });
  deps.syncRuns.running(record);
  const labels = { project: record.project_id, app: record.app_name };
  opts.metrics?.websockets.inc(labels);
  deps.logger.debug({ runId, app: `${record.project_id}/${record.app_name}` }, "WebSocket open");

  const onDrain = () => relay.close("shutdown", CLOSE.GOING_AWAY, "skiff is shutting down");
  call.draining.addEventListener("abort", onDrain, { once: true });
  const cancel = new AbortController();
  cancel.signal.addEventListener("abort", () => relay.close("cancelled", CLOSE.NORMAL, "the run was cancelled"));
  const recheck = setInterval(() => {
    opts.authenticator.authenticate(auth.token).then(
      (p) => p || relay.close("revoked", CLOSE.POLICY_VIOLATION, "the token expired or was revoked"),
      () => undefined, // unknown (NATS unreachable): the connection goes on
    );
  }, TOKEN_RECHECK_MS);
  recheck.unref();

  const finished = relay.ended.then(async (end) => {
    clearInterval(recheck);
    call.draining.removeEventListener("abort", onDrain);
    auth.uncount();
    opts.metrics?.websockets.dec(labels);
    // A replica that died is the clearer reason: its exit follows the broken connection closely.
    const replicaGone =
      end.appDropped &&
      (await Promise.race([
        answer.replicaExited().then(() => true),
        new Promise<boolean>((resolve) => setTimeout(() => resolve(false), 250)),
      ]));
    const final: RunRecord = {
      ...record,
      websocket: {
        close_code: end.closeCode,
        close_reason: end.closeReason,
        closed_by: end.closedBy,
        bytes_in: end.bytesIn,
        bytes_out: end.bytesOut,
        messages_in: end.messagesIn,
        messages_out: end.messagesOut,
      },
    };
    deps.logger.debug({ runId, ...final.websocket }, "WebSocket closed");
    deps.syncRuns.finished(final, websocketOutcome(end, replicaGone, final.websocket!));
    // The final event goes out within a turn of the loop: a process that stops waits for that.
    await new Promise((resolve) => setImmediate(resolve));
  });
  deps.control.track(runId, cancel, finished);
  call.live.add(finished);
  void finished.finally(() => call.live.delete(finished));
}

/** How a connection's run ended: success for a clean close, failure for a broken one or a limit, cancelled. */
export function websocketOutcome(end: RelayEnd, replicaGone: boolean, summary: object): RunOutcome {
  const body = { contentType: "application/json", data: new TextEncoder().encode(JSON.stringify(summary)) };
  const base = { statusCode: 101, runTimeMs: end.durationMs, body };
  const failure = (type: string, message: string): RunOutcome => ({
    ...base,
    status: "failure",
    error: { type, message },
  });
  switch (end.skiff) {
    case "idle":
    case "shutdown":
      return { ...base, status: "success" };
    case "cancelled":
      return { ...base, status: "cancelled", error: { type: "cancelled", message: end.closeReason } };
    case "lifetime":
      return failure("timeout", end.closeReason);
    case "too_large":
      return failure("message_too_big", end.closeReason);
    case "revoked":
      return failure("unauthenticated", end.closeReason);
  }
  if (end.appDropped)
    return failure(
      "replica_crashed",
      replicaGone
        ? "the app's replica stopped while the connection was open"
        : "the app's connection ended without a close frame",
    );
  if (end.closeCode === CLOSE.ABNORMAL)
    return failure("connection_dropped", `the ${end.closedBy}'s connection ended without a close frame`);
  if (end.closeCode === CLOSE.INTERNAL_ERROR)
    return failure("internal_error", `closed with 1011 by the ${end.closedBy}: ${end.closeReason}`);
  return { ...base, status: "success" };
}
