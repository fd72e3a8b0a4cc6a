// A nats-server that skiff starts never outlives it, and never shares its store
// with another: a skiff killed with SIGKILL takes its server with it, and a
// server left running on the data folder is stopped before a new one starts,
// while processes that merely look alike are left alone.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { afterEach, expect, test } from "vitest";
import { silentLogger } from "../../services/config/logger.js";
import { connectNats, type NatsHandle } from "../../services/nats/connect.js";
import { freePort } from "../../services/nats/cluster-process.js";
import { NATS_SERVER_BINARY } from "../../services/nats/server-process.js";
import { capturingLogger } from "../helpers/logs.js";

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

async function tempDir(): Promise<string> {
  const dir = await mkdtemp(path.join(tmpdir(), "skiff-nats-process-"));
  cleanups.push(() => rm(dir, { recursive: true, force: true }));
  return dir;
}

/** A child process, SIGKILLed after the test if it still runs. */
function child(command: string, args: string[], opts: { stdout?: "pipe" } = {}): ChildProcess {
  const c = spawn(command, args, { stdio: ["ignore", opts.stdout ?? "ignore", "ignore"] });
  cleanups.push(() => {
    if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
  });
  return c;
}

/** The process's command line, "" once it is gone (or a zombie). */
async function cmdline(pid: number): Promise<string> {
  return (await readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => "")).replaceAll("\0", " ").trim();
}

/** Polls until `pid` no longer runs nats-server; false if it still does after `timeoutMs`. */
async function serverGone(pid: number, timeoutMs = 10_000): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (!(await cmdline(pid)).includes(NATS_SERVER_BINARY)) return true;
    await sleep(50);
  }
  return false;
}

async function startedServer(dataDir: string, logger = silentLogger): Promise<NatsHandle> {
  const handle = await connectNats({ probeUrl: `nats://127.0.0.1:${await freePort()}`, dataDir, logger });
  cleanups.push(() => handle.close());
  return handle;
}

test("a skiff killed with SIGKILL takes the nats-server it started with it", async () => {
  const dataDir = await tempDir();
  const probeUrl = `nats://127.0.0.1:${await freePort()}`;
  // A process of its own that connects as skiff does, prints the started server's pid and waits.
  const script = [
    `const { connectNats } = await import(${JSON.stringify(path.resolve("services/nats/connect.ts"))});`,
    `const { silentLogger } = await import(${JSON.stringify(path.resolve("services/config/logger.ts"))});`,
    `const h = await connectNats({ probeUrl: ${JSON.stringify(probeUrl)}, dataDir: ${JSON.stringify(dataDir)}, logger: silentLogger });`,
    `process.stdout.write(h.serverPid + "\\n");`,
    `setInterval(() => {}, 60_000);`,
  ].join("\n");
  const skiff = child(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script], { stdout: "pipe" });
  const serverPid = await new Promise<number>((resolve, reject) => {
    let out = "";
    skiff.stdout!.on("data", (d: Buffer) => {
      out += d.toString();
      if (out.includes("\n")) resolve(Number(out.trim()));
    });
    skiff.once("exit", (code) => reject(new Error(`the child exited with ${code} before it started a server`)));
  });
  expect(await cmdline(serverPid)).toContain(path.join(dataDir, "nats"));
  // Stopped by hand if it survives, so a failing run leaves nothing behind.
  cleanups.push(async () => {
    if ((await cmdline(serverPid)).includes(dataDir)) process.kill(serverPid, "SIGKILL");
  });

  const exited = new Promise((resolve) => skiff.once("exit", resolve));
  skiff.kill("SIGKILL");
  await exited;

  expect(await serverGone(serverPid)).toBe(true);
});

test("a nats-server left running on the data folder is stopped before a new one starts; look-alikes are left alone", async () => {
  const dataDir = await tempDir();
  const natsDir = path.join(dataDir, "nats");
  // A first start writes the config, the seed and the store, as an earlier run would have.
  await (await startedServer(dataDir)).close();

  // A server on that store still running, as an earlier version that died without stopping it leaves one.
  const leftover = child(NATS_SERVER_BINARY, ["-c", path.join(natsDir, "nats-server.conf")]);
  // Processes that must survive: one naming the folder that is not nats-server, one unrelated (a `sleep`), and a
  // nats-server on a store of its own.
  const tail = child("tail", ["-f", path.join(natsDir, "nats-server.conf")]);
  const sleeper = child("sleep", ["60"]);
  const otherDir = await tempDir();
  const other = child(NATS_SERVER_BINARY, ["-a", "127.0.0.1", "-p", "-1", "-js", "-sd", path.join(otherDir, "store")]);
  // The leftover has the store when its ports file appears.
  const portsFile = path.join(natsDir, `${NATS_SERVER_BINARY}_${leftover.pid}.ports`);
  while (leftover.exitCode === null && (await readFile(portsFile, "utf8").catch(() => "")) === "") await sleep(10);
  expect(leftover.exitCode).toBeNull();

  // And the ports file of a server killed outright (SIGKILL leaves it): its pid and port may be anyone's now.
  await writeFile(path.join(natsDir, `${NATS_SERVER_BINARY}_4194303.ports`), '{"nats":["nats://127.0.0.1:1"]}');

  const { logger, lines } = capturingLogger();
  const handle = await startedServer(dataDir, logger);
  expect((await readdir(natsDir)).filter((n) => n.endsWith(".ports"))).toEqual([
    `${NATS_SERVER_BINARY}_${handle.serverPid}.ports`,
  ]);

  expect(await cmdline(leftover.pid!)).not.toContain(NATS_SERVER_BINARY);
  expect(handle.serverPid).not.toBe(leftover.pid);
  expect(await cmdline(handle.serverPid!)).toContain(natsDir);
  expect(lines.filter((l) => l.msg.includes(`stopped a leftover nats-server (pid ${leftover.pid})`))).toHaveLength(1);
  for (const c of [tail, sleeper, other]) {
    expect(c.exitCode).toBeNull();
    expect(c.signalCode).toBeNull();
    expect(await cmdline(c.pid!)).not.toBe("");
  }
  // The new server serves the store.
  await handle.nc.jetstreamManager();
});
