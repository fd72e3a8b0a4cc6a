// InvocationService.RunStream: a sync run whose answer reaches a Connect or
// gRPC caller as it is produced, as the REST answer of Run does: the head
// (run id, status, headers, content type), then each chunk of the body.
import { create } from "@bufbuild/protobuf";
import type { HandlerContext } from "@connectrpc/connect";
import {
  RunRequestSchema,
  RunResponseSchema,
  RunStreamResponseSchema,
  type RunStreamRequest,
  type RunStreamResponse,
} from "../../gen/skiff/invocation/v4/invocation_pb.js";
import type { InvocationDeps } from "./deps.js";
import { run } from "./run.js";
import { kRunStream, type RunStreamSink } from "./streamed.js";

export async function* runStream(
  deps: InvocationDeps,
  req: RunStreamRequest,
  ctx: HandlerContext,
): AsyncGenerator<RunStreamResponse> {
  const sink: RunStreamSink = {};
  ctx.values.set(kRunStream, sink);
  const request = create(RunRequestSchema, {
    projectId: req.projectId,
    appName: req.appName,
    path: req.path,
    webhookEndpoint: req.webhookEndpoint,
    body: req.body,
    method: req.method,
    query: req.query,
  });
  const answer = await run(deps, request, ctx);
  const whole = answer.body?.data;
  const head = create(RunResponseSchema, {
    runId: answer.runId,
    statusCode: answer.statusCode,
    headers: answer.headers,
    body: { contentType: answer.body?.contentType ?? "" },
  });
  yield create(RunStreamResponseSchema, { part: { case: "head", value: head } });
  if (sink.stream) {
    for await (const chunk of sink.stream.chunks) {
      yield create(RunStreamResponseSchema, { part: { case: "chunk", value: chunk } });
    }
  } else if (whole && whole.byteLength > 0) {
    yield create(RunStreamResponseSchema, { part: { case: "chunk", value: whole } });
  }
}
