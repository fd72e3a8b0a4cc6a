// Sets request message fields from the text of a path variable or a query
// parameter. protobuf-es's fromJson would read "20" into an int field but
// not "true" into a bool, so text is converted here, by the field's type,
// with an error that names the parameter.
import { fromJson, ScalarType, type DescEnum, type DescField, type DescMessage } from "@bufbuild/protobuf";
import { reflect, type ReflectList, type ReflectMessage, type ScalarValue } from "@bufbuild/protobuf/reflect";
import { base64Decode } from "@bufbuild/protobuf/wire";
import { invalidArgument } from "./errors.js";
import { resolveFieldPath } from "./http-rules.js";

const byName = new WeakMap<DescMessage, Map<string, DescField>>();

/** The field of `message` called `name`, by proto name or JSON name (`webhook_endpoint`, `webhookEndpoint`). */
function fieldNamed(message: DescMessage, name: string): DescField | undefined {
  let names = byName.get(message);
  if (!names) {
    names = new Map();
    for (const f of message.fields) names.set(f.jsonName, f);
    // Proto names win over a JSON name that happens to equal another field's proto name.
    for (const f of message.fields) names.set(f.name, f);
    byName.set(message, names);
  }
  return names.get(name);
}

/**
 * The fields a dotted query key names (`a.b` = field b of message field a),
 * by proto or JSON names, or undefined when it names none.
 */
export function resolveDotted(message: DescMessage, key: string): DescField[] | undefined {
  return resolveFieldPath(message, key.split("."), fieldNamed);
}

/**
 * Sets the field at the end of `path` from `text`, creating the messages on
 * the way. A repeated field gets one more item per call; a singular field
 * takes the last value. `what` names the source in errors.
 */
export function setFromText(root: ReflectMessage, path: readonly DescField[], text: string, what: string): void {
  let at = root;
  for (const field of path.slice(0, -1)) {
    if (!at.isSet(field)) at.set(field, at.get(field));
    at = at.get(field) as ReflectMessage;
  }
  const field = path[path.length - 1];
  switch (field.fieldKind) {
    case "scalar":
      at.set(field, scalarFromText(field.scalar, text, what));
      return;
    case "enum":
      at.set(field, enumFromText(field.enum, text, what));
      return;
    case "message":
      at.set(field, messageFromText(field.message, text, what));
      return;
    case "list":
      if (field.listKind === "message") break;
      (at.get(field) as ReflectList).add(
        field.listKind === "scalar" ? scalarFromText(field.scalar, text, what) : enumFromText(field.enum, text, what),
      );
      return;
    case "map":
      break;
  }
  throw invalidArgument(`${what}: field ${field.name} cannot be set from text`);
}

/** Messages with a JSON string form (Timestamp, Duration, FieldMask, Value, ...) read from the text as a JSON string. */
function messageFromText(desc: DescMessage, text: string, what: string): ReflectMessage {
  try {
    return reflect(desc, fromJson(desc, text));
  } catch (e) {
    throw invalidArgument(`${what}: ${reason(e)}`);
  }
}

const INTEGER = /^[-+]?[0-9]+$/;
const FLOAT = /^[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$/;
const FLOAT_SPECIAL = new Map([
  ["NaN", NaN],
  ["Infinity", Infinity],
  ["-Infinity", -Infinity],
]);
const FLOAT32_MAX = 3.4028234663852886e38;
const BASE64 = /^[A-Za-z0-9+/\-_]*={0,2}$/;

const INT_RANGES: Partial<Record<ScalarType, readonly [bigint, bigint, string]>> = {
  [ScalarType.INT32]: [-(2n ** 31n), 2n ** 31n - 1n, "a 32-bit integer"],
  [ScalarType.SINT32]: [-(2n ** 31n), 2n ** 31n - 1n, "a 32-bit integer"],
  [ScalarType.SFIXED32]: [-(2n ** 31n), 2n ** 31n - 1n, "a 32-bit integer"],
  [ScalarType.UINT32]: [0n, 2n ** 32n - 1n, "an unsigned 32-bit integer"],
  [ScalarType.FIXED32]: [0n, 2n ** 32n - 1n, "an unsigned 32-bit integer"],
  [ScalarType.INT64]: [-(2n ** 63n), 2n ** 63n - 1n, "a 64-bit integer"],
  [ScalarType.SINT64]: [-(2n ** 63n), 2n ** 63n - 1n, "a 64-bit integer"],
  [ScalarType.SFIXED64]: [-(2n ** 63n), 2n ** 63n - 1n, "a 64-bit integer"],
  [ScalarType.UINT64]: [0n, 2n ** 64n - 1n, "an unsigned 64-bit integer"],
  [ScalarType.FIXED64]: [0n, 2n ** 64n - 1n, "an unsigned 64-bit integer"],
};

const IS_64 = new Set([
  ScalarType.INT64,
  ScalarType.SINT64,
  ScalarType.SFIXED64,
  ScalarType.UINT64,
  ScalarType.FIXED64,
]);

/** The value of a scalar field read from text; 64-bit integers as bigint (what reflect's set() expects). */
export function scalarFromText(type: ScalarType, text: string, what: string): ScalarValue {
  switch (type) {
    case ScalarType.STRING:
      return text;
    case ScalarType.BOOL:
      if (text === "true" || text === "1") return true;
      if (text === "false" || text === "0") return false;
      throw invalidArgument(`${what}: expected true, false, 1 or 0, got ${quote(text)}`);
    case ScalarType.DOUBLE:
    case ScalarType.FLOAT:
      return floatFromText(type, text, what);
    case ScalarType.BYTES:
      return bytesFromText(text, what);
    default:
      return integerFromText(type, text, what);
  }
}

function integerFromText(type: ScalarType, text: string, what: string): ScalarValue {
  const [min, max, expected] = INT_RANGES[type]!;
  const value = INTEGER.test(text) ? BigInt(text) : undefined;
  if (value === undefined || value < min || value > max)
    throw invalidArgument(`${what}: expected ${expected}, got ${quote(text)}`);
  return IS_64.has(type) ? value : Number(value);
}

function floatFromText(type: ScalarType, text: string, what: string): number {
  const special = FLOAT_SPECIAL.get(text);
  if (special !== undefined) return special;
  const value = FLOAT.test(text) ? Number(text) : NaN;
  const limit = type === ScalarType.FLOAT ? FLOAT32_MAX : Number.MAX_VALUE;
  // A finite number written too large for the type is an error, not Infinity.
  if (!(Math.abs(value) <= limit)) throw invalidArgument(`${what}: expected a number, got ${quote(text)}`);
  return value;
}

/**
 * Standard or URL-safe base64, padded or not. A query string turns "+" into
 * a space; a space is never base64, so it is read back as "+".
 */
function bytesFromText(text: string, what: string): Uint8Array {
  const b64 = text.replaceAll(" ", "+");
  if (!BASE64.test(b64) || b64.replace(/=+$/, "").length % 4 === 1)
    throw invalidArgument(`${what}: expected base64, got ${quote(text)}`);
  return base64Decode(b64);
}

/** An enum value by name, or by number (any int32 for an open enum, a declared one for a closed enum). */
function enumFromText(desc: DescEnum, text: string, what: string): number {
  const named = desc.values.find((v) => v.name === text);
  if (named) return named.number;
  if (INTEGER.test(text)) {
    const n = Number(text);
    const known = desc.values.some((v) => v.number === n);
    if (Number.isInteger(n) && n >= -(2 ** 31) && n < 2 ** 31 && (desc.open || known)) return n;
  }
  throw invalidArgument(`${what}: expected one of ${desc.values.map((v) => v.name).join(", ")}, got ${quote(text)}`);
}

function quote(text: string): string {
  return JSON.stringify(text.length > 64 ? `${text.slice(0, 64)}...` : text);
}

function reason(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}
