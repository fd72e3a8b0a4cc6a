// gRPC details the Connect adapter leaves to the server: an unknown method
// called with gRPC answers as gRPC does (HTTP 200, grpc-status 12), not with
// the REST 404; and grpc-message is percent-encoded only where the gRPC
// spec asks (bytes outside 0x20-0x7E, and "%"), where connect-node uses
// encodeURIComponent (a space becomes %20, "/" %2F).
import { Code } from "@connectrpc/connect";
import type { ConnectNodeAdapterOptions } from "@connectrpc/connect-node";

type NodeHandler = NonNullable<ConnectNodeAdapterOptions["fallback"]>;
type NodeRequest = Parameters<NodeHandler>[0];
type NodeResponse = Parameters<NodeHandler>[1];

/** Whether the request speaks gRPC or gRPC-Web (`application/grpc`, `application/grpc+proto`, `application/grpc-web…`). */
export function isGrpcRequest(req: NodeRequest): boolean {
  const type = req.headers["content-type"];
  return typeof type === "string" && /^application\/grpc([+;-]|$)/i.test(type);
}

/** The gRPC spec's Percent-Encoded form: printable ASCII but "%" stays as it is, every other UTF-8 byte is %XX. */
export function encodeGrpcMessage(message: string): string {
  let out = "";
  for (const byte of Buffer.from(message, "utf8")) {
    out +=
      byte >= 0x20 && byte <= 0x7e && byte !== 0x25
        ? String.fromCharCode(byte)
        : `%${byte.toString(16).toUpperCase().padStart(2, "0")}`;
  }
  return out;
}

/** A grpc-message value as another encoder wrote it, re-encoded minimally; left alone when it does not decode. */
function reencode(value: string): string {
  try {
    return encodeGrpcMessage(decodeURIComponent(value));
  } catch {
    return value;
  }
}

function fixHeaders<T>(headers: T): T {
  if (!headers || typeof headers !== "object" || Array.isArray(headers)) return headers;
  const out: Record<string, unknown> = { ...(headers as Record<string, unknown>) };
  for (const name of Object.keys(out)) {
    const value = out[name];
    if (name.toLowerCase() === "grpc-message" && typeof value === "string") out[name] = reencode(value);
  }
  return out as T;
}

/** Makes the response re-encode grpc-message in its headers and trailers (gRPC over HTTP/2; gRPC-Web's trailers are in the body). */
export function minimalGrpcMessages(res: NodeResponse): void {
  const writeHead = res.writeHead.bind(res) as (...args: unknown[]) => unknown;
  const addTrailers = res.addTrailers.bind(res) as (headers: unknown) => void;
  (res as { writeHead: unknown }).writeHead = (...args: unknown[]) =>
    writeHead(...args.map((arg, i) => (i > 0 ? fixHeaders(arg) : arg)));
  (res as { addTrailers: unknown }).addTrailers = (headers: unknown) => addTrailers(fixHeaders(headers));
}

/**
 * Answers a gRPC call to a method this server does not have: HTTP 200 and
 * grpc-status 12 (UNIMPLEMENTED) in a trailers-only response, as gRPC
 * servers do; the body of the request is drained.
 */
export function answerUnimplemented(req: NodeRequest, res: NodeResponse): void {
  const path = (req.url ?? "/").split("?", 1)[0];
  grpcTrailersOnly(req, res, Code.Unimplemented, `unknown method ${path.slice(0, 200)}`);
}

/**
 * A gRPC or gRPC-Web call's answer that is its status alone: HTTP 200 and
 * grpc-status in one HEADERS frame that ends the stream (what gRPC calls
 * Trailers-Only), as gRPC servers answer a call they refuse outright.
 */
export function grpcTrailersOnly(
  req: NodeRequest,
  res: NodeResponse,
  code: Code,
  message: string,
  more: Record<string, string> = {},
): void {
  const headers = {
    ...more,
    "content-type": String(req.headers["content-type"]),
    "grpc-status": String(code),
    "grpc-message": encodeGrpcMessage(message),
  };
  req.resume();
  if ("stream" in res) {
    if (!res.stream.destroyed && !res.stream.headersSent)
      res.stream.respond({ ":status": 200, ...headers }, { endStream: true });
    return;
  }
  res.writeHead(200, { ...headers, "content-length": "0" });
  res.end();
}
