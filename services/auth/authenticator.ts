// Turns a bearer token into a principal. The hot path is a cache hit: one Map
// lookup for the token, an expiry check and one Map lookup in the
// service-account view (revocation), all in memory. Signatures are checked
// only the first time a token is seen.
import type { ServiceAccountRecord } from "./accounts.js";
import type { Logger } from "../config/index.js";
import { TokenError, verifyToken, type KeyLookup, type VerifiedToken } from "./tokens.js";

export type Principal = { kind: "admin" } | ServiceAccountPrincipal;

export interface ServiceAccountPrincipal {
  kind: "service_account";
  projectId: string;
  serviceAccountId: string;
  expiresAt: Date;
}

const ADMIN: Principal = Object.freeze({ kind: "admin" });

/** Verified tokens kept; beyond this the oldest is dropped. */
const DEFAULT_TOKEN_CACHE_SIZE = 10_000;

type Maybe<T> = T | Promise<T>;

interface AuthenticatorOptions {
  publicKey: KeyLookup;
  findAccount: (projectId: string, serviceAccountId: string) => Maybe<ServiceAccountRecord | undefined>;
  isAdmin: (token: string) => boolean;
  logger: Logger;
  cacheSize?: number;
}

interface Cached {
  verified: VerifiedToken;
  principal: ServiceAccountPrincipal;
}

export class Authenticator {
  private readonly cache = new Map<string, Cached>();
  private readonly cacheSize: number;

  constructor(private readonly opts: AuthenticatorOptions) {
    this.cacheSize = opts.cacheSize ?? DEFAULT_TOKEN_CACHE_SIZE;
  }

  /**
   * The principal of a token verified before whose account the accounts' view
   * holds: known at once, without an await (the usual call). Undefined when
   * that cannot be told without authenticate().
   */
  cached(token: string): Principal | undefined {
    const hit = this.cache.get(token);
    if (hit === undefined || hit.verified.expiresAt * 1000 <= Date.now()) return undefined;
    const record = this.opts.findAccount(hit.verified.projectId, hit.verified.serviceAccountId);
    return !(record instanceof Promise) && isActive(hit.verified, record) ? hit.principal : undefined;
  }

  /**
   * The principal of a token, or undefined when the token is refused for any
   * reason. Throws only when the answer cannot be known (NATS unreachable).
   */
  async authenticate(token: string): Promise<Principal | undefined> {
    const hit = this.cache.get(token);
    if (hit) {
      if (hit.verified.expiresAt * 1000 > Date.now() && (await this.active(hit.verified))) return hit.principal;
      this.cache.delete(token);
      return undefined;
    }
    if (this.opts.isAdmin(token)) return ADMIN;

    let verified: VerifiedToken;
    try {
      verified = await verifyToken(token, this.opts.publicKey);
    } catch (err) {
      if (!(err instanceof TokenError)) throw err;
      this.opts.logger.debug({ reason: err.message }, "token refused");
      return undefined;
    }
    if (!(await this.active(verified))) {
      this.opts.logger.debug(
        { sub: verified.serviceAccountId, project_id: verified.projectId },
        "token refused: service account gone",
      );
      return undefined;
    }
    const principal: ServiceAccountPrincipal = {
      kind: "service_account",
      projectId: verified.projectId,
      serviceAccountId: verified.serviceAccountId,
      expiresAt: new Date(verified.expiresAt * 1000),
    };
    if (this.cache.size >= this.cacheSize) this.cache.delete(this.cache.keys().next().value!);
    this.cache.set(token, { verified, principal });
    return principal;
  }

  /**
   * The account still exists and the token was issued after it was created
   * (a deleted account made again under the same id does not revive old tokens).
   */
  private async active(v: VerifiedToken): Promise<boolean> {
    return isActive(v, await this.opts.findAccount(v.projectId, v.serviceAccountId));
  }
}

/** Whether the account of a verified token is `record`, made before the token was issued. */
function isActive(v: VerifiedToken, record: ServiceAccountRecord | undefined): boolean {
  return (
    record !== undefined &&
    record.project_id === v.projectId &&
    v.issuedAt >= Math.floor(Date.parse(record.created_at) / 1000)
  );
}
