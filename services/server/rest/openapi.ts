// Builds OpenAPI 3.1 documents of the HTTP/JSON API from the same
// descriptors and google.api.http rules that the transcoder serves, so the
// documentation cannot describe a route, field or name the server does not
// have. The only hand-written part is DOCUMENTED_EXTRAS: what a handler adds
// to the HTTP answer at run time (see http-exchange.ts), which no rule says.
import { ScalarType, type DescField, type DescMessage, type DescService } from "@bufbuild/protobuf";
import { InvocationService } from "../../../gen/skiff/invocation/v4/invocation_pb.js";
import { ManagementService } from "../../../gen/skiff/management/v2/management_pb.js";
import { httpBindings, type HttpBinding, type PathTemplate } from "./http-rules.js";

export interface SchemaObject {
  $ref?: string;
  type?: "string" | "integer" | "number" | "boolean" | "object" | "array";
  format?: string;
  description?: string;
  enum?: string[];
  minimum?: number;
  maximum?: number;
  items?: SchemaObject;
  properties?: Record<string, SchemaObject>;
  required?: string[];
  additionalProperties?: SchemaObject | boolean;
}

export interface ParameterObject {
  name: string;
  in: "path" | "query" | "header";
  required: boolean;
  description?: string;
  schema: SchemaObject;
}

export interface MediaTypeObject {
  schema: SchemaObject;
}

export interface HeaderObject {
  description: string;
  schema: SchemaObject;
}

export interface ResponseObject {
  description: string;
  headers?: Record<string, HeaderObject>;
  content?: Record<string, MediaTypeObject>;
}

export interface RequestBodyObject {
  content: Record<string, MediaTypeObject>;
}

export interface OperationObject {
  operationId: string;
  tags: string[];
  parameters: ParameterObject[];
  requestBody?: RequestBodyObject;
  responses: Record<string, ResponseObject>;
  security: Record<string, string[]>[];
}

export type OpenApiMethod = "get" | "put" | "post" | "delete" | "patch" | "head" | "options" | "trace";

export type PathItemObject = Partial<Record<OpenApiMethod, OperationObject>>;

export interface OpenApiInfo {
  title: string;
  version: string;
  description: string;
}

export interface OpenApiDocument {
  openapi: "3.1.0";
  info: OpenApiInfo;
  paths: Record<string, PathItemObject>;
  components: {
    schemas: Record<string, SchemaObject>;
    securitySchemes: Record<string, { type: "http"; scheme: "bearer"; description: string }>;
  };
}

/** What a method's handler adds to its HTTP answer beyond its http rule. */
interface OperationExtras {
  /** Responses besides the rule's 200 (e.g. a status set with setHttpStatus). */
  responses: Record<string, ResponseObject>;
  /** Headers present on every response of the method, errors included. */
  responseHeaders: Record<string, HeaderObject>;
  /** Request headers the handler reads. */
  requestHeaders: ParameterObject[];
}

/**
 * The spec's invocation specifics that google.api.http cannot express, keyed
 * by "<service type name>.<method name>". Keep every such extra here.
 */
const DOCUMENTED_EXTRAS: Readonly<Record<string, OperationExtras>> = {
  "skiff.invocation.v4.InvocationService.Run": {
    responses: {
      "202": {
        description: "Accepted (async=true): the run is durably queued. The body holds only the run id.",
        content: {
          "application/json": {
            schema: {
              type: "object",
              properties: { run_id: { type: "string" } },
              required: ["run_id"],
              additionalProperties: false,
            },
          },
        },
      },
    },
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
  },
};

const BEARER = "bearer";
const ERROR_SCHEMA = "Error";

/** Error statuses a Connect code maps to on the REST path (DESIGN.md, Contracts). */
const ERROR_RESPONSES: Readonly<Record<string, string>> = {
  "400": "Invalid argument.",
  "401": "Missing, malformed or expired bearer token.",
  "403": "The token may not act on this resource.",
  "404": "Not found.",
  "413": "Request body too large.",
  "429": "Too many requests.",
  "503": "Unavailable; retry later.",
  "504": "Deadline exceeded.",
};

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

export class OpenApiError extends Error {
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

export const SKIFF_APIS: readonly ApiDocument[] = [
  {
    file: "gen/openapi/management.v2.json",
    servedAt: "/v2/openapi.json",
    services: [ManagementService],
    // Spec section 9: the management API description carries version 1.0.0.
    info: {
      title: "skiff management API",
      version: "1.0.0",
      description: "Projects, service accounts and their bearer tokens, app deployments, runs and webhook deliveries.",
    },
  },
  {
    file: "gen/openapi/invocation.v4.json",
    servedAt: "/v4/openapi.json",
    services: [InvocationService],
    info: {
      title: "skiff invocation API",
      version: "1.0.0",
      description:
        "Runs deployed apps over HTTP: synchronously (the function's response) or asynchronously (202 with the run id), " +
        "optionally forwarding the response to a signed webhook.",
    },
  },
];

/** The documents by the URL path that serves them, built on demand. */
export function openapiDocuments(): Record<string, () => OpenApiDocument> {
  return Object.fromEntries(SKIFF_APIS.map((api) => [api.servedAt, () => openapiDocument(api.services, api.info)]));
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
    item[method] = operation(binding, uniqueOperationId(operationIds, binding.method.name), schemas);
  }
  return {
    openapi: "3.1.0",
    info: { ...info },
    paths,
    components: {
      schemas: { ...schemas.build(), [ERROR_SCHEMA]: errorSchema() },
      securitySchemes: { [BEARER]: { type: "http", scheme: "bearer", description: "Authorization: Bearer <token>" } },
    },
  };
}

/** The method name; additional bindings of the same method get a numeric suffix so ids stay unique. */
function uniqueOperationId(seen: Map<string, number>, name: string): string {
  const count = (seen.get(name) ?? 0) + 1;
  seen.set(name, count);
  return count === 1 ? name : `${name}${count}`;
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
  const requestBody = requestBodyOf(binding, schemas);
  const responses = withHeaders(
    sortedByStatus({ "200": successResponse(binding, schemas), ...extras?.responses, ...errorResponses() }),
    extras?.responseHeaders,
  );
  return {
    operationId,
    tags: [binding.service.name],
    parameters: [...pathParameters(binding), ...queryParameters(binding), ...(extras?.requestHeaders ?? [])],
    ...(requestBody && { requestBody }),
    responses,
    security: [{ [BEARER]: [] }],
  };
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
      ...(spans && { description: `May span several path segments, "/" included (template \`${pattern}\`).` }),
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
    return { content: jsonContent(schemas.messageWithout(input, pathFields)) };
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

function errorResponses(): Record<string, ResponseObject> {
  const out: Record<string, ResponseObject> = {};
  for (const [status, description] of Object.entries(ERROR_RESPONSES)) {
    out[status] = { description, content: jsonContent({ $ref: schemaRef(ERROR_SCHEMA) }) };
  }
  return out;
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
    if (excluded.length === 0) return this.message(message);
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
    return { type: "object", properties };
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

  private objectSchema(message: DescMessage): SchemaObject {
    const properties: Record<string, SchemaObject> = {};
    for (const field of message.fields) properties[field.name] = this.field(field);
    return { type: "object", properties };
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
