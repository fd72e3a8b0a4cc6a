// Reads the google.api.http rules of services from their generated
// descriptors and parses their path templates. The transcoder and the
// OpenAPI documents are both built from what this module returns, so REST
// routes and their documentation cannot drift apart.
//
// Template grammar (google/api/http.proto):
//   Template = "/" Segments [ Verb ] ;
//   Segments = Segment { "/" Segment } ;
//   Segment  = "*" | "**" | LITERAL | Variable ;
//   Variable = "{" FieldPath [ "=" Segments ] "}" ;
//   FieldPath = IDENT { "." IDENT } ;
//   Verb     = ":" LITERAL ;
import {
  getOption,
  hasOption,
  type DescField,
  type DescMessage,
  type DescMethod,
  type DescService,
} from "@bufbuild/protobuf";
import { http } from "../../../gen/google/api/annotations_pb.js";
import type { HttpRule } from "../../../gen/google/api/http_pb.js";

export type Segment =
  | { kind: "literal"; value: string }
  /** `*`: exactly one segment. */
  | { kind: "wildcard" }
  /** `**`: zero or more segments; only last. */
  | { kind: "deep" };

export interface Variable {
  /** Field path in the request message, e.g. ["project_id"] (proto names). */
  fieldPath: string[];
  /** Index of the variable's first segment in `segments`. */
  start: number;
  /** Number of segments the variable spans; -1 when it ends with `**`. */
  length: number;
}

export interface PathTemplate {
  source: string;
  segments: Segment[];
  variables: Variable[];
  /** Custom verb after the last ":", e.g. "cancel". */
  verb: string | undefined;
}

export interface HttpBinding {
  service: DescService;
  method: DescMethod;
  httpMethod: string;
  template: PathTemplate;
  /** "" (no body), "*" (every field not bound by the path), or a top-level field name. */
  body: string;
  /** "" (the whole response message) or a top-level field name. */
  responseBody: string;
}

export class TemplateError extends Error {
  override name = "TemplateError";
}

const IDENT = /^[A-Za-z_][A-Za-z0-9_]*$/;

export function parseTemplate(source: string): PathTemplate {
  if (!source.startsWith("/")) throw new TemplateError(`template must start with "/": ${source}`);
  let rest = source.slice(1);
  let verb: string | undefined;
  // The verb is a ":" after the last "/" and outside braces.
  const lastSlash = rest.lastIndexOf("/");
  const lastClose = rest.lastIndexOf("}");
  const colon = rest.lastIndexOf(":");
  if (colon > lastSlash && colon > lastClose) {
    verb = rest.slice(colon + 1);
    rest = rest.slice(0, colon);
    if (verb === "") throw new TemplateError(`empty verb in ${source}`);
  }
  const segments: Segment[] = [];
  const variables: Variable[] = [];
  let i = 0;
  const raw = rest;
  const readSegment = (text: string): Segment => {
    if (text === "*") return { kind: "wildcard" };
    if (text === "**") return { kind: "deep" };
    if (text === "" || /[{}=]/.test(text)) throw new TemplateError(`bad segment "${text}" in ${source}`);
    return { kind: "literal", value: text };
  };
  while (i <= raw.length) {
    if (raw[i] === "{") {
      const close = raw.indexOf("}", i);
      if (close < 0) throw new TemplateError(`unclosed variable in ${source}`);
      const inner = raw.slice(i + 1, close);
      const eq = inner.indexOf("=");
      const path = eq < 0 ? inner : inner.slice(0, eq);
      const fieldPath = path.split(".");
      if (!fieldPath.every((p) => IDENT.test(p))) throw new TemplateError(`bad field path "${path}" in ${source}`);
      const sub = eq < 0 ? ["*"] : inner.slice(eq + 1).split("/");
      const start = segments.length;
      for (const s of sub) segments.push(readSegment(s));
      const deep = segments.slice(start).some((s) => s.kind === "deep");
      variables.push({ fieldPath, start, length: deep ? -1 : sub.length });
      i = close + 1;
    } else {
      let end = raw.indexOf("/", i);
      if (end < 0) end = raw.length;
      segments.push(readSegment(raw.slice(i, end)));
      i = end;
    }
    if (i >= raw.length) break;
    if (raw[i] !== "/") throw new TemplateError(`expected "/" at ${i + 1} in ${source}`);
    i++;
  }
  const deepAt = segments.findIndex((s) => s.kind === "deep");
  if (deepAt >= 0 && deepAt !== segments.length - 1)
    throw new TemplateError(`"**" must be the last segment in ${source}`);
  return { source, segments, variables, verb };
}

/** Picks a field of a message by name; proto names by default. */
export type FieldLookup = (message: DescMessage, name: string) => DescField | undefined;

const byProtoName: FieldLookup = (message, name) => message.fields.find((f) => f.name === name);

/**
 * The fields a path of names walks through (`["a", "b"]` = field b of message
 * field a), or undefined when a name matches no field: the walk descends
 * singular message fields only. Path variables, bodies and query parameters
 * all resolve through here.
 */
export function resolveFieldPath(
  message: DescMessage,
  names: readonly string[],
  lookup: FieldLookup = byProtoName,
): DescField[] | undefined {
  const path: DescField[] = [];
  let at: DescMessage | undefined = message;
  for (const name of names) {
    const field: DescField | undefined = at && lookup(at, name);
    if (!field) return undefined;
    path.push(field);
    at = field.fieldKind === "message" ? field.message : undefined;
  }
  return path;
}

function ruleBinding(service: DescService, method: DescMethod, rule: HttpRule): HttpBinding {
  const p = rule.pattern;
  let httpMethod: string;
  let path: string;
  switch (p.case) {
    case "get":
    case "put":
    case "post":
    case "delete":
    case "patch":
      httpMethod = p.case.toUpperCase();
      path = p.value;
      break;
    case "custom":
      httpMethod = p.value.kind.toUpperCase();
      path = p.value.path;
      break;
    default:
      throw new TemplateError(`${method.parent.typeName}.${method.name}: http rule without a pattern`);
  }
  const template = parseTemplate(path);
  for (const v of template.variables) {
    const f = resolveFieldPath(method.input, v.fieldPath)?.at(-1);
    if (!f || f.fieldKind !== "scalar") {
      throw new TemplateError(
        `${method.parent.typeName}.${method.name}: path variable ${v.fieldPath.join(".")} is not a scalar field of ${method.input.typeName}`,
      );
    }
  }
  if (rule.body !== "" && rule.body !== "*" && !method.input.fields.some((f) => f.name === rule.body)) {
    throw new TemplateError(
      `${method.parent.typeName}.${method.name}: body "${rule.body}" is not a field of ${method.input.typeName}`,
    );
  }
  if (rule.responseBody !== "" && !method.output.fields.some((f) => f.name === rule.responseBody)) {
    throw new TemplateError(
      `${method.parent.typeName}.${method.name}: response_body "${rule.responseBody}" is not a field of ${method.output.typeName}`,
    );
  }
  return { service, method, httpMethod, template, body: rule.body, responseBody: rule.responseBody };
}

/** Every HTTP binding (rules and their additional_bindings) of the given services, unary methods only. */
export function httpBindings(services: readonly DescService[]): HttpBinding[] {
  const out: HttpBinding[] = [];
  for (const service of services) {
    for (const method of service.methods) {
      if (!hasOption(method, http)) continue;
      if (method.methodKind !== "unary") {
        throw new TemplateError(`${service.typeName}.${method.name}: only unary methods can have http rules`);
      }
      const rule = getOption(method, http);
      out.push(ruleBinding(service, method, rule));
      for (const extra of rule.additionalBindings) out.push(ruleBinding(service, method, extra));
    }
  }
  return out;
}
