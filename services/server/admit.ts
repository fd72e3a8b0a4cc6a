// Calls judged before their body is read. Connect parses a request's body
// before any interceptor runs, and the REST transcoder reads it before it
// calls the handler: without this, a caller with no valid token had up to a
// method's body limit (DeployApp's: SKIFF_MAX_BUNDLE_BYTES) buffered and
// parsed for it before its 401. So the server asks `admit` first, for every
// RPC path a service here has (server.ts) and every REST route (the
// transcoder), and a refusal goes out at once in the caller's protocol; the
// body is dropped as it comes (up to a bound, then the connection closes),
// never kept.
import http2 from "node:http2";
import { Code, ConnectError } from "@connectrpc/connect";
import type { ConnectNodeAdapterOptions } from "@connectrpc/connect-node";
import { grpcTrailersOnly, isGrpcRequest } from "./grpc-status.js";
import { discardRequest } from "./rest/body.js";
import { codeHttpStatus, codeString, errorBody } from "./rest/errors.js";

/** A request and its answer as the server hands them on (HTTP/1.1 or HTTP/2). */
type NodeHandler = NonNullable<ConnectNodeAdapterOptions["fallback"]>;
type NodeRequest = Parameters<NodeHandler>[0];
type NodeResponse = Parameters<NodeHandler>[1];

/** Who a call was admitted for: a project's token (its project), or the admin's (no project). */
export interface Admitted {
  readonly kind: string;
  readonly projectId?: string;
}

/** Whom the call was admitted for (its body is read, and it is judged in full then); undefined for an open service; else its refusal. */
export type AdmitVerdict = ConnectError | Admitted | undefined;

/**
 * Judges a call of `service` (its protobuf type name) by its Authorization
 * header alone, before its body is read; answers at once (no promise) where
 * it can, as for a token seen before.
 */
export type Admit = (service: string, authorization: string | undefined) => AdmitVerdict | Promise<AdmitVerdict>;

/** Large bodies read at once: in all on this server, and for one project's tokens. */
export interface UploadLimits {
  maxUploads: number;
  maxProjectUploads: number;
  /** How long a body in a slot may take to arrive: graceMs and its size at bytesPerSecond (default 30 s, 256 KiB/s). */
  graceMs?: number;
  bytesPerSecond?: number;
}

const UPLOAD_BYTES_PER_SECOND = 256 * 1024;
const UPLOAD_GRACE_MS = 30_000;

/**
 * The slots of large bodies. A method whose body may be larger than
 * SKIFF_MAX_BODY_BYTES (DeployApp's app bundle, up to
 * SKIFF_MAX_BUNDLE_BYTES) has its body read whole before its handler runs,
 * by Connect and REST alike, and parsing it takes a few times its size: 16
 * bundles of 90 MB sent at once with one project's token held 3.6 GB of the
 * server's memory. So such a body (declared larger than SKIFF_MAX_BODY_BYTES,
 * of unknown length, or compressed: Connect and gRPC inflate a message up to
 * the method's limit) is read only in a slot: `maxUploads` in all,
 * `maxProjectUploads` for one project's tokens (the admin's count in all
 * only). A call past either is refused before its body is read (429
 * `resource_exhausted`, Retry-After). A slot is held until the handler ends
 * its answer or the call ends; a body not arrived whole within 30 s and its
 * size at 256 KiB/s ends its call (its HTTP/2 stream, or its HTTP/1.1
 * connection), so that a dribbling upload cannot keep a slot.
 */
export class UploadSlots {
  private inAll = 0;
  private readonly byProject = new Map<string, number>();

  constructor(
    private readonly limits: UploadLimits,
    private readonly maxBodyBytes: number,
  ) {}

  /** Uploads under way, in all and for a project. */
  underWay(projectId?: string): number {
    return projectId === undefined ? this.inAll : (this.byProject.get(projectId) ?? 0);
  }

  /** Takes a slot for the call's body if it needs one (see the class), until the handler ends its answer or the call ends; else the refusal. */
  take(req: NodeRequest, res: NodeResponse, admitted: Admitted | undefined, limit: number): ConnectError | undefined {
    const declared = req.headers["content-length"];
    const size = declared === undefined ? limit : Math.min(Number(declared), limit);
    // A compressed message is inflated up to the method's limit, whatever it declares.
    if (declared !== undefined && size <= this.maxBodyBytes && !compressed(req)) return undefined;
    const carrier = "stream" in req ? req.stream : req.socket;
    // A caller gone while its token was judged: nothing is read, and no "close" would come to give a slot back.
    if (req.destroyed || res.destroyed || carrier.destroyed) return undefined;
    const project = admitted?.projectId;
    if (this.inAll >= this.limits.maxUploads)
      return busy(`${this.limits.maxUploads} uploads are under way on this server (SKIFF_MAX_UPLOADS)`);
    if (project !== undefined && this.underWay(project) >= this.limits.maxProjectUploads)
      return busy(`${this.limits.maxProjectUploads} uploads of this project are under way (SKIFF_MAX_PROJECT_UPLOADS)`);
    this.inAll++;
    if (project !== undefined) this.byProject.set(project, this.underWay(project) + 1);
    const { graceMs = UPLOAD_GRACE_MS, bytesPerSecond = UPLOAD_BYTES_PER_SECOND } = this.limits;
    const deadline = setTimeout(tooSlow, graceMs + (size / bytesPerSecond) * 1000, req);
    req.once("end", () => clearTimeout(deadline));
    // What ends the call's hold on the body: its connection (HTTP/1.1) or stream (HTTP/2) closing (a pipelined
    // request's answer, which never got the socket, says nothing when the connection goes), its answer closing,
    // or the handler ending its answer (a caller that then reads nothing, an HTTP/2 window kept at 0, holds
    // only the answer).
    let held = true;
    const release = () => {
      if (!held) return;
      held = false;
      clearTimeout(deadline);
      carrier.off("close", release);
      this.inAll--;
      if (project === undefined) return;
      const left = this.underWay(project) - 1;
      if (left > 0) this.byProject.set(project, left);
      else this.byProject.delete(project);
    };
    carrier.once("close", release);
    res.once("close", release);
    const end = res.end as (...args: unknown[]) => NodeResponse;
    (res as { end: unknown }).end = function (this: NodeResponse, ...args: unknown[]) {
      release();
      return end.apply(this, args);
    };
    return undefined;
  }
}

/** Whether a call's message comes compressed (Connect's Content-Encoding, a stream's, gRPC's): it may inflate to the method's limit. */
function compressed(req: NodeRequest): boolean {
  const h = req.headers;
  for (const name of ["content-encoding", "connect-content-encoding", "grpc-encoding"]) {
    const value = h[name];
    if (value !== undefined && String(value).trim().toLowerCase() !== "identity") return true;
  }
  return false;
}

const busy = (why: string) =>
  new ConnectError(`${why}; try again shortly`, Code.ResourceExhausted, { "retry-after": "1" });

/** An upload whose body did not come in time: its call ends (its HTTP/2 stream, or its connection), and its slot. */
function tooSlow(req: NodeRequest): void {
  if ("stream" in req) req.stream.close(http2.constants.NGHTTP2_CANCEL);
  else req.socket.destroy();
}

/**
 * The refusal of a call before its body is read, or undefined when it goes
 * on: its token's verdict, then (for a method with a body `limit` above
 * SKIFF_MAX_BODY_BYTES) an upload's slot.
 */
export function refusalOf(
  verdict: AdmitVerdict,
  req: NodeRequest,
  res: NodeResponse,
  uploads: UploadSlots | undefined,
  limit: number | undefined,
): ConnectError | undefined {
  if (verdict instanceof ConnectError) return verdict;
  return uploads === undefined || limit === undefined ? undefined : uploads.take(req, res, verdict, limit);
}

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
  if (isGrpcRequest(req)) return "grpc";
  const type = (req.headers["content-type"] ?? "").toLowerCase();
  if (/^application\/connect\+(json|proto)\s*(;|$)/.test(type)) return "connect-stream";
  if (/^application\/(json|proto)\s*(;|$)/.test(type) || (req.method === "GET" && type === "")) return "connect-unary";
  return undefined;
}

/**
 * Answers an RPC path's call with `refusal` in its protocol and drops the
 * rest of its body; false when the call speaks no protocol of an RPC (left
 * to the adapter).
 */
export function answerRefusal(req: NodeRequest, res: NodeResponse, refusal: ConnectError): boolean {
  const protocol = protocolOf(req);
  if (protocol === undefined) return false;
  const headers: Record<string, string> = {};
  refusal.metadata.forEach((value, name) => (headers[name] = value));
  if (protocol === "grpc") {
    grpcTrailersOnly(req, res, refusal.code, refusal.rawMessage, headers);
    discardRequest(req);
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
  // The rest of the body is dropped as it comes, as after any answer given before the body was read.
  discardRequest(req);
  return true;
}
