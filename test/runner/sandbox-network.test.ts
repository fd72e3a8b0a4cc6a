// Outbound network of replicas (SKIFF_REPLICA_NETWORK=slirp4netns), tried
// from inside a real sandbox against real listeners: a machine outside the
// host (a network namespace of its own behind a veth pair) is reached; the
// host itself is not, at any of its addresses (127.0.0.1, slirp4netns's
// 10.0.2.2, eth0's, the veth's), nor a range of SKIFF_REPLICA_DENIED_CIDRS,
// and the app cannot lift the refusal. Needs root (to make the outside
// machine) and slirp4netns.
import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { cp, mkdtemp, rm } from "node:fs/promises";
import net from "node:net";
import { networkInterfaces, tmpdir } from "node:os";
import path from "node:path";
import { createInterface } from "node:readline";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parseAppConfig } from "../../services/apps/app-config.js";
import { silentLogger } from "../../services/config/logger.js";
import { Runner } from "../../services/runner/runner.js";
import { DEFAULT_SANDBOX_LIMITS, type SandboxOptions } from "../../services/runner/sandbox.js";
import { slirpPath } from "../../services/runner/sandbox-network.js";
import { configureSandbox } from "../../services/runner/sandbox-setup.js";
import { skiffToml } from "../helpers/apps.js";
import { machineCan } from "../helpers/machine.js";
import { TEST_ROOT } from "../helpers/paths.js";

const ROOT = path.resolve(TEST_ROOT, "..");
const usable = machineCan(
  "sandbox-network",
  process.getuid?.() !== 0 ? "skiff is not root" : slirpPath() === undefined ? "no slirp4netns" : undefined,
);
const NS = `skt${process.pid}`;
const HOST_IF = `skt${process.pid}h`;
// 10.213.N.0/29: the host's side .1, the outside machine .2 (reachable) and .3 (a denied range).
const NET = `10.213.${process.pid % 250}`;
const OUTSIDE = `${NET}.2`;
const DENIED = `${NET}.3`;

let tmp: string;
let runner: Runner;
let configured: SandboxOptions;
let outsideServer: ChildProcess | undefined;
let outsidePort: number;
let hostListener: net.Server;
let hostPort: number;
let seq = 0;

const ip = (...args: string[]) => execFileSync("ip", args, { stdio: ["ignore", "ignore", "pipe"] });

async function py(fn: string, body: unknown): Promise<{ ok: boolean; error?: string; stderr?: string }> {
  const res = await runner.invoke("p-net", "net", {
    runId: `net-${++seq}`,
    method: "POST",
    path: `/${fn}`,
    query: "",
    headers: {},
    body: new TextEncoder().encode(JSON.stringify(body)),
  });
  return JSON.parse(Buffer.from(res.body).toString()).result;
}

describe.skipIf(!usable)("outbound network (SKIFF_REPLICA_NETWORK=slirp4netns)", () => {
  beforeAll(async () => {
    tmp = await mkdtemp(path.join(tmpdir(), "skiff-sandbox-net-"));
    ip("netns", "add", NS);
    ip("link", "add", HOST_IF, "type", "veth", "peer", "name", "eth0", "netns", NS);
    ip("addr", "add", `${NET}.1/29`, "dev", HOST_IF);
    ip("link", "set", HOST_IF, "up");
    for (const a of [OUTSIDE, DENIED]) ip("-n", NS, "addr", "add", `${a}/29`, "dev", "eth0");
    ip("-n", NS, "link", "set", "eth0", "up");
    ip("-n", NS, "link", "set", "lo", "up");
    // The outside machine: a listener on every address of its own namespace.
    outsideServer = spawn(
      "ip",
      [
        "netns",
        "exec",
        NS,
        "python3",
        "-c",
        "import socket\ns=socket.create_server(('0.0.0.0',0))\nprint(s.getsockname()[1],flush=True)\n" +
          "while True:\n  c,_=s.accept()\n  c.close()",
      ],
      { stdio: ["ignore", "pipe", "inherit"] },
    );
    outsidePort = Number(
      await new Promise<string>((resolve) => createInterface({ input: outsideServer!.stdout! }).once("line", resolve)),
    );
    // The host: a listener on every address of the host, as a NATS or PostgreSQL bound to 0.0.0.0 would be.
    hostListener = net.createServer((s) => s.destroy());
    await new Promise<void>((resolve) => hostListener.listen(0, "0.0.0.0", resolve));
    hostPort = (hostListener.address() as net.AddressInfo).port;

    configured = configureSandbox(
      {
        sandbox: "on",
        replicaMemoryMb: 1024,
        replicaPids: DEFAULT_SANDBOX_LIMITS.pids,
        replicaFileMb: 8,
        replicaTmpMb: 16,
        replicaCpuSeconds: 0,
        replicaOpenFiles: 4096,
        replicaNetwork: "slirp4netns",
        replicaDeniedCidrs: [`${DENIED}/32`],
      },
      silentLogger,
    );
    runner = new Runner({
      workDir: path.join(tmp, "replicas"),
      logger: silentLogger,
      startTimeoutMs: 20_000,
      sandbox: {
        enabled: true,
        limits: { ...DEFAULT_SANDBOX_LIMITS, memoryMb: 1024, fileMb: 8, tmpMb: 16 },
        network: "slirp4netns",
        host: configured.host,
      },
    });
    const dir = path.join(tmp, "app");
    await cp(path.join(ROOT, "test/fixtures/apps/intruder-py"), dir, { recursive: true });
    await runner.deploy({
      projectId: "p-net",
      appName: "net",
      version: 1,
      dir,
      config: parseAppConfig(
        skiffToml({ name: "net", runtime: { kind: "cortex", language: "python", entry: "main.py" } }),
      ),
    });
  }, 60_000);

  afterAll(async () => {
    await runner?.close();
    outsideServer?.kill("SIGKILL");
    hostListener?.close();
    for (const args of [
      ["netns", "del", NS],
      ["link", "del", HOST_IF],
    ]) {
      try {
        ip(...args);
      } catch {
        // already gone (deleting the namespace takes the veth pair with it)
      }
    }
    await rm(tmp, { recursive: true, force: true });
  });

  it("reaches a machine outside the host", async () => {
    expect(await py("connect", { host: OUTSIDE, port: outsidePort })).toMatchObject({ ok: true });
  });

  it("does not reach the host at any of its addresses, a listener on 0.0.0.0 included", async () => {
    const hostAddresses = Object.values(networkInterfaces())
      .flat()
      .filter((a) => a && a.family === "IPv4" && !a.internal)
      .map((a) => a!.address);
    expect(hostAddresses).toContain(`${NET}.1`);
    expect(hostAddresses.length).toBeGreaterThan(1); // eth0's too
    for (const host of hostAddresses)
      expect(await py("connect", { host, port: hostPort }), host).toMatchObject({ ok: false, error: "EACCES" });
    // The host's loopback, directly and through slirp4netns's gateway address.
    for (const host of ["127.0.0.1", "10.0.2.2"])
      expect(await py("connect", { host, port: hostPort }), host).toMatchObject({ ok: false });
  });

  it("does not reach SKIFF_REPLICA_DENIED_CIDRS", async () => {
    expect(configured.host.deniedDestinations()).toContain(`${DENIED}/32`);
    expect(await py("connect", { host: DENIED, port: outsidePort })).toMatchObject({ ok: false, error: "EACCES" });
  });

  it("cannot lift the refusal: no capability over its network namespace", async () => {
    for (const argv of [
      ["ip", "rule", "del", "priority", "100"],
      ["ip", "route", "add", `${NET}.1/32`, "dev", "tap0"],
    ]) {
      const done = await py("command", { argv });
      expect(done, argv.join(" ")).toMatchObject({ ok: false });
      expect(done.stderr).toMatch(/Operation not permitted/);
    }
    expect(await py("connect", { host: `${NET}.1`, port: hostPort })).toMatchObject({ ok: false, error: "EACCES" });
  });
});
