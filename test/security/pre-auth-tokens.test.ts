// Attacks on the token gate, its one-entry bearer memo (auth.ts bearerToken)
// and the paths beside it that held. Real skiff (startTestSkiff), real
// nats-server.
import http2 from "node:http2";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { exchange, type RawAnswer } from "../helpers/raw-http.js";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";

const SVC = "/skiff.management.v2.ManagementService";
const ANNOUNCED = 64 * 1024 * 1024;

let t: TestSkiff;
let port: number;

beforeAll(async () => {
  t = await startTestSkiff();
  port = Number(new URL(t.url).port);
}, 60_000);
afterAll(async () => {
  await t?.close();
});

/** The answer, or "late" when none came within 5 s (the body was being read). */
async function answerOf(request: Buffer, head = false): Promise<RawAnswer | "late" | "closed"> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<"late">((resolve) => (timer = setTimeout(() => resolve("late"), 5_000)));
  return await Promise.race([exchange(port, request, head), late]).finally(() => clearTimeout(timer));
}

const statusOf = (a: RawAnswer | "late" | "closed") => (typeof a === "string" ? a : a.status);

function announced(method: string, target: string, headers: string[]): Buffer {
  const head = [`${method} ${target} HTTP/1.1`, "host: localhost", ...headers, `content-length: ${ANNOUNCED}`, "", ""];
  return Buffer.concat([Buffer.from(head.join("\r\n"), "latin1"), Buffer.alloc(1024, 0x41)]);
}

/** A Connect unary GetProject of p-dev with this Authorization header (or none); the HTTP status. */
async function getProject(authorization: string | undefined): Promise<number> {
  const res = await fetch(`${t.url}${SVC}/GetProject`, {
    method: "POST",
    headers: { "content-type": "application/json", ...(authorization === undefined ? {} : { authorization }) },
    body: JSON.stringify({ projectId: "p-dev" }),
  });
  await res.arrayBuffer();
  return res.status;
}

describe("the one-entry bearer memo", () => {
  it("interleaved calls with a valid token and with others are each judged by their own header", async () => {
    const good = [
      `Bearer ${t.devToken}`,
      `bearer ${t.devToken}`,
      `BEARER   ${t.devToken}`,
      `Bearer ${t.devToken}  `,
      `Bearer ${t.adminToken}`,
    ];
    const bad = [
      undefined,
      "Bearer nope",
      `Bearer ${t.devToken}x`,
      `Bearer ${t.devToken.slice(0, -1)}`,
      `Basic ${t.devToken}`,
      `Bearer ${t.devToken} ${t.devToken}`,
      `Bearer${t.devToken}`,
      "Bearer ",
    ];
    // Each round: the calls go out at once, good and bad interleaved, so that the gate's and the
    // interceptor's reads of one call have others' reads between them (a token not seen before is
    // judged with an await; the admin's always is).
    for (let round = 0; round < 4; round++) {
      const calls: { header: string | undefined; ok: boolean }[] = [];
      for (let i = 0; i < Math.max(good.length, bad.length); i++) {
        if (i < good.length) calls.push({ header: good[i], ok: true });
        if (i < bad.length) calls.push({ header: bad[i], ok: false });
      }
      if (round % 2 === 1) calls.reverse();
      const statuses = await Promise.all(calls.map((c) => getProject(c.header)));
      calls.forEach((c, i) => expect(statuses[i], `${round}: ${String(c.header)}`).toBe(c.ok ? 200 : 401));
    }
  });

  it("the same header sent again after a refused one is judged again, not by the memo of another", async () => {
    expect(await getProject("Bearer nope")).toBe(401);
    expect(await getProject(`Bearer ${t.devToken}`)).toBe(200);
    expect(await getProject(`Bearer ${t.devToken}`)).toBe(200);
    expect(await getProject("Bearer nope")).toBe(401);
    expect(await getProject(undefined)).toBe(401);
    expect(await getProject(`Bearer ${t.devToken}`)).toBe(200);
  });

  it("h2c: a valid token on one stream does not let a tokenless stream of the same session through", async () => {
    const session = http2.connect(t.url);
    session.on("error", () => undefined);
    const call = (authorization: string | undefined) =>
      new Promise<string>((resolve) => {
        const req = session.request({
          ":method": "POST",
          ":path": `${SVC}/GetProject`,
          "content-type": "application/json",
          ...(authorization === undefined ? {} : { authorization }),
        });
        req.on("response", (h) => resolve(String(h[":status"])));
        req.on("error", () => resolve("error"));
        req.end(JSON.stringify({ projectId: "p-dev" }));
      });
    try {
      const answers = await Promise.all([
        call(`Bearer ${t.devToken}`),
        call(undefined),
        call(`Bearer ${t.devToken}`),
        call("Bearer nope"),
      ]);
      expect(answers).toEqual(["200", "401", "200", "401"]);
    } finally {
      session.destroy();
    }
  });
});

describe("paths beside the RPCs, without a token, a 64 MiB body announced", () => {
  it("/metrics: 401 at once; the dashboard's files and an unknown path: answered while the body is owed", async () => {
    for (const [method, target, expected] of [
      ["GET", "/metrics", 401],
      ["HEAD", "/metrics", 401],
      ["POST", "/metrics", undefined],
      ["GET", "/", undefined],
      ["GET", "/index.html", undefined],
      ["POST", "/nothing/here", undefined],
    ] as const) {
      const a = await answerOf(announced(method, target, []), method === "HEAD");
      const status = statusOf(a);
      expect(status, `${method} ${target}`).not.toBe("late");
      expect(status, `${method} ${target}`).not.toBe(500);
      if (expected !== undefined) expect(status, `${method} ${target}`).toBe(expected);
    }
  });

  it("a WebSocket upgrade to an app with no token, a bad one, or the subprotocol of a bad one: refused at once", async () => {
    const ws = [
      "upgrade: websocket",
      "connection: upgrade",
      "sec-websocket-version: 13",
      "sec-websocket-key: AAAAAAAAAAAAAAAAAAAAAA==",
    ];
    for (const extra of [[], ["authorization: Bearer nope"], ["sec-websocket-protocol: bearer.nope, chat"]]) {
      const a = await answerOf(announced("GET", "/v4/p-dev/app/x", [...ws, ...extra]));
      expect(statusOf(a), extra.join()).toBe(401);
    }
  });

  it("the REST streamed body of a sync run (InvocationService.Run): refused at once without a valid token", async () => {
    for (const auth of [[], ["authorization: Bearer nope"], [`authorization: Basic ${t.devToken}`]]) {
      const a = await answerOf(
        announced("POST", "/v4/p-dev/app/x", ["content-type: application/octet-stream", ...auth]),
      );
      expect(statusOf(a), auth.join()).toBe(401);
    }
  });
});
