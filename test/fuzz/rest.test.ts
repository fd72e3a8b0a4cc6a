// Fuzzing the REST transcoder through the real one-port server (startServer:
// protocol sniffing, connection deadlines, the transcoder) serving the test
// implementations of the REST fixture. Each case is one connection carrying
// arbitrary bytes in the method, target, version, header names and values,
// and body (framed by Content-Length or chunked, so that the server can tell
// where it ends). Properties: every request gets an answer, never a 500,
// every error (4xx/5xx) is a JSON {"code","message"}; the server survives.
import assert from "node:assert/strict";
import fc from "fast-check";
import { Code, ConnectError } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { InvocationService } from "../../gen/skiff/invocation/v4/invocation_pb.js";
import { ManagementService } from "../../gen/skiff/management/v2/management_pb.js";
import { silentLogger } from "../../services/config/logger.js";
import { HealthState } from "../../services/server/health.js";
import { startServer, type SkiffServer } from "../../services/server/server.js";
import { interceptor, invocation, management, type Call } from "../helpers/rest-fixture.js";
import { exchange } from "../helpers/raw-http.js";
import { FUZZ_RUNS, fuzzTimeout } from "./runs.js";

const LIMIT = 512;

const latin1 = (s: string) => Buffer.from(s, "latin1");
/** Bytes that HTTP/1.1 lets into a token (method, header name). */
const TCHARS = "!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz".split("");
/** Any byte but CR and LF: inside a line, a request keeps its shape, whatever the line holds. */
const lineByte = fc.integer({ min: 0, max: 255 }).filter((b) => b !== 13 && b !== 10);
const lineBytes = (maxLength: number) =>
  fc.array(lineByte, { maxLength }).map((b) => Buffer.from(b).toString("latin1"));
const token = (maxLength: number) =>
  fc.array(fc.constantFrom(...TCHARS), { minLength: 1, maxLength }).map((c) => c.join(""));

const method = fc.oneof(
  { weight: 16, arbitrary: fc.constantFrom("GET", "POST", "DELETE") },
  { weight: 4, arbitrary: fc.constantFrom("PUT", "PATCH", "OPTIONS", "HEAD", "PROPFIND", "TRACE", "get", "CONNECT") },
  { weight: 1, arbitrary: token(10) },
  { weight: 1, arbitrary: lineBytes(8) },
);

/** Characters of a path: the usual, the reserved, and bytes no URL should hold. */
const pathChar = fc.oneof(
  { weight: 6, arbitrary: fc.constantFrom(..."abcxyz019-_.~:;,=@!$&'()*+AZ".split("")) },
  {
    weight: 2,
    arbitrary: fc.constantFrom("%", "%2", "%zz", "%2F", "%2f", "%00", "%C3%A9", "%E0%A4%A", "%FF", "#", "?", "//"),
  },
  { weight: 1, arbitrary: fc.integer({ min: 0, max: 255 }).map((b) => `%${b.toString(16).padStart(2, "0")}`) },
);
/** Any byte but space, CR and LF: most make the request one the parser refuses. */
const rawChar = lineByte.filter((b) => b !== 32).map((b) => String.fromCharCode(b));
const segment = fc.oneof(
  { weight: 12, arbitrary: fc.array(pathChar, { maxLength: 10 }).map((c) => c.join("")) },
  { weight: 1, arbitrary: fc.array(fc.oneof(pathChar, rawChar), { maxLength: 10 }).map((c) => c.join("")) },
  {
    weight: 8,
    arbitrary: fc.constantFrom("", ".", "..", "p-dev", "hello", "missing", "runs", "r-1:cancel", ":cancel", "a:b:c"),
  },
  { weight: 2, arbitrary: fc.nat({ max: 3000 }).map((n) => "x".repeat(n)) },
);
const TEMPLATES = [
  "/v2/identity",
  "/v2/projects",
  "/v2/projects/{}",
  "/v2/projects/{}/service-accounts",
  "/v2/projects/{}/service-accounts/{}",
  "/v2/projects/{}/apps",
  "/v2/projects/{}/apps/{}/runs",
  "/v2/projects/{}/apps/{}/runs/{}",
  "/v2/projects/{}/apps/{}/runs/{}:cancel",
  "/v2/projects/{}/apps/{}/runs/{}/webhook:redeliver",
  "/v2/projects/{}/apps/{}/stats",
  "/v4/{}/{}/{}",
  "/v4/{}/{}/{}/{}/{}",
  "/{}",
  "{}",
  "*",
  "/healthz",
  "/metrics",
  "/skiff.management.v2.ManagementService/GetIdentity",
];
const path = fc
  .tuple(fc.constantFrom(...TEMPLATES), fc.array(segment, { minLength: 5, maxLength: 5 }))
  .map(([t, segs]) => {
    let i = 0;
    return t.replaceAll("{}", () => segs[i++]);
  });
const queryPart = fc.oneof(
  fc.constantFrom("async", "webhookEndpoint", "page_size", "pageSize", "status", "body.data", "body", "project_id", ""),
  fc.array(pathChar, { maxLength: 8 }).map((c) => c.join("")),
);
const query = fc
  .array(fc.tuple(queryPart, fc.option(queryPart, { nil: undefined })), { maxLength: 4 })
  .map((pairs) =>
    pairs.length === 0 ? "" : `?${pairs.map(([k, v]) => (v === undefined ? k : `${k}=${v}`)).join("&")}`,
  );
const target = fc.tuple(path, query).map(([p, q]) => (p + q).replaceAll(" ", "%20"));
const version = fc.oneof(
  { weight: 20, arbitrary: fc.constant("HTTP/1.1") },
  { weight: 1, arbitrary: fc.constantFrom("HTTP/1.0", "HTTP/2.0", "HTTP/1.2", "HTTP/0.9", "HTTX/1.1", "") },
);

const headerName = fc.oneof(
  {
    weight: 24,
    arbitrary: fc.constantFrom(
      "authorization",
      "content-type",
      "x-webhook-secret",
      "idempotency-key",
      "connect-protocol-version",
      "connect-timeout-ms",
      "grpc-timeout",
      "accept",
      "accept-encoding",
      "content-encoding",
      "te",
      "x-request-id",
      "upgrade",
      "connection",
      "expect",
      "x-custom",
    ),
  },
  { weight: 1, arbitrary: token(12) },
  { weight: 1, arbitrary: fc.constant("") },
  { weight: 1, arbitrary: lineBytes(8) },
);
const headerValue = fc.oneof(
  {
    weight: 10,
    arbitrary: fc.constantFrom(
      "application/json",
      "application/json; charset=utf-16",
      "text/plain",
      "application/proto",
      "application/connect+json",
      "application/grpc",
      "application/grpc-web",
      "*/*",
      "Bearer bad",
      "Bearer ",
      "1",
      "0",
      "-1",
      "999999999999999999999",
      "100-continue",
      "gzip",
      "br",
      "identity",
      "trailers",
      "websocket",
      "close",
      "keep-alive",
      "",
    ),
  },
  { weight: 4, arbitrary: fc.string({ maxLength: 30 }).filter((s) => /^[\x20-\x7e]*$/.test(s)) },
  { weight: 1, arbitrary: lineBytes(30) },
);
const headers = fc.array(fc.tuple(headerName, headerValue), { maxLength: 4 });

const body = fc.oneof(
  { weight: 2, arbitrary: fc.constant(undefined) },
  {
    weight: 2,
    arbitrary: fc
      .constantFrom(
        "{}",
        "{",
        "null",
        "[]",
        "42",
        '"x"',
        '{"name":"n"}',
        '{"name":1}',
        '{"unknown":true}',
        "\u00ff\u00fe",
      )
      .map((s) => Buffer.from(s)),
  },
  { weight: 2, arbitrary: fc.json({ maxDepth: 3 }).map((s) => Buffer.from(s)) },
  { weight: 2, arbitrary: fc.uint8Array({ maxLength: 2 * LIMIT }).map((b) => Buffer.from(b)) },
  { weight: 1, arbitrary: fc.nat({ max: 3 * LIMIT }).map((n) => Buffer.from("{".repeat(n))) },
);

interface Request {
  method: string;
  target: string;
  version: string;
  host: boolean;
  headers: [string, string][];
  body: Buffer | undefined;
  chunks: number[] | undefined;
}

const request: fc.Arbitrary<Request> = fc.record({
  method,
  target,
  version,
  host: fc.oneof({ weight: 12, arbitrary: fc.constant(true) }, { weight: 1, arbitrary: fc.constant(false) }),
  headers,
  body,
  // Chunked: the sizes the body is cut into (an empty list: one chunk).
  chunks: fc.option(fc.array(fc.nat({ max: 300 }), { maxLength: 4 }), { nil: undefined }),
});

/** The request's bytes: head as given, the body framed by Content-Length or chunked. */
function encode(r: Request): Buffer {
  const lines = [`${r.method} ${r.target} ${r.version}`.trimEnd()];
  if (r.host) lines.push("host: fuzz");
  for (const [name, value] of r.headers) lines.push(`${name}: ${value}`);
  const parts: Buffer[] = [];
  if (r.body !== undefined && r.chunks === undefined) lines.push(`content-length: ${r.body.length}`);
  if (r.body !== undefined && r.chunks !== undefined) {
    lines.push("transfer-encoding: chunked");
    let at = 0;
    for (const size of [...r.chunks, r.body.length]) {
      const piece = r.body.subarray(at, at + size);
      at += piece.length;
      if (piece.length > 0) parts.push(latin1(`${piece.length.toString(16)}\r\n`), piece, latin1("\r\n"));
    }
    parts.push(latin1("0\r\n\r\n"));
  } else if (r.body !== undefined) parts.push(r.body);
  return Buffer.concat([latin1(`${lines.join("\r\n")}\r\n\r\n`), ...parts]);
}

describe("fuzz: REST transcoder on the real server", () => {
  let server: SkiffServer;
  const calls: Call[] = [];
  beforeAll(async () => {
    const run = invocation(calls).run!;
    // Live and ready: the probes answer 200 (their 503 is a probe's answer, not an API error).
    const health = new HealthState();
    health.setNatsConnected(true);
    health.setProvisioned();
    server = await startServer({
      host: "127.0.0.1",
      port: 0,
      maxBodyBytes: LIMIT,
      logger: silentLogger,
      health,
      restServices: [InvocationService, ManagementService],
      routes: (router) => {
        // The fixture's app "boom" throws a plain Error (a legitimate 500): here it does not exist.
        router.service(InvocationService, {
          run: (req, ctx) => {
            if (req.appName === "boom") throw new ConnectError("app not found", Code.NotFound);
            return run(req, ctx);
          },
        });
        router.service(ManagementService, management(calls));
      },
      interceptors: [interceptor([])],
      // Short deadlines for connections that send no complete head: a case never waits long.
      connections: { firstBytesTimeoutMs: 2_000, headersTimeoutMs: 2_000, keepAliveTimeoutMs: 1_000 },
    });
  });
  afterAll(() => server?.close(0));

  it(
    `arbitrary requests: always an answer, never a 500, errors are JSON {code, message} (${FUZZ_RUNS} cases)`,
    async () => {
      const statuses = new Map<number, number>();
      await fc.assert(
        fc.asyncProperty(request, async (r) => {
          calls.length = 0;
          const answer = await exchange(server.port, encode(r), r.method === "HEAD");
          assert.notEqual(answer, "closed", "the connection closed without an answer");
          if (answer === "closed") return;
          statuses.set(answer.status, (statuses.get(answer.status) ?? 0) + 1);
          assert.ok(answer.status >= 200 && answer.status < 600, `status ${answer.status}`);
          // Connect's own paths answer in Connect's protocol (a bare 405 or 415 for a request that is not one).
          const rpc = /^\/(skiff|grpc)\./.test(r.target);
          // connect-es answers a binary request message that does not parse with `internal` (its JSON
          // counterpart with invalid_argument), before any interceptor runs: the library's, known, not the transcoder's.
          const binaryParse = rpc && answer.body.toString().startsWith('{"code":"internal","message":"parse binary:');
          // 501 (a method the fixture leaves unimplemented) and 503/504 are answers; 500 is a bug.
          if (!binaryParse) assert.notEqual(answer.status, 500, `500: ${answer.body.toString()}`);
          if (answer.status >= 400 && r.method !== "HEAD" && !rpc) {
            assert.match(answer.headers.get("content-type") ?? "", /^application\/json/, `status ${answer.status}`);
            const error = JSON.parse(answer.body.toString()) as { code: unknown; message: unknown };
            assert.equal(typeof error.code, "string");
            assert.equal(typeof error.message, "string");
          }
        }),
        { numRuns: FUZZ_RUNS, timeout: 10_000 },
      );
      console.log("REST answers by status:", Object.fromEntries([...statuses].sort((a, b) => a[0] - b[0])));
      // The cases reach handlers, not only the parser's refusals.
      expect(statuses.get(200) ?? 0).toBeGreaterThan(FUZZ_RUNS / 50);
      const alive = await exchange(server.port, latin1("GET /v2/identity HTTP/1.1\r\nhost: x\r\n\r\n"));
      expect(alive !== "closed" && alive.status).toBe(200);
    },
    fuzzTimeout(40),
  );
});
