// KV views: a delete made by this process takes effect in its own view at
// once, and the watch's older values of the key, still on their way, do not
// bring it back (the same-process half of "deleting a service account revokes
// its token at once").
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connect, type KV, type NatsConnection } from "nats";
import { silentLogger } from "../../services/config/logger.js";
import { KvView, kvKeys } from "../../services/nats/kv-view.js";
import { startNatsServer, type TestNats } from "../helpers/nats-server.js";

describe("KvView", () => {
  let nats: TestNats;
  let nc: NatsConnection;
  let kv: KV;
  beforeAll(async () => {
    nats = await startNatsServer();
    nc = await connect({ servers: nats.url });
    kv = await nc.jetstream().views.kv("view-test");
  });
  afterAll(async () => {
    await nc?.close();
    await nats?.stop();
  });

  const view = () => new KvView<string>({ kv, decode: (e) => e.string(), logger: silentLogger, name: "test" });

  it("a local delete hides the key although the watch still delivers its older PUT", async () => {
    const revision = await kv.put("gone", "v1");
    const v = view();
    // Deleted here before the watch has delivered anything: its replay of v1 is older news.
    v.delete("gone", revision);
    await v.start();
    try {
      expect(v.get("gone")).toBeUndefined();
      // A later value (made again) is taken as usual.
      await kv.put("gone", "v2");
      await expect.poll(() => v.get("gone")).toBe("v2");
    } finally {
      v.close();
    }
  });

  it("without the local delete, the same watch shows the key (the check above can fail)", async () => {
    await kv.put("kept", "v1");
    const v = view();
    await v.start();
    try {
      expect(v.get("kept")).toBe("v1");
    } finally {
      v.close();
    }
  });

  it("kvKeys lists the keys under a filter from the stream's index, deleted ones with them", async () => {
    const jsm = await nc.jetstreamManager();
    const many = Array.from({ length: 300 }, (_, i) => `p1.app.r${i}`);
    await Promise.all([...many, "p1.other.x", "p2.app.y"].map((k) => kv.put(k, "v")));
    await kv.delete("p1.app.r0");
    const keys = await kvKeys(jsm, "view-test", "p1.app.*");
    expect(keys.sort()).toEqual([...many].sort());
    expect(await kvKeys(jsm, "view-test", "p3.>")).toEqual([]);
  });
});
