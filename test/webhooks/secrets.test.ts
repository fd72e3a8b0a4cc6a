import { randomBytes } from "node:crypto";
import { connect, type NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { parseSecretsKey, SecretsKeyError } from "../../services/config/index.js";
import { buckets } from "../../services/nats/layout.js";
import {
  createSecretBox,
  loadWebhookSecret,
  SECRETS_KEY_ENTRY,
  secretBox,
  secretsBucket,
  storeWebhookSecret,
  UnsealError,
} from "../../services/webhooks/secrets.js";
import { startProvisionedNats } from "../helpers/nats-server.js";

describe("secret box", () => {
  const box = secretBox(randomBytes(32));

  test("seals and unseals, never the same sealed text twice, never the plain text in it", () => {
    const a = box.seal("whsec_plain", "run-1");
    const b = box.seal("whsec_plain", "run-1");
    expect(a).not.toBe(b);
    expect(a).not.toContain("whsec_plain");
    expect(box.unseal(a, "run-1")).toBe("whsec_plain");
    expect(box.unseal(box.seal("ünïcode ☃", "x"), "x")).toBe("ünïcode ☃");
  });

  test("a sealed value opens only with its context, its key, and unaltered", () => {
    const sealed = box.seal("whsec_plain", "run-1");
    expect(() => box.unseal(sealed, "run-2")).toThrow(UnsealError);
    expect(() => secretBox(randomBytes(32)).unseal(sealed, "run-1")).toThrow(UnsealError);
    const raw = Buffer.from(sealed.slice(3), "base64url");
    raw[14] ^= 1;
    expect(() => box.unseal(`v1.${raw.toString("base64url")}`, "run-1")).toThrow(UnsealError);
    expect(() => box.unseal("whsec_plain", "run-1")).toThrow(UnsealError);
  });

  test("SKIFF_SECRETS_KEY must be base64 of 32 bytes", () => {
    const key = randomBytes(32);
    expect(parseSecretsKey(key.toString("base64")).equals(key)).toBe(true);
    expect(() => parseSecretsKey(randomBytes(16).toString("base64"))).toThrow(/32 bytes, got 16/);
    expect(() => parseSecretsKey("not base64!")).toThrow(SecretsKeyError);
  });
});

describe("secret box on NATS", () => {
  let server: Awaited<ReturnType<typeof startProvisionedNats>>;
  let nc: NatsConnection;
  beforeAll(async () => {
    server = await startProvisionedNats();
    nc = server.nc;
  });
  afterAll(async () => {
    await server?.stop();
  });

  test("concurrent starts agree on one cluster key, made once in KV skiff-keys", async () => {
    const others = await Promise.all(Array.from({ length: 4 }, () => connect({ servers: server.nats.url })));
    try {
      const boxes = await Promise.all([nc, ...others].map((c) => createSecretBox(c)));
      const sealed = boxes[0].seal("shared", "ctx");
      for (const b of boxes) expect(b.unseal(sealed, "ctx")).toBe("shared");
      const keys = await nc.jetstream().views.kv(buckets.keys.name);
      const entry = await keys.get(SECRETS_KEY_ENTRY);
      expect(parseSecretsKey(entry!.string())).toHaveLength(32);
      // The stored key is the one every box seals with.
      expect(secretBox(parseSecretsKey(entry!.string())).unseal(sealed, "ctx")).toBe("shared");
    } finally {
      await Promise.all(others.map((c) => c.close()));
    }
  });

  test("a configured key is used instead of the cluster's", async () => {
    const key = randomBytes(32).toString("base64");
    const configured = await createSecretBox(nc, { key });
    expect(secretBox(Buffer.from(key, "base64")).unseal(configured.seal("x", "c"), "c")).toBe("x");
    const cluster = await createSecretBox(nc);
    expect(() => cluster.unseal(configured.seal("x", "c"), "c")).toThrow(UnsealError);
  });

  test("webhook secrets are kept sealed under the run id in skiff-secrets, whose TTL bounds them", async () => {
    const box = await createSecretBox(nc);
    const kv = await secretsBucket(nc);
    await storeWebhookSecret(kv, box, "run-a", "whsec_a");
    expect(await loadWebhookSecret(kv, box, "run-a")).toBe("whsec_a");
    expect(await loadWebhookSecret(kv, box, "run-none")).toBeUndefined();
    expect((await kv.get("run-a"))!.string()).not.toContain("whsec_a");
    // A sealed value moved to another run's key does not open there.
    await kv.put("run-b", (await kv.get("run-a"))!.string());
    await expect(loadWebhookSecret(kv, box, "run-b")).rejects.toBeInstanceOf(UnsealError);
    expect((await kv.status()).ttl).toBe(buckets.secrets.ttlMs);
  });
});
