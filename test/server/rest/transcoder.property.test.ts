// Property: whatever arrives on the socket (method, path, query, headers,
// body), the transcoder never answers 500, answers every error with a JSON
// `{code, message}` body, and the server keeps running. The handlers of the fixture
// only throw ConnectErrors here, so any 500 would be a transcoder bug.
import http from "node:http";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startRestFixture, type RestFixture } from "../../helpers/rest-fixture.js";

const LIMIT = 512;

/** Characters Node's client lets through in a request path, '%' and ':' included. */
const PATH_CHARS = "abcxyz019-_.~%:;,=@!$&'()*+AZ".split("");

const segment = fc.oneof(
  fc.constantFrom(
    "",
    ".",
    "..",
    "%",
    "%2",
    "%zz",
    "%2F",
    "%E0%A4%A",
    "%C3%A9",
    "run",
    "runs",
    "apps",
    "p-dev",
    "hello",
    "r-1:cancel",
    "webhook:redeliver",
    ":cancel",
    "a:b:c",
  ),
  fc.array(fc.constantFrom(...PATH_CHARS), { maxLength: 12 }).map((cs) => cs.join("")),
  fc.nat({ max: 3000 }).map((n) => "x".repeat(n)),
);

const prefix = fc.constantFrom(
  "",
  "/v2",
  "/v2/identity",
  "/v2/projects",
  "/v2/projects/p-dev",
  "/v2/projects/p-dev/apps/hello/runs",
  "/v2/projects/p-dev/service-accounts",
  "/v4/p-dev/hello",
  "/v4",
  "/v3",
);

/** Real route templates, "{}" filled with random segments: most requests reach a handler. */
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
  "/v4/{}/{}/{}",
  "/v4/{}/{}/{}/{}/{}",
];
const routePath = fc
  .tuple(fc.constantFrom(...TEMPLATES), fc.array(segment, { minLength: 5, maxLength: 5 }))
  .map(([t, segs]) => {
    let i = 0;
    return t.replaceAll("{}", () => segs[i++]);
  });

// "boom" is the fixture's app whose handler throws a plain Error: a legitimate 500.
const path = fc
  .oneof(
    { weight: 3, arbitrary: routePath },
    {
      weight: 1,
      arbitrary: fc.tuple(prefix, fc.array(segment, { maxLength: 6 })).map(([p, segs]) => [p, ...segs].join("/")),
    },
  )
  .map((p) => p.replaceAll("boom", "bxom") || "/");

const queryValue = fc.oneof(
  fc.constantFrom("", "true", "false", "1", "0", "-1", "abc", "1e400", "NaN", "4294967296", "%", "%zz", "+", "=", "&&"),
  fc.string({ maxLength: 20 }).map(encodeURIComponent),
);
const queryKey = fc.oneof(
  fc.constantFrom(
    "async",
    "webhookEndpoint",
    "webhook_endpoint",
    "page_size",
    "pageSize",
    "async_only",
    "status",
    "limit",
    "run_id",
    "body.data",
    "body",
    "project_id",
    "a.b.c",
    "",
    "%",
    "x.",
  ),
  fc.string({ maxLength: 10 }).map(encodeURIComponent),
);
const query = fc
  .array(fc.tuple(queryKey, queryValue), { maxLength: 5 })
  .map((pairs) => (pairs.length === 0 ? "" : `?${pairs.map(([k, v]) => `${k}=${v}`).join("&")}`));

const method = fc.oneof(
  { weight: 4, arbitrary: fc.constantFrom("GET", "POST", "DELETE") },
  { weight: 1, arbitrary: fc.constantFrom("PUT", "PATCH", "OPTIONS", "PROPFIND", "HEAD") },
);

const contentType = fc.option(
  fc.oneof(
    fc.constantFrom(
      "application/json",
      "application/json; charset=utf-16",
      "text/plain",
      "application/x-www-form-urlencoded",
      "multipart/form-data; boundary=x",
      "application/proto",
      "application/connect+json",
      "application/grpc",
      "*/*",
      ";",
      "application/",
      "a/b+json",
    ),
    fc.string({ maxLength: 30 }).filter((s) => /^[\x20-\x7e]*$/.test(s)),
  ),
  { nil: undefined },
);

const body = fc.option(
  fc.oneof(
    fc.constantFrom(
      "{}",
      "{",
      "null",
      "[]",
      "42",
      '"x"',
      '{"name":"n"}',
      '{"name":1}',
      '{"unknown":true}',
      '{"project_id":"p-x","name":"y"}',
      "\u00ff\u00fe",
    ),
    fc.json({ maxDepth: 3 }),
    fc.uint8Array({ maxLength: 2 * LIMIT }).map((b) => Buffer.from(b)),
    fc.nat({ max: 3 * LIMIT }).map((n) => "{".repeat(n)),
  ),
  { nil: undefined },
);

const extraHeaders = fc.dictionary(
  fc.constantFrom(
    "authorization",
    "x-webhook-secret",
    "idempotency-key",
    "connect-protocol-version",
    "connect-timeout-ms",
    "grpc-timeout",
    "accept-encoding",
    "content-encoding",
    "te",
    "x-custom",
  ),
  fc.string({ maxLength: 20 }).filter((s) => /^[\x20-\x7e]*$/.test(s)),
  { maxKeys: 4 },
);

interface Sent {
  status: number;
  contentType: string | undefined;
  text: string;
}

function send(
  base: string,
  m: string,
  target: string,
  headers: Record<string, string>,
  payload: string | Buffer | undefined,
  chunked: boolean,
): Promise<Sent> {
  return new Promise((resolve, reject) => {
    const all = { ...headers };
    // Explicit framing: Node sends the body of a GET, DELETE or OPTIONS without any, which the server would read as the next request.
    if (payload !== undefined) {
      if (chunked) all["transfer-encoding"] = "chunked";
      else all["content-length"] = String(Buffer.byteLength(payload));
    }
    const req = http.request(`${base}${target}`, { method: m, headers: all, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () =>
        resolve({
          status: res.statusCode ?? 0,
          contentType: res.headers["content-type"],
          text: Buffer.concat(chunks).toString(),
        }),
      );
      res.on("error", reject);
    });
    // The server may answer (413) and stop reading before the body is sent.
    req.on("error", (e: NodeJS.ErrnoException) =>
      e.code === "ECONNRESET" || e.code === "EPIPE" ? undefined : reject(e),
    );
    if (payload !== undefined && chunked) req.write(payload);
    req.end(chunked ? undefined : payload);
  });
}

describe("transcoder property", () => {
  let fx: RestFixture;
  beforeAll(async () => {
    fx = await startRestFixture({ maxBodyBytes: LIMIT });
  });
  afterAll(() => fx?.close());

  it("random requests never get a 500, errors are JSON {code, message}, the server survives", async () => {
    await fc.assert(
      fc.asyncProperty(
        method,
        path,
        query,
        contentType,
        extraHeaders,
        body,
        fc.boolean(),
        async (m, p, q, ct, hs, b, chunked) => {
          const headers: Record<string, string> = { ...hs };
          if (ct !== undefined) headers["content-type"] = ct;
          const res = await send(fx.url, m, p + q, headers, b, chunked);
          expect(res.status).toBeGreaterThanOrEqual(200);
          // 501 (a method the fixture leaves unimplemented) is a legitimate answer; 500 never is.
          expect(res.status).not.toBe(500);
          expect(res.status).toBeLessThan(600);
          if (res.status >= 400 && m !== "HEAD") {
            expect(res.contentType).toBe("application/json");
            const error = JSON.parse(res.text) as { code: unknown; message: unknown };
            expect(typeof error.code).toBe("string");
            expect(typeof error.message).toBe("string");
          }
        },
      ),
      { numRuns: 300 },
    );
    const alive = await send(fx.url, "GET", "/v2/identity", {}, undefined, false);
    expect(alive.status).toBe(200);
  });
});
