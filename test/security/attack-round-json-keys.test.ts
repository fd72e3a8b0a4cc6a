// A JSON body's errors now name a field as the body wrote it (its proto or
// its JSON name: services/server/json-errors.ts, `key` in Place). Attacked as
// a caller with a project token who wants an error to echo text of its own
// that is not a field's name (a script that keys an object by a secret): keys
// beside, inside and around fields, in nested messages, lists, maps, oneofs
// and well-known types, with both ways of naming, over REST, Connect and
// gRPC-Web; in process over every request message of the API. Real skiff,
// real NATS for the port.
import type { DescMessage, JsonObject, JsonValue } from "@bufbuild/protobuf";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { InvocationService } from "../../gen/skiff/invocation/v4/invocation_pb.js";
import { ManagementService } from "../../gen/skiff/management/v2/management_pb.js";
import { jsonDecodeError } from "../../services/server/json-errors.js";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";

const SECRET = "sk_live_4f0c9e1d77_keyed";
const leaks = (text: string) => text.includes(SECRET) || text.includes("4f0c9e1d77");

/** Every value kind a field may be given wrongly. */
const WRONG: JsonValue[] = [true, 1.5, "x", [], {}, [1], { a: 1 }, -1];

/** Bodies for `desc` that hold SECRET only in keys (never in a value), each with something else wrong. */
function bodies(desc: DescMessage, depth = 0): JsonObject[] {
  const out: JsonObject[] = [{ [SECRET]: 1 }, { [`${SECRET}.x`]: {} }, { [`[${SECRET}]`]: 1 }];
  for (const field of desc.fields) {
    for (const name of new Set([field.name, field.jsonName])) {
      for (const wrong of WRONG) {
        out.push({ [name]: wrong, [SECRET]: 1 });
        out.push({ [SECRET]: 1, [name]: wrong });
      }
      // Both names at once (given twice), with a secret key after.
      out.push({ [field.name]: null, [field.jsonName]: null, [SECRET]: 1 });
      if (field.fieldKind === "map") out.push({ [name]: { [SECRET]: WRONG[0] } }, { [name]: { [SECRET]: {} } });
      if (field.fieldKind === "list") out.push({ [name]: [{ [SECRET]: 1 }] });
      if (field.fieldKind === "message" && depth < 3)
        for (const inner of bodies(field.message, depth + 1).slice(0, 40)) out.push({ [name]: inner });
    }
    if (field.oneof)
      for (const other of field.oneof.fields)
        if (other !== field) out.push({ [field.name]: WRONG[2], [other.jsonName]: WRONG[2], [SECRET]: 1 });
  }
  return out;
}

/** Every field name (proto and JSON) of `desc` and the messages below it. */
function fieldNames(desc: DescMessage, into = new Set<string>(), seen = new Set<DescMessage>()): Set<string> {
  if (seen.has(desc)) return into;
  seen.add(desc);
  for (const f of desc.fields) {
    into.add(f.name).add(f.jsonName);
    if (f.fieldKind === "message" || (f.fieldKind === "list" && f.listKind === "message"))
      fieldNames(f.message, into, seen);
    if (f.fieldKind === "map" && f.mapKind === "message") fieldNames(f.message, into, seen);
  }
  return into;
}

describe("attack - a JSON body's keys in its errors, in process", () => {
  it("over every request message of the API, with proto and JSON names: no error holds a key that is not a field's name", () => {
    const inputs = [
      ...Object.values(ManagementService.method).map((m) => m.input),
      ...Object.values(InvocationService.method).map((m) => m.input),
    ];
    let checked = 0;
    for (const desc of inputs) {
      const names = fieldNames(desc);
      for (const body of bodies(desc))
        for (const mode of ["proto", "json"] as const) {
          const message = jsonDecodeError(desc, body, false, undefined, mode);
          expect(leaks(message), `${desc.typeName} ${JSON.stringify(body)}: ${message}`).toBe(false);
          // Every field the message names is a field's proto or JSON name, and the path it gives is made of them.
          for (const [, quoted] of message.matchAll(/fields? "([^"]*)"/g))
            expect(names.has(quoted), message).toBe(true);
          for (const [, quoted] of message.matchAll(/ and "([^"]*)" of/g))
            expect(names.has(quoted), message).toBe(true);
          for (const [, at] of message.matchAll(/, at ([^\s:]+)/g))
            for (const part of at.replace(/\[(\d+|\*)\]/g, "").split(".")) expect(names.has(part), message).toBe(true);
          checked++;
        }
    }
    expect(checked).toBeGreaterThan(1000);
  });
});

describe("attack - a JSON body's keys in its errors, over the port", () => {
  let t: TestSkiff;
  beforeAll(async () => {
    t = await startTestSkiff();
  }, 120_000);
  afterAll(async () => {
    await t?.close();
  });

  const CASES: { rest: [string, string]; procedure: string; body: JsonObject }[] = [
    {
      rest: ["POST", "/v2/projects/p-dev/service-accounts"],
      procedure: "/skiff.management.v2.ManagementService/CreateServiceAccount",
      body: { project_id: "p-dev", name: "x", expires_at: { [SECRET]: 1 } },
    },
    {
      rest: ["POST", "/v2/projects/p-dev/service-accounts"],
      procedure: "/skiff.management.v2.ManagementService/CreateServiceAccount",
      body: { expiresAt: 12, [SECRET]: "v" },
    },
    {
      rest: ["PUT", "/v2/projects/p-dev/secrets/PROBE"],
      procedure: "/skiff.management.v2.ManagementService/SetSecret",
      body: { value: { [SECRET]: true } },
    },
    {
      rest: ["POST", "/v2/projects/p-dev/apps/-/runs/00000000-0000-7000-8000-000000000000:cancel"],
      procedure: "/skiff.management.v2.ManagementService/CancelRun",
      body: { [`run_id${SECRET}`]: 1, run_id: [SECRET] },
    },
  ];

  it("REST, Connect and gRPC-Web answer such bodies with errors that hold no key of the caller's", async () => {
    const auth = { authorization: `Bearer ${t.devToken}` };
    for (const c of CASES) {
      const text = JSON.stringify(c.body);
      const answers: string[] = [];
      const restAnswer = await fetch(t.url + c.rest[1], {
        method: c.rest[0],
        headers: { ...auth, "content-type": "application/json" },
        body: text,
      });
      answers.push(`${restAnswer.status} ${await restAnswer.text()}`);
      const connect = await fetch(t.url + c.procedure, {
        method: "POST",
        headers: { ...auth, "content-type": "application/json" },
        body: text,
      });
      answers.push(`${connect.status} ${await connect.text()}`);
      const payload = Buffer.from(text);
      const frame = Buffer.concat([Buffer.from([0, 0, 0, 0, 0]), payload]);
      frame.writeUInt32BE(payload.length, 1);
      const grpcWeb = await fetch(t.url + c.procedure, {
        method: "POST",
        headers: { ...auth, "content-type": "application/grpc-web+json" },
        body: frame,
      });
      answers.push(
        `${grpcWeb.status} ${grpcWeb.headers.get("grpc-message") ?? ""} ${Buffer.from(await grpcWeb.arrayBuffer()).toString("latin1")}`,
      );
      for (const a of answers) {
        expect(leaks(decodeURIComponent(a)), `${c.procedure} ${text}: ${a}`).toBe(false);
        expect(a).toMatch(/invalid JSON body|invalid_argument|InvalidArgument|grpc-status:\s*3|^400/);
      }
    }
  });
});
