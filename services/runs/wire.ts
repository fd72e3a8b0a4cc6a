// The bytes of a run request and of its answer on NATS: the sync request
// and reply on `skiff.invoke.{project}.{app}` and the async message on
// `skiff.runs.queue.{project}.{app}`. A frame is a 4-byte big-endian length,
// that many bytes of JSON metadata, then the body as it is (no base64).
//
// A body too large for the server's max_payload travels through object
// store `skiff-results` under `transfer.{id}`: the frame names it, and
// the receiver reads and removes it.
import type { NatsConnection, ObjectStore } from "nats";
import type { BodyStreamMeta } from "./body-wire.js";
import { callerHeaders } from "../server/index.js";
import {
  AppNotFound,
  Cancelled,
  FunctionNotFound,
  Overloaded,
  ReplicaCrashed,
  RunnerError,
  RunTimeout,
  StartFailed,
} from "./errors.js";
import type { InvokeRequest, InvokeResponse } from "./invoke.js";
import type { RunRecord } from "./store.js";

/** Room for the metadata and NATS headers within max_payload. */
const FRAME_HEADROOM_BYTES = 64 * 1024;

export interface RequestMeta {
  run_id: string;
  method: string;
  path: string;
  query: string;
  headers: Record<string, string>;
  body_object?: string;
  /** An async run's `queued` record: the queue message is the record until a runner writes the next one. */
  record?: RunRecord;
  /** The gateway takes a streamed answer: its body goes to this inbox (see stream-wire.ts). */
  stream_to?: string;
  /** The body follows the request as it comes (see body-wire.ts); the frame's own body is empty then. */
  body_stream?: BodyStreamMeta;
}

/** A runner error, as an error reply (or a stream's `fail` frame) carries it. */
export interface ErrorMeta {
  error: string;
  message: string;
  retry_after?: number;
  seconds?: number;
  app?: string;
  function?: string;
}

export type ReplyMeta =
  | {
      status: number;
      headers: Record<string, string | string[]>;
      run_time_ms: number;
      replica_id: string;
      body_object?: string;
      /** The answer streams: its body follows on the request's `stream_to`; credit goes to `credit_to`. */
      stream?: { credit_to: string };
    }
  | ErrorMeta;

const encoder = new TextEncoder();
const decoder = new TextDecoder();

export function frame(meta: object, body: Uint8Array): Uint8Array {
  const json = encoder.encode(JSON.stringify(meta));
  const out = new Uint8Array(4 + json.byteLength + body.byteLength);
  new DataView(out.buffer).setUint32(0, json.byteLength);
  out.set(json, 4);
  out.set(body, 4 + json.byteLength);
  return out;
}

export function unframe<T>(data: Uint8Array): { meta: T; body: Uint8Array } {
  if (data.byteLength < 4) throw new Error("not a run frame");
  const metaLength = new DataView(data.buffer, data.byteOffset, data.byteLength).getUint32(0);
  if (4 + metaLength > data.byteLength) throw new Error("truncated run frame");
  return {
    meta: JSON.parse(decoder.decode(data.subarray(4, 4 + metaLength))) as T,
    body: data.subarray(4 + metaLength),
  };
}

/** Frames come from other processes: metadata not of the declared shape is refused, never passed on. */
class MalformedFrame extends Error {
  override name = "MalformedFrame";
  constructor(what: string) {
    super(`malformed run frame: ${what}`);
  }
}

type Fields = Record<string, unknown>;
const isObject = (v: unknown): v is Fields => typeof v === "object" && v !== null && !Array.isArray(v);
const isCount = (v: unknown): v is number => typeof v === "number" && Number.isFinite(v) && v >= 0;

function strings(meta: Fields, required: readonly string[], optional: readonly string[] = []): void {
  for (const k of required) if (typeof meta[k] !== "string") throw new MalformedFrame(`${k} is not a string`);
  for (const k of optional)
    if (meta[k] !== undefined && typeof meta[k] !== "string") throw new MalformedFrame(`${k} is not a string`);
}

function headerMap(v: unknown, lists: boolean): void {
  if (!isObject(v)) throw new MalformedFrame("headers is not an object");
  for (const value of Object.values(v))
    if (typeof value !== "string" && !(lists && Array.isArray(value) && value.every((x) => typeof x === "string")))
      throw new MalformedFrame("a header value is not a string");
}

/** An error reply's (or a stream's `fail` frame's) metadata, checked. */
export function checkErrorMeta(meta: Fields): ErrorMeta {
  strings(meta, ["error", "message"], ["app", "function"]);
  for (const k of ["retry_after", "seconds"])
    if (meta[k] !== undefined && !isCount(meta[k])) throw new MalformedFrame(`${k} is not a number`);
  return meta as unknown as ErrorMeta;
}

function checkRequestMeta(meta: unknown): RequestMeta {
  if (!isObject(meta)) throw new MalformedFrame("the metadata is not an object");
  strings(meta, ["run_id", "method", "path", "query"], ["body_object", "stream_to"]);
  headerMap(meta.headers, false);
  if (meta.record !== undefined && !isObject(meta.record)) throw new MalformedFrame("record is not an object");
  const b = meta.body_stream;
  if (
    b !== undefined &&
    !(isObject(b) && typeof b.credit_to === "string" && (b.length === undefined || isCount(b.length)))
  )
    throw new MalformedFrame("body_stream has no credit_to, or a length that is not a count");
  return meta as unknown as RequestMeta;
}

function checkReplyMeta(meta: unknown): ReplyMeta {
  if (!isObject(meta)) throw new MalformedFrame("the metadata is not an object");
  if ("error" in meta) return checkErrorMeta(meta);
  const status = meta.status;
  if (typeof status !== "number" || !Number.isInteger(status) || status < 100 || status > 599)
    throw new MalformedFrame("status is not an HTTP status");
  headerMap(meta.headers, true);
  if (!isCount(meta.run_time_ms)) throw new MalformedFrame("run_time_ms is not a number");
  strings(meta, ["replica_id"], ["body_object"]);
  if (meta.stream !== undefined && !(isObject(meta.stream) && typeof meta.stream.credit_to === "string"))
    throw new MalformedFrame("stream has no credit_to");
  return meta as unknown as ReplyMeta;
}

/** Moves large bodies through the object store. */
export class BodyTransfer {
  readonly limit: number;
  constructor(
    nc: NatsConnection,
    private readonly objects: () => Promise<ObjectStore>,
  ) {
    this.limit = nc.info!.max_payload - FRAME_HEADROOM_BYTES;
  }

  /** The sending side: the body to put in the frame, or none and the object it went to when too large for one. */
  async send(id: string, body: Uint8Array): Promise<{ body: Uint8Array; object?: string }> {
    if (body.byteLength <= this.limit) return { body };
    const name = `transfer.${id}`;
    await (await this.objects()).putBlob({ name }, body);
    return { body: new Uint8Array(0), object: name };
  }

  /** The receiving side: the body a frame carried, read back from the store when it was there, and removed unless `keep`. */
  async receive(body: Uint8Array, object: string | undefined, keep = false): Promise<Uint8Array> {
    if (object === undefined) return body;
    const os = await this.objects();
    const data = await os.getBlob(object);
    if (data === null) throw new Error(`run body ${object} is missing from the object store`);
    if (!keep) await os.delete(object).catch(() => undefined);
    return data;
  }

  /** Removes a stored body nobody will read (the request failed). */
  async drop(object: string | undefined): Promise<void> {
    if (object !== undefined) await (await this.objects()).delete(object).catch(() => undefined);
  }
}

/**
 * A request frame; an async run's carries its `queued` record too, a sync
 * one that takes a stream its inbox, and one whose body follows it where
 * the runner asks for it (body-wire.ts).
 */
export async function encodeRequest(
  transfer: BodyTransfer,
  req: InvokeRequest,
  { record, streamTo, bodyStream }: { record?: RunRecord; streamTo?: string; bodyStream?: BodyStreamMeta } = {},
): Promise<{ data: Uint8Array; object?: string }> {
  const { body, object } = await transfer.send(`${req.runId}.request`, req.body);
  const meta: RequestMeta = {
    run_id: req.runId,
    method: req.method,
    path: req.path,
    query: req.query,
    headers: req.headers,
    ...(object ? { body_object: object } : {}),
    ...(record ? { record } : {}),
    ...(streamTo ? { stream_to: streamTo } : {}),
    ...(bodyStream ? { body_stream: bodyStream } : {}),
  };
  return { data: frame(meta, body), object };
}

/** A request as a runner reads it: with where a streamed answer goes, and where a streamed body comes from. */
export type DecodedRequest = InvokeRequest & { streamTo?: string; bodyFrom?: BodyStreamMeta };

/** The request a frame carries; with `keepObject` a stored body stays (an async message may be delivered again). */
export async function decodeRequest(
  transfer: BodyTransfer,
  data: Uint8Array,
  keepObject = false,
): Promise<DecodedRequest> {
  return (await decodeRequestFrame(transfer, data, keepObject)).req;
}

/** decodeRequest() with the frame's metadata as well (its record, its body's object), read once. */
export async function decodeRequestFrame(
  transfer: BodyTransfer,
  data: Uint8Array,
  keepObject = false,
): Promise<{ meta: RequestMeta; req: DecodedRequest }> {
  const { meta: raw, body } = unframe<unknown>(data);
  const meta = checkRequestMeta(raw);
  const full = await transfer.receive(body, meta.body_object, keepObject);
  const req = {
    runId: meta.run_id,
    method: meta.method,
    path: meta.path,
    query: meta.query,
    headers: meta.headers,
    body: full,
    ...(meta.stream_to ? { acceptStream: true, streamTo: meta.stream_to } : {}),
    ...(meta.body_stream ? { bodyFrom: meta.body_stream } : {}),
  };
  return { meta, req };
}

/** A request frame's metadata: the run id, and the object holding its body, if any (to remove once the run is final). */
export function requestMeta(data: Uint8Array): RequestMeta {
  return checkRequestMeta(unframe<unknown>(data).meta);
}

/** The answer's reply frame; a streamed answer's is its head, naming where the gateway sends credit. */
export async function encodeReply(
  transfer: BodyTransfer,
  runId: string,
  res: InvokeResponse,
  creditTo?: string,
): Promise<Uint8Array> {
  const { body, object } = await transfer.send(`${runId}.reply`, res.body);
  return frame(
    {
      status: res.status,
      headers: res.headers,
      run_time_ms: res.runTimeMs,
      replica_id: res.replicaId,
      ...(object ? { body_object: object } : {}),
      ...(creditTo ? { stream: { credit_to: creditTo } } : {}),
    },
    body,
  );
}

/** A runner error as an error reply (or a stream's `fail` frame) carries it. */
export function errorMeta(err: RunnerError): ErrorMeta {
  const meta: ErrorMeta = { error: err.name, message: err.message };
  if (err instanceof Overloaded) meta.retry_after = err.retryAfterSeconds;
  if (err instanceof RunTimeout) meta.seconds = err.seconds;
  if (err instanceof AppNotFound) meta.app = `${err.projectId}/${err.appName}`;
  if (err instanceof FunctionNotFound) [meta.app, meta.function] = [err.appName, err.functionName];
  return meta;
}

export function encodeErrorReply(err: RunnerError): Uint8Array {
  return frame(errorMeta(err), new Uint8Array(0));
}

/**
 * The runner's answer, or throws the runner error it reported. A streamed
 * answer's head comes with `creditTo`, for the StreamReceiver of its body.
 */
export async function decodeReply(
  transfer: BodyTransfer,
  data: Uint8Array,
): Promise<InvokeResponse & { creditTo?: string }> {
  const { meta: raw, body } = unframe<unknown>(data);
  const meta = checkReplyMeta(raw);
  if ("error" in meta) throw runnerError(meta);
  return {
    status: meta.status,
    // Whatever a runner sent, a caller gets only the app's headers that callers get.
    headers: callerHeaders(meta.headers),
    runTimeMs: meta.run_time_ms,
    replicaId: meta.replica_id,
    body: await transfer.receive(body, meta.body_object),
    ...(meta.stream ? { creditTo: meta.stream.credit_to } : {}),
  };
}

export function runnerError(meta: ErrorMeta): Error {
  switch (meta.error) {
    case "Overloaded":
      return new Overloaded(meta.message, meta.retry_after ?? 1);
    case "RunTimeout":
      return new RunTimeout(meta.seconds ?? 0);
    case "Cancelled":
      return new Cancelled();
    case "ReplicaCrashed":
      return new ReplicaCrashed(meta.message);
    case "FunctionNotFound":
      return new FunctionNotFound(meta.app ?? "", meta.function ?? "");
    case "AppNotFound": {
      const [p = "", a = ""] = (meta.app ?? "").split("/");
      return new AppNotFound(p, a);
    }
    default:
      return new StartFailed(meta.message);
  }
}
