// Which HTTP headers cross which boundary, decided in one place. skiff
// stands between a caller and an app: a Custom app gets the caller's request
// headers and the caller gets the app's response headers, each less those
// that belong to one connection, to the RPC protocol, or to skiff itself.
// The REST transcoder stands between a REST caller and the RPC handler, and
// passes on neither the REST exchange's own headers nor the RPC's.
//
// All header names here are lower case, as Node and the Fetch API give them.

/**
 * Connection-specific fields: they describe one hop, never the message, and
 * are never forwarded in either direction. RFC 9110 §7.6.1 (connection,
 * proxy-connection, keep-alive, te, transfer-encoding, upgrade), trailer
 * (which announces the hop's own trailers), the proxy authentication pair
 * (meant for the next proxy only), and HTTP2-Settings (RFC 7540 §3.2.1).
 */
const HOP_BY_HOP = new Set([
  "connection",
  "keep-alive",
  "proxy-authenticate",
  "proxy-authorization",
  "proxy-connection",
  "te",
  "trailer",
  "transfer-encoding",
  "upgrade",
  "http2-settings",
]);

/** Headers of the Connect, gRPC and gRPC-Web protocols themselves. */
function isRpcProtocol(name: string): boolean {
  return name.startsWith("connect-") || name.startsWith("grpc-");
}

/**
 * Request headers an app never gets from its caller: hop-by-hop ones; Host
 * (the app has its own) and Content-Length (recomputed for the body as
 * sent); Accept-Encoding (skiff, not the app, answers the caller, and passes
 * the app's body on as it is); the caller's credentials and skiff's own
 * (X-Request-Id is set to the run id); and the RPC protocol's.
 */
const NOT_FORWARDED_TO_APPS = new Set([
  "host",
  "content-length",
  "accept-encoding",
  "authorization",
  "x-webhook-secret",
  "idempotency-key",
  "x-request-id",
]);

/** Whether an app gets this request header of its caller (a lower-case name). */
export function isForwardedToApp(name: string): boolean {
  return !HOP_BY_HOP.has(name) && !NOT_FORWARDED_TO_APPS.has(name) && !isRpcProtocol(name);
}

/**
 * The request headers an app gets, from the caller's. `bodyContentType`,
 * when given, is the content type of the body the app gets, which replaces
 * the caller's Content-Type (an RPC's Content-Type names the RPC encoding);
 * "" sends none.
 */
export function appRequestHeaders(
  headers: Iterable<[string, string]>,
  bodyContentType?: string,
): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [name, value] of headers) {
    const lower = name.toLowerCase();
    if (isForwardedToApp(lower) && !(bodyContentType !== undefined && lower === "content-type")) out[lower] = value;
  }
  if (bodyContentType) out["content-type"] = bodyContentType;
  return out;
}

/**
 * Response headers of an app that its caller gets: all but hop-by-hop ones,
 * Content-Length (recomputed), X-Request-Id (skiff's: the run id),
 * Skiff-Worker (skiff's: the worker that answered, which an app's own would
 * replace) and those of the RPC protocols (including Connect's `trailer-`
 * prefix). Content-Type passes; an RPC carries it with the body rather than
 * as a header.
 */
export function isPassedToCaller(name: string): boolean {
  return (
    !HOP_BY_HOP.has(name) &&
    name !== "content-length" &&
    name !== "x-request-id" &&
    name !== "skiff-worker" &&
    !isRpcProtocol(name) &&
    !name.startsWith("trailer-")
  );
}

/** An app's answer headers, less those its caller never gets (see isPassedToCaller). */
export function callerHeaders(
  headers: Readonly<Record<string, string | string[] | undefined>>,
): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  for (const name in headers) {
    const value = headers[name];
    if (value !== undefined && isPassedToCaller(name)) out[name] = value;
  }
  return out;
}

/**
 * Request headers that describe a REST exchange itself, not the call, and
 * so never reach the RPC handler: hop-by-hop ones, the REST body's
 * Content-* and Accept-Encoding (the handler gets a message, not that body),
 * and the RPC protocols' own.
 */
export function isRestExchangeHeader(name: string): boolean {
  return HOP_BY_HOP.has(name) || name === "accept-encoding" || name.startsWith("content-") || isRpcProtocol(name);
}

/**
 * Response headers of an RPC handler that belong to its Connect exchange,
 * not to the REST caller (Set-Cookie is copied on its own, since it may
 * repeat).
 */
export function isRpcExchangeResponseHeader(name: string): boolean {
  return isRestExchangeHeader(name) || name.startsWith("trailer-") || name === "set-cookie";
}

/** The last host that made a URL: a caller sends the same one call after call. */
let lastGoodHost: string | undefined;

/**
 * Whether a request's Host (HTTP/1.1) or :authority (HTTP/2) makes a URL,
 * as the Connect adapter makes one of it before anything else, outside any
 * try: a Host of "[" or "a b" threw there, in the server's request listener,
 * and ended the process.
 */
export function hostMakesUrl(host: string | undefined): boolean {
  if (host === undefined || host === "") return false;
  if (host === lastGoodHost) return true;
  if (!URL.canParse("/", `http://${host}`)) return false;
  lastGoodHost = host;
  return true;
}
