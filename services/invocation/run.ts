// InvocationService.Run: gives the call its id (UUIDv7, the X-Request-Id of
// every answer, errors included, and the run id once it is accepted; a REST
// call's id is made by the transcoder, so that refusals before this handler
// carry it too), checks it, then runs it synchronously (sync.ts) or queues
// it (enqueue.ts).
import { Code, ConnectError, type HandlerContext } from "@connectrpc/connect";
import type { RunRequest, RunResponse } from "../../gen/skiff/invocation/v4/invocation_pb.js";
import { newRunId, type InvokeRequest, type RunRecord } from "../runs/index.js";
import type { AppRecord } from "../apps/index.js";
import { appRequestHeaders, httpExchange } from "../server/index.js";
import { cortexBody, cortexFunction, customPath, findApp, webhookEndpoint, webhookSecret } from "./checks.js";
import type { InvocationDeps } from "./deps.js";
import { enqueue } from "./enqueue.js";
import { takesStream } from "./streamed.js";
import { runSync } from "./sync.js";

/** Query parameters that belong to skiff, not to a Custom app. */
export const OWN_PARAMS: ReadonlySet<string> = new Set(["async", "webhookEndpoint"]);
const NO_HEADERS: Record<string, string> = {};

/** The methods an app may be called with (a Cortex app: POST only). */
export const APP_METHODS: ReadonlySet<string> = new Set(["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]);

/** A query string as a request line carries it: printable ASCII (no space, no control character), no "#". */
const QUERY_TEXT = /^[\x21-\x22\x24-\x7e]*$/;

/**
 * The query string a Custom app gets: the caller's, as written and in its
 * order, less skiff's own parameters (by their decoded names, as the
 * transcoder reads them). A Connect or gRPC call's comes from its `query`
 * field, without a leading "?".
 */
export function forwardedQuery(raw: string): string {
  if (raw === "") return "";
  const kept = raw.split("&").filter((pair) => {
    const eq = pair.indexOf("=");
    const name = eq < 0 ? pair : pair.slice(0, eq);
    return !OWN_PARAMS.has(decodedName(name));
  });
  return kept.join("&");
}

function decodedName(name: string): string {
  const text = name.replaceAll("+", " ");
  try {
    return decodeURIComponent(text);
  } catch {
    return text;
  }
}

/** A Connect or gRPC call's `query` field, checked: text that can follow "?" in a URL. */
function queryField(query: string): string {
  const raw = query.startsWith("?") ? query.slice(1) : query;
  if (!QUERY_TEXT.test(raw))
    throw new ConnectError(
      'query must be a query string as a URL writes it (percent-encoded, no spaces, no "#"), without the leading "?"',
      Code.InvalidArgument,
    );
  return raw;
}

/** A Connect or gRPC call's `method` field, checked; empty is POST. */
function methodField(method: string): string {
  if (method === "") return "POST";
  const upper = method.toUpperCase();
  if (!APP_METHODS.has(upper))
    throw new ConnectError(
      `method must be one of ${[...APP_METHODS].join(", ")}, got ${JSON.stringify(method.slice(0, 20))}`,
      Code.InvalidArgument,
    );
  return upper;
}

/** The request line's method and query of the call: a REST call's own, or a Connect call's fields. */
function requestLine(
  req: RunRequest,
  ctx: HandlerContext,
  exchange: ReturnType<typeof httpExchange>,
): { method: string; query: string } {
  if (!exchange) return { method: methodField(req.method), query: queryField(req.query) };
  const url = ctx.url;
  const q = url.indexOf("?");
  return { method: exchange.method, query: q < 0 ? "" : url.slice(q + 1) };
}

/** A Cortex app's functions are called with POST; another method is refused as the REST path refuses one (405). */
function cortexMethod(method: string, app: AppRecord): void {
  if (method !== "POST")
    throw new ConnectError(
      `app ${app.app_name} is a Cortex app: its functions are called with POST, not ${method}`,
      Code.Unimplemented,
      { allow: "POST" },
    );
}

/**
 * How a Cortex generator streams to this caller (see the shims): server-sent
 * events when a REST caller accepts them, else NDJSON (RunStream too); a
 * Connect or gRPC caller of Run gets the items whole, as one JSON array.
 */
function cortexStreamAccept(ctx: HandlerContext): Record<string, string> {
  if (!takesStream(ctx)) return NO_HEADERS;
  const sse = ctx.requestHeader.get("accept")?.includes("text/event-stream") ?? false;
  return sse ? SSE : NDJSON;
}
const SSE = { accept: "text/event-stream" };
const NDJSON = { accept: "application/x-ndjson" };

export async function run(deps: InvocationDeps, req: RunRequest, ctx: HandlerContext): Promise<RunResponse> {
  // Refused calls get an id too, for the caller's and the logs' sake; no run is recorded under it.
  const exchange = httpExchange(ctx);
  const runId = exchange?.requestId ?? newRunId();
  ctx.responseHeader.set("x-request-id", runId);
  // The view has the app but right after its deploy (then findApp reads KV): no await on the way that most calls take.
  const app =
    deps.registry.get(req.projectId, req.appName) ?? (await findApp(deps.registry, req.projectId, req.appName));
  const cortex = app.config.runtime.kind === "cortex";
  const line = requestLine(req, ctx, exchange);
  if (cortex) cortexMethod(line.method, app);
  const contentType = req.body?.contentType ?? "";
  const path = cortex ? cortexFunction(app, req.path) : customPath(req.path, exchange?.rawPathVariable("path"));
  const webhook = req.webhookEndpoint === "" ? undefined : await webhookEndpoint(req.webhookEndpoint, deps.guard);
  // A secret only signs webhooks: without an endpoint it has nothing to sign.
  const secret = webhook === undefined ? undefined : webhookSecret(ctx.requestHeader.get("x-webhook-secret"));
  // A large REST body streams to a Custom app's sync run; a Cortex app's arguments and a queued run's body are whole.
  const pending = exchange?.requestBody;
  const bodyStream = pending && !cortex && !req.async ? pending : undefined;
  const rawBody = pending && !bodyStream ? await pending.read() : (req.body?.data ?? new Uint8Array(0));
  const body = cortex ? cortexBody(rawBody, contentType) : rawBody;

  // Built field by field: a spread of an optional part costs several times as much (bench/README.md).
  const invoke: InvokeRequest = {
    runId: "",
    method: line.method,
    path,
    query: cortex ? "" : forwardedQuery(line.query),
    // A Custom app gets the caller's headers that apps get, and the body's content type.
    headers: cortex ? cortexStreamAccept(ctx) : appRequestHeaders(ctx.requestHeader, contentType),
    body,
  };
  if (bodyStream) invoke.bodyStream = bodyStream;
  const now = new Date().toISOString();
  const record: RunRecord = {
    run_id: "",
    project_id: app.project_id,
    app_name: app.app_name,
    path,
    async: req.async,
    status: req.async ? "queued" : "running",
    queued_at: now,
    attempts: 0,
  };
  if (webhook) {
    record.webhook_endpoint = webhook;
    record.webhook_signed = secret !== undefined;
  }
  if (req.async)
    return enqueue(
      deps,
      { runId, app, record, invoke, secret, idempotencyKey: ctx.requestHeader.get("idempotency-key") ?? undefined },
      ctx,
    );

  invoke.runId = record.run_id = runId;
  record.started_at = now;
  record.attempts = 1;
  record.runner = deps.control.id;
  return runSync(deps, app, record, invoke, secret, ctx);
}
