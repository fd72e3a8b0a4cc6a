// What a run asks of a runner and what it gets back: the contract between the
// gateway and the runner, in-process or over NATS (see runner-client/).
import type { CallSignal, StreamedRequestBody } from "../server/index.js";

/**
 * A Custom app's bodies larger than this (or of unknown length) stream
 * between its caller and its replica, both ways, when the path allows it;
 * smaller ones pass whole, which costs less per call.
 */
export const STREAM_BODIES_ABOVE = 256 * 1024;

export interface InvokeRequest {
  runId: string;
  method: string;
  /** After the app name: "/fn" (or "fn") for a Cortex app, any path for a Custom one. */
  path: string;
  /** Without the leading "?"; "" for none. */
  query: string;
  /** Lower-case names; only those that apps get (see server/headers.ts). */
  headers: Record<string, string>;
  body: Uint8Array;
  /**
   * A Custom app's body as the caller sends it (`body` is empty then): the
   * runner streams it to the replica. Across NATS it follows the request
   * on the run's byte stream (runner-client/nats.ts).
   */
  bodyStream?: StreamedRequestBody;
  /** Stops the run: an AbortSignal, or a REST call's own (lighter) signal. */
  signal?: CallSignal;
  /**
   * The caller takes a streamed answer: an answer the app streams (no
   * Content-Length, or text/event-stream) comes back as `stream` as soon as
   * its head arrives. Otherwise every answer comes back whole.
   */
  acceptStream?: boolean;
  /**
   * The largest answer the caller takes (an async run's result) and the
   * setting that says so: a larger one is read no further, and the run
   * fails with error type result_too_large naming the setting.
   */
  answerLimit?: AnswerLimit;
}

export interface AnswerLimit {
  bytes: number;
  /** The SKIFF_* setting the caller's error names. */
  setting: string;
}

/**
 * The body of an answer that streams: its chunks as the app writes them.
 * Reading slowly slows the app (back-pressure); the run holds its replica
 * slot and its response_grace_period until the body has ended.
 */
export interface AnswerStream {
  /** The chunks, once (the iterator ends when the body ends, and throws the run's error when it breaks). */
  readonly chunks: AsyncIterable<Uint8Array>;
  /** Stops the answer (its caller went away): the run ends cancelled. */
  cancel(): void;
  /** Settles when the body has passed whole, or with the run's error. */
  readonly ended: Promise<StreamEnd>;
}

/** How a streamed body ended. */
export interface StreamEnd {
  /** From handing the request to a replica to the body's end. */
  runTimeMs: number;
  /** The app reported a failure after the head had gone out (a Cortex generator that raised). */
  error?: { type: string; message: string };
}

export interface InvokeResponse {
  status: number;
  /** Those the replica sent that its caller gets, Content-Type among them (see server/headers.ts); set-cookie may repeat. */
  headers: Record<string, string | string[]>;
  body: Uint8Array;
  /** From handing the request to a replica to the end of its response (to its head, for a streamed one). */
  runTimeMs: number;
  replicaId: string;
  /** Set when the answer streams (only if the request accepted it): `body` is then empty. */
  stream?: AnswerStream;
}
