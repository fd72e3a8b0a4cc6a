// SKIFF_WORKERS=2 from the network, against the supervisor's count of
// connections per address (services/server/connections.ts AddressCounts,
// services/workers.ts): every way a connection can end (a reset before the
// verdict, a half-close, HTTP/2, upgrades, keep-alive churn, the first-bytes
// deadline, a burst racing the verdicts, its worker killed) must give its
// place back, so that the address has SKIFF_MAX_CONNECTIONS_PER_ADDRESS
// connections again, and never more; a connection past the cap must be
// closed having served nothing. Each attack comes from an address of its
// own (127.0.0.0/8 is all loopback on Linux), so that a leak shows in the
// attack that made it.
import { EventEmitter } from "node:events";
import http2 from "node:http2";
import net from "node:net";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { packApp } from "../../services/apps/bundle.js";
import { silentLogger } from "../../services/config/logger.js";
import { AddressCounts, ConnectionGuard, type AddressLedger } from "../../services/server/connections.js";
import { TEST_ROOT } from "../helpers/paths.js";
import { serves, startWorkersSkiff, stopWorkersSkiff, type WorkersSkiff } from "../helpers/workers-skiff.js";

const PER_ADDRESS = 4;
const FIRST_BYTES_MS = 2_000;

let skiff: WorkersSkiff;
let port: number;

beforeAll(async () => {
  skiff = await startWorkersSkiff({
    SKIFF_MAX_CONNECTIONS_PER_ADDRESS: String(PER_ADDRESS),
    SKIFF_FIRST_BYTES_TIMEOUT_MS: String(FIRST_BYTES_MS),
  });
  port = Number(new URL(skiff.url).port);
  const echo = path.join(TEST_ROOT, "..", "examples", "ws-echo");
  await skiff.admin.deployApp({
    projectId: "p-dev",
    bundle: { contentType: "application/gzip", data: (await packApp(echo)).bytes },
  });
}, 120_000);

afterAll(() => stopWorkersSkiff(skiff), 60_000);

const settle = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A connection from `local`, resolved once connected; it records when it closes and what it read. */
interface Held {
  socket: net.Socket;
  read: () => string;
  closed: () => boolean;
}

function connectFrom(local: string): Promise<Held> {
  return new Promise((resolve, reject) => {
    const socket = net.connect({ host: "127.0.0.1", port, localAddress: local });
    let read = "";
    let closed = false;
    socket.on("data", (d: Buffer) => (read += d.toString("latin1")));
    socket.on("close", () => (closed = true));
    socket.on("error", () => undefined);
    socket.once("connect", () => resolve({ socket, read: () => read, closed: () => closed }));
    socket.once("error", reject);
  });
}

/**
 * How many connections from `local` the machine holds open at once: opens more than the cap one after
 * another, counts those still open a moment later, then closes them all and waits for their closes to count.
 */
async function capacity(local: string): Promise<number> {
  const held: Held[] = [];
  try {
    for (let i = 0; i < PER_ADDRESS + 3; i++) held.push(await connectFrom(local));
    await settle(700);
    return held.filter((h) => !h.closed()).length;
  } finally {
    for (const h of held) h.socket.destroy();
    await settle(300);
  }
}

/** `n` connections from `local` at once, each given to `each` as soon as it is made. */
async function burst(local: string, n: number, each: (s: net.Socket) => void): Promise<void> {
  await Promise.all(
    Array.from(
      { length: n },
      () =>
        new Promise<void>((resolve) => {
          const socket = net.connect({ host: "127.0.0.1", port, localAddress: local });
          socket.on("error", () => undefined);
          socket.resume(); // reads what comes, so that it sees skiff's close
          socket.once("close", () => resolve());
          socket.once("connect", () => each(socket));
          setTimeout(() => {
            socket.destroy();
            resolve();
          }, 5_000).unref();
        }),
    ),
  );
}

const REQUEST = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";

describe("the count per address over the workers gives back every place, and holds the cap", () => {
  it("at the start, an address has exactly SKIFF_MAX_CONNECTIONS_PER_ADDRESS connections", async () => {
    expect(await capacity("127.0.0.10")).toBe(PER_ADDRESS);
  });

  it("connections reset at once, before any verdict can reach their worker, leak no place", async () => {
    const local = "127.0.0.11";
    await burst(local, 200, (s) => s.resetAndDestroy());
    await burst(local, 200, (s) => s.destroy());
    await settle(500);
    expect(await capacity(local)).toBe(PER_ADDRESS);
  });

  it("half-closed connections (FIN at once, with a whole request, with half a head) leak no place", async () => {
    const local = "127.0.0.12";
    await burst(local, 60, (s) => s.end());
    await burst(local, 60, (s) => s.end(REQUEST));
    await burst(local, 60, (s) => s.end("GET /healthz HTTP/1.1\r\nHo"));
    await settle(500);
    expect(await capacity(local)).toBe(PER_ADDRESS);
  });

  it("HTTP/2 connections are held to the cap, and their ends (GOAWAY, destroy, reset) leak no place", async () => {
    const local = "127.0.0.13";
    const sessions: http2.ClientHttp2Session[] = [];
    const answered = async (session: http2.ClientHttp2Session) =>
      new Promise<boolean>((resolve) => {
        session.on("error", () => resolve(false));
        const req = session.request({ ":path": "/healthz" });
        req.on("response", () => resolve(true));
        req.on("error", () => resolve(false));
        req.on("close", () => resolve(false));
        req.end();
        req.resume();
      });
    try {
      for (let i = 0; i < PER_ADDRESS * 2; i++)
        sessions.push(
          http2.connect(`http://127.0.0.1:${port}`, {
            createConnection: () => net.connect({ host: "127.0.0.1", port, localAddress: local }),
          }),
        );
      const served = await Promise.all(sessions.map(answered));
      expect(served.filter(Boolean).length).toBeLessThanOrEqual(PER_ADDRESS);
      expect(served.filter(Boolean).length).toBeGreaterThan(0);
      sessions.forEach((s, i) => {
        if (i % 3 === 0) s.close();
        else if (i % 3 === 1) s.destroy();
        else (s.socket as net.Socket | undefined)?.resetAndDestroy();
      });
    } finally {
      for (const s of sessions) s.destroy();
    }
    await settle(500);
    expect(await capacity(local)).toBe(PER_ADDRESS);
  });

  it("upgrade requests (WebSocket without a token, h2c declined and served as HTTP/1.1) leak no place", async () => {
    const local = "127.0.0.14";
    const websocket =
      "GET /v4/p-dev/none HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n" +
      "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
    const h2c =
      "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n";
    for (const head of [websocket, h2c]) {
      await burst(local, 12, (s) => {
        s.write(head);
        s.once("data", () => s.destroy());
      });
      await burst(local, 12, (s) => {
        s.write(head);
        s.resetAndDestroy();
      });
    }
    await settle(500);
    expect(await capacity(local)).toBe(PER_ADDRESS);
  });

  it("WebSocket connections relayed to an app are held to the cap, and their ends leak no place", async () => {
    const local = "127.0.0.19";
    const handshake =
      "GET /v4/p-dev/ws-echo/echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
      skiff.devToken +
      "\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n" +
      "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
    const upgraded = (h: Held) => h.read().startsWith("HTTP/1.1 101");
    const held: Held[] = [];
    try {
      // The first ones start a replica in each worker.
      for (let i = 0; i < PER_ADDRESS * 2; i++) {
        const h = await connectFrom(local);
        held.push(h);
        h.socket.write(handshake);
      }
      for (let i = 0; i < 300 && held.filter(upgraded).length < PER_ADDRESS; i++) await settle(100);
      await settle(500);
      expect(held.filter(upgraded).length).toBe(PER_ADDRESS);
      expect(held.filter((h) => !h.closed()).length).toBe(PER_ADDRESS);
      // Ended every way: a reset, a FIN, a close frame, the app closing it.
      const open = held.filter((h) => !h.closed());
      open[0].socket.resetAndDestroy();
      open[1].socket.end();
      open[2].socket.write(Buffer.from([0x88, 0x80, 0, 0, 0, 0]));
      // A masked text frame "close 1000 x": the app closes with 1000.
      const text = Buffer.from("close 1000 x");
      open[3].socket.write(Buffer.concat([Buffer.from([0x81, 0x80 | text.length, 0, 0, 0, 0]), text]));
      for (let i = 0; i < 50 && open.some((h) => !h.closed()); i++) {
        await settle(100);
        if (i === 20) for (const h of open) h.socket.end();
      }
    } finally {
      for (const h of held) h.socket.destroy();
    }
    await settle(500);
    expect(await capacity(local)).toBe(PER_ADDRESS);
  }, 60_000);

  it("keep-alive churn (a request on each of 400 new connections, some closed by skiff) leaks no place", async () => {
    const local = "127.0.0.15";
    let answered = 0;
    for (let round = 0; round < 100; round++)
      await burst(local, PER_ADDRESS, (s) => {
        s.write(round % 2 === 0 ? REQUEST : REQUEST.replace("Host: x", "Host: x\r\nConnection: close"));
        s.once("data", () => {
          answered++;
          s.destroy();
        });
      });
    expect(answered).toBeGreaterThan(300);
    await settle(500);
    expect(await capacity(local)).toBe(PER_ADDRESS);
  });

  it("a burst of connections at once racing the verdicts: at most the cap served, those past it read nothing", async () => {
    const local = "127.0.0.16";
    const held: Held[] = await Promise.all(Array.from({ length: 60 }, () => connectFrom(local)));
    try {
      // Each asks at once and keeps its connection (keep-alive): only those admitted may be answered.
      for (const h of held) h.socket.write(REQUEST);
      await settle(1_000);
      const answered = held.filter((h) => h.read().length > 0);
      expect(answered.length).toBeLessThanOrEqual(PER_ADDRESS);
      expect(held.filter((h) => !h.closed()).length).toBeLessThanOrEqual(PER_ADDRESS);
      for (const h of held) if (h.closed() && !answered.includes(h)) expect(h.read()).toBe("");
    } finally {
      for (const h of held) h.socket.destroy();
    }
    await settle(500);
    expect(await capacity(local)).toBe(PER_ADDRESS);
  });

  it("silent connections closed by the first-bytes deadline, while held or while waiting, leak no place", async () => {
    const local = "127.0.0.17";
    const held: Held[] = [];
    for (let i = 0; i < PER_ADDRESS * 3; i++) held.push(await connectFrom(local));
    await settle(FIRST_BYTES_MS + 1_000);
    expect(held.filter((h) => !h.closed())).toEqual([]);
    expect(await capacity(local)).toBe(PER_ADDRESS);
  });

  it("a worker killed while it holds connections and verdicts are under way gives its places back", async () => {
    const local = "127.0.0.18";
    const held: Held[] = [];
    for (let i = 0; i < PER_ADDRESS; i++) held.push(await connectFrom(local));
    for (const h of held) h.socket.write(REQUEST);
    await settle(300);
    // Which worker holds each: its answer's Skiff-Worker.
    const workerOf = (h: Held) => /skiff-worker: (\d+)/i.exec(h.read())?.[1];
    expect(held.every((h) => workerOf(h) !== undefined)).toBe(true);
    const pid = Number(skiff.logs.lines.findLast(serves(2))!.pid);
    const restarted = skiff.logs.next(serves(2));
    // More connections race the kill: some wait for their verdict as the worker ends.
    const racing = burst(local, 40, (s) => s.write(REQUEST));
    process.kill(pid, "SIGKILL");
    await racing;
    await restarted;
    await settle(500);
    // Worker 1's connections are still open and still count; worker 2's ended with it.
    const stillOpen = held.filter((h) => !h.closed());
    expect(stillOpen.map(workerOf)).toEqual(held.filter((h) => workerOf(h) === "1").map(workerOf));
    for (const h of stillOpen) h.socket.destroy();
    await settle(500);
    expect(await capacity(local)).toBe(PER_ADDRESS);
  }, 60_000);
});

/** A socket as the guard sees one, from any address spelling Node may report. */
class FakeSocket extends EventEmitter {
  destroyed = false;
  constructor(readonly remoteAddress: string) {
    super();
  }
  pause(): this {
    return this;
  }
  resume(): this {
    return this;
  }
  destroy(): this {
    if (!this.destroyed) {
      this.destroyed = true;
      setImmediate(() => this.emit("close"));
    }
    return this;
  }
}

/** A worker's ledger on the supervisor's count, its verdicts a turn of the event loop later (as over IPC). */
function workerLedger(counts: AddressCounts<object>): AddressLedger {
  const worker = {};
  let id = 0;
  return {
    open(address, verdict) {
      const answer = counts.report(worker, { skiff: "address-open", id: ++id, address });
      setImmediate(() => verdict(answer!.admitted));
    },
    closed(address) {
      counts.report(worker, { skiff: "address-closed", address });
    },
  };
}

describe("address spellings", () => {
  it("an IPv4 address and its IPv4-mapped IPv6 spelling share one count over the workers", async () => {
    const counts = new AddressCounts<object>(2);
    const limits = {
      firstBytesTimeoutMs: 60_000,
      headersTimeoutMs: 60_000,
      keepAliveTimeoutMs: 60_000,
      http2IdleTimeoutMs: 60_000,
      maxConnections: 100,
      maxConnectionsPerAddress: 2,
    };
    const guards = [0, 1].map(() => new ConnectionGuard(limits, silentLogger, workerLedger(counts)));
    const sockets = ["::ffff:10.0.0.1", "10.0.0.1", "::ffff:10.0.0.1", "10.0.0.1"].map((a) => new FakeSocket(a));
    sockets.forEach((s, i) => guards[i % 2].admit(s as unknown as net.Socket));
    await settle(50);
    expect(sockets.map((s) => s.destroyed)).toEqual([false, false, true, true]);
    expect(counts.open("10.0.0.1")).toBe(2);
    expect(counts.open("::ffff:10.0.0.1")).toBe(0);
    sockets[0].destroy();
    await settle(50);
    expect(counts.open("10.0.0.1")).toBe(1);
    for (const g of guards) g.destroyAll();
  });
});
