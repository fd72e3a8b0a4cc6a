// The bytes of every message between a gateway and a runner, and of the
// async queue's messages: binary headers and the payload as it is (no base64).
//
// A run frame (a request, a reply, an async run's queue message): a 4-byte
// big-endian length, that many bytes of JSON metadata, then the body. A body
// too large for the server's max_payload travels through the object store
// (BodyTransfer): the frame names the object instead.
//
// A stream frame (byte-stream.ts): kind (1 byte), sequence number (4 bytes,
// big-endian), then the payload.
import { callerHeaders } from "../server/index.js";
import {
  AppNotFound,
  Cancelled,
  FunctionNotFound,
  InvalidArguments,
  Overloaded,
  ReplicaCrashed,
  RequestBodyFailed,
  RunnerError,
  RunTimeout,
  StartFailed,
  type BodyTransfer,
  type InvokeRequest,
  type InvokeResponse,
  type RunRecord,
  type StreamEnd,
} from "../runs/index.js";

export interface RequestMeta {
  run_id: string;
  method: string;
  path: string;
  query: string;
  headers: Record<string, string>;
  body_object?: string;
  /** An async run's `queued` record: the queue message is the record until a runner writes the next one. */
  record?: RunRecord;
  /** The byte stream the gateway opened for this run (`skiff.stream.{id}.*`). */
  stream?: string;
  /** The gateway takes a streamed answer: its body comes back on the stream. */
  accept_stream?: boolean;
  /** The body follows on the stream (the frame's own body is empty then), with the caller's Content-Length if it gave one. */
  body_follows?: { length?: number };
}

/** A runner error, as an error reply (or a stream's ABORT) carries it. */
interface ErrorMeta {
  error: string;
  message: string;
  retry_after?: number;
  seconds?: number;
  app?: string;
  function?: string;
  /** RequestBodyFailed: why the caller's body broke. */
  reason?: string;
}

interface AnswerMeta {
  status: number;
  headers: Record<string, string | string[]>;
  run_time_ms: number;
  replica_id: string;
  body_object?: string;
  /** The answer streams: its body follows on the request's stream, and the frame's body is empty. */
  streams?: boolean;
  /** A WebSocket handshake the app accepted: the frame's body is what the app sent after its 101, and the connection's bytes travel on the stream. */
  upgraded?: boolean;
}

type ReplyMeta = AnswerMeta | ErrorMeta;

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

function unframe<T>(data: Uint8Array): { meta: T; body: Uint8Array } {
  if (data.byteLength < 4) throw new MalformedFrame("shorter than its length field");
  const metaLength = new DataView(data.buffer, data.byteOffset, data.byteLength).getUint32(0);
  if (4 + metaLength > data.byteLength) throw new MalformedFrame("truncated");
  let meta: T;
  try {
    meta = JSON.parse(decoder.decode(data.subarray(4, 4 + metaLength))) as T;
  } catch {
    throw new MalformedFrame("the metadata is not JSON");
  }
  return { meta, body: data.subarray(4 + metaLength) };
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
/** A stream id becomes a subject token: letters and digits only. */
const STREAM_ID = /^[A-Za-z0-9]{1,64}$/;

function strings(meta: Fields, required: readonly string[], optional: readonly string[] = []): void {
  for (const k of required) if (typeof meta[k] !== "string") throw new MalformedFrame(`${k} is not a string`);
  for (const k of optional)
    if (meta[k] !== undefined && typeof meta[k] !== "string") throw new MalformedFrame(`${k} is not a string`);
}

function flags(meta: Fields, names: readonly string[]): void {
  for (const k of names)
    if (meta[k] !== undefined && typeof meta[k] !== "boolean") throw new MalformedFrame(`${k} is not a boolean`);
}

function headerMap(v: unknown, lists: boolean): void {
  if (!isObject(v)) throw new MalformedFrame("headers is not an object");
  for (const value of Object.values(v))
    if (typeof value !== "string" && !(lists && Array.isArray(value) && value.every((x) => typeof x === "string")))
      throw new MalformedFrame("a header value is not a string");
}

/** An error reply's (or an ABORT's) metadata, checked. */
function checkErrorMeta(meta: unknown): ErrorMeta {
  if (!isObject(meta)) throw new MalformedFrame("the error is not an object");
  strings(meta, ["error", "message"], ["app", "function", "reason"]);
  for (const k of ["retry_after", "seconds"])
    if (meta[k] !== undefined && !isCount(meta[k])) throw new MalformedFrame(`${k} is not a number`);
  return meta as unknown as ErrorMeta;
}

function checkRequestMeta(meta: unknown): RequestMeta {
  if (!isObject(meta)) throw new MalformedFrame("the metadata is not an object");
  strings(meta, ["run_id", "method", "path", "query"], ["body_object", "stream"]);
  headerMap(meta.headers, false);
  flags(meta, ["accept_stream"]);
  if (meta.record !== undefined && !isObject(meta.record)) throw new MalformedFrame("record is not an object");
  if (meta.stream !== undefined && !STREAM_ID.test(meta.stream as string))
    throw new MalformedFrame("stream is not a stream id");
  const b = meta.body_follows;
  if (b !== undefined && !(isObject(b) && (b.length === undefined || isCount(b.length))))
    throw new MalformedFrame("body_follows has a length that is not a count");
  if ((b !== undefined || meta.accept_stream === true) && meta.stream === undefined)
    throw new MalformedFrame("a body or answer that streams, and no stream");
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
  flags(meta, ["streams", "upgraded"]);
  return meta as unknown as ReplyMeta;
}

/** How the request's body and answer travel besides the frame. */
interface RequestStreams {
  /** An async run's `queued` record. */
  record?: RunRecord;
  /** The id of the byte stream the gateway opened. */
  stream?: string;
  acceptStream?: boolean;
  /** The body follows on the stream, of this Content-Length when known. */
  bodyFollows?: { length?: number };
}

/** A request frame, its body put in the object store when too large for one. */
export async function encodeRequest(
  transfer: BodyTransfer,
  req: Pick<InvokeRequest, "runId" | "method" | "path" | "query" | "headers" | "body">,
  { record, stream, acceptStream, bodyFollows }: RequestStreams = {},
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
    ...(stream ? { stream } : {}),
    ...(acceptStream ? { accept_stream: true } : {}),
    ...(bodyFollows ? { body_follows: bodyFollows } : {}),
  };
  return { data: frame(meta, body), object };
}

/** The request a frame carries; with `keepObject` a stored body stays (an async message may be delivered again). */
export async function decodeRequest(
  transfer: BodyTransfer,
  data: Uint8Array,
  keepObject = false,
): Promise<InvokeRequest> {
  return (await decodeRequestFrame(transfer, data, keepObject)).req;
}

/** decodeRequest() with the frame's metadata as well (its record, its body's object, its stream), read once. */
export async function decodeRequestFrame(
  transfer: BodyTransfer,
  data: Uint8Array,
  keepObject = false,
): Promise<{ meta: RequestMeta; req: InvokeRequest }> {
  const { meta: raw, body } = unframe<unknown>(data);
  const meta = checkRequestMeta(raw);
  const full = await transfer.receive(body, meta.body_object, keepObject);
  const req: InvokeRequest = {
    runId: meta.run_id,
    method: meta.method,
    path: meta.path,
    query: meta.query,
    headers: meta.headers,
    body: full,
    ...(meta.accept_stream ? { acceptStream: true } : {}),
  };
  return { meta, req };
}

/** A request frame's metadata: the run id, and the object holding its body, if any (to remove once the run is final). */
export function requestMeta(data: Uint8Array): RequestMeta {
  return checkRequestMeta(unframe<unknown>(data).meta);
}

/** An answer's reply frame: whole, or the head of one whose body follows on the stream (`streams`). */
export async function encodeReply(
  transfer: BodyTransfer,
  runId: string,
  res: InvokeResponse,
  streams = false,
): Promise<Uint8Array> {
  const { body, object } = await transfer.send(`${runId}.reply`, res.body);
  return frame(
    {
      status: res.status,
      headers: res.headers,
      run_time_ms: res.runTimeMs,
      replica_id: res.replicaId,
      ...(object ? { body_object: object } : {}),
      ...(streams ? { streams: true } : {}),
    } satisfies AnswerMeta,
    body,
  );
}

/** The answer to a WebSocket handshake: the app's 101 (`upgraded`, with the bytes it sent after it) or its refusal. */
export function encodeUpgradeReply(answer: {
  upgraded: boolean;
  status: number;
  headers: Record<string, string | string[]>;
  body: Uint8Array;
  replicaId: string;
}): Uint8Array {
  const meta: AnswerMeta = {
    status: answer.status,
    headers: answer.headers,
    run_time_ms: 0,
    replica_id: answer.replicaId,
    ...(answer.upgraded ? { upgraded: true } : {}),
  };
  return frame(meta, answer.body);
}

/** A runner error as an error reply (or an ABORT) carries it. */
function errorMeta(err: RunnerError | RequestBodyFailed): ErrorMeta {
  const meta: ErrorMeta = { error: err.name, message: err.message };
  if (err instanceof Overloaded) meta.retry_after = err.retryAfterSeconds;
  if (err instanceof RunTimeout) meta.seconds = err.seconds;
  if (err instanceof AppNotFound) meta.app = `${err.projectId}/${err.appName}`;
  if (err instanceof FunctionNotFound) [meta.app, meta.function] = [err.appName, err.functionName];
  if (err instanceof RequestBodyFailed) meta.reason = err.reason;
  return meta;
}

export function encodeError(err: RunnerError | RequestBodyFailed): Uint8Array {
  return encoder.encode(JSON.stringify(errorMeta(err)));
}

/** An ABORT's reason as the error it names; an unreadable one is taken as `fallback`. */
export function decodeError(data: Uint8Array, fallback: () => Error): Error {
  try {
    return runnerError(checkErrorMeta(JSON.parse(decoder.decode(data))));
  } catch {
    return fallback();
  }
}

export function encodeErrorReply(err: RunnerError): Uint8Array {
  return frame(errorMeta(err), new Uint8Array(0));
}

/** The runner's answer (with `streams` or `upgraded` when it says so), or throws the runner error it reported. */
export async function decodeReply(
  transfer: BodyTransfer,
  data: Uint8Array,
): Promise<InvokeResponse & { streams?: boolean; upgraded?: boolean }> {
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
    ...(meta.streams ? { streams: true } : {}),
    ...(meta.upgraded ? { upgraded: true } : {}),
  };
}

function runnerError(meta: ErrorMeta): Error {
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
    case "InvalidArguments":
      return new InvalidArguments(meta.message);
    case "AppNotFound": {
      const [p = "", a = ""] = (meta.app ?? "").split("/");
      return new AppNotFound(p, a);
    }
    case "RequestBodyFailed":
      return new RequestBodyFailed(meta.message, meta.reason === "gone" ? "gone" : "too_large");
    default:
      return new StartFailed(meta.message);
  }
}

/** How a streamed answer ended, as the END of its stream says it. */
export function encodeStreamEnd(end: StreamEnd): Uint8Array {
  return encoder.encode(JSON.stringify({ run_time_ms: end.runTimeMs, ...(end.error ? { error: end.error } : {}) }));
}

/** A streamed answer's end from its stream's END, or throws when it is not one. */
export function decodeStreamEnd(data: Uint8Array | undefined): StreamEnd {
  const m = data === undefined || data.byteLength === 0 ? undefined : (JSON.parse(decoder.decode(data)) as unknown);
  if (!isObject(m) || !isCount(m.run_time_ms)) throw new MalformedFrame("the answer's end has no run_time_ms");
  const e = m.error;
  if (e !== undefined && !(isObject(e) && typeof e.type === "string" && typeof e.message === "string"))
    throw new MalformedFrame("the answer's end has a malformed error");
  return {
    runTimeMs: m.run_time_ms,
    ...(e ? { error: { type: e.type as string, message: e.message as string } } : {}),
  };
}

/** The kinds of stream frame (byte-stream.ts). */
export enum StreamKind {
  Data = 1,
  Credit = 2,
  End = 3,
  Abort = 4,
  Ping = 5,
}

const STREAM_HEADER_BYTES = 5;

export function encodeStreamFrame(kind: StreamKind, seq: number, payload?: Uint8Array): Uint8Array {
  const out = new Uint8Array(STREAM_HEADER_BYTES + (payload?.byteLength ?? 0));
  out[0] = kind;
  new DataView(out.buffer).setUint32(1, seq >>> 0);
  if (payload) out.set(payload, STREAM_HEADER_BYTES);
  return out;
}

/** A stream frame, or throws when it is not one. */
export function decodeStreamFrame(data: Uint8Array): { kind: StreamKind; seq: number; payload: Uint8Array } {
  if (data.byteLength < STREAM_HEADER_BYTES || data[0] < StreamKind.Data || data[0] > StreamKind.Ping)
    throw new Error("not a stream frame");
  return {
    kind: data[0] as StreamKind,
    seq: new DataView(data.buffer, data.byteOffset, data.byteLength).getUint32(1),
    payload: data.subarray(STREAM_HEADER_BYTES),
  };
}
