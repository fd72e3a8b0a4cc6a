// A request message that is not valid protobuf, sent as binary (Connect
// unary application/proto, gRPC-Web +proto, gRPC over h2c), was answered as
// skiff's own failure: HTTP 500 {"code":"internal","message":"parse binary:
// premature EOF"} (Connect), grpc-status 13 INTERNAL (gRPC, gRPC-Web).
// Reached without any token on the open Health service, and with the dev
// token on every method. The caller sent a malformed message: that is
// invalid_argument (400, grpc-status 3), as skiff answers a malformed JSON
// message (server.ts connectJsonOptions). The cause: @connectrpc/connect's
// binary serialization (protocol/serialization.js, `parse binary: …`)
// throws Code.Internal on a parse failure; each RPC's handler is now wrapped
// to say invalid_argument instead (services/server/binary-errors.ts). Real
// skiff, real nats-server.
import http2 from "node:http2";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { exchange, type RawAnswer } from "../helpers/raw-http.js";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";

let t: TestSkiff;
let port: number;

beforeAll(async () => {
  t = await startTestSkiff();
  port = Number(new URL(t.url).port);
}, 60_000);
afterAll(async () => {
  await t?.close();
});

const HEALTH = "/grpc.health.v1.Health/Check";
const IDENTITY = "/skiff.management.v2.ManagementService/GetIdentity";
/** Not protobuf: "{" opens a group (field 15) that never ends; 0x0a 0xff is a length past the end. */
const BROKEN = [Buffer.from("{}"), Buffer.from([0x0a, 0xff]), Buffer.from([0x0a, 0x01, 0xff])];

function post(path: string, type: string, body: Buffer, token?: string): Buffer {
  const lines = [`POST ${path} HTTP/1.1`, "host: localhost", `content-type: ${type}`, `content-length: ${body.length}`];
  if (token !== undefined) lines.push(`authorization: Bearer ${token}`);
  lines.push("connection: close");
  return Buffer.concat([Buffer.from(`${lines.join("\r\n")}\r\n\r\n`, "latin1"), body]);
}

async function answer(request: Buffer): Promise<RawAnswer> {
  const a = await exchange(port, request);
  if (a === "closed") throw new Error("closed without an answer");
  return a;
}

function envelope(data: Buffer): Buffer {
  const prefix = Buffer.alloc(5);
  prefix.writeUInt32BE(data.length, 1);
  return Buffer.concat([prefix, data]);
}

describe("a request message that is not protobuf is the caller's error, not skiff's", () => {
  it("Connect unary application/proto on Health, without a token: 400 invalid_argument, not 500", async () => {
    for (const body of BROKEN) {
      const a = await answer(post(HEALTH, "application/proto", body));
      // Observed: 500 {"code":"internal","message":"parse binary: premature EOF"}.
      expect(a.status, a.body.toString()).toBe(400);
      expect(JSON.parse(a.body.toString()).code).toBe("invalid_argument");
    }
  });

  it("Connect unary application/proto on GetIdentity, with the dev token: 400 invalid_argument, not 500", async () => {
    const a = await answer(post(IDENTITY, "application/proto", BROKEN[0], t.devToken));
    // Observed: 500 {"code":"internal","message":"parse binary: premature EOF"}.
    expect(a.status, a.body.toString()).toBe(400);
  });

  it("gRPC-Web +proto on Health, without a token: grpc-status 3, not 13", async () => {
    const a = await answer(post(HEALTH, "application/grpc-web+proto", envelope(BROKEN[1])));
    // Observed: 200 with a trailer frame grpc-status 13 (INTERNAL), "parse binary: premature EOF".
    const status = /grpc-status: ?(\d+)/i.exec(a.body.toString("latin1"))?.[1] ?? a.headers.get("grpc-status");
    expect(status).toBe("3");
  });

  it("gRPC over h2c on Health, without a token: grpc-status 3, not 13", async () => {
    const session = http2.connect(`http://127.0.0.1:${port}`);
    session.on("error", () => undefined);
    const status = await new Promise<string>((resolve) => {
      const req = session.request({
        ":method": "POST",
        ":path": HEALTH,
        "content-type": "application/grpc",
        te: "trailers",
      });
      let got = "none";
      req.on("response", (h) => (got = String(h["grpc-status"] ?? got)));
      req.on("trailers", (h) => (got = String(h["grpc-status"] ?? got)));
      req.on("error", () => resolve("error"));
      req.on("close", () => resolve(got));
      req.resume();
      req.end(envelope(BROKEN[0]));
    });
    session.destroy();
    // Observed: grpc-status 13 (INTERNAL), grpc-message "parse binary: premature EOF".
    expect(status).toBe("3");
  });

  it("held: a valid empty protobuf message on Health is served (200)", async () => {
    const a = await answer(post(HEALTH, "application/proto", Buffer.alloc(0)));
    expect(a.status).toBe(200);
  });
});
