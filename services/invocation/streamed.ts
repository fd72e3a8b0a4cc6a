// Where a sync run's streamed answer goes: the REST answer (the transcoder
// writes it chunk by chunk) or a RunStream call (its messages); a Connect or
// gRPC caller of Run has neither and gets the answer whole.
import { createContextKey, type HandlerContext } from "@connectrpc/connect";
import { httpExchange, streamHttpBody, type StreamedBody } from "../server/index.js";

/** A RunStream call's slot for the body that follows its head. */
export interface RunStreamSink {
  stream?: StreamedBody;
}

export const kRunStream = createContextKey<RunStreamSink | undefined>(undefined, {
  description: "skiff RunStream body",
});

/** Whether this caller takes an answer as it streams. */
export function takesStream(ctx: HandlerContext): boolean {
  return httpExchange(ctx) !== undefined || ctx.values.get(kRunStream) !== undefined;
}

/** Hands the body to the caller that streams it; false when the caller takes the answer whole. */
export function streamTo(ctx: HandlerContext, body: StreamedBody): boolean {
  if (streamHttpBody(ctx, body)) return true;
  const sink = ctx.values.get(kRunStream);
  if (!sink) return false;
  sink.stream = body;
  return true;
}
