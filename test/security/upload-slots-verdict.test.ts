// Upload slots attacked through the time a token takes to be judged. A token
// not seen before (a new service account's: a tenant's token may mint them)
// is judged with an await (`admit` returns a promise), and the slot is taken
// when the verdict comes: UploadSlots.take() then listens for "close" on the
// request's socket or stream, and on its response. A caller that goes away
// before the verdict has closed all three already: nothing ever says "close"
// again, the body never ends, nobody answers, and the slot is never given
// back (its deadline only cuts a call, which is gone). Each such call kept a
// slot for good (SKIFF_MAX_PROJECT_UPLOADS of them and the project could
// never upload again, and every tenant that did it took slots of
// SKIFF_MAX_UPLOADS away from all) until take() learned to take none for a
// call already gone.
import http2 from "node:http2";
import net from "node:net";
import { Code, ConnectError } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ManagementService } from "../../gen/skiff/management/v2/management_pb.js";
import { silentLogger } from "../../services/config/logger.js";
import { HealthState } from "../../services/server/health.js";
import { startServer, type SkiffServer } from "../../services/server/server.js";
import { management } from "../helpers/rest-fixture.js";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";

const MAX_BODY = 4096;
const BUNDLE_LIMIT = 1024 * 1024;
const GRACE_MS = 300;
const DEPLOY = "/skiff.management.v2.ManagementService/DeployApp";
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const opened: net.Socket[] = [];
const sessions: http2.ClientHttp2Session[] = [];
afterAll(() => {
  for (const s of opened) s.destroy();
  for (const s of sessions) s.destroy();
});

function connect(port: number): net.Socket {
  const socket = net.connect(port, "127.0.0.1");
  socket.on("error", () => undefined);
  opened.push(socket);
  return socket;
}

function h2(port: number): http2.ClientHttp2Session {
  const session = http2.connect(`http://127.0.0.1:${port}`);
  session.on("error", () => undefined);
  sessions.push(session);
  return session;
}

function head(path: string, token: string, type: string, length: number): string {
  return [
    `POST ${path} HTTP/1.1`,
    "host: localhost",
    `authorization: Bearer ${token}`,
    `content-type: ${type}`,
    `content-length: ${length}`,
    "",
    "",
  ].join("\r\n");
}

/** What becomes of an upload with `token`: "reading" (taken in: no answer within 300 ms), else its status; then it goes away. */
async function probe(port: number, path: string, token: string): Promise<string> {
  const socket = connect(port);
  const outcome = await new Promise<string>((resolve) => {
    socket.on("data", (d: Buffer) => resolve(/^HTTP\/1\.1 (\d{3})/.exec(d.toString("latin1"))?.[1] ?? "?"));
    socket.on("close", () => resolve("closed"));
    const type = path.startsWith("/v2/") ? "application/octet-stream" : "application/proto";
    socket.write(head(path, token, type, 100_000) + "A".repeat(1024));
    setTimeout(() => resolve("reading"), 300);
  });
  socket.destroy();
  await sleep(50);
  return outcome;
}

/** Whether an upload with `token` is taken in now. */
async function slotFree(port: number, path: string, token: string): Promise<boolean> {
  return (await probe(port, path, token)) === "reading";
}

describe("upload slots: a caller gone before its token's verdict (stand-in admit, a 100 ms verdict)", () => {
  let server: SkiffServer;
  beforeAll(async () => {
    server = await startServer({
      host: "127.0.0.1",
      port: 0,
      maxBodyBytes: MAX_BODY,
      bodyLimits: new Map([[ManagementService.method.deployApp, BUNDLE_LIMIT]]),
      // `good-<project>` is judged at once (a token seen before), `new-<project>` after 100 ms (one not seen before).
      admit: (_service, authorization) => {
        const m = /^Bearer (good|new)-([a-z0-9-]+)$/.exec(authorization ?? "");
        if (!m) return new ConnectError("invalid bearer token", Code.Unauthenticated);
        const admitted = { kind: "service_account", projectId: m[2] };
        return m[1] === "good" ? admitted : sleep(100).then(() => admitted);
      },
      uploads: { maxUploads: 100, maxProjectUploads: 1, graceMs: GRACE_MS, bytesPerSecond: 1e9 },
      logger: silentLogger,
      health: new HealthState(),
      restServices: [ManagementService],
      routes: (router) => router.service(ManagementService, management([])),
    });
  });
  afterAll(() => server?.close(0));

  it("the probe: a slow verdict that its caller waits for takes the slot, and gives it back when the caller goes", async () => {
    const socket = connect(server.port);
    socket.write(head(DEPLOY, "new-wait", "application/proto", 100_000) + "A".repeat(1024));
    await sleep(250);
    expect(await slotFree(server.port, DEPLOY, "good-wait")).toBe(false);
    socket.destroy();
    await sleep(100);
    expect(await slotFree(server.port, DEPLOY, "good-wait")).toBe(true);
  });

  it("Connect over HTTP/1.1: a connection closed before the verdict leaves no slot behind", async () => {
    expect(await slotFree(server.port, DEPLOY, "good-h1")).toBe(true);
    const socket = connect(server.port);
    socket.write(head(DEPLOY, "new-h1", "application/proto", 100_000) + "A".repeat(1024), () => socket.destroy());
    // Past the verdict and past the body's deadline many times over.
    await sleep(100 + 3 * GRACE_MS);
    expect(await slotFree(server.port, DEPLOY, "good-h1")).toBe(true);
  });

  it("REST over HTTP/1.1: a connection closed before the verdict leaves no slot behind", async () => {
    expect(await slotFree(server.port, "/v2/projects/rest/apps", "good-rest")).toBe(true);
    const socket = connect(server.port);
    socket.write(head("/v2/projects/rest/apps", "new-rest", "application/octet-stream", 100_000), () =>
      socket.destroy(),
    );
    await sleep(100 + 3 * GRACE_MS);
    expect(await slotFree(server.port, "/v2/projects/rest/apps", "good-rest")).toBe(true);
  });

  it("HTTP/2: a stream reset before the verdict leaves no slot behind", async () => {
    expect(await slotFree(server.port, DEPLOY, "good-h2")).toBe(true);
    const session = h2(server.port);
    const stream = session.request({
      ":method": "POST",
      ":path": DEPLOY,
      "content-type": "application/proto",
      "content-length": "100000",
      authorization: "Bearer new-h2",
    });
    stream.on("error", () => undefined);
    await sleep(20);
    stream.close(http2.constants.NGHTTP2_CANCEL);
    await sleep(100 + 3 * GRACE_MS);
    expect(await slotFree(server.port, DEPLOY, "good-h2")).toBe(true);
  });
});

describe("upload slots: real skiff, a tenant's freshly minted tokens", () => {
  let t: TestSkiff;
  let port: number;
  beforeAll(async () => {
    t = await startTestSkiff({
      env: { SKIFF_MAX_UPLOADS: "4", SKIFF_MAX_PROJECT_UPLOADS: "1", SKIFF_MAX_BODY_BYTES: String(MAX_BODY) },
    });
    port = Number(new URL(t.url).port);
  }, 60_000);
  afterAll(async () => {
    await t?.close();
  });

  it("a tenant's new token, its upload's stream reset at once, does not keep the project's slot for good", async () => {
    const client = t.management(t.devToken);
    const identity = await client.getIdentity({});
    const project = identity.projectId;
    expect(identity.kind).toBe("service_account");
    expect(await slotFree(port, DEPLOY, t.devToken)).toBe(true);
    // The tenant mints tokens of its own project (as its token may); each is judged with an await the first time.
    const fresh: string[] = [];
    for (let i = 0; i < 3; i++)
      fresh.push(
        (await client.createServiceAccount({ projectId: project, name: `race-${i}`, expiresAt: identity.expiresAt }))
          .token,
      );
    const session = h2(port);
    for (const token of fresh) {
      const stream = session.request({
        ":method": "POST",
        ":path": DEPLOY,
        "content-type": "application/proto",
        "content-length": "100000",
        authorization: `Bearer ${token}`,
      });
      stream.on("error", () => undefined);
      // HEADERS and RST_STREAM leave together: the stream is gone before its token is judged.
      stream.close(http2.constants.NGHTTP2_CANCEL);
    }
    await sleep(1_000);
    session.destroy();
    await sleep(200);
    // Nothing of those calls is left: the project's one slot is free for its next upload.
    // (Now: 429, "1 uploads of this project are under way", for as long as the server runs.)
    expect(await probe(port, DEPLOY, t.devToken)).toBe("reading");
  }, 30_000);
});
