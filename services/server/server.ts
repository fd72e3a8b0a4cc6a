// One port for everything: HTTP/1.1 (REST, Connect, gRPC-Web) and cleartext
// HTTP/2 with prior knowledge (gRPC, Connect). A net.Server peeks at the first
// bytes of each connection and hands the socket to the http or http2 server.
import { setMaxListeners } from "node:events";
import http from "node:http";
import http2 from "node:http2";
import net from "node:net";
import { fromJsonString, type DescMessage, type DescMethod, type DescService } from "@bufbuild/protobuf";
import {
  Code,
  ConnectError,
  createMethodImplSpec,
  createServiceImplSpec,
  type ConnectRouter,
  type Interceptor,
  type MethodImplSpec,
} from "@connectrpc/connect";
import type { UniversalHandler } from "@connectrpc/connect/protocol";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import {
  DEFAULT_FIRST_BYTES_TIMEOUT_MS,
  DEFAULT_HEADERS_TIMEOUT_MS,
  DEFAULT_HTTP2_IDLE_TIMEOUT_MS,
  DEFAULT_KEEP_ALIVE_TIMEOUT_MS,
  DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
  MAX_RUN_SECONDS,
  type Logger,
} from "../config/index.js";
import { ConnectionGuard, type Connection, type ConnectionLimits } from "./connections.js";
import type { HealthState } from "./health.js";
import {
  answerRefusal,
  refusalOf,
  serviceOfProcedure,
  UploadSlots,
  type Admit,
  type AdmitVerdict,
  type UploadLimits,
} from "./admit.js";
import { answerUnimplemented, isGrpcRequest, minimalGrpcMessages } from "./grpc-status.js";
import { withBinaryParseErrors } from "./binary-errors.js";
import { hostMakesUrl } from "./headers.js";
import { discardRequest } from "./rest/body.js";
import { reflectionRoutes } from "./reflection.js";
import { isApiPath, type StaticHandler } from "./static-files.js";
import {
  createTranscoder,
  restRouteOf,
  type Cors,
  type NodeHandler,
  type RequestIds,
  type TranscoderOptions,
} from "./rest/transcoder.js";
import { malformedJson } from "./rest/errors.js";
import { jsonTextDecodeError } from "./json-errors.js";
import { METRICS_CONTENT_TYPE, type Metrics } from "../metrics/index.js";

type NodeRequest = Parameters<NodeHandler>[0];
type NodeResponse = Parameters<NodeHandler>[1];
const kRequest = Symbol("skiff request");
const kStarted = Symbol("skiff request start");
/** A response with its request and start time, for the metrics counted when it closes. */
type TrackedResponse = NodeResponse & { [kRequest]?: NodeRequest; [kStarted]?: number };

export interface ServerOptions {
  host: string;
  port: number;
  maxBodyBytes: number;
  /** Methods that take larger bodies than maxBodyBytes (an app bundle), on every protocol. */
  bodyLimits?: ReadonlyMap<DescMethod, number>;
  /** Methods whose every REST answer carries X-Request-Id (see TranscoderOptions.requestIds). */
  requestIds?: RequestIds;
  /** Methods whose handler may read a large REST body as it comes (see TranscoderOptions.streamedBodies). */
  streamedBodies?: TranscoderOptions["streamedBodies"];
  /** Judges every call by its headers before its body is read, on every protocol (see admit.ts). */
  admit?: Admit;
  /** Bodies above maxBodyBytes (the methods of bodyLimits) read at once (see admit.ts UploadSlots); default unbounded. */
  uploads?: UploadLimits;
  /** CORS of the resources of some methods (an app's allow-list; see TranscoderOptions.cors). */
  cors?: Cors;
  logger: Logger;
  health: HealthState;
  /** Services whose google.api.http rules become REST routes. */
  restServices: readonly DescService[];
  /** Registers every service implementation on the router. */
  routes: (router: ConnectRouter) => void;
  interceptors?: Interceptor[];
  /** Documents served as JSON by GET, by path (the OpenAPI documents). */
  documents?: Record<string, () => unknown>;
  /** Answers GET and HEAD requests for paths that are not API paths (the dashboard). */
  site?: StaticHandler;
  /** Deadlines of connections that are not serving a request, and the connection caps; default the config's defaults. */
  connections?: Partial<ConnectionLimits>;
  /** Where request counts and latencies go; GET /metrics serves the registry to a bearer `authorize` accepts. */
  metrics?: { metrics: Metrics; authorize(token: string): boolean };
  /** Takes every HTTP/1.1 upgrade request (WebSockets); without it, they are served as plain requests. */
  upgrade?: UpgradeHandler;
  /** The number of this worker among those serving the port (SKIFF_WORKERS): every answer carries it as `Skiff-Worker`. */
  worker?: number;
}

/**
 * An HTTP/1.1 upgrade request: the socket is the handler's from then on
 * (it answers, refusals included, and closes it). `draining` is aborted
 * when the server begins to stop; the stop waits (up to its grace) for the
 * socket to close.
 */
export type UpgradeHandler = (
  req: http.IncomingMessage,
  socket: net.Socket,
  head: Buffer,
  draining: AbortSignal,
) => void;

const DEFAULT_CONNECTION_LIMITS: ConnectionLimits = {
  firstBytesTimeoutMs: DEFAULT_FIRST_BYTES_TIMEOUT_MS,
  headersTimeoutMs: DEFAULT_HEADERS_TIMEOUT_MS,
  keepAliveTimeoutMs: DEFAULT_KEEP_ALIVE_TIMEOUT_MS,
  http2IdleTimeoutMs: DEFAULT_HTTP2_IDLE_TIMEOUT_MS,
  maxConnections: undefined,
  maxConnectionsPerAddress: DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
};

export interface SkiffServer {
  /** Base URL, e.g. http://127.0.0.1:8080 */
  url: string;
  port: number;
  /** Stops accepting, lets in-flight requests finish for up to graceMs, then closes every connection. */
  close(graceMs: number): Promise<void>;
}

/** Invalid UTF-8 is refused, as REST refuses it, rather than read as U+FFFD. */
const utf8 = new TextDecoder("utf-8", { fatal: true });

/**
 * What Connect's JSON codec (Connect, gRPC-Web and gRPC with +json) reads a
 * request message's text with (its `textDecoder` option), for a method whose
 * request is `input`. Connect parses and decodes before any interceptor runs,
 * and sends its errors back as they are: V8's parse message quotes the text's
 * first characters (a SetSecret's value, say), and protobuf-es's decode
 * messages quote the values and keys they refuse. So the text is decoded here
 * first, as Connect will (fromJsonString, unknown fields ignored), and a
 * failure is refused with skiff's words, which quote nothing the caller sent
 * (json-errors.ts): where the JSON broke, or the field, the kind it takes and
 * the kind it got. Connect then decodes the text itself: only JSON requests
 * pay. Every method has its own (limitedRouter registers them all).
 */
export function connectJsonOptions(input: DescMessage) {
  return {
    // Connect's default, said so that the object is one of its JSON options.
    ignoreUnknownFields: true,
    textDecoder: {
      decode(data?: Uint8Array): string {
        let text: string;
        try {
          text = utf8.decode(data);
        } catch (err) {
          throw new ConnectError(malformedJson(err), Code.InvalidArgument);
        }
        try {
          fromJsonString(input, text, { ignoreUnknownFields: true });
        } catch (err) {
          throw new ConnectError(jsonTextDecodeError(input, text, true, err), Code.InvalidArgument);
        }
        return text;
      },
    },
  };
}

/** Room for the framing of a request message around its body. */
const MESSAGE_OVERHEAD_BYTES = 64 * 1024;

/**
 * The router the roles register on, which registers every method on its own:
 * with its body limit (the methods in `limits` accept larger messages) and
 * with the JSON options that check its request messages (connectJsonOptions).
 */
function limitedRouter(router: ConnectRouter, limits: ReadonlyMap<DescMethod, number>): ConnectRouter {
  const optionsOf = (method: DescMethod, options: object | undefined) => {
    const limit = limits.get(method);
    return {
      ...options,
      jsonOptions: connectJsonOptions(method.input),
      ...(limit === undefined ? {} : { readMaxBytes: limit + MESSAGE_OVERHEAD_BYTES }),
    };
  };
  const limited: ConnectRouter = {
    handlers: router.handlers,
    service(service, implementation, options) {
      const spec = createServiceImplSpec(service, implementation);
      for (const method of service.methods)
        router.rpc(method, spec.methods[method.localName].impl as never, optionsOf(method, options));
      return limited;
    },
    rpc(method, impl, options) {
      router.rpc(method, impl, optionsOf(method, options));
      return limited;
    },
  };
  return limited;
}

/**
 * A router that keeps the implementation of every method registered on it
 * in `into` (for the REST transcoder, which calls them in-process) and
 * registers it on `router` as it was given.
 */
export function recordingRouter(router: ConnectRouter, into: Map<DescMethod, MethodImplSpec>): ConnectRouter {
  const recording: ConnectRouter = {
    handlers: router.handlers,
    service(service, implementation, options) {
      for (const spec of Object.values(createServiceImplSpec(service, implementation).methods))
        into.set(spec.method, spec);
      router.service(service, implementation, options);
      return recording;
    },
    rpc(method, impl, options) {
      into.set(method, createMethodImplSpec(method, impl as never));
      router.rpc(method, impl, options);
      return recording;
    },
  };
  return recording;
}

const HTTP2_PREFACE = Buffer.from("PRI * HTTP/2.0\r\n");

/** The options that are set, so that an undefined one keeps its default. */
function definedOnly<T extends object>(options: T): Partial<T> {
  return Object.fromEntries(Object.entries(options).filter(([, v]) => v !== undefined)) as Partial<T>;
}

/**
 * The head of a request that offered an upgrade, less the offer (Upgrade,
 * HTTP2-Settings and their Connection tokens), to be parsed again as a
 * plain request: Node hands every upgrade offer to the upgrade listener.
 */
function withoutUpgrade(req: http.IncomingMessage): Buffer {
  const lines = [`${req.method} ${req.url} HTTP/${req.httpVersion}`];
  const raw = req.rawHeaders;
  for (let i = 0; i + 1 < raw.length; i += 2) {
    const name = raw[i].toLowerCase();
    let value = raw[i + 1];
    if (name === "upgrade" || name === "http2-settings") continue;
    if (name === "connection") {
      value = value
        .split(",")
        .map((token) => token.trim())
        .filter((token) => !/^(upgrade|http2-settings)$/i.test(token))
        .join(", ");
      if (value === "") continue;
    }
    lines.push(`${raw[i]}: ${value}`);
  }
  return Buffer.from(`${lines.join("\r\n")}\r\n\r\n`, "latin1");
}

const METRICS_PATH = "/metrics";

/** Whether a request's path is one of the HTTP/JSON API's (`/v4/…`, `/v2/…`), which no RPC path is. */
function isRestPath(url: string | undefined): boolean {
  return url !== undefined && (url.startsWith("/v4/") || url.startsWith("/v2/"));
}

/** GET /metrics: the Prometheus text, for an admin token or the metrics token. */
async function serveMetrics(
  req: NodeRequest,
  res: NodeResponse,
  opts: { metrics: Metrics; authorize(token: string): boolean },
): Promise<void> {
  const token = /^Bearer +(\S+) *$/i.exec(req.headers.authorization ?? "")?.[1];
  if (token === undefined || !opts.authorize(token)) {
    res.setHeader("www-authenticate", 'Bearer realm="skiff"');
    return sendJson(res, 401, {
      code: "unauthenticated",
      message: "send an admin token or SKIFF_METRICS_TOKEN as a bearer token",
    });
  }
  try {
    const text = await opts.metrics.text();
    res.writeHead(200, { "content-type": METRICS_CONTENT_TYPE, "content-length": Buffer.byteLength(text) });
    if (req.method === "HEAD") res.end();
    else res.end(text);
  } catch {
    sendJson(res, 503, { code: "unavailable", message: "cannot collect the metrics right now" });
  }
}

function sendJson(res: NodeResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text) });
  res.end(text);
}

/** A whole HTTP/1.1 answer carrying a JSON error, for a socket no ServerResponse holds; the connection closes. */
function rawJsonAnswer(status: number, reason: string, code: string, message: string): string {
  const body = JSON.stringify({ code, message });
  const head = `HTTP/1.1 ${status} ${reason}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}`;
  return `${head}\r\nconnection: close\r\n\r\n${body}`;
}

export async function startServer(opts: ServerOptions): Promise<SkiffServer> {
  const { logger, health } = opts;
  const shutdown = new AbortController();
  // Every call in flight listens to it: not a leak, so no listener-count warning.
  setMaxListeners(0, shutdown.signal);
  let handlers: readonly UniversalHandler[] = [];
  const implementations = new Map<DescMethod, MethodImplSpec>();
  let transcode: ReturnType<typeof createTranscoder> | undefined;

  // Plain HTTP endpoints that are not RPCs: probes and documents.
  const plain = new Map<string, (res: NodeResponse) => void>([
    ["/healthz", (res) => sendJson(res, health.live ? 200 : 503, { status: health.live ? "ok" : "nats disconnected" })],
    [
      "/readyz",
      (res) =>
        sendJson(res, health.ready ? 200 : 503, {
          status: health.ready ? "ready" : "not ready",
          ...(health.natsAuth === false ? { nats_auth: false } : {}),
          ...(health.sandbox === false ? { sandbox: "off" } : {}),
          ...(health.fullStores.length > 0 ? { full_stores: health.fullStores } : {}),
        }),
    ],
  ]);
  for (const [path, make] of Object.entries(opts.documents ?? {})) {
    let cached: string | undefined;
    plain.set(path, (res) => {
      cached ??= JSON.stringify(make(), null, 2);
      res.writeHead(200, { "content-type": "application/json" });
      res.end(cached);
    });
  }

  const fallback = (req: NodeRequest, res: NodeResponse) => {
    const path = (req.url ?? "/").split("?", 1)[0];
    const endpoint = plain.get(path);
    const read = req.method === "GET" || req.method === "HEAD";
    if (endpoint && read) return endpoint(res);
    if (path === METRICS_PATH && read && opts.metrics) return void serveMetrics(req, res, opts.metrics);
    if (opts.site && read && !isApiPath(path)) return opts.site(req, res);
    // A gRPC call of a method no service here has: gRPC's UNIMPLEMENTED, not REST's 404.
    if (isGrpcRequest(req)) return answerUnimplemented(req, res);
    transcode!(req, res);
  };

  const adapter = connectNodeAdapter({
    routes: (router) => {
      const limited = limitedRouter(router, opts.bodyLimits ?? new Map());
      opts.routes(recordingRouter(limited, implementations));
      // Last: it lists the services registered before it.
      reflectionRoutes(limited);
      // The adapter reads the list once this returns: each handler answers a request that is not protobuf as the caller's error.
      router.handlers.forEach((h, i, all) => ((all as UniversalHandler[])[i] = withBinaryParseErrors(h)));
      handlers = router.handlers;
    },
    fallback,
    interceptors: opts.interceptors,
    // The limit is on the body; an encoded request message adds a few bytes.
    readMaxBytes: opts.maxBodyBytes + MESSAGE_OVERHEAD_BYTES,
    writeMaxBytes: 64 * 1024 * 1024,
    // A sync run may last up to 12 hours; Connect's default is unbounded.
    maxTimeoutMs: MAX_RUN_SECONDS * 1000 + 60_000,
    shutdownSignal: shutdown.signal,
  });
  const uploads = opts.uploads && new UploadSlots(opts.uploads, opts.maxBodyBytes);
  /** The body limit of each RPC path whose method takes more than maxBodyBytes (an upload). */
  const uploadPaths = new Map<string, number>();
  for (const [method, limit] of opts.bodyLimits ?? [])
    if (limit > opts.maxBodyBytes) uploadPaths.set(`/${method.parent.typeName}/${method.name}`, limit);
  transcode = createTranscoder({
    services: opts.restServices,
    implementations,
    interceptors: opts.interceptors,
    shutdownSignal: shutdown.signal,
    maxBodyBytes: opts.maxBodyBytes,
    bodyLimits: opts.bodyLimits,
    requestIds: opts.requestIds,
    streamedBodies: opts.streamedBodies,
    cors: opts.cors,
    admit: opts.admit,
    uploads,
    logger,
  });

  let stopping = false;
  let inFlight = 0;
  let drained: (() => void) | undefined;
  const metrics = opts.metrics?.metrics;
  const worker = opts.worker === undefined ? undefined : String(opts.worker);
  /** The RPC paths served here, which metrics may name as routes (any other path is "unmatched"). */
  const procedures = new Set(handlers.map((h) => h.requestPath));
  /** What a request is counted under: its REST route or RPC method, never the raw path. */
  const routeOf = (req: NodeRequest, res: NodeResponse): string => {
    const rest = restRouteOf(res);
    if (rest !== undefined) return rest;
    const path = (req.url ?? "/").split("?", 1)[0];
    if (plain.has(path) || path === METRICS_PATH || procedures.has(path)) return path;
    return opts.site && !isApiPath(path) ? "dashboard" : "unmatched";
  };
  // One listener for every answer (no closure per request): the request and its start ride on the response.
  function answered(this: TrackedResponse): void {
    const req = this[kRequest];
    // Counted once, should a response ever say "close" twice.
    if (req === undefined) return;
    inFlight--;
    if (inFlight === 0) drained?.();
    if (metrics) {
      const route = routeOf(req, this);
      metrics.requests.inc({ route, method: req.method ?? "", code: String(this.statusCode) });
      metrics.requestDuration.observe({ route }, (performance.now() - this[kStarted]!) / 1000);
    }
    this[kRequest] = undefined;
  }
  const track = (req: NodeRequest, res: NodeResponse) => {
    inFlight++;
    const tracked = res as TrackedResponse;
    tracked[kRequest] = req;
    tracked[kStarted] = metrics ? performance.now() : 0;
    // "close" comes once per answer: on(), not once(), which wraps the listener per request.
    res.on("close", answered);
    if (worker !== undefined) res.setHeader("skiff-worker", worker);
    // While stopping, HTTP/1.1 keep-alive connections close after their answer.
    if (stopping && req.httpVersionMajor === 1) res.setHeader("connection", "close");
    if (isGrpcRequest(req)) minimalGrpcMessages(res);
    // A REST path is never an RPC's (those are /{package}.{Service}/{Method}): it skips the RPC router's lookup.
    if (isRestPath(req.url)) fallback(req, res);
    else rpc(req, res);
  };
  /** An RPC path's call goes to the Connect adapter once admitted (a path no service has, at once: see fallback). */
  const rpc = (req: NodeRequest, res: NodeResponse) => {
    // The adapter makes a URL of the host first, outside any try: one that makes none would end the process.
    if (!hostMakesUrl("authority" in req ? req.authority : req.headers.host)) return refuseHost(req, res);
    const path = (req.url ?? "/").split("?", 1)[0];
    const admit = opts.admit;
    if (admit === undefined || !procedures.has(path)) return adapter(req, res);
    const verdict = admit(serviceOfProcedure(path), req.headers.authorization);
    if (!(verdict instanceof Promise)) return judged(req, res, path, verdict);
    verdict.then(
      (v) => judged(req, res, path, v),
      () => adapter(req, res),
    );
  };
  const refuseHost = (req: NodeRequest, res: NodeResponse) => {
    const message = "the request's Host (or :authority) is not a host name";
    if (answerRefusal(req, res, new ConnectError(message, Code.InvalidArgument))) return;
    sendJson(res, 400, { code: "invalid_argument", message });
    discardRequest(req);
  };
  /** A refusal is answered in the call's protocol; a call that speaks none goes to the adapter, which refuses it. */
  const judged = (req: NodeRequest, res: NodeResponse, path: string, verdict: AdmitVerdict) => {
    const refusal = refusalOf(verdict, req, res, uploads, uploadPaths.get(path));
    if (refusal === undefined || !answerRefusal(req, res, refusal)) adapter(req, res);
  };

  /**
   * What the request listeners call: a request that makes something throw before any handler's own error
   * handling (as a host that made no URL did in the RPC adapter) is answered 500 and logged, instead of
   * ending the process with an uncaught exception.
   */
  function serve(req: NodeRequest, res: NodeResponse): void {
    try {
      track(req, res);
    } catch (err) {
      logger.error(
        { err, method: req.method, url: String(req.url).slice(0, 200) },
        "a request failed before its handler",
      );
      if (res.headersSent) res.destroy();
      else {
        sendJson(res, 500, { code: "internal", message: "internal error" });
        discardRequest(req);
      }
    }
  }

  const limits: ConnectionLimits = { ...DEFAULT_CONNECTION_LIMITS, ...definedOnly(opts.connections ?? {}) };
  const guard = new ConnectionGuard(limits, logger);
  const h1 = http.createServer(
    {
      // Long synchronous runs are legitimate: no whole-request timeout. The
      // head's deadline is the guard's (Node's headersTimeout never starts
      // for sockets handed over by emit("connection")).
      requestTimeout: 0,
      headersTimeout: 0,
      // A silent socket between requests (socket inactivity, as Node does it).
      keepAliveTimeout: limits.keepAliveTimeoutMs,
      // Refused below, with a JSON body (Node's own refusal has none).
      requireHostHeader: false,
    },
    (req, res) => {
      // HTTP/1.1 demands Host (RFC 9112, section 3.2).
      if (req.httpVersionMinor === 1 && req.headers.host === undefined) {
        res.setHeader("connection", "close");
        return sendJson(res, 400, { code: "invalid_argument", message: "an HTTP/1.1 request must have a Host header" });
      }
      // HTTP/1.0 may leave Host out; the handlers build the request's URL from it, so it is this server's address.
      if (req.headers.host === undefined) req.headers.host = hostOf(req.socket);
      serve(req, res);
    },
  );
  h1.on("request", (req: http.IncomingMessage, res: http.ServerResponse) => guard.http1Request(req.socket, res));
  // CONNECT (a proxy's method): Node would close the socket without a word.
  h1.on("connect", (_req: http.IncomingMessage, socket: net.Socket) => {
    socket.end(rawJsonAnswer(405, "Method Not Allowed", "unimplemented", "CONNECT is not served here"));
  });
  // An Expect other than 100-continue: Node's refusal has no body.
  h1.on("checkExpectation", (req: http.IncomingMessage, res: http.ServerResponse) => {
    guard.http1Request(req.socket, res);
    sendJson(res, 417, { code: "failed_precondition", message: "the only expectation served is Expect: 100-continue" });
  });
  // A request Node's parser refuses (a malformed head, headers too large): answered as every other
  // refusal is, with a JSON {code, message}, where Node would send a bare status line.
  h1.on("clientError", (err: NodeJS.ErrnoException, socket: net.Socket) => {
    if (socket.writable && socket.bytesWritten === 0) {
      const [status, reason, code, message] =
        err.code === "HPE_HEADER_OVERFLOW"
          ? [431, "Request Header Fields Too Large", "resource_exhausted", "the request's headers are too large"]
          : [
              400,
              "Bad Request",
              "invalid_argument",
              `malformed HTTP request: ${err.message.replace(/^Parse Error: /, "")}`,
            ];
      socket.write(rawJsonAnswer(status, reason, code, message));
    }
    socket.destroy();
  });
  const draining = new AbortController();
  // Every open upgraded connection listens to it: not a leak.
  setMaxListeners(0, draining.signal);
  const upgrade = opts.upgrade;
  if (upgrade) {
    h1.on("upgrade", (req: http.IncomingMessage, socket: net.Socket, head: Buffer) => {
      // Any other upgrade offer (curl --http2 offers h2c) is declined: the request is served as HTTP/1.1,
      // on the socket handed to HTTP/1.1 again once the requests before it are answered (pipelined,
      // they still write to it; the socket holds what follows meanwhile: it is not read).
      if (req.headers.upgrade?.toLowerCase() !== "websocket") {
        const rest = Buffer.concat([withoutUpgrade(req), head]);
        guard.afterRequests(socket, () => {
          socket.unshift(rest);
          h1.emit("connection", socket);
        });
        return;
      }
      // Busy until it closes: no deadline of an idle connection cuts it, and a stop waits for it.
      guard.http1Request(socket, socket);
      inFlight++;
      socket.once("close", () => {
        inFlight--;
        if (inFlight === 0) drained?.();
      });
      upgrade(req, socket, head, draining.signal);
    });
  }
  const h2 = http2.createServer({}, serve);
  let handing: Connection | undefined;
  h2.on("session", (session) => {
    // emit("connection") makes the session synchronously, for the socket being handed over.
    if (handing) guard.startHttp2(handing, session);
  });

  const tcp = net.createServer((socket) => {
    socket.on("error", () => socket.destroy());
    const conn = guard.admit(socket);
    if (!conn) return;
    let head = Buffer.alloc(0);
    const peek = (chunk: Buffer) => {
      head = Buffer.concat([head, chunk]);
      const n = Math.min(head.length, HTTP2_PREFACE.length);
      const isH2 = head.subarray(0, n).equals(HTTP2_PREFACE.subarray(0, n));
      if (isH2 && head.length < HTTP2_PREFACE.length) return; // need more bytes to decide
      socket.off("data", peek);
      socket.pause();
      socket.unshift(head);
      // Both servers read what was unshifted; http2 drains it on the next
      // tick, so the socket must stay paused for it (flowing would lose it).
      if (isH2) {
        handing = conn;
        try {
          h2.emit("connection", socket);
        } finally {
          handing = undefined;
        }
      } else {
        guard.startHttp1(conn);
        h1.emit("connection", socket);
        socket.resume();
      }
    };
    socket.on("data", peek);
  });

  await new Promise<void>((resolve, reject) => {
    const refused = (err: NodeJS.ErrnoException) =>
      reject(
        err.code === "EADDRINUSE"
          ? Object.assign(
              new Error(
                `port ${opts.port} on ${opts.host} is already in use (another skiff, or another program): stop it, or serve on another port with SKIFF_PORT (a second skiff on this machine also needs its own SKIFF_DATA_DIR)`,
                { cause: err },
              ),
              { code: err.code },
            )
          : err,
      );
    tcp.once("error", refused);
    tcp.listen(opts.port, opts.host, () => {
      tcp.off("error", refused);
      resolve();
    });
  });
  const port = (tcp.address() as net.AddressInfo).port;
  const host = opts.host.includes(":") ? `[${opts.host}]` : opts.host;

  return {
    url: `http://${host}:${port}`,
    port,
    async close(graceMs: number) {
      stopping = true;
      draining.abort();
      health.setStopping();
      tcp.close();
      // Idle HTTP/1.1 connections close now; HTTP/2 sessions get GOAWAY: open streams finish, no new ones.
      guard.stop();
      if (inFlight > 0) {
        logger.info({ inFlight, graceMs }, "waiting for in-flight requests");
        await new Promise<void>((resolve) => {
          drained = resolve;
          setTimeout(resolve, graceMs).unref();
        });
      }
      shutdown.abort();
      guard.destroyAll();
    },
  };
}

/** The address a socket was reached at, as a Host header would name it. */
function hostOf(socket: net.Socket): string {
  const address = socket.localAddress ?? "127.0.0.1";
  return `${net.isIPv6(address) ? `[${address}]` : address}:${socket.localPort ?? 0}`;
}
