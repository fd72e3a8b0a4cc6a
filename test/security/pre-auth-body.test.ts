// Bodies sent without a valid token, attacked: every request below announces
// a 64 MiB body (DeployApp takes up to SKIFF_MAX_BUNDLE_BYTES) and sends
// 1 KiB of it. Connect parses a body before any interceptor, and REST read it
// before calling the handler, so such a caller had the whole body buffered
// and parsed for it before its 401 (90 MB sent without a token held 2 GB of
// the server's memory and 6 s of its CPU). Now a call is judged by its token
// first, on every protocol: the refusal comes while the body is still being
// sent, in the caller's protocol. Real skiff, real nats-server.
import http2 from "node:http2";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { exchange, type RawAnswer } from "../helpers/raw-http.js";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";

const DAY_MS = 24 * 60 * 60 * 1000;
const ANNOUNCED = 64 * 1024 * 1024;
const SENT = Buffer.alloc(1024, 0x41);
const DEPLOY = "/skiff.management.v2.ManagementService/DeployApp";
const WATCH = "/skiff.management.v2.ManagementService/WatchRuns";

let t: TestSkiff;
let port: number;

beforeAll(async () => {
  t = await startTestSkiff();
  port = Number(new URL(t.url).port);
}, 60_000);
afterAll(async () => {
  await t?.close();
});

/** A request whose head announces ANNOUNCED bytes of body (or chunks, never ended), and 1 KiB of it. */
function partial(method: string, path: string, headers: Record<string, string>, chunked = false): Buffer {
  const lines = [`${method} ${path} HTTP/1.1`, "host: localhost"];
  for (const [name, value] of Object.entries(headers)) lines.push(`${name}: ${value}`);
  lines.push(chunked ? "transfer-encoding: chunked" : `content-length: ${ANNOUNCED}`);
  const head = Buffer.from(`${lines.join("\r\n")}\r\n\r\n`, "latin1");
  const body = chunked
    ? Buffer.concat([Buffer.from(`${SENT.length.toString(16)}\r\n`), SENT, Buffer.from("\r\n")])
    : SENT;
  return Buffer.concat([head, body]);
}

/** The answer, which must come while the body is still owed: no answer within 5 s fails. */
async function answerOf(request: Buffer): Promise<RawAnswer> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<"late">((resolve) => (timer = setTimeout(() => resolve("late"), 5_000)));
  const answer = await Promise.race([exchange(port, request), late]).finally(() => clearTimeout(timer));
  if (answer === "late") throw new Error("no answer before the body was sent whole: the body was being read");
  if (answer === "closed") throw new Error("the connection closed without an answer");
  return answer;
}

const json = (a: RawAnswer) => JSON.parse(a.body.toString()) as { code: string; message: string };

describe("a call without a valid token is refused before its body is read", () => {
  it("REST: DeployApp with no token, a sync run with a token that is not one, a chunked body", async () => {
    const deploy = await answerOf(
      partial("POST", "/v2/projects/p-dev/apps", { "content-type": "application/octet-stream" }),
    );
    expect(deploy.status).toBe(401);
    expect(json(deploy)).toEqual({
      code: "unauthenticated",
      message: "missing bearer token: send Authorization: Bearer <token>",
    });
    expect(deploy.headers.get("www-authenticate")).toBe('Bearer realm="skiff"');

    const run = await answerOf(
      partial("POST", "/v4/p-dev/anything/run", { authorization: "Bearer not-a-token", "content-type": "text/plain" }),
    );
    expect(run.status).toBe(401);
    expect(json(run).code).toBe("unauthenticated");
    // Every answer to an invocation carries its request id, refusals included.
    expect(run.headers.get("x-request-id")).toMatch(/^[0-9a-f-]{36}$/);

    const chunked = await answerOf(
      partial("POST", "/v2/projects/p-dev/apps", { "content-type": "application/octet-stream" }, true),
    );
    expect(chunked.status).toBe(401);
  });

  it("Connect: unary JSON and binary, and a server stream's end", async () => {
    for (const type of ["application/json", "application/proto", "application/json; charset=utf-8"]) {
      const a = await answerOf(partial("POST", DEPLOY, { "content-type": type, "connect-protocol-version": "1" }));
      expect(a.status, type).toBe(401);
      expect(a.headers.get("content-type")).toBe("application/json");
      expect(json(a).code).toBe("unauthenticated");
      expect(a.headers.get("www-authenticate")).toBe('Bearer realm="skiff"');
    }
    const stream = await answerOf(partial("POST", WATCH, { "content-type": "application/connect+json" }));
    expect(stream.status).toBe(200);
    expect(stream.headers.get("content-type")).toBe("application/connect+json");
    // One envelope flagged end-of-stream (2), its JSON the error.
    expect(stream.body[0]).toBe(2);
    expect(stream.body.readUInt32BE(1)).toBe(stream.body.length - 5);
    const end = JSON.parse(stream.body.subarray(5).toString()) as { error: { code: string } };
    expect(end.error.code).toBe("unauthenticated");
  });

  it("gRPC-Web over HTTP/1.1 and gRPC over h2c: grpc-status 16 in a trailers-only answer", async () => {
    const web = await answerOf(partial("POST", DEPLOY, { "content-type": "application/grpc-web+proto" }));
    expect(web.status).toBe(200);
    expect(web.headers.get("grpc-status")).toBe("16");
    expect(web.headers.get("grpc-message")).toMatch(/^missing bearer token/);

    const client = http2.connect(t.url);
    try {
      const headers = await new Promise<http2.IncomingHttpHeaders>((resolve, reject) => {
        const stream = client.request({
          ":method": "POST",
          ":path": DEPLOY,
          "content-type": "application/grpc",
          te: "trailers",
          authorization: "Bearer not-a-token",
        });
        stream.on("response", resolve);
        stream.on("error", reject);
        // A message announced at 64 MiB, 1 KiB of it sent, the stream left open.
        const prefix = Buffer.alloc(5);
        prefix.writeUInt32BE(ANNOUNCED, 1);
        stream.write(Buffer.concat([prefix, SENT]));
        setTimeout(() => reject(new Error("no answer before the message was sent whole")), 5_000).unref();
      });
      expect(headers[":status"]).toBe(200);
      expect(headers["grpc-status"]).toBe("16");
      expect(headers["grpc-message"]).toBe("invalid bearer token");
    } finally {
      client.close();
    }
  });

  it("a deleted service account's token is refused before the body too", async () => {
    const admin = t.management();
    const sa = await admin.createServiceAccount({
      projectId: "p-dev",
      name: "gone",
      expiresAt: timestampFromDate(new Date(Date.now() + DAY_MS)),
    });
    await admin.deleteServiceAccount({ projectId: "p-dev", serviceAccountId: sa.serviceAccount!.serviceAccountId });
    await expect
      .poll(
        async () =>
          (
            await answerOf(
              partial("POST", "/v2/projects/p-dev/apps", {
                authorization: `Bearer ${sa.token}`,
                "content-type": "application/octet-stream",
              }),
            )
          ).status,
        { timeout: 5_000 },
      )
      .toBe(401);
  });

  it("what stays as it was: open services, other media types, and calls with a valid token", async () => {
    // Health is open: its body is read and answered without a token.
    const health = await fetch(`${t.url}/grpc.health.v1.Health/Check`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: "{}",
    });
    expect(health.status).toBe(200);
    // A media type no RPC protocol has is refused as before (415), without the body either.
    const other = await answerOf(partial("POST", DEPLOY, { "content-type": "text/plain" }));
    expect(other.status).toBe(415);
    // A valid token: the body is read, and the call judged in full (another project's is refused, 403).
    const mine = await fetch(`${t.url}/skiff.management.v2.ManagementService/ListApps`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${t.devToken}` },
      body: JSON.stringify({ projectId: "p-dev" }),
    });
    expect(mine.status).toBe(200);
    const theirs = await fetch(`${t.url}/skiff.management.v2.ManagementService/ListApps`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${t.devToken}` },
      body: JSON.stringify({ projectId: "p-other" }),
    });
    expect(theirs.status).toBe(403);
  });
});
