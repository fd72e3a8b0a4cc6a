// The generic HTTP/JSON transcoder: serves every google.api.http rule of the
// given services by calling the method's implementation in-process, through
// the router's interceptors and with a handler context as Connect makes one,
// with no protobuf encoding in between: the request message it builds is the
// one the handler gets, and the handler's message is what it writes (an
// HttpBody's bytes pass through as they are). Interceptors, handler context
// and error mapping are those of a Connect call; the transcoder only maps
// HTTP to a request message and a response message (or error) back to HTTP.
//
// Mapping, after google/api/http.proto:
//   - path variables set the fields they name (percent-decoded). A variable
//     that ends the path with `**` ({path=**}) is reserved expansion, as
//     RFC 6570's {+path}: "/" separates segments whether it comes as is or
//     as %2F, which is how a generated OpenAPI client writes every "/" of a
//     value (its path parameters are encoded whole);
//   - query parameters set the fields that neither the path nor the body
//     binds, by proto name or JSON name, nested with dots, repeated by
//     repeating the key. Unknown parameters are ignored on purpose: the
//     handler sees the full query in HttpExchange.query, and a Custom app
//     behind `/v4/...` gets its own parameters through it;
//   - body "*": the JSON body (empty = `{}`) sets every other field, unknown
//     JSON fields are an error; body "<field>": the JSON body is that field,
//     or, for a google.api.HttpBody field, the raw bytes and their
//     Content-Type; no body rule: a body is read (under the size limit) and
//     ignored. Path variables win over a body that sets the same field. A
//     method named in `streamedBodies` gets a large HttpBody body unread,
//     to read as it comes (HttpExchange.requestBody).
//   - the response is JSON with proto field names and implicit fields
//     emitted, or only its `response_body` field; an HttpBody is written
//     raw with its content type. The status is the one the handler chose
//     with setHttpStatus() (http-exchange.ts), else 200. An answer to HEAD
//     is its head alone.
//   - CORS, for the methods named in `cors`: the handler's side says which
//     origins the resource the path names allows (an app's allow-list);
//     with a list, the transcoder answers preflights itself (before any
//     interceptor: a browser's preflight carries no credentials) and marks
//     the answers to allowed origins, errors included. Without one, nothing
//     is added and OPTIONS goes to the handler like any method. A request
//     without an Origin header is no CORS request and is left alone.
//
// Errors are `{"code", "message"}` with the status of the Connect code;
// the transcoder's own are 404 not_found (no route), 405 unimplemented with
// an Allow header (the path exists, not with this method; a handler's
// unimplemented error that carries an Allow header is answered 405 too), 400
// invalid_argument (bad parameter, malformed JSON), 413 resource_exhausted
// (body too large) and 415 invalid_argument (a JSON body that is not JSON).
import {
  create,
  fromJson,
  isMessage,
  ScalarType,
  toJson,
  type DescField,
  type DescMessage,
  type DescMethod,
  type DescMethodUnary,
  type DescService,
  type JsonValue,
  type Message,
} from "@bufbuild/protobuf";
import { reflect, type ReflectMessage } from "@bufbuild/protobuf/reflect";
import {
  Code,
  ConnectError,
  createContextKey,
  createContextValues,
  type ContextValues,
  type HandlerContext,
  type Interceptor,
  type MethodImplSpec,
  type UnaryRequest,
  type UnaryResponse,
} from "@connectrpc/connect";
import type { ConnectNodeAdapterOptions } from "@connectrpc/connect-node";
import type { HttpBody } from "../../../gen/google/api/httpbody_pb.js";
import { hostMakesUrl, isRpcExchangeResponseHeader } from "../headers.js";
import { requestHeaderView } from "./request-headers.js";
import { kHttpExchange, LightSignal, type CallSignal, type HttpExchange, type StreamedBody } from "./http-exchange.js";
import { httpBindings, resolveFieldPath, type HttpBinding, type Variable } from "./http-rules.js";
import type { Logger } from "../../config/index.js";
import { refusalOf, type Admit, type UploadSlots } from "../admit.js";
import {
  ClientGoneError,
  closedEarly,
  discardRequest,
  PendingBody,
  readBody,
  streamsBody,
  type NodeRequest,
  type NodeResponse,
} from "./body.js";
import { codeString, errorBody, invalidArgument, malformedJson, notAnObject, TranscodeError } from "./errors.js";
import { jsonDecodeError } from "../json-errors.js";
import { resolveDotted, setFromText } from "./fields.js";
import { rawVariableValue, RouteTable, variableValue, type RouteMatch } from "./routes.js";

export interface TranscoderOptions {
  /** Services whose google.api.http rules become REST routes. */
  services: readonly DescService[];
  /**
   * The implementation of every bound method, as registered on the Connect
   * router: REST calls them in-process, with no protobuf encoding between.
   */
  implementations: ReadonlyMap<DescMethod, MethodImplSpec>;
  /** The Connect router's interceptors: a REST call passes through them as a Connect call does. */
  interceptors?: readonly Interceptor[];
  /** Aborts the calls under way when the server stops. */
  shutdownSignal?: AbortSignal;
  /** Largest request body accepted (SKIFF_MAX_BODY_BYTES); 413 above it. */
  maxBodyBytes: number;
  /** Methods that take larger bodies than maxBodyBytes (an app bundle), by method. */
  bodyLimits?: ReadonlyMap<DescMethod, number>;
  /**
   * Methods with an HttpBody body whose handler may read it as it comes
   * (HttpExchange.requestBody) when it is larger than `above` bytes or of
   * unknown length, instead of finding it whole in the request message.
   */
  streamedBodies?: { methods: ReadonlySet<DescMethod>; above: number };
  /**
   * Methods whose every REST answer, refusals included (401, 403, 413, …),
   * carries `X-Request-Id`: the id is made as soon as the route is known and
   * handed to the handler as `httpExchange(ctx).requestId`.
   */
  requestIds?: RequestIds;
  /** CORS for the resources of some methods (see Cors). */
  cors?: Cors;
  /** Judges a call by its headers before its body is read (see admit.ts); a refusal is the answer. */
  admit?: Admit;
  /** The slots of bodies above maxBodyBytes (see admit.ts). */
  uploads?: UploadSlots;
  logger: Logger;
}

/**
 * CORS as the resource a REST path names allows it. `origins` gets the
 * request message with only its path variables set and answers the
 * origins allowed ("*" for any), or undefined to leave CORS to the handler
 * (which then gets OPTIONS requests as any other).
 */
export interface Cors {
  methods: ReadonlySet<DescMethod>;
  origins(pathOnly: Message): readonly string[] | undefined;
}

/** How long a browser may keep a preflight's answer, in seconds. */
const PREFLIGHT_MAX_AGE = "600";

/** The methods whose REST answers carry `X-Request-Id`, and what makes the ids (the run id's maker: one id for both). */
export interface RequestIds {
  methods: ReadonlySet<DescMethod>;
  make(): string;
}

const HTTP_BODY = "google.api.HttpBody";
const JSON_WRITE = { useProtoFieldName: true, alwaysEmitImplicit: true } as const;

type BodyMode = "none" | "json-all" | "raw-all" | "json-field" | "raw-field";

interface Route {
  binding: HttpBinding;
  /** "METHOD template", as metrics name the route. */
  label: string;
  impl: MethodImplSpec;
  body: BodyMode;
  bodyField: DescField | undefined;
  /**
   * Path variables and the fields they set; `property`: the message's property a variable sets as it is
   * (a string field at the top, outside any oneof), with no reflection.
   */
  variables: { variable: Variable; path: DescField[]; property: string | undefined }[];
  /** Proto names of fields bound by the path or the body: query parameters never set them. */
  bound: string[][];
  /** The method's implementation behind the interceptors, put together once (see RestCall). */
  call: (req: UnaryRequest) => Promise<UnaryResponse>;
}

/**
 * The type of connectNodeAdapter's `fallback`: a request listener for both
 * node:http and node:http2 (connect-node only reconciles the two write()
 * signatures of their response types).
 */
export type NodeHandler = NonNullable<ConnectNodeAdapterOptions["fallback"]>;

/** The REST route each answered response belonged to, for request metrics. */
const restRoutes = new WeakMap<object, string>();

/** The REST route (`POST /v4/{project_id}/{app_name}/{path=**}`) a response answered, if it matched one. */
export function restRouteOf(res: object): string | undefined {
  return restRoutes.get(res);
}

export function createTranscoder(opts: TranscoderOptions): NodeHandler {
  const table = new RouteTable(compileRoutes(opts.services, opts.implementations, opts.interceptors ?? []));
  const live = new LiveCalls(opts.shutdownSignal);
  return (req, nodeRes) => {
    const res = nodeRes as NodeResponse;
    // An aborted request emits "error"; without a listener that would be an uncaught exception.
    req.on("error", ignore);
    transcode(req, res, table, opts, live).catch((e: unknown) => answerError(req, res, e, opts));
  };
}

function ignore(): void {}

/**
 * The calls under way, which the server's shutdown aborts: one listener on
 * the shutdown signal for all of them, not one per call (an EventTarget's
 * listener costs more than the call's other bookkeeping).
 */
class LiveCalls {
  private readonly calls = new Set<RestExchange>();

  constructor(private readonly shutdown: AbortSignal | undefined) {
    shutdown?.addEventListener("abort", () => {
      for (const exchange of this.calls) exchange.abort(shutdown.reason);
    });
  }

  add(exchange: RestExchange): void {
    if (this.shutdown?.aborted) exchange.abort(this.shutdown.reason);
    else this.calls.add(exchange);
  }

  delete(exchange: RestExchange): void {
    this.calls.delete(exchange);
  }
}

function compileRoutes(
  services: readonly DescService[],
  implementations: ReadonlyMap<DescMethod, MethodImplSpec>,
  interceptors: readonly Interceptor[],
): Route[] {
  return httpBindings(services).map((binding) => {
    const impl = implementations.get(binding.method);
    if (impl?.kind !== "unary")
      throw new Error(
        `no implementation of ${binding.service.typeName}.${binding.method.name}: register the service on the router`,
      );
    const input = binding.method.input;
    const bodyField =
      binding.body === "" || binding.body === "*" ? undefined : input.fields.find((f) => f.name === binding.body);
    const variables = binding.template.variables.map((variable) => {
      const path = protoPath(input, variable.fieldPath);
      const field = path[0];
      const plain =
        path.length === 1 && field.fieldKind === "scalar" && field.scalar === ScalarType.STRING && !field.oneof;
      return { variable, path, property: plain ? field.localName : undefined };
    });
    const bound = binding.template.variables.map((v) => v.fieldPath);
    if (bodyField) bound.push([bodyField.name]);
    const label = `${binding.httpMethod} ${binding.template.source}`;
    const call = interceptors.reduceRight(
      (next, interceptor) => interceptor(next as Parameters<Interceptor>[0]),
      handlerCall(impl) as Parameters<Interceptor>[0],
    ) as Route["call"];
    return { binding, impl, label, body: bodyMode(binding, bodyField), bodyField, variables, bound, call };
  });
}

/**
 * The innermost step of a REST call's chain of interceptors: the method's
 * implementation, given the call as its handler context. An interceptor that
 * passed on a request of its own (a copy with another message) gets a
 * context merged from it, as Connect merges one.
 */
function handlerCall(impl: Extract<MethodImplSpec, { kind: "unary" }>) {
  const method = impl.method;
  return async (req: UnaryRequest): Promise<UnaryResponse> => {
    const call = req instanceof RestCall ? req : req.contextValues.get(kRestCall)!;
    const ctx: HandlerContext = req === call ? call : call.mergedWith(req);
    const out = await impl.impl(req.message, ctx);
    const message = isMessage(out, method.output) ? out : create(method.output, out);
    return new RestResponse(call, message);
  };
}

function bodyMode(binding: HttpBinding, bodyField: DescField | undefined): BodyMode {
  if (binding.body === "") return "none";
  if (binding.body === "*") return binding.method.input.typeName === HTTP_BODY ? "raw-all" : "json-all";
  return bodyField?.fieldKind === "message" && bodyField.message.typeName === HTTP_BODY ? "raw-field" : "json-field";
}

function protoPath(message: DescMessage, names: readonly string[]): DescField[] {
  const path = resolveFieldPath(message, names);
  if (!path) throw new Error(`${message.typeName} has no field ${names.join(".")}`);
  return path;
}

async function transcode(
  req: NodeRequest,
  res: NodeResponse,
  table: RouteTable<Route>,
  opts: TranscoderOptions,
  live: LiveCalls,
): Promise<void> {
  const url = req.url ?? "";
  const q = url.indexOf("?");
  const path = q < 0 ? url : url.slice(0, q);
  const query = new URLSearchParams(q < 0 ? "" : url.slice(q + 1));
  const method = req.method ?? "";
  const match = pickRoute(table.match(path), method, path);
  restRoutes.set(res, match.route.label);
  const requestId = opts.requestIds?.methods.has(match.route.binding.method) ? opts.requestIds.make() : undefined;
  // Set before anything can fail: an error answer's headers are merged with it.
  if (requestId !== undefined) res.setHeader("x-request-id", requestId);
  const route = match.route;
  // Only a request with an Origin (a browser's) is a CORS request: the others cost no lookup.
  const cors =
    req.headers.origin !== undefined && opts.cors?.methods.has(route.binding.method)
      ? applyCors(req, res, match, table, path, opts.cors)
      : "none";
  if (cors === "answered") return;
  const limit = opts.bodyLimits?.get(route.binding.method) ?? opts.maxBodyBytes;
  if (opts.admit !== undefined) {
    const admitted = opts.admit(route.binding.method.parent.typeName, req.headers.authorization);
    const verdict = admitted instanceof Promise ? await admitted : admitted;
    const refusal = refusalOf(verdict, req, res, opts.uploads, limit > opts.maxBodyBytes ? limit : undefined);
    // Answered as the handler's refusal would be; the body is discarded as it comes (answerError).
    if (refusal !== undefined) throw handlerError(refusal, route, opts.logger, res);
  }
  const pending = streamedBody(req, route, limit, opts);
  const body = pending ? NO_BODY_BYTES : await readBody(req, limit);
  try {
    const input = requestMessage(route, match.segments, query, body, header(req, "content-type"));
    const exchange = new RestExchange(method, query, requestId, route, match.segments, pending);
    const output = await callMethod(req, res, route, input, exchange, opts, pending, live);
    const passed = exchange.responseHeaders;
    // Content-Type is the payload's (an HttpBody's own); CORS headers are skiff's where it answers CORS.
    if (passed)
      for (const name in passed) {
        if (name === "content-type" || (cors === "marked" && name.startsWith("access-control-"))) continue;
        if (cors === "marked" && name === "vary") res.setHeader("vary", `Origin, ${String(passed[name])}`);
        else res.setHeader(name, passed[name]);
      }
    const payload = responsePayload(route.binding, output);
    const head = method === "HEAD";
    if (exchange.stream) await writeStreamed(res, exchange.status ?? 200, payload.contentType, exchange.stream, head);
    else writeSuccess(res, exchange.status ?? 200, payload, head);
  } finally {
    pending?.finish();
  }
}

const NO_BODY_BYTES = new Uint8Array(0);

/**
 * A REST call's exchange, and its signal: one object whose methods are its
 * class's, so that a call makes no closures for it. The signal aborts when
 * the caller goes away before the answer ended, when the server shuts down,
 * or by abort(); it is the exchange itself (a LightSignal), because a real
 * AbortSignal costs several microseconds to make. One is made
 * (contextSignal) only for a handler that reads its context's signal.
 */
class RestExchange extends LightSignal implements HttpExchange {
  status: number | undefined = undefined;
  stream?: StreamedBody;
  responseHeaders?: Record<string, string | string[]>;
  private controller: AbortController | undefined = undefined;

  constructor(
    readonly method: string,
    readonly query: URLSearchParams,
    readonly requestId: string | undefined,
    private readonly route: Route,
    private readonly segments: readonly string[],
    readonly requestBody: PendingBody | undefined,
  ) {
    super();
  }

  get signal(): CallSignal {
    return this;
  }

  rawPathVariable(fieldPath: string): string | undefined {
    for (const { variable } of this.route.variables)
      if (variable.fieldPath.join(".") === fieldPath)
        return rawVariableValue(variable, expandSlashes(variable, this.segments));
    return undefined;
  }

  protected override aborting(reason: unknown): void {
    this.controller?.abort(reason);
  }

  /** An AbortSignal that follows this one, made the first time a handler reads its context's signal. */
  contextSignal(): AbortSignal {
    if (this.controller === undefined) {
      this.controller = new AbortController();
      if (this.aborted) this.controller.abort(this.reason);
    }
    return this.controller.signal;
  }
}

/** The exchange of the call a response answers, for the response's "close" listener. */
const kRestExchange = Symbol("skiff REST exchange");
type TrackedResponse = NodeResponse & { [kRestExchange]?: RestExchange };

/** A response closed: when its caller went away before the answer ended, its call's signal aborts. */
function onResponseClose(this: TrackedResponse): void {
  if (closedEarly(this)) this[kRestExchange]?.abort(new ClientGoneError("client closed the request"));
}

/** The body left for the handler to stream on (see TranscoderOptions.streamedBodies), or undefined to read it whole. */
function streamedBody(req: NodeRequest, route: Route, limit: number, opts: TranscoderOptions): PendingBody | undefined {
  const streamed = opts.streamedBodies;
  if (!streamed?.methods.has(route.binding.method) || (route.body !== "raw-all" && route.body !== "raw-field"))
    return undefined;
  return streamsBody(req, streamed.above) ? new PendingBody(req, limit) : undefined;
}

function pickRoute(matches: RouteMatch<Route>[], method: string, path: string): RouteMatch<Route> {
  const found = matches.find((m) => m.route.binding.httpMethod === method);
  if (found) return found;
  if (matches.length === 0) throw new TranscodeError(Code.NotFound, `no route for ${truncate(path)}`);
  const allow = [...new Set(matches.map((m) => m.route.binding.httpMethod))].join(", ");
  throw new TranscodeError(Code.Unimplemented, `method ${truncate(method)} not allowed; allowed: ${allow}`, {
    status: 405,
    headers: { allow },
  });
}

// --- CORS -------------------------------------------------------------------

/**
 * Applies the resource's CORS allow-list (see Cors): "answered" when this
 * was a preflight, now answered; "marked" when the answer is skiff's to mark
 * (a list is set); "none" when CORS is the handler's.
 */
function applyCors(
  req: NodeRequest,
  res: NodeResponse,
  match: RouteMatch<Route>,
  table: RouteTable<Route>,
  path: string,
  cors: Cors,
): "answered" | "marked" | "none" {
  const route = match.route;
  const pathOnly = create(route.binding.method.input);
  const r = reflect(route.binding.method.input, pathOnly);
  for (const { variable, path: fields } of route.variables)
    setFromText(r, fields, variableValue(variable, expandSlashes(variable, match.segments)), "path");
  const allowed = cors.origins(pathOnly);
  if (allowed === undefined) return "none";
  const origin = header(req, "origin") ?? "";
  const ok = allowed.includes("*") || allowed.includes(origin) ? origin : undefined;
  const preflight = req.method === "OPTIONS" && header(req, "access-control-request-method") !== undefined;
  if (preflight) {
    const headers: Record<string, string> = {
      vary: "Origin, Access-Control-Request-Method, Access-Control-Request-Headers",
    };
    if (ok !== undefined) {
      headers["access-control-allow-origin"] = ok;
      headers["access-control-allow-methods"] = [
        ...new Set(table.match(path).map((m) => m.route.binding.httpMethod)),
      ].join(", ");
      const asked = header(req, "access-control-request-headers");
      if (asked) headers["access-control-allow-headers"] = asked;
      headers["access-control-max-age"] = PREFLIGHT_MAX_AGE;
    }
    res.writeHead(204, headers);
    res.end();
    discardRequest(req);
    return "answered";
  }
  res.setHeader("vary", "Origin");
  if (ok !== undefined) {
    res.setHeader("access-control-allow-origin", ok);
    res.setHeader("access-control-expose-headers", "X-Request-Id");
  }
  return "marked";
}

// --- request ----------------------------------------------------------------

function requestMessage(
  route: Route,
  segments: readonly string[],
  query: URLSearchParams,
  body: Uint8Array,
  contentType: string | undefined,
): Message {
  const input = route.binding.method.input;
  const msg = bodyMessage(route, body, contentType);
  let r: ReflectMessage | undefined;
  if (route.body !== "json-all" && route.body !== "raw-all")
    for (const [key, value] of query) {
      r ??= reflect(input, msg);
      const path = resolveDotted(input, key);
      if (!path || isBound(route, path)) continue;
      setFromText(r, path, value, `query parameter "${truncate(key)}"`);
    }
  for (const { variable, path, property } of route.variables) {
    const value = variableValue(variable, expandSlashes(variable, segments));
    if (property !== undefined) (msg as unknown as Record<string, unknown>)[property] = value;
    else setFromText((r ??= reflect(input, msg)), path, value, `path variable "${variable.fieldPath.join(".")}"`);
  }
  return msg;
}

/**
 * The request's segments with each %2F of a `**` variable's (the path's end)
 * made a separator: such a variable is reserved expansion, and a generated
 * client writes its "/" as %2F. Other variables keep their segments.
 */
function expandSlashes(variable: Variable, segments: readonly string[]): readonly string[] {
  if (variable.length >= 0) return segments;
  let encoded = false;
  for (let i = variable.start; i < segments.length && !encoded; i++) encoded = segments[i].includes("%");
  if (!encoded) return segments;
  const tail = segments.slice(variable.start).flatMap((segment) => segment.split(/%2F/i));
  return [...segments.slice(0, variable.start), ...tail];
}

/** Whether a field path is, contains or lies inside a field bound by the path or the body. */
function isBound(route: Route, path: readonly DescField[]): boolean {
  return route.bound.some((b) => b.every((name, i) => i >= path.length || path[i].name === name));
}

function bodyMessage(route: Route, body: Uint8Array, contentType: string | undefined): Message {
  const input = route.binding.method.input;
  switch (route.body) {
    case "none":
      return create(input);
    case "raw-all":
      return httpBody(input, body, contentType);
    case "raw-field": {
      const msg = create(input);
      const field = route.bodyField!;
      // A message field outside a oneof is a plain property of its message (no reflection: a Map a message).
      if (field.fieldKind === "message" && !field.oneof)
        (msg as unknown as Record<string, unknown>)[field.localName] = httpBody(field.message, body, contentType);
      else if (field.fieldKind === "message")
        reflect(input, msg).set(field, reflect(field.message, httpBody(field.message, body, contentType)));
      return msg;
    }
    case "json-all": {
      const json = parseJson(body, contentType) ?? {};
      const wrong = notAnObject(json);
      if (wrong !== undefined) throw invalidArgument(wrong);
      return decodeJson(input, json);
    }
    case "json-field": {
      const json = parseJson(body, contentType);
      return json === undefined ? create(input) : decodeJson(input, { [route.bodyField!.jsonName]: json });
    }
  }
}

function httpBody(desc: DescMessage, data: Uint8Array, contentType: string | undefined): Message {
  const msg = create(desc) as unknown as HttpBody;
  msg.data = data;
  msg.contentType = contentType ?? "";
  return msg as unknown as Message;
}

const utf8 = new TextDecoder("utf-8", { fatal: true });

/** The JSON value of the body; undefined when empty. */
function parseJson(body: Uint8Array, contentType: string | undefined): JsonValue | undefined {
  if (body.length === 0) return undefined;
  if (contentType && !isJsonMediaType(contentType)) {
    throw new TranscodeError(
      Code.InvalidArgument,
      `unsupported media type ${JSON.stringify(truncate(contentType))}: the body must be JSON${
        /^application\/x-www-form-urlencoded\b/i.test(contentType)
          ? " (send Content-Type: application/json: curl -d sends this type unless told otherwise)"
          : ""
      }`,
      { status: 415 },
    );
  }
  try {
    return JSON.parse(utf8.decode(body)) as JsonValue;
  } catch (e) {
    throw invalidArgument(malformedJson(e));
  }
}

function isJsonMediaType(contentType: string): boolean {
  const type = contentType.split(";", 1)[0].trim().toLowerCase();
  return type === "application/json" || (type.startsWith("application/") && type.endsWith("+json"));
}

/** The message of a JSON body, unknown fields refused; an error names fields and kinds, never what the caller sent. */
function decodeJson(desc: DescMessage, json: JsonValue): Message {
  try {
    return fromJson(desc, json, { ignoreUnknownFields: false });
  } catch (e) {
    // REST's JSON names fields by their proto names: its errors do too.
    throw invalidArgument(jsonDecodeError(desc, json, false, e, "proto"));
  }
}

// --- the call ---------------------------------------------------------------

/**
 * Calls the method's implementation in-process, through the router's
 * interceptors, with a handler context as Connect makes one: no protobuf
 * encoding between REST and the handler. The context's response headers
 * (and an error's metadata) become the answer's headers.
 */
async function callMethod(
  req: NodeRequest,
  res: NodeResponse,
  route: Route,
  input: Message,
  exchange: RestExchange,
  opts: TranscoderOptions,
  pending: PendingBody | undefined,
  live: LiveCalls,
): Promise<Message> {
  const call = new RestCall(route, input, req, exchange);
  const tracked = res as TrackedResponse;
  tracked[kRestExchange] = exchange;
  res.on("close", onResponseClose);
  live.add(exchange);
  try {
    const answer = await route.call(call);
    copyResponseHeaders(answer instanceof RestResponse ? call.headersSet() : answer.header, res);
    return answer.message;
  } catch (e) {
    copyResponseHeaders(call.headersSet(), res);
    // A body that broke while the handler read it (too large, the caller gone) is the call's answer.
    throw pending?.failure ?? handlerError(e, route, opts.logger, res);
  } finally {
    res.off("close", onResponseClose);
    tracked[kRestExchange] = undefined;
    live.delete(exchange);
  }
}

const NO_TIMEOUT = () => undefined;

/** Where a REST call's context values hold the call (see handlerCall). */
const kRestCall = createContextKey<RestCall | undefined>(undefined, { description: "skiff REST call" });

/**
 * A REST call as the interceptors and the handler see it: its request
 * (UnaryRequest) and its handler context in one object, as Connect makes
 * them for a call without a deadline (REST has no timeout header), but with
 * no copies per call, and with what most calls never read made only when
 * read: the URL, the AbortSignal (the exchange's signal is what aborts it:
 * the caller gone before the handler returned, the server's shutdown,
 * HttpExchange.abort), the response headers and trailers. Unlike a Connect
 * call's, its signal is not aborted when the handler returns (nothing needs
 * it: a streamed answer that outlives the handler is cancelled through its
 * own body), so a call costs no abort event. The request headers are a view
 * of the ones Node read (request-headers.ts), not a copy of them.
 */
class RestCall implements HandlerContext, UnaryRequest {
  readonly stream = false;
  readonly protocolName = "rest";
  readonly timeoutMs = NO_TIMEOUT;
  readonly service: DescService;
  readonly method: DescMethodUnary;
  readonly requestMethod: string;
  readonly requestHeader: Headers;
  readonly values: ContextValues;
  // The request's fields under their UnaryRequest names, as own properties: an interceptor's copy
  // ({ ...req, message }) keeps them (the lazy ones below, read through getters, it does not).
  readonly header: Headers;
  readonly contextValues: ContextValues;
  private responseHeaders: Headers | undefined = undefined;
  private responseTrailers: Headers | undefined = undefined;

  constructor(
    route: Route,
    readonly message: Message,
    private readonly req: NodeRequest,
    readonly exchange: RestExchange,
  ) {
    this.service = route.binding.service;
    this.method = route.binding.method as DescMethodUnary;
    this.requestMethod = req.method ?? "POST";
    this.header = this.requestHeader = requestHeaderView(req.headers);
    this.contextValues = this.values = createContextValues().set(kHttpExchange, exchange).set(kRestCall, this);
  }

  get url(): string {
    return `http://${authority(this.req)}${this.req.url ?? "/"}`;
  }

  get signal(): AbortSignal {
    return this.exchange.contextSignal();
  }

  get responseHeader(): Headers {
    return (this.responseHeaders ??= new Headers());
  }

  get responseTrailer(): Headers {
    return (this.responseTrailers ??= new Headers());
  }

  /** The response headers the handler set, if it set any. */
  headersSet(): Headers | undefined {
    return this.responseHeaders;
  }

  /** The context of a request an interceptor passed on in place of this one. */
  mergedWith(req: UnaryRequest): HandlerContext {
    return {
      service: req.service,
      method: this.method,
      protocolName: this.protocolName,
      requestMethod: this.requestMethod,
      url: req.url ?? this.url,
      signal: req.signal ?? this.signal,
      timeoutMs: NO_TIMEOUT,
      requestHeader: req.header ?? this.requestHeader,
      responseHeader: this.responseHeader,
      responseTrailer: this.responseTrailer,
      values: req.contextValues ?? this.values,
    };
  }
}

/** The handler's answer through the interceptors; its headers are the call's, made only when read. */
class RestResponse implements UnaryResponse {
  readonly stream = false;
  readonly method: DescMethodUnary;
  readonly service: DescService;

  constructor(
    private readonly call: RestCall,
    readonly message: Message,
  ) {
    this.method = call.method;
    this.service = call.service;
  }

  get header(): Headers {
    return this.call.responseHeader;
  }

  get trailer(): Headers {
    return this.call.responseTrailer;
  }
}

/** The caller's host for the handler's URL; a host that would not make a URL is replaced. */
function authority(req: NodeRequest): string {
  const host = "authority" in req ? req.authority : req.headers.host;
  return hostMakesUrl(host) ? host! : "localhost";
}

/** What a handler (or an interceptor) threw, as a transcoder error; its metadata become headers of the answer. */
function handlerError(e: unknown, route: Route, logger: Logger, res: NodeResponse): TranscodeError {
  const procedure = `/${route.binding.service.typeName}/${route.binding.method.name}`;
  if (!(e instanceof ConnectError)) {
    logger.error({ err: e, procedure }, "handler failed");
    return new TranscodeError(Code.Internal, "internal error");
  }
  copyResponseHeaders(e.metadata, res);
  if (e.code === Code.Internal || e.code === Code.Unknown || e.code === Code.DataLoss) {
    logger.error({ procedure, code: codeString(e.code), message: e.rawMessage }, "handler failed");
  }
  // The method is one the resource does not take, and the handler named those it does.
  if (e.code === Code.Unimplemented && e.metadata.has("allow"))
    return new TranscodeError(e.code, e.rawMessage, { status: 405 });
  return new TranscodeError(e.code, e.rawMessage);
}

// --- response ---------------------------------------------------------------

interface Payload {
  contentType: string;
  bytes: Uint8Array;
}

function responsePayload(binding: HttpBinding, output: Message): Payload {
  const desc = binding.method.output;
  if (binding.responseBody === "")
    return desc.typeName === HTTP_BODY ? rawPayload(output) : jsonPayload(toJson(desc, output, JSON_WRITE));
  const field = desc.fields.find((f) => f.name === binding.responseBody)!;
  if (field.fieldKind === "message") {
    // An unset message field reads as an empty message.
    const value = field.oneof
      ? (reflect(desc, output).get(field) as ReflectMessage).message
      : (((output as unknown as Record<string, unknown>)[field.localName] as Message | undefined) ??
        create(field.message));
    return field.message.typeName === HTTP_BODY
      ? rawPayload(value)
      : jsonPayload(toJson(field.message, value, JSON_WRITE));
  }
  const json = toJson(desc, output, JSON_WRITE) as Record<string, JsonValue>;
  return jsonPayload(json[field.name] ?? null);
}

function rawPayload(message: Message): Payload {
  const body = message as unknown as HttpBody;
  return { contentType: body.contentType || "application/octet-stream", bytes: body.data };
}

function jsonPayload(json: JsonValue): Payload {
  return { contentType: "application/json", bytes: Buffer.from(JSON.stringify(json)) };
}

function copyResponseHeaders(from: Headers | undefined, res: NodeResponse): void {
  if (!from) return;
  from.forEach((value, name) => {
    if (!isRpcExchangeResponseHeader(name)) res.setHeader(name, value);
  });
  const cookies = from.getSetCookie();
  if (cookies.length > 0) res.setHeader("set-cookie", cookies);
}

/** Statuses that never carry a body. */
const NO_BODY = new Set([204, 205, 304]);

function writeSuccess(res: NodeResponse, status: number, payload: Payload, head: boolean): void {
  if (isGone(res)) return;
  if (NO_BODY.has(status)) {
    res.writeHead(status);
    res.end();
    return;
  }
  if (head) {
    // The head of the answer alone; the payload of an answer to HEAD is empty (an app sends no body to HEAD).
    res.writeHead(status, { "content-type": payload.contentType });
    res.end();
    return;
  }
  res.writeHead(status, { "content-type": payload.contentType, "content-length": String(payload.bytes.byteLength) });
  res.end(payload.bytes);
}

/**
 * Writes the head at once (a caller of server-sent events sees it before
 * the first event), then each chunk as it comes, waiting for the caller to
 * drain before reading the next. The caller going away cancels the body; a
 * body that breaks after the head ends the connection (HTTP/1.1: no last
 * chunk; HTTP/2: a reset stream), which is how a caller tells an answer cut
 * short from a whole one.
 */
async function writeStreamed(
  res: NodeResponse,
  status: number,
  contentType: string,
  body: StreamedBody,
  head: boolean,
): Promise<void> {
  if (isGone(res)) return body.cancel();
  let gone = false;
  let wake: (() => void) | undefined;
  const onClose = () => {
    if (closedEarly(res)) {
      gone = true;
      body.cancel();
    }
    wake?.();
  };
  res.once("close", onClose);
  try {
    res.writeHead(status, { "content-type": contentType });
    if (NO_BODY.has(status) || head) {
      res.end();
      // An answer to HEAD has no body; whatever the app sent is read to its end and not written.
      if (head) for await (const chunk of body.chunks) void chunk;
      return;
    }
    if ("flushHeaders" in res) res.flushHeaders(); // HTTP/2's writeHead sends the head by itself
    for await (const chunk of body.chunks) {
      if (gone) return;
      if (!(res.write as (c: Uint8Array) => boolean)(chunk)) {
        await new Promise<void>((resolve) => {
          wake = resolve;
          res.once("drain", resolve);
        });
        wake = undefined;
        if (gone) return;
      }
    }
    res.end();
  } catch {
    // The body broke after the head went out: cut the connection (the run records why).
    res.destroy();
  } finally {
    res.off("close", onClose);
  }
}

function writeError(res: NodeResponse, error: TranscodeError): void {
  if (isGone(res)) return;
  const body = errorBody(error.code, error.message);
  res.writeHead(error.status, {
    ...error.headers,
    "content-type": "application/json",
    "content-length": String(Buffer.byteLength(body)),
  });
  res.end(body);
}

function isGone(res: NodeResponse): boolean {
  return res.writableEnded || ("stream" in res ? res.stream.destroyed : res.destroyed);
}

/** Answers a failed transcode; anything but a TranscodeError is a bug, logged and answered 500. */
function answerError(req: NodeRequest, res: NodeResponse, e: unknown, opts: TranscoderOptions): void {
  if (e instanceof ClientGoneError) return;
  let error: TranscodeError;
  if (e instanceof TranscodeError) {
    error = e;
  } else {
    opts.logger.error({ err: e, method: req.method, url: truncate(req.url ?? "") }, "transcoder failed");
    error = new TranscodeError(Code.Internal, "internal error");
  }
  try {
    if (res.headersSent) {
      res.destroy();
      return;
    }
    writeError(res, error);
    discardRequest(req);
  } catch (writeFailure) {
    opts.logger.error({ err: writeFailure }, "transcoder could not answer");
    res.destroy();
  }
}

function header(req: NodeRequest, name: string): string | undefined {
  const value = req.headers[name];
  return Array.isArray(value) ? value.join(", ") : value;
}

function truncate(text: string): string {
  return text.length > 200 ? `${text.slice(0, 200)}...` : text;
}
