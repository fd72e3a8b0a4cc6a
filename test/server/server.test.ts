// The one-port server: probes, protocols, documents and graceful stop.
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import http from "node:http";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { createClient, ConnectError, Code } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Health, HealthCheckResponse_ServingStatus as Serving } from "../../gen/grpc/health/v1/health_pb.js";
import { InvocationService } from "../../gen/skiff/invocation/v4/invocation_pb.js";
import { ManagementService } from "../../gen/skiff/management/v2/management_pb.js";
import { loadConfig } from "../../services/config/config.js";
import { HealthState } from "../../services/server/health.js";
import { silentLogger } from "../../services/config/logger.js";
import { startServer } from "../../services/server/server.js";
import { startSkiff, type Skiff } from "../../services/start.js";
import { startNatsServer, type TestNats } from "../helpers/nats-server.js";
import { TEST_ROOT } from "../helpers/paths.js";

const run = promisify(execFile);
const root = join(TEST_ROOT, "..");

describe("skiff server", () => {
  let nats: TestNats;
  let skiff: Skiff;
  let dataDir: string;

  beforeAll(async () => {
    nats = await startNatsServer();
    dataDir = mkdtempSync(join(tmpdir(), "skiff-data-"));
    skiff = await startSkiff(
      loadConfig({ SKIFF_NATS_URL: nats.url, SKIFF_PORT: "0", SKIFF_DATA_DIR: dataDir }),
      silentLogger,
    );
  });
  afterAll(async () => {
    await skiff?.close();
    await nats?.stop();
    rmSync(dataDir, { recursive: true, force: true });
  });

  it("GET /healthz and /readyz answer 200 while NATS is connected", async () => {
    for (const path of ["/healthz", "/readyz"]) {
      const res = await fetch(skiff.url + path);
      expect(res.status, path).toBe(200);
    }
  });

  it("grpc.health.v1.Health/Check answers SERVING over gRPC (h2c), Connect (HTTP/1.1 and h2c) and gRPC-Web on one port", async () => {
    const transports = {
      grpc: createGrpcTransport({ baseUrl: skiff.url }),
      connectH1: createConnectTransport({ baseUrl: skiff.url, httpVersion: "1.1" }),
      connectH2: createConnectTransport({ baseUrl: skiff.url, httpVersion: "2" }),
      grpcWeb: createGrpcWebTransport({ baseUrl: skiff.url, httpVersion: "1.1" }),
    };
    for (const [name, transport] of Object.entries(transports)) {
      const res = await createClient(Health, transport).check({});
      expect(res.status, name).toBe(Serving.SERVING);
      const svc = await createClient(Health, transport).check({ service: "skiff.management.v2.ManagementService" });
      expect(svc.status, name).toBe(Serving.SERVING);
    }
  });

  it("Health/Check of an unknown service is not_found", async () => {
    const client = createClient(Health, createGrpcTransport({ baseUrl: skiff.url }));
    await expect(client.check({ service: "no.such.Service" })).rejects.toMatchObject({ code: Code.NotFound });
  });

  it("buf curl reaches Health/Check over gRPC with prior knowledge and over Connect", async () => {
    const buf = join(root, "node_modules/.bin/buf");
    const url = `${skiff.url}/grpc.health.v1.Health/Check`;
    const grpc = await run(buf, ["curl", "--schema", "proto", "--protocol", "grpc", "--http2-prior-knowledge", url], {
      cwd: root,
    });
    expect(JSON.parse(grpc.stdout)).toEqual({ status: "SERVING" });
    const connect = await run(buf, ["curl", "--schema", "proto", "--protocol", "connect", url], { cwd: root });
    expect(JSON.parse(connect.stdout)).toEqual({ status: "SERVING" });
  });

  it("serves the OpenAPI documents: management at /v2/openapi.json (version 1.0.0), invocation at /v4/openapi.json", async () => {
    const v2 = (await (await fetch(`${skiff.url}/v2/openapi.json`)).json()) as any;
    expect(v2.info.version).toBe("1.0.0");
    expect(v2.paths["/v2/projects/{project_id}/service-accounts/{service_account_id}"].delete).toBeDefined();
    const v4 = (await (await fetch(`${skiff.url}/v4/openapi.json`)).json()) as any;
    expect(Object.keys(v4.paths)).toContain("/v4/{project_id}/{app_name}/{path}");
  });

  it("/healthz turns 503 and Health/Watch NOT_SERVING while NATS is down, and both recover when it returns", async () => {
    const client = createClient(Health, createGrpcTransport({ baseUrl: skiff.url }));
    const abort = new AbortController();
    const seen: Serving[] = [];
    const watching = (async () => {
      try {
        for await (const m of client.watch({}, { signal: abort.signal })) seen.push(m.status);
      } catch (err) {
        if (ConnectError.from(err).code !== Code.Canceled) throw err;
      }
    })();
    await expect.poll(() => seen, { timeout: 30_000 }).toEqual([Serving.SERVING]);
    await nats.kill();
    await expect.poll(async () => (await fetch(`${skiff.url}/healthz`)).status, { timeout: 30_000 }).toBe(503);
    await nats.restart();
    await expect.poll(async () => (await fetch(`${skiff.url}/healthz`)).status, { timeout: 45_000 }).toBe(200);
    await expect.poll(() => seen, { timeout: 30_000 }).toEqual([Serving.SERVING, Serving.NOT_SERVING, Serving.SERVING]);
    abort.abort();
    await watching;
  });
});

describe("graceful stop", () => {
  it("lets an in-flight request finish, then refuses new connections", async () => {
    const health = new HealthState();
    health.setNatsConnected(true);
    health.setProvisioned();
    let release!: () => void;
    const started = new Promise<void>((resolve) => {
      release = resolve;
    });
    const server = await startServer({
      host: "127.0.0.1",
      port: 0,
      maxBodyBytes: 1024,
      logger: silentLogger,
      health,
      restServices: [InvocationService],
      routes: (router) =>
        router.service(InvocationService, {
          async run(req) {
            release();
            await new Promise((r) => setTimeout(r, 300));
            return {
              runId: "r1",
              statusCode: 200,
              body: { contentType: "application/json", data: new TextEncoder().encode('{"done":true}') },
            };
          },
        }),
    });
    const inFlight = fetch(`${server.url}/v4/p-x/app/run`, {
      method: "POST",
      body: "{}",
      headers: { "content-type": "application/json" },
    });
    await started;
    const closing = server.close(5_000);
    const res = await inFlight;
    expect(res.status).toBe(200);
    expect(await res.json()).toEqual({ done: true });
    await closing;
    await expect(
      new Promise((resolve, reject) => http.get(`${server.url}/healthz`, resolve).on("error", reject)),
    ).rejects.toMatchObject({ code: "ECONNREFUSED" });
  });
});

describe("unimplemented methods", () => {
  it("a method without a handler answers unimplemented (501) over REST and Connect alike", async () => {
    const health = new HealthState();
    const server = await startServer({
      host: "127.0.0.1",
      port: 0,
      maxBodyBytes: 1024,
      logger: silentLogger,
      health,
      restServices: [ManagementService],
      routes: (router) => router.service(ManagementService, {}),
    });
    try {
      const res = await fetch(`${server.url}/v2/projects/p-dev/apps/hello/stats`);
      expect(res.status).toBe(501);
      expect(await res.json()).toMatchObject({ code: "unimplemented" });
      const client = createClient(
        ManagementService,
        createConnectTransport({ baseUrl: server.url, httpVersion: "1.1" }),
      );
      await expect(client.getAppStats({ projectId: "p-dev", appName: "hello" })).rejects.toMatchObject({
        code: Code.Unimplemented,
      });
    } finally {
      await server.close(1000);
    }
  });
});

describe("a port already in use", () => {
  it("refuses with a message that says so and names SKIFF_PORT, not a bare EADDRINUSE", async () => {
    const options = {
      host: "127.0.0.1",
      maxBodyBytes: 1024,
      logger: silentLogger,
      health: new HealthState(),
      restServices: [ManagementService],
      routes: (router: Parameters<Parameters<typeof startServer>[0]["routes"]>[0]) =>
        router.service(ManagementService, {}),
    };
    const first = await startServer({ ...options, port: 0 });
    try {
      await expect(startServer({ ...options, port: first.port })).rejects.toThrow(
        new RegExp(`^port ${first.port} on 127\\.0\\.0\\.1 is already in use .*SKIFF_PORT`),
      );
    } finally {
      await first.close(1000);
    }
  });
});

describe("per-method body limits", () => {
  it("a method given a larger limit takes larger bodies over REST and Connect; the others keep SKIFF_MAX_BODY_BYTES", async () => {
    const health = new HealthState();
    health.setNatsConnected(true);
    health.setProvisioned();
    const server = await startServer({
      host: "127.0.0.1",
      port: 0,
      maxBodyBytes: 1024,
      bodyLimits: new Map([[ManagementService.method.deployApp, 4096]]),
      logger: silentLogger,
      health,
      restServices: [ManagementService],
      routes: (router) =>
        router.service(ManagementService, {
          deployApp: (req) => ({ app: { appName: `got ${req.bundle?.data.length}` } }),
          createProject: (req) => ({ project: { projectId: req.projectId, name: `${req.name.length}` } }),
        }),
    });
    try {
      const big = new Uint8Array(3000);
      const deploy = await fetch(`${server.url}/v2/projects/p-x/apps`, {
        method: "POST",
        body: big,
        headers: { "content-type": "application/gzip" },
      });
      expect(deploy.status).toBe(200);
      expect(((await deploy.json()) as { app: { app_name: string } }).app.app_name).toBe("got 3000");
      const tooBig = await fetch(`${server.url}/v2/projects/p-x/apps`, {
        method: "POST",
        body: new Uint8Array(5000),
        headers: { "content-type": "application/gzip" },
      });
      expect(tooBig.status).toBe(413);
      const project = await fetch(`${server.url}/v2/projects`, {
        method: "POST",
        body: JSON.stringify({ project_id: "p-x", name: "n".repeat(1500) }),
        headers: { "content-type": "application/json" },
      });
      expect(project.status).toBe(413);

      const client = createClient(
        ManagementService,
        createConnectTransport({ baseUrl: server.url, httpVersion: "1.1" }),
      );
      expect((await client.deployApp({ projectId: "p-x", bundle: { data: big } })).app?.appName).toBe("got 3000");
      await expect(client.createProject({ projectId: "p-x", name: "n".repeat(70_000) })).rejects.toMatchObject({
        code: Code.ResourceExhausted,
      });
      expect((await client.createProject({ projectId: "p-x", name: "n".repeat(100) })).project?.name).toBe("100");
    } finally {
      await server.close(1000);
    }
  });
});

describe("an h2c upgrade offer pipelined behind another request", () => {
  it("is declined once the requests before it are answered: every answer comes, in order", async () => {
    let release: () => void = () => {};
    const slow = new Promise<void>((resolve) => (release = resolve));
    const health = new HealthState();
    health.setNatsConnected(true);
    const server = await startServer({
      host: "127.0.0.1",
      port: 0,
      maxBodyBytes: 1024,
      logger: silentLogger,
      health,
      restServices: [ManagementService],
      routes: (router) =>
        router.service(ManagementService, {
          async getIdentity() {
            await slow;
            return { kind: "service_account", serviceAccountId: "sa-slow" };
          },
        }),
      // WebSockets would be taken here; an h2c offer never reaches it.
      upgrade: (_req, socket) => socket.destroy(),
    });
    try {
      const socket = net.connect(server.port, "127.0.0.1");
      let data = "";
      socket.on("data", (chunk: Buffer) => (data += chunk.toString("latin1")));
      const ended = new Promise<void>((resolve) => socket.on("close", () => resolve()));
      socket.write(
        "GET /v2/identity HTTP/1.1\r\nHost: x\r\n\r\n" +
          "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n" +
          "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
      );
      // The offer has arrived while the first request waits for its handler.
      await new Promise((resolve) => setTimeout(resolve, 100));
      release();
      await ended;
      const statuses = [...data.matchAll(/HTTP\/1\.1 (\d{3}) /g)].map((m) => Number(m[1]));
      expect(statuses).toEqual([200, 200, 200]);
      expect(data.indexOf("sa-slow")).toBeLessThan(data.indexOf('"status"'));
    } finally {
      await server.close(0);
    }
  });
});
