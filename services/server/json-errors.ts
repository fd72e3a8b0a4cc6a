// What a caller is told of a JSON request message that does not decode, over
// REST and over Connect, gRPC-Web and gRPC with the JSON codec alike.
// protobuf-es's errors quote what they got (a number whole, a string of up
// to 30 characters whole, an unknown key whole, an out-of-range 64-bit
// integer whole), and a request may carry a secret in any of those places.
// These errors name the field (by its JSON name, and its message), what kind
// of value it takes and what kind it got, and never quote a value or a key of
// the caller's.
//
// They are found by walking the JSON against the message's descriptor, in
// the order protobuf-es reads it. Whether a value fits its field is decided
// by protobuf-es itself, reading that one value on its own, so the walk
// agrees with the decoding it explains; only the words are skiff's. Where the
// walk finds nothing, the answer names what protobuf-es's error names (a
// field of a descriptor, never a value), or only the message.
import {
  fromJson,
  fromJsonString,
  ScalarType,
  type DescEnum,
  type DescField,
  type DescMessage,
  type DescOneof,
  type JsonObject,
  type JsonValue,
} from "@bufbuild/protobuf";
import { isFieldError } from "@bufbuild/protobuf/reflect";
import { isWrapperDesc } from "@bufbuild/protobuf/wkt";
import { editDistance } from "../config/index.js";
import { jsonKind, malformedJson, notAnObject } from "./rest/errors.js";

/** How deep messages may nest in JSON: protobuf-es's default, which Connect keeps. */
const RECURSION_LIMIT = 100;

const PREFIX = "invalid JSON body: ";

/**
 * Why `json` does not decode as `desc` (protobuf-es's fromJson with these
 * options threw `cause`), in words that quote nothing the caller sent.
 */
export function jsonDecodeError(
  desc: DescMessage,
  json: JsonValue,
  ignoreUnknownFields: boolean,
  cause?: unknown,
  names: FieldNames = "json",
): string {
  const walk = new Walk(ignoreUnknownFields);
  return PREFIX + (walk.message(desc, json, { path: "", depth: 1, names }) ?? fallback(desc, cause, names));
}

/**
 * How the caller names fields, and so how messages name them: REST's JSON by their proto names
 * (`expires_at`, README "One port, three protocols"), Connect's by their JSON names (`expiresAt`).
 * protobuf-es reads either.
 */
export type FieldNames = "json" | "proto";
const nameOf = (field: DescField, names: FieldNames) => (names === "proto" ? field.name : field.jsonName);

/**
 * Why a JSON text does not decode as `desc` with protobuf-es's
 * fromJsonString (which also refuses an object with the same key twice),
 * which threw `cause`: not JSON, not an object, or what jsonDecodeError says.
 */
export function jsonTextDecodeError(
  desc: DescMessage,
  text: string,
  ignoreUnknownFields: boolean,
  cause?: unknown,
): string {
  let json: JsonValue;
  try {
    json = JSON.parse(text) as JsonValue;
  } catch (err) {
    return malformedJson(err);
  }
  const wrong = notAnObject(json);
  if (wrong !== undefined) return wrong;
  try {
    fromJson(desc, json, { ignoreUnknownFields });
  } catch (err) {
    return jsonDecodeError(desc, json, ignoreUnknownFields, err);
  }
  // JSON.parse keeps the last of a key given twice; fromJsonString refuses it (and quotes the key).
  try {
    fromJsonString(desc, text, { ignoreUnknownFields });
  } catch {
    return `${PREFIX}an object in it has the same key twice`;
  }
  return PREFIX + fallback(desc, cause, "json");
}

/** Where the walk is: the JSON path to the value (JSON names, `[i]` for an item, `[*]` for a map's value), and how many messages deep. */
interface Place {
  path: string;
  depth: number;
  /** The field that holds the value, and its message; none for the body itself. */
  field?: DescField;
  /** The field's name as the body wrote it (its proto or its JSON name: nothing else finds it). */
  key?: string;
  /** How to name fields the body did not write (a list of them, a near miss). */
  names: FieldNames;
}

class Walk {
  constructor(private readonly ignoreUnknownFields: boolean) {}

  /** What is wrong with `json` as a `desc` message, or undefined where nothing is found. */
  message(desc: DescMessage, json: JsonValue, at: Place): string | undefined {
    if (at.depth > RECURSION_LIMIT) return `${where(at)}: messages nested more than ${RECURSION_LIMIT} deep`;
    if (hasCustomJson(desc)) return this.wellKnown(desc, json, at);
    if (!isObject(json)) return `${where(at)}: expected ${expected(desc)}, got ${jsonKind(json)}`;
    const byKey = fieldsByJsonKey(desc);
    const seen = new Set<DescField>();
    const oneofs = new Map<DescOneof, DescField>();
    for (const key of Object.keys(json)) {
      const value = json[key];
      const field = byKey.get(key);
      if (field === undefined) {
        if (this.ignoreUnknownFields) continue;
        return unknownKey(desc, key, at);
      }
      const here: Place = { path: join(at.path, key), depth: at.depth, field, key, names: at.names };
      if (seen.has(field))
        return `${where(here)}: given twice, by its JSON name ("${field.jsonName}") and its proto name ("${field.name}")`;
      seen.add(field);
      if (field.oneof !== undefined && !(field.fieldKind === "scalar" && value === null)) {
        const other = oneofs.get(field.oneof);
        if (other !== undefined)
          return `fields "${nameOf(other, at.names)}" and "${nameOf(field, at.names)}" of ${desc.typeName} are both set, and only one of oneof "${field.oneof.name}" may be`;
        oneofs.set(field.oneof, field);
      }
      const wrong = this.field(desc, field, key, value, here);
      if (wrong !== undefined) return wrong;
    }
    return undefined;
  }

  /** A message with a JSON form of its own (Timestamp, Duration, Struct, wrappers...): protobuf-es reads it whole. */
  private wellKnown(desc: DescMessage, json: JsonValue, at: Place): string | undefined {
    try {
      // Counted from this message, as the whole decoding counts it.
      fromJson(desc, json, {
        ignoreUnknownFields: this.ignoreUnknownFields,
        recursionLimit: RECURSION_LIMIT - at.depth + 1,
      });
      return undefined;
    } catch (err) {
      if (err instanceof Error && /maximum recursion depth/.test(err.message))
        return `${where(at)}: messages nested more than ${RECURSION_LIMIT} deep`;
      return `${where(at)}: expected ${expected(desc)}, got ${got(desc, json)}`;
    }
  }

  private field(parent: DescMessage, field: DescField, key: string, value: JsonValue, at: Place): string | undefined {
    switch (field.fieldKind) {
      case "message":
        if (value === null && field.message.typeName !== "google.protobuf.Value") return undefined;
        return this.message(field.message, value, { ...at, depth: at.depth + 1 });
      case "scalar":
      case "enum":
        if (this.reads(parent, key, value)) return undefined;
        return `${where(at)}: expected ${expectedOf(field)}, got ${got(field, value)}`;
      case "list":
        return this.list(parent, field, key, value, at);
      case "map":
        return this.map(parent, field, key, value, at);
    }
  }

  private list(
    parent: DescMessage,
    field: DescField & { fieldKind: "list" },
    key: string,
    value: JsonValue,
    at: Place,
  ): string | undefined {
    if (value === null) return undefined;
    if (!Array.isArray(value)) return `${where(at)}: expected ${expectedOf(field)}, got ${jsonKind(value)}`;
    const item = (i: number) => ({ ...at, path: `${at.path}[${i}]` });
    if (field.listKind !== "message") {
      const i = firstRefused(value.length, (from, to) => !this.reads(parent, key, value.slice(from, to)));
      if (i === undefined || i === "apart") return undefined;
      return `${where(item(i))}: expected ${expectedItem(field)}, got ${got(field, value[i])}`;
    }
    for (let i = 0; i < value.length; i++) {
      const wrong = this.messageItem(field.message, value[i], { ...item(i), depth: at.depth + 1 });
      if (wrong !== undefined) return wrong;
    }
    return undefined;
  }

  /** A message that is a list's item or a map's value, where null is refused (but as a google.protobuf.Value). */
  private messageItem(desc: DescMessage, value: JsonValue, at: Place): string | undefined {
    if (value === null && desc.typeName !== "google.protobuf.Value")
      return `${where(at)}: expected ${expected(desc)}, got null`;
    return this.message(desc, value, at);
  }

  private map(
    parent: DescMessage,
    field: DescField & { fieldKind: "map" },
    key: string,
    value: JsonValue,
    at: Place,
  ): string | undefined {
    if (value === null) return undefined;
    if (!isObject(value)) return `${where(at)}: expected ${expectedOf(field)}, got ${jsonKind(value)}`;
    const here = { ...at, path: `${at.path}[*]` };
    const twice = `${where(at)}: the same key is given twice, written two ways`;
    const badKey = `${where(at)}: expected each key to be ${keyKind(field.mapKey)}, got a key that is not one`;
    const keyRead = (k: string) => this.reads(parent, key, { [k]: goodValue(field) });
    const entries = Object.entries(value);
    if (field.mapKind === "message") {
      for (const [k, v] of entries) {
        const wrong = this.messageItem(field.message, v, { ...here, depth: at.depth + 1 });
        if (wrong !== undefined) return wrong;
        if (field.mapKey !== ScalarType.STRING && !keyRead(k)) return badKey;
      }
      return field.mapKey !== ScalarType.STRING && !this.reads(parent, key, value) ? twice : undefined;
    }
    const i = firstRefused(
      entries.length,
      (from, to) => !this.reads(parent, key, Object.fromEntries(entries.slice(from, to))),
    );
    if (i === undefined) return undefined;
    if (i === "apart") return twice;
    const [k, v] = entries[i];
    if (!this.reads(parent, key, { [GOOD_KEYS[field.mapKey] ?? "0"]: v }))
      return `${where(here)}: expected ${expectedItem(field)}, got ${got(field, v)}`;
    return keyRead(k) ? twice : badKey;
  }

  /** Whether protobuf-es reads `value` into the field of `parent` that `key` names, on its own. */
  private reads(parent: DescMessage, key: string, value: JsonValue): boolean {
    try {
      fromJson(parent, { [key]: value }, { ignoreUnknownFields: this.ignoreUnknownFields });
      return true;
    } catch {
      return false;
    }
  }
}

/**
 * The first of `n` items (a list's, a map's entries) that protobuf-es refuses,
 * found by halves, each read whole: a read per item would cost far more than
 * the decoding it explains. `refused(from, to)` reads items from..to-1.
 * "apart" when every part reads and the whole does not (a map key given
 * twice, written two ways, one in each half).
 */
function firstRefused(n: number, refused: (from: number, to: number) => boolean): number | "apart" | undefined {
  if (n === 0 || !refused(0, n)) return undefined;
  let from = 0;
  let to = n;
  while (to - from > 1) {
    const mid = (from + to) >>> 1;
    if (refused(from, mid)) to = mid;
    else if (refused(mid, to)) from = mid;
    else return "apart";
  }
  return from;
}

/** A value that a map field takes. */
function goodValue(field: DescField & { fieldKind: "map" }): JsonValue {
  if (field.mapKind === "enum") return field.enum.values[0].number;
  if (field.mapKind === "message") return {};
  switch (field.scalar) {
    case ScalarType.STRING:
    case ScalarType.BYTES:
      return "";
    case ScalarType.BOOL:
      return false;
    default:
      return 0;
  }
}

/** What protobuf-es's error names, where the walk found nothing: a field or a oneof of a descriptor, never a value. */
function fallback(desc: DescMessage, cause: unknown, names: FieldNames): string {
  const fieldError = cause instanceof Error && isFieldError(cause.cause) ? cause.cause : undefined;
  const named = fieldError?.field();
  if (named?.kind === "field")
    return `field "${nameOf(named, names)}" of ${named.parent.typeName}: its value is not one the field takes`;
  if (named?.kind === "oneof") return `oneof "${named.name}" of ${named.parent.typeName}: it is set more than once`;
  return `it does not decode as ${desc.typeName}`;
}

function where(at: Place): string {
  if (at.field === undefined) return at.path === "" ? "the body" : `at ${at.path}`;
  const name = at.key ?? nameOf(at.field, at.names);
  const field = `field "${name}" of ${at.field.parent.typeName}`;
  return at.path === name ? field : `${field}, at ${at.path}`;
}

function join(path: string, name: string): string {
  return path === "" ? name : `${path}.${name}`;
}

function isObject(json: JsonValue): json is JsonObject {
  return typeof json === "object" && json !== null && !Array.isArray(json);
}

const byJsonKey = new WeakMap<DescMessage, Map<string, DescField>>();

/** The field each key names, by proto name and JSON name, as protobuf-es looks them up (a later field's names win). */
function fieldsByJsonKey(desc: DescMessage): Map<string, DescField> {
  let fields = byJsonKey.get(desc);
  if (fields === undefined) {
    fields = new Map();
    for (const field of desc.fields) fields.set(field.name, field).set(field.jsonName, field);
    byJsonKey.set(desc, fields);
  }
  return fields;
}

// --- unknown keys -----------------------------------------------------------

/** A fair number of names to list. */
const MAX_NAMES = 40;

/**
 * A key that is not a field, not quoted: a key is as much the caller's text as
 * a value is (a script may build an object keyed by a secret). The message's
 * field names, and the one the key is a near miss of, if any, tell a caller
 * which key is wrong.
 */
function unknownKey(desc: DescMessage, key: string, at: Place): string {
  const names = desc.fields.map((f) => nameOf(f, at.names));
  const near = nearMiss(key, desc.fields, at.names);
  const which = at.field === undefined ? "the body" : `the object at ${at.path}`;
  const listed =
    names.length === 0
      ? "it has no fields"
      : `its fields are ${names.slice(0, MAX_NAMES).join(", ")}${names.length > MAX_NAMES ? ", …" : ""}`;
  return `${which} has a key that is not a field of ${desc.typeName}${
    near === undefined ? "" : ` (did you mean "${near}"?)`
  }; ${listed}`;
}

/**
 * The JSON name of the field whose name the key is one or two edits away
 * from (case, `_` and `-` aside), if one is: a typo of a field name, which
 * says nothing of the key beyond that.
 */
function nearMiss(key: string, fields: readonly DescField[], names: FieldNames): string | undefined {
  if (key.length > 128) return undefined;
  const plain = (s: string) => s.toLowerCase().replace(/[_-]/g, "");
  const k = plain(key);
  let best: [number, string] | undefined;
  for (const field of fields) {
    const name = plain(field.jsonName);
    const d = editDistance(k, name);
    if (d <= (name.length < 6 ? 1 : 2) && (best === undefined || d < best[0])) best = [d, nameOf(field, names)];
  }
  return best?.[1];
}

// --- what a field takes -----------------------------------------------------

const WELL_KNOWN: Record<string, string> = {
  "google.protobuf.Timestamp": 'an RFC 3339 timestamp (a string such as "2025-01-02T03:04:05Z")',
  "google.protobuf.Duration": 'a duration (a string such as "1.5s")',
  "google.protobuf.FieldMask": "a field mask (a string of comma-separated lowerCamelCase paths)",
  "google.protobuf.Struct": "an object (google.protobuf.Struct)",
  "google.protobuf.ListValue": "an array (google.protobuf.ListValue)",
  "google.protobuf.Value": "any JSON value (google.protobuf.Value)",
  "google.protobuf.Any": 'an object whose "@type" names a message type known here (google.protobuf.Any)',
};

function hasCustomJson(desc: DescMessage): boolean {
  return desc.typeName in WELL_KNOWN || isWrapperDesc(desc);
}

/** What a message takes, in JSON. */
function expected(desc: DescMessage): string {
  const known = WELL_KNOWN[desc.typeName];
  if (known !== undefined) return known;
  if (isWrapperDesc(desc)) return `${SCALARS[desc.fields[0].scalar]} or null (${desc.typeName})`;
  return `an object (${desc.typeName})`;
}

const SCALARS: Record<ScalarType, string> = {
  [ScalarType.STRING]: "a string",
  [ScalarType.BOOL]: "true or false",
  [ScalarType.INT32]: "a 32-bit integer",
  [ScalarType.SINT32]: "a 32-bit integer",
  [ScalarType.SFIXED32]: "a 32-bit integer",
  [ScalarType.UINT32]: "an unsigned 32-bit integer",
  [ScalarType.FIXED32]: "an unsigned 32-bit integer",
  [ScalarType.INT64]: "a 64-bit integer (a number or a string of digits)",
  [ScalarType.SINT64]: "a 64-bit integer (a number or a string of digits)",
  [ScalarType.SFIXED64]: "a 64-bit integer (a number or a string of digits)",
  [ScalarType.UINT64]: "an unsigned 64-bit integer (a number or a string of digits)",
  [ScalarType.FIXED64]: "an unsigned 64-bit integer (a number or a string of digits)",
  [ScalarType.DOUBLE]: "a number",
  [ScalarType.FLOAT]: "a number (a 32-bit float)",
  [ScalarType.BYTES]: "a base64 string",
};

/** What a map key of a type takes (JSON writes every key as a string). */
function keyKind(type: ScalarType): string {
  switch (type) {
    case ScalarType.STRING:
      return "a string";
    case ScalarType.BOOL:
      return '"true" or "false"';
    default:
      return `${SCALARS[type].replace(/ \(.*\)$/, "")}, written as a string`;
  }
}

/** A key of each key type that protobuf-es reads. */
const GOOD_KEYS: Partial<Record<ScalarType, string>> = { [ScalarType.STRING]: "k", [ScalarType.BOOL]: "true" };

/** How many enum value names to list. */
const MAX_ENUM_NAMES = 12;

function expectedEnum(desc: DescEnum): string {
  const names = desc.values.map((v) => `"${v.name}"`);
  const shown = names.slice(0, MAX_ENUM_NAMES).join(", ") + (names.length > MAX_ENUM_NAMES ? ", …" : "");
  return `a value of ${desc.typeName} (${shown}, or its number)`;
}

/** What a field, an item of a list or a value of a map takes. */
function expectedItem(field: DescField): string {
  switch (field.fieldKind) {
    case "scalar":
      return SCALARS[field.scalar];
    case "enum":
      return expectedEnum(field.enum);
    case "message":
      return expected(field.message);
    case "list":
      return field.listKind === "scalar"
        ? SCALARS[field.scalar]
        : field.listKind === "enum"
          ? expectedEnum(field.enum)
          : expected(field.message);
    case "map":
      return field.mapKind === "scalar"
        ? SCALARS[field.scalar]
        : field.mapKind === "enum"
          ? expectedEnum(field.enum)
          : expected(field.message);
  }
}

/** What a field takes as a whole. */
function expectedOf(field: DescField): string {
  switch (field.fieldKind) {
    case "list":
      return `an array, each item ${expectedItem(field)}`;
    case "map":
      return `an object (a map: each key ${keyKind(field.mapKey)}, each value ${expectedItem(field)})`;
    default:
      return expectedItem(field);
  }
}

// --- what a field got -------------------------------------------------------

/**
 * The kind of a value that a field, or a message with a JSON form of its own,
 * refused; where the kind is one it takes, what is wrong with it, in words.
 */
function got(to: DescField | DescMessage, json: JsonValue): string {
  const kind = jsonKind(json);
  if (to.kind === "message") return gotWellKnown(to, json, kind);
  const scalar =
    to.fieldKind === "scalar" ||
    (to.fieldKind === "list" && to.listKind === "scalar") ||
    (to.fieldKind === "map" && to.mapKind === "scalar")
      ? to.scalar
      : undefined;
  if (scalar === undefined) {
    // An enum.
    if (typeof json === "string") return "a string that is not the name of one of its values";
    if (typeof json === "number")
      return Number.isInteger(json) ? "a number that is not one of its values" : "a number that is not an integer";
    return kind;
  }
  return gotScalar(scalar, json, kind);
}

function gotScalar(scalar: ScalarType, json: JsonValue, kind: string): string {
  switch (scalar) {
    case ScalarType.STRING:
      return typeof json === "string" ? "a string that is not well-formed Unicode (a lone surrogate)" : kind;
    case ScalarType.BOOL:
      return kind;
    case ScalarType.BYTES:
      return typeof json === "string" ? "a string that is not base64" : kind;
    case ScalarType.DOUBLE:
    case ScalarType.FLOAT:
      if (typeof json === "number") return "a number out of its range";
      return typeof json === "string" ? "a string that is not a number" : kind;
    default:
      // The integers.
      if (typeof json === "number")
        return Number.isInteger(json) ? "a number out of its range" : "a number that is not an integer";
      return typeof json === "string" ? "a string that is not an integer in its range" : kind;
  }
}

function gotWellKnown(desc: DescMessage, json: JsonValue, kind: string): string {
  if (isWrapperDesc(desc)) return gotScalar(desc.fields[0].scalar, json, kind);
  switch (desc.typeName) {
    case "google.protobuf.Timestamp":
      return typeof json === "string" ? "a string that is not an RFC 3339 timestamp from year 1 to 9999" : kind;
    case "google.protobuf.Duration":
      return typeof json === "string" ? "a string that is not a duration in range" : kind;
    case "google.protobuf.FieldMask":
      return typeof json === "string" ? "a string with a path that is not lowerCamelCase" : kind;
    case "google.protobuf.Any":
      return isObject(json) ? 'an object whose "@type" is missing or names no message type known here' : kind;
    default:
      return kind;
  }
}
