// InvocationService.Run: gives the call its id (UUIDv7, the X-Request-Id of
// every answer, errors included, and the run id once it is accepted; a REST
// call's id is made by the transcoder, so that refusals before this handler
// carry it too), checks it, then runs it synchronously (sync.ts) or queues
// it (enqueue.ts).
import type { HandlerContext } from "@connectrpc/connect";
import type { RunRequest, RunResponse } from "../../gen/skiff/invocation/v4/invocation_pb.js";
import { newRunId, type InvokeRequest, type RunRecord } from "../runs/index.js";
import { appRequestHeaders, httpExchange } from "../server/index.js";
import { cortexBody, cortexFunction, customPath, findApp, webhookEndpoint, webhookSecret } from "./checks.js";
import type { InvocationDeps } from "./deps.js";
import { enqueue } from "./enqueue.js";
import { takesStream } from "./streamed.js";
import { runSync } from "./sync.js";

/** Query parameters that belong to skiff, not to a Custom app. */
export const OWN_PARAMS = ["async", "webhookEndpoint"];
const NO_HEADERS: Record<string, string> = {};

function forwardedQuery(ctx: HandlerContext): string {
  const query = httpExchange(ctx)?.query;
  if (!query || query.size === 0) return "";
  const params = new URLSearchParams(query);
  for (const name of OWN_PARAMS) params.delete(name);
  return params.toString();
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
  const app = findApp(deps.registry, req.projectId, req.appName);
  const cortex = app.config.runtime.kind === "cortex";
  const contentType = req.body?.contentType ?? "";
  const path = cortex ? cortexFunction(app, req.path) : customPath(req.path, exchange?.rawPathVariable("path"));
  const webhook = req.webhookEndpoint === "" ? undefined : await webhookEndpoint(req.webhookEndpoint, deps.guard);
  // A secret only signs webhooks: without an endpoint it has nothing to sign.
  const secret = webhook === undefined ? undefined : webhookSecret(ctx.requestHeader.get("x-webhook-secret"));
  // A large REST body streams to a Custom app's sync run; a Cortex app's arguments and a queued run's body are whole.
  const pending = exchange?.requestBody;
  const bodyStream = pending && !cortex && !req.async ? pending : undefined;
  const rawBody = pending && !bodyStream ? await pending.read() : (req.body?.data ?? new Uint8Array(0));
  const body = cortex ? cortexBody(rawBody) : rawBody;

  const invoke: InvokeRequest = {
    runId: "",
    method: cortex ? "POST" : (exchange?.method ?? "POST"),
    path,
    query: cortex ? "" : forwardedQuery(ctx),
    // A Custom app gets the caller's headers that apps get, and the body's content type.
    headers: cortex ? cortexStreamAccept(ctx) : appRequestHeaders(ctx.requestHeader, contentType),
    body,
    ...(bodyStream ? { bodyStream } : {}),
  };
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
    ...(webhook ? { webhook_endpoint: webhook, webhook_signed: secret !== undefined } : {}),
  };
  if (req.async)
    return enqueue(
      deps,
      { runId, app, record, invoke, secret, idempotencyKey: ctx.requestHeader.get("idempotency-key") ?? undefined },
      ctx,
    );

  invoke.runId = record.run_id = runId;
  Object.assign(record, { started_at: now, attempts: 1, runner: deps.control.id });
  return runSync(deps, app, record, invoke, secret, ctx);
}
