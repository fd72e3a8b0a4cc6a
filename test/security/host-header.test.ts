// A bad request that threw synchronously inside the request listener killed
// the whole skiff process: the Connect adapter (connect-node's
// universalRequestFromNodeRequest) builds `new URL(path, "http://" + host)`
// before anything else, outside any try, so a Host (HTTP/1.1) or :authority
// (h2c) that makes no URL, such as "[" or "a b", threw an uncaught
// exception and the process exited. Reached without any token: an open
// service (Health), or any RPC path whose token the gate refused when the
// call's Content-Type was none the gate knows. The server now refuses such a
// host (400, or grpc-status 3) before the adapter, and the REST transcoder
// replaces it by the same test.
//
// The skiff here is the real server (`node bin/skiff-server.js`, one
// process, its own nats-server) in a child process, so that a crash shows as
// its exit. Each test starts its own: a crash ends the process.
import { spawn, type ChildProcess } from "node:child_process";
import http2 from "node:http2";
import net from "node:net";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { afterEach, describe, expect, it } from "vitest";
import { SKIFF_SERVER, TEST_ROOT } from "../helpers/paths.js";

interface Child {
  child: ChildProcess;
  /** The end of what it wrote to stderr (an uncaught exception's stack). */
  stderr(): string;
  dataDir: string;
  port: number;
  exited: Promise<number | string>;
}

let running: Child | undefined;

async function startSkiff(): Promise<Child> {
  const dataDir = await mkdtemp(join(tmpdir(), "skiff-host-header-"));
  const child = spawn(process.execPath, [SKIFF_SERVER], {
    cwd: join(TEST_ROOT, ".."),
    env: { PATH: process.env.PATH, HOME: process.env.HOME, CI: "1", SKIFF_PORT: "0", SKIFF_DATA_DIR: dataDir },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stderr = "";
  child.stderr!.on("data", (d: Buffer) => (stderr = (stderr + d.toString()).slice(-4000)));
  const exited = new Promise<number | string>((resolve) =>
    child.once("exit", (code, signal) => resolve(code ?? signal ?? "?")),
  );
  const url = await new Promise<string>((resolve, reject) => {
    createInterface({ input: child.stdout! }).on("line", (text) => {
      const m = /skiff serves (http:\/\/\S+)/.exec(text);
      if (m) resolve(m[1]);
    });
    void exited.then((code) => reject(new Error(`skiff exited with ${code} before it served`)));
  });
  running = { child, stderr: () => stderr, dataDir, port: Number(new URL(url).port), exited };
  return running;
}

afterEach(async () => {
  const c = running;
  running = undefined;
  if (!c) return;
  if (c.child.exitCode === null && c.child.signalCode === null) {
    c.child.kill("SIGTERM");
    const timer = setTimeout(() => c.child.kill("SIGKILL"), 15_000);
    await c.exited;
    clearTimeout(timer);
  }
  await rm(c.dataDir, { recursive: true, force: true });
});

/** Sends raw HTTP/1.1 bytes; resolves with the answer's status line, or "closed". */
function send(port: number, request: string): Promise<string> {
  return new Promise((resolve) => {
    const socket = net.connect(port, "127.0.0.1");
    let data = "";
    const timer = setTimeout(() => (socket.destroy(), resolve(data.split("\r\n")[0] || "late")), 5_000);
    socket.on("data", (d: Buffer) => {
      data += d.toString("latin1");
      if (data.includes("\r\n")) {
        clearTimeout(timer);
        socket.destroy();
        resolve(data.split("\r\n")[0]);
      }
    });
    socket.on("error", () => undefined);
    socket.on("close", () => {
      clearTimeout(timer);
      resolve(data.split("\r\n")[0] || "closed");
    });
    socket.write(request);
  });
}

/** "serving" when the process is still there and answers /healthz a second after the attack; else what became of it. */
async function fate(c: Child): Promise<string> {
  const gone = await Promise.race([c.exited, new Promise((r) => setTimeout(() => r(undefined), 1_000))]);
  if (gone !== undefined) return `exited (${String(gone)}): ${c.stderr().split("\n").slice(0, 3).join(" / ")}`;
  const status = await send(c.port, "GET /healthz HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n");
  return status.startsWith("HTTP/1.1 200") ? "serving" : `healthz: ${status}`;
}

const HEALTH = "/grpc.health.v1.Health/Check";
const DEPLOY = "/skiff.management.v2.ManagementService/DeployApp";

describe("a Host that makes no URL, on an RPC path, without a token", () => {
  it("HTTP/1.1, an open service (Health), Host: [ : answered, and skiff keeps serving", async () => {
    const c = await startSkiff();
    expect(await fate(c)).toBe("serving");
    const answer = await send(
      c.port,
      `POST ${HEALTH} HTTP/1.1\r\nhost: [\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}`,
    );
    // Observed: no answer ("closed"), and the skiff process exits (TypeError: Invalid URL, uncaught).
    expect(await fate(c)).toBe("serving");
    expect(answer).toMatch(/^HTTP\/1\.1 [45]\d\d/);
  }, 60_000);

  it("HTTP/1.1, DeployApp refused by the gate with a Content-Type it does not know, Host: a b : skiff keeps serving", async () => {
    const c = await startSkiff();
    expect(await fate(c)).toBe("serving");
    const answer = await send(
      c.port,
      `POST ${DEPLOY} HTTP/1.1\r\nhost: a b\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\r\n{}`,
    );
    expect(await fate(c)).toBe("serving");
    expect(answer).toMatch(/^HTTP\/1\.1 4\d\d/);
  }, 60_000);

  it("h2c, :authority [ on Health: the stream is answered or reset, and skiff keeps serving", async () => {
    const c = await startSkiff();
    expect(await fate(c)).toBe("serving");
    const session = http2.connect(`http://127.0.0.1:${c.port}`);
    session.on("error", () => undefined);
    const outcome = await new Promise<string>((resolve) => {
      const req = session.request({
        ":method": "POST",
        ":path": HEALTH,
        ":authority": "[",
        "content-type": "application/json",
      });
      req.on("response", (h) => resolve(String(h[":status"])));
      req.on("error", () => resolve("error"));
      req.on("close", () => resolve("closed"));
      req.end("{}");
    });
    session.destroy();
    expect(await fate(c)).toBe("serving");
    expect(outcome).not.toBe("500");
  }, 60_000);
});
