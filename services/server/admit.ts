// Calls judged before their body is read. Connect parses a request's body
// before any interceptor runs, and the REST transcoder reads it before it
// calls the handler: without this, a caller with no valid token had up to a
// method's body limit (DeployApp's: SKIFF_MAX_BUNDLE_BYTES) buffered and
// parsed for it before its 401. So the server asks `admit` first, for every
// RPC path a service here has (server.ts) and every REST route (the
// transcoder), and a refusal goes out at once in the caller's protocol; the
// body is drained as it comes, never kept.
import { Code, ConnectError } from "@connectrpc/connect";
import { grpcTrailersOnly } from "./grpc-status.js";
import { codeHttpStatus, codeString, errorBody } from "./rest/errors.js";
import type { NodeHandler } from "./rest/transcoder.js";

type NodeRequest = Parameters<NodeHandler>[0];
type NodeResponse = Parameters<NodeHandler>[1];

/** Undefined: the call goes on (its body is read, and it is judged in full then); else its refusal. */
export type AdmitVerdict = ConnectError | undefined;

/**
 * Judges a call of `service` (its protobuf type name) by its Authorization
 * header alone, before its body is read; answers at once (no promise) where
 * it can, as for a token seen before.
 */
export type Admit = (service: string, authorization: string | undefined) => AdmitVerdict | Promise<AdmitVerdict>;

/** The service of an RPC path (`/{package}.{Service}/{Method}`). */
export function serviceOfProcedure(path: string): string {
  return path.slice(1, path.lastIndexOf("/"));
}

type Protocol = "grpc" | "connect-stream" | "connect-unary";

/**
 * The protocol a call to an RPC path speaks, by its Content-Type (a Connect
 * GET has none); undefined when it speaks none of them, which the Connect
 * adapter refuses (415) without reading the body.
 */
function protocolOf(req: NodeRequest): Protocol | undefined {
  const type = (req.headers["content-type"] ?? "").toLowerCase();
  if (/^application\/grpc([+;-]|$)/.test(type)) return "grpc";
  if (/^application\/connect\+(json|proto)\s*(;|$)/.test(type)) return "connect-stream";
  if (/^application\/(json|proto)\s*(;|$)/.test(type) || (req.method === "GET" && type === "")) return "connect-unary";
  return undefined;
}

/**
 * Answers an RPC path's call with `refusal` in its protocol and drains its
 * body; false when the call speaks no protocol of an RPC (left to the
 * adapter).
 */
export function answerRefusal(req: NodeRequest, res: NodeResponse, refusal: ConnectError): boolean {
  const protocol = protocolOf(req);
  if (protocol === undefined) return false;
  const headers: Record<string, string> = {};
  refusal.metadata.forEach((value, name) => (headers[name] = value));
  // Drained as it comes: the refusal is the whole answer.
  req.resume();
  if (protocol === "grpc") {
    grpcTrailersOnly(req, res, refusal.code, refusal.rawMessage, headers);
    return true;
  }
  let status: number;
  let body: Buffer;
  if (protocol === "connect-unary") {
    status = codeHttpStatus(refusal.code);
    headers["content-type"] = "application/json";
    body = Buffer.from(errorBody(refusal.code, refusal.rawMessage));
  } else {
    // A stream's end: an envelope flagged 2 whose JSON carries the error, and the error's metadata.
    status = 200;
    headers["content-type"] = String(req.headers["content-type"]);
    const metadata: Record<string, string[]> = {};
    for (const name in headers) if (name !== "content-type") metadata[name] = [headers[name]];
    const json = Buffer.from(
      JSON.stringify({ error: { code: codeString(refusal.code), message: refusal.rawMessage }, metadata }),
    );
    body = Buffer.alloc(5 + json.length);
    body[0] = 2;
    body.writeUInt32BE(json.length, 1);
    json.copy(body, 5);
  }
  headers["content-length"] = String(body.length);
  res.writeHead(status, headers);
  res.end(body);
  return true;
}
