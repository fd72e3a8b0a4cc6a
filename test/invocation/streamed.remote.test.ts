// Streamed answers across NATS: the gateway here runs no runner, so a sync
// run goes to a runner process over NATS and a streamed answer's body comes
// back on the run's byte stream, with credit-based flow control
// (runner-client/nats.ts, byte-stream.ts). The same app as test/invocation/streamed.test.ts.
import path from "node:path";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { InvocationService } from "../../gen/skiff/invocation/v4/invocation_pb.js";
import { packApp } from "../../services/apps/bundle.js";
import { bearer, startTestRunner, startTestSkiff, type TestRunner, type TestSkiff } from "../helpers/skiff.js";
import { P, post } from "../helpers/run-apps.js";
import { TEST_ROOT } from "../helpers/paths.js";

const ROOT = path.resolve(TEST_ROOT, "..");
const APP = "stream-events";
let gateway: TestSkiff;
let runner: TestRunner;
const v4 = (rest: string) => `${gateway.url}/v4/${P}/${APP}/${rest}`;

beforeAll(async () => {
  gateway = await startTestSkiff({ env: { SKIFF_ROLES: "invocation,management" } });
  runner = await startTestRunner(gateway);
  const bundle = (await packApp(path.join(ROOT, "examples", APP))).bytes;
  await gateway.management().deployApp({ projectId: P, bundle: { contentType: "application/gzip", data: bundle } });
  await vi.waitUntil(async () => (await post(v4("state"), gateway.devToken, "")).status === 200, {
    timeout: 60_000,
    interval: 200,
  });
}, 90_000);
afterAll(async () => {
  await runner?.close();
  await gateway?.close();
});

async function open(rest: string) {
  const res = await fetch(v4(rest), { method: "POST", headers: { authorization: `Bearer ${gateway.devToken}` } });
  return { res, reader: res.body!.getReader() };
}

async function readAll(reader: ReadableStreamDefaultReader<Uint8Array>): Promise<Uint8Array[]> {
  const parts: Uint8Array[] = [];
  for (let next = await reader.read(); !next.done; next = await reader.read()) parts.push(next.value);
  return parts;
}

const runOf = (runId: string, status: string) =>
  vi.waitUntil(
    async () => {
      const got = await gateway
        .management()
        .getRun({ projectId: P, appName: APP, runId })
        .catch(() => undefined);
      return got?.run?.status === status ? got.run : undefined;
    },
    { timeout: 60_000 },
  );

describe("streamed answers through a runner over NATS", () => {
  it("a large chunked request body reaches the app across NATS whole and in order", async () => {
    const words = Array.from({ length: 300 }, (_, i) => `${i}`.padStart(1000, "w"));
    const body = new TextEncoder().encode(words.join(" "));
    const res = await fetch(v4("words"), {
      method: "POST",
      headers: { authorization: `Bearer ${gateway.devToken}`, "content-type": "text/plain" },
      // A stream has no length: it goes chunked, the way the transcoder leaves a body for its handler.
      body: new Blob([body]).stream(),
      duplex: "half",
    } as RequestInit);
    expect(res.status).toBe(200);
    const lines = (await res.text()).trim().split("\n");
    expect(lines.map((line) => (JSON.parse(line) as { word: string }).word)).toEqual(words);
  });

  it("the first event arrives while the app still answers; the rest follows in order", async () => {
    expect(gateway.skiff.runner).toBeUndefined();
    const { res, reader } = await open("gate/remote");
    expect(res.headers.get("content-type")).toBe("text/event-stream");
    expect(new TextDecoder().decode((await reader.read()).value)).toBe('data: {"waiting":"remote"}\n\n');
    await post(v4("open/remote"), gateway.devToken, "");
    const rest = new TextDecoder().decode(Buffer.concat(await readAll(reader)));
    expect(rest).toBe('data: {"opened":"remote"}\n\n');
    const run = await runOf(res.headers.get("x-request-id")!, "success");
    expect(run.statusCode).toBe(200);
  });

  it("a caller that does not read holds the app back across NATS; reading on gets every byte", async () => {
    const mb = 32;
    const { res, reader } = await open(`flood?mb=${mb}`);
    let got = (await reader.read()).value!.byteLength;
    let last = -1;
    const stalled = await vi.waitUntil(
      async () => {
        const now = ((await post(v4("state"), gateway.devToken, "")).json as { flooded: number }).flooded;
        const still = now === last;
        last = now;
        return still ? now : undefined;
      },
      { timeout: 60_000, interval: 300 },
    );
    expect(stalled).toBeLessThan((mb * 1024 * 1024) / 2);
    for (const part of await readAll(reader)) got += part.byteLength;
    expect(got).toBe(mb * 1024 * 1024);
    await runOf(res.headers.get("x-request-id")!, "success");
  });

  it("a caller that goes away cancels the run on the runner; the app sees its connection close", async () => {
    const { res, reader } = await open("gate/gone");
    await reader.read();
    await reader.cancel();
    await runOf(res.headers.get("x-request-id")!, "cancelled");
    await vi.waitUntil(
      async () =>
        ((await post(v4("state"), gateway.devToken, "")).json as { closedEarly: string[] }).closedEarly.includes(
          "gone",
        ),
      { timeout: 30_000 },
    );
  });

  it("RunStream over gRPC through the remote runner", async () => {
    const client = createClient(
      InvocationService,
      createGrpcTransport({ baseUrl: gateway.url, interceptors: [bearer(gateway.devToken)] }),
    );
    let text = "";
    for await (const m of client.runStream({ projectId: P, appName: APP, path: "ticks" }))
      if (m.part.case === "chunk") text += new TextDecoder().decode(m.part.value);
    expect(text.match(/^id: (\d+)$/gm)).toEqual(["id: 1", "id: 2", "id: 3", "id: 4", "id: 5"]);
  });
});
