// The namespace-connect helper (services/runner/netns-connect.py) serves every
// replica of the runner: a replica that accepts no connection (its listen
// backlog full) must cost only its own callers. Here a namespace's server
// never accepts and its backlog is full; connections to another namespace's
// server, asked for after the stuck ones through the same helper, are made
// while the stuck ones are still pending, and a burst to the stuck one holds
// at most CONNECTS_PER_NAMESPACE connections of the helper in it. Real network
// namespaces (`unshare -n`), as root.
import { spawn, type ChildProcess } from "node:child_process";
import { readFile } from "node:fs/promises";
import type net from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { silentLogger } from "../../services/config/logger.js";
import { CONNECTS_PER_NAMESPACE, NetnsConnector } from "../../services/runner/netns-connect.js";
import { RELAY_PYTHON } from "../../services/runner/replica-factory.js";
import { machineCan } from "../helpers/machine.js";

const usable = machineCan(
  "security/netns-connect",
  process.getuid?.() !== 0 ? "skiff is not root" : RELAY_PYTHON === undefined ? "no python3 for the helper" : undefined,
);
const STUCK_PORT = 8200;
const HEALTHY_PORT = 8300;

/**
 * A listener with a backlog of 0 that never accepts: one connection of its
 * own fills its accept queue (the LISTEN entry's rx_queue in /proc/net/tcp
 * counts it), after which the kernel drops every new SYN.
 */
const STUCK = `
import socket, time
l = socket.socket()
l.bind(("127.0.0.1", ${STUCK_PORT}))
l.listen(0)
fill = socket.create_connection(("127.0.0.1", ${STUCK_PORT}))
local = "0100007F:%04X" % ${STUCK_PORT}
def queued():
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        f = line.split()
        if f[1] == local and f[3] == "0A":
            return int(f[4].split(":")[1], 16)
    return 0
while queued() < 1:
    time.sleep(0.01)
print("ready", flush=True)
while True:
    time.sleep(3600)
`;

/** A listener that accepts every connection and answers it. */
const HEALTHY = `
import socket
l = socket.socket()
l.bind(("127.0.0.1", ${HEALTHY_PORT}))
l.listen(512)
print("ready", flush=True)
while True:
    c, _ = l.accept()
    c.sendall(b"healthy")
    c.close()
`;

/** A python program in a network namespace of its own (unshare execs it: its pid holds the namespace). */
async function inNamespace(program: string): Promise<ChildProcess> {
  const child = spawn("unshare", ["-n", "sh", "-c", `ip link set lo up && exec ${RELAY_PYTHON} -c '${program}'`], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  await new Promise<void>((resolve, reject) => {
    child.stdout!.on("data", (d: Buffer) => d.toString().includes("ready") && resolve());
    child.once("exit", (code) => reject(new Error(`the program in its namespace exited (${code})`)));
  });
  return child;
}

/** Connections of the namespace of `pid` in SYN_SENT towards 127.0.0.1:`port`: connects the helper has under way. */
async function connecting(pid: number, port: number): Promise<number> {
  const table = await readFile(`/proc/${pid}/net/tcp`, "utf8");
  const remote = `0100007F:${port.toString(16).toUpperCase().padStart(4, "0")}`;
  return table
    .split("\n")
    .slice(1)
    .filter((line) => {
      const f = line.trim().split(/\s+/);
      return f[2] === remote && f[3] === "02";
    }).length;
}

function readAll(socket: net.Socket): Promise<string> {
  return new Promise((resolve, reject) => {
    let text = "";
    socket.setEncoding("utf8");
    socket.on("data", (c: string) => (text += c));
    socket.on("end", () => resolve(text));
    socket.on("error", reject);
  });
}

describe.skipIf(!usable)("the namespace-connect helper and an app that accepts nothing", () => {
  let stuck: ChildProcess;
  let healthy: ChildProcess;
  let netns: NetnsConnector;

  beforeAll(async () => {
    [stuck, healthy] = await Promise.all([inNamespace(STUCK), inNamespace(HEALTHY)]);
  });
  afterAll(() => {
    stuck?.kill("SIGKILL");
    healthy?.kill("SIGKILL");
  });

  /** Asks for `n` connections to the stuck server; `events` gets one entry as each settles. */
  function connectStuck(n: number, events: string[]): Promise<Error[]> {
    return Promise.all(
      Array.from({ length: n }, () =>
        netns.connect("stuck", STUCK_PORT).then(
          (socket) => {
            socket.destroy();
            events.push("stuck connected");
            return new Error("connected");
          },
          (err: Error) => {
            events.push("stuck failed");
            return err;
          },
        ),
      ),
    );
  }

  it("connections to another namespace are made while the stuck ones are pending; the stuck ones fail after the deadline", async () => {
    netns = new NetnsConnector(RELAY_PYTHON!, silentLogger);
    try {
      expect(await netns.open("stuck", stuck.pid!)).toBeUndefined();
      expect(await netns.open("healthy", healthy.pid!)).toBeUndefined();
      const events: string[] = [];
      // Asked for first: a helper that waits on each in turn answers them before anything asked later.
      const stuckOnes = connectStuck(3, events);
      const socket = await netns.connect("healthy", HEALTHY_PORT);
      events.push("healthy connected");
      expect(events).toEqual(["healthy connected"]);
      expect(await readAll(socket)).toBe("healthy");
      const errors = await stuckOnes;
      expect(events).toEqual(["healthy connected", "stuck failed", "stuck failed", "stuck failed"]);
      for (const err of errors)
        expect(err.message).toMatch(new RegExp(`^cannot connect to port ${STUCK_PORT} in the sandbox: .*within`));
    } finally {
      netns.stop();
    }
  });

  it("a burst to the stuck app holds at most CONNECTS_PER_NAMESPACE connects; a larger burst to a healthy app all connect", async () => {
    netns = new NetnsConnector(RELAY_PYTHON!, silentLogger);
    try {
      expect(await netns.open("stuck", stuck.pid!)).toBeUndefined();
      expect(await netns.open("healthy", healthy.pid!)).toBeUndefined();
      const n = CONNECTS_PER_NAMESPACE + 8;
      const events: string[] = [];
      const stuckOnes = connectStuck(n, events);
      // Beyond the cap too: those wait for a free slot of their namespace, not for the stuck one.
      const sockets = await Promise.all(Array.from({ length: n }, () => netns.connect("healthy", HEALTHY_PORT)));
      expect(events).toEqual([]);
      // Every stuck request reached the helper before the healthy ones (one channel, in order): the cap is full.
      expect(await connecting(stuck.pid!, STUCK_PORT)).toBe(CONNECTS_PER_NAMESPACE);
      expect(await Promise.all(sockets.map(readAll))).toEqual(Array(n).fill("healthy"));
      const errors = await stuckOnes;
      expect(events).toEqual(Array(n).fill("stuck failed"));
      for (const err of errors) expect(err.message).toMatch(/within/);
      // The helper closed every socket it gave up on.
      for (let i = 0; i < 100 && (await connecting(stuck.pid!, STUCK_PORT)) > 0; i++)
        await new Promise((r) => setTimeout(r, 20));
      expect(await connecting(stuck.pid!, STUCK_PORT)).toBe(0);
    } finally {
      netns.stop();
    }
  });
});
