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
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { SkiffServer } from "../../services/server/server.js";
import { Clients, DEPLOY, MAX_BODY, sleep, startUploadServer, uploadHead } from "../helpers/upload-server.js";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";

const GRACE_MS = 300;
const clients = new Clients();
afterAll(() => clients.destroy());

describe("upload slots: a caller gone before its token's verdict (stand-in admit, a 100 ms verdict)", () => {
  let server: SkiffServer;
  beforeAll(async () => {
    // `good-<project>` is judged at once (a token seen before), `new-<project>` after 100 ms (one not seen before).
    server = await startUploadServer({ maxUploads: 100, maxProjectUploads: 1, graceMs: GRACE_MS, bytesPerSecond: 1e9 });
  });
  afterAll(() => server?.close(0));

  it("the probe: a slow verdict that its caller waits for takes the slot, and gives it back when the caller goes", async () => {
    const socket = clients.connect(server.port);
    socket.write(uploadHead(DEPLOY, "new-wait") + "A".repeat(1024));
    await sleep(250);
    expect(await clients.slotFree(server.port, DEPLOY, "good-wait")).toBe(false);
    socket.destroy();
    await sleep(100);
    expect(await clients.slotFree(server.port, DEPLOY, "good-wait")).toBe(true);
  });

  it("Connect over HTTP/1.1: a connection closed before the verdict leaves no slot behind", async () => {
    expect(await clients.slotFree(server.port, DEPLOY, "good-h1")).toBe(true);
    const socket = clients.connect(server.port);
    socket.write(uploadHead(DEPLOY, "new-h1") + "A".repeat(1024), () => socket.destroy());
    // Past the verdict and past the body's deadline many times over.
    await sleep(100 + 3 * GRACE_MS);
    expect(await clients.slotFree(server.port, DEPLOY, "good-h1")).toBe(true);
  });

  it("REST over HTTP/1.1: a connection closed before the verdict leaves no slot behind", async () => {
    expect(await clients.slotFree(server.port, "/v2/projects/rest/apps", "good-rest")).toBe(true);
    const socket = clients.connect(server.port);
    socket.write(uploadHead("/v2/projects/rest/apps", "new-rest"), () => socket.destroy());
    await sleep(100 + 3 * GRACE_MS);
    expect(await clients.slotFree(server.port, "/v2/projects/rest/apps", "good-rest")).toBe(true);
  });

  it("HTTP/2: a stream reset before the verdict leaves no slot behind", async () => {
    expect(await clients.slotFree(server.port, DEPLOY, "good-h2")).toBe(true);
    const session = clients.h2(server.port);
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
    expect(await clients.slotFree(server.port, DEPLOY, "good-h2")).toBe(true);
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
    expect(await clients.slotFree(port, DEPLOY, t.devToken)).toBe(true);
    // The tenant mints tokens of its own project (as its token may); each is judged with an await the first time.
    const fresh: string[] = [];
    for (let i = 0; i < 3; i++)
      fresh.push(
        (await client.createServiceAccount({ projectId: project, name: `race-${i}`, expiresAt: identity.expiresAt }))
          .token,
      );
    const session = clients.h2(port);
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
    expect(await clients.probe(port, DEPLOY, t.devToken)).toBe("reading");
  }, 30_000);
});
