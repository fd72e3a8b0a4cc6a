// The one mechanism by which a handler shapes the HTTP/JSON answer of its
// method beyond the response message:
//
//   - the success status: `setHttpStatus(ctx, 202)`;
//   - extra response headers: `ctx.responseHeader.set("X-Request-Id", id)`
//     (standard Connect; they reach Connect, gRPC and REST callers alike).
//
// The transcoder puts an HttpExchange into the context values of every call
// it makes and reads the status back when the handler returns. Connect and
// gRPC callers have no exchange, so setHttpStatus does nothing for them.
import { createContextKey, type HandlerContext } from "@connectrpc/connect";

export interface HttpExchange {
  /** HTTP method of the REST call. */
  readonly method: string;
  /** The REST call's query string parameters, all of them. */
  readonly query: URLSearchParams;
  /** Success status chosen by the handler; undefined means 200. */
  status: number | undefined;
  /** The X-Request-Id already sent with this answer, for methods that asked for one (TranscoderOptions.requestIds). */
  readonly requestId?: string;
  /**
   * A path variable (by its field path, e.g. "path") as the URL wrote it,
   * percent-encoding included; the request message holds its decoded value.
   */
  rawPathVariable(fieldPath: string): string | undefined;
  /** Set by the handler with streamHttpBody(): the answer's body, written as it comes. */
  stream?: StreamedBody;
  /**
   * Set by a handler that passes on another HTTP answer's headers (a Custom
   * app's): written to the REST answer as they are, Content-* among them,
   * with no Headers object in between. A Content-Type among them is left
   * out: the answer's is the response message's.
   */
  responseHeaders?: Record<string, string | string[]>;
  /**
   * Aborts the call's signal, as its caller going away does. A REST call's
   * signal aborts only for those reasons and the server's shutdown, never
   * because its handler returned: work that outlives the handler (a streamed
   * answer) may hold on to it.
   */
  readonly abort: (reason: unknown) => void;
  /**
   * What abort() and the caller going away abort, for work that must stop
   * with the call (a run): cheaper than the context's AbortSignal, which is
   * made only when read.
   */
  readonly signal: CallSignal;
  /**
   * A request body left unread for the handler to stream on (a large or
   * chunked one, on a method that takes it so: TranscoderOptions.streamedBodies);
   * the request message's body is empty then. Undefined when the message holds it.
   */
  readonly requestBody?: StreamedRequestBody;
}

/**
 * The part of an AbortSignal that work stopped by a call uses: an AbortSignal
 * is one, and so is a REST call's exchange, which costs a fraction of one.
 */
export type CallSignal = Pick<AbortSignal, "aborted" | "reason" | "addEventListener" | "removeEventListener">;

type Listener = Parameters<AbortSignal["addEventListener"]>[1];

/**
 * A CallSignal that is a flag and a list of listeners, and what aborts it: a
 * REST call's exchange is one, and so is an async run's stop. A real
 * AbortController and its signal cost several microseconds to make and
 * allocate about a kilobyte (bench/README.md), on every call.
 */
export class LightSignal implements CallSignal {
  aborted = false;
  reason: unknown = undefined;
  private listeners: Listener[] | undefined = undefined;

  abort(reason?: unknown): void {
    if (this.aborted) return;
    this.aborted = true;
    this.reason = reason;
    this.aborting(reason);
    const listeners = this.listeners;
    this.listeners = undefined;
    if (!listeners) return;
    const event = new Event("abort");
    for (const l of listeners) {
      if (typeof l === "function") l.call(this, event);
      else l.handleEvent(event);
    }
  }

  /** Called by abort() once the flag is set, before the listeners: for what a subclass aborts with it. */
  protected aborting(_reason: unknown): void {}

  addEventListener(type: string, listener: Listener | null): void {
    if (type !== "abort" || listener === null || this.aborted) return;
    (this.listeners ??= []).push(listener);
  }

  removeEventListener(type: string, listener: Listener | null): void {
    const listeners = this.listeners;
    if (type !== "abort" || !listeners) return;
    const i = listeners.indexOf(listener!);
    if (i !== -1) listeners.splice(i, 1);
  }
}

/**
 * A request body read as it comes, under the method's size limit. Whatever
 * reads it fails with the transcoder's own error when it breaks (too large:
 * 413; the caller gone), and the transcoder answers with that error.
 */
export interface StreamedRequestBody {
  /** Its Content-Length, when the caller declared one. */
  readonly length: number | undefined;
  /** Its chunks as they come, once; the caller's pace follows the reader's (back-pressure). */
  chunks(): AsyncIterable<Uint8Array>;
  /** The whole body, for a handler that needs it whole after all. */
  read(): Promise<Uint8Array>;
}

/** A body the REST answer writes chunk by chunk, at the pace its caller reads (back-pressure). */
export interface StreamedBody {
  readonly chunks: AsyncIterable<Uint8Array>;
  /** The caller went away before the end: stop producing. */
  cancel(): void;
}

export const kHttpExchange = createContextKey<HttpExchange | undefined>(undefined, {
  description: "skiff HTTP/JSON exchange",
});

/** Chooses the HTTP status a REST caller gets when the handler succeeds. */
export function setHttpStatus(ctx: HandlerContext, status: number): void {
  if (!Number.isInteger(status) || status < 200 || status > 599) {
    throw new RangeError(`HTTP status out of range: ${status}`);
  }
  const exchange = ctx.values.get(kHttpExchange);
  if (exchange) exchange.status = status;
}

/** The REST exchange of this call, or undefined for a Connect or gRPC call. */
export function httpExchange(ctx: HandlerContext): HttpExchange | undefined {
  return ctx.values.get(kHttpExchange);
}

/**
 * Makes the REST answer's body `body`, written chunk by chunk after the
 * head (status, headers, the response message's content type) instead of
 * the response message's bytes. False for a Connect or gRPC call, which
 * has no exchange: the handler answers with a message then.
 */
export function streamHttpBody(ctx: HandlerContext, body: StreamedBody): boolean {
  const exchange = ctx.values.get(kHttpExchange);
  if (!exchange) return false;
  exchange.stream = body;
  return true;
}
