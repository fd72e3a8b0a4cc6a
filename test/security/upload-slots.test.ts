// Upload slots attacked by a caller with a valid token: ways to leak a slot
// (so it never frees), hold one forever, or read a large body without one.
// The server here is skiff's own (startServer) with a stand-in admit: a
// token `good-<project>` is that project's, any other is refused; the slots'
// grace is short (800 ms) so that a deadline's effect shows quickly. Each
// test uses its own project, SKIFF_MAX_PROJECT_UPLOADS is 1: a probe upload
// of that project is taken in (no answer while it sends) when its slot is
// free, and refused 429 at once when something still holds it.
//
// Three of these failed on the first version of the slots, each a way to
// keep a slot for good (four tenants' tokens then took every slot with the
// defaults): a pipelined HTTP/1.1 upload's slot never freed (Node emits no
// "close" for a response that never got the socket); an HTTP/2 upload's body
// deadline did nothing (Http2ServerRequest.destroy() leaves the stream
// open); an HTTP/2 caller that kept its stream window at 0 kept its slot as
// long as it liked. A slot now also ends with its connection or stream, a
// late body ends its stream or connection, and the slot is given back as
// the handler ends its answer.
import http2 from "node:http2";
import { create, toBinary } from "@bufbuild/protobuf";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DeployAppRequestSchema } from "../../gen/skiff/management/v2/management_pb.js";
import type { SkiffServer } from "../../services/server/server.js";
import { Clients, DEPLOY, MAX_BODY, sleep, startUploadServer, uploadHead } from "../helpers/upload-server.js";

const GRACE_MS = 800;

let server: SkiffServer;
const clients = new Clients();

beforeAll(async () => {
  server = await startUploadServer(
    { maxUploads: 100, maxProjectUploads: 1, graceMs: GRACE_MS, bytesPerSecond: 1e9 },
    // An answer that never comes: the first request of a pipeline keeps the connection's turn.
    { getProject: () => new Promise(() => undefined) },
  );
});
afterAll(async () => {
  clients.destroy();
  await server?.close(0);
});

const connect = () => clients.connect(server.port);
const h2 = () => clients.h2(server.port);
/** An upload to `project`'s REST path with its own token. */
const restHead = (project: string, extra: string[] = [], length: number | "chunked" = 100_000) =>
  uploadHead(`/v2/projects/${project}/apps`, `good-${project}`, length, extra);
/** Whether an upload of `project` is taken in now (see Clients.probe). */
const slotFree = (project: string) => clients.slotFree(server.port, `/v2/projects/${project}/apps`, `good-${project}`);

async function eventuallyFree(project: string, ms = 3 * GRACE_MS): Promise<boolean> {
  const until = Date.now() + ms;
  do {
    if (await slotFree(project)) return true;
  } while (Date.now() < until);
  return false;
}

describe("upload slots: every way a call ends gives its slot back", () => {
  it("the probe itself: a free slot takes the upload, a held one refuses the next with 429", async () => {
    expect(await slotFree("probe")).toBe(true);
    const holder = connect();
    holder.write(restHead("probe") + "A".repeat(1024));
    await sleep(100);
    expect(await slotFree("probe")).toBe(false);
    holder.destroy();
    expect(await eventuallyFree("probe")).toBe(true);
  });

  it("a pipelined upload behind a request still being answered gives its slot back when the connection goes", async () => {
    // Request 1 (any call with a token) is still being answered; request 2, an upload, is
    // pipelined behind it on the same connection. Node emits request 2 at once (its answer
    // queued), so it is admitted and takes its slot; its answer never gets the socket.
    const socket = connect();
    socket.write(
      ["GET /v2/projects/pipe HTTP/1.1", "host: localhost", "authorization: Bearer good-pipe", "", ""].join("\r\n") +
        restHead("pipe", [], "chunked") +
        `400\r\n${"A".repeat(1024)}\r\n`,
    );
    await sleep(200);
    socket.destroy();
    // Past the body's deadline, and the connection long gone: the slot should be free.
    await sleep(2 * GRACE_MS);
    expect(await eventuallyFree("pipe")).toBe(true);
  });

  it("an HTTP/2 upload whose caller then refuses the answer (stream window 0) does not hold its slot forever", async () => {
    // The body comes whole and at once; the client's stream window is 0, so the answer's
    // DATA can never be sent and the response never ends.
    const session = clients.h2(server.port, { initialWindowSize: 0 });
    const body = toBinary(
      DeployAppRequestSchema,
      create(DeployAppRequestSchema, { projectId: "window", bundle: { data: new Uint8Array(2 * MAX_BODY) } }),
    );
    const stream = session.request({
      ":method": "POST",
      ":path": DEPLOY,
      "content-type": "application/proto",
      "content-length": String(body.length),
      authorization: "Bearer good-window",
    });
    stream.on("error", () => undefined);
    const head = new Promise<number>((resolve) => stream.on("response", (h) => resolve(Number(h[":status"]))));
    stream.end(body);
    // The call was served (its head came back): the body was read and the handler answered.
    expect(await head).toBe(200);
    await sleep(3 * GRACE_MS);
    expect(await eventuallyFree("window", 2_000)).toBe(true);
  });

  it("an HTTP/2 stream reset (RST_STREAM CANCEL) mid-body frees its slot", async () => {
    const session = h2();
    const stream = clients.h2Upload(session, DEPLOY, "good-rst", 100_000);
    stream.write(Buffer.alloc(1024, 0x41));
    await sleep(150);
    expect(await slotFree("rst")).toBe(false);
    stream.close(http2.constants.NGHTTP2_CANCEL);
    expect(await eventuallyFree("rst", 1_000)).toBe(true);
  });

  it("an HTTP/2 session torn down with uploads open frees their slots", async () => {
    const session = h2();
    const stream = clients.h2Upload(session, "/v2/projects/gone/apps", "good-gone");
    stream.write(Buffer.alloc(1024, 0x41));
    await sleep(150);
    expect(await slotFree("gone")).toBe(false);
    session.destroy();
    expect(await eventuallyFree("gone", 1_000)).toBe(true);
  });

  it("an HTTP/2 upload that sends its headers and no DATA at all is cut at its deadline", async () => {
    const session = h2();
    const stream = clients.h2Upload(session, DEPLOY, "good-nodata", 100_000);
    await sleep(150);
    expect(await slotFree("nodata")).toBe(false);
    await sleep(GRACE_MS);
    expect(await eventuallyFree("nodata")).toBe(true);
  });

  it("Expect: 100-continue and then no body: cut at its deadline", async () => {
    const socket = connect();
    socket.write(restHead("expect", ["expect: 100-continue"]));
    await sleep(150);
    expect(await slotFree("expect")).toBe(false);
    await sleep(GRACE_MS);
    expect(await eventuallyFree("expect")).toBe(true);
  });

  it("a chunked body dribbled a byte at a time is cut at its deadline", async () => {
    const socket = connect();
    socket.write(restHead("dribble", [], "chunked"));
    const timer = setInterval(() => socket.writable && socket.write("1\r\nA\r\n"), 50);
    try {
      await sleep(150);
      expect(await slotFree("dribble")).toBe(false);
      const closed = await new Promise<boolean>((resolve) => {
        socket.on("close", () => resolve(true));
        setTimeout(() => resolve(false), 3 * GRACE_MS);
      });
      expect(closed).toBe(true);
    } finally {
      clearInterval(timer);
    }
    expect(await eventuallyFree("dribble")).toBe(true);
  });

  it("a refused upload (429) takes nothing, and its connection serves the next request", async () => {
    const holder = connect();
    holder.write(restHead("refused") + "A".repeat(1024));
    await sleep(100);
    // Twenty refusals in a row on one connection, each fully answered.
    const socket = connect();
    let answers = "";
    socket.on("data", (d: Buffer) => (answers += d.toString("latin1")));
    // Each announces more than MAX_BODY (a slot needed) and sends it: the refusal drains it, the next head follows.
    for (let i = 0; i < 20; i++) socket.write(restHead("refused", [], 2 * MAX_BODY) + "A".repeat(2 * MAX_BODY));
    await expect.poll(() => answers.match(/HTTP\/1\.1 429/g)?.length ?? 0, { timeout: 3_000 }).toBe(20);
    holder.destroy();
    expect(await eventuallyFree("refused")).toBe(true);
  });

  it("another project's token cannot take this project's slot; an unknown token takes none", async () => {
    const holder = connect();
    // good-a's token, sent to project b's path: counted as a's.
    holder.write(restHead("b").replace("good-b", "good-a") + "A".repeat(1024));
    await sleep(100);
    expect(await slotFree("b")).toBe(true);
    expect(await slotFree("a")).toBe(false);
    holder.destroy();
    // Refused tokens, many at once: nothing counted.
    const bad = Array.from({ length: 10 }, () => {
      const s = connect();
      s.write(restHead("c").replace("good-c", "bad-c") + "A".repeat(1024));
      return s;
    });
    await sleep(100);
    expect(await slotFree("c")).toBe(true);
    for (const s of bad) s.destroy();
  });

  it("an HTTP/2 upload cannot skip its slot by declaring a small content-length and sending more", async () => {
    // The project's one slot is held; an h2 stream declares 10 bytes (no slot needed) and sends 2 × MAX_BODY.
    const holder = connect();
    holder.write(restHead("liar") + "A".repeat(1024));
    await sleep(100);
    const session = h2();
    const body = toBinary(
      DeployAppRequestSchema,
      create(DeployAppRequestSchema, { projectId: "liar", bundle: { data: new Uint8Array(2 * MAX_BODY) } }),
    );
    const stream = session.request({
      ":method": "POST",
      ":path": DEPLOY,
      "content-type": "application/proto",
      "content-length": "10",
      authorization: "Bearer good-liar",
    });
    const outcome = await new Promise<string>((resolve) => {
      stream.on("response", (h) => resolve(`status ${String(h[":status"])}`));
      stream.on("error", (err: NodeJS.ErrnoException) => resolve(`error ${err.code ?? err.message}`));
      stream.on("close", () => resolve(`closed ${stream.rstCode}`));
      stream.end(body);
    });
    // nghttp2 holds the stream to its content-length: the stream is reset, never served.
    expect(outcome).not.toBe("status 200");
    holder.destroy();
  });
});
