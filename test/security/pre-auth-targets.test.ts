// The token gate before the body, attacked by an outsider (no valid token)
// on a real skiff: odd request targets, methods, media types, encodings,
// upgrades and malformed heads, each announcing a 64 MiB body and sending
// 1 KiB of it. A gate that holds answers while the body is still owed (no
// answer in 5 s means the server was reading the body) and never with 500.
// Real skiff, real nats-server.
import http2 from "node:http2";
import net from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { exchange, type RawAnswer } from "../helpers/raw-http.js";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";

const ANNOUNCED = 64 * 1024 * 1024;
const SENT = Buffer.alloc(1024, 0x41);
const SVC = "/skiff.management.v2.ManagementService";
const DEPLOY = `${SVC}/DeployApp`;
const WATCH = `${SVC}/WatchRuns`;

let t: TestSkiff;
let port: number;

beforeAll(async () => {
  t = await startTestSkiff();
  port = Number(new URL(t.url).port);
}, 60_000);
afterAll(async () => {
  await t?.close();
});

function partial(
  method: string,
  target: string,
  headers: Record<string, string>,
  body: "announced" | "chunked" | Buffer = "announced",
): Buffer {
  const lines = [`${method} ${target} HTTP/1.1`, "host: localhost"];
  for (const [name, value] of Object.entries(headers)) lines.push(`${name}: ${value}`);
  if (body === "chunked") lines.push("transfer-encoding: chunked");
  else lines.push(`content-length: ${body === "announced" ? ANNOUNCED : body.length}`);
  const head = Buffer.from(`${lines.join("\r\n")}\r\n\r\n`, "latin1");
  if (body === "chunked")
    return Buffer.concat([head, Buffer.from(`${SENT.length.toString(16)}\r\n`), SENT, Buffer.from("\r\n")]);
  return Buffer.concat([head, body === "announced" ? SENT : body]);
}

/** The answer, or "late" when none came within 5 s (the body was being read), or "closed". */
async function answerOf(request: Buffer, head = false): Promise<RawAnswer | "late" | "closed"> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<"late">((resolve) => (timer = setTimeout(() => resolve("late"), 5_000)));
  return await Promise.race([exchange(port, request, head), late]).finally(() => clearTimeout(timer));
}

const statusOf = (a: RawAnswer | "late" | "closed") => (typeof a === "string" ? a : a.status);

/** A Connect envelope: flags 0, the length, the bytes. */
function envelope(data: Buffer): Buffer {
  const prefix = Buffer.alloc(5);
  prefix.writeUInt32BE(data.length, 1);
  return Buffer.concat([prefix, data]);
}

describe("a media type Connect's streaming regex accepts and the gate does not know", () => {
  // Connect's streaming content type is /^application\/connect\+?(json|proto)$/: the "+" is optional,
  // while the gate (admit.ts protocolOf) knows only "application/connect+json" and leaves any other
  // type to the adapter. Held: the adapter answers such a type 415, without reading or parsing the body.
  for (const type of ["application/connectjson", "application/connectproto", "application/connectjson; charset=utf-8"])
    it(`WatchRuns as ${type} without a token: no message parsed before a refusal`, async () => {
      const broken = envelope(Buffer.from('{"projectId": '));
      const a = await answerOf(partial("POST", WATCH, { "content-type": type }, broken));
      expect(statusOf(a)).toBe(415);
      const chunked = await answerOf(partial("POST", WATCH, { "content-type": type }, "chunked"));
      expect(statusOf(chunked)).toBe(415);
    });
});

describe("odd request targets on RPC paths, without a token", () => {
  const cases: [string, string][] = [
    ["query string", `${DEPLOY}?x=1`],
    ["empty query", `${DEPLOY}?`],
    ["double slash in front", `/${DEPLOY}`],
    ["trailing slash", `${DEPLOY}/`],
    ["fragment", `${DEPLOY}#x`],
    ["percent-encoded letter", `${SVC}/%44eployApp`],
    ["percent-encoded slash", `${SVC}%2FDeployApp`],
    ["dot segments", `${SVC}/x/../DeployApp`],
    ["absolute form", `http://localhost${DEPLOY}`],
    ["lower-case service", DEPLOY.toLowerCase()],
    ["unknown method of the service", `${SVC}/DeployAppX`],
    ["unknown service", "/nope.v1.Nope/Call"],
    ["open service, unknown method", "/grpc.health.v1.Health/Nope"],
  ];
  for (const type of ["application/proto", "application/grpc-web+proto", "application/connect+json"])
    it(`answered at once, never 500 (${type})`, async () => {
      for (const [what, target] of cases) {
        const a = await answerOf(partial("POST", target, { "content-type": type }));
        const status = statusOf(a);
        expect(status, what).not.toBe("late");
        expect(status, what).not.toBe(500);
        // Whatever the answer, it is a refusal or a miss, never a served call.
        if (typeof a === "string") continue;
        if (a.headers.get("grpc-status") !== undefined) expect(a.headers.get("grpc-status"), what).not.toBe("0");
        else if (status === 200)
          expect(a.body.toString("latin1"), what).toMatch(/"error":\{"code":"(unauthenticated|unimplemented)"/);
        else expect(status, what).toBeGreaterThanOrEqual(400);
      }
    });
});

describe("odd request targets and methods on REST paths, without a token", () => {
  const cases: [string, string, Record<string, string>][] = [
    ["POST", "/v2/projects/p-dev/apps", {}],
    ["POST", "/v2/projects/p-dev/apps/", {}],
    ["POST", "/v2/projects/p-dev/apps?x=1&async=true", {}],
    ["POST", "//v2/projects/p-dev/apps", {}],
    ["POST", "/v2//projects/p-dev/apps", {}],
    ["POST", "/v2/projects/p%2Ddev/apps", {}],
    ["POST", "/v2/projects/p-dev%2Fapps", {}],
    ["POST", "/%762/projects/p-dev/apps", {}],
    ["POST", "/v2/projects/p-dev/x/../apps", {}],
    ["POST", "http://localhost/v2/projects/p-dev/apps", {}],
    ["PUT", "/v2/projects/p-dev/apps", {}],
    ["PATCH", "/v2/projects/p-dev/apps", {}],
    ["DELETE", "/v2/projects/p-dev/apps/a", {}],
    ["GET", "/v2/projects/p-dev/apps", {}],
    ["HEAD", "/v2/projects/p-dev/apps", {}],
    ["OPTIONS", "/v2/projects/p-dev/apps", {}],
    ["OPTIONS", "/v2/projects/p-dev/apps", { origin: "https://x.example", "access-control-request-method": "POST" }],
    ["OPTIONS", "/v4/p-dev/app/run", { origin: "https://x.example", "access-control-request-method": "POST" }],
    ["POST", "/v4/p-dev/app/run", { origin: "https://x.example" }],
    ["POST", "/v4/p-dev/app/some/path?async=true", {}],
    ["POST", "/v4/p-dev/app/run", { expect: "100-continue" }],
    ["POST", "/v2/projects/p-dev/apps", { "content-encoding": "gzip" }],
    [
      "POST",
      "/v2/projects/p-dev/apps",
      { connection: "Upgrade, HTTP2-Settings", upgrade: "h2c", "http2-settings": "" },
    ],
    ["POST", "/v4/nope", {}],
    ["POST", "/v3/projects/p-dev/apps", {}],
    ["POST", "/metrics", {}],
    ["POST", "/healthz", {}],
    ["POST", "/", {}],
  ];
  it("answered while the body is owed, never 500", async () => {
    for (const [method, target, headers] of cases) {
      for (const body of ["announced", "chunked"] as const) {
        const what = `${method} ${target} ${JSON.stringify(headers)} ${body}`;
        const a = await answerOf(
          partial(method, target, { "content-type": "application/octet-stream", ...headers }, body),
          method === "HEAD",
        );
        const status = statusOf(a);
        expect(status, what).not.toBe("late");
        expect(status, what).not.toBe(500);
        if (typeof status === "number") expect(status, what).toBeGreaterThanOrEqual(400);
      }
    }
  });
});

describe("protocol corners of RPC paths, without a token", () => {
  it("Connect GET, gRPC-Web text, gzip, Expect, h2c upgrade, websocket upgrade: refused at once", async () => {
    const message = encodeURIComponent(JSON.stringify({ projectId: "p-dev" }));
    const requests: [string, Buffer][] = [
      ["connect GET", partial("GET", `${DEPLOY}?connect=v1&encoding=json&message=${message}`, {})],
      ["connect GET proto", partial("GET", `${WATCH}?connect=v1&encoding=proto&base64=1&message=AA`, {})],
      ["grpc-web-text", partial("POST", DEPLOY, { "content-type": "application/grpc-web-text" })],
      ["grpc over h1", partial("POST", DEPLOY, { "content-type": "application/grpc", te: "trailers" })],
      ["gzip", partial("POST", DEPLOY, { "content-type": "application/proto", "content-encoding": "gzip" })],
      [
        "connect stream gzip",
        partial("POST", WATCH, { "content-type": "application/connect+proto", "connect-content-encoding": "gzip" }),
      ],
      ["expect", partial("POST", DEPLOY, { "content-type": "application/json", expect: "100-continue" })],
      [
        "h2c upgrade",
        partial("POST", DEPLOY, {
          "content-type": "application/proto",
          connection: "Upgrade, HTTP2-Settings",
          upgrade: "h2c",
          "http2-settings": "AAMAAABkAARAAAAAAAIAAAAA",
        }),
      ],
      [
        "websocket upgrade",
        partial("POST", DEPLOY, {
          "content-type": "application/proto",
          connection: "Upgrade",
          upgrade: "websocket",
          "sec-websocket-version": "13",
          "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==",
        }),
      ],
      [
        "websocket upgrade to a REST path",
        partial("GET", "/v2/projects/p-dev/apps", {
          connection: "Upgrade",
          upgrade: "websocket",
          "sec-websocket-version": "13",
          "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==",
        }),
      ],
      ["no content type", partial("POST", DEPLOY, {})],
      ["content type with parameters", partial("POST", DEPLOY, { "content-type": "application/json; charset=utf-8" })],
      ["upper case type", partial("POST", DEPLOY, { "content-type": "APPLICATION/PROTO" })],
      ["PUT", partial("PUT", DEPLOY, { "content-type": "application/proto" })],
    ];
    for (const [what, request] of requests) {
      const a = await answerOf(request);
      const status = statusOf(a);
      expect(status, what).not.toBe("late");
      expect(status, what).not.toBe(500);
      if (typeof a !== "string" && a.status === 200) expect(a.headers.get("grpc-status") ?? "", what).not.toBe("0");
    }
  });

  it("Expect: 100-continue: the refusal comes, and the body invited by 100 Continue is not read into a call", async () => {
    const a = await answerOf(partial("POST", "/v2/projects/p-dev/apps", { expect: "100-continue" }, "announced"));
    expect(statusOf(a)).toBe(401);
  });

  it("pipelined requests after a refusal are each judged on their own", async () => {
    const one = (token?: string) =>
      partial(
        "POST",
        `${SVC}/ListApps`,
        { "content-type": "application/json", ...(token ? { authorization: `Bearer ${token}` } : {}) },
        Buffer.from(JSON.stringify({ projectId: "p-dev" })),
      );
    const socket = net.connect(port, "127.0.0.1");
    let data = "";
    socket.on("data", (d: Buffer) => (data += d.toString("latin1")));
    socket.write(Buffer.concat([one(), one("bad"), one(t.devToken), one()]));
    await expect.poll(() => data.match(/HTTP\/1\.1 \d{3}/g)?.length ?? 0, { timeout: 5_000 }).toBe(4);
    expect(data.match(/HTTP\/1\.1 (\d{3})/g)).toEqual(["HTTP/1.1 401", "HTTP/1.1 401", "HTTP/1.1 200", "HTTP/1.1 401"]);
    socket.destroy();
  });

  it("open services: Health over Connect takes at most SKIFF_MAX_BODY_BYTES, refused at once above it", async () => {
    const a = await answerOf(partial("POST", "/grpc.health.v1.Health/Check", { "content-type": "application/json" }));
    expect(statusOf(a)).not.toBe("late");
    expect(statusOf(a)).not.toBe(500);
  });
});

describe("malformed heads, without a token", () => {
  it("bad Content-Length, duplicate and huge Authorization, non-ASCII: refused, never 500", async () => {
    const raw = (head: string) => Buffer.concat([Buffer.from(head, "latin1"), SENT]);
    const requests: [string, Buffer][] = [
      ["content-length abc", raw(`POST ${DEPLOY} HTTP/1.1\r\nhost: x\r\ncontent-length: abc\r\n\r\n`)],
      ["content-length -1", raw(`POST ${DEPLOY} HTTP/1.1\r\nhost: x\r\ncontent-length: -1\r\n\r\n`)],
      [
        "two content-lengths",
        raw(`POST ${DEPLOY} HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\ncontent-length: 99999999\r\n\r\n`),
      ],
      [
        "content-length and chunked",
        raw(`POST ${DEPLOY} HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n`),
      ],
      [
        "huge content-length",
        raw(
          `POST ${DEPLOY} HTTP/1.1\r\nhost: x\r\ncontent-type: application/proto\r\ncontent-length: 99999999999999999999\r\n\r\n`,
        ),
      ],
      [
        "two authorizations, the second a real one",
        partial("POST", "/v2/projects/p-dev/apps", {
          authorization: "Bearer nope",
          Authorization: `Bearer ${t.devToken}`,
        }),
      ],
      [
        "huge authorization",
        partial("POST", DEPLOY, { "content-type": "application/proto", authorization: `Bearer ${"a".repeat(12_000)}` }),
      ],
      [
        "non-ASCII authorization",
        partial("POST", "/v2/projects/p-dev/apps", { authorization: "Bearer t\u00e9\u00ff\u0080ken" }),
      ],
      [
        "authorization without scheme",
        partial("POST", DEPLOY, { "content-type": "application/proto", authorization: t.devToken }),
      ],
      [
        "basic authorization",
        partial("POST", DEPLOY, { "content-type": "application/json", authorization: "Basic YTpi" }),
      ],
      [
        "bearer with a tab",
        partial("POST", DEPLOY, { "content-type": "application/json", authorization: "Bearer\tx" }),
      ],
      [
        "admin token with trailing junk",
        partial("POST", DEPLOY, { "content-type": "application/json", authorization: `Bearer ${t.adminToken} x` }),
      ],
    ];
    for (const [what, request] of requests) {
      const a = await answerOf(request);
      const status = statusOf(a);
      expect(status, what).not.toBe("late");
      expect(status, what).not.toBe(500);
      if (typeof status === "number") expect(status, what).toBeGreaterThanOrEqual(400);
    }
    // The server is still up.
    expect((await fetch(`${t.url}/healthz`)).status).toBe(200);
  });
});

describe("HTTP/2 without a token", () => {
  it("h2c prior knowledge: odd paths and types are refused while the body is owed", async () => {
    const client = http2.connect(t.url);
    client.on("error", () => undefined);
    try {
      const cases: [string, string][] = [
        [DEPLOY, "application/grpc"],
        [DEPLOY, "application/proto"],
        [`${DEPLOY}?x`, "application/connect+proto"],
        ["/v2/projects/p-dev/apps", "application/octet-stream"],
        ["/v2/projects/p-dev/apps/", "application/octet-stream"],
        [`/${DEPLOY}`, "application/grpc"],
        ["/nope.v1.Nope/Call", "application/grpc"],
      ];
      for (const [path, type] of cases) {
        const outcome = await new Promise<string>((resolve) => {
          const stream = client.request({ ":method": "POST", ":path": path, "content-type": type });
          stream.on("response", (h) => resolve(`${String(h[":status"])} ${String(h["grpc-status"] ?? "")}`));
          stream.on("error", () => resolve("error"));
          stream.on("close", () => resolve("closed"));
          stream.write(SENT);
          setTimeout(() => resolve("late"), 5_000).unref();
        });
        expect(outcome, `${path} ${type}`).not.toBe("late");
        expect(outcome, `${path} ${type}`).not.toMatch(/^500/);
        // A Connect stream's refusal is its end-of-stream message (200, no grpc-status); gRPC's is grpc-status 16/12.
        if (!type.startsWith("application/connect+")) expect(outcome, `${path} ${type}`).not.toMatch(/^200 0?$/);
      }
    } finally {
      client.destroy();
    }
  });
});

describe("legitimate calls still work", () => {
  it("a valid token over Connect, gRPC-Web, gRPC (h2c), REST, and a small DeployApp body", async () => {
    const body = JSON.stringify({ projectId: "p-dev" });
    const connect = await fetch(`${t.url}${SVC}/ListApps`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${t.devToken}` },
      body,
    });
    expect(connect.status).toBe(200);
    const web = await answerOf(
      partial(
        "POST",
        `${SVC}/ListApps`,
        { "content-type": "application/grpc-web+json", authorization: `Bearer ${t.devToken}` },
        envelope(Buffer.from(body)),
      ),
    );
    expect(statusOf(web)).toBe(200);
    expect(typeof web === "string" ? "" : web.body.toString("latin1")).toMatch(/grpc-status: ?0/);
    const client = http2.connect(t.url);
    try {
      const status = await new Promise<string>((resolve, reject) => {
        const stream = client.request({
          ":method": "POST",
          ":path": `${SVC}/ListApps`,
          "content-type": "application/grpc+json",
          te: "trailers",
          authorization: `Bearer ${t.devToken}`,
        });
        stream.on("trailers", (tr) => resolve(String(tr["grpc-status"])));
        stream.on("response", (h) => h["grpc-status"] !== undefined && resolve(String(h["grpc-status"])));
        stream.on("error", reject);
        stream.resume();
        stream.end(envelope(Buffer.from(body)));
      });
      expect(status).toBe("0");
    } finally {
      client.close();
    }
    const rest = await t.api("GET", "/v2/projects/p-dev/apps", undefined, t.devToken);
    expect(rest.status).toBe(200);
    // A small bundle that is no bundle: read and judged (400), not refused before its body.
    const small = await fetch(`${t.url}/v2/projects/p-dev/apps`, {
      method: "POST",
      headers: { authorization: `Bearer ${t.devToken}`, "content-type": "application/octet-stream" },
      body: Buffer.alloc(100, 0x41),
    });
    expect(small.status).toBe(400);
  });

  it("another project's data with a valid token: 403 after the body, and the slot it took is free again", async () => {
    const big = Buffer.alloc(2 * 1024 * 1024, 0x41);
    for (let i = 0; i < 4; i++) {
      const theirs = await fetch(`${t.url}/v2/projects/p-other/apps`, {
        method: "POST",
        headers: { authorization: `Bearer ${t.devToken}`, "content-type": "application/octet-stream" },
        body: big,
      });
      expect([403, 413]).toContain(theirs.status);
    }
    // SKIFF_MAX_PROJECT_UPLOADS (2) were not leaked: the project's own upload is still taken in (400: not a bundle).
    const mine = await fetch(`${t.url}/v2/projects/p-dev/apps`, {
      method: "POST",
      headers: { authorization: `Bearer ${t.devToken}`, "content-type": "application/octet-stream" },
      body: big,
    });
    expect(mine.status).not.toBe(429);
  });
});
