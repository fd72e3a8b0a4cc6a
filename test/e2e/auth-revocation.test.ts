// Revocation across processes: a second skiff OS process, sharing only NATS,
// stops accepting a deleted service account's token once it is deleted,
// although it had that token verified and cached. How fast is the bench's
// to say (`revocation_ms` in bench/results/latest.json), not a test's.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { createInterface } from "node:readline";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";
import { SKIFF_SERVER, TEST_ROOT } from "../helpers/paths.js";

const root = path.join(TEST_ROOT, "..");

function serveUrl(child: ChildProcess): Promise<string> {
  return new Promise((resolve, reject) => {
    createInterface({ input: child.stdout! }).on("line", (text) => {
      try {
        const line = JSON.parse(text);
        if (typeof line.url === "string" && line.url.startsWith("http")) resolve(line.url);
      } catch {
        // not a log line
      }
    });
    child.once("exit", (code) => reject(new Error(`second process exited with ${code}`)));
  });
}

describe("revocation across processes", () => {
  let t: TestSkiff;
  let child: ChildProcess;
  let secondUrl: string;
  let secondData: string;

  beforeAll(async () => {
    t = await startTestSkiff();
    secondData = await mkdtemp(path.join(tmpdir(), "skiff-second-"));
    child = spawn(process.execPath, [SKIFF_SERVER, "--roles", "management"], {
      cwd: root,
      env: {
        PATH: process.env.PATH,
        HOME: process.env.HOME,
        CI: "1",
        SKIFF_NATS_URL: t.nats.url,
        SKIFF_PORT: "0",
        SKIFF_DATA_DIR: secondData,
      },
      stdio: ["ignore", "pipe", "inherit"],
    });
    secondUrl = await serveUrl(child);
  });
  afterAll(async () => {
    if (child && child.exitCode === null) {
      const exited = new Promise((r) => child.once("exit", r));
      child.kill("SIGTERM");
      await exited;
    }
    await t?.close();
    await rm(secondData, { recursive: true, force: true });
  });

  const status = async (url: string, token: string) =>
    (await fetch(`${url}/v2/projects/p-dev/service-accounts`, { headers: { authorization: `Bearer ${token}` } }))
      .status;

  it("a token created in one process works in the other at once (KV fallback), and is refused there after its DELETE", async () => {
    const admin = t.management();
    const created = await admin.createServiceAccount({
      projectId: "p-dev",
      name: "two-process",
      expiresAt: { seconds: BigInt(Math.floor(Date.now() / 1000) + 3600) },
    });
    // Right after creation: the second process may not have seen the watch update yet.
    expect(await status(secondUrl, created.token)).toBe(200);
    // Warm: the second process now holds the token verified in its cache.
    for (let i = 0; i < 5; i++) expect(await status(secondUrl, created.token)).toBe(200);

    const del = await fetch(`${t.url}/v2/projects/p-dev/service-accounts/${created.serviceAccount!.serviceAccountId}`, {
      method: "DELETE",
      headers: { authorization: `Bearer ${t.adminToken}` },
    });
    expect(del.status).toBe(200);
    await vi.waitUntil(async () => (await status(secondUrl, created.token)) === 401, { timeout: 30_000, interval: 5 });
    // And it stays refused.
    expect(await status(secondUrl, created.token)).toBe(401);
  });
});
