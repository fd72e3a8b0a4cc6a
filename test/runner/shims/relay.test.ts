// The Custom-app relays (services/runner/shims/relay.py and relay.mjs), each
// as the real process a sandboxed replica runs: handed a listening Unix
// socket as fd 3, relaying to an app on 127.0.0.1. What passes through must
// arrive unchanged, at once, with half-closes, upgrades and back-pressure.
import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtemp, readFile, rename, rm } from "node:fs/promises";
import net from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from "vitest";
import { SHIM_DIR } from "../../../services/runner/sandbox-argv.js";

let tmp: string;
let seq = 0;
const started: ChildProcess[] = [];
const servers: net.Server[] = [];

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-relay-"));
});
afterEach(() => {
  for (const s of servers.splice(0)) s.close();
});
afterAll(async () => {
  for (const p of started) p.kill("SIGKILL");
  await rm(tmp, { recursive: true, force: true });
});

/** An app on 127.0.0.1 (a free port, or `port`); `onConn` gets each connection. */
async function app(onConn: (s: net.Socket) => void, port = 0): Promise<number> {
  const server = net.createServer({ allowHalfOpen: true }, onConn);
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(port, "127.0.0.1", resolve));
  return (server.address() as net.AddressInfo).port;
}

async function freePort(): Promise<number> {
  const port = await app(() => undefined);
  await new Promise((resolve) => servers.pop()!.close(resolve));
  return port;
}

/** Starts a relay as the runner does: the listening socket as fd 3, accepted by the relay alone. */
async function startRelay(file: string, port: number): Promise<{ proc: ChildProcess; socketPath: string }> {
  const socketPath = path.join(tmp, `r${++seq}.sock`);
  const server = await new Promise<net.Server>((resolve) => {
    const s = net.createServer().listen(`${socketPath}.new`, () => resolve(s));
  });
  const fd = (server as unknown as { _handle: { fd: number } })._handle.fd;
  const command = file.endsWith(".py") ? ["python3", "-I", "-S"] : [process.execPath];
  const proc = spawn(command[0], [...command.slice(1), path.join(SHIM_DIR, file), "3", String(port)], {
    stdio: ["ignore", "inherit", "inherit", fd],
  });
  started.push(proc);
  await rename(`${socketPath}.new`, socketPath);
  server.close();
  return { proc, socketPath };
}

function connect(socketPath: string): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const s = net.connect({ path: socketPath, allowHalfOpen: true }, () => resolve(s));
    s.once("error", reject);
  });
}

/** Everything a socket reads until its end. */
function readAll(s: net.Socket): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    s.on("data", (c: Buffer) => chunks.push(c));
    s.on("end", () => resolve(Buffer.concat(chunks)));
    s.on("error", reject);
    s.resume();
  });
}

/** The next `n` bytes a socket reads (it must not have a data listener yet). */
function readBytes(s: net.Socket, n: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let got = 0;
    const onData = (c: Buffer) => {
      chunks.push(c);
      got += c.length;
      if (got >= n) {
        s.off("data", onData);
        s.off("error", reject);
        s.pause();
        const all = Buffer.concat(chunks);
        if (all.length > n) s.unshift(all.subarray(n));
        resolve(all.subarray(0, n));
      }
    };
    s.on("data", onData);
    s.once("error", reject);
    s.resume();
  });
}

const echo = (s: net.Socket) => s.pipe(s);

const rssKb = async (pid: number) => Number(/VmRSS:\s+(\d+)/.exec(await readFile(`/proc/${pid}/status`, "utf8"))![1]);

describe.each(["relay.py", "relay.mjs"])("%s", (file) => {
  it("passes 16 MiB of random bytes each way unchanged", async () => {
    const { socketPath } = await startRelay(file, await app(echo));
    const sent = randomBytes(16 << 20);
    const s = await connect(socketPath);
    const back = readAll(s);
    s.end(sent);
    expect((await back).equals(sent)).toBe(true);
  });

  it("keeps 40 connections at once apart", async () => {
    const { socketPath } = await startRelay(file, await app(echo));
    const all = await Promise.all(
      Array.from({ length: 40 }, async () => {
        const sent = randomBytes(256 << 10);
        const s = await connect(socketPath);
        const back = readAll(s);
        s.end(sent);
        return (await back).equals(sent);
      }),
    );
    expect(all.every(Boolean)).toBe(true);
  });

  it("passes a half-close on: the app answers after the caller's end of input", async () => {
    const port = await app((s) => {
      const chunks: Buffer[] = [];
      s.on("data", (c: Buffer) => chunks.push(c));
      s.on("end", () => s.end(`got ${Buffer.concat(chunks).length} bytes`));
    });
    const { socketPath } = await startRelay(file, port);
    const s = await connect(socketPath);
    const back = readAll(s);
    s.end(Buffer.alloc(100_000, 1));
    expect((await back).toString()).toBe("got 100000 bytes");
  });

  it("forwards each chunk of a trickling answer as it comes, without waiting for more", async () => {
    // The app sends the next chunk only once the caller has acknowledged the last: a relay that held
    // bytes back waiting for more would stall here.
    const port = await app((s) => {
      let n = 0;
      s.write(`chunk ${n}\n`);
      s.on("data", () => {
        if (++n < 20) s.write(`chunk ${n}\n`);
        else s.end("done\n");
      });
    });
    const { socketPath } = await startRelay(file, port);
    const s = await connect(socketPath);
    const got: string[] = [];
    for (let i = 0; i < 20; i++) {
      got.push((await readBytes(s, `chunk ${i}\n`.length)).toString());
      s.write("ack");
    }
    expect((await readAll(s)).toString()).toBe("done\n");
    expect(got).toEqual(Array.from({ length: 20 }, (_, i) => `chunk ${i}\n`));
  });

  it("relays an upgraded connection (HTTP 101, then both ways at will)", async () => {
    const port = await app((s) => {
      s.once("data", (head: Buffer) => {
        expect(head.toString()).toMatch(/^GET \/ws HTTP\/1\.1\r\n[\s\S]*Upgrade: websocket/);
        s.write("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n");
        s.write("hello from the app");
        s.on("data", (c: Buffer) => s.write(Buffer.concat([Buffer.from("echo:"), c])));
      });
    });
    const { socketPath } = await startRelay(file, port);
    const s = await connect(socketPath);
    s.write("GET /ws HTTP/1.1\r\nHost: app\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n");
    const head = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n";
    expect((await readBytes(s, head.length)).toString()).toBe(head);
    expect((await readBytes(s, 18)).toString()).toBe("hello from the app");
    for (const word of ["one", "two", "three"]) {
      s.write(word);
      expect((await readBytes(s, 5 + word.length)).toString()).toBe(`echo:${word}`);
    }
    s.destroy();
  });

  it("waits for an app that is not listening yet, then relays what the caller sent meanwhile", async () => {
    const port = await freePort();
    const { socketPath } = await startRelay(file, port);
    const s = await connect(socketPath);
    const back = readAll(s);
    s.end("sent before the app listened");
    await app(echo, port);
    expect((await back).toString()).toBe("sent before the app listened");
  });

  it("does not read more from the app than its caller takes (bounded buffer, back-pressure)", async () => {
    const size = 48 << 20;
    let appSide: net.Socket | undefined;
    const port = await app((s) => {
      appSide = s;
      s.end(Buffer.alloc(size, 7));
    });
    const { proc, socketPath } = await startRelay(file, port);
    // A first download that is read at once: the relay as it is after a busy connection.
    expect((await readAll(await connect(socketPath))).length).toBe(size);
    const rssBefore = await rssKb(proc.pid!);
    appSide = undefined;
    const s = await connect(socketPath);
    s.pause();
    await vi.waitUntil(() => appSide !== undefined);
    // Until the app's writes stop moving: the relay has taken all it will take while the caller reads nothing.
    let last = -1;
    await vi.waitUntil(
      async () => {
        const now = appSide!.bytesWritten - appSide!.writableLength;
        const settled = now === last;
        last = now;
        await new Promise((r) => setTimeout(r, 200));
        return settled;
      },
      { timeout: 60_000, interval: 1 },
    );
    expect(appSide!.writableLength).toBeGreaterThan(size / 2);
    expect((await rssKb(proc.pid!)) - rssBefore).toBeLessThan(16 << 10);
    // Then all of it arrives once the caller reads.
    const got = await readAll(s);
    expect(got.length).toBe(size);
    expect(got.every((b) => b === 7)).toBe(true);
  });

  it("ignores SIGTERM (the app's to act on) and keeps relaying", async () => {
    const { proc, socketPath } = await startRelay(file, await app(echo));
    const first = await connect(socketPath);
    first.write("relay up");
    expect((await readBytes(first, 8)).toString()).toBe("relay up");
    proc.kill("SIGTERM");
    const s = await connect(socketPath);
    const back = readAll(s);
    s.end("after SIGTERM");
    expect((await back).toString()).toBe("after SIGTERM");
    first.write("still open");
    expect((await readBytes(first, 10)).toString()).toBe("still open");
    expect(proc.exitCode).toBeNull();
    first.destroy();
  });
});
