// Persistent storage when skiff dies: kill -9 of the process leaves nothing
// mounted and no loop device attached (the sandboxes die with it and the
// kernel lets the device go), and skiff started again on the same data folder
// finds what the app wrote.
import { execFileSync } from "node:child_process";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { createClient, type Client } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { ManagementService } from "../../gen/skiff/management/v2/management_pb.js";
import { bearerAuth } from "../../services/auth/bearer.js";
import { packApp } from "../../services/apps/bundle.js";
import { spawnSkiff, type SkiffProcess } from "../faults/fleet.js";
import { skiffToml, writeApp } from "../helpers/apps.js";
import { machineCan } from "../helpers/machine.js";
import { startNatsServer, type TestNats } from "../helpers/nats-server.js";
import { post } from "../helpers/run-apps.js";

const MAIN = `def write(text: str):
    with open("/persistent-storage/kept.txt", "w") as f:
        f.write(text)
    return "written"


def read():
    with open("/persistent-storage/kept.txt") as f:
        return f.read()
`;

const loopsOf = (file: string) =>
  execFileSync("/usr/sbin/losetup", ["-j", file], { encoding: "utf8" }).split("\n").filter(Boolean);

const isRoot = process.getuid?.() === 0;

describe.skipIf(!machineCan("persistent storage crash test", isRoot ? undefined : "it needs root (a loop device)"))(
  "persistent storage - kill -9",
  () => {
    let tmp: string;
    let nats: TestNats;
    let skiff: SkiffProcess;
    let token: string;
    let management: Client<typeof ManagementService>;

    beforeAll(async () => {
      tmp = await mkdtemp(path.join(tmpdir(), "skiff-storage-crash-"));
      nats = await startNatsServer();
      skiff = await spawnSkiff({ name: "skiff", dataDir: path.join(tmp, "data"), env: { SKIFF_NATS_URL: nats.url } });
      await skiff.start();
      token = (await readFile(path.join(tmp, "data", "admin-token"), "utf8")).trim();
      management = createClient(
        ManagementService,
        createConnectTransport({ baseUrl: skiff.url, httpVersion: "1.1", interceptors: [bearerAuth(token)] }),
      );
      const dir = await writeApp(tmp, {
        "skiff.toml": skiffToml({
          name: "keeper",
          runtime: { kind: "cortex", language: "python", entry: "main.py" },
          scaling: { min_replicas: 1 },
        }),
        "main.py": MAIN,
      });
      await management.deployApp({
        projectId: "p-dev",
        bundle: { contentType: "application/gzip", data: (await packApp(dir)).bytes },
      });
    }, 180_000);
    afterAll(async () => {
      await skiff?.kill();
      await nats?.stop();
      await rm(tmp, { recursive: true, force: true });
    }, 60_000);

    it("leaves no mount and no loop device behind, and the data is there after a restart", async () => {
      const call = (fn: string, body: unknown = {}) =>
        post(`${skiff.url}/v4/p-dev/keeper/${fn}`, token, JSON.stringify(body));
      await vi.waitUntil(async () => (await call("write", { text: "before the crash" })).status === 200, {
        timeout: 120_000,
        interval: 500,
      });
      const image = path.join(tmp, "data", "storage", "p-dev.img");
      expect(loopsOf(image)).toHaveLength(1);

      // Only skiff's own process: its sandboxes must end with it.
      process.kill(skiff.pid, "SIGKILL");
      await skiff.kill();
      await vi.waitUntil(() => loopsOf(image).length === 0, { timeout: 30_000, interval: 200 });
      expect(await readFile("/proc/self/mountinfo", "utf8")).not.toContain(tmp);

      await skiff.start();
      await vi.waitUntil(async () => (await call("read")).status === 200, { timeout: 120_000, interval: 500 });
      expect((await call("read")).json.result).toBe("before the crash");
    }, 300_000);
  },
);
