// Token keys in KV `skiff-keys`:
//
//   verify.<kid>     public JWK of every key that has signed tokens; kept after
//                    a rotation so older tokens verify until they expire
//   signing.current  the private JWK used to sign, created once by the first
//                    process that needs it (`kv.create`: the first writer wins)
//                    unless SKIFF_SIGNING_KEY provides the key
//
// Every process keeps the public keys in memory, fed by a watch of verify.>.
import { createPublicKey, type JsonWebKey, type KeyObject } from "node:crypto";
import type { KV } from "nats";
import type { Logger } from "../config/index.js";
import { KvView, jsonOf } from "../nats/index.js";
import { KID, newEd25519Key, parsePrivateKey, publicJwk, signingKeyFrom, type SigningKey } from "./tokens.js";

const VERIFY_PREFIX = "verify.";
const SIGNING_KEY = "signing.current";
/** How long an unknown kid is remembered as unknown, so forged kids cannot make every request ask NATS. */
const UNKNOWN_KID_MS = 1_000;
const MAX_UNKNOWN_KIDS = 1_000;

function decodePublicKey(value: unknown): KeyObject | undefined {
  try {
    const key = createPublicKey({ key: value as JsonWebKey, format: "jwk" });
    return key.asymmetricKeyType === "ed25519" ? key : undefined;
  } catch {
    return undefined;
  }
}

export class Keyring {
  private readonly view: KvView<KeyObject>;
  private readonly unknown = new Map<string, number>();

  constructor(
    private readonly kv: KV,
    private readonly logger: Logger,
  ) {
    this.view = new KvView({
      kv,
      key: `${VERIFY_PREFIX}>`,
      decode: (e) => decodePublicKey(jsonOf(e)),
      logger,
      name: "token keys",
    });
  }

  start(): Promise<void> {
    return this.view.start();
  }

  close(): void {
    this.view.close();
  }

  /** The public key of a kid; asks KV only for a kid the watch has not brought yet. */
  publicKey = (kid: string): KeyObject | undefined | Promise<KeyObject | undefined> => {
    return this.view.get(VERIFY_PREFIX + kid) ?? this.fetch(kid);
  };

  private async fetch(kid: string): Promise<KeyObject | undefined> {
    if (!KID.test(kid)) return undefined;
    const seen = this.unknown.get(kid);
    if (seen !== undefined && Date.now() - seen < UNKNOWN_KID_MS) return undefined;
    const entry = await this.kv.get(VERIFY_PREFIX + kid);
    const key = entry && entry.operation === "PUT" ? decodePublicKey(jsonOf(entry)) : undefined;
    if (!key) {
      if (this.unknown.size >= MAX_UNKNOWN_KIDS) this.unknown.clear();
      this.unknown.set(kid, Date.now());
    }
    return key;
  }

  /**
   * The key this process signs with: the configured one, else the cluster's
   * (made by whichever process gets there first). Its public half is published
   * under verify.<kid> before any token it signs can exist.
   */
  async signingKey(configured: string | undefined): Promise<SigningKey> {
    const key = await signingKeyFrom(configured !== undefined ? parsePrivateKey(configured) : await this.clusterKey());
    const jwk = JSON.stringify(publicJwk(key.publicKey));
    await this.kv.create(VERIFY_PREFIX + key.kid, jwk).catch(async (err: unknown) => {
      // Already published (a restart, or another process with the same key) is the normal case.
      if ((await this.kv.get(VERIFY_PREFIX + key.kid))?.operation !== "PUT") throw err;
    });
    this.view.set(VERIFY_PREFIX + key.kid, key.publicKey);
    return key;
  }

  private async clusterKey(): Promise<KeyObject> {
    const existing = await this.kv.get(SIGNING_KEY);
    if (existing && existing.operation === "PUT") return parsePrivateKey(existing.string());
    const privateKey = newEd25519Key();
    try {
      await this.kv.create(SIGNING_KEY, JSON.stringify(privateKey.export({ format: "jwk" })));
      this.logger.info("created the token signing key in KV skiff-keys");
      return privateKey;
    } catch (err) {
      // Another process created it first: use theirs.
      const winner = await this.kv.get(SIGNING_KEY);
      if (winner && winner.operation === "PUT") return parsePrivateKey(winner.string());
      throw err;
    }
  }
}
