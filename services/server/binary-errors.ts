// A request message that is not protobuf is the caller's error. Connect's
// binary serialization answers any failure to parse a request with
// `internal` ("parse binary: …"), which is a 500 over Connect and
// grpc-status 13 over gRPC: reachable without a token on the open Health
// service, and with one on every method. Each RPC's handler is wrapped so
// that such an answer says `invalid_argument` (400, grpc-status 3) instead;
// any other answer passes as it is. (JSON requests are checked before
// Connect parses them: see connectJsonOptions in server.ts.)
import type { UniversalHandler, UniversalServerResponse } from "@connectrpc/connect/protocol";

/** What Connect's binary parse failure says, as written and as connect-node percent-encodes a grpc-message. */
const PARSE_BINARY = /^parse(?: |%20)binary(?::|%3A)/;

/** The handler, answering a parse failure of its request message as invalid_argument. */
export function withBinaryParseErrors(handler: UniversalHandler): UniversalHandler {
  const wrapped = async (req: Parameters<UniversalHandler>[0]): Promise<UniversalServerResponse> => {
    const res = await handler(req);
    if (res.status === 500) return connectUnary(res);
    if (
      (res.trailer !== undefined || /^application\/grpc-web/.test(res.header?.get("content-type") ?? "")) &&
      res.body !== undefined &&
      typeof res.body === "object" &&
      Symbol.asyncIterator in res.body
    )
      return { ...res, body: fixingTrailer(res.body, res.trailer, res.header) };
    return res;
  };
  return Object.assign(wrapped, handler);
}

/** A Connect unary error answer (500, JSON): rewritten when it is a parse failure. */
async function connectUnary(res: UniversalServerResponse): Promise<UniversalServerResponse> {
  const header = res.header;
  if (header?.get("content-type") !== "application/json" || header.has("content-encoding")) return res;
  const chunks: Uint8Array[] = [];
  if (res.body instanceof Uint8Array) chunks.push(res.body);
  else if (res.body !== undefined) for await (const chunk of res.body) chunks.push(chunk);
  const bytes = Buffer.concat(chunks);
  let error: { code?: unknown; message?: unknown } | undefined;
  try {
    error = JSON.parse(bytes.toString("utf8")) as typeof error;
  } catch {
    error = undefined;
  }
  if (error?.code !== "internal" || typeof error.message !== "string" || !PARSE_BINARY.test(error.message))
    return { ...res, body: once(bytes) };
  const body = Buffer.from(JSON.stringify({ code: "invalid_argument", message: error.message }));
  header.set("content-length", String(body.length));
  return { ...res, status: 400, body: once(body) };
}

async function* once(bytes: Uint8Array): AsyncIterable<Uint8Array> {
  yield bytes;
}

/** A gRPC answer's body, after which a parse failure's status in its trailers (or its headers) reads 3. */
async function* fixingTrailer(
  body: AsyncIterable<Uint8Array>,
  trailer: Headers | undefined,
  header: Headers | undefined,
): AsyncIterable<Uint8Array> {
  fix(header);
  for await (const chunk of body) yield trailerFrame(chunk);
  fix(trailer);
}

/**
 * gRPC-Web's trailers travel in the body, as a frame flagged 0x80: one that
 * reports a parse failure with status 13 is written again with 3.
 */
function trailerFrame(chunk: Uint8Array): Uint8Array {
  if (chunk.length < 5 || chunk[0] !== 0x80) return chunk;
  const length = Buffer.from(chunk.buffer, chunk.byteOffset, chunk.length).readUInt32BE(1);
  if (length !== chunk.length - 5) return chunk;
  const text = Buffer.from(chunk.buffer, chunk.byteOffset + 5, length).toString("latin1");
  const message = /^grpc-message: ?(.*)$/im.exec(text)?.[1] ?? "";
  if (!/^grpc-status: ?13\r?$/im.test(text) || !PARSE_BINARY.test(message)) return chunk;
  const fixed = Buffer.from(text.replace(/^(grpc-status: ?)13(\r?)$/im, "$13$2"), "latin1");
  const frame = Buffer.alloc(5 + fixed.length);
  frame[0] = 0x80;
  frame.writeUInt32BE(fixed.length, 1);
  fixed.copy(frame, 5);
  return frame;
}

function fix(h: Headers | undefined): void {
  if (h?.get("grpc-status") === "13" && PARSE_BINARY.test(h.get("grpc-message") ?? "")) h.set("grpc-status", "3");
}
