// A gateway in front of runners of an earlier version, which read a request's
// body only whole (they know nothing of bodies that follow the request,
// runs/body-wire.ts, and would give the app an empty one): such runners do not
// listen where requests with a following body go, so the gateway, finding no
// runner there, sends the body whole on the subject they do listen on. The
// runner here is a stand-in on that subject that answers what the app would
// have got, as an earlier runner would: the frame's own body.
import http from "node:http";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { connect, type NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { subjects } from "../services/nats/layout.js";
import { BodyTransfer, decodeRequest, encodeReply, STREAM_BODIES_ABOVE } from "../services/runs/index.js";
import { startTestSkiff, type TestSkiff } from "./helpers/skiff.js";
import { P, deploy } from "./helpers/run-apps.js";
import { skiffToml } from "./helpers/apps.js";

const APP = "older";
let t: TestSkiff;
let nc: NatsConnection;
const seen: { bodyFollows: boolean; bytes: number }[] = [];

beforeAll(async () => {
  // A gateway without a runner of its own: its sync runs go over NATS.
  t = await startTestSkiff({ env: { SKIFF_ROLES: "invocation,management" } });
  const tmp = await mkdtemp(path.join(tmpdir(), "skiff-older-"));
  await deploy(tmp, t.management(), {
    "skiff.toml": skiffToml({ name: APP, runtime: { kind: "custom", command: ["node", "server.mjs"] } }),
    "server.mjs": "",
  });
  await rm(tmp, { recursive: true, force: true });
  nc = await connect({ servers: t.nats.url });
  const transfer = new BodyTransfer(nc, () => nc.jetstream().views.os("skiff-results"));
  // The earlier runner: its queue group, its subject, and the body as the frame carries it.
  nc.subscribe(subjects.invoke(P, APP), {
    queue: subjects.invokeQueueGroup,
    callback: (_err, msg) => {
      void (async () => {
        const req = await decodeRequest(transfer, msg.data);
        seen.push({ bodyFollows: req.bodyFrom !== undefined, bytes: req.body.byteLength });
        const body = new TextEncoder().encode(JSON.stringify({ bytes: req.body.byteLength }));
        const headers = { "content-type": "application/json" };
        msg.respond(
          await encodeReply(transfer, req.runId, { status: 200, headers, body, runTimeMs: 1, replicaId: "r" }),
        );
      })();
    },
  });
  await nc.flush();
}, 90_000);

afterAll(async () => {
  await nc?.close();
  await t?.close();
});

/** POSTs `size` bytes in chunks of 64 KiB, without Content-Length (so the body streams), and reads the answer. */
async function postChunked(size: number): Promise<{ status: number; body: string }> {
  const req = http.request(`${t.url}/v4/${P}/${APP}/upload`, {
    method: "POST",
    agent: new http.Agent({ keepAlive: false }),
    headers: { authorization: `Bearer ${t.devToken}`, "content-type": "application/octet-stream" },
  });
  const answer = new Promise<{ status: number; body: string }>((resolve, reject) => {
    req.once("error", reject);
    req.once("response", (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (s: string) => (body += s));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
    });
  });
  for (let sent = 0; sent < size; sent += 64 * 1024) req.write(Buffer.alloc(Math.min(64 * 1024, size - sent), 7));
  req.end();
  return answer;
}

describe("a gateway in front of runners of an earlier version", () => {
  it("sends a large or chunked body whole to them, never as a body that follows, which they would drop", async () => {
    // A small body goes whole anyway; once it is answered, the gateway knows the app.
    const small = async () =>
      (
        await fetch(`${t.url}/v4/${P}/${APP}/small`, {
          method: "POST",
          headers: { authorization: `Bearer ${t.devToken}`, "content-type": "text/plain" },
          body: "hi",
        })
      ).status;
    await vi.waitUntil(async () => (await small()) === 200, { timeout: 10_000, interval: 100 });
    const size = 4 * STREAM_BODIES_ABOVE + 123;
    const res = await postChunked(size);
    expect(res.status).toBe(200);
    expect(JSON.parse(res.body)).toEqual({ bytes: size });
    expect(seen.at(-1)).toEqual({ bodyFollows: false, bytes: size });
  });
});
