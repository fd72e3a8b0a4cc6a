// Connections that never speak, or speak too slowly, on real loopback
// sockets: the first-bytes, header, keep-alive and HTTP/2 idle deadlines,
// the caps per address and in all, and requests in progress that no deadline
// may cut.
import { spawn, type ChildProcess } from "node:child_process";
import http2 from "node:http2";
import net from "node:net";
import path from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { InvocationService } from "../../gen/skiff/invocation/v4/invocation_pb.js";
import { silentLogger } from "../../services/config/logger.js";
import type { ConnectionLimits } from "../../services/server/connections.js";
import { connectionCap, normalizeAddress, openFileLimit } from "../../services/server/connections.js";
import { HealthState } from "../../services/server/health.js";
import { startServer } from "../../services/server/server.js";
import { TEST_ROOT } from "../helpers/paths.js";

type Server = Awaited<ReturnType<typeof startServer>>;

const servers: Server[] = [];
const sockets: net.Socket[] = [];
const timers: NodeJS.Timeout[] = [];
const children: ChildProcess[] = [];

afterEach(async () => {
  for (const t of timers.splice(0)) clearInterval(t);
  for (const s of sockets.splice(0)) s.destroy();
  for (const c of children.splice(0)) c.kill("SIGKILL");
  await Promise.all(servers.splice(0).map((s) => s.close(100)));
});

/** A server whose Run sleeps for the number of milliseconds in its path (`/v4/p/app/<ms>`). */
async function serve(connections: Partial<ConnectionLimits> = {}): Promise<Server> {
  const health = new HealthState();
  health.setNatsConnected(true);
  health.setProvisioned();
  const server = await startServer({
    host: "127.0.0.1",
    port: 0,
    maxBodyBytes: 1024,
    logger: silentLogger,
    health,
    restServices: [InvocationService],
    connections,
    routes: (router) =>
      router.service(InvocationService, {
        async run(req) {
          await new Promise((r) => setTimeout(r, Number(req.path) || 0));
          return {
            runId: "r1",
            statusCode: 200,
            body: { contentType: "application/json", data: new TextEncoder().encode(`{"slept":${req.path}}`) },
          };
        },
      }),
  });
  servers.push(server);
  return server;
}

/** A socket to the server, optionally from another loopback address (Linux routes all of 127/8 to lo). */
function connect(server: Server, localAddress?: string): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const socket = net.connect({ host: "127.0.0.1", port: server.port, localAddress });
    sockets.push(socket);
    socket.on("error", () => {});
    socket.once("connect", () => resolve(socket));
    socket.once("error", reject);
  });
}

/** Resolves with the milliseconds from `since` to the socket's close. */
function closedAfter(socket: net.Socket, since: number): Promise<number> {
  return new Promise((resolve) => {
    if (socket.destroyed) resolve(performance.now() - since);
    socket.once("close", () => resolve(performance.now() - since));
  });
}

/** Writes text one byte every `everyMs`, until the socket closes or the text is sent. */
function dribble(socket: net.Socket, text: string, everyMs: number): void {
  let i = 0;
  const t = setInterval(() => {
    if (socket.destroyed || i >= text.length) return clearInterval(t);
    socket.write(text[i++]);
  }, everyMs);
  timers.push(t);
}

/** Reads from the socket until the text appears. */
function readUntil(socket: net.Socket, text: string): Promise<string> {
  return new Promise((resolve, reject) => {
    let got = "";
    const onData = (chunk: Buffer) => {
      got += chunk.toString("latin1");
      if (got.includes(text)) {
        socket.off("data", onData);
        resolve(got);
      }
    };
    socket.on("data", onData);
    socket.once("close", () => reject(new Error(`closed before ${JSON.stringify(text)}; got ${JSON.stringify(got)}`)));
  });
}

const REQUEST =
  "POST /v4/p-x/app/0 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";

describe("connection deadlines", () => {
  it("a socket that sends nothing is closed after the first-bytes timeout", async () => {
    const server = await serve({ firstBytesTimeoutMs: 300 });
    const start = performance.now();
    const socket = await connect(server);
    expect(await closedAfter(socket, start)).toBeGreaterThanOrEqual(290);
  });

  it("an HTTP/2 preface that stops halfway is closed after the first-bytes timeout", async () => {
    const server = await serve({ firstBytesTimeoutMs: 300 });
    const start = performance.now();
    const socket = await connect(server);
    socket.write("PRI * HTTP");
    expect(await closedAfter(socket, start)).toBeGreaterThanOrEqual(290);
  });

  it("an HTTP/1.1 head dribbled a byte at a time is closed after the headers timeout, although bytes keep coming", async () => {
    const server = await serve({ firstBytesTimeoutMs: 200, headersTimeoutMs: 600, keepAliveTimeoutMs: 200 });
    const socket = await connect(server);
    const start = performance.now();
    socket.write("G");
    dribble(socket, "ET / HTTP/1.1\r\nHost: x\r\nX-Slow: " + "a".repeat(1000), 50);
    expect(await closedAfter(socket, start)).toBeGreaterThanOrEqual(590);
  });

  it("an idle keep-alive connection is closed after the keep-alive timeout", async () => {
    const server = await serve({ keepAliveTimeoutMs: 400, headersTimeoutMs: 5_000 });
    const socket = await connect(server);
    // Timed from before the request: the server's deadline starts at its answer's end, which a loaded test
    // process may read well after it was sent.
    const start = performance.now();
    socket.write(REQUEST);
    await readUntil(socket, '{"slept":0}');
    expect(await closedAfter(socket, start)).toBeGreaterThanOrEqual(390);
  });

  it("a keep-alive connection that dribbles its next head is closed after keep-alive + headers timeouts", async () => {
    const server = await serve({ keepAliveTimeoutMs: 300, headersTimeoutMs: 400 });
    const socket = await connect(server);
    const start = performance.now(); // before the request, as above
    socket.write(REQUEST);
    await readUntil(socket, '{"slept":0}');
    dribble(socket, "GET / HTTP/1.1\r\nHost: x\r\nX-Slow: " + "a".repeat(1000), 50);
    expect(await closedAfter(socket, start)).toBeGreaterThanOrEqual(690);
  });

  it("an HTTP/2 session without a stream gets GOAWAY and is closed after the idle timeout", async () => {
    const server = await serve({ http2IdleTimeoutMs: 400 });
    const session = http2.connect(server.url);
    session.on("error", () => {});
    const start = performance.now();
    const closed = new Promise<number>((resolve) => session.once("close", () => resolve(performance.now() - start)));
    const goaway = new Promise<boolean>((resolve) => session.once("goaway", () => resolve(true)));
    expect(await closed).toBeGreaterThanOrEqual(390);
    expect(await goaway).toBe(true);
  });

  it("a request in progress outlives every deadline, over HTTP/1.1 and HTTP/2", async () => {
    const limits = {
      firstBytesTimeoutMs: 200,
      headersTimeoutMs: 200,
      keepAliveTimeoutMs: 200,
      http2IdleTimeoutMs: 200,
    };
    const server = await serve(limits);
    const h1 = await fetch(`${server.url}/v4/p-x/app/1000`, { method: "POST", body: "{}" });
    expect(h1.status).toBe(200);
    expect(await h1.json()).toEqual({ slept: 1000 });

    const session = http2.connect(server.url);
    session.on("error", () => {});
    try {
      const answer = await new Promise<{ status: number; body: string }>((resolve, reject) => {
        const stream = session.request({ ":method": "POST", ":path": "/v4/p-x/app/1000" });
        let status = 0;
        let body = "";
        stream.on("response", (headers) => (status = Number(headers[":status"])));
        stream.on("data", (chunk: Buffer) => (body += chunk.toString()));
        stream.on("end", () => resolve({ status, body }));
        stream.on("error", reject);
        stream.end("{}");
      });
      expect(answer).toEqual({ status: 200, body: '{"slept":1000}' });
    } finally {
      session.destroy();
    }
  });
});

describe("connection caps", () => {
  it("a normal request answers while 1,000 idle or slow connections are open (default settings)", async () => {
    const server = await serve();
    // 250 from each of four other loopback addresses: under the per-address cap (256).
    const others = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"];
    const open: net.Socket[] = [];
    for (const address of others) {
      for (let i = 0; i < 250; i++) open.push(await connect(server, address));
    }
    // Half stay silent; half send a header byte every second.
    const slow = open.filter((_, i) => i % 2 === 1);
    for (const s of slow) s.write("G");
    let k = 0;
    const text = "ET / HTTP/1.1\r\nHost: x\r\nX-Slow: " + "a".repeat(100);
    const t = setInterval(() => {
      const byte = text[k++ % text.length];
      for (const s of slow) if (!s.destroyed) s.write(byte);
    }, 1_000);
    timers.push(t);
    await new Promise((r) => setTimeout(r, 1_500));

    const res = await fetch(`${server.url}/v4/p-x/app/0`, { method: "POST", body: "{}" });
    expect(res.status).toBe(200);
    expect(await res.json()).toEqual({ slept: 0 });
    expect(open.filter((s) => s.destroyed)).toHaveLength(0);
  }, 60_000);

  it("refuses a connection over the per-address cap, and admits one again when a connection closes", async () => {
    const server = await serve({ maxConnectionsPerAddress: 5, firstBytesTimeoutMs: 60_000 });
    const five = await Promise.all([1, 2, 3, 4, 5].map(() => connect(server)));
    const sixth = await connect(server);
    await closedAfter(sixth, 0);
    // Another address is not affected.
    const other = await connect(server, "127.0.0.2");
    five[0].destroy();
    await new Promise((r) => setTimeout(r, 100));
    const again = await connect(server);
    again.write(REQUEST);
    expect(await readUntil(again, '{"slept":0}')).toMatch(/^HTTP\/1\.1 200/);
    expect(five.slice(1).filter((s) => s.destroyed)).toHaveLength(0);
    expect(other.destroyed).toBe(false);
  });

  it("at the total cap, a new connection closes the longest-idle one; when all are busy, it is refused", async () => {
    const server = await serve({ maxConnections: 3, firstBytesTimeoutMs: 60_000, keepAliveTimeoutMs: 60_000 });
    const a = await connect(server);
    await new Promise((r) => setTimeout(r, 50));
    const b = await connect(server);
    const c = await connect(server);
    await new Promise((r) => setTimeout(r, 50));
    const d = await connect(server);
    await closedAfter(a, 0);
    expect([b, c, d].map((s) => s.destroyed)).toEqual([false, false, false]);

    // Three requests in progress: nothing is idle, so a fourth connection is refused.
    const answers = [b, c, d].map((s) => {
      s.write(REQUEST.replace("/app/0", "/app/800"));
      return readUntil(s, '{"slept":800}');
    });
    await new Promise((r) => setTimeout(r, 200));
    const e = await connect(server);
    await closedAfter(e, 0);
    for (const answer of answers) expect(await answer).toMatch(/^HTTP\/1\.1 200/);
  });

  it("the default cap is half the open-file limit", () => {
    const files = openFileLimit();
    expect(connectionCap(undefined)).toBe(files === undefined ? 4096 : Math.floor(files / 2));
    expect(connectionCap(10)).toBe(10);
  });
});

describe("connections under a small open-file limit", () => {
  it("idle sockets beyond the limit do not stop new requests: the default cap makes room", async () => {
    const fixture = path.join(TEST_ROOT, "fixtures", "one-port-server.ts");
    // One process (tsx as a loader, not its CLI's wrapper), so that killing it leaves nothing behind.
    const child = spawn("sh", ["-c", `ulimit -n 256 && exec "${process.execPath}" --import tsx "${fixture}"`], {
      stdio: ["ignore", "pipe", "inherit"],
    });
    children.push(child);
    const url = await new Promise<string>((resolve, reject) => {
      let out = "";
      child.stdout.on("data", (c: Buffer) => {
        out += c.toString();
        const line = out.split("\n").find((l) => l.startsWith("http://"));
        if (line) resolve(line.trim());
      });
      child.once("exit", (code) => reject(new Error(`the server exited (${code})`)));
    });
    const port = Number(new URL(url).port);
    // More idle sockets than the server has file descriptors.
    for (let i = 0; i < 300; i++) {
      const socket = net.connect({ host: "127.0.0.1", port });
      socket.on("error", () => {});
      sockets.push(socket);
      await new Promise((resolve) => socket.once("connect", resolve).once("close", resolve));
    }
    for (let i = 0; i < 3; i++) {
      const res = await fetch(`${url}/healthz`, { headers: { connection: "close" } });
      expect(res.status).toBe(200);
    }
  }, 60_000);
});

describe("what connections are counted under, per SKIFF_MAX_CONNECTIONS_PER_ADDRESS", () => {
  it("an IPv4 address, whether or not spelled as IPv4-mapped IPv6", () => {
    expect(normalizeAddress("10.0.0.1")).toBe("10.0.0.1");
    expect(normalizeAddress("::ffff:10.0.0.1")).toBe("10.0.0.1");
    expect(normalizeAddress(undefined)).toBeUndefined();
  });

  it("an IPv6 address's /64, however it is spelled: a client holds a /64, not one address", () => {
    const same = [
      "2001:db8:1:2::1",
      "2001:db8:1:2:ffff:ffff:ffff:ffff",
      "2001:0DB8:0001:0002:0:0:0:7",
      "2001:db8:1:2::1.2.3.4",
      "2001:db8:1:2:a:b:c:d%eth0",
    ];
    for (const address of same) expect(normalizeAddress(address), address).toBe("2001:db8:1:2::/64");
    expect(normalizeAddress("2001:db8:1:3::1")).toBe("2001:db8:1:3::/64");
    expect(normalizeAddress("2001:db8::1")).toBe("2001:db8:0:0::/64");
    expect(normalizeAddress("::1")).toBe("0:0:0:0::/64");
    expect(normalizeAddress("fe80::1%lo")).toBe("fe80:0:0:0::/64");
    expect(normalizeAddress("64:ff9b::1.2.3.4")).toBe("64:ff9b:0:0::/64");
  });
});
