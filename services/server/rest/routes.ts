// The transcoder's route table: the path templates of every google.api.http
// binding compiled once into a segment tree, so matching a request walks the
// path once instead of trying each template (this is the hot path of
// `POST /v4/{project_id}/{app_name}/{path=**}`).
//
// Literal segments are compared with the raw (still percent-encoded) request
// segments; variables are decoded after the match. A `*` variable needs a
// non-empty segment; `**` takes the remaining segments, zero or more, empty
// ones included. Dot segments (`.`, `..`) are not resolved: they are values
// like any other, so a path can never be turned into another route's path.
import type { HttpBinding, Variable } from "./http-rules.js";
import { invalidArgument } from "./errors.js";

export interface RouteMatch<R> {
  route: R;
  /** The raw request segments the template matched, verb removed. */
  segments: readonly string[];
}

interface Node<R> {
  literals: Map<string, Node<R>>;
  wildcard: Node<R> | undefined;
  /** Routes whose template ends at this node. */
  ends: Entry<R>[];
  /** Routes whose template ends with `**` at this node. */
  deep: Entry<R>[];
}

interface Entry<R> {
  verb: string | undefined;
  route: R;
}

function node<R>(): Node<R> {
  return { literals: new Map(), wildcard: undefined, ends: [], deep: [] };
}

export class RouteTable<R extends { binding: HttpBinding }> {
  private readonly root = node<R>();

  constructor(routes: readonly R[]) {
    for (const route of routes) this.insert(route);
  }

  private insert(route: R): void {
    const { segments, verb } = route.binding.template;
    let at = this.root;
    for (const segment of segments) {
      if (segment.kind === "deep") {
        at.deep.push({ verb, route });
        return;
      }
      if (segment.kind === "wildcard") {
        at = at.wildcard ??= node();
      } else {
        let next = at.literals.get(segment.value);
        if (!next) at.literals.set(segment.value, (next = node()));
        at = next;
      }
    }
    at.ends.push({ verb, route });
  }

  /**
   * Every route whose template matches the raw path (no query), best first:
   * a custom verb before a plain match of the same path (so
   * `/runs/{run_id}:cancel` wins over `/runs/{run_id}` with run_id "x:cancel"),
   * then literal segments before variables, and `**` last.
   */
  match(path: string): RouteMatch<R>[] {
    const out: RouteMatch<R>[] = [];
    if (!path.startsWith("/")) return out;
    const segments = path.slice(1).split("/");
    const last = segments[segments.length - 1];
    const colon = last.lastIndexOf(":");
    if (colon >= 0) {
      const stripped = [...segments.slice(0, -1), last.slice(0, colon)];
      walk(this.root, stripped, 0, last.slice(colon + 1), out);
    }
    walk(this.root, segments, 0, undefined, out);
    return out;
  }
}

function walk<R>(
  at: Node<R>,
  segments: readonly string[],
  i: number,
  verb: string | undefined,
  out: RouteMatch<R>[],
): void {
  if (i === segments.length) {
    for (const e of at.ends) if (e.verb === verb) out.push({ route: e.route, segments });
  } else {
    const literal = at.literals.get(segments[i]);
    if (literal) walk(literal, segments, i + 1, verb, out);
    if (at.wildcard && segments[i] !== "") walk(at.wildcard, segments, i + 1, verb, out);
  }
  for (const e of at.deep) if (e.verb === verb) out.push({ route: e.route, segments });
}

/**
 * The decoded value of a path variable. A one-segment variable is fully
 * percent-decoded; a multi-segment one is decoded segment by segment with
 * "/" kept as separator and "%2F" kept encoded, as google.api.http
 * specifies, so the segments of the value stay those of the request.
 */
export function variableValue(variable: Variable, segments: readonly string[]): string {
  const end = variable.length < 0 ? segments.length : variable.start + variable.length;
  const parts = segments.slice(variable.start, end);
  const name = variable.fieldPath.join(".");
  if (parts.length === 1 && variable.length === 1) return decode(parts[0], name);
  return parts
    .map((part) =>
      part
        .split(/(%2F)/i)
        .map((piece, k) => (k % 2 === 1 ? piece : decode(piece, name)))
        .join(""),
    )
    .join("/");
}

/** A path variable's text as the request wrote it, percent-encoding and all. */
export function rawVariableValue(variable: Variable, segments: readonly string[]): string {
  const end = variable.length < 0 ? segments.length : variable.start + variable.length;
  return segments.slice(variable.start, end).join("/");
}

function decode(text: string, name: string): string {
  if (!text.includes("%")) return text;
  try {
    return decodeURIComponent(text);
  } catch {
    throw invalidArgument(`path variable "${name}": invalid percent-encoding`);
  }
}
