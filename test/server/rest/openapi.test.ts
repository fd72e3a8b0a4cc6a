import { execFile } from "node:child_process";
import { readFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { createRegistry, type DescFile } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { file_skiff_invocation_v4_invocation } from "../../../gen/skiff/invocation/v4/invocation_pb.js";
import { file_skiff_management_v2_management } from "../../../gen/skiff/management/v2/management_pb.js";
import { SKIFF_APIS } from "../../../services/apis.js";
import {
  openapiDocument,
  openapiPath,
  type OpenApiDocument,
  type OperationObject,
} from "../../../services/server/rest/openapi.js";
import { parseTemplate } from "../../../services/server/rest/http-rules.js";
import { openapiFiles } from "../../../scripts/write-openapi.js";
import { TEST_ROOT } from "../../helpers/paths.js";

const root = join(TEST_ROOT, "..");
const run = promisify(execFile);

function documentFor(file: string): OpenApiDocument {
  const api = SKIFF_APIS.find((a) => a.file === file);
  if (!api) throw new Error(`no API document ${file}`);
  return openapiDocument(api.services, api.info);
}

const management = documentFor("gen/openapi/management.v2.json");
const invocation = documentFor("gen/openapi/invocation.v4.json");
const documents = { management, invocation };

function operations(doc: OpenApiDocument): [string, OperationObject][] {
  return Object.entries(doc.paths).flatMap(([path, item]) =>
    Object.values(item).map((op): [string, OperationObject] => [path, op]),
  );
}

/** Every value of the JSON tree, with its location, for structural checks. */
function* walk(value: unknown, at = "$"): Generator<[string, unknown]> {
  yield [at, value];
  if (value !== null && typeof value === "object") {
    for (const [key, child] of Object.entries(value)) yield* walk(child, `${at}.${key}`);
  }
}

function withDependencies(files: DescFile[]): DescFile[] {
  const out = new Set<DescFile>();
  const add = (f: DescFile): void => {
    if (out.has(f)) return;
    out.add(f);
    f.dependencies.forEach(add);
  };
  files.forEach(add);
  return [...out];
}

const runPath = "/v4/{project_id}/{app_name}/{path}";

describe("openapi - management document", () => {
  const path = "/v2/projects/{project_id}/service-accounts/{service_account_id}";

  it("carries info.version 1.0.0 (spec section 9)", () => {
    expect(management.openapi).toBe("3.1.0");
    expect(management.info).toEqual({
      title: "skiff management API",
      version: "1.0.0",
      description: expect.any(String),
    });
  });

  it("documents DELETE of a service account with a 200 response and bearer security", () => {
    const del = management.paths[path]?.delete;
    expect(del?.operationId).toBe("DeleteServiceAccount");
    expect(del?.responses["200"]).toBeDefined();
    expect(del?.security).toEqual([{ bearer: [] }]);
    expect(management.components.securitySchemes.bearer).toMatchObject({ type: "http", scheme: "bearer" });
    expect(del?.parameters.map((p) => [p.name, p.in, p.required])).toEqual([
      ["project_id", "path", true],
      ["service_account_id", "path", true],
    ]);
    expect(del?.requestBody).toBeUndefined();
  });

  it("keeps custom verbs in the path", () => {
    expect(management.paths["/v2/projects/{project_id}/apps/{app_name}/runs/{run_id}:cancel"]?.post?.operationId).toBe(
      "CancelRun",
    );
  });

  it("body '*' is the request message without its path fields", () => {
    const body = management.paths["/v2/projects/{project_id}/service-accounts"]?.post?.requestBody;
    const schema = body?.content["application/json"]?.schema;
    expect(Object.keys(schema?.properties ?? {})).toEqual(["name", "expires_at"]);
    expect(schema?.properties?.expires_at).toEqual({ type: "string", format: "date-time" });
  });

  it("a named HttpBody body field is a binary request body", () => {
    const body = management.paths["/v2/projects/{project_id}/apps"]?.post?.requestBody;
    expect(body?.content).toEqual({ "*/*": { schema: { type: "string", format: "binary" } } });
  });

  it("fields not bound by path or body are query parameters, with JSON names", () => {
    const list = management.paths["/v2/projects/{project_id}/apps/{app_name}/runs"]?.get;
    const query = list?.parameters.filter((p) => p.in === "query").map((p) => [p.name, p.schema]);
    expect(query).toEqual([
      ["pageSize", { type: "integer", minimum: 0, maximum: 4294967295 }],
      ["pageToken", { type: "string" }],
      ["asyncOnly", { type: "boolean" }],
      ["status", { type: "string" }],
    ]);
  });

  it("component schemas follow ProtoJSON with proto field names", () => {
    const schemas = management.components.schemas;
    expect(schemas["skiff.management.v2.ServiceAccount"]).toEqual({
      type: "object",
      properties: {
        service_account_id: { type: "string" },
        name: { type: "string" },
        created_at: { type: "string", format: "date-time" },
        expires_at: { type: "string", format: "date-time" },
      },
      required: ["service_account_id", "name", "created_at", "expires_at"],
    });
    const deployment = schemas["skiff.management.v2.Deployment"]?.properties;
    expect(deployment?.bundle_bytes).toEqual({ type: "string", format: "int64" });
    const run = schemas["skiff.management.v2.Run"]?.properties;
    expect(run?.run_time_ms).toEqual({ type: "number", format: "double" });
    expect(run?.result).toEqual({});
    expect(run?.webhook_deliveries).toEqual({
      type: "array",
      items: { $ref: "#/components/schemas/skiff.management.v2.WebhookDelivery" },
    });
    expect(schemas["skiff.management.v2.App"]?.properties?.env_names).toEqual({
      type: "array",
      items: { type: "string" },
    });
    expect(schemas["google.api.HttpBody"]?.properties?.data).toEqual({ type: "string", format: "byte" });
  });

  it("error responses reference the Error schema {code, message}", () => {
    const del = management.paths[path]?.delete;
    expect(Object.keys(del?.responses ?? {})).toEqual(["200", "400", "401", "403", "404", "413", "500", "503"]);
    for (const status of ["400", "401", "403", "404", "413", "500", "503"]) {
      expect(del?.responses[status]?.content?.["application/json"]?.schema, status).toEqual({
        $ref: "#/components/schemas/Error",
      });
    }
    expect(management.components.schemas.Error).toMatchObject({
      properties: { code: { type: "string" }, message: { type: "string" } },
      required: ["code", "message"],
    });
  });

  it("lists 415 where the body is JSON and 409 where the handler can conflict", () => {
    const statuses = (p: string, m: "get" | "post" | "delete") =>
      Object.keys(management.paths[p]?.[m]?.responses ?? {});
    expect(statuses("/v2/projects/{project_id}/service-accounts", "post")).toEqual([
      "200",
      "400",
      "401",
      "403",
      "404",
      "409",
      "413",
      "415",
      "500",
      "503",
    ]);
    expect(statuses("/v2/projects", "post")).toContain("409");
    // DeployApp takes the bundle as raw bytes: no 415.
    expect(statuses("/v2/projects/{project_id}/apps", "post")).not.toContain("415");
    expect(statuses("/v2/projects", "get")).not.toContain("415");
    expect(management.info.description).toMatch(/405/);
  });

  it("marks required fields: what a new service account needs, and what ProtoJSON always writes", () => {
    const body = management.paths["/v2/projects/{project_id}/service-accounts"]?.post?.requestBody;
    expect(body?.required).toBe(true);
    expect(body?.content["application/json"]?.schema.required).toEqual(["name", "expires_at"]);
    const schemas = management.components.schemas;
    expect(schemas["skiff.management.v2.ListProjectsResponse"]?.required).toEqual(["projects"]);
    expect(schemas["skiff.management.v2.CreateServiceAccountResponse"]?.required).toEqual(["service_account", "token"]);
    // A message field that no handler is known to set always stays optional.
    expect(schemas["skiff.management.v2.GetAppResponse"]?.required).toBeUndefined();
    // Creating a project needs nothing: an id is made up when none is given.
    expect(management.paths["/v2/projects"]?.post?.requestBody?.required).toBe(false);
  });

  it("gives every operation a summary and the document a server", () => {
    for (const [, op] of operations(management)) expect(op.summary, op.operationId).toMatch(/^[A-Z][a-z]+( [a-z]+)+$/);
    expect(management.paths["/v2/projects"]?.get?.summary).toBe("List projects");
    expect(management.servers).toEqual([{ url: "/", description: expect.any(String) }]);
  });

  it("streaming methods, which have no http rule, are left out", () => {
    const ids = operations(management).map(([, op]) => op.operationId);
    expect(ids).not.toContain("TailAppLogs");
    expect(ids).not.toContain("WatchRuns");
  });
});

describe("openapi - invocation document", () => {
  const run = invocation.paths[runPath]?.post;

  it("documents POST /v4/{project_id}/{app_name}/{path} with the spanning path parameter noted", () => {
    expect(invocation.info.version).toBe("1.0.0");
    expect(run?.operationId).toBe("Run");
    const path = run?.parameters.find((p) => p.name === "path");
    expect(path).toMatchObject({ in: "path", required: true, schema: { type: "string" } });
    expect(path?.description).toMatch(/span/);
  });

  it("takes async (boolean) and webhookEndpoint (string) as query parameters", () => {
    const query = run?.parameters.filter((p) => p.in === "query").map((p) => [p.name, p.schema]);
    expect(query).toEqual([
      ["async", { type: "boolean" }],
      ["webhookEndpoint", { type: "string" }],
    ]);
  });

  it("reads X-Webhook-Secret and Idempotency-Key request headers", () => {
    expect(run?.parameters.filter((p) => p.in === "header").map((p) => p.name)).toEqual([
      "X-Webhook-Secret",
      "Idempotency-Key",
    ]);
  });

  it("types the body as JSON: an object for Cortex apps, any JSON value for Custom apps", () => {
    expect(run?.summary).toBe("Run an app");
    expect(run?.requestBody?.content).toEqual({
      "application/json": {
        schema: {
          anyOf: [{ $ref: "#/components/schemas/CortexRunInput" }, { $ref: "#/components/schemas/CustomRunInput" }],
        },
      },
    });
    const schemas = invocation.components.schemas;
    expect(schemas.CortexRunInput).toMatchObject({ type: "object", additionalProperties: true });
    expect(schemas.CustomRunInput?.type).toBeUndefined();
    expect(run?.description).toMatch(/Custom app/);
  });

  it("types the sync answer as the Cortex envelope, and its 500 as the Cortex error envelope or {code, message}", () => {
    expect(run?.responses["200"]?.content).toEqual({
      "application/json": { schema: { $ref: "#/components/schemas/CortexRunResult" } },
    });
    expect(invocation.components.schemas.CortexRunResult).toMatchObject({
      type: "object",
      required: ["run_id", "result", "run_time_ms"],
    });
    expect(run?.responses["500"]?.content?.["application/json"]?.schema).toEqual({
      anyOf: [{ $ref: "#/components/schemas/CortexRunError" }, { $ref: "#/components/schemas/Error" }],
    });
    expect(invocation.components.schemas.CortexRunError).toMatchObject({
      required: ["run_id", "error"],
      properties: { error: { required: ["type", "message"] } },
    });
  });

  it("answers an async call 202 with a body of only run_id", () => {
    expect(run?.responses["202"]?.content?.["application/json"]?.schema).toEqual({
      $ref: "#/components/schemas/RunAccepted",
    });
    expect(invocation.components.schemas.RunAccepted).toEqual({
      type: "object",
      description: expect.any(String),
      properties: { run_id: { type: "string", description: expect.any(String) } },
      required: ["run_id"],
      additionalProperties: false,
    });
  });

  it("documents every method of the run path, each with the same parameters, none for the request line", () => {
    const item = invocation.paths[runPath] ?? {};
    expect(Object.keys(item)).toEqual(["post", "get", "put", "patch", "delete", "head", "options"]);
    expect(Object.values(item).map((op) => op?.operationId)).toEqual([
      "Run",
      "RunGet",
      "RunPut",
      "RunPatch",
      "RunDelete",
      "RunHead",
      "RunOptions",
    ]);
    const names = (m: keyof typeof item) => item[m]?.parameters.map((p) => p.name);
    for (const m of Object.keys(item) as (keyof typeof item)[]) expect(names(m)).toEqual(names("post"));
    expect(names("post")).toEqual(expect.arrayContaining(["async", "webhookEndpoint"]));
    expect(names("post")).not.toContain("method");
    expect(names("post")).not.toContain("query");
    expect(run?.responses["405"]?.headers?.Allow).toMatchObject({ schema: { type: "string" } });
  });

  it("lists the statuses a run can answer, 429 with Retry-After", () => {
    expect(Object.keys(run?.responses ?? {})).toEqual([
      "200",
      "202",
      "400",
      "401",
      "403",
      "404",
      "405",
      "413",
      "429",
      "499",
      "500",
      "503",
      "504",
    ]);
    expect(run?.responses["429"]?.headers?.["Retry-After"]).toMatchObject({ schema: { type: "integer" } });
  });

  it("declares X-Request-Id on every response, errors included", () => {
    const responses = Object.entries(run?.responses ?? {});
    expect(responses.length).toBeGreaterThan(2);
    for (const [status, response] of responses)
      expect(response.headers?.["X-Request-Id"], status).toMatchObject({ schema: { type: "string" } });
  });

  it("adds the invocation extras to no other method", () => {
    for (const [, op] of operations(management)) {
      expect(
        op.parameters.some((p) => p.in === "header"),
        op.operationId,
      ).toBe(false);
      expect(op.responses["202"], op.operationId).toBeUndefined();
      for (const response of Object.values(op.responses)) expect(response.headers, op.operationId).toBeUndefined();
    }
  });
});

describe("openapi - every document", () => {
  for (const [name, doc] of Object.entries(documents)) {
    it(`${name}: every $ref resolves to a component schema`, () => {
      const refs = [...walk(doc)].filter(([at]) => at.endsWith(".$ref")).map(([, v]) => v);
      expect(refs.length).toBeGreaterThan(0);
      for (const ref of refs) {
        expect(ref).toMatch(/^#\/components\/schemas\//);
        expect(doc.components.schemas[String(ref).slice("#/components/schemas/".length)], String(ref)).toBeDefined();
      }
    });

    it(`${name}: every path parameter appears in its path, and every {variable} is a parameter`, () => {
      for (const [path, op] of operations(doc)) {
        const declared = op.parameters
          .filter((p) => p.in === "path")
          .map((p) => p.name)
          .sort();
        const inPath = [...path.matchAll(/\{([^}]+)\}/g)].map((m) => m[1]).sort();
        expect(declared, `${op.operationId} ${path}`).toEqual(inPath);
      }
    });

    it(`${name}: has no undefined values and unique operationIds, each with bearer security`, () => {
      const undefinedAt = [...walk(doc)].filter(([, v]) => v === undefined).map(([at]) => at);
      expect(undefinedAt).toEqual([]);
      const ids = operations(doc).map(([, op]) => op.operationId);
      expect(new Set(ids).size).toBe(ids.length);
      for (const [, op] of operations(doc)) expect(op.security, op.operationId).toEqual([{ bearer: [] }]);
    });
  }
});

describe("openapi - component schemas", () => {
  it("are the messages by full type name, with their proto field names in declaration order", () => {
    const registry = createRegistry(
      ...withDependencies([file_skiff_management_v2_management, file_skiff_invocation_v4_invocation]),
    );
    const messages = Object.values(documents)
      .flatMap((doc) => Object.entries(doc.components.schemas))
      .filter(([typeName]) => typeName.includes("."));
    expect(messages.length).toBeGreaterThan(10);
    for (const [typeName, schema] of messages) {
      const desc = registry.getMessage(typeName);
      expect(desc, typeName).toBeDefined();
      expect(Object.keys(schema.properties ?? {}), typeName).toEqual(desc?.fields.map((f) => f.name));
    }
  });
});

describe("openapi - paths and files", () => {
  it("turns templates into OpenAPI paths: {var=**} is one {var}, verbs stay", () => {
    expect(openapiPath(parseTemplate("/v4/{project_id}/{app_name}/{path=**}"))).toBe(runPath);
    expect(openapiPath(parseTemplate("/v1/{name=projects/*/apps/*}:cancel"))).toBe("/v1/{name}:cancel");
    expect(() => openapiPath(parseTemplate("/v1/*/apps"))).toThrow(/wildcard/);
  });

  it("gen/openapi files are fresh (run `npm run generate` when this fails)", () => {
    const files = openapiFiles();
    expect(Object.keys(files).sort()).toEqual(["gen/openapi/invocation.v4.json", "gen/openapi/management.v2.json"]);
    for (const [rel, text] of Object.entries(files)) {
      expect(readFileSync(join(root, rel), "utf8"), rel).toBe(text);
      expect(text.endsWith("}\n")).toBe(true);
    }
  });

  it("a separate process writes the committed text", async () => {
    const out = await mkdtemp(join(tmpdir(), "skiff-openapi-"));
    try {
      await run(join(root, "node_modules", ".bin", "tsx"), ["scripts/write-openapi.ts", "--out", out], { cwd: root });
      for (const rel of Object.keys(openapiFiles()))
        expect(readFileSync(join(out, rel), "utf8"), rel).toBe(readFileSync(join(root, rel), "utf8"));
    } finally {
      await rm(out, { recursive: true, force: true });
    }
    expect(JSON.parse(readFileSync(join(root, "gen/openapi/management.v2.json"), "utf8"))).toEqual(management);
  }, 60_000);
});
