// A server with upload slots and a stand-in token check, for the tests that
// attack the slots (test/security/upload*.test.ts): skiff's own startServer
// with the management API on fixtures, DeployApp's body limit BUNDLE_LIMIT
// above MAX_BODY. A token `good-<project>` is that project's, judged at once
// (a token seen before); `new-<project>` the same, judged after 100 ms (one
// not seen before); any other is refused. The clients' sockets and sessions
// are kept, to be destroyed after the tests (`Clients.destroy`).
import http2 from "node:http2";
import net from "node:net";
import { Code, ConnectError, type ServiceImpl } from "@connectrpc/connect";
import { ManagementService } from "../../gen/skiff/management/v2/management_pb.js";
import { silentLogger } from "../../services/config/logger.js";
import type { UploadLimits } from "../../services/server/admit.js";
import { HealthState } from "../../services/server/health.js";
import { startServer, type SkiffServer } from "../../services/server/server.js";
import { management } from "./rest-fixture.js";

export const MAX_BODY = 4096;
export const BUNDLE_LIMIT = 1024 * 1024;
export const DEPLOY = "/skiff.management.v2.ManagementService/DeployApp";

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** The server; `handlers` replace the fixture's methods. */
export function startUploadServer(
  uploads: UploadLimits,
  handlers: Partial<ServiceImpl<typeof ManagementService>> = {},
): Promise<SkiffServer> {
  return startServer({
    host: "127.0.0.1",
    port: 0,
    maxBodyBytes: MAX_BODY,
    bodyLimits: new Map([[ManagementService.method.deployApp, BUNDLE_LIMIT]]),
    admit: (service, authorization) => {
      if (service === "grpc.health.v1.Health") return undefined;
      const m = /^Bearer (good|new)-([a-z0-9-]+)$/.exec(authorization ?? "");
      if (!m) return new ConnectError("invalid bearer token", Code.Unauthenticated);
      const admitted = { kind: "service_account", projectId: m[2] };
      return m[1] === "good" ? admitted : sleep(100).then(() => admitted);
    },
    uploads,
    logger: silentLogger,
    health: new HealthState(),
    restServices: [ManagementService],
    routes: (router) => router.service(ManagementService, { ...management([]), ...handlers }),
  });
}

/** The head of an upload to `path` (REST's or the RPC's) with `token`, announcing `length` bytes of body. */
export function uploadHead(
  path: string,
  token: string,
  length: number | "chunked" = 100_000,
  extra: string[] = [],
): string {
  return [
    `POST ${path} HTTP/1.1`,
    "host: localhost",
    `authorization: Bearer ${token}`,
    `content-type: ${path.startsWith("/v2/") ? "application/octet-stream" : "application/proto"}`,
    length === "chunked" ? "transfer-encoding: chunked" : `content-length: ${length}`,
    ...extra,
    "",
    "",
  ].join("\r\n");
}

/** Sockets and HTTP/2 sessions to a server, destroyed together. */
export class Clients {
  private readonly sockets: net.Socket[] = [];
  private readonly sessions: http2.ClientHttp2Session[] = [];

  connect(port: number): net.Socket {
    const socket = net.connect(port, "127.0.0.1");
    socket.on("error", () => undefined);
    this.sockets.push(socket);
    return socket;
  }

  h2(port: number, settings?: http2.Settings): http2.ClientHttp2Session {
    const session = http2.connect(`http://127.0.0.1:${port}`, { settings });
    session.on("error", () => undefined);
    this.sessions.push(session);
    return session;
  }

  /** An HTTP/2 upload stream to `path` with `token` (its errors ignored), its head sent; `length` declared if given. */
  h2Upload(session: http2.ClientHttp2Session, path: string, token: string, length?: number): http2.ClientHttp2Stream {
    const stream = session.request({
      ":method": "POST",
      ":path": path,
      "content-type": path.startsWith("/v2/") ? "application/octet-stream" : "application/proto",
      ...(length === undefined ? {} : { "content-length": String(length) }),
      authorization: `Bearer ${token}`,
    });
    stream.on("error", () => undefined);
    return stream;
  }

  /**
   * What becomes of an upload of 100,000 bytes to `path` with `token`, 1 KiB
   * of it sent: "reading" (taken in: no answer within 300 ms), else its
   * status or "closed"; then it goes away (and gives back its slot).
   */
  async probe(port: number, path: string, token: string): Promise<string> {
    const socket = this.connect(port);
    const outcome = await new Promise<string>((resolve) => {
      socket.on("data", (d: Buffer) => resolve(/^HTTP\/1\.1 (\d{3})/.exec(d.toString("latin1"))?.[1] ?? "?"));
      socket.on("close", () => resolve("closed"));
      socket.write(uploadHead(path, token) + "A".repeat(1024));
      setTimeout(() => resolve("reading"), 300);
    });
    socket.destroy();
    await sleep(50);
    return outcome;
  }

  /** Whether an upload to `path` with `token` is taken in now. */
  async slotFree(port: number, path: string, token: string): Promise<boolean> {
    return (await this.probe(port, path, token)) === "reading";
  }

  destroy(): void {
    for (const s of this.sockets.splice(0)) s.destroy();
    for (const s of this.sessions.splice(0)) s.destroy();
  }
}
