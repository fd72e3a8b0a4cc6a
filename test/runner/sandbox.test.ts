// Tenant isolation, tried as a hostile tenant would: an intruder app (Python
// and Node) deployed next to a victim app attacks the platform and the
// victim from inside its sandbox, and every attack fails. Real processes,
// real bwrap sandboxes, a real nats-server. Outbound network (slirp4netns):
// test/runner/sandbox-network.test.ts.
import { cp, mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from "node:fs/promises";
import http from "node:http";
import { networkInterfaces, tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parseAppConfig } from "../../services/apps/app-config.js";
import { silentLogger } from "../../services/config/logger.js";
import { ReplicaCrashed } from "../../services/runs/errors.js";
import type { InvokeRequest } from "../../services/runs/invoke.js";
import { channelPath } from "../../services/runner/replica.js";
import { Runner } from "../../services/runner/runner.js";
import { DEFAULT_SANDBOX_LIMITS, defaultSandbox } from "../../services/runner/sandbox.js";
import { hashedUids } from "../../services/runner/uids.js";
import { skiffToml, type CortexRuntime } from "../helpers/apps.js";
import { startNatsServer, type TestNats } from "../helpers/nats-server.js";
import { hostProcessesWith } from "../helpers/host-processes.js";
import { TEST_ROOT } from "../helpers/paths.js";

const ROOT = path.resolve(TEST_ROOT, "..");
const SANDBOX = defaultSandbox({ limits: { ...DEFAULT_SANDBOX_LIMITS, memoryMb: 1024, fileMb: 8, tmpMb: 16 } });

let tmp: string;
let dataDir: string;
let runner: Runner;
let nats: TestNats;
let skiffPort: http.Server;
const dirs: Record<string, string> = {};

const cortex = (name: string, language: CortexRuntime["language"], entry: string) =>
  parseAppConfig(skiffToml({ name, runtime: { kind: "cortex", language, entry } }));

async function copyApp(fixture: string, name: string): Promise<string> {
  const dir = path.join(dataDir, "deployments", name);
  await cp(path.join(ROOT, "test/fixtures/apps", fixture), dir, { recursive: true });
  dirs[name] = dir;
  return dir;
}

let seq = 0;
function request(fn: string, body: unknown = {}): InvokeRequest {
  return {
    runId: `run-${++seq}`,
    method: "POST",
    path: `/${fn}`,
    query: "",
    headers: {},
    body: new TextEncoder().encode(JSON.stringify(body)),
  };
}

/** Calls a function of an app and gives back its result (the Cortex envelope's). */
async function call(project: string, app: string, fn: string, body: unknown = {}): Promise<any> {
  const res = await runner.invoke(project, app, request(fn, body));
  const env = JSON.parse(Buffer.from(res.body).toString()) as { result?: unknown; error?: unknown };
  if (res.status !== 200) return { status: res.status, ...env };
  return env.result;
}

const py = (fn: string, body: unknown = {}) => call("p-intruder", "intruder", fn, body);
const node = (fn: string, body: unknown = {}) => call("p-intruder-node", "intruder-node", fn, body);

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-sandbox-"));
  dataDir = path.join(tmp, "data");
  await mkdir(dataDir, { recursive: true });
  await writeFile(path.join(dataDir, "admin-token"), "admin-token-that-must-not-leak\n");
  process.env.SKIFF_SANDBOX_TEST_SECRET = "platform-secret-that-must-not-leak";
  nats = await startNatsServer();
  skiffPort = http.createServer((_, res) => res.end("skiff"));
  await new Promise<void>((resolve) => skiffPort.listen(0, "0.0.0.0", resolve));
  runner = new Runner({
    workDir: path.join(dataDir, "replicas"),
    logger: silentLogger,
    startTimeoutMs: 20_000,
    sandbox: SANDBOX,
  });
  await runner.deploy({
    projectId: "p-victim",
    appName: "victim",
    version: 1,
    dir: await copyApp("intruder-py", "victim"),
    config: parseAppConfig(
      skiffToml({
        name: "victim",
        runtime: { kind: "cortex", language: "python", entry: "main.py" },
        env: { SECRET: "victim-secret-that-must-not-leak" },
        scaling: { min_replicas: 1 },
      }),
    ),
  });
  await runner.deploy({
    projectId: "p-intruder",
    appName: "intruder",
    version: 1,
    dir: await copyApp("intruder-py", "intruder"),
    config: cortex("intruder", "python", "main.py"),
  });
  await runner.deploy({
    projectId: "p-intruder-node",
    appName: "intruder-node",
    version: 1,
    dir: await copyApp("intruder-node", "intruder-node"),
    config: cortex("intruder-node", "node", "index.mjs"),
  });
  expect(await call("p-victim", "victim", "ping")).toBe("pong");
}, 60_000);

afterAll(async () => {
  delete process.env.SKIFF_SANDBOX_TEST_SECRET;
  await runner?.close();
  await nats?.stop();
  skiffPort?.close();
  await rm(tmp, { recursive: true, force: true });
});

describe("sandbox - a hostile tenant reaches nothing of the platform or of other tenants", () => {
  it("runs as its project's own unprivileged uid, in /app, as the first processes of its own pid namespace", async () => {
    const me = await py("whoami");
    // A Runner without a registry gives projects hashedUids' uids.
    const projectUid = hashedUids.projectUid;
    expect(me).toMatchObject({ uid: await projectUid("p-intruder"), cwd: "/app", home: "/app" });
    expect(me.uid).not.toBe(0);
    expect(me.pid).toBeLessThan(10);
    const victim = await call("p-victim", "victim", "whoami");
    expect(victim.uid).toBe(await projectUid("p-victim"));
    expect(victim.uid).not.toBe(me.uid);
    expect((await node("whoami")).uid).toBe(await projectUid("p-intruder-node"));
  });

  it("token files and SKIFF_DATA_DIR: neither by a relative path nor by the host's path", async () => {
    for (const p of [
      "../admin-token",
      "../../admin-token",
      "../../../../../../admin-token",
      path.join(dataDir, "admin-token"),
      path.join(dirs.victim, "main.py"),
      path.join(ROOT, "package.json"),
      "/etc/shadow",
      "/etc/passwd",
      "/root/.bash_history",
    ]) {
      expect(await py("read", { path: p }), p).toMatchObject({ ok: false });
      expect(await node("read", { path: p }), p).toMatchObject({ ok: false });
    }
    expect(await py("listdir", { path: "/" })).toMatchObject({ ok: true });
    const top = (await py("listdir", { path: "/" })).names as string[];
    expect(top).not.toContain("work");
    expect(top).not.toContain(path.basename(tmp));
    // Its own deployment it does read.
    expect((await py("read", { path: "/app/main.py" })).data).toContain("hostile tenant");
  });

  it("/proc: only its own processes; skiff's and the victim's environment stay out of reach", async () => {
    for (const env of [await py("environs"), await node("environs")]) {
      const pids = Object.keys(env).map(Number);
      expect(pids.length).toBeLessThan(6);
      expect(pids).not.toContain(process.pid);
      const all = JSON.stringify(env);
      expect(all).not.toContain("platform-secret-that-must-not-leak");
      expect(all).not.toContain("victim-secret-that-must-not-leak");
    }
    expect(await py("read", { path: `/proc/${process.pid}/environ` })).toMatchObject({ ok: false });
    const victimPid = runner.replicas("p-victim", "victim")[0].pid!;
    expect(await py("read", { path: `/proc/${victimPid}/environ` })).toMatchObject({ ok: false });
  });

  it("network: not NATS, not skiff's port, not the host's other addresses", async () => {
    const hostAddresses = Object.values(networkInterfaces())
      .flat()
      .filter((a) => a && a.family === "IPv4")
      .map((a) => a!.address);
    const targets: [string, number][] = [
      ["127.0.0.1", nats.port],
      ["127.0.0.1", (skiffPort.address() as { port: number }).port],
      ...hostAddresses.map((a): [string, number] => [a, (skiffPort.address() as { port: number }).port]),
      ...hostAddresses.map((a): [string, number] => [a, nats.port]),
    ];
    for (const [host, port] of targets) {
      expect(await py("connect", { host, port }), `${host}:${port}`).toMatchObject({ ok: false });
      expect(await node("connect", { host, port }), `${host}:${port}`).toMatchObject({ ok: false });
    }
  });

  it("another replica's channel: its socket is not in the sandbox", async () => {
    const replica = runner.replicas("p-victim", "victim")[0].replicaId;
    const channel = channelPath(path.join(dataDir, "replicas", "p-victim", "victim", replica), replica);
    await expect(stat(channel).then((st) => st.isSocket())).resolves.toBe(true);
    expect(await py("connect_unix", { path: channel })).toMatchObject({ ok: false });
    expect(await node("connect", { path: channel })).toMatchObject({ ok: false });
  });

  it("writes: not its own deployment, not the shim, not another deployment", async () => {
    const victimBefore = await readFile(path.join(dirs.victim, "main.py"), "utf8");
    const shimBefore = await readFile(path.join(ROOT, "services/runner/shims/cortex.py"), "utf8");
    for (const p of ["/app/main.py", "/skiff/cortex.py", "/skiff/cortex.mjs", path.join(dirs.victim, "main.py")]) {
      expect(await py("write", { path: p }), p).toMatchObject({ ok: false });
    }
    expect(await node("write", { path: "/app/index.mjs" })).toMatchObject({ ok: false });
    expect(await readFile(path.join(dirs.victim, "main.py"), "utf8")).toBe(victimBefore);
    expect(await readFile(path.join(ROOT, "services/runner/shims/cortex.py"), "utf8")).toBe(shimBefore);
    // New files next to its deployment, in its own writable /app, are its own business.
    expect(await py("write", { path: "/app/notes.txt" })).toMatchObject({ ok: true });
    expect(await readdir(dirs.intruder)).not.toContain("notes.txt");
  });

  it("memory and disk bombs fail inside the sandbox; the victim keeps serving", async () => {
    const mem = await py("memory_bomb");
    expect(mem).toMatchObject({ status: 500, error: { type: "MemoryError" } });
    // One file past SKIFF_REPLICA_FILE_MB (8 here): EFBIG (Python ignores SIGXFSZ).
    expect(await py("disk_bomb", { path: "/tmp/bomb", mb: 64 })).toMatchObject({ ok: false, error: "EFBIG" });
    // Many files within it, past the tmpfs size (16 here): ENOSPC.
    expect(await py("fill", { folder: "/tmp", mb: 64 })).toMatchObject({ ok: false, error: "ENOSPC" });
    expect(await py("fill", { folder: "/app", mb: 64 })).toMatchObject({ ok: false, error: "ENOSPC" });
    expect(await call("p-victim", "victim", "ping")).toBe("pong");
  });

  it("a Node replica that writes past the file size limit gets EFBIG; it and others keep serving", async () => {
    const res = await node("diskBomb", { path: "/tmp/bomb", mb: 12 });
    expect(res).toMatchObject({ status: 500, error: { message: expect.stringContaining("EFBIG") } });
    expect(await call("p-victim", "victim", "ping")).toBe("pong");
    expect(await node("ping")).toBe("pong");
  });

  it("a Node replica that exhausts its memory is stopped with a clear error; others serve", async () => {
    const err = await node("memoryBomb").catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ReplicaCrashed);
    expect((err as Error).message, (err as Error).message).toMatch(/out of memory.*SKIFF_REPLICA_MEMORY_MB/);
    expect(await call("p-victim", "victim", "ping")).toBe("pong");
  }, 60_000);

  it("a setsid orphan dies with its replica, and stopping does not wait for it", async () => {
    const marker = `3600.${Date.now() % 100000}${Math.floor(Math.random() * 1000)}`;
    expect(await py("orphan", { marker })).toMatchObject({ ok: true });
    await expect.poll(() => hostProcessesWith(marker), { timeout: 30_000 }).toHaveLength(1);
    await runner.remove("p-intruder", "intruder");
    // Gone with the sandbox's pid namespace (the kernel may take a moment to release it under load).
    await expect.poll(() => hostProcessesWith(marker), { timeout: 3000 }).toEqual([]);
    expect(await call("p-victim", "victim", "ping")).toBe("pong");
  });
});

describe("sandbox off (SKIFF_SANDBOX=off): apps still run, unconfined", () => {
  it("a Custom and a Cortex app serve on 127.0.0.1 ports from a copy of their folder", async () => {
    const off = new Runner({
      workDir: path.join(tmp, "off"),
      logger: silentLogger,
      startTimeoutMs: 20_000,
      sandbox: { ...SANDBOX, enabled: false },
    });
    try {
      const dir = path.join(tmp, "off-app");
      await cp(path.join(ROOT, "test/fixtures/apps/intruder-py"), dir, { recursive: true });
      await off.deploy({
        projectId: "p-off",
        appName: "off",
        version: 1,
        dir,
        config: cortex("off", "python", "main.py"),
      });
      const res = await off.invoke("p-off", "off", request("whoami"));
      const me = JSON.parse(Buffer.from(res.body).toString()).result;
      expect(me.uid).toBe(process.getuid!());
      expect(me.cwd).toContain(path.join(tmp, "off"));
      const behave = parseAppConfig(
        `[app]\nname = "b"\n[runtime]\nkind = "custom"\ncommand = ["node", "server.mjs"]\n`,
      );
      await off.deploy({
        projectId: "p-off",
        appName: "b",
        version: 1,
        dir: path.join(ROOT, "test/fixtures/apps/behave"),
        config: behave,
      });
      const health = await off.invoke("p-off", "b", { ...request("health"), method: "GET", body: new Uint8Array() });
      expect(health.status).toBe(200);
    } finally {
      await off.close();
    }
  });
});
