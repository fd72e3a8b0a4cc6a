// A real HTTP webhook receiver on 127.0.0.1 for tests: it records every
// request (arrival time, headers, raw body bytes) and answers each path the
// way the test says, by the request's number on that path.
import http from "node:http";
import type { AddressInfo, Socket } from "node:net";
import { vi } from "vitest";

export interface ReceivedRequest {
  /** Without the query. */
  path: string;
  /** Path and query, as sent. */
  url: string;
  method: string;
  /** Date.now() when the request's body had fully arrived. */
  at: number;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
}

/** A status (with optional headers), or "hang": never answer. */
export type Answer = number | { status: number; headers?: Record<string, string> } | "hang";

export interface Receiver {
  /** http://127.0.0.1:<port> */
  url: string;
  port: number;
  requests: ReceivedRequest[];
  /** Requests to one path, in order. */
  to(path: string): ReceivedRequest[];
  /** Resolves when `path` has received `count` requests. */
  waitFor(path: string, count: number, timeoutMs?: number): Promise<ReceivedRequest[]>;
  close(): Promise<void>;
}

/** `answer(path, n)`: the answer to the n-th (1-based) request on `path`. */
export async function startReceiver(answer: (path: string, n: number) => Answer): Promise<Receiver> {
  const requests: ReceivedRequest[] = [];
  const sockets = new Set<Socket>();
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const url = req.url ?? "/";
      const path = url.split("?")[0];
      requests.push({
        path,
        url,
        method: req.method ?? "",
        at: Date.now(),
        headers: req.headers,
        body: Buffer.concat(chunks),
      });
      const a = answer(path, requests.filter((r) => r.path === path).length);
      if (a === "hang") return;
      const { status, headers } = typeof a === "number" ? { status: a, headers: {} } : a;
      res.writeHead(status, headers).end(status === 204 || status === 304 ? undefined : `answer ${status}`);
    });
  });
  server.on("connection", (s) => {
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as AddressInfo).port;
  const to = (path: string) => requests.filter((r) => r.path === path);
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    requests,
    to,
    waitFor: (path, count, timeoutMs = 20_000) =>
      vi.waitFor(
        () => {
          const got = to(path);
          if (got.length < count) throw new Error(`${path} got ${got.length} of ${count} requests in ${timeoutMs} ms`);
          return got;
        },
        { timeout: timeoutMs, interval: 10 },
      ),
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

/** A URL where nothing listens: a port the OS just handed out and that was closed again. */
export async function refusedUrl(): Promise<string> {
  const srv = http.createServer();
  await new Promise<void>((resolve) => srv.listen(0, "127.0.0.1", resolve));
  const { port } = srv.address() as AddressInfo;
  await new Promise((resolve) => srv.close(resolve));
  return `http://127.0.0.1:${port}/refused`;
}
