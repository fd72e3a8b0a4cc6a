// A secret value sent to skiff never comes back in an error answer and
// never reaches skiff's log, whatever is wrong with the request, on every
// protocol the port speaks: REST, Connect unary (JSON and binary, POST and
// GET), gRPC-Web and gRPC (HTTP/2) with the +json and the binary codecs,
// compressed bodies, other charsets, BOMs, bodies over the limit, duplicate
// keys, and the value in a place or of a JSON type the message does not
// take. A request message that does not decode is refused with the field (its
// JSON name and its message), the kind of value it takes and the kind it got,
// or, for a key that is no field, the fields there are: never a value or a key
// of the caller's. In process, every kind of field (scalars, enums open and
// closed, bytes, messages, lists, maps, oneofs, well-known types, nested)
// gets wrong values of every JSON type; over the port, real skiff (the
// invocation and management roles) gets raw requests.
import http2 from "node:http2";
import { gzipSync } from "node:zlib";
import {
  create,
  createFileRegistry,
  fromJson,
  type DescMessage,
  type JsonObject,
  type JsonValue,
} from "@bufbuild/protobuf";
import {
  FieldDescriptorProto_Label as Label,
  FieldDescriptorProto_Type as Type,
  FieldDescriptorProtoSchema,
  FieldOptionsSchema,
  FileDescriptorProtoSchema,
  file_google_protobuf_any,
  file_google_protobuf_duration,
  file_google_protobuf_field_mask,
  file_google_protobuf_struct,
  file_google_protobuf_timestamp,
  file_google_protobuf_wrappers,
  UninterpretedOptionSchema,
} from "@bufbuild/protobuf/wkt";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { RunRequestSchema } from "../../gen/skiff/invocation/v4/invocation_pb.js";
import {
  CancelRunRequestSchema,
  CreateProjectRequestSchema,
  CreateServiceAccountRequestSchema,
  DeployAppRequestSchema,
  ListRunsRequestSchema,
  SetSecretRequestSchema,
} from "../../gen/skiff/management/v2/management_pb.js";
import { jsonDecodeError, jsonTextDecodeError } from "../../services/server/json-errors.js";
import { capturingLogger } from "../helpers/logs.js";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";

/** A value as a secret store holds them. */
const VALUE = "sk_live_8c1e4b2a7f9d03e5_target";
/** A secret that is a number (a PIN, an account number): a script may well send it unquoted. */
const NUMERIC = "830417295561";
const PROCEDURE = "/skiff.management.v2.ManagementService/SetSecret";
const REST_PATH = "/v2/projects/p-json/secrets/PROBE";

/** Whether a text holds any of the secrets, or a recognisable part of one. */
const leaks = (text: string) =>
  [VALUE.slice(0, 10), VALUE.slice(-10), NUMERIC, NUMERIC.slice(0, 9), NUMERIC.slice(-9)].some((part) =>
    text.includes(part),
  );

/** Percent-decoded where it can be (gRPC's grpc-message), else as it is. */
function decoded(text: string): string {
  try {
    return decodeURIComponent(text);
  } catch {
    return text;
  }
}

/** Everything an answer says: status, headers and trailers (decoded), body (as latin1, so no byte is lost). */
interface Seen {
  status: number;
  text: string;
}

function frame(payload: Uint8Array | string, flags = 0): Buffer {
  const data = typeof payload === "string" ? Buffer.from(payload) : Buffer.from(payload);
  const out = Buffer.alloc(5 + data.length);
  out[0] = flags;
  out.writeUInt32BE(data.length, 1);
  data.copy(out, 5);
  return out;
}

/** The protobuf encoding of a length-delimited field. */
function lengthDelimited(field: number, bytes: Uint8Array): Buffer {
  const len: number[] = [];
  let n = bytes.length;
  do {
    let b = n & 0x7f;
    n >>>= 7;
    if (n) b |= 0x80;
    len.push(b);
  } while (n);
  return Buffer.concat([Buffer.from([(field << 3) | 2, ...len]), Buffer.from(bytes)]);
}

/** A secret short enough that protobuf-es would quote it whole (30 characters or fewer). */
const SHORT = VALUE.slice(0, 24);

/** Wrong values of every JSON type, each carrying a secret, or of a kind that cannot carry one (booleans, null in a list). */
const WRONG: JsonValue[] = [
  Number(NUMERIC),
  -Number(NUMERIC),
  Number(NUMERIC) + 0.5,
  SHORT,
  VALUE,
  NUMERIC,
  `${SHORT}\ud800`,
  [SHORT],
  [Number(NUMERIC)],
  [[SHORT]],
  [null],
  { k: SHORT },
  { [SHORT]: 1 },
  { [NUMERIC]: SHORT },
  true,
  false,
];

/** The ways an error may describe a value: its kind, never the value. */
const KIND =
  /got (a string|a number|an array|an object|a boolean|null)\b|has a key that is not a field of|given twice|are both set|got a key that is not one/;

/** protobuf-es's own phrases, and what is said where the walk found nothing: none may be answered. */
const NOT_OURS = /from JSON|does not decode as|is not one the field takes|Array\(|Uint8Array|ReflectMessage/;

/** A proto3 message with a field of every kind, built as protoc would describe it. */
function probeMessage(): DescMessage {
  const camel = (name: string) => name.replace(/_([a-z])/g, (_, c: string) => c.toUpperCase());
  let number = 0;
  const field = (
    name: string,
    type: Type,
    more: { typeName?: string; repeated?: boolean; oneofIndex?: number } = {},
  ) => ({
    name,
    jsonName: camel(name),
    number: ++number,
    type,
    label: more.repeated ? Label.REPEATED : Label.OPTIONAL,
    typeName: more.typeName,
    oneofIndex: more.oneofIndex,
  });
  const entry = (name: string, key: Type, value: Type, typeName?: string) => ({
    name,
    field: [
      { name: "key", jsonName: "key", number: 1, type: key, label: Label.OPTIONAL },
      { name: "value", jsonName: "value", number: 2, type: value, label: Label.OPTIONAL, typeName },
    ],
    options: { mapEntry: true },
  });
  const file = create(FileDescriptorProtoSchema, {
    name: "skiff/test/probe.proto",
    package: "skiff.test",
    syntax: "proto3",
    dependency: [
      "google/protobuf/any.proto",
      "google/protobuf/duration.proto",
      "google/protobuf/field_mask.proto",
      "google/protobuf/struct.proto",
      "google/protobuf/timestamp.proto",
      "google/protobuf/wrappers.proto",
    ],
    enumType: [
      {
        name: "Color",
        value: [
          { name: "COLOR_UNSPECIFIED", number: 0 },
          { name: "RED", number: 1 },
        ],
      },
    ],
    messageType: [
      {
        name: "Probe",
        field: [
          field("text", Type.STRING),
          field("int32_value", Type.INT32),
          field("uint32_value", Type.UINT32),
          field("int64_value", Type.INT64),
          field("uint64_value", Type.UINT64),
          field("double_value", Type.DOUBLE),
          field("float_value", Type.FLOAT),
          field("flag", Type.BOOL),
          field("data", Type.BYTES),
          field("color", Type.ENUM, { typeName: ".skiff.test.Color" }),
          field("texts", Type.STRING, { repeated: true }),
          field("numbers", Type.INT32, { repeated: true }),
          field("colors", Type.ENUM, { typeName: ".skiff.test.Color", repeated: true }),
          field("child", Type.MESSAGE, { typeName: ".skiff.test.Probe" }),
          field("children", Type.MESSAGE, { typeName: ".skiff.test.Probe", repeated: true }),
          field("labels", Type.MESSAGE, { typeName: ".skiff.test.Probe.LabelsEntry", repeated: true }),
          field("by_number", Type.MESSAGE, { typeName: ".skiff.test.Probe.ByNumberEntry", repeated: true }),
          field("by_flag", Type.MESSAGE, { typeName: ".skiff.test.Probe.ByFlagEntry", repeated: true }),
          field("time", Type.MESSAGE, { typeName: ".google.protobuf.Timestamp" }),
          field("duration", Type.MESSAGE, { typeName: ".google.protobuf.Duration" }),
          field("mask", Type.MESSAGE, { typeName: ".google.protobuf.FieldMask" }),
          field("struct", Type.MESSAGE, { typeName: ".google.protobuf.Struct" }),
          field("value", Type.MESSAGE, { typeName: ".google.protobuf.Value" }),
          field("list", Type.MESSAGE, { typeName: ".google.protobuf.ListValue" }),
          field("wrapped", Type.MESSAGE, { typeName: ".google.protobuf.Int64Value" }),
          field("any", Type.MESSAGE, { typeName: ".google.protobuf.Any" }),
          field("one_text", Type.STRING, { oneofIndex: 0 }),
          field("one_child", Type.MESSAGE, { typeName: ".skiff.test.Probe", oneofIndex: 0 }),
        ],
        nestedType: [
          entry("LabelsEntry", Type.STRING, Type.STRING),
          entry("ByNumberEntry", Type.INT32, Type.MESSAGE, ".skiff.test.Probe"),
          entry("ByFlagEntry", Type.BOOL, Type.ENUM, ".skiff.test.Color"),
        ],
        oneofDecl: [{ name: "choice" }],
      },
    ],
  });
  const deps = [
    file_google_protobuf_any,
    file_google_protobuf_duration,
    file_google_protobuf_field_mask,
    file_google_protobuf_struct,
    file_google_protobuf_timestamp,
    file_google_protobuf_wrappers,
  ];
  return createFileRegistry(file, (name) => deps.find((d) => d.name === name.replace(/\.proto$/, ""))).getMessage(
    "skiff.test.Probe",
  )!;
}

describe("decode errors name the field and the kinds, never a value (in process)", () => {
  const PROBE = probeMessage();
  /** Request messages of the proto2 and proto3 kinds: closed enums, 64-bit integers, nested lists, skiff's own. */
  const MESSAGES: DescMessage[] = [
    PROBE,
    FieldDescriptorProtoSchema,
    FieldOptionsSchema,
    UninterpretedOptionSchema,
    SetSecretRequestSchema,
    CreateServiceAccountRequestSchema,
    DeployAppRequestSchema,
    ListRunsRequestSchema,
    RunRequestSchema,
  ];

  /** Ways to put a value in a field of the probe at some depth: at the top, in a child, a list's item, a map's value, a oneof. */
  const NESTINGS: ((inner: JsonObject) => JsonObject)[] = [
    (inner) => inner,
    (inner) => ({ child: inner }),
    (inner) => ({ child: { children: [{}, inner] } }),
    (inner) => ({ byNumber: { "7": inner } }),
    (inner) => ({ oneChild: { child: inner } }),
  ];

  /** What protobuf-es refuses, and what skiff says of it; undefined where protobuf-es reads it. */
  function refusal(desc: DescMessage, json: JsonObject, ignoreUnknownFields: boolean): string | undefined {
    try {
      fromJson(desc, json, { ignoreUnknownFields });
      return undefined;
    } catch (err) {
      return jsonDecodeError(desc, json, ignoreUnknownFields, err);
    }
  }

  it("a field given a wrong value of any JSON type: named with the kinds, the value never", () => {
    let refused = 0;
    for (const desc of MESSAGES) {
      for (const field of desc.fields) {
        for (const wrong of WRONG) {
          for (const nest of desc === PROBE ? NESTINGS : NESTINGS.slice(0, 1)) {
            for (const ignoreUnknownFields of [false, true]) {
              const json = nest({ [field.jsonName]: wrong });
              const said = refusal(desc, json, ignoreUnknownFields);
              if (said === undefined) continue;
              refused++;
              const what = `${desc.typeName}: ${JSON.stringify(json)}: ${said}`;
              expect(leaks(said), what).toBe(false);
              expect(said, what).toMatch(/^invalid JSON body: /);
              expect(said, what).toMatch(KIND);
              expect(said, what).not.toMatch(NOT_OURS);
              // The field is named, or the field inside it that took the value.
              if (!/has a key that is not a field/.test(said)) expect(said, what).toMatch(/field "[A-Za-z0-9]+" of /);
            }
          }
        }
      }
    }
    // Most of them are refused: the sweep checks something.
    expect(refused).toBeGreaterThan(1000);
  });

  it("a wrong value names the field, the kind it takes and the kind it got", () => {
    expect(refusal(SetSecretRequestSchema, { value: Number(NUMERIC) }, false)).toBe(
      'invalid JSON body: field "value" of skiff.management.v2.SetSecretRequest: expected a string, got a number',
    );
    expect(refusal(PROBE, { child: { children: [{}, { texts: [SHORT, 1] }] } }, true)).toBe(
      'invalid JSON body: field "texts" of skiff.test.Probe, at child.children[1].texts[1]: expected a string, got a number',
    );
    expect(refusal(PROBE, { uint32Value: SHORT }, false)).toBe(
      'invalid JSON body: field "uint32Value" of skiff.test.Probe: expected an unsigned 32-bit integer, got a string that is not an integer in its range',
    );
    expect(refusal(PROBE, { labels: { [SHORT]: [SHORT] } }, false)).toBe(
      'invalid JSON body: field "labels" of skiff.test.Probe, at labels[*]: expected a string, got an array',
    );
    expect(refusal(PROBE, { byNumber: { [SHORT]: {} } }, false)).toBe(
      'invalid JSON body: field "byNumber" of skiff.test.Probe: expected each key to be a 32-bit integer, written as a string, got a key that is not one',
    );
    expect(refusal(PROBE, { byNumber: { "1": {}, "01": {} } }, false)).toBe(
      'invalid JSON body: field "byNumber" of skiff.test.Probe: the same key is given twice, written two ways',
    );
    expect(refusal(PROBE, { byFlag: { true: "RED", [SHORT]: "RED" } }, false)).toBe(
      'invalid JSON body: field "byFlag" of skiff.test.Probe: expected each key to be "true" or "false", got a key that is not one',
    );
    expect(refusal(PROBE, { byFlag: { false: 1, true: SHORT } }, false)).toBe(
      'invalid JSON body: field "byFlag" of skiff.test.Probe, at byFlag[*]: expected a value of skiff.test.Color ("COLOR_UNSPECIFIED", "RED", or its number), got a string that is not the name of one of its values',
    );
    expect(refusal(PROBE, { colors: [1, 0, 1.5, SHORT] }, false)).toBe(
      'invalid JSON body: field "colors" of skiff.test.Probe, at colors[2]: expected a value of skiff.test.Color ("COLOR_UNSPECIFIED", "RED", or its number), got a number that is not an integer',
    );
    expect(refusal(PROBE, { color: SHORT }, false)).toBe(
      'invalid JSON body: field "color" of skiff.test.Probe: expected a value of skiff.test.Color ("COLOR_UNSPECIFIED", "RED", or its number), got a string that is not the name of one of its values',
    );
    expect(refusal(PROBE, { time: SHORT }, false)).toBe(
      'invalid JSON body: field "time" of skiff.test.Probe: expected an RFC 3339 timestamp (a string such as "2025-01-02T03:04:05Z"), got a string that is not an RFC 3339 timestamp from year 1 to 9999',
    );
    expect(refusal(PROBE, { flag: true, data: true }, false)).toBe(
      'invalid JSON body: field "data" of skiff.test.Probe: expected a base64 string, got a boolean',
    );
    expect(refusal(UninterpretedOptionSchema, { positiveIntValue: `${NUMERIC}${NUMERIC}` }, false)).toBe(
      'invalid JSON body: field "positiveIntValue" of google.protobuf.UninterpretedOption: expected an unsigned 64-bit integer (a number or a string of digits), got a string that is not an integer in its range',
    );
    expect(refusal(PROBE, { oneText: "a", oneChild: {} }, false)).toBe(
      'invalid JSON body: fields "oneText" and "oneChild" of skiff.test.Probe are both set, and only one of oneof "choice" may be',
    );
    expect(refusal(SetSecretRequestSchema, { project_id: "a", projectId: "b" }, false)).toBe(
      'invalid JSON body: field "projectId" of skiff.management.v2.SetSecretRequest: given twice, by its JSON name ("projectId") and its proto name ("project_id")',
    );
  });

  it("a key that is not a field: not quoted, the fields listed, a near miss named", () => {
    for (const key of [VALUE, SHORT, NUMERIC, `${SHORT}_name`]) {
      for (const nest of NESTINGS) {
        const json = nest({ [key]: 1 });
        const said = refusal(PROBE, json, false);
        expect(said, JSON.stringify(json)).toMatch(
          /has a key that is not a field of skiff\.test\.Probe; its fields are text, int32Value, /,
        );
        expect(leaks(said!), said).toBe(false);
        // Connect ignores unknown keys, as the JSON mapping allows.
        expect(refusal(PROBE, json, true)).toBeUndefined();
      }
    }
    expect(refusal(SetSecretRequestSchema, { projectId: "p", nmae: "n" }, false)).toBe(
      'invalid JSON body: the body has a key that is not a field of skiff.management.v2.SetSecretRequest (did you mean "name"?); its fields are projectId, name, value',
    );
    expect(refusal(PROBE, { children: [{ Int32_Valeu: 1 }] }, false)).toBe(
      'invalid JSON body: the object at children[0] has a key that is not a field of skiff.test.Probe (did you mean "int32Value"?); its fields are text, int32Value, uint32Value, int64Value, uint64Value, doubleValue, floatValue, flag, data, color, texts, numbers, colors, child, children, labels, byNumber, byFlag, time, duration, mask, struct, value, list, wrapped, any, oneText, oneChild',
    );
  });

  it("a text: not JSON, not an object, a key twice, too deep", () => {
    expect(jsonTextDecodeError(SetSecretRequestSchema, `{"value": ${VALUE}}`, true)).toBe(
      "malformed JSON body: not valid JSON",
    );
    expect(jsonTextDecodeError(SetSecretRequestSchema, `{"value": "${VALUE}"`, true)).toBe(
      "malformed JSON body: not valid JSON (at position 43)",
    );
    expect(jsonTextDecodeError(SetSecretRequestSchema, JSON.stringify(SHORT), true)).toBe(
      "invalid JSON body: expected an object, got a string",
    );
    expect(jsonTextDecodeError(SetSecretRequestSchema, `{"${SHORT}": 1, "${SHORT}": 2}`, true)).toBe(
      "invalid JSON body: an object in it has the same key twice",
    );
    let deep: JsonValue = SHORT;
    for (let i = 0; i < 200; i++) deep = { child: deep };
    expect(refusal(PROBE, deep as JsonObject, true)).toBe(
      `invalid JSON body: field "child" of skiff.test.Probe, at ${Array(100).fill("child").join(".")}: messages nested more than 100 deep`,
    );
    let deepValue: JsonValue = [SHORT];
    for (let i = 0; i < 200; i++) deepValue = [deepValue];
    expect(refusal(PROBE, { value: deepValue }, true)).toBe(
      'invalid JSON body: field "value" of skiff.test.Probe: messages nested more than 100 deep',
    );
  });
});

describe("secret values in error answers and in the log", () => {
  let t: TestSkiff;
  const { logger, lines } = capturingLogger();

  beforeAll(async () => {
    // No sandbox: no app runs here; only the server's answers are checked.
    t = await startTestSkiff({ logger, env: { SKIFF_ROLES: "invocation,management", SKIFF_SANDBOX: "off" } });
    await t.management().createProject({ projectId: "p-json" });
  }, 120_000);
  afterAll(async () => {
    await t?.close();
  });

  const auth = () => ({ authorization: `Bearer ${t.adminToken}` });

  async function viaFetch(method: string, p: string, headers: Record<string, string>, body?: Uint8Array | string) {
    const res = await fetch(t.url + p, { method, headers: { ...auth(), ...headers }, body });
    const bytes = Buffer.from(await res.arrayBuffer());
    const head = [...res.headers].map(([k, v]) => `${k}: ${decoded(v)}`).join("\n");
    return { status: res.status, text: `${head}\n${bytes.toString("latin1")}\n${decoded(bytes.toString("latin1"))}` };
  }

  const rest = (body: Uint8Array | string, contentType = "application/json") =>
    viaFetch("PUT", REST_PATH, { "content-type": contentType }, body);
  const connect = (body: Uint8Array | string, headers: Record<string, string> = {}) =>
    viaFetch("POST", PROCEDURE, { "content-type": "application/json", ...headers }, body);
  const grpcWeb = (message: Uint8Array | string, codec: "json" | "proto", headers: Record<string, string> = {}) =>
    viaFetch(
      "POST",
      PROCEDURE,
      { "content-type": `application/grpc-web+${codec}`, "x-grpc-web": "1", ...headers },
      frame(message),
    );

  /** One gRPC call over h2c (prior knowledge) with a hand-made frame; everything it answered. */
  const grpc = (body: Buffer, codec: "json" | "proto", headers: Record<string, string> = {}) =>
    grpcTo(PROCEDURE, body, codec, headers);

  /** The same, to any procedure. */
  function grpcTo(
    procedure: string,
    body: Buffer,
    codec: "json" | "proto",
    headers: Record<string, string> = {},
  ): Promise<Seen> {
    return new Promise((resolve, reject) => {
      const session = http2.connect(t.url);
      session.on("error", reject);
      const stream = session.request({
        ":method": "POST",
        ":path": procedure,
        "content-type": `application/grpc+${codec}`,
        te: "trailers",
        ...auth(),
        ...headers,
      });
      let status = 0;
      const said: string[] = [];
      const chunks: Buffer[] = [];
      const note = (h: http2.IncomingHttpHeaders) => {
        for (const [k, v] of Object.entries(h)) said.push(`${k}: ${decoded(String(v))}`);
      };
      stream.on("response", (h) => {
        status = Number(h[":status"]);
        note(h);
      });
      stream.on("trailers", note);
      stream.on("data", (c: Buffer) => chunks.push(c));
      stream.on("error", reject);
      stream.on("close", () => {
        session.close();
        const data = Buffer.concat(chunks).toString("latin1");
        resolve({ status, text: `${said.join("\n")}\n${data}\n${decoded(data)}` });
      });
      stream.end(body);
    });
  }

  /** The error message of an answer: the JSON body's `message`, or gRPC's grpc-message (decoded). */
  function messageOf(seen: Seen): string | undefined {
    const grpcMessage = /grpc-message: ([^\r\n]*)/.exec(seen.text)?.[1];
    if (grpcMessage !== undefined) return decoded(grpcMessage);
    const body = seen.text.split("\n").find((line) => line.startsWith('{"code":'));
    return body === undefined ? undefined : (JSON.parse(body) as { message?: string }).message;
  }

  /** Whether an answer is a refusal: an HTTP error status, or a gRPC status other than OK. */
  const refused = (seen: Seen) => seen.status >= 400 || /grpc-status: [1-9]/.test(seen.text);

  const inObject = (rest: string) => `{"projectId":"p-json","name":"PROBE",${rest}}`;

  // A string field given a number: protobuf-es's message would quote the number whole.
  it("REST: a secret that is a number, sent unquoted, does not come back", async () => {
    const seen = await rest(`{"value": ${NUMERIC}}`);
    expect(refused(seen)).toBe(true);
    expect(leaks(seen.text), seen.text).toBe(false);
  });

  it("Connect (JSON): a secret that is a number, sent unquoted, does not come back", async () => {
    const seen = await connect(inObject(`"value": ${NUMERIC}`));
    expect(refused(seen)).toBe(true);
    expect(leaks(seen.text), seen.text).toBe(false);
  });

  it("Connect (JSON, gzip): a secret that is a number, sent unquoted, does not come back", async () => {
    const seen = await connect(gzipSync(inObject(`"value": ${NUMERIC}`)), { "content-encoding": "gzip" });
    expect(refused(seen)).toBe(true);
    expect(leaks(seen.text), seen.text).toBe(false);
  });

  it("gRPC-Web (+json): a secret that is a number, sent unquoted, does not come back", async () => {
    const seen = await grpcWeb(inObject(`"value": ${NUMERIC}`), "json");
    expect(refused(seen)).toBe(true);
    expect(leaks(seen.text), seen.text).toBe(false);
  });

  it("gRPC (+json, HTTP/2): a secret that is a number, sent unquoted, does not come back", async () => {
    const seen = await grpc(frame(inObject(`"value": ${NUMERIC}`)), "json");
    expect(refused(seen)).toBe(true);
    expect(leaks(seen.text), seen.text).toBe(false);
  });

  // REST decodes with unknown fields refused: protobuf-es's message would quote the unknown key whole.
  it("REST: a secret sent as a key of the body (an unknown field) does not come back", async () => {
    const seen = await rest(`{"value": "v", "${VALUE}": ""}`);
    expect(refused(seen)).toBe(true);
    expect(leaks(seen.text), seen.text).toBe(false);
  });

  /** RPCs whose request is JSON, with a body that decodes, the fields to get wrong values, and the REST route of those bound by "*". */
  const RPCS: {
    procedure: string;
    schema: DescMessage;
    base: JsonObject;
    fields: string[];
    rest?: [string, string];
  }[] = [
    {
      procedure: PROCEDURE,
      schema: SetSecretRequestSchema,
      base: { projectId: "p-json", name: "PROBE" },
      fields: ["value", "name", "projectId"],
      rest: ["PUT", REST_PATH],
    },
    {
      procedure: "/skiff.management.v2.ManagementService/CreateProject",
      schema: CreateProjectRequestSchema,
      base: {},
      fields: ["name", "projectId"],
      rest: ["POST", "/v2/projects"],
    },
    {
      procedure: "/skiff.management.v2.ManagementService/CreateServiceAccount",
      schema: CreateServiceAccountRequestSchema,
      base: { projectId: "p-json" },
      fields: ["name", "expiresAt"],
      rest: ["POST", "/v2/projects/p-json/service-accounts"],
    },
    {
      procedure: "/skiff.management.v2.ManagementService/CancelRun",
      schema: CancelRunRequestSchema,
      base: { projectId: "p-json", appName: "a" },
      fields: ["runId"],
      rest: ["POST", "/v2/projects/p-json/apps/a/runs/r-1:cancel"],
    },
    {
      procedure: "/skiff.management.v2.ManagementService/ListRuns",
      schema: ListRunsRequestSchema,
      base: { projectId: "p-json" },
      fields: ["pageSize", "asyncOnly", "status"],
    },
    {
      procedure: "/skiff.management.v2.ManagementService/DeployApp",
      schema: DeployAppRequestSchema,
      base: { projectId: "p-json" },
      fields: ["bundle", "bundle.data", "bundle.extensions"],
    },
    {
      procedure: "/skiff.invocation.v4.InvocationService/Run",
      schema: RunRequestSchema,
      base: { projectId: "p-json", appName: "a" },
      fields: ["async", "body", "body.data", "webhookEndpoint"],
    },
  ];

  /** The body with a value at a field path (`bundle.data`), and whether protobuf-es refuses it. */
  function withValue(base: JsonObject, path: string, value: JsonValue): JsonObject {
    const [head, ...rest] = path.split(".");
    return { ...base, [head]: rest.length === 0 ? value : withValue({}, rest.join("."), value) };
  }
  function refuses(schema: DescMessage, json: JsonObject, ignoreUnknownFields: boolean): boolean {
    try {
      fromJson(schema, json, { ignoreUnknownFields });
      return false;
    } catch {
      return true;
    }
  }

  it("every RPC with a JSON request, every protocol: a wrong value is refused naming its field, never quoted", async () => {
    let sent = 0;
    for (const rpc of RPCS) {
      for (const path of rpc.fields) {
        const name = path.split(".").at(-1)!;
        for (const wrong of WRONG) {
          const json = withValue(rpc.base, path, wrong);
          const body = JSON.stringify(json);
          const answers: [string, () => Promise<Seen>][] = [];
          if (refuses(rpc.schema, json, true)) {
            const post = (headers: Record<string, string>, payload: Uint8Array | string) =>
              viaFetch("POST", rpc.procedure, headers, payload);
            answers.push(
              ["Connect", () => post({ "content-type": "application/json" }, body)],
              ["gRPC-Web", () => post({ "content-type": "application/grpc-web+json", "x-grpc-web": "1" }, frame(body))],
              ["gRPC", () => grpcTo(rpc.procedure, frame(body), "json")],
            );
          }
          if (rpc.rest && refuses(rpc.schema, json, false)) {
            const [method, restPath] = rpc.rest;
            answers.push(["REST", () => viaFetch(method, restPath, { "content-type": "application/json" }, body)]);
          }
          for (const [how, send] of answers) {
            const seen = await send();
            sent++;
            const what = `${how} ${rpc.procedure} ${body}: ${seen.text.slice(0, 600)}`;
            expect(refused(seen), what).toBe(true);
            expect(leaks(seen.text), what).toBe(false);
            const message = messageOf(seen) ?? "";
            expect(message, what).toMatch(/^invalid JSON body: /);
            expect(message, what).toMatch(KIND);
            expect(message, what).toContain(`"${name}"`);
            expect(message, what).not.toMatch(NOT_OURS);
          }
        }
      }
    }
    expect(sent).toBeGreaterThan(150);
  });

  it("Connect, gRPC-Web and gRPC say what REST says of a wrong value, and of text that is not UTF-8", async () => {
    const said = messageOf;
    const body = inObject(`"value": ${NUMERIC}`);
    const expected =
      'invalid JSON body: field "value" of skiff.management.v2.SetSecretRequest: expected a string, got a number';
    expect(said(await rest(`{"value": ${NUMERIC}}`))).toBe(expected);
    expect(said(await connect(body))).toBe(expected);
    expect(said(await grpcWeb(body, "json"))).toBe(expected);
    expect(said(await grpc(frame(body), "json"))).toBe(expected);
    const notUtf8 = Buffer.concat([Buffer.from(inObject(`"value": "${SHORT}`)), Buffer.from([0xc3, 0x28, 0x22, 0x7d])]);
    const refusal = "malformed JSON body: not UTF-8 text";
    expect(said(await rest(notUtf8))).toBe(refusal);
    expect(said(await connect(notUtf8))).toBe(refusal);
    expect(said(await grpcWeb(notUtf8, "json"))).toBe(refusal);
    expect(said(await grpc(frame(notUtf8), "json"))).toBe(refusal);
  });

  it("a secret as a key given twice (Connect refuses duplicate keys) does not come back", async () => {
    const body = inObject(`"value": "v", "${SHORT}": 1, "${SHORT}": 2`);
    for (const seen of [await connect(body), await grpcWeb(body, "json"), await grpc(frame(body), "json")]) {
      expect(refused(seen), seen.text).toBe(true);
      expect(leaks(seen.text), seen.text).toBe(false);
      expect(messageOf(seen)).toBe("invalid JSON body: an object in it has the same key twice");
    }
  });

  it("a secret sent as a number never reached the log", () => {
    expect(leaks(JSON.stringify(lines))).toBe(false);
  });

  /** Bodies of a SetSecret that went wrong otherwise, each holding the value (JSON texts, as bytes). */
  const BROKEN: [string, Buffer][] = [
    ["the bare value", Buffer.from(VALUE)],
    ["a JSON string", Buffer.from(JSON.stringify(VALUE))],
    ["a short JSON string", Buffer.from(JSON.stringify(VALUE.slice(0, 24)))],
    ["a list of it", Buffer.from(JSON.stringify([VALUE]))],
    ["cut JSON", Buffer.from(inObject(`"value": "${VALUE}"`).slice(0, -1))],
    ["a trailing comma", Buffer.from(inObject(`"value": "${VALUE}",`))],
    ["single quotes", Buffer.from(inObject(`"value": '${VALUE}'`))],
    ["a value in a list", Buffer.from(inObject(`"value": ["${VALUE}"]`))],
    ["a value in an object", Buffer.from(inObject(`"value": {"k": "${VALUE}"}`))],
    ["a value as an object's key", Buffer.from(inObject(`"value": {"${VALUE}": 1}`))],
    ["a short value in a list", Buffer.from(inObject(`"value": ["${VALUE.slice(0, 24)}"]`))],
    ["a NUL in the value", Buffer.from(inObject(`"value": "${VALUE}\\u0000"`))],
    ["a raw control character in the value", Buffer.from(inObject(`"value": "${VALUE}\u0001"`))],
    ["a lone surrogate in the value", Buffer.from(inObject(`"value": "${VALUE}\\ud800"`))],
    ["the value twice", Buffer.from(inObject(`"value": "${VALUE}", "value": "${VALUE}"`))],
    ["a short value twice", Buffer.from(inObject(`"value": "${VALUE.slice(0, 24)}", "value": "x"`))],
    [
      "a short value in project_id and projectId",
      Buffer.from(`{"project_id":"${VALUE.slice(0, 20)}","projectId":"p"}`),
    ],
    ["a short value as the name", Buffer.from(inObject(`"value": "v", "name": "${VALUE.slice(0, 24)}"`))],
    ["a value over 64 KiB", Buffer.from(inObject(`"value": "${VALUE}${"x".repeat(70 * 1024)}"`))],
    ["a body over the size limit", Buffer.from(inObject(`"value": "${VALUE}${"x".repeat(11 * 1024 * 1024)}"`))],
    ["a BOM, then cut JSON", Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from(`"${VALUE}`)])],
    [
      "UTF-16 with a BOM",
      Buffer.concat([Buffer.from([0xff, 0xfe]), Buffer.from(inObject(`"value": "${VALUE}"`), "utf16le")]),
    ],
    ["latin1 bytes in the value", Buffer.from(inObject(`"value": "${VALUE}\u00e9\u00ff"`), "latin1")],
    ["a value after bytes that are not UTF-8", Buffer.concat([Buffer.from([0xc3, 0x28]), Buffer.from(VALUE)])],
    ["a deeply nested value", Buffer.from(`${"[".repeat(5000)}"${VALUE}"${"]".repeat(5000)}`)],
  ];
  const shortBroken = BROKEN.filter(([, body]) => body.length < 1024 * 1024);

  it("REST: no other broken body brings the value back", async () => {
    for (const [what, body] of BROKEN) {
      const seen = await rest(body);
      expect(leaks(seen.text), `${what}: ${seen.text.slice(0, 400)}`).toBe(false);
    }
    for (const type of ["application/json; charset=utf-16", "text/plain", "application/merge-patch+json"]) {
      const seen = await rest(JSON.stringify(VALUE), type);
      expect(leaks(seen.text), `${type}: ${seen.text.slice(0, 400)}`).toBe(false);
    }
  });

  it("Connect (JSON, plain and gzip): no other broken body brings the value back", async () => {
    for (const [what, body] of BROKEN) {
      for (const gz of [false, true]) {
        const seen = await connect(gz ? gzipSync(body) : body, gz ? { "content-encoding": "gzip" } : {});
        expect(leaks(seen.text), `${what} (gzip ${gz}): ${seen.text.slice(0, 400)}`).toBe(false);
      }
    }
    // A body that says it is gzip and is not, a charset that is not UTF-8, Connect's streaming type.
    for (const [headers, body] of [
      [{ "content-encoding": "gzip" }, Buffer.from(VALUE)],
      [{ "content-encoding": "br" }, Buffer.from(VALUE)],
      [{ "content-type": "application/json; charset=utf-16" }, Buffer.from(JSON.stringify(VALUE))],
      [{ "content-type": "application/json; charset=latin1" }, Buffer.from(JSON.stringify(VALUE))],
      [{ "content-type": "application/connect+json" }, frame(JSON.stringify(VALUE))],
      [{ "connect-protocol-version": "1" }, Buffer.from(VALUE)],
    ] as [Record<string, string>, Buffer][]) {
      const seen = await connect(body, headers);
      expect(leaks(seen.text), `${JSON.stringify(headers)}: ${seen.text.slice(0, 400)}`).toBe(false);
    }
  });

  it("Connect GET (?message=, JSON and base64): the value does not come back", async () => {
    for (const query of [
      `encoding=json&message=${encodeURIComponent(JSON.stringify(VALUE))}`,
      `encoding=json&message=${encodeURIComponent(VALUE)}`,
      `encoding=json&message=${encodeURIComponent(inObject(`"value": ${NUMERIC}`))}`,
      `encoding=json&base64=1&message=${Buffer.from(inObject(`"value": ${NUMERIC}`)).toString("base64url")}`,
      `encoding=proto&base64=1&message=${Buffer.from(VALUE).toString("base64url")}`,
      `encoding=json&compression=gzip&base64=1&message=${gzipSync(VALUE).toString("base64url")}`,
    ]) {
      const seen = await viaFetch("GET", `${PROCEDURE}?connect=v1&${query}`, {});
      expect(refused(seen), query).toBe(true);
      expect(leaks(seen.text), `${query}: ${seen.text.slice(0, 400)}`).toBe(false);
    }
  });

  it("Connect (binary): a message that does not parse does not bring the value back", async () => {
    const value = Buffer.from(VALUE);
    for (const [what, body] of [
      ["the bare value", value],
      ["bytes not UTF-8 around the value", lengthDelimited(3, Buffer.concat([value, Buffer.from([0xff, 0xfe])]))],
      ["the value cut short", lengthDelimited(3, value).subarray(0, 12)],
      ["the value under a wire type of its field's", Buffer.concat([Buffer.from([(3 << 3) | 5]), value])],
      ["the value as a group", Buffer.concat([Buffer.from([(3 << 3) | 3]), value, Buffer.from([(3 << 3) | 4])])],
      ["a length past the end", Buffer.concat([Buffer.from([(3 << 3) | 2, 0xff, 0x01]), value])],
      ["field number 0", Buffer.concat([Buffer.from([2, value.length]), value])],
    ] as [string, Buffer][]) {
      for (const gz of [false, true]) {
        const seen = await connect(gz ? gzipSync(body) : body, {
          "content-type": "application/proto",
          ...(gz ? { "content-encoding": "gzip" } : {}),
        });
        expect(leaks(seen.text), `${what}: ${seen.text.slice(0, 400)}`).toBe(false);
      }
    }
  });

  it("gRPC-Web and gRPC (JSON and binary codecs, compressed or not): no broken message brings the value back", async () => {
    const messages: [string, Buffer][] = [
      ...shortBroken,
      [
        "proto: bytes not UTF-8 around the value",
        lengthDelimited(3, Buffer.concat([Buffer.from(VALUE), Buffer.from([0xff])])),
      ],
      ["proto: a length past the end", Buffer.concat([Buffer.from([(3 << 3) | 2, 0xff, 0x01]), Buffer.from(VALUE)])],
    ];
    for (const [what, message] of messages) {
      const codec = what.startsWith("proto:") ? "proto" : "json";
      const gzFrame = frame(gzipSync(message), 1);
      for (const [how, send] of [
        ["gRPC-Web", () => grpcWeb(message, codec)],
        [
          "gRPC-Web gzip",
          () =>
            viaFetch(
              "POST",
              PROCEDURE,
              { "content-type": `application/grpc-web+${codec}`, "grpc-encoding": "gzip" },
              gzFrame,
            ),
        ],
        ["gRPC", () => grpc(frame(message), codec)],
        ["gRPC gzip", () => grpc(gzFrame, codec, { "grpc-encoding": "gzip" })],
        // A frame that says it is compressed and is not: the value is the "compressed" bytes.
        ["gRPC false gzip", () => grpc(frame(message, 1), codec, { "grpc-encoding": "gzip" })],
        // A frame whose length says more than was sent.
        ["gRPC short frame", () => grpc(frame(message).subarray(0, 5 + Math.floor(message.length / 2)), codec)],
      ] as [string, () => Promise<Seen>][]) {
        const seen = await send();
        expect(leaks(seen.text), `${how}, ${what}: ${seen.text.slice(0, 400)}`).toBe(false);
      }
    }
  });

  it("none of the broken requests above reached the log with the value", () => {
    expect(leaks(JSON.stringify(lines))).toBe(false);
  });
});
