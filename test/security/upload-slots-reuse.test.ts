// Upload slots attacked in ways that held: listeners piling up on a
// keep-alive connection that carries upload after upload, and a body declared
// past the method's limit (Connect refuses it at once and ends its answer,
// giving the slot back while the caller still sends).
import { create, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DeployAppRequestSchema } from "../../gen/skiff/management/v2/management_pb.js";
import type { SkiffServer } from "../../services/server/server.js";
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
const clients = new Clients();

beforeAll(async () => {
  server = await startUploadServer(
    { maxUploads: 100, maxProjectUploads: 1, graceMs: 800, bytesPerSecond: 1e9 },
    {
      deployApp: () => {
        throw new ConnectError("stand-in", Code.Aborted);
      },
    },
  );
});
afterAll(async () => {
  clients.destroy();
  await server?.close(0);
});

const connect = () => clients.connect(server.port);
const head = (project: string, length: number) => uploadHead(DEPLOY, `good-${project}`, length);
const slotFree = (project: string) => clients.slotFree(server.port, DEPLOY, `good-${project}`);

describe("upload slots: attacks that held", () => {
  it("forty uploads in a row on one keep-alive connection: each answered, no listener piles up, the slot is free after", async () => {
    const warnings: string[] = [];
    const onWarning = (w: Error) => warnings.push(`${w.name}: ${w.message}`);
    process.on("warning", onWarning);
    try {
      const body = Buffer.from(
        toBinary(
          DeployAppRequestSchema,
          create(DeployAppRequestSchema, { projectId: "keep", bundle: { data: new Uint8Array(2 * MAX_BODY) } }),
        ),
      );
      const socket = connect();
      let answers = "";
      socket.on("data", (d: Buffer) => (answers += d.toString("latin1")));
      // One after another, each sent once the previous was answered (the slot is the project's only one).
      for (let i = 1; i <= 40; i++) {
        socket.write(head("keep", body.length));
        socket.write(body);
        await expect.poll(() => answers.match(/HTTP\/1\.1 \d{3}/g)?.length ?? 0, { timeout: 3_000 }).toBe(i);
      }
      expect(answers.match(/HTTP\/1\.1 429/g)).toBeNull();
      expect(socket.destroyed).toBe(false);
      expect(await slotFree("keep")).toBe(true);
      socket.destroy();
      await sleep(50);
      expect(warnings.filter((w) => /MaxListeners/.test(w))).toEqual([]);
    } finally {
      process.off("warning", onWarning);
    }
  });

  it("a body declared past the method's limit: refused at once, its slot free again while it still sends", async () => {
    const socket = connect();
    let answer = "";
    socket.on("data", (d: Buffer) => (answer += d.toString("latin1")));
    socket.write(head("over", 10 * BUNDLE_LIMIT) + "A".repeat(1024));
    await expect.poll(() => /^HTTP\/1\.1 (\d{3})/.exec(answer)?.[1], { timeout: 3_000 }).toMatch(/^4\d\d$/);
    // The caller keeps sending; the slot is not counted for it any more.
    socket.write("A".repeat(64 * 1024));
    expect(await slotFree("over")).toBe(true);
    socket.destroy();
  });
});
