// Turning a replica's HTTP answer into the caller's final answer, and the
// caller's request into the replica's.
import type http from "node:http";
import { isForwardedToApp } from "../server/index.js";
import type { Exchange } from "./replica.js";

const JSON_HEADERS = { "content-type": "application/json" } as const;

/**
 * A Custom app's request headers: the caller's that apps get (the gateway
 * filtered them already; a runner does not rely on it, and drops any other),
 * less Expect (the caller's 100-continue is answered by skiff's server, and
 * the body is sent at once), plus the run id and the body length when it is
 * known (a streamed body of unknown length goes chunked). Written into the
 * request's own headers, which are the replica request's from here on: no
 * copy.
 */
export function forwardHeaders(
  headers: Record<string, string>,
  runId: string,
  length: number | undefined,
): http.OutgoingHttpHeaders {
  for (const name in headers) {
    const lower = name.toLowerCase();
    if (!isForwardedToApp(lower) || lower === "expect") delete headers[name];
  }
  const out: http.OutgoingHttpHeaders = headers;
  out["x-request-id"] = runId;
  if (length !== undefined) out["content-length"] = length;
  return out;
}

/** A Cortex shim's request: JSON arguments and the run id; `accept` asks a generator to stream (see the shims). */
export function cortexHeaders(runId: string, length: number, accept?: string): http.OutgoingHttpHeaders {
  const headers: http.OutgoingHttpHeaders = {
    "content-type": "application/json",
    "content-length": length,
    "x-request-id": runId,
  };
  if (accept !== undefined) headers.accept = accept;
  return headers;
}

/**
 * The Cortex envelope, spliced from the shim's bytes without parsing the
 * result: 200 {"run_id","result","run_time_ms"}; any other status carries
 * the shim's {"error": {...}} object with run_id put first.
 */
export function cortexEnvelope(
  ex: Exchange,
  runId: string,
  runTimeMs: number,
): { status: number; headers: Record<string, string>; body: Buffer } {
  const id = JSON.stringify(runId);
  if (ex.status === 200) {
    const body = Buffer.concat([
      Buffer.from(`{"run_id":${id},"result":`),
      ex.body,
      Buffer.from(`,"run_time_ms":${runTimeMs}}`),
    ]);
    return { status: 200, headers: { ...JSON_HEADERS }, body };
  }
  const rest = ex.body.subarray(ex.body.indexOf(0x7b) + 1); // after the shim's opening "{"
  return {
    status: ex.status,
    headers: { ...JSON_HEADERS },
    body: Buffer.concat([Buffer.from(`{"run_id":${id},`), rest]),
  };
}

/**
 * The shim's 400 for a body that does not fit the function's parameters
 * (`{"error": {"type": "invalid_argument", "message"}}`, message naming the
 * parameter): its message, or undefined for any other answer.
 */
export function invalidArguments(ex: Exchange): string | undefined {
  if (ex.status !== 400) return undefined;
  try {
    const error = (JSON.parse(ex.body.toString("utf8")) as { error?: { type?: unknown; message?: unknown } }).error;
    return error?.type === "invalid_argument" && typeof error.message === "string" ? error.message : undefined;
  } catch {
    return undefined;
  }
}

/**
 * What a run gets in place of an answer larger than the caller takes (see
 * Replica.send's maxBody): 502 {"run_id", "error": {"type":
 * "result_too_large", "message"}}, the shape of a Cortex function's error,
 * which the run's outcome reads as its error.
 */
export function tooLargeAnswer(
  runId: string,
  message: string,
): { status: number; headers: Record<string, string>; body: Buffer } {
  const error = { type: "result_too_large", message };
  return {
    status: 502,
    headers: { ...JSON_HEADERS },
    body: Buffer.from(JSON.stringify({ run_id: runId, error })),
  };
}

/**
 * What a run gets in place of an answer whose status is not HTTP's (outside
 * 100-599): 502 {"run_id", "error": {"type": "bad_status", "message"}}, on
 * every path alike (a status the runner cannot pass on is no answer).
 */
export function badStatusAnswer(
  runId: string,
  status: number,
  app: string,
): { status: number; headers: Record<string, string>; body: Buffer } {
  const error = { type: "bad_status", message: `app ${app} answered status ${status}, outside HTTP's 100-599` };
  return {
    status: 502,
    headers: { ...JSON_HEADERS },
    body: Buffer.from(JSON.stringify({ run_id: runId, error })),
  };
}
