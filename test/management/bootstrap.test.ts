// First start of the management role: the admin token file, SKIFF_ADMIN_TOKEN,
// project p-dev with its dev token, restarts and concurrent starts.
import { mkdtemp, readFile, rm, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { Writable } from "node:stream";
import { connect } from "nats";
import { pino } from "pino";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { buckets } from "../../services/nats/layout.js";
import { startNatsServer, type TestNats } from "../helpers/nats-server.js";
import { startTestSkiff } from "../helpers/skiff.js";

const DAY_MS = 86_400_000;

describe("bootstrap", () => {
  let nats: TestNats;
  let dataDir: string;
  beforeEach(async () => {
    nats = await startNatsServer();
    dataDir = await mkdtemp(path.join(tmpdir(), "skiff-boot-"));
  });
  afterEach(async () => {
    await nats?.stop();
    await rm(dataDir, { recursive: true, force: true });
  });

  const identity = async (url: string, token: string) => {
    const res = await fetch(`${url}/v2/identity`, { headers: { authorization: `Bearer ${token}` } });
    return { status: res.status, body: (await res.json()) as Record<string, string> };
  };

  it("writes admin-token and dev-token with mode 0600, logs where they are and never what they hold", async () => {
    let log = "";
    const sink = new Writable({ write: (c, _e, done) => ((log += c.toString()), done()) });
    const t = await startTestSkiff({ nats, dataDir, logger: pino({ level: "info" }, sink) });
    try {
      for (const file of ["admin-token", "dev-token"])
        expect((await stat(path.join(dataDir, file))).mode & 0o777, file).toBe(0o600);
      expect(t.adminToken).toMatch(/^skiff_admin_[A-Za-z0-9_-]{43}$/);
      expect(await identity(t.url, t.adminToken)).toMatchObject({ status: 200, body: { kind: "admin" } });
      const dev = await identity(t.url, t.devToken);
      expect(dev).toMatchObject({
        status: 200,
        body: { kind: "service_account", project_id: "p-dev", service_account_id: "sa-dev" },
      });
      const left = Date.parse(dev.body.expires_at) - Date.now();
      expect(left).toBeGreaterThan(29 * DAY_MS);
      expect(left).toBeLessThanOrEqual(30 * DAY_MS);
      const started = log
        .split("\n")
        .filter(Boolean)
        .map((l) => JSON.parse(l))
        .find((l) => l.adminTokenFile);
      expect(started).toMatchObject({
        adminTokenFile: path.join(dataDir, "admin-token"),
        devTokenFile: path.join(dataDir, "dev-token"),
      });
      expect(log).not.toContain(t.adminToken);
      expect(log).not.toContain(t.devToken);
    } finally {
      await t.close();
    }
  });

  it("a restart keeps the admin token and the dev token", async () => {
    const first = await startTestSkiff({ nats, dataDir });
    await first.close();
    const second = await startTestSkiff({ nats, dataDir });
    try {
      expect(second.adminToken).toBe(first.adminToken);
      expect(second.devToken).toBe(first.devToken);
      expect((await identity(second.url, first.adminToken)).status).toBe(200);
    } finally {
      await second.close();
    }
  });

  it("concurrent first starts agree on one admin token and one signing key", async () => {
    const [a, b] = await Promise.all([startTestSkiff({ nats, dataDir }), startTestSkiff({ nats, dataDir })]);
    try {
      expect(a.adminToken).toBe(b.adminToken);
      for (const t of [a, b]) {
        expect((await identity(t.url, a.adminToken)).status).toBe(200);
        // Each one's dev token verifies on the other: same key, same account.
        expect((await identity(t.url, a.devToken)).status).toBe(200);
        expect((await identity(t.url, b.devToken)).status).toBe(200);
      }
    } finally {
      await Promise.all([a.close(), b.close()]);
    }
  });

  it("SKIFF_ADMIN_TOKEN replaces the admin token file and works in another process that does not have it", async () => {
    const adminToken = "a-long-admin-token-chosen-by-the-operator-0123456789";
    const a = await startTestSkiff({ nats, dataDir, env: { SKIFF_ADMIN_TOKEN: adminToken } });
    const b = await startTestSkiff({ nats });
    try {
      await expect(stat(path.join(dataDir, "admin-token"))).rejects.toMatchObject({ code: "ENOENT" });
      expect((await identity(a.url, adminToken)).status).toBe(200);
      expect((await identity(b.url, adminToken)).status).toBe(200);
    } finally {
      await Promise.all([a.close(), b.close()]);
    }
  });

  it("the dev account is renewed for 30 days when fewer than 7 are left", async () => {
    const first = await startTestSkiff({ nats, dataDir });
    await first.close();
    const nc = await connect({ servers: nats.url });
    try {
      const kv = await nc.jetstream().views.kv(buckets.serviceAccounts.name, { bindOnly: true });
      const record = (await kv.get("p-dev.sa-dev"))!.json<Record<string, string>>();
      await kv.put(
        "p-dev.sa-dev",
        JSON.stringify({ ...record, expires_at: new Date(Date.now() + 3 * DAY_MS).toISOString() }),
      );
    } finally {
      await nc.close();
    }
    await new Promise((r) => setTimeout(r, 1_100)); // expiries are whole seconds: renew in a later one
    const second = await startTestSkiff({ nats, dataDir });
    try {
      expect(second.devToken).not.toBe(first.devToken);
      const dev = await identity(second.url, second.devToken);
      expect(dev.status).toBe(200);
      expect(Date.parse(dev.body.expires_at) - Date.now()).toBeGreaterThan(29 * DAY_MS);
      expect((await readFile(path.join(dataDir, "dev-token"), "utf8")).trim()).toBe(second.devToken);
    } finally {
      await second.close();
    }
  });
});
