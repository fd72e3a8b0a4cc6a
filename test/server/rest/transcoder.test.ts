// The HTTP/JSON transcoder against a real listener, with test
// implementations of the real services behind Connect's router.
import http from "node:http";
import http2 from "node:http2";
import { Writable } from "node:stream";
import { create } from "@bufbuild/protobuf";
import { FieldDescriptorProtoSchema, FieldDescriptorProto_Type } from "@bufbuild/protobuf/wkt";
import { reflect } from "@bufbuild/protobuf/reflect";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AppSchema, StatsBucketSchema } from "../../../gen/skiff/management/v2/management_pb.js";
import { HttpBodySchema } from "../../../gen/google/api/httpbody_pb.js";
import type { RunRequest } from "../../../gen/skiff/invocation/v4/invocation_pb.js";
import type { ListRunsRequest } from "../../../gen/skiff/management/v2/management_pb.js";
import { resolveDotted, setFromText } from "../../../services/server/rest/fields.js";
import { rest, rest2, startRestFixture, type RestFixture, type RestResponse } from "../../helpers/rest-fixture.js";

const LIMIT = 1024;

interface Case {
  name: string;
  method: string;
  path: string;
  headers?: Record<string, string>;
  body?: string | Buffer;
  status: number;
  /** Exact JSON body. */
  json?: unknown;
  /** Exact raw body. */
  text?: string;
  contentType?: string;
  check?: (res: RestResponse, fx: RestFixture) => void;
}

function lastCall(fx: RestFixture, method: string) {
  const call = fx.calls.findLast((c) => c.method === method);
  if (!call) throw new Error(`${method} was not called`);
  return call;
}

function runOf(fx: RestFixture): RunRequest {
  return lastCall(fx, "Run").request as RunRequest;
}

const json = { "content-type": "application/json" };
const hook = "https://hooks.example.com/in?x=1&y=2";

const cases: Case[] = [
  // --- rule 2 + 4: the handler chooses status and headers, raw HttpBody answer
  {
    name: "async run: the handler's 202, X-Request-Id and raw HttpBody reach the REST caller",
    method: "POST",
    path: `/v4/p-dev/hello/run?async=true&webhookEndpoint=${encodeURIComponent(hook)}`,
    headers: {
      ...json,
      authorization: "Bearer tok",
      "x-webhook-secret": "s3cret",
      "idempotency-key": "k-1",
      "accept-encoding": "gzip",
    },
    body: '{"prompt":"hi"}',
    status: 202,
    text: '{"run_id":"run-0001"}',
    contentType: "application/json",
    check: (res, fx) => {
      expect(res.headers["x-request-id"]).toBe("run-0001");
      expect(res.headers["x-intercepted"]).toBe("yes");
      const call = lastCall(fx, "Run");
      const req = call.request as RunRequest;
      expect({
        projectId: req.projectId,
        appName: req.appName,
        path: req.path,
        async: req.async,
        webhookEndpoint: req.webhookEndpoint,
      }).toEqual({
        projectId: "p-dev",
        appName: "hello",
        path: "run",
        async: true,
        webhookEndpoint: hook,
      });
      expect(req.body?.contentType).toBe("application/json");
      expect(new TextDecoder().decode(req.body?.data)).toBe('{"prompt":"hi"}');
      expect(call.header.get("authorization")).toBe("Bearer tok");
      expect(call.header.get("x-webhook-secret")).toBe("s3cret");
      expect(call.header.get("idempotency-key")).toBe("k-1");
      // The handler gets a message, not the REST body: no Content-Type of either encoding.
      expect(call.header.get("content-type")).toBeNull();
      expect(call.header.get("accept-encoding")).toBeNull();
      expect(call.exchange).toEqual({
        method: "POST",
        query: `async=true&webhookEndpoint=${encodeURIComponent(hook)}`,
      });
    },
  },
  {
    name: "sync run: a body of any content type goes to the app raw and comes back raw",
    method: "POST",
    path: "/v4/p-dev/hello/run",
    headers: { "content-type": "text/plain; charset=utf-8" },
    body: "plain words",
    status: 200,
    text: "plain words",
    contentType: "text/plain; charset=utf-8",
    check: (res) => expect(res.headers["x-request-id"]).toBe("run-0001"),
  },
  {
    name: "webhook_endpoint by proto name and async=1",
    method: "POST",
    path: `/v4/p-dev/hello/run?async=1&webhook_endpoint=${encodeURIComponent(hook)}`,
    status: 202,
    check: (_res, fx) => expect([runOf(fx).async, runOf(fx).webhookEndpoint]).toEqual([true, hook]),
  },
  {
    name: "async=false stays synchronous",
    method: "POST",
    path: "/v4/p-dev/hello/run?async=false",
    status: 200,
    check: (_res, fx) => expect(runOf(fx).async).toBe(false),
  },
  // --- rule 1: templates
  {
    name: "{path=**} takes several segments",
    method: "POST",
    path: "/v4/p-dev/site/static/css/main.css",
    status: 200,
    check: (_res, fx) => expect([runOf(fx).appName, runOf(fx).path]).toEqual(["site", "static/css/main.css"]),
  },
  {
    name: "{path=**} matches zero segments and keeps empty ones",
    method: "POST",
    path: "/v4/p-dev/site/a//b/",
    status: 200,
    check: (_res, fx) => expect(runOf(fx).path).toBe("a//b/"),
  },
  {
    name: "path variables are percent-decoded; inside {path=**} (reserved expansion) %2F separates segments as / does",
    method: "POST",
    path: "/v4/p%2Ddev/my%20app/x%20y/a%2Fb/%C3%A9",
    status: 200,
    check: (_res, fx) =>
      expect([runOf(fx).projectId, runOf(fx).appName, runOf(fx).path]).toEqual(["p-dev", "my app", "x y/a/b/é"]),
  },
  {
    name: "a one-segment variable decodes %2F to /",
    method: "GET",
    path: "/v2/projects/p-dev/apps/hello/runs/r%2F1",
    status: 200,
    check: (res) => expect(JSON.parse(res.text).run.run_id).toBe("r/1"),
  },
  {
    name: "bad percent-encoding in a path variable is 400",
    method: "GET",
    path: "/v2/projects/%E0%A4%A",
    status: 400,
    json: { code: "invalid_argument", message: 'path variable "project_id": invalid percent-encoding' },
  },
  {
    name: "custom verb :cancel",
    method: "POST",
    path: "/v2/projects/p-dev/apps/hello/runs/r-1:cancel",
    status: 200,
    check: (res, fx) => {
      expect(JSON.parse(res.text).run).toMatchObject({
        run_id: "r-1",
        status: "cancelled",
        attempts: 0,
        webhook_deliveries: [],
      });
      expect(lastCall(fx, "CancelRun").request).toMatchObject({ projectId: "p-dev", appName: "hello", runId: "r-1" });
    },
  },
  {
    name: "custom verb webhook:redeliver",
    method: "POST",
    path: "/v2/projects/p-dev/apps/hello/runs/r-2/webhook:redeliver",
    headers: json,
    body: "{}",
    status: 200,
    json: { delivery: { delivery_id: "d-1", run_id: "r-2", url: "", state: "pending", attempts: [] } },
  },
  {
    name: "a verb that no route has stays part of the variable",
    method: "GET",
    path: "/v2/projects/p-dev/apps/hello/runs/r-1:other",
    status: 200,
    check: (res) => expect(JSON.parse(res.text).run.run_id).toBe("r-1:other"),
  },
  // --- rule 4: response JSON
  {
    name: "response uses proto field names and emits implicit fields",
    method: "GET",
    path: "/v2/identity",
    status: 200,
    json: { kind: "service_account", project_id: "", service_account_id: "sa-1" },
    contentType: "application/json",
  },
  {
    name: "GET service account: service_account_id and RFC 3339 timestamps",
    method: "GET",
    path: "/v2/projects/p-dev/service-accounts/sa-9",
    status: 200,
    json: { service_account: { service_account_id: "sa-9", name: "ci", created_at: "2025-01-02T03:04:05Z" } },
  },
  {
    name: "DELETE service account answers 200 {}",
    method: "DELETE",
    path: "/v2/projects/p-dev/service-accounts/sa-9",
    status: 200,
    json: {},
    check: (_res, fx) =>
      expect(lastCall(fx, "DeleteServiceAccount").request).toMatchObject({
        projectId: "p-dev",
        serviceAccountId: "sa-9",
      }),
  },
  // --- rule 3: query
  {
    name: "query: async_only=true&page_size=20&status=failure set the fields",
    method: "GET",
    path: "/v2/projects/p-dev/apps/hello/runs?async_only=true&page_size=20&status=failure",
    status: 200,
    json: { runs: [], next_page_token: "" },
    check: (_res, fx) =>
      expect(lastCall(fx, "ListRuns").request).toMatchObject({ asyncOnly: true, pageSize: 20, status: "failure" }),
  },
  {
    name: "query: JSON names work too (asyncOnly=1&pageSize=5)",
    method: "GET",
    path: "/v2/projects/p-dev/apps/hello/runs?asyncOnly=1&pageSize=5",
    status: 200,
    check: (_res, fx) => expect(lastCall(fx, "ListRuns").request).toMatchObject({ asyncOnly: true, pageSize: 5 }),
  },
  {
    name: "query: page_size=abc is 400 naming the parameter",
    method: "GET",
    path: "/v2/projects/p-dev/apps/hello/runs?page_size=abc",
    status: 400,
    json: {
      code: "invalid_argument",
      message: 'query parameter "page_size": expected an unsigned 32-bit integer, got "abc"',
    },
  },
  {
    name: "query: page_size out of uint32 range is 400",
    method: "GET",
    path: "/v2/projects/p-dev/apps/hello/runs?page_size=4294967296",
    status: 400,
    json: {
      code: "invalid_argument",
      message: 'query parameter "page_size": expected an unsigned 32-bit integer, got "4294967296"',
    },
  },
  {
    name: "query: an empty bool is 400, not true",
    method: "POST",
    path: "/v4/p-dev/hello/run?async",
    status: 400,
    json: { code: "invalid_argument", message: 'query parameter "async": expected true, false, 1 or 0, got ""' },
  },
  {
    name: "query: unknown parameters are ignored and reach the handler in HttpExchange.query",
    method: "GET",
    path: "/v2/projects/p-dev/apps/hello/runs?foo=bar&page_size=3&x.y=1",
    status: 200,
    check: (_res, fx) => {
      const call = lastCall(fx, "ListRuns");
      expect((call.request as ListRunsRequest).pageSize).toBe(3);
      expect(call.exchange).toEqual({ method: "GET", query: "foo=bar&page_size=3&x.y=1" });
    },
  },
  {
    name: "query: cannot override a path variable",
    method: "GET",
    path: "/v2/projects/p-dev/apps/hello/runs?project_id=p-other&app_name=evil",
    status: 200,
    check: (_res, fx) =>
      expect(lastCall(fx, "ListRuns").request).toMatchObject({ projectId: "p-dev", appName: "hello" }),
  },
  {
    name: "query: cannot set the body field of a body rule",
    method: "POST",
    path: "/v4/p-dev/hello/run?body.content_type=evil",
    headers: { "content-type": "text/plain" },
    body: "x",
    status: 200,
    check: (_res, fx) => expect(runOf(fx).body?.contentType).toBe("text/plain"),
  },
  // --- rule 3: bodies
  {
    name: 'body "*": the JSON body fills the request (proto and JSON names)',
    method: "POST",
    path: "/v2/projects",
    headers: json,
    body: '{"projectId":"p-x","name":"Dev"}',
    status: 200,
    json: { project: { project_id: "p-x", name: "Dev", created_at: "2025-01-02T03:04:05Z" } },
  },
  {
    name: 'body "*": an empty body counts as {}',
    method: "POST",
    path: "/v2/projects",
    status: 200,
    json: { project: { project_id: "p-new", name: "", created_at: "2025-01-02T03:04:05Z" } },
  },
  {
    name: 'body "*": path variables win over the body',
    method: "POST",
    path: "/v2/projects/p-dev/apps/hello/runs/r-7:cancel",
    headers: json,
    body: '{"run_id":"r-other"}',
    status: 200,
    check: (res) => expect(JSON.parse(res.text).run.run_id).toBe("r-7"),
  },
  {
    name: 'body "*": an unknown field is 400',
    method: "POST",
    path: "/v2/projects",
    headers: json,
    body: '{"name":"Dev","nmae":"typo"}',
    status: 400,
    check: (res) => {
      const body = JSON.parse(res.text);
      expect(body.code).toBe("invalid_argument");
      // The key is not quoted (a key may carry a secret); the fields are listed, and a near miss named.
      expect(body.message).toBe(
        'invalid JSON body: the body has a key that is not a field of skiff.management.v2.CreateProjectRequest (did you mean "name"?); its fields are project_id, name',
      );
    },
  },
  {
    name: 'body "*": a field of the wrong type is 400',
    method: "POST",
    path: "/v2/projects",
    headers: json,
    body: '{"name":42}',
    status: 400,
    check: (res) =>
      expect(JSON.parse(res.text)).toEqual({
        code: "invalid_argument",
        message:
          'invalid JSON body: field "name" of skiff.management.v2.CreateProjectRequest: expected a string, got a number',
      }),
  },
  {
    name: 'body "*": a field is named as the body names it, by its proto name or its JSON name',
    method: "POST",
    path: "/v2/projects",
    headers: json,
    body: '{"name":"Dev","project_id":7}',
    status: 400,
    check: (res) =>
      expect(JSON.parse(res.text).message).toBe(
        'invalid JSON body: field "project_id" of skiff.management.v2.CreateProjectRequest: expected a string, got a number',
      ),
  },
  {
    name: "malformed JSON is 400",
    method: "POST",
    path: "/v2/projects",
    headers: json,
    body: '{"name":',
    status: 400,
    check: (res) => {
      const body = JSON.parse(res.text);
      expect(body.code).toBe("invalid_argument");
      expect(body.message).toMatch(/^malformed JSON body: /);
    },
  },
  {
    name: "a JSON body that is not JSON is 415",
    method: "POST",
    path: "/v2/projects",
    headers: { "content-type": "text/plain" },
    body: '{"name":"Dev"}',
    status: 415,
    json: { code: "invalid_argument", message: 'unsupported media type "text/plain": the body must be JSON' },
  },
  {
    name: "a form body (curl -d without -H) is 415, saying what to send",
    method: "POST",
    path: "/v2/projects",
    headers: { "content-type": "application/x-www-form-urlencoded" },
    body: '{"name":"Dev"}',
    status: 415,
    json: {
      code: "invalid_argument",
      message:
        'unsupported media type "application/x-www-form-urlencoded": the body must be JSON (send Content-Type: application/json: curl -d sends this type unless told otherwise)',
    },
  },
  {
    name: "a body without Content-Type is read as JSON",
    method: "POST",
    path: "/v2/projects",
    body: '{"name":"NoType"}',
    status: 200,
    check: (res) => expect(JSON.parse(res.text).project.name).toBe("NoType"),
  },
  {
    name: "application/json with charset and +json types are JSON",
    method: "POST",
    path: "/v2/projects",
    headers: { "content-type": "application/merge-patch+json; charset=UTF-8" },
    body: '{"name":"Plus"}',
    status: 200,
    check: (res) => expect(JSON.parse(res.text).project.name).toBe("Plus"),
  },
  {
    name: "an HttpBody body field gets the raw bytes and Content-Type; uint64 is a JSON string",
    method: "POST",
    path: "/v2/projects/p-dev/apps",
    headers: { "content-type": "application/gzip" },
    body: Buffer.from([0x1f, 0x8b, 0, 1, 2]),
    status: 200,
    check: (res, fx) => {
      expect(JSON.parse(res.text).app.deployment).toEqual({
        version: 1,
        created_by: "",
        bundle_bytes: "5",
        digest: "application/gzip",
      });
      expect([...(lastCall(fx, "DeployApp").request as { bundle: { data: Uint8Array } }).bundle.data]).toEqual([
        0x1f, 0x8b, 0, 1, 2,
      ]);
    },
  },
  {
    name: "no body rule: a body is ignored",
    method: "GET",
    path: "/v2/identity",
    headers: { "content-type": "text/plain" },
    body: "ignored {",
    status: 200,
    json: { kind: "service_account", project_id: "", service_account_id: "sa-1" },
  },
  // --- rule 5: limits
  {
    name: "a body at the limit is accepted",
    method: "POST",
    path: "/v2/projects",
    headers: json,
    body: `{"name":"${"x".repeat(LIMIT - 11)}"}`,
    status: 200,
  },
  {
    name: "a body over the limit is 413 (Content-Length)",
    method: "POST",
    path: "/v2/projects",
    headers: json,
    body: `{"name":"${"x".repeat(LIMIT - 10)}"}`,
    status: 413,
    json: { code: "resource_exhausted", message: `request body larger than ${LIMIT} bytes` },
  },
  // --- rule 6: errors
  {
    name: "unknown route is 404 not_found",
    method: "GET",
    path: "/v3/nothing?x=1",
    status: 404,
    json: { code: "not_found", message: "no route for /v3/nothing" },
    contentType: "application/json",
  },
  {
    name: "known path with another method is 405 with Allow",
    method: "PUT",
    path: "/v2/projects/p-dev/service-accounts/sa-1",
    status: 405,
    json: { code: "unimplemented", message: "method PUT not allowed; allowed: GET, DELETE" },
    check: (res) => expect(res.headers.allow).toBe("GET, DELETE"),
  },
  ...["GET", "PUT", "PATCH", "DELETE", "OPTIONS"].map((method): Case => ({
    name: `${method} on the run path reaches Run with its method, query and body`,
    method,
    path: "/v4/p-dev/hello/items/7?b=2&a=1&async=false",
    headers: { "content-type": "text/plain" },
    body: "x",
    status: 200,
    text: "x",
    check: (_res, fx) => {
      const call = lastCall(fx, "Run");
      expect(call.exchange).toEqual({ method, query: "b=2&a=1&async=false" });
      expect((call.request as RunRequest).path).toBe("items/7");
      // The request line is the exchange's: its query parameters never set these fields.
      expect((call.request as RunRequest).method).toBe("");
    },
  })),
  {
    name: "HEAD on the run path reaches Run; the answer is the head alone",
    method: "HEAD",
    path: "/v4/p-dev/hello/items?method=DELETE",
    headers: { "content-type": "text/plain" },
    body: "four",
    status: 200,
    text: "",
    contentType: "text/plain",
    check: (res, fx) => {
      expect(lastCall(fx, "Run").exchange?.method).toBe("HEAD");
      expect(res.headers["content-length"]).toBeUndefined();
    },
  },
  {
    name: "a handler's unimplemented error with an Allow header is 405 with that header",
    method: "GET",
    path: "/v4/p-dev/post-only/run",
    status: 405,
    json: { code: "unimplemented", message: "POST only" },
    check: (res) => {
      expect(res.headers.allow).toBe("POST");
      expect(res.headers["x-request-id"]).toBe("run-0001");
    },
  },
  {
    name: "TRACE on the run path is 405 with Allow naming every bound method",
    method: "TRACE",
    path: "/v4/p-dev/hello/run",
    status: 405,
    check: (res) => expect(res.headers.allow).toBe("POST, GET, PUT, PATCH, DELETE, HEAD, OPTIONS"),
  },
  {
    name: "a method without implementation is 501 unimplemented",
    method: "GET",
    path: "/v2/projects/p-dev/apps/hello/stats",
    status: 501,
    check: (res) =>
      expect(JSON.parse(res.text)).toEqual({
        code: "unimplemented",
        message: "skiff.management.v2.ManagementService.GetAppStats is not implemented",
      }),
  },
  {
    name: "ConnectError(NotFound) from the handler is 404 JSON",
    method: "GET",
    path: "/v2/projects/p-missing",
    status: 404,
    json: { code: "not_found", message: "project p-missing not found" },
    contentType: "application/json",
  },
  {
    name: "error answers keep the handler's headers (X-Request-Id)",
    method: "POST",
    path: "/v4/p-dev/missing/run",
    status: 404,
    json: { code: "not_found", message: "app p-dev/missing not found" },
    check: (res) => expect(res.headers["x-request-id"]).toBe("run-0001"),
  },
  {
    name: "an interceptor's ConnectError maps too (401)",
    method: "GET",
    path: "/v2/identity",
    headers: { authorization: "Bearer bad" },
    status: 401,
    json: { code: "unauthenticated", message: "bad token" },
  },
];

describe("transcoder", () => {
  let fx: RestFixture;
  const logLines: string[] = [];

  beforeAll(async () => {
    const sink = new Writable({
      write(chunk: Buffer, _enc, done) {
        logLines.push(chunk.toString());
        done();
      },
    });
    fx = await startRestFixture({ maxBodyBytes: LIMIT, logger: pino({ level: "error" }, sink) });
  });
  afterAll(() => fx?.close());

  it.each(cases)("$name", async (c) => {
    const res = await rest(fx.url, c.method, c.path, { headers: c.headers, body: c.body });
    expect({ status: res.status, text: res.text }).toMatchObject({ status: c.status });
    if (c.json !== undefined) expect(JSON.parse(res.text)).toEqual(c.json);
    if (c.text !== undefined) expect(res.text).toBe(c.text);
    if (c.contentType !== undefined) expect(res.headers["content-type"]).toBe(c.contentType);
    if (c.status >= 400) expect(res.headers["content-type"]).toBe("application/json");
    c.check?.(res, fx);
  });

  it("interceptors run for REST calls", async () => {
    const before = fx.intercepted.length;
    await rest(fx.url, "GET", "/v2/projects/p-dev");
    expect(fx.intercepted.slice(before)).toEqual(["GetProject"]);
  });

  it("a handler throwing a plain Error is 500 internal, logged, and the server keeps serving", async () => {
    const res = await rest(fx.url, "POST", "/v4/p-dev/boom/run");
    expect(res.status).toBe(500);
    expect(JSON.parse(res.text)).toEqual({ code: "internal", message: "internal error" });
    expect(res.headers["x-request-id"]).toBe("run-0001");
    expect(
      logLines.some(
        (l) => l.includes('"procedure":"/skiff.invocation.v4.InvocationService/Run"') && l.includes("handler failed"),
      ),
    ).toBe(true);
    const after = await rest(fx.url, "GET", "/v2/identity");
    expect(after.status).toBe(200);
  });

  it("a chunked body is refused with 413 as soon as it passes the limit, before it ends", async () => {
    const res = await new Promise<RestResponse>((resolve, reject) => {
      const req = http.request(`${fx.url}/v2/projects`, { method: "POST", headers: json, agent: false }, (r) => {
        const chunks: Buffer[] = [];
        r.on("data", (c: Buffer) => chunks.push(c));
        r.on("end", () => {
          req.destroy();
          resolve({ status: r.statusCode ?? 0, headers: r.headers, text: Buffer.concat(chunks).toString() });
        });
      });
      req.on("error", reject);
      // Never ended: only the limit can make the server answer.
      req.write("x".repeat(700));
      req.write("x".repeat(700));
    });
    expect(res.status).toBe(413);
    expect(JSON.parse(res.text)).toEqual({
      code: "resource_exhausted",
      message: `request body larger than ${LIMIT} bytes`,
    });
    expect((await rest(fx.url, "GET", "/v2/identity")).status).toBe(200);
  });

  it("after a 413 the HTTP/1.1 connection still serves the next request", async () => {
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    const send = (body: string) =>
      new Promise<number>((resolve, reject) => {
        const req = http.request(`${fx.url}/v2/projects`, { method: "POST", headers: json, agent }, (r) => {
          r.resume();
          r.on("end", () => resolve(r.statusCode ?? 0));
        });
        req.on("error", reject);
        req.end(body);
      });
    try {
      expect(await send("y".repeat(3 * LIMIT))).toBe(413);
      expect(await send('{"name":"again"}')).toBe(200);
    } finally {
      agent.destroy();
    }
  });

  it("HTTP/2 (h2c): async run gets 202, X-Request-Id and the raw body", async () => {
    const res = await rest2(
      fx.h2url,
      "POST",
      `/v4/p-dev/hello/run?async=true&webhookEndpoint=${encodeURIComponent(hook)}`,
      {
        headers: { ...json, "x-webhook-secret": "s3cret" },
        body: '{"a":1}',
      },
    );
    expect(res.status).toBe(202);
    expect(res.text).toBe('{"run_id":"run-0001"}');
    expect(res.headers["content-type"]).toBe("application/json");
    expect(res.headers["x-request-id"]).toBe("run-0001");
    const call = fx.calls.findLast((c) => c.method === "Run")!;
    expect((call.request as RunRequest).webhookEndpoint).toBe(hook);
    expect(call.header.get("x-webhook-secret")).toBe("s3cret");
  });

  it("HTTP/2 (h2c): a streamed body over the limit is 413 before it ends, and the session still serves", async () => {
    const session = http2.connect(fx.h2url);
    try {
      const refused = await new Promise<{ status: number; text: string }>((resolve, reject) => {
        const stream = session.request({ ":method": "POST", ":path": "/v2/projects", ...json });
        const chunks: Buffer[] = [];
        let status = 0;
        stream.on("response", (h) => (status = Number(h[":status"])));
        stream.on("data", (c: Buffer) => chunks.push(c));
        stream.on("end", () => resolve({ status, text: Buffer.concat(chunks).toString() }));
        stream.on("error", reject);
        // Never ended: only the limit can make the server answer.
        stream.write("z".repeat(5 * LIMIT));
      });
      expect(refused.status).toBe(413);
      expect(JSON.parse(refused.text)).toEqual({
        code: "resource_exhausted",
        message: `request body larger than ${LIMIT} bytes`,
      });
      const next = await new Promise<number>((resolve, reject) => {
        const stream = session.request({ ":method": "GET", ":path": "/v2/identity" });
        let status = 0;
        stream.on("response", (h) => (status = Number(h[":status"])));
        stream.on("end", () => resolve(status));
        stream.on("error", reject);
        stream.resume();
        stream.end();
      });
      expect(next).toBe(200);
    } finally {
      session.close();
    }
  });
});

describe("transcoder query conversion", () => {
  const app = () => reflect(AppSchema, create(AppSchema));
  const set = (r: ReturnType<typeof app>, key: string, value: string) =>
    setFromText(r, resolveDotted(r.desc, key)!, value, `query parameter "${key}"`);

  it("nested fields with dots, repeated fields by repeating the key, by proto and JSON name", () => {
    const r = app();
    set(r, "runtime.command", "node");
    set(r, "runtime.command", "server.js");
    set(r, "scaling.minReplicas", "2");
    set(r, "scaling.max_replicas", "4");
    set(r, "env_names", "A");
    set(r, "envNames", "B");
    const msg = r.message as ReturnType<typeof create<typeof AppSchema>>;
    expect(msg.runtime?.command).toEqual(["node", "server.js"]);
    expect([msg.scaling?.minReplicas, msg.scaling?.maxReplicas]).toEqual([2, 4]);
    expect(msg.envNames).toEqual(["A", "B"]);
  });

  it("64-bit integers become bigint; out of range is an error", () => {
    const r = app();
    set(r, "deployment.bundle_bytes", "18446744073709551615");
    expect((r.message as ReturnType<typeof create<typeof AppSchema>>).deployment?.bundleBytes).toBe(
      18446744073709551615n,
    );
    expect(() => set(r, "deployment.bundle_bytes", "18446744073709551616")).toThrow(
      'query parameter "deployment.bundle_bytes": expected an unsigned 64-bit integer',
    );
    expect(() => set(r, "deployment.bundle_bytes", "-1")).toThrow(/unsigned 64-bit/);
  });

  it("floats, NaN and Infinity; garbage is an error", () => {
    const r = reflect(StatsBucketSchema, create(StatsBucketSchema));
    const sb = (key: string, v: string) => setFromText(r, resolveDotted(r.desc, key)!, v, key);
    sb("p50_ms", "1.5e3");
    sb("p95_ms", "-Infinity");
    sb("p99_ms", "NaN");
    const m = r.message as ReturnType<typeof create<typeof StatsBucketSchema>>;
    expect([m.p50Ms, m.p95Ms, Number.isNaN(m.p99Ms)]).toEqual([1500, -Infinity, true]);
    expect(() => sb("p50_ms", "1e400")).toThrow("p50_ms: expected a number");
    expect(() => sb("p50_ms", "12abc")).toThrow("p50_ms: expected a number");
    expect(() => sb("p50_ms", "")).toThrow("p50_ms: expected a number");
  });

  it("bytes from base64 and base64url (a query's '+' read as space is restored)", () => {
    const r = reflect(HttpBodySchema, create(HttpBodySchema));
    const data = () => [...(r.message as ReturnType<typeof create<typeof HttpBodySchema>>).data];
    setFromText(r, resolveDotted(r.desc, "data")!, "+/8=", "data");
    expect(data()).toEqual([0xfb, 0xff]);
    setFromText(r, resolveDotted(r.desc, "data")!, " /8", "data");
    expect(data()).toEqual([0xfb, 0xff]);
    setFromText(r, resolveDotted(r.desc, "data")!, "-_8", "data");
    expect(data()).toEqual([0xfb, 0xff]);
    expect(() => setFromText(r, resolveDotted(r.desc, "data")!, "***", "data")).toThrow("data: expected base64");
  });

  it("enums by name or number; an unknown value of a closed enum is an error", () => {
    const r = reflect(FieldDescriptorProtoSchema, create(FieldDescriptorProtoSchema));
    const type = () => (r.message as ReturnType<typeof create<typeof FieldDescriptorProtoSchema>>).type;
    setFromText(r, resolveDotted(r.desc, "type")!, "TYPE_STRING", "type");
    expect(type()).toBe(FieldDescriptorProto_Type.STRING);
    setFromText(r, resolveDotted(r.desc, "type")!, "8", "type");
    expect(type()).toBe(FieldDescriptorProto_Type.BOOL);
    expect(() => setFromText(r, resolveDotted(r.desc, "type")!, "99", "type")).toThrow(
      /type: expected one of TYPE_DOUBLE/,
    );
    expect(() => setFromText(r, resolveDotted(r.desc, "type")!, "STRING", "type")).toThrow(/expected one of/);
  });

  it("bools accept true/false/1/0 only; 32-bit ints are range-checked; timestamps read RFC 3339", () => {
    const r = app();
    expect(() => set(r, "scaling.cooldown", "4294967296")).toThrow("expected an unsigned 32-bit integer");
    expect(() => set(r, "scaling.cooldown", "1.5")).toThrow("expected an unsigned 32-bit integer");
    set(r, "created_at", "2025-01-02T03:04:05Z");
    expect(Number((r.message as ReturnType<typeof create<typeof AppSchema>>).createdAt?.seconds)).toBe(
      Date.UTC(2025, 0, 2, 3, 4, 5) / 1000,
    );
    expect(() => set(r, "created_at", "yesterday")).toThrow('query parameter "created_at"');
    const b = reflect(FieldDescriptorProtoSchema, create(FieldDescriptorProtoSchema));
    expect(() => setFromText(b, resolveDotted(b.desc, "proto3_optional")!, "yes", "p")).toThrow(
      "p: expected true, false, 1 or 0",
    );
    expect(() => setFromText(b, resolveDotted(b.desc, "proto3_optional")!, "", "p")).toThrow(
      "p: expected true, false, 1 or 0",
    );
  });

  it("names that lead nowhere resolve to nothing (ignored), maps and message lists cannot be set", () => {
    const r = app();
    expect(resolveDotted(r.desc, "nope")).toBeUndefined();
    expect(resolveDotted(r.desc, "replicas.host")).toBeUndefined();
    expect(resolveDotted(r.desc, "runtime.kind.x")).toBeUndefined();
    expect(() => set(r, "replicas", "x")).toThrow("field replicas cannot be set from text");
  });
});

describe("transcoder - CORS of a method's resources", () => {
  let fx: RestFixture;
  const ORIGIN = "https://app.example";
  const preflight = (origin: string) => ({
    origin,
    "access-control-request-method": "PUT",
    "access-control-request-headers": "authorization, content-type",
  });

  beforeAll(async () => {
    fx = await startRestFixture({ cors: { web: [ORIGIN], any: ["*"] } });
  });
  afterAll(() => fx?.close());

  it("a preflight from a listed origin is answered 204 by the transcoder, before any interceptor", async () => {
    const before = fx.intercepted.length;
    const res = await rest(fx.url, "OPTIONS", "/v4/p-dev/web/items", { headers: preflight(ORIGIN) });
    expect(res.status).toBe(204);
    expect(res.headers["access-control-allow-origin"]).toBe(ORIGIN);
    expect(res.headers["access-control-allow-methods"]).toBe("POST, GET, PUT, PATCH, DELETE, HEAD, OPTIONS");
    expect(res.headers["access-control-allow-headers"]).toBe("authorization, content-type");
    expect(res.headers["access-control-max-age"]).toBe("600");
    expect(res.headers.vary).toContain("Origin");
    expect(fx.intercepted.length).toBe(before);
  });

  it("a preflight from an origin not listed is answered without allowing it; '*' allows any", async () => {
    const refused = await rest(fx.url, "OPTIONS", "/v4/p-dev/web/items", {
      headers: preflight("https://evil.example"),
    });
    expect(refused.status).toBe(204);
    expect(refused.headers["access-control-allow-origin"]).toBeUndefined();
    expect(refused.headers["access-control-allow-methods"]).toBeUndefined();
    const any = await rest(fx.url, "OPTIONS", "/v4/p-dev/any/items", { headers: preflight("http://localhost:3000") });
    expect(any.headers["access-control-allow-origin"]).toBe("http://localhost:3000");
  });

  it("an answer to a listed origin carries Access-Control-Allow-Origin and Vary, errors included", async () => {
    const ok = await rest(fx.url, "GET", "/v4/p-dev/web/items", { headers: { origin: ORIGIN } });
    expect(ok.status).toBe(200);
    expect(ok.headers["access-control-allow-origin"]).toBe(ORIGIN);
    expect(ok.headers["access-control-expose-headers"]).toBe("X-Request-Id");
    expect(ok.headers.vary).toBe("Origin");
    const denied = await rest(fx.url, "POST", "/v4/p-dev/web/run", {
      headers: { origin: ORIGIN, authorization: "Bearer bad" },
    });
    expect(denied.status).toBe(401);
    expect(denied.headers["access-control-allow-origin"]).toBe(ORIGIN);
    const noOrigin = await rest(fx.url, "GET", "/v4/p-dev/web/items");
    expect(noOrigin.headers.vary).toBeUndefined();
    expect(noOrigin.headers["access-control-allow-origin"]).toBeUndefined();
    const other = await rest(fx.url, "GET", "/v4/p-dev/web/items", { headers: { origin: "https://evil.example" } });
    expect(other.headers["access-control-allow-origin"]).toBeUndefined();
    expect(other.headers.vary).toBe("Origin");
  });

  it("without a list, OPTIONS (a preflight too) goes to the handler and nothing is added", async () => {
    const res = await rest(fx.url, "OPTIONS", "/v4/p-dev/hello/items", { headers: preflight(ORIGIN) });
    expect(res.status).toBe(200);
    expect(lastCall(fx, "Run").exchange?.method).toBe("OPTIONS");
    expect(res.headers["access-control-allow-origin"]).toBeUndefined();
    expect(res.headers.vary).toBeUndefined();
  });
});
