// Reading a REST request body under SKIFF_MAX_BODY_BYTES, and getting rid of
// the part of a refused body that the client is still sending.
import type http from "node:http";
import http2 from "node:http2";
import { Code } from "@connectrpc/connect";
import { TranscodeError } from "./errors.js";

export type NodeRequest = http.IncomingMessage | http2.Http2ServerRequest;
export type NodeResponse = http.ServerResponse | http2.Http2ServerResponse;

/**
 * Whether a response closed before its whole answer was handed over: the
 * caller went away. (An HTTP/2 response reset by its caller reads as
 * writableFinished, but not writableEnded.)
 */
export function closedEarly(res: NodeResponse): boolean {
  return !res.writableEnded || !res.writableFinished;
}

/** How long, and how many more bytes, an HTTP/1.1 client may send of a refused body before its connection is closed. */
const DISCARD_MS = 5_000;
const DISCARD_BYTES = 1024 * 1024;

export function tooLarge(limit: number): TranscodeError {
  return new TranscodeError(Code.ResourceExhausted, `request body larger than ${limit} bytes`, { status: 413 });
}

/** Whether the body's declared length (Content-Length) passes `limit`: refused before any of it is read. */
function declaredOver(req: NodeRequest, limit: number): boolean {
  return Number(req.headers["content-length"]) > limit;
}

/** Raised when the client goes away before its body is read; nobody is left to answer. */
export class ClientGoneError extends Error {
  override name = "ClientGoneError";
}

/**
 * The whole body, refused with 413 as soon as it passes `limit`: up front by
 * Content-Length, else while counting streamed bytes, so a chunked body is
 * never buffered beyond the limit. The request is paused when refused;
 * discardRequest() deals with the rest.
 */
export function readBody(req: NodeRequest, limit: number): Promise<Buffer> {
  if (declaredOver(req, limit)) return Promise.reject(tooLarge(limit));
  if (req.readableEnded) return Promise.resolve(Buffer.alloc(0));
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let total = 0;
    const done = () => {
      req.off("data", onData);
      req.off("end", onEnd);
      req.off("close", onClose);
    };
    const onData = (chunk: Buffer) => {
      total += chunk.length;
      if (total > limit) {
        done();
        req.pause();
        reject(tooLarge(limit));
        return;
      }
      chunks.push(chunk);
    };
    const onEnd = () => {
      done();
      resolve(Buffer.concat(chunks, total));
    };
    // "close" before "end": the client reset the stream or the connection.
    const onClose = () => {
      done();
      reject(new ClientGoneError("client closed the request"));
    };
    req.on("data", onData);
    req.once("end", onEnd);
    req.once("close", onClose);
  });
}

/** Requests whose rest is being dropped already. */
const discarded = new WeakSet<NodeRequest>();

/**
 * After an answer was written without reading the whole body (413, or an
 * error before the body was read): HTTP/2 ends the request stream with
 * RST_STREAM(NO_ERROR) once the answer is sent, as RFC 9113 section 8.1
 * allows. HTTP/1.1 has no such signal; closing the socket at once could
 * reset it before the client read the answer, so the rest of the body is
 * read and dropped, which also keeps the connection usable; past
 * DISCARD_BYTES or DISCARD_MS the connection is closed instead.
 */
export function discardRequest(req: NodeRequest): void {
  if (req.readableEnded || req.destroyed || discarded.has(req)) return;
  discarded.add(req);
  if ("stream" in req) {
    // The stream's own "finish" (the answer is flushed): the response object
    // only finishes when the stream closes, which this is about to do.
    const stream = req.stream;
    const close = () => {
      if (!stream.closed) stream.close(http2.constants.NGHTTP2_NO_ERROR);
    };
    if (stream.writableFinished) close();
    else stream.once("finish", close);
    return;
  }
  const socket = req.socket;
  let left = DISCARD_BYTES;
  const timer = setTimeout(() => socket.destroy(), DISCARD_MS);
  timer.unref();
  const stop = () => clearTimeout(timer);
  req.on("data", (chunk: Buffer) => {
    left -= chunk.length;
    if (left < 0) {
      stop();
      socket.destroy();
    }
  });
  req.once("end", stop);
  req.once("close", stop);
  req.resume();
}

/** A body's chunks, read to the end and joined (StreamedRequestBody.read). */
export async function readWhole(chunks: AsyncIterable<Uint8Array>): Promise<Uint8Array> {
  const parts: Uint8Array[] = [];
  let size = 0;
  for await (const chunk of chunks) {
    parts.push(chunk);
    size += chunk.byteLength;
  }
  return Buffer.concat(parts, size);
}

/**
 * Whether a request's body is worth streaming rather than reading whole: it
 * is declared larger than `above`, or its length is not declared (chunked
 * HTTP/1.1; HTTP/2 DATA frames without Content-Length). A request without a
 * body has none to stream.
 */
export function streamsBody(req: NodeRequest, above: number): boolean {
  if (req.readableEnded) return false;
  const declared = req.headers["content-length"];
  if (declared !== undefined) return Number(declared) > above;
  return "stream" in req ? !req.stream.endAfterHeaders : req.headers["transfer-encoding"] !== undefined;
}

/**
 * A request body left for the handler to read as it comes, under `limit`
 * (one declared larger is refused at once, as readBody does): too large
 * fails with 413, a caller gone with ClientGoneError, and the
 * first failure stays in `failure` for the transcoder to answer with. Once
 * the call is answered, finish() drops what no one read (see discardRequest),
 * at once or when the reader under way stops.
 */
export class PendingBody {
  readonly length: number | undefined;
  failure: Error | undefined;
  private taken = false;
  private reading = false;
  private finished = false;

  constructor(
    private readonly req: NodeRequest,
    private readonly limit: number,
  ) {
    if (declaredOver(req, limit)) throw tooLarge(limit);
    const declared = req.headers["content-length"];
    this.length = declared === undefined ? undefined : Number(declared);
  }

  async *chunks(): AsyncGenerator<Uint8Array> {
    if (this.taken) throw new Error("the request body was read already");
    this.taken = this.reading = true;
    let total = 0;
    try {
      // Not destroyOnReturn: a reader that stops early (the app answered first) must leave the
      // request whole, or its connection would go and the answer with it.
      for await (const chunk of this.req.iterator({ destroyOnReturn: false }) as AsyncIterable<Buffer>) {
        total += chunk.byteLength;
        if (total > this.limit) throw this.fail(tooLarge(this.limit));
        yield chunk;
      }
      // An HTTP/1.1 request cut short ends its iterator with an error. An HTTP/2 stream reset ends it as
      // END_STREAM would, and says "aborted" only after that: a turn of the event loop later.
      if ("stream" in this.req) await new Promise(setImmediate);
      if ("stream" in this.req ? this.req.aborted : !this.req.complete)
        throw this.fail(new ClientGoneError("client closed the request"));
    } catch (err) {
      throw this.failure ?? this.fail(new ClientGoneError("client closed the request", { cause: err }));
    } finally {
      this.reading = false;
      if (this.finished) discardRequest(this.req);
    }
  }

  read(): Promise<Uint8Array> {
    return readWhole(this.chunks());
  }

  /** The call is answered: what is left of the body is dropped (by its reader's end, when one is under way). */
  finish(): void {
    this.finished = true;
    if (!this.reading) discardRequest(this.req);
  }

  private fail(err: Error): Error {
    this.failure ??= err;
    return err;
  }
}
