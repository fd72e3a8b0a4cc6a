// The REST request path attacked after it was made cheaper: the auth
// interceptor built once per route and its token cache answered without an
// await (Authenticator.cached), REST paths sent past the RPC router, the run
// record put into the event's NATS header without nats.js's check, calls
// held in LiveCalls for the shutdown, and a run stopped through the
// exchange's own signal. Real skiff, real sandbox, real nats-server.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { consumerOpts, type JsMsg } from "nats";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { packApp } from "../../services/apps/bundle.js";
import { streams } from "../../services/nats/layout.js";
import { skiffToml, writeApp } from "../helpers/apps.js";
import { exchange } from "../helpers/raw-http.js";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";
import { MAX_ERROR_MESSAGE_CHARS } from "../../services/runs/outcome.js";

const P = "p-dev";
const OTHER = "p-other";
const APP = "edge";

const INDEX = [
  "export function add({ a, b }) { return a + b; }",
  "export async function sleep({ ms }) { await new Promise((r) => setTimeout(r, ms)); return { slept: ms }; }",
  "export function boom({ n }) { throw new Error('a\\r\\nSkiff-Run: {\"run_id\":\"forged\"}\\r\\n\\u0000\\u2028' + 'x'.repeat(n)); }",
].join("\n");

/** A Cortex function's result in its REST answer. */
function resultOf(a: Answer): unknown {
  return (JSON.parse(a.text) as { result?: unknown }).result;
}

interface Answer {
  status: number;
  headers: Headers;
  text: string;
}

/** The app under attack (INDEX) deployed in the dev project, one replica taking `concurrency` calls at once. */
async function deployApp(t: TestSkiff, tmp: string, concurrency: number): Promise<void> {
  const dir = await writeApp(tmp, {
    "skiff.toml": skiffToml({
      name: APP,
      runtime: { kind: "cortex", language: "node", entry: "index.mjs" },
      scaling: { min_replicas: 1, max_replicas: 1, replica_concurrency: concurrency },
    }),
    "index.mjs": INDEX,
  });
  await t.management(t.devToken).deployApp({
    projectId: P,
    bundle: { contentType: "application/gzip", data: (await packApp(dir)).bytes },
  });
}

describe("the REST request path", () => {
  let t: TestSkiff;
  let tmp: string;
  let otherToken: string;

  const call = async (
    method: string,
    p: string,
    token: string | undefined,
    body?: unknown,
    headers: Record<string, string> = {},
  ): Promise<Answer> => {
    const res = await fetch(t.url + p, {
      method,
      headers: {
        "content-type": "application/json",
        ...(token === undefined ? {} : { authorization: `Bearer ${token}` }),
        ...headers,
      },
      body: body === undefined ? undefined : typeof body === "string" ? body : JSON.stringify(body),
    });
    return { status: res.status, headers: res.headers, text: await res.text() };
  };

  /** One request written byte for byte (fetch would normalize the path). */
  const raw = async (lines: string[], body = "") => {
    const port = Number(new URL(t.url).port);
    const head = [...lines, `content-length: ${Buffer.byteLength(body)}`, "connection: close", "", ""].join("\r\n");
    const answer = await exchange(port, Buffer.from(head + body, "latin1"));
    if (answer === "closed") return { status: 0, body: "" };
    return { status: answer.status, body: answer.body.toString("utf8"), headers: answer.headers };
  };

  const serviceAccount = async (projectId: string, seconds = 3600) =>
    t.management().createServiceAccount({
      projectId,
      name: `sa-${Math.random().toString(36).slice(2, 8)}`,
      expiresAt: { seconds: BigInt(Math.floor(Date.now() / 1000) + seconds) },
    });

  beforeAll(async () => {
    tmp = await mkdtemp(path.join(tmpdir(), "skiff-request-path-"));
    t = await startTestSkiff();
    await t.management().createProject({ projectId: OTHER });
    otherToken = (await serviceAccount(OTHER)).token;
    await deployApp(t, tmp, 8);
  }, 180_000);

  afterAll(async () => {
    await t?.close();
    if (tmp) await rm(tmp, { recursive: true, force: true });
  });

  describe("tokens answered from the cache", () => {
    it("a deleted service account's token is refused on the next REST call, though cached", async () => {
      const made = await serviceAccount(P);
      const token = made.token;
      for (let i = 0; i < 3; i++) expect((await call("GET", `/v2/projects/${P}/apps`, token)).status).toBe(200);
      expect(resultOf(await call("POST", `/v4/${P}/${APP}/add`, token, { a: 1, b: 2 }))).toBe(3);
      await t.management().deleteServiceAccount({
        projectId: P,
        serviceAccountId: made.serviceAccount!.serviceAccountId,
      });
      await vi.waitFor(async () => expect((await call("GET", `/v2/projects/${P}/apps`, token)).status).toBe(401), {
        timeout: 5_000,
        interval: 20,
      });
      // And it stays refused, on every route (the cache entry is not revived by another route's chain).
      expect((await call("POST", `/v4/${P}/${APP}/add`, token, { a: 1, b: 2 })).status).toBe(401);
      expect((await call("GET", `/v2/projects/${P}/secrets`, token)).status).toBe(401);
      expect((await call("GET", `/v2/projects/${P}/apps`, token)).status).toBe(401);
    });

    it("an expired token is refused once its time is up, though cached", async () => {
      const { token } = await serviceAccount(P, 3);
      expect((await call("GET", `/v2/projects/${P}/apps`, token)).status).toBe(200);
      expect(resultOf(await call("POST", `/v4/${P}/${APP}/add`, token, { a: 2, b: 2 }))).toBe(4);
      await vi.waitFor(async () => expect((await call("GET", `/v2/projects/${P}/apps`, token)).status).toBe(401), {
        timeout: 10_000,
        interval: 100,
      });
      expect((await call("POST", `/v4/${P}/${APP}/add`, token, { a: 2, b: 2 })).status).toBe(401);
    });

    it("a token of a deleted project stays refused after the project is made again under its id", async () => {
      const id = "p-again";
      await t.management().createProject({ projectId: id });
      const { token } = await serviceAccount(id);
      expect((await call("GET", `/v2/projects/${id}/apps`, token)).status).toBe(200);
      await t.management().deleteProject({ projectId: id });
      await t.management().createProject({ projectId: id });
      // The new tenant's own accounts: the old token must not fit any of them.
      await serviceAccount(id);
      await serviceAccount(id);
      await vi.waitFor(async () => expect((await call("GET", `/v2/projects/${id}/apps`, token)).status).toBe(401), {
        timeout: 5_000,
        interval: 20,
      });
      expect((await call("GET", `/v2/projects/${id}/secrets`, token)).status).toBe(401);
    });

    it("a cached token of one project reaches no other project through a REST path or an odd encoding", async () => {
      // Cache the token first: every attempt below is a cache hit.
      expect((await call("GET", `/v2/projects/${OTHER}/apps`, otherToken)).status).toBe(200);
      const denied = [
        ["GET", `/v2/projects/${P}/apps`],
        ["GET", `/v2/projects/${P}/secrets`],
        ["GET", `/v2/projects/${P}/apps/${APP}/runs`],
        ["GET", `/v2/projects/p%2Ddev/apps`],
        ["GET", `/v2/projects/%70-dev/apps`],
        ["POST", `/v4/${P}/${APP}/add`],
        ["POST", `/v4/p%2ddev/${APP}/add`],
        ["PUT", `/v2/projects/${P}/secrets/STOLEN`],
        ["DELETE", `/v2/projects/${P}/apps/${APP}`],
      ] as const;
      for (const [method, p] of denied) {
        const res = await call(
          method,
          p,
          otherToken,
          method === "PUT" ? { value: "x" } : method === "POST" ? { a: 1, b: 1 } : undefined,
        );
        expect({ method, p, status: res.status, text: res.status === 403 ? "" : res.text }).toEqual({
          method,
          p,
          status: 403,
          text: "",
        });
      }
      // The bound project id cannot be swapped by a query parameter or the body.
      const query = await call("GET", `/v2/projects/${OTHER}/apps?project_id=${P}&projectId=${P}`, otherToken);
      expect(query.status).toBe(200);
      expect(query.text).not.toContain(APP);
      const body = await call("PUT", `/v2/projects/${OTHER}/secrets/S`, otherToken, { value: "v", projectId: P });
      expect(body.status).toBeLessThan(500);
      expect((await t.management().listSecrets({ projectId: P })).secrets.map((s) => s.name)).not.toContain("S");
      // A project id with a path separator, a NUL or a dot segment is no other project's.
      for (const p of [
        `/v2/projects/${OTHER}%2F..%2F${P}/apps`,
        `/v2/projects/${OTHER}%00/apps`,
        `/v4/${OTHER}%2F..%2F${P}/${APP}/add`,
      ]) {
        const res = await call(
          p.startsWith("/v4") ? "POST" : "GET",
          p,
          otherToken,
          p.startsWith("/v4") ? {} : undefined,
        );
        expect({ p, status: res.status }).toEqual({ p, status: 403 });
      }
    });

    it("no token, a garbled token or a token with spaces gets 401 on every REST route, never a 500", async () => {
      for (const auth of [undefined, "x", "Bearer", "Bearer ", "Bearer a.b.c", `Bearer ${t.devToken}x`, "Basic Zm9v"]) {
        for (const [method, p] of [
          ["GET", `/v2/projects/${P}/apps`],
          ["POST", `/v4/${P}/${APP}/add`],
          ["GET", `/v2/identity`],
        ] as const) {
          const res = await fetch(t.url + p, {
            method,
            headers: auth === undefined ? {} : { authorization: auth },
            body: method === "POST" ? "{}" : undefined,
          });
          await res.text();
          expect({ auth, p, status: res.status }).toEqual({ auth, p, status: 401 });
        }
      }
    });
  });

  describe("RPCs through the REST shortcut", () => {
    const RPC = "/skiff.management.v2.ManagementService/ListSecrets";

    it("an RPC path behind /v2/ or /v4/ with dot segments is not served without a token", async () => {
      for (const target of [`/v2/..${RPC}`, `/v4/..${RPC}`, `/v2/%2e%2e${RPC}`, `/v4/./..${RPC}`]) {
        for (const type of ["application/json", "application/proto"]) {
          const res = await raw(
            [`POST ${target} HTTP/1.1`, "host: x", `content-type: ${type}`, "connect-protocol-version: 1"],
            type === "application/json" ? `{"projectId":"${P}"}` : "",
          );
          expect(res.status, `${target} ${type}`).not.toBe(200);
          expect(res.status, `${target} ${type}`).toBeLessThan(500);
          expect(res.body).not.toContain('"secrets"');
        }
      }
    });

    it("an RPC path behind /v2/ with another project's token does not answer for that project", async () => {
      const res = await raw(
        [
          `POST /v2/..${RPC} HTTP/1.1`,
          "host: x",
          "content-type: application/json",
          "connect-protocol-version: 1",
          `authorization: Bearer ${otherToken}`,
        ],
        `{"projectId":"${P}"}`,
      );
      expect(res.status).not.toBe(200);
      expect(res.status).toBeLessThan(500);
    });

    it("gRPC and Connect content types on REST paths get a protocol error, not a REST answer or a 500", async () => {
      for (const type of ["application/grpc", "application/grpc+proto", "application/grpc-web"]) {
        const res = await raw(
          [`POST /v2/projects/${P}/apps HTTP/1.1`, "host: x", `content-type: ${type}`, "te: trailers"],
          "\0\0\0\0\0",
        );
        expect(res.status, type).toBeLessThan(500);
        expect(res.body, type).not.toContain(APP);
      }
      for (const type of ["application/connect+json", "application/connect+proto", "application/proto"]) {
        const res = await raw([`POST /v4/${P}/${APP}/add HTTP/1.1`, "host: x", `content-type: ${type}`], "{}");
        expect({ type, status: res.status }).toEqual({ type, status: 401 });
      }
    });

    it("HEAD, OPTIONS and odd methods on REST paths answer without a token's data and without a 500", async () => {
      for (const method of ["HEAD", "OPTIONS", "TRACE", "PROPFIND", "CONNECT_X"]) {
        for (const p of [
          `/v2/projects/${P}/apps`,
          `/v4/${P}/${APP}/add`,
          `/v2/projects/${P}/secrets`,
          "/v2/",
          "/v4/",
        ]) {
          const res = await raw([`${method} ${p} HTTP/1.1`, "host: x"]);
          if (res.status === 0) continue; // Node refused the method itself
          expect({ method, p, status: res.status < 500 }).toEqual({ method, p, status: true });
          expect(res.status, `${method} ${p}`).not.toBe(200);
        }
      }
    });

    it("absolute-form, double-slash, upper-case and asterisk request targets do not reach another project", async () => {
      const targets = [
        `http://x/v2/projects/${P}/secrets`,
        `http://x/v2/..${RPC}`,
        `//v2/projects/${P}/secrets`,
        `/v2//projects/${P}/secrets`,
        `/V2/projects/${P}/secrets`,
        `/v2/projects/${P}/secrets/`,
        `/v2/projects/${P}/secrets;x`,
        `/v2/projects/${P}/secrets#x`,
        `/%76%32/projects/${P}/secrets`,
        `*`,
      ];
      for (const target of targets) {
        for (const method of ["GET", "OPTIONS", "POST"]) {
          const res = await raw([
            `${method} ${target} HTTP/1.1`,
            "host: x",
            "content-type: application/json",
            `authorization: Bearer ${otherToken}`,
          ]);
          // The dashboard's page may answer a path that is no API's; no project's data, no 500.
          const leaked = res.body.includes('"secrets"') || res.body.includes("STOLEN");
          // (Its 503 "dashboard not built" here, where the dashboard's files are not built, is the page's.)
          const page = res.status === 503 && res.body.includes("dashboard not built");
          expect({ method, target, leaked, ok: res.status < 500 || page }).toEqual({
            method,
            target,
            leaked: false,
            ok: true,
          });
        }
      }
    });

    it("bad percent-encoding, long and NUL paths, bad query values: 4xx, never a 500", async () => {
      const token = t.devToken;
      const paths = [
        `/v2/projects/%ZZ/apps`,
        `/v2/projects/%E0%A4%A/apps`,
        `/v2/projects/%ED%A0%80/apps`,
        `/v2/projects/${P}/apps/%FF/runs`,
        `/v2/projects/${P}/apps/${APP}/runs?page_size=abc`,
        `/v2/projects/${P}/apps/${APP}/runs?page_size=99999999999999999999`,
        `/v2/projects/${P}/apps/${APP}/runs?pageSize=1&status=%00`,
        `/v2/projects/${P}/apps/${APP}/runs?a.b.c.d=1&__proto__=1&constructor.prototype=1`,
        `/v2/projects/${P}/apps/${APP}/runs?page_token=%FF%FE`,
        `/v2/projects/${P}/apps/${APP}/runs/${"r".repeat(8000)}`,
        `/v2/projects/${P}/apps/${APP}/runs/%00`,
        `/v4/${P}/${APP}/${"a".repeat(8000)}`,
        `/v4/${P}/${APP}/%00%0D%0A`,
        `/v4/${P}/${APP}/add?async=maybe`,
        `/v4/${P}/${APP}/add?webhookEndpoint=%00`,
        `/v4/${P}/__proto__/add`,
        `/v4/__proto__/${APP}/add`,
        `/v4/${P}/${APP}/constructor`,
      ];
      for (const p of paths) {
        for (const method of ["GET", "POST"]) {
          const res = await call(method, p, token, method === "POST" ? "{}" : undefined);
          expect({ p, method, ok: res.status < 500 }).toEqual({ p, method, ok: true });
        }
      }
      // Bodies that are no JSON, JSON of the wrong shape, or huge.
      for (const body of [
        "{",
        "[]",
        "null",
        '"x"',
        '{"a":{"b":',
        "\u0000",
        '{"__proto__":{"x":1}}',
        "x".repeat(100_000),
      ]) {
        const res = await call("POST", `/v2/projects/${P}/apps`, token, body);
        expect({ body: body.slice(0, 20), ok: res.status < 500 }).toEqual({ body: body.slice(0, 20), ok: true });
        const put = await call("PUT", `/v2/projects/${P}/secrets/K`, token, body);
        expect({ body: body.slice(0, 20), ok: put.status < 500 }).toEqual({ body: body.slice(0, 20), ok: true });
      }
      // Still alive.
      expect(resultOf(await call("POST", `/v4/${P}/${APP}/add`, token, { a: 5, b: 5 }))).toBe(10);
    });
  });

  describe("the run record in the event's header", () => {
    /** The events of the app's runs, headers only. */
    const events = async (): Promise<JsMsg[]> => {
      const js = t.skiff.nats.nc.jetstream();
      const opts = consumerOpts().deliverAll().ackNone().orderedConsumer();
      opts.filterSubject(`skiff.events.runs.${P}.${APP}.>`);
      const sub = await js.subscribe(`skiff.events.runs.${P}.${APP}.>`, opts);
      const jsm = await t.skiff.nats.nc.jetstreamManager();
      const info = await jsm.streams.info(streams.events.name, {
        subjects_filter: `skiff.events.runs.${P}.${APP}.>`,
      });
      const total = Object.values(info.state.subjects ?? {}).reduce((a, b) => a + b, 0);
      const out: JsMsg[] = [];
      for await (const m of sub) {
        out.push(m);
        if (out.length >= total) break;
      }
      sub.unsubscribe();
      return out;
    };

    it("CR, LF, NUL and U+2028 in a run's error stay inside the record: no forged header, the history reads it", async () => {
      const res = await call("POST", `/v4/${P}/${APP}/boom`, t.devToken, { n: 10 });
      expect(res.status).toBeGreaterThanOrEqual(400);
      expect(res.status).toBeLessThan(600);
      const runId = res.headers.get("x-request-id")!;
      let record: Record<string, unknown> | undefined;
      await vi.waitFor(
        async () => {
          const ours = (await events()).filter((m) => m.headers?.get("Skiff-Run").includes(runId));
          expect(ours.length).toBeGreaterThan(0);
          for (const m of ours) {
            const keys = [...m.headers!.keys()];
            // Only skiff's own keys: none named by the run's error.
            expect(keys.every((k) => !/forged|^\s|\0/.test(k))).toBe(true);
            expect(m.headers!.values("Skiff-Run")).toHaveLength(1);
            record = JSON.parse(m.headers!.get("Skiff-Run")) as Record<string, unknown>;
            expect(record.run_id).toBe(runId);
          }
        },
        { timeout: 10_000, interval: 100 },
      );
      expect(JSON.stringify(record)).toContain("Skiff-Run");
      await vi.waitFor(
        async () => {
          const got = await t.management(t.devToken).getRun({ projectId: P, appName: APP, runId });
          expect(got.run!.runId).toBe(runId);
          expect(got.run!.error?.message).toContain('\r\nSkiff-Run: {"run_id":"forged"}\r\n');
        },
        { timeout: 10_000, interval: 100 },
      );
      const list = await t.management(t.devToken).listRuns({ projectId: P, appName: APP, pageSize: 100 });
      expect(list.runs.some((r) => r.runId === "forged")).toBe(false);
    });

    // Fails (as at 31e6fdd, before this change): a run's error text is copied whole into its final record
    // (runs/finish.ts finalRecord), which its event carries twice, in the Skiff-Run header (runs/events.ts
    // recordHeader) and in the body; past the server's max_payload the publish throws, finishSync logs it,
    // and the run is in no history: GetRun answers not_found.
    it("a huge error (a record past NATS's payload) does not break the history nor the next runs", async () => {
      const res = await call("POST", `/v4/${P}/${APP}/boom`, t.devToken, { n: 3_000_000 });
      // The app's own error, answered as a failed run (500 with the run's error), not a crash of skiff.
      expect(res.status, res.text.slice(0, 400)).toBe(500);
      expect((JSON.parse(res.text) as { error: { type: string } }).error.type).toBe("Error");
      const huge = res.headers.get("x-request-id")!;
      // The next runs still work and are recorded.
      const ok = await call("POST", `/v4/${P}/${APP}/add`, t.devToken, { a: 20, b: 22 });
      expect(resultOf(ok)).toBe(42);
      const next = ok.headers.get("x-request-id")!;
      await vi.waitFor(
        async () => {
          const got = await t.management(t.devToken).getRun({ projectId: P, appName: APP, runId: next });
          expect(got.run!.status).toBe("success");
        },
        { timeout: 15_000, interval: 100 },
      );
      // The huge run itself is in the history, ended (its record, or its event, cut to fit).
      await vi.waitFor(
        async () => {
          const got = await t.management(t.devToken).getRun({ projectId: P, appName: APP, runId: huge });
          expect(got.run!.status).toBe("failure");
          // The record keeps the start of the error and says how much it left out; the answer had all of it.
          expect(got.run!.error!.message.length).toBeLessThan(MAX_ERROR_MESSAGE_CHARS + 100);
          expect(got.run!.error!.message).toMatch(/… \(\d+ more characters\)$/);
        },
        { timeout: 15_000, interval: 200 },
      );
      const list = await t.management(t.devToken).listRuns({ projectId: P, appName: APP, pageSize: 100 });
      expect(list.runs.length).toBeGreaterThan(0);
    });
  });

  describe("calls that end early", () => {
    /** A sync call to `sleep` under way, and its run's id, found among the project's runs (known only from the answer). */
    async function sleepingRun(ms: number): Promise<{ res: Promise<Response>; runId: string }> {
      // Runs listed before: a finished one may still show as running until the history has its end.
      const before = new Set(
        (await t.management().listRuns({ projectId: P, appName: APP, pageSize: 100 })).runs.map((r) => r.runId),
      );
      const res = fetch(`${t.url}/v4/${P}/${APP}/sleep`, {
        method: "POST",
        headers: { authorization: `Bearer ${t.devToken}`, "content-type": "application/json" },
        body: JSON.stringify({ ms }),
      });
      let runId = "";
      await vi.waitFor(
        async () => {
          const list = await t.management().listRuns({ projectId: P, appName: APP, pageSize: 100 });
          const r = list.runs.find((x) => x.path === "sleep" && x.status === "running" && !before.has(x.runId));
          expect(r).toBeDefined();
          runId = r!.runId;
        },
        { timeout: ms / 2, interval: 50 },
      );
      return { res, runId };
    }

    it("callers that go away mid-run end their runs, and skiff keeps answering", async () => {
      const ids: string[] = [];
      await Promise.all(
        Array.from({ length: 20 }, async () => {
          const ac = new AbortController();
          const res = fetch(`${t.url}/v4/${P}/${APP}/sleep`, {
            method: "POST",
            headers: { authorization: `Bearer ${t.devToken}`, "content-type": "application/json" },
            body: JSON.stringify({ ms: 30_000 }),
            signal: ac.signal,
          });
          setTimeout(() => ac.abort(), 300);
          await res.then(
            (r) => ids.push(r.headers.get("x-request-id") ?? ""),
            () => undefined,
          );
        }),
      );
      // Each sleeping run held one of 8 slots: had the aborts not reached them, they would stay running and the
      // next call would queue behind them (the states below say which).
      expect(resultOf(await call("POST", `/v4/${P}/${APP}/add`, t.devToken, { a: 1, b: 1 }))).toBe(2);
      await vi.waitFor(
        async () => {
          const list = await t.management(t.devToken).listRuns({ projectId: P, appName: APP, pageSize: 100 });
          const running = list.runs.filter(
            (r) => r.path === "sleep" && (r.status === "running" || r.status === "queued"),
          );
          expect(running).toHaveLength(0);
        },
        { timeout: 15_000, interval: 200 },
      );
    });

    it("another project's token cannot cancel a run, under its own project or the run's", async () => {
      const { res, runId } = await sleepingRun(8_000);
      const own = await call("POST", `/v2/projects/${OTHER}/apps/${APP}/runs/${runId}:cancel`, otherToken, {});
      expect(own.status).toBe(404);
      const theirs = await call("POST", `/v2/projects/${P}/apps/${APP}/runs/${runId}:cancel`, otherToken, {});
      expect(theirs.status).toBe(403);
      const answer = await res;
      expect(answer.status).toBe(200);
      expect(await answer.json()).toMatchObject({ result: { slept: 8000 } });
    });

    it("the owner's cancel of a REST sync run stops it through the exchange's signal: an answer, no 500, recorded cancelled", async () => {
      const { res, runId } = await sleepingRun(20_000);
      const cancel = await call("POST", `/v2/projects/${P}/apps/${APP}/runs/${runId}:cancel`, t.devToken, {});
      expect(cancel.status).toBe(200);
      const answer = await res;
      const text = await answer.text();
      expect(text).not.toContain('"slept"');
      expect({ status: answer.status, text }).not.toMatchObject({ status: 500 });
      expect(answer.status).toBeGreaterThanOrEqual(400);
      await vi.waitFor(
        async () => {
          const got = await t.management().getRun({ projectId: P, appName: APP, runId });
          expect(got.run!.status).toBe("cancelled");
        },
        { timeout: 10_000, interval: 100 },
      );
    });
  });
});

describe("the server's shutdown with REST calls in flight", () => {
  it("aborts them through LiveCalls: a sleeping sync run ends, the close does not wait it out", async () => {
    const tmp = await mkdtemp(path.join(tmpdir(), "skiff-request-path-stop-"));
    const t = await startTestSkiff({ env: { SKIFF_SHUTDOWN_TIMEOUT_MS: "500" } });
    let closed = false;
    try {
      await deployApp(t, tmp, 4);
      const calls = Array.from({ length: 4 }, () =>
        fetch(`${t.url}/v4/${P}/${APP}/sleep`, {
          method: "POST",
          headers: { authorization: `Bearer ${t.devToken}`, "content-type": "application/json" },
          body: JSON.stringify({ ms: 60_000 }),
        }).then(
          async (r) => r.status,
          () => "gone" as const,
        ),
      );
      await vi.waitFor(
        async () => {
          const list = await t.management().listRuns({ projectId: P, appName: APP, pageSize: 100 });
          expect(list.runs.filter((r) => r.status === "running")).toHaveLength(4);
        },
        { timeout: 10_000, interval: 100 },
      );
      await t.close();
      closed = true;
      // Had the close waited the runs out, they would have answered 200 after their 60 s.
      for (const outcome of await Promise.all(calls)) expect(outcome === "gone" || outcome !== 200).toBe(true);
    } finally {
      if (!closed) await t.close();
      await rm(tmp, { recursive: true, force: true });
    }
  }, 90_000);
});
