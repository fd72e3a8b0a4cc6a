// KV reads through the stream leader on the shared reply subscription
// (nats/kv-get.ts) against a real nats-server: the latest revision of a key,
// deletes and purges, a key never written, many reads at once, and a bucket
// that is not there.
import { connect, type KV, type NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { PublishError, requestPipelined } from "../../services/nats/acked-publish.js";
import { kvGetLatest } from "../../services/nats/kv-get.js";
import { startNatsServer, type TestNats } from "../helpers/nats-server.js";

let nats: TestNats;
let nc: NatsConnection;
let kv: KV;
const text = (b: Uint8Array) => new TextDecoder().decode(b);

beforeAll(async () => {
  nats = await startNatsServer();
  nc = await connect({ servers: nats.url });
  kv = await nc.jetstream().views.kv("direct-test", { history: 5 });
});
afterAll(async () => {
  await nc?.close();
  await nats?.stop();
});

describe("kvGetLatest", () => {
  it("reads a key's latest value with its revision, as kv.get does", async () => {
    await kv.put("a.b", "one");
    const second = await kv.put("a.b", "two");
    const entry = await kvGetLatest(nc, "direct-test", "a.b");
    expect(entry).toMatchObject({ revision: second, operation: "PUT" });
    expect(text(entry!.value)).toBe("two");
    expect((await kv.get("a.b"))?.revision).toBe(second);
  });

  it("says a deleted or purged key is so, and a key never written is not there", async () => {
    await kv.put("gone", "x");
    await kv.delete("gone");
    expect((await kvGetLatest(nc, "direct-test", "gone"))?.operation).toBe("DEL");
    await kv.put("purged", "x");
    await kv.purge("purged");
    expect((await kvGetLatest(nc, "direct-test", "purged"))?.operation).toBe("PURGE");
    expect(await kvGetLatest(nc, "direct-test", "never")).toBeUndefined();
  });

  it("refuses a key that is none (a wildcard would read the last entry of another key), as kv.get does", async () => {
    await kv.put("w.one", "1");
    await kv.put("w.two", "2");
    for (const key of ["w.>", "w.*", ">", "*", "w..two", ".w", "w.", "", "w two"]) {
      await expect(kvGetLatest(nc, "direct-test", key)).rejects.toThrow(/invalid KV key/);
      await expect(kv.get(key)).rejects.toThrow();
    }
  });

  it("answers many reads in flight at once, each with its own key", async () => {
    await Promise.all(Array.from({ length: 200 }, (_, i) => kv.put(`many.${i}`, String(i))));
    const entries = await Promise.all(
      Array.from({ length: 200 }, (_, i) => kvGetLatest(nc, "direct-test", `many.${i}`)),
    );
    expect(entries.map((e) => text(e!.value))).toEqual(Array.from({ length: 200 }, (_, i) => String(i)));
  });

  it("asks the stream's leader, never a replica that may lag (no direct get), on a bucket that allows both", async () => {
    expect((await kv.status()).streamInfo.config.allow_direct).toBe(true);
    const asked: string[] = [];
    const watch = nc.subscribe("$JS.API.>", {
      callback: (_err, m) => m.subject.includes(".GET.") && asked.push(m.subject),
    });
    await nc.flush();
    await kv.put("leader", "x");
    expect(text((await kvGetLatest(nc, "direct-test", "leader"))!.value)).toBe("x");
    await nc.flush();
    watch.unsubscribe();
    expect(asked).toEqual(["$JS.API.STREAM.MSG.GET.KV_direct-test"]);
  });

  it("fails clearly for a bucket that does not exist", async () => {
    const err = await kvGetLatest(nc, "no-such-bucket", "k").catch((e: unknown) => e);
    expect(err).toBeInstanceOf(PublishError);
    expect((err as Error).message).toMatch(/^cannot read k of KV no-such-bucket: stream not found/);
  });

  it("reads a value too large for one line of base64 and one with every byte", async () => {
    const big = new Uint8Array(200_000).map((_, i) => i % 256);
    await kv.put("big", big);
    expect(Buffer.from((await kvGetLatest(nc, "direct-test", "big"))!.value).equals(Buffer.from(big))).toBe(true);
  });
});

describe("requestPipelined", () => {
  it("gives each of many requests in flight its own answer; nothing listening is said at once", async () => {
    const sub = nc.subscribe("echo.>", { callback: (_err, m) => m.respond(m.data) });
    const answers = await Promise.all(
      Array.from({ length: 300 }, (_, i) => requestPipelined(nc, `echo.${i}`, new TextEncoder().encode(`n${i}`))),
    );
    expect(answers.map((m) => text(m.data))).toEqual(Array.from({ length: 300 }, (_, i) => `n${i}`));
    sub.unsubscribe();
    const nobody = await requestPipelined(nc, "nobody.here", new Uint8Array()).catch((e: unknown) => e);
    expect((nobody as Error).message).toMatch(/^nothing answers on nobody\.here/);
  });
});
