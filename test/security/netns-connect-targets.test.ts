// Where the namespace-connect helper (services/runner/netns-connect.py) may
// connect: only to 127.0.0.1 in the namespace it holds for a replica. Here
// the host has a listener on the same port as an app whose own namespace has
// none; a connect for that app must fail rather than reach the host's
// listener. A key never opened or already closed, the runner's own namespace
// offered as a sandbox's, a port out of range: each is refused, with no
// socket, and the helper goes on serving. Real network namespaces
// (`unshare -n`), as root.
import { spawn, type ChildProcess } from "node:child_process";
import net from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { silentLogger } from "../../services/config/logger.js";
import { NetnsConnector } from "../../services/runner/netns-connect.js";
import { RELAY_PYTHON } from "../../services/runner/replica-factory.js";
import { machineCan } from "../helpers/machine.js";

const usable = machineCan(
  "security/netns-connect-targets",
  process.getuid?.() !== 0 ? "skiff is not root" : RELAY_PYTHON === undefined ? "no python3 for the helper" : undefined,
);

/** An app's namespace with its loopback up and nothing listening; its pid holds the namespace. */
async function emptyNamespace(): Promise<ChildProcess> {
  const child = spawn("unshare", ["-n", "sh", "-c", "ip link set lo up && echo ready && exec sleep 600"], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  await new Promise<void>((resolve, reject) => {
    child.stdout!.on("data", (d: Buffer) => d.toString().includes("ready") && resolve());
    child.once("exit", (code) => reject(new Error(`the namespace's process exited (${code})`)));
  });
  return child;
}

describe.skipIf(!usable)("the namespace-connect helper's targets", () => {
  let app: ChildProcess;
  let host: net.Server;
  let hostPort: number;
  let hostConnections = 0;
  let netns: NetnsConnector;

  beforeAll(async () => {
    app = await emptyNamespace();
    // What the app must never reach: a listener of the host (as the nats-server or skiff itself listens).
    host = net.createServer((s) => {
      hostConnections++;
      s.end("host");
    });
    await new Promise<void>((resolve) => host.listen(0, "127.0.0.1", () => resolve()));
    hostPort = (host.address() as net.AddressInfo).port;
    netns = new NetnsConnector(RELAY_PYTHON!, silentLogger);
    expect(await netns.open("app", app.pid!)).toBeUndefined();
  });
  afterAll(async () => {
    netns?.stop();
    app?.kill("SIGKILL");
    await new Promise((r) => host?.close(r));
  });

  it("a port the app does not listen on is refused in its namespace, never connected on the host", async () => {
    await expect(netns.connect("app", hostPort)).rejects.toThrow(/refused/i);
    expect(hostConnections).toBe(0);
  });

  it("a namespace never opened, or closed, is unknown: nothing is connected from the helper's own", async () => {
    await expect(netns.connect("never-opened", hostPort)).rejects.toThrow(/unknown namespace/);
    expect(await netns.open("closed", app.pid!)).toBeUndefined();
    netns.close("closed");
    await expect(netns.connect("closed", hostPort)).rejects.toThrow(/unknown namespace/);
    expect(hostConnections).toBe(0);
  });

  it("the runner's own namespace is not taken for a sandbox's", async () => {
    expect(await netns.open("own", process.pid)).toMatch(/shares this network namespace/);
    await expect(netns.connect("own", hostPort)).rejects.toThrow(/unknown namespace/);
    expect(hostConnections).toBe(0);
  });

  it("ports out of range and keys of other types are refused, and the helper goes on serving", async () => {
    for (const port of [-1, 65_536, 1e12, Number.NaN])
      await expect(netns.connect("app", port)).rejects.toThrow(/cannot connect/);
    expect(await netns.open("app-again", app.pid!)).toBeUndefined();
    await expect(netns.connect("app-again", hostPort)).rejects.toThrow(/refused/i);
    expect(hostConnections).toBe(0);
  });
});
