// Errors of the HTTP/JSON transcoder. Every REST error body is
// `{"code": "...", "message": "..."}` with the Connect code string, and the
// HTTP status the Connect protocol gives that code, so a REST caller and a
// Connect caller of the same failing call see the same code.
import { Code } from "@connectrpc/connect";

/** Connect code → [code string, HTTP status], as in the Connect protocol's error table. */
const CODES: Record<Code, readonly [string, number]> = {
  [Code.Canceled]: ["canceled", 499],
  [Code.Unknown]: ["unknown", 500],
  [Code.InvalidArgument]: ["invalid_argument", 400],
  [Code.DeadlineExceeded]: ["deadline_exceeded", 504],
  [Code.NotFound]: ["not_found", 404],
  [Code.AlreadyExists]: ["already_exists", 409],
  [Code.PermissionDenied]: ["permission_denied", 403],
  [Code.ResourceExhausted]: ["resource_exhausted", 429],
  [Code.FailedPrecondition]: ["failed_precondition", 400],
  [Code.Aborted]: ["aborted", 409],
  [Code.OutOfRange]: ["out_of_range", 400],
  [Code.Unimplemented]: ["unimplemented", 501],
  [Code.Internal]: ["internal", 500],
  [Code.Unavailable]: ["unavailable", 503],
  [Code.DataLoss]: ["data_loss", 500],
  [Code.Unauthenticated]: ["unauthenticated", 401],
};

export function codeString(code: Code): string {
  return CODES[code][0];
}

export function codeHttpStatus(code: Code): number {
  return CODES[code][1];
}

/**
 * An error the transcoder answers itself, before or after the handler runs.
 * `status` overrides the code's usual status where HTTP has a more precise
 * one: 405 (method), 413 (body size) and 415 (media type).
 */
export class TranscodeError extends Error {
  override name = "TranscodeError";
  readonly status: number;
  readonly headers: Record<string, string>;
  constructor(
    readonly code: Code,
    message: string,
    options: { status?: number; headers?: Record<string, string> } = {},
  ) {
    super(message);
    this.status = options.status ?? codeHttpStatus(code);
    this.headers = options.headers ?? {};
  }
}

export function invalidArgument(message: string): TranscodeError {
  return new TranscodeError(Code.InvalidArgument, message);
}

export function errorBody(code: Code, message: string): string {
  return JSON.stringify({ code: codeString(code), message });
}

/** The kind of a JSON value, as errors name it: never the value itself. */
export function jsonKind(json: unknown): string {
  if (json === null) return "null";
  if (Array.isArray(json)) return "an array";
  switch (typeof json) {
    case "string":
      return "a string";
    case "number":
      return "a number";
    case "boolean":
      return "a boolean";
    case "object":
      return "an object";
    default:
      return typeof json;
  }
}

/**
 * What a caller is told of a JSON body that is not an object, where a message
 * is expected: its kind only (protobuf-es's message quotes a short string
 * whole, and a body may be a bare secret).
 */
export function notAnObject(json: unknown): string | undefined {
  if (typeof json === "object" && json !== null && !Array.isArray(json)) return undefined;
  return `invalid JSON body: expected an object, got ${jsonKind(json)}`;
}

/**
 * What a caller is told of a body that is not JSON: where it broke, not V8's
 * message, which quotes the body's first characters (a body may carry a
 * secret, and a log line may carry the message); or that it is not UTF-8,
 * for an error of a fatal TextDecoder.
 */
export function malformedJson(err: unknown): string {
  if ((err as { code?: unknown } | undefined)?.code === "ERR_ENCODING_INVALID_ENCODED_DATA")
    return "malformed JSON body: not UTF-8 text";
  const at = /at position (\d+)/.exec(err instanceof Error ? err.message : "")?.[1];
  return `malformed JSON body: not valid JSON${at === undefined ? "" : ` (at position ${at})`}`;
}
