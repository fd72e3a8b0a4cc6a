// Answers that stream: a Custom app's chunked or text/event-stream answer
// reaches the REST caller chunk by chunk as the app writes it, at the pace
// the caller reads; a Connect caller of Run gets it whole; the run record
// keeps status, time and size. The app is examples/stream-events.
import { spawn } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { Code, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { InvocationService } from "../../gen/skiff/invocation/v4/invocation_pb.js";
import { packApp } from "../../services/apps/bundle.js";
import { bearer, startTestSkiff, type TestSkiff } from "../helpers/skiff.js";
import { P, deploy, post } from "../helpers/run-apps.js";
import { startReceiver } from "../helpers/webhook-receiver.js";
import { skiffToml } from "../helpers/apps.js";
import { TEST_ROOT } from "../helpers/paths.js";

const ROOT = path.resolve(TEST_ROOT, "..");
const APP = "stream-events";
let t: TestSkiff;
const v4 = (rest: string) => `${t.url}/v4/${P}/${APP}/${rest}`;

const scaling = { max_replicas: 1, replica_concurrency: 8 };
const NODE_GENERATORS = [
  "const gates = new Map();",
  "export async function* count({ n }) { for (let i = 1; i <= n; i++) yield { i }; }",
  "export async function* gated({ name }) { yield 'waiting'; await new Promise((r) => gates.set(name, r)); yield 'opened'; }",
  "export function open({ name }) { gates.get(name)?.(); return gates.delete(name); }",
  "export function* boom() { yield 1; throw new RangeError('too far'); }",
].join("\n");
const PYTHON_GENERATORS = [
  "import asyncio",
  "def count(n):",
  "    for i in range(1, n + 1):",
  "        yield {'i': i}",
  "async def slow(n):",
  "    for i in range(n):",
  "        await asyncio.sleep(0)",
  "        yield i",
  "def boom():",
  "    yield 1",
  "    raise ValueError('bad ü')",
].join("\n");

beforeAll(async () => {
  t = await startTestSkiff({ env: { SKIFF_WEBHOOK_ALLOWED_CIDRS: "127.0.0.0/8" } });
  const bundle = (await packApp(path.join(ROOT, "examples", APP))).bytes;
  await t.management().deployApp({ projectId: P, bundle: { contentType: "application/gzip", data: bundle } });
  const tmp = await mkdtemp(path.join(tmpdir(), "skiff-stream-"));
  await deploy(tmp, t.management(), {
    "skiff.toml": skiffToml({
      name: "gen-node",
      runtime: { kind: "cortex", language: "node", entry: "index.mjs" },
      scaling,
    }),
    "index.mjs": NODE_GENERATORS,
  });
  await deploy(tmp, t.management(), {
    "skiff.toml": skiffToml({
      name: "gen-py",
      runtime: { kind: "cortex", language: "python", entry: "main.py" },
      scaling,
    }),
    "main.py": PYTHON_GENERATORS,
  });
  await rm(tmp, { recursive: true, force: true });
  await vi.waitUntil(() => [APP, "gen-node", "gen-py"].every((a) => t.skiff.runner!.version(P, a) === 1), {
    timeout: 60_000,
  });
}, 90_000);
afterAll(async () => {
  await t?.close();
});

/** Opens a streamed answer; reads it chunk by chunk. */
async function open(rest: string, body = "", headers: Record<string, string> = {}, app = APP) {
  const res = await fetch(`${t.url}/v4/${P}/${app}/${rest}`, {
    method: "POST",
    headers: { authorization: `Bearer ${t.devToken}`, "content-type": "text/plain", ...headers },
    body,
  });
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  let text = "";
  return {
    res,
    /** Reads until the text so far contains `marker` (or the body ends); the text so far. */
    async until(marker: string): Promise<string> {
      while (!text.includes(marker)) {
        const { value, done } = await reader.read();
        if (done) break;
        text += decoder.decode(value, { stream: true });
      }
      return text;
    },
    async rest(): Promise<string> {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return text;
        text += decoder.decode(value, { stream: true });
      }
    },
    cancel: () => reader.cancel(),
    read: () => reader.read(),
  };
}

async function runOf(runId: string, status: string, app = APP) {
  return vi.waitUntil(
    async () => {
      // Not found until the run's record is written, which follows its end.
      const run = (
        await t
          .management()
          .getRun({ projectId: P, appName: app, runId })
          .catch(() => undefined)
      )?.run;
      return run?.status === status ? run : undefined;
    },
    { timeout: 60_000 },
  );
}

describe("streamed answers", () => {
  it("the first event reaches the caller while the app is still answering (it waits for the caller to open its gate)", async () => {
    const s = await open("gate/first");
    expect(s.res.status).toBe(200);
    expect(s.res.headers.get("content-type")).toBe("text/event-stream");
    expect(s.res.headers.get("x-request-id")).toBeTruthy();
    // Were the answer buffered until its end, this read would never return: the app ends only once opened.
    expect(await s.until("waiting")).toBe('data: {"waiting":"first"}\n\n');
    const opened = await post(v4("open/first"), t.devToken, "");
    expect(opened.json).toEqual({ opened: true });
    expect(await s.rest()).toBe('data: {"waiting":"first"}\n\ndata: {"opened":"first"}\n\n');
    const run = await runOf(s.res.headers.get("x-request-id")!, "success");
    expect(run.statusCode).toBe(200);
  });

  it("server-sent events arrive whole and in order", async () => {
    const s = await open("ticks?n=20&ms=5");
    const text = await s.rest();
    const ids = [...text.matchAll(/^id: (\d+)$/gm)].map((m) => Number(m[1]));
    expect(ids).toEqual(Array.from({ length: 20 }, (_, i) => i + 1));
    expect(text.split("\n\n").filter(Boolean)).toHaveLength(20);
    // The record keeps the size of what the caller got, although nothing kept the body.
    const run = await runOf(s.res.headers.get("x-request-id")!, "success");
    expect(run.responseBytes).toBe(BigInt(Buffer.byteLength(text)));
  });

  it("curl -N gets the first event while the app is still answering, then the rest", async () => {
    const curl = spawn(
      "curl",
      ["-N", "-sS", "-X", "POST", "-H", `Authorization: Bearer ${t.devToken}`, "-D", "-", v4("gate/curl")],
      { stdio: ["ignore", "pipe", "pipe"] },
    );
    let out = "";
    curl.stdout.on("data", (d: Buffer) => (out += d.toString()));
    const exited = new Promise<number | null>((resolve) => curl.once("exit", resolve));
    try {
      // The app ends only once opened: without -N's unbuffered reads (or a buffering skiff) this never shows.
      await vi.waitUntil(() => out.includes('data: {"waiting":"curl"}'), { timeout: 45_000 });
      expect(out).toMatch(/^HTTP\/1\.1 200/);
      expect(out.toLowerCase()).toContain("content-type: text/event-stream");
      expect(out).not.toContain("opened");
      expect((await post(v4("open/curl"), t.devToken, "")).json).toEqual({ opened: true });
      expect(await exited).toBe(0);
      expect(out).toContain('data: {"waiting":"curl"}\n\ndata: {"opened":"curl"}\n\n');
    } finally {
      curl.kill();
    }
  });

  it("an NDJSON answer to a body streams line by line", async () => {
    const s = await open("words", "one two three");
    expect(s.res.headers.get("content-type")).toBe("application/x-ndjson");
    const lines = (await s.rest())
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as unknown);
    expect(lines).toEqual([{ word: "one" }, { word: "two" }, { word: "three" }]);
  });

  it("a caller that does not read holds the app back (back-pressure); reading on gets every byte", async () => {
    const mb = 64;
    const s = await open(`flood?mb=${mb}`);
    expect((await s.read()).done).toBe(false);
    // Without reading: what the app has written stops growing, far short of the whole.
    let last = -1;
    const stalled = await vi.waitUntil(
      async () => {
        const now = ((await post(v4("state"), t.devToken, "")).json as { flooded: number }).flooded;
        const still = now === last;
        last = now;
        return still ? now : undefined;
      },
      { timeout: 60_000, interval: 300 },
    );
    expect(stalled).toBeLessThan((mb * 1024 * 1024) / 2);
    let bytes = 0;
    for (;;) {
      const { value, done } = await s.read();
      if (done) break;
      bytes += value.byteLength;
    }
    // The first chunk was read above; the rest makes up the whole.
    expect(bytes).toBeGreaterThan(mb * 1024 * 1024 - 1024 * 1024);
    const run = await runOf(s.res.headers.get("x-request-id")!, "success");
    expect(run.statusCode).toBe(200);
  });

  it("a caller that goes away mid-answer ends the run cancelled, and the app sees its connection close", async () => {
    const s = await open("gate/left");
    await s.until("waiting");
    await s.cancel();
    const run = await runOf(s.res.headers.get("x-request-id")!, "cancelled");
    expect(run.statusCode).toBe(499);
    await vi.waitUntil(
      async () =>
        ((await post(v4("state"), t.devToken, "")).json as { closedEarly: string[] }).closedEarly.includes("left"),
      { timeout: 30_000 },
    );
  });

  it("a streamed run with a webhook delivers the whole body once it has ended", async () => {
    const receiver = await startReceiver(() => 200);
    try {
      const hook = encodeURIComponent(`${receiver.url}/hook`);
      const s = await open(`ticks?n=4&ms=5&webhookEndpoint=${hook}`);
      const text = await s.rest();
      expect(text.match(/^id: /gm)).toHaveLength(4);
      const [delivery] = await receiver.waitFor("/hook", 1);
      expect(delivery.body.toString("utf8")).toBe(text);
      // Spec 6.1: a webhook is always sent as application/json, whatever the body.
      expect(delivery.headers["content-type"]).toBe("application/json");
    } finally {
      await receiver.close();
    }
  });

  it("a Connect caller of Run gets the streamed answer whole", async () => {
    const client = createClient(
      InvocationService,
      createConnectTransport({ baseUrl: t.url, httpVersion: "1.1", interceptors: [bearer(t.devToken)] }),
    );
    const res = await client.run({ projectId: P, appName: APP, path: "ticks", body: { data: new Uint8Array() } }, {});
    expect(res.statusCode).toBe(200);
    expect(res.body?.contentType).toBe("text/event-stream");
    expect(new TextDecoder().decode(res.body?.data).match(/^id: /gm)).toHaveLength(5);
    expect((await runOf(res.runId, "success")).responseBytes).toBe(BigInt(res.body!.data.byteLength));
  });
});

describe("Cortex generators", () => {
  const json = { "content-type": "application/json" };

  it("a Node async generator streams NDJSON by default: the first item comes before the function ends", async () => {
    const s = await open("gated", '{"name":"g1"}', json, "gen-node");
    expect(s.res.headers.get("content-type")).toBe("application/x-ndjson");
    // The function ends only once opened: a buffered answer would never show its first line.
    expect(await s.until("\n")).toBe('{"result":"waiting"}\n');
    expect((await post(`${t.url}/v4/${P}/gen-node/open`, t.devToken, '{"name":"g1"}')).json.result).toBe(true);
    expect(await s.rest()).toBe('{"result":"waiting"}\n{"result":"opened"}\n');
    await runOf(s.res.headers.get("x-request-id")!, "success", "gen-node");
  });

  it("with Accept: text/event-stream the items are server-sent events", async () => {
    for (const app of ["gen-node", "gen-py"]) {
      const s = await open("count", '{"n":3}', { ...json, accept: "text/event-stream" }, app);
      expect(s.res.headers.get("content-type")).toBe("text/event-stream");
      expect(await s.rest()).toBe([1, 2, 3].map((i) => `event: result\ndata: {"i":${i}}\n\n`).join(""));
    }
  });

  it("a Python generator and an async generator stream NDJSON lines", async () => {
    const s = await open("count", '{"n":3}', json, "gen-py");
    expect(await s.rest()).toBe('{"result":{"i":1}}\n{"result":{"i":2}}\n{"result":{"i":3}}\n');
    const a = await open("slow", '{"n":4}', json, "gen-py");
    expect(await a.rest()).toBe([0, 1, 2, 3].map((i) => `{"result":${i}}\n`).join(""));
  });

  it("a generator that raises mid-way ends with an error item, and its run reads failure with the error", async () => {
    for (const [app, type, message] of [
      ["gen-node", "RangeError", "too far"],
      ["gen-py", "ValueError", "bad ü"],
    ]) {
      const s = await open("boom", "{}", json, app);
      expect(s.res.status).toBe(200);
      const lines = (await s.rest())
        .trim()
        .split("\n")
        .map((l) => JSON.parse(l) as unknown);
      expect(lines).toEqual([{ result: 1 }, { error: { type, message } }]);
      const run = await runOf(s.res.headers.get("x-request-id")!, "failure", app);
      expect(run.error).toMatchObject({ type, message });
    }
  });

  it("a Connect caller of Run gets the items as one JSON array in the envelope", async () => {
    const client = createClient(
      InvocationService,
      createConnectTransport({ baseUrl: t.url, httpVersion: "1.1", interceptors: [bearer(t.devToken)] }),
    );
    for (const app of ["gen-node", "gen-py"]) {
      const res = await client.run({
        projectId: P,
        appName: app,
        path: "count",
        body: { contentType: "application/json", data: new TextEncoder().encode('{"n":2}') },
      });
      const body = JSON.parse(new TextDecoder().decode(res.body?.data)) as { result: unknown };
      expect(body.result).toEqual([{ i: 1 }, { i: 2 }]);
    }
  });
});

describe("RunStream (Connect and gRPC)", () => {
  const transports = {
    connect: () => createConnectTransport({ baseUrl: t.url, httpVersion: "1.1", interceptors: [bearer(t.devToken)] }),
    grpc: () => createGrpcTransport({ baseUrl: t.url, interceptors: [bearer(t.devToken)] }),
  };

  for (const [name, transport] of Object.entries(transports)) {
    it(`${name}: the head, then each chunk as the app writes it`, async () => {
      const client = createClient(InvocationService, transport());
      const parts = client.runStream({ projectId: P, appName: APP, path: `gate/${name}` })[Symbol.asyncIterator]();
      const head = (await parts.next()).value!.part;
      expect(head.case).toBe("head");
      if (head.case !== "head") return;
      expect(head.value).toMatchObject({ statusCode: 200, body: { contentType: "text/event-stream" } });
      const first = (await parts.next()).value!.part;
      // The app ends only once opened: this chunk came while it was still answering.
      expect(first.case === "chunk" && new TextDecoder().decode(first.value)).toBe(`data: {"waiting":"${name}"}\n\n`);
      await post(v4(`open/${name}`), t.devToken, "");
      let rest = "";
      for (let next = await parts.next(); !next.done; next = await parts.next()) {
        if (next.value.part.case === "chunk") rest += new TextDecoder().decode(next.value.part.value);
      }
      expect(rest).toBe(`data: {"opened":"${name}"}\n\n`);
      await runOf(head.value.runId, "success");
    });
  }

  it("an answer that does not stream comes as the head and one chunk; a Cortex generator as NDJSON", async () => {
    const client = createClient(InvocationService, transports.grpc());
    const parts = [];
    for await (const m of client.runStream({ projectId: P, appName: APP, path: "state" })) parts.push(m.part.case);
    expect(parts).toEqual(["head", "chunk"]);
    let text = "";
    const body = { contentType: "application/json", data: new TextEncoder().encode('{"n":2}') };
    for await (const m of client.runStream({ projectId: P, appName: "gen-py", path: "count", body }))
      if (m.part.case === "chunk") text += new TextDecoder().decode(m.part.value);
    expect(text).toBe('{"result":{"i":1}}\n{"result":{"i":2}}\n');
  });

  it("refusals are the same as Run's: an unknown app is not_found", async () => {
    const client = createClient(InvocationService, transports.connect());
    await expect(async () => {
      for await (const m of client.runStream({ projectId: P, appName: "nope", path: "x" })) void m;
    }).rejects.toMatchObject({ code: Code.NotFound });
  });
});
