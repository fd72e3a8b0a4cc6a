// Upload slots attacked with compressed bodies. A body needs a slot when its
// declared length passes SKIFF_MAX_BODY_BYTES (or is unknown); Connect,
// gRPC-Web and gRPC accept gzip and brotli (connectNodeAdapter's default),
// and inflate a message up to the method's readMaxBytes (DeployApp's:
// SKIFF_MAX_BUNDLE_BYTES and a little). So a bundle of zeros that inflates to
// the bundle limit is sent in a few KiB, declared as such: it takes no slot,
// and was inflated, parsed and handed to the handler all the same, as many at
// once as the caller liked: the very memory the slots were made to bound. A
// compressed body on an upload method now needs a slot whatever it declares.
import type net from "node:net";
import { brotliCompressSync, gzipSync } from "node:zlib";
import { create, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DeployAppRequestSchema } from "../../gen/skiff/management/v2/management_pb.js";
import type { SkiffServer } from "../../services/server/server.js";
import { exchange } from "../helpers/raw-http.js";
import {
  BUNDLE_LIMIT,
  Clients,
  DEPLOY,
  MAX_BODY,
  sleep,
  startUploadServer,
  uploadHead,
} from "../helpers/upload-server.js";

let server: SkiffServer;
/** The size of every bundle the DeployApp handler was given. */
const seen: number[] = [];
const clients = new Clients();

beforeAll(async () => {
  // One upload in all: held by the test, every other large body must wait for it.
  server = await startUploadServer(
    { maxUploads: 1, maxProjectUploads: 1, graceMs: 20_000, bytesPerSecond: 1e9 },
    {
      deployApp: (req) => {
        seen.push(req.bundle?.data.length ?? 0);
        throw new ConnectError("stand-in: bundle seen", Code.Aborted);
      },
    },
  );
});
afterAll(async () => {
  clients.destroy();
  await server?.close(0);
});

/** The server's one slot, held by an upload under way (its head and 1 KiB of 100 000 bytes). */
async function holdTheSlot(): Promise<net.Socket> {
  const socket = clients.connect(server.port);
  socket.write(uploadHead(DEPLOY, "good-holder") + "A".repeat(1024));
  await sleep(150);
  return socket;
}

/** A DeployApp request message whose bundle is `size` zero bytes. */
const message = (size: number) =>
  toBinary(
    DeployAppRequestSchema,
    create(DeployAppRequestSchema, { projectId: "zip", bundle: { data: new Uint8Array(size) } }),
  );

const BIG = BUNDLE_LIMIT - 1024;

describe("upload slots: a compressed body that inflates past SKIFF_MAX_BODY_BYTES", () => {
  it("the probe: an uncompressed body of that size, its length declared, is refused 429 while the slot is held", async () => {
    const holder = await holdTheSlot();
    const body = message(BIG);
    const answer = await exchange(
      server.port,
      Buffer.concat([
        Buffer.from(
          `POST ${DEPLOY} HTTP/1.1\r\nhost: localhost\r\nauthorization: Bearer good-zip\r\ncontent-type: application/proto\r\ncontent-length: ${body.length}\r\n\r\n`,
        ),
        body,
      ]),
    );
    expect(answer !== "closed" && answer.status).toBe(429);
    holder.destroy();
    await sleep(100);
  });

  for (const [encoding, compress] of [
    ["gzip", gzipSync],
    ["br", brotliCompressSync],
  ] as const) {
    it(`Connect unary, Content-Encoding: ${encoding}: not inflated to ${BIG} bytes and handled without a slot`, async () => {
      seen.length = 0;
      const holder = await holdTheSlot();
      const body = compress(message(BIG));
      // A few KiB on the wire, under SKIFF_MAX_BODY_BYTES: no slot asked for.
      expect(body.length).toBeLessThan(MAX_BODY);
      const request = Buffer.concat([
        Buffer.from(
          [
            `POST ${DEPLOY} HTTP/1.1`,
            "host: localhost",
            "authorization: Bearer good-zip",
            "content-type: application/proto",
            `content-encoding: ${encoding}`,
            `content-length: ${body.length}`,
            "",
            "",
          ].join("\r\n"),
        ),
        body,
      ]);
      // Eight at once, with the server's only slot held by someone else.
      const answers = await Promise.all(Array.from({ length: 8 }, () => exchange(server.port, request)));
      holder.destroy();
      // Now: every one was inflated to a whole bundle and handed to DeployApp (409 aborted from the stand-in).
      expect(seen.filter((n) => n > MAX_BODY)).toEqual([]);
      for (const a of answers) expect(a !== "closed" && a.status).toBe(429);
    });
  }

  it("gRPC over HTTP/2, grpc-encoding: gzip: not inflated and handled without a slot", async () => {
    seen.length = 0;
    const holder = await holdTheSlot();
    const payload = gzipSync(message(BIG));
    const envelope = Buffer.alloc(5 + payload.length);
    envelope[0] = 1; // compressed
    envelope.writeUInt32BE(payload.length, 1);
    payload.copy(envelope, 5);
    const session = clients.h2(server.port);
    const status = await new Promise<string>((resolve) => {
      const stream = session.request({
        ":method": "POST",
        ":path": DEPLOY,
        "content-type": "application/grpc",
        te: "trailers",
        "grpc-encoding": "gzip",
        "content-length": String(envelope.length),
        authorization: "Bearer good-zip",
      });
      stream.on("error", () => resolve("error"));
      let grpcStatus: string | undefined;
      stream.on("response", (h) => (grpcStatus ??= h["grpc-status"] as string | undefined));
      stream.on("trailers", (h) => (grpcStatus ??= h["grpc-status"] as string | undefined));
      stream.on("data", () => undefined);
      stream.on("close", () => resolve(grpcStatus ?? "none"));
      stream.end(envelope);
    });
    holder.destroy();
    expect(seen.filter((n) => n > MAX_BODY)).toEqual([]);
    expect(status).toBe(String(Code.ResourceExhausted));
  });
});
