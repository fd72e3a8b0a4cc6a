// The stop of skiff's NATS connection (nats/connect.ts): whatever was published before it reaches the server,
// even when nats.js's drain() gives up at once. It does when one of the connection's subscriptions ended on its
// own (a subscription's timeout, say) and is still listed: drain() swallows that subscription's refusal to
// drain and resolves without having flushed or closed anything. Real nats-server.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { connect } from "nats";
import { afterEach, describe, expect, it } from "vitest";
import { silentLogger } from "../../services/config/logger.js";
import { publishInBackground } from "../../services/nats/coalesce.js";
import { connectNats } from "../../services/nats/connect.js";
import { startNatsServer } from "../helpers/nats-server.js";

const cleanups: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** A nats-server of its own and skiff's connection to it (as with SKIFF_NATS_URL); both gone after the test. */
async function skiffConnection() {
  const nats = await startNatsServer();
  cleanups.push(() => nats.stop());
  const dataDir = await mkdtemp(path.join(tmpdir(), "skiff-nats-stop-"));
  cleanups.push(() => rm(dataDir, { recursive: true, force: true }));
  return { nats, handle: await connectNats({ url: nats.url, dataDir, logger: silentLogger }) };
}

describe("stopping the NATS connection", () => {
  it.each([
    ["every subscription live", false],
    ["a subscription that ended on its own", true],
  ])("with %s, delivers what was published just before", async (_name, endedSubscription) => {
    const { nats, handle } = await skiffConnection();
    const reader = await connect({ servers: nats.url });
    cleanups.push(() => reader.close());
    let received = 0;
    reader.subscribe("stop.events", { callback: () => void received++ });
    await reader.flush();

    if (endedSubscription) {
      handle.nc.subscribe("stop.nothing", { timeout: 20, callback: () => undefined });
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    // Published to wait for company (up to 20 ms), as a sync run's event is: still in the client's buffer.
    for (let i = 0; i < 50; i++) publishInBackground(handle.nc, "stop.events", new Uint8Array(8));
    await handle.close();
    expect(handle.nc.isClosed()).toBe(true);

    await reader.flush();
    await expect.poll(() => received, { timeout: 2_000 }).toBe(50);
  });

  it("with a subscription that ended on its own, still waits for the server to have it all", async () => {
    const { nats, handle } = await skiffConnection();
    handle.nc.subscribe("stop.nothing", { timeout: 20, callback: () => undefined });
    await new Promise((resolve) => setTimeout(resolve, 100));
    publishInBackground(handle.nc, "stop.events", new Uint8Array(8));
    // Frozen: it can confirm nothing. The stop must wait (until the drain's own deadline), not end at once.
    await nats.freeze();
    let ended = false;
    const closing = handle.close().then(() => (ended = true));
    try {
      await new Promise((resolve) => setTimeout(resolve, 1_000));
      expect(ended).toBe(false);
    } finally {
      nats.thaw();
    }
    // Back: it confirms, and the stop ends.
    await closing;
    expect(handle.nc.isClosed()).toBe(true);
  });
});
