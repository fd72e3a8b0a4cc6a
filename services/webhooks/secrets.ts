// Sealed webhook secrets. The X-Webhook-Secret of a call must reach the
// webhook role, which may run in another process, yet never travel in a public
// event, a run record or a log line. So it is sealed with AES-256-GCM under a
// platform key and kept in KV `skiff-secrets` under the run id; the bucket's
// TTL bounds how long it lives.
//
// The platform key is SKIFF_SECRETS_KEY (32 bytes, base64) when given, else
// the cluster's own, made once in KV `skiff-keys` by whichever process gets
// there first (`kv.create`: the first writer wins, later ones read theirs).
import { createCipheriv, createDecipheriv, randomBytes } from "node:crypto";
import type { KV, NatsConnection } from "nats";
import { parseSecretsKey, SECRETS_KEY_BYTES as KEY_BYTES, SecretsKeyError } from "../config/index.js";
import { buckets } from "../nats/index.js";

const IV_BYTES = 12;
const TAG_BYTES = 16;
/** Where the cluster's key lives in KV skiff-keys. */
export const SECRETS_KEY_ENTRY = "secrets.current";
/** Sealed values carry a version, so the format can change without guessing. */
const SEALED_PREFIX = "v1.";

/** A sealed value that does not open: another key sealed it, it was altered, or it is not a sealed value. */
export class UnsealError extends Error {
  override name = "UnsealError";
}

export interface SecretBox {
  /** `context` is bound to the sealed value (GCM additional data): it unseals only with the same context. */
  seal(plain: string, context?: string): string;
  unseal(sealed: string, context?: string): string;
}

export function secretBox(key: Buffer): SecretBox {
  if (key.length !== KEY_BYTES) throw new SecretsKeyError(`an AES-256 key is ${KEY_BYTES} bytes, got ${key.length}`);
  return {
    seal(plain, context = "") {
      const iv = randomBytes(IV_BYTES);
      const cipher = createCipheriv("aes-256-gcm", key, iv);
      cipher.setAAD(Buffer.from(context, "utf8"));
      const data = Buffer.concat([cipher.update(plain, "utf8"), cipher.final()]);
      return SEALED_PREFIX + Buffer.concat([iv, data, cipher.getAuthTag()]).toString("base64url");
    },
    unseal(sealed, context = "") {
      if (!sealed.startsWith(SEALED_PREFIX)) throw new UnsealError("not a sealed value");
      const raw = Buffer.from(sealed.slice(SEALED_PREFIX.length), "base64url");
      if (raw.length < IV_BYTES + TAG_BYTES) throw new UnsealError("sealed value is too short");
      const decipher = createDecipheriv("aes-256-gcm", key, raw.subarray(0, IV_BYTES));
      decipher.setAAD(Buffer.from(context, "utf8"));
      decipher.setAuthTag(raw.subarray(raw.length - TAG_BYTES));
      try {
        return Buffer.concat([
          decipher.update(raw.subarray(IV_BYTES, raw.length - TAG_BYTES)),
          decipher.final(),
        ]).toString("utf8");
      } catch (err) {
        throw new UnsealError(
          "sealed value does not open with this platform key (SKIFF_SECRETS_KEY differs between processes, or the value was altered)",
          { cause: err },
        );
      }
    },
  };
}

/**
 * The platform's secret box. `key`: SKIFF_SECRETS_KEY as given (base64);
 * without it, the cluster's key from KV skiff-keys, created if none exists.
 * Every process must use the same key: all set SKIFF_SECRETS_KEY, or none.
 */
export async function createSecretBox(nc: NatsConnection, opts: { key?: string } = {}): Promise<SecretBox> {
  if (opts.key !== undefined) return secretBox(parseSecretsKey(opts.key));
  const kv = await nc.jetstream().views.kv(buckets.keys.name, { bindOnly: true });
  return secretBox(await clusterKey(kv));
}

async function clusterKey(kv: KV): Promise<Buffer> {
  const existing = await kv.get(SECRETS_KEY_ENTRY);
  if (existing?.operation === "PUT") return parseSecretsKey(existing.string());
  try {
    await kv.create(SECRETS_KEY_ENTRY, randomBytes(KEY_BYTES).toString("base64"));
  } catch (err) {
    // Another process created it between our get and our create; theirs is read below.
    if ((await kv.get(SECRETS_KEY_ENTRY))?.operation !== "PUT") throw err;
  }
  // Read back rather than trust our own value: with concurrent starts only one create wins.
  const winner = await kv.get(SECRETS_KEY_ENTRY);
  if (winner?.operation !== "PUT")
    throw new SecretsKeyError(`KV ${buckets.keys.name} lost ${SECRETS_KEY_ENTRY} right after it was written`);
  return parseSecretsKey(winner.string());
}

/** KV `skiff-secrets`, for storeWebhookSecret and loadWebhookSecret. */
export function secretsBucket(nc: NatsConnection): Promise<KV> {
  return nc.jetstream().views.kv(buckets.secrets.name, { bindOnly: true });
}

/**
 * Keeps a call's X-Webhook-Secret, sealed, under its run id. Call it before the
 * run's first event is published, so the webhook role finds it.
 */
export async function storeWebhookSecret(kv: KV, box: SecretBox, runId: string, secret: string): Promise<void> {
  // The run id is the sealing context: a sealed value copied under another run does not open.
  await kv.put(runId, box.seal(secret, runId));
}

/** The secret of a run, or undefined when the call had none (or the bucket's TTL removed it). */
export async function loadWebhookSecret(kv: KV, box: SecretBox, runId: string): Promise<string | undefined> {
  const entry = await kv.get(runId);
  if (entry?.operation !== "PUT") return undefined;
  return box.unseal(entry.string(), runId);
}
