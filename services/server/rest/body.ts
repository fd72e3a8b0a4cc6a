// Reading a REST request body under SKIFF_MAX_BODY_BYTES, and getting rid of
// the part of a refused body that the client is still sending.
import type http from "node:http";
import http2 from "node:http2";
import { Code } from "@connectrpc/connect";
import { TranscodeError } from "./errors.js";

export type NodeRequest = http.IncomingMessage | http2.Http2ServerRequest;
export type NodeResponse = http.ServerResponse | http2.Http2ServerResponse;

/** How long, and how many more bytes, an HTTP/1.1 client may send of a refused body before its connection is closed. */
const DISCARD_MS = 5_000;
const DISCARD_BYTES = 1024 * 1024;

export function tooLarge(limit: number): TranscodeError {
  return new TranscodeError(Code.ResourceExhausted, `request body larger than ${limit} bytes`, { status: 413 });
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
  const declared = Number(req.headers["content-length"]);
  if (declared > limit) return Promise.reject(tooLarge(limit));
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
  if (req.readableEnded || req.destroyed) return;
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
