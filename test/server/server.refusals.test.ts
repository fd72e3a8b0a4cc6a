// Requests that Node's HTTP parser or server refuses before any handler runs
// (a malformed head, headers too large, no Host, an Expect other than
// 100-continue, CONNECT) get the JSON {code, message} of every other
// refusal, not a bare status line or a silent close (found by
// test/fuzz/rest.test.ts).
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ManagementService } from "../../gen/skiff/management/v2/management_pb.js";
import { silentLogger } from "../../services/config/logger.js";
import { HealthState } from "../../services/server/health.js";
import { startServer, type SkiffServer } from "../../services/server/server.js";
import { exchange } from "../helpers/raw-http.js";
import { management } from "../helpers/rest-fixture.js";

describe("server: refusals before a handler are JSON", () => {
  let server: SkiffServer;
  beforeAll(async () => {
    server = await startServer({
      host: "127.0.0.1",
      port: 0,
      maxBodyBytes: 1024,
      logger: silentLogger,
      health: new HealthState(),
      restServices: [ManagementService],
      routes: (router) => router.service(ManagementService, management([])),
    });
  });
  afterAll(() => server?.close(0));

  const send = (text: string) => exchange(server.port, Buffer.from(text, "latin1"));

  it.each([
    ["a header without a name", "GET /v2/identity HTTP/1.1\r\nhost: x\r\n: v\r\n\r\n", 400, "invalid_argument"],
    [
      "a control byte in a header value",
      "GET /v2/identity HTTP/1.1\r\nhost: x\r\na: \x01\r\n\r\n",
      400,
      "invalid_argument",
    ],
    ["no Host in HTTP/1.1", "GET /v2/identity HTTP/1.1\r\n\r\n", 400, "invalid_argument"],
    [
      "Expect other than 100-continue",
      "GET /v2/identity HTTP/1.1\r\nhost: x\r\nexpect: x\r\n\r\n",
      417,
      "failed_precondition",
    ],
    ["CONNECT", "CONNECT /v2/identity HTTP/1.1\r\nhost: x\r\n\r\n", 405, "unimplemented"],
    [
      "headers too large",
      `GET /v2/identity HTTP/1.1\r\nhost: x\r\na: ${"x".repeat(20_000)}\r\n\r\n`,
      431,
      "resource_exhausted",
    ],
  ])("%s: a JSON error", async (_name, text, status, code) => {
    const answer = await send(text);
    expect(answer).not.toBe("closed");
    if (answer === "closed") return;
    expect(answer.status).toBe(status);
    expect(answer.headers.get("content-type")).toBe("application/json");
    const body = JSON.parse(answer.body.toString()) as { code: string; message: string };
    expect(body.code).toBe(code);
    expect(typeof body.message).toBe("string");
  });

  it("HTTP/1.0 without Host is served, and the server still answers after every refusal", async () => {
    const answer = await send("GET /v2/identity HTTP/1.0\r\n\r\n");
    expect(answer !== "closed" && answer.status).toBe(200);
  });

  it("HTTP/1.0 without Host to an RPC path is answered too (the handler's URL needs an authority)", async () => {
    const answer = await send(
      "POST /skiff.management.v2.ManagementService/GetIdentity HTTP/1.0\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}",
    );
    expect(answer !== "closed" && answer.status).toBe(200);
    const get = await send(
      "GET /skiff.management.v2.ManagementService/GetIdentity HTTP/1.0\r\ncontent-length: 1\r\n\r\n0",
    );
    expect(get !== "closed" && get.status).toBeLessThan(500);
  });
});

describe("server: a request that makes something throw before its handler", () => {
  let server: SkiffServer;
  let throwing = true;
  beforeAll(async () => {
    server = await startServer({
      host: "127.0.0.1",
      port: 0,
      maxBodyBytes: 1024,
      logger: silentLogger,
      health: new HealthState(),
      restServices: [ManagementService],
      routes: (router) => router.service(ManagementService, management([])),
      // Called in the request listener's own turn, before any handler's error handling.
      admit: () => {
        if (throwing) throw new Error("a bug");
        return { kind: "admin" };
      },
    });
  });
  afterAll(() => server?.close(0));

  it("is answered 500 and logged; the process and the server go on", async () => {
    const rpc =
      "POST /skiff.management.v2.ManagementService/GetIdentity HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
    const failed = await exchange(server.port, Buffer.from(rpc, "latin1"));
    expect(failed !== "closed" && failed.status).toBe(500);
    expect(failed !== "closed" && JSON.parse(failed.body.toString())).toEqual({
      code: "internal",
      message: "internal error",
    });
    throwing = false;
    const served = await exchange(server.port, Buffer.from(rpc, "latin1"));
    expect(served !== "closed" && served.status).toBe(200);
  });
});
