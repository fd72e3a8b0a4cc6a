// Disk full on a runner's data folder: SKIFF_DATA_DIR of the runner process
// is a small tmpfs of its own (mounted for the test; the test is skipped,
// saying why, where mount is not allowed), filled to the last byte by a
// file. A deploy then cannot be unpacked there: the runner says why (its log
// and the app's log name ENOSPC), stays up (no exit, no restart), keeps
// serving the app it had, and callers of the new app get a plain 503; once
// space is freed, the next deploy lands.
import { execFileSync } from "node:child_process";
import { mkdir, mkdtemp, readFile, rm, statfs, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { AckPolicy, connect, DeliverPolicy, type NatsConnection } from "nats";
import { afterAll, beforeAll, expect, it, vi } from "vitest";
import { ManagementService } from "../../gen/skiff/management/v2/management_pb.js";
import { bearerAuth } from "../../services/auth/bearer.js";
import { startNatsServer, type TestNats } from "../helpers/nats-server.js";
import { cortexApp, deploy, P } from "../helpers/run-apps.js";
import { machineCan } from "../helpers/machine.js";
import { call, report, spawnSkiff, type SkiffProcess } from "./fleet.js";

const MOUNT_MB = 48;
let tmp: string;
let mountPoint: string;
let mounted = false;
let mountError = "";
let nats: TestNats;
let nc: NatsConnection;
let gateway: SkiffProcess;
let runner: SkiffProcess;
let devToken: string;
let management: ReturnType<typeof createClient<typeof ManagementService>>;

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-faults-disk-"));
  mountPoint = path.join(tmp, "runner-disk");
  await mkdir(mountPoint);
  try {
    execFileSync("mount", ["-t", "tmpfs", "-o", `size=${MOUNT_MB}m,mode=0700`, "tmpfs", mountPoint], {
      stdio: "pipe",
    });
    mounted = true;
  } catch (err) {
    mountError = String((err as { stderr?: Buffer }).stderr ?? err).trim();
    return;
  }
  nats = await startNatsServer();
  nc = await connect({ servers: nats.url });
  const env = { SKIFF_NATS_URL: nats.url };
  gateway = await spawnSkiff({
    name: "gateway",
    roles: "invocation,management",
    dataDir: path.join(tmp, "gateway"),
    env,
  });
  await gateway.start();
  runner = await spawnSkiff({ name: "runner", roles: "runner", dataDir: path.join(mountPoint, "data"), env });
  await runner.start();
  const adminToken = (await readFile(path.join(tmp, "gateway", "admin-token"), "utf8")).trim();
  devToken = (await readFile(path.join(tmp, "gateway", "dev-token"), "utf8")).trim();
  management = createClient(
    ManagementService,
    createConnectTransport({ baseUrl: gateway.url, httpVersion: "1.1", interceptors: [bearerAuth(adminToken)] }),
  );
  await deploy(tmp, management, cortexApp("before", { min_replicas: 1, max_replicas: 1 }));
  await vi.waitUntil(
    async () => (await call(`${gateway.url}/v4/${P}/before/add`, devToken, '{"a":1,"b":2}')).status === 200,
    { timeout: 120_000, interval: 500 },
  );
}, 300_000);

afterAll(async () => {
  await runner?.kill();
  await gateway?.kill();
  await nc?.close();
  await nats?.stop();
  if (mounted) execFileSync("umount", ["-l", mountPoint]);
  await rm(tmp, { recursive: true, force: true });
}, 60_000);

/** The app's log lines (SKIFF_LOGS), as the dashboard and `skiff logs` read them. */
async function appLog(app: string): Promise<string[]> {
  const jsm = await nc.jetstreamManager();
  const ci = await jsm.consumers.add("SKIFF_LOGS", {
    filter_subject: `skiff.logs.${P}.${app}`,
    deliver_policy: DeliverPolicy.All,
    ack_policy: AckPolicy.None,
    mem_storage: true,
    num_replicas: 1,
  });
  try {
    const consumer = await nc.jetstream().consumers.get("SKIFF_LOGS", ci.name);
    const lines: string[] = [];
    const batch = await consumer.fetch({ max_messages: 100, expires: 2_000 });
    for await (const m of batch) lines.push(m.string());
    return lines;
  } finally {
    await jsm.consumers.delete("SKIFF_LOGS", ci.name).catch(() => undefined);
  }
}

it("a runner whose data folder is full: clear errors, no crash loop, the app it had keeps running; a deploy lands once space is freed", async (ctx) => {
  if (!machineCan("faults/disk-full", mounted ? undefined : `a tmpfs cannot be mounted here (${mountError})`))
    ctx.skip();
  const started = Date.now();
  const { bavail, bsize } = await statfs(mountPoint);
  const filler = path.join(mountPoint, "filler");
  // Every block left: the next write of any size fails with ENOSPC.
  await writeFile(filler, Buffer.alloc(Number(bavail) * Number(bsize)));
  const left = await statfs(mountPoint);
  expect(Number(left.bavail)).toBe(0);

  await deploy(tmp, management, cortexApp("after", { max_replicas: 1 }));
  const logged = await vi.waitUntil(
    async () => (await appLog("after")).find((l) => /could not be deployed on this runner/.test(l)),
    { timeout: 60_000, interval: 500 },
  );
  const newApp = await call(`${gateway.url}/v4/${P}/after/add`, devToken, '{"a":1,"b":2}');
  const oldApp = await call(`${gateway.url}/v4/${P}/before/add`, devToken, '{"a":2,"b":2}');
  // Some time for a crash loop to show.
  await new Promise((r) => setTimeout(r, 10_000));
  const exitsWhileFull = [...runner.exits];
  const runnerSays = runner.tail.filter((l) => /ENOSPC|no space left/i.test(l));

  await rm(filler);
  // A new version of the app: the runner prepares it now that there is room.
  await deploy(tmp, management, cortexApp("after", { max_replicas: 1 }));
  const recovered = await vi.waitUntil(
    async () => {
      const c = await call(`${gateway.url}/v4/${P}/after/add`, devToken, '{"a":3,"b":4}');
      return c.status === 200 ? c : undefined;
    },
    { timeout: 120_000, interval: 1_000 },
  );
  report("6. disk full on a runner's data folder", {
    simulated: `SKIFF_DATA_DIR on a ${MOUNT_MB} MiB tmpfs filled to 0 blocks free by one file`,
    appLog: logged,
    runnerLogLinesNamingENOSPC: runnerSays.length,
    newAppCallWhileFull: { status: newApp.status, error: newApp.error },
    oldAppCallWhileFull: oldApp.status,
    runnerExitsWhileFull: exitsWhileFull.length,
    newAppAfterSpaceFreed: recovered.status,
    durationMs: Date.now() - started,
  });
  expect(logged).toMatch(/ENOSPC|no space left/i);
  expect(runnerSays.length).toBeGreaterThan(0);
  expect(exitsWhileFull).toEqual([]);
  expect(runner.alive).toBe(true);
  expect(newApp.status).toBe(503);
  expect(oldApp.status).toBe(200);
}, 600_000);
