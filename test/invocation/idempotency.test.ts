// Idempotency-Key claims (invocation/idempotency.ts) against a real
// nats-server provisioned as skiff provisions it: one winner among racing
// claims, repeats answered with the winner's run id, a released key claimed
// afresh (over its delete marker), and keys scoped to one app.
import type { KV, NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { claimIdempotencyKey, releaseIdempotencyKey } from "../../services/invocation/idempotency.js";
import { buckets } from "../../services/nats/layout.js";
import { startProvisionedNats } from "../helpers/nats-server.js";

let stop: () => Promise<void>;
let nc: NatsConnection;
let kv: KV;
const app = { project_id: "p-idem", app_name: "a", created_at: "2026-01-01T00:00:00.000Z" };

beforeAll(async () => {
  const provisioned = await startProvisionedNats();
  ({ nc, stop } = provisioned);
  kv = await nc.jetstream().views.kv(buckets.idempotency.name, { bindOnly: true });
});
afterAll(async () => {
  await stop?.();
});

describe("Idempotency-Key claims", () => {
  it("the first claim wins; a repeat gets the first run id", async () => {
    expect(await claimIdempotencyKey(nc, app, "k1", "run-1")).toBe("run-1");
    expect(await claimIdempotencyKey(nc, app, "k1", "run-2")).toBe("run-1");
  });

  it("of claims racing for one key, one wins and every one answers its run id", async () => {
    const ids = Array.from({ length: 20 }, (_, i) => `race-${i}`);
    const owners = await Promise.all(ids.map((id) => claimIdempotencyKey(nc, app, "k-race", id)));
    expect(new Set(owners).size).toBe(1);
    expect(ids).toContain(owners[0]);
  });

  it("a released key is claimed afresh, over the delete marker its release left", async () => {
    expect(await claimIdempotencyKey(nc, app, "k2", "first")).toBe("first");
    await releaseIdempotencyKey(kv, app, "k2", "first");
    expect(await claimIdempotencyKey(nc, app, "k2", "second")).toBe("second");
    expect(await claimIdempotencyKey(nc, app, "k2", "third")).toBe("second");
    // A release by a run that does not own the key changes nothing.
    await releaseIdempotencyKey(kv, app, "k2", "first");
    expect(await claimIdempotencyKey(nc, app, "k2", "fourth")).toBe("second");
  });

  it("a key belongs to one app: another app, or a new app of the same name, starts afresh", async () => {
    expect(await claimIdempotencyKey(nc, app, "k3", "of-a")).toBe("of-a");
    expect(await claimIdempotencyKey(nc, { ...app, app_name: "b" }, "k3", "of-b")).toBe("of-b");
    expect(await claimIdempotencyKey(nc, { ...app, created_at: "2026-02-01T00:00:00.000Z" }, "k3", "of-new")).toBe(
      "of-new",
    );
  });
});
