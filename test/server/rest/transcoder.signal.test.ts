// A REST call's signal: aborted when its caller goes away before the answer,
// when the server shuts down meanwhile, or by the exchange's abort; not when
// the handler returns. Against a real listener and the real transcoder.
import http from "node:http";
import type { AddressInfo } from "node:net";
import { create, type DescMethod } from "@bufbuild/protobuf";
import { createRouterTransport, type MethodImplSpec } from "@connectrpc/connect";
import { afterEach, describe, expect, it } from "vitest";
import { HttpBodySchema } from "../../../gen/google/api/httpbody_pb.js";
import { InvocationService } from "../../../gen/skiff/invocation/v4/invocation_pb.js";
import { silentLogger } from "../../../services/config/logger.js";
import { httpExchange } from "../../../services/server/rest/http-exchange.js";
import { createTranscoder } from "../../../services/server/rest/transcoder.js";
import { recordingRouter } from "../../../services/server/server.js";

interface Seen {
  signal: AbortSignal;
  /** Settles when the handler may answer. */
  release: () => void;
}

async function serve(shutdown: AbortController) {
  const seen: Seen[] = [];
  const implementations = new Map<DescMethod, MethodImplSpec>();
  createRouterTransport((router) => {
    recordingRouter(router, implementations).service(InvocationService, {
      async run(req, ctx) {
        if (req.appName === "abort-self") httpExchange(ctx)!.abort(new Error("cancelled by the exchange"));
        await new Promise<void>((resolve) => seen.push({ signal: ctx.signal, release: resolve }));
        return { runId: "r", statusCode: 200, body: create(HttpBodySchema, { contentType: "text/plain" }) };
      },
    });
  });
  const transcode = createTranscoder({
    services: [InvocationService],
    implementations,
    maxBodyBytes: 1024,
    logger: silentLogger,
    shutdownSignal: shutdown.signal,
  });
  const server = http.createServer((req, res) => transcode(req, res));
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return { server, seen, port: (server.address() as AddressInfo).port };
}

function call(port: number, app: string) {
  const req = http.request({ host: "127.0.0.1", port, method: "POST", path: `/v4/p-dev/${app}/run` });
  const answer = new Promise<number>((resolve, reject) => {
    req.on("response", (res) => {
      res.resume();
      res.on("end", () => resolve(res.statusCode ?? 0));
    });
    req.on("error", reject);
  });
  answer.catch(() => undefined);
  req.end("{}");
  return { req, answer };
}

async function until(check: () => boolean): Promise<void> {
  for (let i = 0; i < 500 && !check(); i++) await new Promise((r) => setTimeout(r, 10));
  expect(check()).toBe(true);
}

describe("a REST call's signal", () => {
  const servers: http.Server[] = [];
  afterEach(async () => {
    for (const s of servers.splice(0)) {
      s.closeAllConnections();
      await new Promise((r) => s.close(r));
    }
  });

  it("stays unaborted when the handler returns, and aborts when the caller goes away mid-call", async () => {
    const fx = await serve(new AbortController());
    servers.push(fx.server);
    const answered = call(fx.port, "app");
    await until(() => fx.seen.length === 1);
    fx.seen[0].release();
    expect(await answered.answer).toBe(200);
    await new Promise((r) => setTimeout(r, 50));
    expect(fx.seen[0].signal.aborted).toBe(false);

    const gone = call(fx.port, "app");
    await until(() => fx.seen.length === 2);
    gone.req.destroy();
    await until(() => fx.seen[1].signal.aborted);
    expect(String(fx.seen[1].signal.reason)).toMatch(/client closed the request/);
    fx.seen[1].release();
  });

  it("aborts with the server's shutdown reason (a call after it starts aborted), and by the exchange's abort", async () => {
    const shutdown = new AbortController();
    const fx = await serve(shutdown);
    servers.push(fx.server);
    const first = call(fx.port, "app");
    await until(() => fx.seen.length === 1);
    shutdown.abort(new Error("server stopping"));
    await until(() => fx.seen[0].signal.aborted);
    expect((fx.seen[0].signal.reason as Error).message).toBe("server stopping");
    fx.seen[0].release();
    await first.answer;
    // A call that comes after the shutdown began starts aborted.
    const late = call(fx.port, "app");
    await until(() => fx.seen.length === 2);
    expect((fx.seen[1].signal.reason as Error).message).toBe("server stopping");
    fx.seen[1].release();
    await late.answer;

    const other = await serve(new AbortController());
    servers.push(other.server);
    const self = call(other.port, "abort-self");
    await until(() => other.seen.length === 1);
    expect((other.seen[0].signal.reason as Error).message).toBe("cancelled by the exchange");
    other.seen[0].release();
    expect(await self.answer).toBe(200);
  });
});
