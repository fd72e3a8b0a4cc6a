// A JetStream cluster of three local nodes (nats/cluster-process.ts), as
// `npm run cluster` starts it: skiff's streams and buckets get three copies
// with SKIFF_NATS_REPLICAS=3, and survive one node's crash.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { connect, type NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { silentLogger } from "../../services/config/logger.js";
import { startNatsCluster, type NatsCluster } from "../../services/nats/cluster-process.js";
import { buckets, streams } from "../../services/nats/layout.js";
import { provision } from "../../services/nats/provision.js";

let dir: string;
let cluster: NatsCluster;
let nc: NatsConnection;

beforeAll(async () => {
  dir = await mkdtemp(path.join(tmpdir(), "skiff-cluster-"));
  cluster = await startNatsCluster({ dir });
  nc = await connect({ servers: cluster.url.split(","), user: cluster.user, pass: cluster.password });
}, 60_000);
afterAll(async () => {
  await nc?.close();
  await cluster?.stop();
  await rm(dir, { recursive: true, force: true });
});

describe("a three-node JetStream cluster", () => {
  it("admits only its user", async () => {
    await expect(connect({ servers: cluster.nodes[0].url })).rejects.toThrow(/Authorization/i);
  });

  it("provisioning with three replicas puts every stream and bucket on three nodes, and is idempotent", async () => {
    await provision(nc, silentLogger, { replicas: 3 });
    await provision(nc, silentLogger, { replicas: 3 });
    const jsm = await nc.jetstreamManager();
    for (const name of [streams.runs.name, streams.events.name, `KV_${buckets.runs.name}`]) {
      const info = await jsm.streams.info(name);
      expect(info.config.num_replicas).toBe(3);
      expect(info.cluster?.replicas ?? []).toHaveLength(2);
    }
  }, 60_000);

  it("with one node killed, an acknowledged publish and a KV write still succeed; the node comes back and catches up", async () => {
    const js = nc.jetstream();
    const victim = cluster.nodes[2];
    await victim.kill();
    // The client may have been on the killed node: it reconnects to another, and the streams it led elect a new leader.
    const put = await vi.waitUntil(
      async () => {
        try {
          const kv = await js.views.kv(buckets.runs.name, { bindOnly: true });
          return await kv.put("p.a.r1", new TextEncoder().encode("x"));
        } catch {
          return undefined;
        }
      },
      { timeout: 60_000, interval: 250 },
    );
    expect(put).toBeGreaterThan(0);
    await victim.start();
    await vi.waitUntil(
      async () => {
        const info = await nc
          .jetstreamManager()
          .then((jsm) => jsm.streams.info(`KV_${buckets.runs.name}`))
          .catch(() => undefined);
        return (info?.cluster?.replicas ?? []).length === 2 && info!.cluster!.replicas!.every((r) => r.current);
      },
      { timeout: 60_000, interval: 250 },
    );
  }, 90_000);
});
