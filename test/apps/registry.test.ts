// The app registry (services/apps/registry.ts): the in-memory view of KV
// skiff-apps that the gateway answers from. lookup() reads KV when the view
// does not have an app yet, so a call right after its deploy finds the app
// even while the watch is behind; a missing app is still not found.
import { connect, type NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parseAppConfig } from "../../services/apps/app-config.js";
import { AppRegistry, appKey, type AppRecord } from "../../services/apps/registry.js";
import { silentLogger } from "../../services/config/logger.js";
import { provision } from "../../services/nats/connect.js";
import { buckets } from "../../services/nats/layout.js";
import { skiffToml } from "../helpers/apps.js";
import { startNatsServer, type TestNats } from "../helpers/nats-server.js";

let nats: TestNats;
let nc: NatsConnection;

function record(version: number): AppRecord {
  const deployment = {
    version,
    created_at: new Date().toISOString(),
    bundle_bytes: 1,
    digest: "d".repeat(64),
    created_by: "admin",
    object: `bundle-${version}`,
  };
  return {
    project_id: "p-reg",
    app_name: "late",
    config: parseAppConfig(skiffToml({ name: "late", runtime: { kind: "custom", command: ["node", "s.mjs"] } })),
    deployment,
    deployments: [deployment],
    created_at: deployment.created_at,
    updated_at: new Date(Date.now() + version).toISOString(),
  };
}

beforeAll(async () => {
  nats = await startNatsServer();
  nc = await connect({ servers: nats.url });
  await provision(nc, silentLogger);
});

afterAll(async () => {
  await nc?.close();
  await nats?.stop();
});

describe("AppRegistry.lookup", () => {
  it("finds an app KV has and the view does not yet (its watch stopped here, as a loaded one lags); a missing or malformed name is not found", async () => {
    const registry = await AppRegistry.start(nc, silentLogger);
    registry.close(); // the watch ends: from here on only lookup() reads KV
    const kv = await nc.jetstream().views.kv(buckets.apps.name, { bindOnly: true });
    await kv.put(appKey("p-reg", "late"), JSON.stringify(record(1)));
    await kv.put(appKey("p-reg", "late"), JSON.stringify(record(2)));
    expect(registry.get("p-reg", "late")).toBeUndefined();
    expect((await registry.lookup("p-reg", "late"))?.deployment.version).toBe(2);
    expect(registry.get("p-reg", "late")?.deployment.version).toBe(2);
    expect(await registry.lookup("p-reg", "missing")).toBeUndefined();
    expect(await registry.lookup("p-reg", "a b*>")).toBeUndefined();
  });

  it("after a lookup the watch keeps the view current: a later version replaces the one lookup read", async () => {
    const registry = await AppRegistry.start(nc, silentLogger);
    try {
      const kv = await nc.jetstream().views.kv(buckets.apps.name, { bindOnly: true });
      await kv.put(appKey("p-reg", "late"), JSON.stringify(record(3)));
      expect((await registry.lookup("p-reg", "late"))?.deployment.version).toBeGreaterThanOrEqual(2);
      // Whatever order the watch and lookup() saw them in, the view ends at the newest.
      await expect.poll(() => registry.get("p-reg", "late")?.deployment.version).toBe(3);
    } finally {
      registry.close();
    }
  });
});
