// The admin token: it can do everything in every project. Only its SHA-256 is
// kept, under `admin.<sha256 hex>` in KV `skiff-keys`, so every process can
// check it and nothing in NATS can be replayed as a token. Several admin
// tokens may be valid at once (one per data folder that bootstrapped, plus
// SKIFF_ADMIN_TOKEN); deleting its key revokes one.
import { createHash, randomBytes, timingSafeEqual } from "node:crypto";
import type { KV } from "nats";
import type { Logger } from "../config/index.js";
import { KvView } from "../nats/index.js";

const ADMIN_PREFIX = "admin.";
/** Prefix of generated admin tokens, so that secret scanners and people can recognise one. */
const ADMIN_TOKEN_PREFIX = "skiff_admin_";

export function newAdminToken(): string {
  return ADMIN_TOKEN_PREFIX + randomBytes(32).toString("base64url");
}

function sha256(token: string): Buffer {
  return createHash("sha256").update(token).digest();
}

/** Whether two secrets are the same, compared in constant time (by their hashes, so lengths do not show). */
export function sameToken(a: string, b: string): boolean {
  return timingSafeEqual(sha256(a), sha256(b));
}

export class AdminTokens {
  private readonly view: KvView<Buffer>;

  constructor(
    private readonly kv: KV,
    logger: Logger,
  ) {
    this.view = new KvView({
      kv,
      key: `${ADMIN_PREFIX}>`,
      decode: (e) => Buffer.from(e.key.slice(ADMIN_PREFIX.length), "hex"),
      logger,
      name: "admin tokens",
    });
  }

  start(): Promise<void> {
    return this.view.start();
  }

  close(): void {
    this.view.close();
  }

  /** True when the token is an admin token. Compares hashes in constant time; there are only a few. */
  accepts(token: string): boolean {
    const hash = sha256(token);
    let match = false;
    for (const known of this.view.values()) {
      if (known.length === hash.length && timingSafeEqual(known, hash)) match = true;
    }
    return match;
  }

  /** Makes a token an admin token in every process (idempotent). */
  async register(token: string, source: string): Promise<void> {
    const hash = sha256(token);
    const key = ADMIN_PREFIX + hash.toString("hex");
    if ((await this.kv.get(key))?.operation !== "PUT") {
      await this.kv.put(key, JSON.stringify({ source, created_at: new Date().toISOString() }));
    }
    this.view.set(key, hash);
  }
}
