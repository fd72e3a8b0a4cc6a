// How a run ended, decided in one place for the sync gateway and the async
// worker alike: the final state and error of the record, and, for runs that
// produced no app answer, the Connect error the sync caller gets (whose REST
// body is also what a webhook receives for such a run).
import { Code, ConnectError } from "@connectrpc/connect";
import {
  AppNotFound,
  Cancelled,
  FunctionNotFound,
  InvalidArguments,
  Overloaded,
  ReplicaCrashed,
  RequestBodyFailed,
  RunTimeout,
  StartFailed,
} from "./errors.js";
import type { InvokeResponse } from "./invoke.js";
import type { FinalStatus } from "./status.js";
import type { RunErrorInfo } from "./store.js";
import { codeHttpStatus, errorBody } from "../server/index.js";

export interface RunOutcome {
  status: FinalStatus;
  statusCode: number;
  runTimeMs: number;
  error?: RunErrorInfo;
  /** The body the sync caller got (or would have got). */
  body: { contentType: string; data: Uint8Array };
  /** The body's size when `body` holds less than the caller got (a streamed answer, kept in part or not at all). */
  responseBytes?: number;
}

/** No runner hosts the app (nobody answered its invoke subject). */
export class NoRunner extends Error {
  override name = "NoRunner";
}

const decoder = new TextDecoder();

/**
 * How much of an app's error a run's record keeps (the answer's body, which the caller and the webhook get and
 * a kept result holds, keeps all of it): the record travels in every event's header, and one past the NATS
 * server's max_payload could not be published, which left the run out of the history.
 */
export const MAX_ERROR_TYPE_CHARS = 200;
export const MAX_ERROR_MESSAGE_CHARS = 8 * 1024;

function cut(text: string, max: number): string {
  if (text.length <= max) return text;
  // Not between the two halves of a surrogate pair (an emoji): the kept half would be no character.
  const at = /[\ud800-\udbff]/.test(text[max - 1]) ? max - 1 : max;
  return `${text.slice(0, at)}… (${text.length - at} more characters)`;
}

/** A Cortex error envelope's {"error": {type, message}}, or the HTTP status for anything else. */
function answerError(res: InvokeResponse, contentType: string): RunErrorInfo {
  if (contentType.startsWith("application/json")) {
    try {
      const error = (JSON.parse(decoder.decode(res.body)) as { error?: { type?: unknown; message?: unknown } }).error;
      if (error && typeof error.type === "string")
        return {
          type: cut(error.type, MAX_ERROR_TYPE_CHARS),
          message: typeof error.message === "string" ? cut(error.message, MAX_ERROR_MESSAGE_CHARS) : "",
        };
    } catch {
      // not the envelope: fall through
    }
  }
  return { type: "http_error", message: `the app answered ${res.status}` };
}

export function contentTypeOf(headers: InvokeResponse["headers"]): string {
  const value = headers["content-type"];
  return (Array.isArray(value) ? value[0] : value) ?? "application/octet-stream";
}

/** An app answered: 5xx reads failure (a Cortex function that raised answers 500), anything else success. */
export function outcomeOfAnswer(res: InvokeResponse): RunOutcome {
  const contentType = contentTypeOf(res.headers);
  const body = { contentType, data: res.body };
  if (res.status >= 500)
    return {
      status: "failure",
      statusCode: res.status,
      runTimeMs: res.runTimeMs,
      error: answerError(res, contentType),
      body,
    };
  return { status: "success", statusCode: res.status, runTimeMs: res.runTimeMs, body };
}

/** The Connect error a sync caller gets for a run that produced no app answer, and the record's error type. */
export function runFailure(err: unknown): { connect: ConnectError; type: string } {
  if (err instanceof RunTimeout)
    return { connect: new ConnectError(err.message, Code.DeadlineExceeded), type: "timeout" };
  if (err instanceof Overloaded) {
    return {
      connect: new ConnectError(err.message, Code.ResourceExhausted, { "retry-after": String(err.retryAfterSeconds) }),
      type: "overloaded",
    };
  }
  if (err instanceof Cancelled) return { connect: new ConnectError(err.message, Code.Canceled), type: "cancelled" };
  if (err instanceof RequestBodyFailed)
    return err.reason === "gone"
      ? { connect: new ConnectError(err.message, Code.Canceled), type: "cancelled" }
      : err.reason === "lost"
        ? { connect: new ConnectError(err.message, Code.Unavailable), type: "request_body_lost" }
        : { connect: new ConnectError(err.message, Code.ResourceExhausted), type: "request_too_large" };
  if (err instanceof FunctionNotFound)
    return { connect: new ConnectError(err.message, Code.NotFound), type: "function_not_found" };
  if (err instanceof InvalidArguments)
    return { connect: new ConnectError(err.message, Code.InvalidArgument), type: "invalid_argument" };
  if (err instanceof ReplicaCrashed)
    return { connect: new ConnectError(err.message, Code.Unavailable), type: "replica_crashed" };
  if (err instanceof StartFailed)
    return { connect: new ConnectError(err.message, Code.Unavailable), type: "start_failed" };
  if (err instanceof AppNotFound || err instanceof NoRunner)
    return { connect: new ConnectError(err.message, Code.Unavailable), type: "no_runner" };
  if (err instanceof ConnectError) return { connect: err, type: Code[err.code].toLowerCase() };
  return { connect: new ConnectError("the run failed inside skiff", Code.Internal), type: "internal" };
}

/** The outcome of a run that ended without an app answer. */
export function outcomeOfError(err: unknown, runTimeMs: number): RunOutcome {
  const { connect, type } = runFailure(err);
  const data = new TextEncoder().encode(errorBody(connect.code, connect.rawMessage));
  return {
    status: type === "cancelled" ? "cancelled" : "failure",
    // A body too large is answered 413 (as the transcoder refuses one up front), not resource_exhausted's 429.
    statusCode: type === "request_too_large" ? 413 : codeHttpStatus(connect.code),
    runTimeMs,
    error: { type, message: connect.rawMessage },
    body: { contentType: "application/json", data },
  };
}
