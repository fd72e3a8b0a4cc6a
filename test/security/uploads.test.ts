// Large bodies sent with a valid token, attacked: DeployApp takes bodies up to
// SKIFF_MAX_BUNDLE_BYTES, read whole and parsed before its handler runs, so
// 16 bundles of 90 MB sent at once with one project's token held 3.6 GB of
// the server's memory (and 256 connections an address allow far more). Such
// bodies are now read in slots (SKIFF_MAX_UPLOADS in all,
// SKIFF_MAX_PROJECT_UPLOADS for one project's tokens): one past them is
// refused at once, before its body is read, on REST and Connect alike; a
// slot frees when its answer ends, and a body that comes too slowly ends its
// call. Real skiff, real nats-server.
import net from "node:net";
import { Code, ConnectError } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ManagementService } from "../../gen/skiff/management/v2/management_pb.js";
import { silentLogger } from "../../services/config/logger.js";
import { HealthState } from "../../services/server/health.js";
import { startServer, type SkiffServer } from "../../services/server/server.js";
import { exchange, type RawAnswer } from "../helpers/raw-http.js";
import { management } from "../helpers/rest-fixture.js";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";

const MAX_BODY = 4096;
const ANNOUNCED = 64 * 1024 * 1024;
const DEPLOY = "/skiff.management.v2.ManagementService/DeployApp";

function head(method: string, path: string, headers: Record<string, string>, length: number | "chunked"): Buffer {
  const lines = [`${method} ${path} HTTP/1.1`, "host: localhost"];
  for (const [name, value] of Object.entries(headers)) lines.push(`${name}: ${value}`);
  lines.push(length === "chunked" ? "transfer-encoding: chunked" : `content-length: ${length}`);
  return Buffer.from(`${lines.join("\r\n")}\r\n\r\n`, "latin1");
}

/** An upload left under way: its head and 1 KiB of the body it announces; `status` resolves with its answer's, if any. */
interface Held {
  socket: net.Socket;
  answered: Promise<number | "closed">;
}

function hold(port: number, request: Buffer): Held {
  const socket = net.connect(port, "127.0.0.1");
  let data = "";
  const answered = new Promise<number | "closed">((resolve) => {
    socket.on("data", (d: Buffer) => {
      data += d.toString("latin1");
      const m = /^HTTP\/1\.1 (\d{3})/.exec(data);
      if (m) resolve(Number(m[1]));
    });
    socket.on("close", () => resolve("closed"));
    socket.on("error", () => resolve("closed"));
  });
  const some = Buffer.alloc(1024, 0x41);
  const chunked = /\r\ntransfer-encoding: chunked\r\n/.test(request.toString("latin1"));
  socket.write(
    Buffer.concat([request, chunked ? Buffer.concat([Buffer.from("400\r\n"), some, Buffer.from("\r\n")]) : some]),
  );
  return { socket, answered };
}

/** The answer of a request that must be answered at once (within 5 s), its body still owed. */
async function answerNow(port: number, request: Buffer): Promise<RawAnswer> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<"late">((resolve) => (timer = setTimeout(() => resolve("late"), 5_000)));
  const answer = await Promise.race([exchange(port, request), late]).finally(() => clearTimeout(timer));
  if (answer === "late" || answer === "closed") throw new Error(`no answer: ${answer}`);
  return answer;
}

/** No answer within `ms`: the upload was taken in and its body is being read. */
async function stillReading(held: Held, ms = 500): Promise<boolean> {
  const outcome = await Promise.race([held.answered, new Promise((r) => setTimeout(() => r("waiting"), ms))]);
  return outcome === "waiting";
}

describe("uploads: bodies above SKIFF_MAX_BODY_BYTES are read a few at a time", () => {
  let t: TestSkiff;
  let port: number;
  const held: Held[] = [];
  beforeAll(async () => {
    t = await startTestSkiff({
      env: { SKIFF_MAX_UPLOADS: "3", SKIFF_MAX_PROJECT_UPLOADS: "2", SKIFF_MAX_BODY_BYTES: String(MAX_BODY) },
    });
    port = Number(new URL(t.url).port);
  }, 60_000);
  afterAll(async () => {
    for (const h of held) h.socket.destroy();
    await t?.close();
  });

  const rest = (token: string, length: number | "chunked" = ANNOUNCED) =>
    head(
      "POST",
      "/v2/projects/p-dev/apps",
      { authorization: `Bearer ${token}`, "content-type": "application/octet-stream" },
      length,
    );
  const connect = (token: string, length: number | "chunked" = ANNOUNCED) =>
    head("POST", DEPLOY, { authorization: `Bearer ${token}`, "content-type": "application/proto" }, length);

  it("a project's tokens get SKIFF_MAX_PROJECT_UPLOADS, the server SKIFF_MAX_UPLOADS; one more is refused before its body", async () => {
    // Two of the project's uploads, one by REST and one by Connect (chunked: a length unknown needs a slot too).
    held.push(hold(port, rest(t.devToken)), hold(port, connect(t.devToken, "chunked")));
    expect(await stillReading(held[0])).toBe(true);
    expect(await stillReading(held[1])).toBe(true);

    const third = await answerNow(port, rest(t.devToken));
    expect(third.status).toBe(429);
    expect(JSON.parse(third.body.toString())).toMatchObject({ code: "resource_exhausted" });
    expect(third.body.toString()).toContain("SKIFF_MAX_PROJECT_UPLOADS");
    expect(third.headers.get("retry-after")).toBe("1");
    const thirdConnect = await answerNow(port, connect(t.devToken));
    expect(thirdConnect.status).toBe(429);

    // The admin's count in all only: it takes the last slot, and then nobody gets one.
    held.push(hold(port, connect(t.adminToken)));
    expect(await stillReading(held[2])).toBe(true);
    const full = await answerNow(port, rest(t.adminToken));
    expect(full.status).toBe(429);
    expect(full.body.toString()).toContain("SKIFF_MAX_UPLOADS");

    // A body within SKIFF_MAX_BODY_BYTES needs no slot: it is read and judged (not a bundle: 400).
    const small = await fetch(`${t.url}/v2/projects/p-dev/apps`, {
      method: "POST",
      headers: { authorization: `Bearer ${t.devToken}`, "content-type": "application/octet-stream" },
      body: Buffer.alloc(100, 0x41),
    });
    expect(small.status).toBe(400);

    // A caller that goes away frees its slot; the next upload is taken in (its whole body read, then judged).
    held[0].socket.destroy();
    const client = t.management(t.devToken);
    await expect
      .poll(
        async () => {
          try {
            await client.deployApp({ projectId: "p-dev", bundle: { data: new Uint8Array(2 * MAX_BODY) } });
            return "deployed";
          } catch (err) {
            return ConnectError.from(err).code;
          }
        },
        { timeout: 5_000 },
      )
      .toBe(Code.InvalidArgument);
  });
});

describe("uploads: a body that comes too slowly ends its call and frees its slot", () => {
  let server: SkiffServer;
  beforeAll(async () => {
    server = await startServer({
      host: "127.0.0.1",
      port: 0,
      maxBodyBytes: MAX_BODY,
      bodyLimits: new Map([[ManagementService.method.deployApp, 1024 * 1024]]),
      admit: () => ({ kind: "service_account", projectId: "p1" }),
      uploads: { maxUploads: 1, maxProjectUploads: 1, graceMs: 300, bytesPerSecond: 1e9 },
      logger: silentLogger,
      health: new HealthState(),
      restServices: [ManagementService],
      routes: (router) => router.service(ManagementService, management([])),
    });
  });
  afterAll(() => server?.close(0));

  it("the dribbler's connection ends after its time; then another upload gets the slot", async () => {
    const slow = hold(server.port, head("POST", "/v2/projects/p1/apps", {}, 100_000));
    expect(await stillReading(slow, 100)).toBe(true);
    const refused = await answerNow(server.port, head("POST", "/v2/projects/p1/apps", {}, 100_000));
    expect(refused.status).toBe(429);
    expect(await slow.answered).toBe("closed");
    const next = hold(server.port, head("POST", "/v2/projects/p1/apps", {}, 100_000));
    expect(await stillReading(next, 100)).toBe(true);
    next.socket.destroy();
  });
});
