// The cap per address counted beyond one process, as the workers of
// SKIFF_WORKERS count it with their supervisor: guards on real loopback
// sockets whose ledger is one AddressCounts, reached through the same
// reports and verdicts a worker sends and gets over IPC (here in-process, so
// that a verdict can be held back). test/security/workers.test.ts shows the
// same across real workers.
import net from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { silentLogger } from "../../services/config/logger.js";
import {
  AddressCounts,
  ConnectionGuard,
  type AddressLedger,
  type ConnectionLimits,
} from "../../services/server/connections.js";

const LIMITS: ConnectionLimits = {
  firstBytesTimeoutMs: 60_000,
  headersTimeoutMs: 60_000,
  keepAliveTimeoutMs: 60_000,
  http2IdleTimeoutMs: 60_000,
  maxConnections: 100,
  maxConnectionsPerAddress: 3,
};

const cleanups: (() => void)[] = [];
afterEach(() => {
  for (const c of cleanups.splice(0)) c();
});

/** A worker's ledger on a shared count; with `hold`, verdicts wait until release() is called. */
class Ledger implements AddressLedger {
  private nextId = 0;
  private held: (() => void)[] = [];
  constructor(
    private readonly counts: AddressCounts<object>,
    private readonly hold = false,
  ) {}
  open(address: string, verdict: (admitted: boolean) => void): void {
    const answer = this.counts.report(this, { skiff: "address-open", id: ++this.nextId, address });
    const deliver = () => verdict(answer!.admitted);
    if (this.hold) this.held.push(deliver);
    else setImmediate(deliver);
  }
  closed(address: string): void {
    expect(this.counts.report(this, { skiff: "address-closed", address })).toBeUndefined();
  }
  release(): void {
    for (const deliver of this.held.splice(0)) deliver();
  }
}

interface Served {
  port: number;
  guard: ConnectionGuard;
  /** What the server read, by connection, in order of admission. */
  reads: string[];
}

/** A TCP server that admits through a guard and echoes, as server.ts does: its "data" listener comes after admit. */
async function serve(ledger: AddressLedger, limits: Partial<ConnectionLimits> = {}): Promise<Served> {
  const guard = new ConnectionGuard({ ...LIMITS, ...limits }, silentLogger, ledger);
  const reads: string[] = [];
  const server = net.createServer((socket) => {
    socket.on("error", () => socket.destroy());
    if (!guard.admit(socket)) return;
    const i = reads.push("") - 1;
    socket.on("data", (chunk: Buffer) => {
      reads[i] += chunk.toString();
      socket.write(chunk);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  cleanups.push(() => {
    guard.destroyAll();
    server.close();
  });
  return { port: (server.address() as net.AddressInfo).port, guard, reads };
}

function connect(port: number): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const socket = net.connect({ host: "127.0.0.1", port });
    cleanups.push(() => socket.destroy());
    socket.on("error", () => {});
    socket.once("connect", () => resolve(socket));
    socket.once("error", reject);
  });
}

function closed(socket: net.Socket): Promise<void> {
  return new Promise((resolve) => (socket.closed ? resolve() : socket.once("close", () => resolve())));
}

/** Resolves with what the socket reads until `text` has come back. */
function echoed(socket: net.Socket, text: string): Promise<string> {
  return new Promise((resolve, reject) => {
    let got = "";
    socket.on("data", (chunk: Buffer) => {
      got += chunk.toString();
      if (got.includes(text)) resolve(got);
    });
    socket.once("close", () => reject(new Error(`closed before the echo; got ${JSON.stringify(got)}`)));
    socket.write(text);
  });
}

const settle = (ms = 100) => new Promise((r) => setTimeout(r, ms));

describe("the cap per address over several guards", () => {
  it("two guards on one count hold the cap together, and a close in one frees a place in the other", async () => {
    const counts = new AddressCounts<object>(LIMITS.maxConnectionsPerAddress);
    const [a, b] = await Promise.all([serve(new Ledger(counts)), serve(new Ledger(counts))]);
    const sockets: net.Socket[] = [];
    for (let i = 0; i < 6; i++) sockets.push(await connect(i % 2 === 0 ? a.port : b.port));
    await settle();
    const open = sockets.filter((s) => !s.closed);
    expect(open).toHaveLength(3);
    expect(counts.open("127.0.0.1")).toBe(3);
    for (const s of open) expect(await echoed(s, "ping")).toBe("ping");

    // One that went to a closes; the next goes to b and is served.
    const fromA = open.find((s) => sockets.indexOf(s) % 2 === 0)!;
    fromA.destroy();
    await settle();
    expect(counts.open("127.0.0.1")).toBe(2);
    const again = await connect(b.port);
    expect(await echoed(again, "pong")).toBe("pong");
    expect(counts.open("127.0.0.1")).toBe(3);
  });

  it("a connection waits unread for its verdict: a refused one has served nothing, an admitted one reads on", async () => {
    const counts = new AddressCounts<object>(1);
    const ledger = new Ledger(counts, true);
    const server = await serve(ledger);
    const first = await connect(server.port);
    const second = await connect(server.port);
    first.write("first");
    second.write("second");
    await settle();
    // Both wait: nothing they sent reached the server's listener.
    expect(server.reads).toEqual(["", ""]);
    ledger.release();
    await closed(second);
    expect(await echoed(first, "!")).toBe("first!");
    expect(server.reads).toEqual(["first!", ""]);
    expect(counts.open("127.0.0.1")).toBe(1);
  });

  it("a connection closed before its verdict is not counted once admitted; one the guard ends while it waits is not either", async () => {
    const counts = new AddressCounts<object>(LIMITS.maxConnectionsPerAddress);
    const ledger = new Ledger(counts, true);
    const server = await serve(ledger, { firstBytesTimeoutMs: 200 });
    const gone = await connect(server.port);
    gone.destroy();
    // This one sends nothing: its first-bytes deadline passes while it waits.
    const silent = await connect(server.port);
    await closed(silent);
    await settle();
    expect(counts.open("127.0.0.1")).toBe(2); // the supervisor's count, before the verdicts reach the worker
    ledger.release();
    await settle();
    expect(counts.open("127.0.0.1")).toBe(0);
  });

  it("a stop closes the connections that wait for a verdict", async () => {
    const counts = new AddressCounts<object>(LIMITS.maxConnectionsPerAddress);
    const ledger = new Ledger(counts, true);
    const server = await serve(ledger);
    const waiting = await connect(server.port);
    await settle();
    server.guard.stop();
    await closed(waiting);
    ledger.release();
    await settle();
    expect(counts.open("127.0.0.1")).toBe(0);
  });
});

describe("the supervisor's count", () => {
  it("a worker that ended gives back its connections, and is refused what it asks after", () => {
    const counts = new AddressCounts<object>(2);
    const [one, two] = [{}, {}];
    const open = (worker: object, id: number, address = "10.0.0.1") =>
      counts.report(worker, { skiff: "address-open", id, address });
    expect(open(one, 1)).toEqual({ skiff: "address-verdict", id: 1, admitted: true });
    expect(open(two, 1)).toEqual({ skiff: "address-verdict", id: 1, admitted: true });
    expect(open(two, 2)).toEqual({ skiff: "address-verdict", id: 2, admitted: false });
    expect(open(two, 3, "10.0.0.2")?.admitted).toBe(true);
    counts.forget(one);
    expect(counts.open("10.0.0.1")).toBe(1);
    expect(open(one, 2)?.admitted).toBe(false);
    expect(open(two, 4)?.admitted).toBe(true);
    // A close it never had counted, and what is not a report, change nothing.
    expect(counts.report(one, { skiff: "address-closed", address: "10.0.0.1" })).toBeUndefined();
    expect(counts.report(two, { hello: "world" })).toBeUndefined();
    expect(counts.report(two, { skiff: "address-open", address: 1, id: 5 })).toBeUndefined();
    expect([counts.open("10.0.0.1"), counts.open("10.0.0.2")]).toEqual([2, 1]);
    counts.report(two, { skiff: "address-closed", address: "10.0.0.1" });
    expect(counts.open("10.0.0.1")).toBe(1);
  });
});
