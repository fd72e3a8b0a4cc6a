// Builds OpenAPI 3.1 documents of the HTTP/JSON API from the same
// descriptors and google.api.http rules that the transcoder serves, so the
// documentation cannot describe a route, field or name the server does not
// have. The only hand-written part is DOCUMENTED_EXTRAS: what a handler adds
// to the HTTP answer at run time (see http-exchange.ts), which no rule says.
import { ScalarType, type DescField, type DescMessage, type DescService } from "@bufbuild/protobuf";
import { FeatureSet_FieldPresence } from "@bufbuild/protobuf/wkt";
import { httpBindings, type HttpBinding, type PathTemplate } from "./http-rules.js";

const IMPLICIT = FeatureSet_FieldPresence.IMPLICIT;

interface SchemaObject {
  $ref?: string;
  type?: "string" | "integer" | "number" | "boolean" | "object" | "array";
  title?: string;
  format?: string;
  description?: string;
  enum?: string[];
  minimum?: number;
  maximum?: number;
  items?: SchemaObject;
  properties?: Record<string, SchemaObject>;
  required?: string[];
  additionalProperties?: SchemaObject | boolean;
  anyOf?: SchemaObject[];
}

interface ParameterObject {
  name: string;
  in: "path" | "query" | "header";
  required: boolean;
  description?: string;
  schema: SchemaObject;
}

interface MediaTypeObject {
  schema: SchemaObject;
}

interface HeaderObject {
  description: string;
  schema: SchemaObject;
}

interface ResponseObject {
  description: string;
  headers?: Record<string, HeaderObject>;
  content?: Record<string, MediaTypeObject>;
}

interface RequestBodyObject {
  description?: string;
  required?: boolean;
  content: Record<string, MediaTypeObject>;
}

export interface OperationObject {
  operationId: string;
  summary: string;
  description?: string;
  tags: string[];
  parameters: ParameterObject[];
  requestBody?: RequestBodyObject;
  responses: Record<string, ResponseObject>;
  security: Record<string, string[]>[];
}

type OpenApiMethod = "get" | "put" | "post" | "delete" | "patch" | "head" | "options" | "trace";

type PathItemObject = Partial<Record<OpenApiMethod, OperationObject>>;

interface OpenApiInfo {
  title: string;
  version: string;
  description: string;
}

interface ServerObject {
  url: string;
  description: string;
}

export interface OpenApiDocument {
  openapi: "3.1.0";
  info: OpenApiInfo;
  servers: ServerObject[];
  tags: { name: string; description: string }[];
  paths: Record<string, PathItemObject>;
  components: {
    schemas: Record<string, SchemaObject>;
    securitySchemes: Record<string, { type: "http"; scheme: "bearer"; description: string }>;
  };
}

/** What a method's handler adds to its HTTP answer beyond its http rule. */
interface OperationExtras {
  /** A summary better than the one made from the method name. */
  summary?: string;
  description?: string;
  /** Replaces the request body the rule implies (an HttpBody that the handler reads as JSON). */
  requestBody?: RequestBodyObject;
  /** Responses besides, or instead of, the rule's 200 (e.g. a status set with setHttpStatus). */
  responses?: Record<string, ResponseObject>;
  /** Error statuses the handler answers beyond COMMON_ERRORS (see ERROR_RESPONSES). */
  errors?: string[];
  /** Headers present on every response of the method, errors included. */
  responseHeaders?: Record<string, HeaderObject>;
  /** Request headers the handler reads. */
  requestHeaders?: ParameterObject[];
  /**
   * Request fields a REST call takes from its own request line (its method,
   * its query string) rather than from a query parameter: the handler reads
   * the HTTP exchange for them, so they are not documented as parameters.
   */
  fromRequestLine?: string[];
  /** Component schemas the extras refer to. */
  schemas?: Record<string, SchemaObject>;
}

const BEARER = "bearer";
const ERROR_SCHEMA = "Error";

const RETRY_AFTER: HeaderObject = {
  description: "Seconds to wait before calling again.",
  schema: { type: "integer", minimum: 0 },
};

/** The Cortex runtime's answers and the async acknowledgement, which are JSON although Run's message says HttpBody. */
const RUN_SCHEMAS: Record<string, SchemaObject> = {
  CortexRunInput: {
    type: "object",
    additionalProperties: true,
    description: "Cortex app: a JSON object whose fields are the function's keyword arguments (an empty body is {}).",
  },
  CustomRunInput: {
    description:
      "Custom app: any JSON value, or with another Content-Type any bytes; the app receives the body unchanged.",
  },
  CortexRunResult: {
    type: "object",
    description: "Cortex app, 200: the function's return value in an envelope.",
    properties: {
      run_id: { type: "string", description: "The run id, equal to the X-Request-Id header." },
      result: { description: "The function's return value, any JSON value." },
      run_time_ms: { type: "number", description: "How long the function ran, in milliseconds." },
    },
    required: ["run_id", "result", "run_time_ms"],
  },
  CortexRunError: {
    type: "object",
    description: "Cortex app: the function raised (500) or could not be called with this body (400, 404).",
    properties: {
      run_id: { type: "string" },
      error: {
        type: "object",
        properties: {
          type: { type: "string", description: 'The exception\'s class, e.g. "ValueError".' },
          message: { type: "string" },
        },
        required: ["type", "message"],
      },
    },
    required: ["run_id", "error"],
  },
  RunAccepted: {
    type: "object",
    description: "async=true: the run is durably queued; the body holds only the run id.",
    properties: { run_id: { type: "string", description: "The run id, equal to the X-Request-Id header." } },
    required: ["run_id"],
    additionalProperties: false,
  },
};

/** An error answer of Run: skiff's own `{code, message}`, or a Cortex function's error envelope. */
const RUN_ERROR_CONTENT = jsonContent({
  anyOf: [{ $ref: schemaRef("CortexRunError") }, { $ref: schemaRef(ERROR_SCHEMA) }],
});

/**
 * What handlers do that google.api.http cannot express, keyed by
 * "<service type name>.<method name>". Keep every such extra here.
 */
const DOCUMENTED_EXTRAS: Readonly<Record<string, OperationExtras>> = {
  "skiff.invocation.v4.InvocationService.Run": {
    summary: "Run an app",
    description:
      "Synchronous by default: the answer is the function's response. A Cortex app answers 200 with the envelope " +
      "`{run_id, result, run_time_ms}`, or its error envelope `{run_id, error: {type, message}}`. A Custom app's " +
      "answer passes through unchanged (its own status, headers and body, any content type): the schemas below " +
      "describe Cortex apps. With `async=true` the run is durably queued and the answer is 202 `{run_id}`; the " +
      "result goes to `webhookEndpoint` when given. Every method reaches a Custom app, with the query string as " +
      "written less `async` and `webhookEndpoint`, which act the same on every method (a queued run keeps its " +
      "method and query); a HEAD answer has no body. A Cortex app takes POST only: another method answers 405 " +
      "with `Allow: POST`. An app whose config lists CORS origins has its preflights answered by skiff.",
    requestBody: {
      description: "What the app receives. Cortex: a JSON object of keyword arguments. Custom: any body.",
      required: false,
      content: jsonContent({ anyOf: [{ $ref: schemaRef("CortexRunInput") }, { $ref: schemaRef("CustomRunInput") }] }),
    },
    responses: {
      "200": {
        description:
          "The sync answer. Cortex app: the envelope {run_id, result, run_time_ms}. Custom app: the app's own " +
          "answer, unchanged (any JSON value or content type; this schema then does not apply).",
        content: jsonContent({ $ref: schemaRef("CortexRunResult") }),
      },
      "202": {
        description: "Accepted (async=true): the run is durably queued. The body holds only the run id.",
        content: jsonContent({ $ref: schemaRef("RunAccepted") }),
      },
      "400": {
        description: "Invalid argument: a malformed parameter, webhookEndpoint or body.",
        content: RUN_ERROR_CONTENT,
      },
      "404": { description: "No such project, app or function.", content: RUN_ERROR_CONTENT },
      "500": { description: "A Cortex function raised (error envelope), or a skiff bug.", content: RUN_ERROR_CONTENT },
    },
    errors: ["405", "429", "499", "504"],
    fromRequestLine: ["method", "query"],
    responseHeaders: {
      "X-Request-Id": { description: "The run id; equal to run_id of an async call.", schema: { type: "string" } },
    },
    requestHeaders: [
      {
        name: "X-Webhook-Secret",
        in: "header",
        required: false,
        description: "Secret that signs the webhook deliveries of this run (with webhookEndpoint).",
        schema: { type: "string" },
      },
      {
        name: "Idempotency-Key",
        in: "header",
        required: false,
        description: "Caller-chosen key; calls repeated with the same key are treated as one run.",
        schema: { type: "string" },
      },
    ],
    schemas: RUN_SCHEMAS,
  },
  "skiff.management.v2.ManagementService.CreateProject": { errors: ["409"] },
  "skiff.management.v2.ManagementService.CreateServiceAccount": { errors: ["409"] },
};

/**
 * Message fields of answers that the handlers always set, by message type
 * name (ProtoJSON leaves an unset message field out, so the descriptors
 * alone cannot say it is always there). Each is set by a converter in
 * services/management/convert.ts or by the handler's return.
 */
const SET_BY_HANDLERS: Readonly<Record<string, readonly string[]>> = {
  "skiff.management.v2.Project": ["created_at"],
  "skiff.management.v2.ServiceAccount": ["created_at", "expires_at"],
  "skiff.management.v2.CreateProjectResponse": ["project"],
  "skiff.management.v2.GetProjectResponse": ["project"],
  "skiff.management.v2.CreateServiceAccountResponse": ["service_account"],
  "skiff.management.v2.GetServiceAccountResponse": ["service_account"],
};

/** Request body fields the handler refuses to go without (400 when missing), by message type name. */
const REQUIRED_FIELDS: Readonly<Record<string, readonly string[]>> = {
  "skiff.management.v2.CreateServiceAccountRequest": ["name", "expires_at"],
};

/**
 * Error statuses every operation can answer: 400 (a bad parameter), 401 and
 * 403 (the auth interceptor), 404 (an unknown resource or path), 413 (every
 * request body is read under the size limit), 500 (a bug) and 503 (the
 * token cannot be checked right now, NATS unavailable).
 */
const COMMON_ERRORS = ["400", "401", "403", "404", "413", "500", "503"] as const;

/** Every error status skiff's REST path answers, with the Connect codes behind it (DESIGN.md, Contracts). */
const ERROR_RESPONSES: Readonly<Record<string, ResponseObject>> = {
  "400": errorResponse("Invalid argument (invalid_argument, failed_precondition, out_of_range)."),
  "401": errorResponse("Missing, malformed, expired or revoked bearer token (unauthenticated)."),
  "403": errorResponse("The token may not act on this resource (permission_denied)."),
  "404": errorResponse("Not found (not_found)."),
  "409": errorResponse("Conflict: it already exists, or a concurrent change won; retry (already_exists, aborted)."),
  "413": errorResponse("Request body too large (resource_exhausted)."),
  "405": {
    ...errorResponse("This method is not one the app takes (unimplemented); `Allow` names those it does."),
    headers: { Allow: { description: "The methods the app takes.", schema: { type: "string" } } },
  },
  "415": errorResponse("The request body is not JSON (its Content-Type says otherwise)."),
  "429": {
    ...errorResponse("Too many requests: the app's queue or replicas are full (resource_exhausted)."),
    headers: { "Retry-After": RETRY_AFTER },
  },
  "499": errorResponse("The run was cancelled while the caller waited (canceled)."),
  "500": errorResponse("Internal error: a bug in skiff (internal)."),
  "503": errorResponse("Unavailable: no runner can take the app, or NATS is unreachable; retry (unavailable)."),
  "504": errorResponse("The run outlasted the app's response_grace_period (deadline_exceeded)."),
};

/** Said once per document: a status no single operation owns. */
const METHOD_NOT_ALLOWED =
  "Errors are JSON `{code, message}`. A path called with a method it does not have answers 405 " +
  "(`unimplemented`) with an `Allow` header.";

const HTTP_BODY = "google.api.HttpBody";

const OPENAPI_METHODS: ReadonlySet<string> = new Set([
  "get",
  "put",
  "post",
  "delete",
  "patch",
  "head",
  "options",
  "trace",
]);

class OpenApiError extends Error {
  override name = "OpenApiError";
}

/** One of skiff's HTTP/JSON APIs: what its document covers, where it is committed and where it is served. */
export interface ApiDocument {
  /** Path of the committed document, relative to the repository root. */
  file: string;
  /** URL path the server answers with the document. */
  servedAt: string;
  services: readonly DescService[];
  info: OpenApiInfo;
}

/** The documents of `apis` by the URL path that serves them, built on demand. */
export function openapiDocuments(apis: readonly ApiDocument[]): Record<string, () => OpenApiDocument> {
  return Object.fromEntries(apis.map((api) => [api.servedAt, () => openapiDocument(api.services, api.info)]));
}

export function openapiDocument(services: readonly DescService[], info: OpenApiInfo): OpenApiDocument {
  const schemas = new SchemaRegistry();
  const paths: Record<string, PathItemObject> = {};
  const operationIds = new Map<string, number>();
  for (const binding of httpBindings(services)) {
    const path = openapiPath(binding.template);
    const method = openapiMethod(binding);
    const item = (paths[path] ??= {});
    if (item[method]) throw new OpenApiError(`two http rules bind ${method.toUpperCase()} ${path}`);
    item[method] = operation(binding, uniqueOperationId(operationIds, binding.method.name, method), schemas);
  }
  const extraSchemas: Record<string, SchemaObject> = {};
  for (const binding of httpBindings(services))
    Object.assign(extraSchemas, DOCUMENTED_EXTRAS[methodKey(binding)]?.schemas);
  return {
    openapi: "3.1.0",
    info: { ...info, description: `${info.description}\n\n${METHOD_NOT_ALLOWED}` },
    // Relative to the document's own URL: the server that serves it.
    servers: [{ url: "/", description: "The skiff server that serves this document." }],
    tags: services.map((service) => ({
      name: service.name,
      description: `${service.typeName}; also served over Connect, gRPC and gRPC-Web at /${service.typeName}/<method>.`,
    })),
    paths,
    components: {
      schemas: sortedByName({ ...schemas.build(), ...extraSchemas, [ERROR_SCHEMA]: errorSchema() }),
      securitySchemes: { [BEARER]: { type: "http", scheme: "bearer", description: "Authorization: Bearer <token>" } },
    },
  };
}

/**
 * The method name; an additional binding of the same method gets its HTTP
 * method as suffix (`RunGet`), or a number where that is taken, so ids stay unique.
 */
function uniqueOperationId(seen: Map<string, number>, name: string, httpMethod: string): string {
  const count = (seen.get(name) ?? 0) + 1;
  seen.set(name, count);
  if (count === 1) return name;
  const named = `${name}${httpMethod[0].toUpperCase()}${httpMethod.slice(1)}`;
  if (!seen.has(named)) {
    seen.set(named, 1);
    return named;
  }
  return `${name}${count}`;
}

function openapiMethod(binding: HttpBinding): OpenApiMethod {
  const method = binding.httpMethod.toLowerCase();
  if (!OPENAPI_METHODS.has(method))
    throw new OpenApiError(`${methodKey(binding)}: OpenAPI has no HTTP method ${binding.httpMethod}`);
  return method as OpenApiMethod;
}

function methodKey(binding: HttpBinding): string {
  return `${binding.method.parent.typeName}.${binding.method.name}`;
}

/**
 * The template in OpenAPI form: each variable becomes one `{field.path}`,
 * even when it spans segments (OpenAPI cannot say so; the parameter's
 * description does), and the custom verb stays as `:verb`.
 */
export function openapiPath(template: PathTemplate): string {
  const parts: string[] = [];
  for (let i = 0; i < template.segments.length;) {
    const variable = template.variables.find((v) => v.start === i);
    if (variable) {
      parts.push(`{${variable.fieldPath.join(".")}}`);
      i = variable.length < 0 ? template.segments.length : i + variable.length;
      continue;
    }
    const segment = template.segments[i];
    if (segment.kind !== "literal")
      throw new OpenApiError(`${template.source}: OpenAPI cannot express a wildcard outside a variable`);
    parts.push(segment.value);
    i++;
  }
  return `/${parts.join("/")}${template.verb === undefined ? "" : `:${template.verb}`}`;
}

function operation(binding: HttpBinding, operationId: string, schemas: SchemaRegistry): OperationObject {
  const extras = DOCUMENTED_EXTRAS[methodKey(binding)];
  const requestBody = extras?.requestBody ?? requestBodyOf(binding, schemas);
  const statuses = [...COMMON_ERRORS, ...(isJsonBody(binding) ? ["415"] : []), ...(extras?.errors ?? [])];
  const errors = Object.fromEntries(statuses.map((status) => [status, ERROR_RESPONSES[status]]));
  if (Object.values(errors).some((r) => r === undefined))
    throw new OpenApiError(`${methodKey(binding)}: an error status without a description`);
  const responses = withHeaders(
    sortedByStatus({ "200": successResponse(binding, schemas), ...errors, ...extras?.responses }),
    extras?.responseHeaders,
  );
  return {
    operationId,
    summary: extras?.summary ?? summaryOf(binding.method.name),
    ...(extras?.description !== undefined && { description: extras.description }),
    tags: [binding.service.name],
    parameters: [
      ...pathParameters(binding),
      ...queryParameters(binding).filter((p) => !extras?.fromRequestLine?.includes(p.name)),
      ...(extras?.requestHeaders ?? []),
    ],
    ...(requestBody && { requestBody }),
    responses,
    security: [{ [BEARER]: [] }],
  };
}

/** "ListServiceAccounts" → "List service accounts". */
function summaryOf(methodName: string): string {
  const words = methodName.split(/(?<=[a-z0-9])(?=[A-Z])/).map((w, i) => (i === 0 ? w : w.toLowerCase()));
  return words.join(" ");
}

/** Whether the transcoder parses the request body as JSON (and so answers 415 to another media type). */
function isJsonBody(binding: HttpBinding): boolean {
  if (binding.body === "") return false;
  if (binding.body === "*") return binding.method.input.typeName !== HTTP_BODY;
  const field = topField(binding.method.input, binding.body);
  return !(field.fieldKind === "message" && field.message.typeName === HTTP_BODY);
}

function pathParameters(binding: HttpBinding): ParameterObject[] {
  return binding.template.variables.map((variable) => {
    const field = fieldAt(binding.method.input, variable.fieldPath);
    const spans = variable.length < 0 || variable.length > 1;
    const pattern = binding.template.segments
      .slice(variable.start, variable.length < 0 ? undefined : variable.start + variable.length)
      .map((s) => (s.kind === "literal" ? s.value : s.kind === "wildcard" ? "*" : "**"))
      .join("/");
    return {
      name: variable.fieldPath.join("."),
      in: "path",
      required: true,
      // Reserved expansion ({+path}): a generated client encodes the value whole, each "/" as %2F, and skiff reads that as "/".
      ...(spans && {
        description: `May span several path segments (template \`${pattern}\`): each "/" may be written as it is or as %2F, as generated clients write it; both separate segments.`,
        allowReserved: true,
      }),
      schema: scalarLikeSchema(field),
    };
  });
}

/**
 * Every scalar, enum or repeated scalar/enum field that neither the path nor
 * the body binds, as the transcoder reads them: dotted names for nested
 * fields, each named as queryName() says.
 */
function queryParameters(binding: HttpBinding): ParameterObject[] {
  if (binding.body === "*") return [];
  const bound = new Set(binding.template.variables.map((v) => v.fieldPath.join(".")));
  const out: ParameterObject[] = [];
  const walk = (message: DescMessage, protoPath: string[], restPath: string[], seen: ReadonlySet<string>): void => {
    for (const field of message.fields) {
      const path = [...protoPath, field.name];
      if (bound.has(path.join(".")) || (path.length === 1 && field.name === binding.body)) continue;
      const name = [...restPath, queryName(field)];
      if (field.fieldKind === "message" && !specialSchema(field.message) && !seen.has(field.message.typeName)) {
        walk(field.message, path, name, new Set([...seen, field.message.typeName]));
      } else if (isQueryable(field)) {
        out.push({ name: name.join("."), in: "query", required: false, schema: scalarLikeSchema(field) });
      }
    }
  };
  walk(binding.method.input, [], [], new Set([binding.method.input.typeName]));
  return out;
}

/**
 * Query parameters go by the fields' JSON names: the spec spells one
 * `webhookEndpoint`, and descriptors cannot tell its explicit json_name from
 * the lowerCamelCase default of other fields (`page_size` → `pageSize`), so
 * one rule covers them all. Names without "_" are the same either way.
 */
function queryName(field: DescField): string {
  return field.jsonName;
}

function isQueryable(field: DescField): boolean {
  return (
    field.fieldKind === "scalar" ||
    field.fieldKind === "enum" ||
    (field.fieldKind === "list" && field.listKind !== "message")
  );
}

function requestBodyOf(binding: HttpBinding, schemas: SchemaRegistry): RequestBodyObject | undefined {
  const input = binding.method.input;
  if (binding.body === "") return undefined;
  if (binding.body === "*") {
    if (input.typeName === HTTP_BODY) return { content: binaryContent() };
    const pathFields = binding.template.variables.map((v) => v.fieldPath);
    const schema = schemas.messageWithout(input, pathFields);
    return { required: (schema.required?.length ?? 0) > 0, content: jsonContent(schema) };
  }
  return { content: fieldContent(topField(input, binding.body), schemas) };
}

function successResponse(binding: HttpBinding, schemas: SchemaRegistry): ResponseObject {
  const output = binding.method.output;
  if (binding.responseBody !== "") {
    return { description: "OK", content: fieldContent(topField(output, binding.responseBody), schemas) };
  }
  if (output.typeName === HTTP_BODY) return { description: "OK", content: binaryContent() };
  return { description: "OK", content: jsonContent(schemas.message(output)) };
}

function fieldContent(field: DescField, schemas: SchemaRegistry): Record<string, MediaTypeObject> {
  if (field.fieldKind === "message" && field.message.typeName === HTTP_BODY) return binaryContent();
  return jsonContent(schemas.field(field));
}

/** google.api.HttpBody is the raw body with its own content type, not JSON. */
function binaryContent(): Record<string, MediaTypeObject> {
  return { "*/*": { schema: { type: "string", format: "binary" } } };
}

function jsonContent(schema: SchemaObject): Record<string, MediaTypeObject> {
  return { "application/json": { schema } };
}

function errorResponse(description: string): ResponseObject {
  return { description, content: jsonContent({ $ref: schemaRef(ERROR_SCHEMA) }) };
}

function errorSchema(): SchemaObject {
  return {
    type: "object",
    properties: {
      code: { type: "string", description: 'Connect error code, e.g. "not_found".' },
      message: { type: "string" },
    },
    required: ["code", "message"],
  };
}

function sortedByName(schemas: Record<string, SchemaObject>): Record<string, SchemaObject> {
  return Object.fromEntries(Object.entries(schemas).sort(([a], [b]) => compareCodeUnits(a, b)));
}

function sortedByStatus(responses: Record<string, ResponseObject>): Record<string, ResponseObject> {
  return Object.fromEntries(Object.entries(responses).sort(([a], [b]) => compareCodeUnits(a, b)));
}

/** Locale-independent ordering, so the written documents are the same on every machine. */
function compareCodeUnits(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

function withHeaders(
  responses: Record<string, ResponseObject>,
  headers: Record<string, HeaderObject> | undefined,
): Record<string, ResponseObject> {
  if (!headers) return responses;
  return Object.fromEntries(
    Object.entries(responses).map(([status, r]) => [status, { ...r, headers: { ...r.headers, ...headers } }]),
  );
}

function topField(message: DescMessage, name: string): DescField {
  return fieldAt(message, [name]);
}

function fieldAt(message: DescMessage, fieldPath: readonly string[]): DescField {
  let current: DescMessage | undefined = message;
  let field: DescField | undefined;
  for (const name of fieldPath) {
    field = current?.fields.find((f) => f.name === name);
    if (!field) throw new OpenApiError(`${message.typeName} has no field ${fieldPath.join(".")}`);
    current = field.fieldKind === "message" ? field.message : undefined;
  }
  if (!field) throw new OpenApiError(`empty field path in ${message.typeName}`);
  return field;
}

function schemaRef(name: string): string {
  return `#/components/schemas/${name}`;
}

/** Schema of a path or query parameter: a scalar or enum, or an array of them. */
function scalarLikeSchema(field: DescField): SchemaObject {
  switch (field.fieldKind) {
    case "scalar":
      return scalarSchema(field.scalar);
    case "enum":
      return enumSchema(field.enum.values.map((v) => v.name));
    case "list":
      if (field.listKind === "scalar") return { type: "array", items: scalarSchema(field.scalar) };
      if (field.listKind === "enum") return { type: "array", items: enumSchema(field.enum.values.map((v) => v.name)) };
  }
  throw new OpenApiError(`${field.parent.typeName}.${field.name} cannot be a path or query parameter`);
}

function enumSchema(names: string[]): SchemaObject {
  return { type: "string", enum: names };
}

/** ProtoJSON: 64-bit integers are strings (JavaScript numbers cannot hold them), bytes are base64. */
function scalarSchema(scalar: ScalarType): SchemaObject {
  switch (scalar) {
    case ScalarType.INT64:
    case ScalarType.SINT64:
    case ScalarType.SFIXED64:
    case ScalarType.UINT64:
    case ScalarType.FIXED64:
      return { type: "string", format: "int64" };
    case ScalarType.INT32:
    case ScalarType.SINT32:
    case ScalarType.SFIXED32:
      return { type: "integer", format: "int32" };
    case ScalarType.UINT32:
    case ScalarType.FIXED32:
      return { type: "integer", minimum: 0, maximum: 4294967295 };
    case ScalarType.DOUBLE:
      return { type: "number", format: "double" };
    case ScalarType.FLOAT:
      return { type: "number", format: "float" };
    case ScalarType.BOOL:
      return { type: "boolean" };
    case ScalarType.STRING:
      return { type: "string" };
    case ScalarType.BYTES:
      return { type: "string", format: "byte" };
  }
}

const WRAPPER = /^google\.protobuf\.(Double|Float|Int64|UInt64|Int32|UInt32|Bool|String|Bytes)Value$/;

/** Well-known types whose ProtoJSON form is not an object of their fields; undefined for every other message. */
function specialSchema(message: DescMessage): SchemaObject | undefined {
  switch (message.typeName) {
    case "google.protobuf.Timestamp":
      return { type: "string", format: "date-time" };
    case "google.protobuf.Duration":
      return { type: "string", description: 'Seconds with an "s" suffix, e.g. "1.5s".' };
    case "google.protobuf.FieldMask":
      return { type: "string", description: "Comma-separated lowerCamelCase field paths." };
    case "google.protobuf.Struct":
      return { type: "object" };
    case "google.protobuf.Value":
      return {};
    case "google.protobuf.ListValue":
      return { type: "array", items: {} };
    case "google.protobuf.Empty":
      return { type: "object" };
    case "google.protobuf.Any":
      return { type: "object", properties: { "@type": { type: "string" } }, required: ["@type"] };
  }
  if (WRAPPER.test(message.typeName)) return scalarLikeSchema(topField(message, "value"));
  return undefined;
}

/**
 * Whether the transcoder's JSON (alwaysEmitImplicit) always has the field:
 * lists, maps and fields of implicit presence; not messages, proto3
 * `optional` fields or oneof members, which are left out when unset.
 */
function alwaysWritten(field: DescField): boolean {
  if (field.fieldKind === "list" || field.fieldKind === "map") return true;
  if (field.fieldKind === "message" || field.oneof !== undefined) return false;
  return field.presence === IMPLICIT;
}

/**
 * Hands out schemas for fields and messages, collecting every message it
 * refers to so that build() emits exactly the component schemas referenced.
 */
class SchemaRegistry {
  private readonly messages = new Map<string, DescMessage>();

  /** A $ref to the message's component schema, or the inline form of a well-known type. */
  message(message: DescMessage): SchemaObject {
    const special = specialSchema(message);
    if (special) return special;
    this.messages.set(message.typeName, message);
    return { $ref: schemaRef(message.typeName) };
  }

  /**
   * The message without the fields at the given paths, inline (for `body: "*"`,
   * where path-bound fields are not part of the body); a plain $ref when none.
   */
  messageWithout(message: DescMessage, excluded: readonly string[][]): SchemaObject {
    const special = specialSchema(message);
    if (special) return special;
    const properties: Record<string, SchemaObject> = {};
    for (const field of message.fields) {
      const inside = excluded.filter((p) => p[0] === field.name);
      if (inside.some((p) => p.length === 1)) continue;
      properties[field.name] =
        inside.length > 0 && field.fieldKind === "message"
          ? this.messageWithout(
              field.message,
              inside.map((p) => p.slice(1)),
            )
          : this.field(field);
    }
    const required = (REQUIRED_FIELDS[message.typeName] ?? []).filter((name) => name in properties);
    return { type: "object", properties, ...(required.length > 0 && { required: [...required] }) };
  }

  field(field: DescField): SchemaObject {
    switch (field.fieldKind) {
      case "message":
        return this.message(field.message);
      case "list":
        return field.listKind === "message"
          ? { type: "array", items: this.message(field.message) }
          : scalarLikeSchema(field);
      case "map":
        return { type: "object", additionalProperties: this.mapValue(field) };
      default:
        return scalarLikeSchema(field);
    }
  }

  /** Component schemas by full proto type name, sorted; referenced messages found while building are added too. */
  build(): Record<string, SchemaObject> {
    const built = new Map<string, SchemaObject>();
    for (let pending = this.unbuilt(built); pending.length > 0; pending = this.unbuilt(built)) {
      for (const message of pending) built.set(message.typeName, this.objectSchema(message));
    }
    return Object.fromEntries([...built].sort(([a], [b]) => compareCodeUnits(a, b)));
  }

  private unbuilt(built: ReadonlyMap<string, SchemaObject>): DescMessage[] {
    return [...this.messages.values()].filter((m) => !built.has(m.typeName));
  }

  /** Component schemas describe answers: every field that ProtoJSON always writes, or a handler always sets, is required. */
  private objectSchema(message: DescMessage): SchemaObject {
    const properties: Record<string, SchemaObject> = {};
    for (const field of message.fields) properties[field.name] = this.field(field);
    const setByHandler = SET_BY_HANDLERS[message.typeName] ?? [];
    const required = message.fields.filter((f) => alwaysWritten(f) || setByHandler.includes(f.name)).map((f) => f.name);
    return { type: "object", properties, ...(required.length > 0 && { required }) };
  }

  private mapValue(field: DescField & { fieldKind: "map" }): SchemaObject {
    switch (field.mapKind) {
      case "message":
        return this.message(field.message);
      case "enum":
        return enumSchema(field.enum.values.map((v) => v.name));
      case "scalar":
        return scalarSchema(field.scalar);
    }
  }
}
