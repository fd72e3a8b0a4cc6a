// A real listener (HTTP/1.1 and h2c) serving test implementations of the
// real InvocationService and ManagementService through Connect and, as the
// Connect adapter's fallback, through the HTTP/JSON transcoder.
import http from "node:http";
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { create, type DescMethod } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import {
  Code,
  ConnectError,
  type ConnectRouter,
  type HandlerContext,
  type Interceptor,
  type MethodImplSpec,
  type ServiceImpl,
} from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { HttpBodySchema } from "../../gen/google/api/httpbody_pb.js";
import { InvocationService, type RunRequest } from "../../gen/skiff/invocation/v4/invocation_pb.js";
import { ManagementService } from "../../gen/skiff/management/v2/management_pb.js";
import { httpExchange, setHttpStatus } from "../../services/server/rest/http-exchange.js";
import { silentLogger, type Logger } from "../../services/config/logger.js";
import { createTranscoder } from "../../services/server/rest/transcoder.js";
import { recordingRouter } from "../../services/server/server.js";

/** What a handler saw: the decoded request, its headers and the REST exchange. */
export interface Call {
  method: string;
  request: unknown;
  header: Headers;
  exchange: { method: string; query: string } | undefined;
}

export interface RestFixture {
  url: string;
  h2url: string;
  calls: Call[];
  /** Methods the interceptor saw, in order. */
  intercepted: string[];
  close(): Promise<void>;
}

function record(calls: Call[], method: string, request: unknown, ctx: HandlerContext): void {
  const exchange = httpExchange(ctx);
  calls.push({
    method,
    request,
    header: ctx.requestHeader,
    exchange: exchange && { method: exchange.method, query: exchange.query.toString() },
  });
}

export function invocation(calls: Call[]): Partial<ServiceImpl<typeof InvocationService>> {
  return {
    run(req: RunRequest, ctx) {
      record(calls, "Run", req, ctx);
      ctx.responseHeader.set("X-Request-Id", "run-0001");
      if (req.appName === "boom") throw new Error("handler bug");
      if (req.appName === "missing")
        throw new ConnectError(`app ${req.projectId}/${req.appName} not found`, Code.NotFound);
      // As a Cortex app refuses any method but POST.
      if (req.appName === "post-only" && httpExchange(ctx)?.method !== "POST")
        throw new ConnectError("POST only", Code.Unimplemented, { allow: "POST" });
      if (req.async) {
        setHttpStatus(ctx, 202);
        const data = new TextEncoder().encode(JSON.stringify({ run_id: "run-0001" }));
        return { runId: "run-0001", statusCode: 202, body: { contentType: "application/json", data } };
      }
      // Sync: echo the request body back with its content type.
      return { runId: "run-0001", statusCode: 200, body: req.body ?? create(HttpBodySchema) };
    },
  };
}

export function management(calls: Call[]): Partial<ServiceImpl<typeof ManagementService>> {
  const at = timestampFromMs(Date.UTC(2025, 0, 2, 3, 4, 5));
  return {
    getIdentity(req, ctx) {
      record(calls, "GetIdentity", req, ctx);
      return { kind: "service_account", serviceAccountId: "sa-1" };
    },
    createProject(req, ctx) {
      record(calls, "CreateProject", req, ctx);
      return { project: { projectId: req.projectId || "p-new", name: req.name, createdAt: at } };
    },
    getProject(req, ctx) {
      record(calls, "GetProject", req, ctx);
      if (req.projectId === "p-missing") throw new ConnectError(`project ${req.projectId} not found`, Code.NotFound);
      return { project: { projectId: req.projectId, name: "Dev" } };
    },
    getServiceAccount(req, ctx) {
      record(calls, "GetServiceAccount", req, ctx);
      return { serviceAccount: { serviceAccountId: req.serviceAccountId, name: "ci", createdAt: at } };
    },
    deleteServiceAccount(req, ctx) {
      record(calls, "DeleteServiceAccount", req, ctx);
      return {};
    },
    deployApp(req, ctx) {
      record(calls, "DeployApp", req, ctx);
      const bytes = BigInt(req.bundle?.data.length ?? 0);
      return {
        app: {
          projectId: req.projectId,
          appName: "hello",
          deployment: { version: 1, bundleBytes: bytes, digest: req.bundle?.contentType ?? "" },
        },
      };
    },
    listAppLogs(req, ctx) {
      record(calls, "ListAppLogs", req, ctx);
      return { lines: [] };
    },
    listRuns(req, ctx) {
      record(calls, "ListRuns", req, ctx);
      return { runs: [], nextPageToken: "" };
    },
    getRun(req, ctx) {
      record(calls, "GetRun", req, ctx);
      return { run: { runId: req.runId, projectId: req.projectId, appName: req.appName, status: "success" } };
    },
    cancelRun(req, ctx) {
      record(calls, "CancelRun", req, ctx);
      return { run: { runId: req.runId, status: "cancelled" } };
    },
    redeliverWebhook(req, ctx) {
      record(calls, "RedeliverWebhook", req, ctx);
      return { delivery: { deliveryId: "d-1", runId: req.runId, state: "pending" } };
    },
    // GetAppStats and the rest are left out on purpose: they answer unimplemented.
  };
}

/** Shows that interceptors run for REST calls: records them, refuses a bad token, tags the answer. */
export function interceptor(intercepted: string[]): Interceptor {
  return (next) => async (req) => {
    intercepted.push(req.method.name);
    if (req.header.get("authorization") === "Bearer bad") throw new ConnectError("bad token", Code.Unauthenticated);
    const res = await next(req);
    res.header.set("x-intercepted", "yes");
    return res;
  };
}

export async function startRestFixture(
  options: {
    maxBodyBytes?: number;
    logger?: Logger;
    /** CORS allow-lists of Run's apps, by app name (TranscoderOptions.cors). */
    cors?: Record<string, string[]>;
  } = {},
): Promise<RestFixture> {
  const calls: Call[] = [];
  const intercepted: string[] = [];
  const implementations = new Map<DescMethod, MethodImplSpec>();
  const interceptors = [interceptor(intercepted)];
  let transcode: ReturnType<typeof createTranscoder> | undefined;
  const adapter = connectNodeAdapter({
    routes: (connectRouter: ConnectRouter) => {
      const router = recordingRouter(connectRouter, implementations);
      router.service(InvocationService, invocation(calls));
      router.service(ManagementService, management(calls));
    },
    fallback: (req, res) => transcode!(req, res),
    interceptors,
  });
  transcode = createTranscoder({
    services: [InvocationService, ManagementService],
    implementations,
    interceptors,
    maxBodyBytes: options.maxBodyBytes ?? 1024,
    logger: options.logger ?? silentLogger,
    cors: {
      methods: new Set([InvocationService.method.run]),
      origins: (pathOnly) => options.cors?.[(pathOnly as unknown as RunRequest).appName],
    },
  });
  const h1 = http.createServer(adapter);
  const h2 = http2.createServer(adapter);
  await Promise.all([listen(h1), listen(h2)]);
  return {
    url: `http://127.0.0.1:${(h1.address() as AddressInfo).port}`,
    h2url: `http://127.0.0.1:${(h2.address() as AddressInfo).port}`,
    calls,
    intercepted,
    async close() {
      h1.closeAllConnections();
      await Promise.all([new Promise((r) => h1.close(r)), new Promise((r) => h2.close(r))]);
    },
  };
}

function listen(server: http.Server | http2.Http2Server): Promise<void> {
  return new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
}

export interface RestResponse {
  status: number;
  headers: http.IncomingHttpHeaders;
  text: string;
}

/** One HTTP/1.1 request on a fresh connection. */
export function rest(
  base: string,
  method: string,
  path: string,
  options: { headers?: Record<string, string>; body?: string | Buffer } = {},
): Promise<RestResponse> {
  return new Promise((resolve, reject) => {
    // An explicit Content-Length: Node sends a GET body without one, which the server would read as the next request.
    const headers =
      options.body === undefined
        ? options.headers
        : { "content-length": String(Buffer.byteLength(options.body)), ...options.headers };
    const req = http.request(`${base}${path}`, { method, headers, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () =>
        resolve({ status: res.statusCode ?? 0, headers: res.headers, text: Buffer.concat(chunks).toString() }),
      );
      res.on("error", reject);
    });
    req.on("error", reject);
    req.end(options.body);
  });
}

/** One request over a fresh h2c session. */
export function rest2(
  base: string,
  method: string,
  path: string,
  options: { headers?: Record<string, string>; body?: string | Buffer } = {},
): Promise<RestResponse> {
  return new Promise((resolve, reject) => {
    const session = http2.connect(base);
    session.on("error", reject);
    const stream = session.request({ ":method": method, ":path": path, ...options.headers });
    const chunks: Buffer[] = [];
    let headers: http2.IncomingHttpHeaders = {};
    stream.on("response", (h) => (headers = h));
    stream.on("data", (c: Buffer) => chunks.push(c));
    stream.on("end", () => {
      session.close();
      resolve({ status: Number(headers[":status"]), headers, text: Buffer.concat(chunks).toString() });
    });
    stream.on("error", reject);
    stream.end(options.body);
  });
}
