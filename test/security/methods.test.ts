// Methods, queries and paths to Custom apps, attacked: a Connect caller's
// `method`, `query` and `path` fields, and raw HTTP requests (odd methods,
// encoded CR/LF, absolute-form targets, bytes above ASCII, very long
// queries), trying to add a header or a second request to what the runner
// writes to the replica; HEAD, OPTIONS and CORS preflights without a token;
// skiff's own query parameters written another way; async runs with odd
// methods. The app records every request it gets, as it got it.
// Real skiff, real sandbox, real nats-server.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { InvocationService } from "../../gen/skiff/invocation/v4/invocation_pb.js";
import { skiffToml } from "../helpers/apps.js";
import { exchange } from "../helpers/raw-http.js";
import { deploy, P } from "../helpers/run-apps.js";
import { bearer, startTestSkiff, type TestSkiff } from "../helpers/skiff.js";

/** Records each request (method, url, headers) and answers it with the record. /__seen: every record so far. */
const RECORDER = `
import http from "node:http";
const seen = [];
http
  .createServer((req, res) => {
    if (req.url === "/health") return res.end("ok");
    if (req.url === "/__seen") {
      const out = JSON.stringify(seen);
      res.writeHead(200, { "content-type": "application/json" });
      return res.end(out);
    }
    const record = { method: req.method, url: req.url, headers: req.rawHeaders };
    seen.push(record);
    req.resume();
    req.on("end", () => {
      const out = JSON.stringify(record);
      res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(out) });
      res.end(req.method === "HEAD" ? undefined : out);
    });
  })
  .listen(Number(process.env.PORT), "127.0.0.1");
`;

const ORIGIN = "https://allowed.example";

describe("methods, queries and paths to a Custom app, attacked", () => {
  let t: TestSkiff;
  let tmp: string;
  let invocation: Client<typeof InvocationService>;
  const v4 = (app: string, rest: string) => `${t.url}/v4/${P}/${app}/${rest}`;

  const seen = async (app = "rec"): Promise<{ method: string; url: string; headers: string[] }[]> => {
    const res = await fetch(v4(app, "__seen"), { headers: { authorization: `Bearer ${t.devToken}` } });
    expect(res.status).toBe(200);
    return (await res.json()) as { method: string; url: string; headers: string[] }[];
  };
  const port = () => Number(new URL(t.url).port);
  const raw = (head: string, asHead = false) => exchange(port(), Buffer.from(head, "latin1"), asHead);

  beforeAll(async () => {
    tmp = await mkdtemp(path.join(tmpdir(), "skiff-methods-attack-"));
    t = await startTestSkiff();
    invocation = createClient(
      InvocationService,
      createConnectTransport({ baseUrl: t.url, httpVersion: "1.1", interceptors: [bearer(t.devToken)] }),
    );
    const node = { kind: "custom" as const, command: ["node", "server.mjs"], healthcheck: "/health" };
    const scaling = { min_replicas: 1, max_replicas: 1, replica_concurrency: 8 };
    await deploy(tmp, t.management(), {
      "skiff.toml": skiffToml({ name: "rec", runtime: node, scaling }),
      "server.mjs": RECORDER,
    });
    await deploy(tmp, t.management(), {
      "skiff.toml": `${skiffToml({ name: "corsy", runtime: node, scaling })}\n[cors]\nallow_origins = ["${ORIGIN}"]\n`,
      "server.mjs": RECORDER,
    });
    await vi.waitUntil(
      async () => (await fetch(v4("rec", "__seen"), { headers: { authorization: `Bearer ${t.devToken}` } })).ok,
      {
        timeout: 60_000,
        interval: 250,
      },
    );
  }, 180_000);
  afterAll(async () => {
    await t?.close();
    await rm(tmp, { recursive: true, force: true });
  });

  it("a Connect caller's method and query cannot carry a line break, a space or a '#', nor a method apps do not take", async () => {
    const before = (await seen()).length;
    const bad: [string, string][] = [
      ["GET\r\nX-Injected: 1", ""],
      ["GET /x HTTP/1.1\r\n\r\nGET", ""],
      ["GET ", ""],
      ["CONNECT", ""],
      ["TRACE", ""],
      ["PROPFIND", ""],
      ["G\u0130T", ""],
      ["GET", "a=1\r\nX-Injected: 1"],
      ["GET", "a=1 HTTP/1.1\r\nX-Injected: 1\r\n\r\nGET /smuggled"],
      ["GET", "a=1\nb=2"],
      ["GET", "a=%ZZ#frag"],
      ["GET", "a=\u00e9"],
      ["GET", "a=\u0000"],
    ];
    for (const [method, query] of bad) {
      const err = await invocation.run({ projectId: P, appName: "rec", path: "x", method, query }).catch((e) => e);
      expect(err, JSON.stringify([method, query])).toBeInstanceOf(ConnectError);
      expect((err as ConnectError).code).toBe(Code.InvalidArgument);
    }
    expect((await seen()).length).toBe(before);
  });

  it("a Connect caller's path stays one path of the app: encoded, never a second line, an absolute URL or a request", async () => {
    const paths = [
      "a\r\nX-Injected: 1",
      "http://evil.example/x",
      "//evil.example/x",
      "../../etc/passwd",
      "a b?c#d",
      "%0d%0a",
    ];
    for (const p of paths) {
      const res = await invocation.run({ projectId: P, appName: "rec", path: p, method: "get", query: "q=1" });
      expect(res.statusCode, p).toBe(200);
      const got = JSON.parse(new TextDecoder().decode(res.body!.data)) as {
        method: string;
        url: string;
        headers: string[];
      };
      expect(got.method).toBe("GET");
      expect(got.url.startsWith("/")).toBe(true);
      // (A path written with a leading "/" or "//" keeps its empty segments, as a REST caller's raw path does.)
      expect(got.url).not.toMatch(/^\/+https?:/);
      expect(got.url).toMatch(/\?q=1$/);
      expect(got.url).not.toMatch(/[\r\n #]/);
      expect(got.headers.map((h) => h.toLowerCase())).not.toContain("x-injected");
    }
    // Exactly one request each, nothing smuggled after them.
    const all = await seen();
    expect(all.filter((r) => r.url.includes("smuggled") || r.url.includes("evil.example/x HTTP"))).toEqual([]);
  });

  it("a raw request with an odd method, encoded CR/LF, an absolute target or high bytes adds nothing to the app's request", async () => {
    const before = (await seen()).length;
    const auth = `Authorization: Bearer ${t.devToken}\r\n`;
    for (const method of ["CONNECT", "TRACE", "PROPFIND", "MKCOL", "SEARCH", "PURGE"]) {
      const answer = await raw(
        `${method} /v4/${P}/rec/x HTTP/1.1\r\nHost: x\r\n${auth}Content-Length: 0\r\nConnection: close\r\n\r\n`,
      );
      expect(answer === "closed" || answer.status >= 400, method).toBe(true);
    }
    expect((await seen()).length).toBe(before);
    const crlf = await raw(
      `GET /v4/${P}/rec/a%0D%0AX-Injected:%201?b=%0D%0AX-Injected:%202 HTTP/1.1\r\nHost: x\r\n${auth}Connection: close\r\n\r\n`,
    );
    expect(crlf).not.toBe("closed");
    if (crlf !== "closed") {
      expect(crlf.status).toBe(200);
      const got = JSON.parse(crlf.body.toString()) as { url: string; headers: string[] };
      expect(got.url).toBe("/a%0D%0AX-Injected:%201?b=%0D%0AX-Injected:%202");
      expect(got.headers.map((h) => h.toLowerCase())).not.toContain("x-injected");
    }
    const absolute = await raw(
      `GET http://evil.example/v4/${P}/rec/abs?x=1 HTTP/1.1\r\nHost: x\r\n${auth}Connection: close\r\n\r\n`,
    );
    // Not routed to the app at all: an absolute target names no app (the dashboard's pages, or a refusal, answer it).
    expect(absolute).not.toBe("closed");
    expect((await seen()).map((r) => r.url)).not.toContain("/abs?x=1");
    const high = await raw(`GET /v4/${P}/rec/h\xe9?q=\xff HTTP/1.1\r\nHost: x\r\n${auth}Connection: close\r\n\r\n`);
    if (high !== "closed" && high.status === 200) {
      const got = JSON.parse(high.body.toString()) as { url: string; headers: string[] };
      expect(got.url).not.toMatch(/[\r\n ]/);
    }
    // Node's parser refuses bytes above ASCII in the target.
    expect(high !== "closed" && high.status).toBe(400);
    // A query as long as a request line may be: an answer, and skiff serves on.
    const long = await raw(
      `GET /v4/${P}/rec/long?q=${"a".repeat(15_000)} HTTP/1.1\r\nHost: x\r\n${auth}Connection: close\r\n\r\n`,
    );
    expect(long === "closed" || long.status > 0).toBe(true);
    const viaConnect = await invocation
      .run({ projectId: P, appName: "rec", path: "long", method: "GET", query: `q=${"b".repeat(200_000)}` })
      .then((r) => r.statusCode)
      .catch((e: ConnectError) => e.code);
    expect(viaConnect).toBeDefined();
    expect((await fetch(v4("rec", "after"), { headers: { authorization: `Bearer ${t.devToken}` } })).status).toBe(200);
  });

  it("without a token, HEAD, OPTIONS and GET reach no app; a preflight is answered by skiff alone", async () => {
    const before = [(await seen("rec")).length, (await seen("corsy")).length];
    for (const app of ["rec", "corsy"])
      for (const method of ["GET", "HEAD", "OPTIONS", "DELETE"]) {
        const res = await fetch(v4(app, "x"), { method });
        expect(res.status, `${method} ${app}`).toBe(401);
        // A CORS request (with an Origin), not a preflight, needs its token too.
        const cors = await fetch(v4(app, "x"), { method, headers: { origin: ORIGIN } });
        expect(cors.status, `${method} ${app} with Origin`).toBe(401);
      }
    // A wrong token, a token of another kind, likewise.
    for (const token of ["x", "Bearer", `${t.devToken}x`]) {
      const res = await fetch(v4("rec", "x"), { method: "HEAD", headers: { authorization: `Bearer ${token}` } });
      expect(res.status).toBe(401);
    }
    const preflight = (app: string, origin: string) =>
      fetch(v4(app, "x"), {
        method: "OPTIONS",
        headers: {
          origin,
          "access-control-request-method": "DELETE",
          "access-control-request-headers": "authorization",
        },
      });
    const listed = await preflight("corsy", ORIGIN);
    expect(listed.status).toBe(204);
    expect(listed.headers.get("access-control-allow-origin")).toBe(ORIGIN);
    expect(listed.headers.get("access-control-allow-credentials")).toBeNull();
    const unlisted = await preflight("corsy", "https://evil.example");
    expect(unlisted.status).toBe(204);
    expect(unlisted.headers.get("access-control-allow-origin")).toBeNull();
    // An app without a list and an app that does not exist answer alike: the token is asked for.
    expect((await preflight("rec", ORIGIN)).status).toBe(401);
    expect((await preflight("nope", ORIGIN)).status).toBe(401);
    expect(
      (
        await fetch(`${t.url}/v4/p-nobody/app/x`, {
          method: "OPTIONS",
          headers: { origin: ORIGIN, "access-control-request-method": "GET" },
        })
      ).status,
    ).toBe(401);
    expect([(await seen("rec")).length, (await seen("corsy")).length]).toEqual(before);
  });

  it("skiff's own query parameters written another way are read as skiff reads them, and never reach the app", async () => {
    const auth = { authorization: `Bearer ${t.devToken}` };
    for (const q of ["%61sync=true", "async=true&async=false", "asyn%63=1"]) {
      const res = await fetch(v4("rec", `own?keep=1&${q}`), { method: "PATCH", headers: auth, body: "{}" });
      expect([200, 202, 400], q).toContain(res.status);
    }
    await new Promise((r) => setTimeout(r, 2_000));
    for (const r of (await seen()).filter((r) => r.url.startsWith("/own"))) {
      expect(r.url).toBe("/own?keep=1");
      expect(r.method).toBe("PATCH");
    }
    // A queued run keeps an odd-but-allowed method and its query, and nothing else.
    const queued = await fetch(v4("rec", "queued?z=%0D%0A&async=true"), { method: "DELETE", headers: auth });
    expect(queued.status).toBe(202);
    await vi.waitUntil(async () => (await seen()).some((r) => r.url.startsWith("/queued")), {
      timeout: 30_000,
      interval: 250,
    });
    const got = (await seen()).filter((r) => r.url.startsWith("/queued"));
    expect(got).toHaveLength(1);
    expect(got[0]).toMatchObject({ method: "DELETE", url: "/queued?z=%0D%0A" });
    // A webhook endpoint in the query, however its name is written, is checked: a link-local one is refused
    // (loopback is allowed here: this skiff listens on a loopback address).
    for (const name of ["webhookEndpoint", "webhook%45ndpoint", "webhook_endpoint", "%77ebhookEndpoint"]) {
      const hook = await fetch(v4("rec", `hook?async=true&${name}=http://169.254.169.254/x`), {
        method: "POST",
        headers: auth,
        body: "{}",
      });
      expect(hook.status, name).toBe(400);
    }
  });
});
