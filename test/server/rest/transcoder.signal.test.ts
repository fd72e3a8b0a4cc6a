// A REST call's signal: aborted when its caller goes away before the answer,
// when the server shuts down meanwhile, or by the exchange's abort; not when
// the handler returns. Against a real listener and the real transcoder.
import http from "node:http";
import type { AddressInfo } from "node:net";
import { create, type DescMethod } from "@bufbuild/protobuf";
import { createRouterTransport, type Interceptor, type MethodImplSpec } from "@connectrpc/connect";
import { afterEach, describe, expect, it } from "vitest";
import { HttpBodySchema } from "../../../gen/google/api/httpbody_pb.js";
import { InvocationService, type RunRequest } from "../../../gen/skiff/invocation/v4/invocation_pb.js";
import { silentLogger } from "../../../services/config/logger.js";
import { httpExchange, type CallSignal } from "../../../services/server/rest/http-exchange.js";
import { createTranscoder } from "../../../services/server/rest/transcoder.js";
import { recordingRouter } from "../../../services/server/server.js";

interface Seen {
  /** The handler context's signal (an AbortSignal, made when the handler reads it). */
  signal: AbortSignal;
  /** The exchange's own signal, which a run stops on, and how often its listener was called. */
  exchange: CallSignal;
  heard: number;
  /** The app name the handler got (an interceptor may have passed on another message). */
  appName: string;
  /** Settles when the handler may answer. */
  release: () => void;
}

/** For app "copied-by-interceptor": an interceptor passes on a copy of the request with another message. */
const copying: Interceptor = (next) => (req) => {
  if (req.stream || (req.message as RunRequest).appName !== "copied-by-interceptor") return next(req);
  const message: RunRequest = { ...(req.message as RunRequest), appName: "the-copy" };
  return next({ ...req, message });
};

async function serve(shutdown: AbortController) {
  const seen: Seen[] = [];
  const implementations = new Map<DescMethod, MethodImplSpec>();
  createRouterTransport((router) => {
    recordingRouter(router, implementations).service(InvocationService, {
      async run(req, ctx) {
        const exchange = httpExchange(ctx)!;
        if (req.appName === "abort-self") exchange.abort(new Error("cancelled by the exchange"));
        // Read first as the run does: the context's AbortSignal is made later, when the handler reads it.
        const entry = { exchange: exchange.signal, heard: 0, appName: req.appName } as Seen;
        exchange.signal.addEventListener("abort", () => entry.heard++, { once: true });
        ctx.responseHeader.set("x-handler", "set");
        await new Promise<void>((resolve) => seen.push(Object.assign(entry, { signal: ctx.signal, release: resolve })));
        return { runId: "r", statusCode: 200, body: create(HttpBodySchema, { contentType: "text/plain" }) };
      },
    });
  });
  const transcode = createTranscoder({
    services: [InvocationService],
    implementations,
    interceptors: [copying],
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
      res.on("end", () => resolve(res.headers["x-handler"] === "set" ? (res.statusCode ?? 0) : -1));
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
    expect([fx.seen[0].exchange.aborted, fx.seen[0].heard]).toEqual([false, 0]);

    const gone = call(fx.port, "app");
    await until(() => fx.seen.length === 2);
    gone.req.destroy();
    await until(() => fx.seen[1].signal.aborted);
    expect(String(fx.seen[1].signal.reason)).toMatch(/client closed the request/);
    expect([fx.seen[1].exchange.aborted, fx.seen[1].heard]).toEqual([true, 1]);
    expect(fx.seen[1].exchange.reason).toBe(fx.seen[1].signal.reason);
    fx.seen[1].release();
  });

  it("reaches the handler through an interceptor that passes on a copy of the request: its message, the same exchange, signal and headers", async () => {
    const fx = await serve(new AbortController());
    servers.push(fx.server);
    const copied = call(fx.port, "copied-by-interceptor");
    await until(() => fx.seen.length === 1);
    expect(fx.seen[0].appName).toBe("the-copy");
    fx.seen[0].release();
    expect(await copied.answer).toBe(200);

    const gone = call(fx.port, "copied-by-interceptor");
    await until(() => fx.seen.length === 2);
    gone.req.destroy();
    await until(() => fx.seen[1].signal.aborted);
    expect([fx.seen[1].exchange.aborted, fx.seen[1].heard]).toEqual([true, 1]);
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
    expect([fx.seen[0].exchange.aborted, fx.seen[0].heard]).toEqual([true, 1]);
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
    // Aborted before the handler listened: a listener added then is never called, as on an AbortSignal.
    expect([other.seen[0].exchange.aborted, other.seen[0].heard]).toEqual([true, 0]);
    other.seen[0].release();
    expect(await self.answer).toBe(200);
  });
});
