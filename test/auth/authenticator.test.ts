// The verified-token cache: the signature is checked once per token, later
// checks cost microseconds, and the cache still honours deletion and expiry.
import { describe, expect, it } from "vitest";
import type { ServiceAccountRecord } from "../../services/auth/accounts.js";
import { Authenticator } from "../../services/auth/authenticator.js";
import { silentLogger } from "../../services/config/logger.js";
import { issueToken, newEd25519Key, signingKeyFrom } from "../../services/auth/tokens.js";

async function setup(cacheSize?: number) {
  const key = await signingKeyFrom(newEd25519Key());
  const accounts = new Map<string, ServiceAccountRecord>();
  const add = (id: string) =>
    accounts.set(`p-a.${id}`, {
      service_account_id: id,
      project_id: "p-a",
      name: id,
      created_at: new Date(Date.now() - 60_000).toISOString(),
      expires_at: "",
      created_by: "admin",
    });
  let keyLookups = 0;
  const auth = new Authenticator({
    publicKey: (kid) => (keyLookups++, kid === key.kid ? key.publicKey : undefined),
    findAccount: (project, id) => accounts.get(`${project}.${id}`),
    isAdmin: () => false,
    logger: silentLogger,
    cacheSize,
  });
  const token = (id: string, expiresAt = new Date(Date.now() + 3_600_000)) =>
    issueToken(key, { projectId: "p-a", serviceAccountId: id, expiresAt });
  return { auth, accounts, add, token, lookups: () => keyLookups };
}

describe("token cache", () => {
  it("verifies a token's signature once; 10 000 later checks come from the cache", async () => {
    const { auth, add, token, lookups } = await setup();
    add("sa-one");
    const t = await token("sa-one");
    expect(await auth.authenticate(t)).toMatchObject({ kind: "service_account", serviceAccountId: "sa-one" });
    for (let i = 0; i < 10_000; i++) await auth.authenticate(t);
    expect(lookups()).toBe(1);
  });

  it("a cached token stops working when its account goes, and when its exp passes", async () => {
    const { auth, accounts, add, token } = await setup();
    add("sa-gone");
    const t = await token("sa-gone");
    expect(auth.cached(t)).toBeUndefined(); // not verified yet
    expect(await auth.authenticate(t)).toBeDefined();
    expect(auth.cached(t)).toMatchObject({ kind: "service_account", serviceAccountId: "sa-gone" });
    accounts.delete("p-a.sa-gone");
    expect(auth.cached(t)).toBeUndefined();
    expect(await auth.authenticate(t)).toBeUndefined();

    add("sa-brief");
    const brief = await token("sa-brief", new Date(Math.ceil(Date.now() / 1000) * 1000 + 1_000));
    expect(await auth.authenticate(brief)).toBeDefined();
    expect(auth.cached(brief)).toBeDefined();
    await new Promise((r) => setTimeout(r, 2_100));
    expect(auth.cached(brief)).toBeUndefined();
    expect(await auth.authenticate(brief)).toBeUndefined();
  });

  it("knows a cached token at once only while its account is the one it was issued for", async () => {
    const { auth, accounts, add, token } = await setup();
    add("sa-again");
    const old = await token("sa-again");
    expect(await auth.authenticate(old)).toBeDefined();
    // The account deleted and made again under the same id after the token was issued.
    accounts.set("p-a.sa-again", {
      ...accounts.get("p-a.sa-again")!,
      created_at: new Date(Date.now() + 5_000).toISOString(),
    });
    expect(auth.cached(old)).toBeUndefined();
    expect(await auth.authenticate(old)).toBeUndefined();
  });

  it("the cache is bounded: beyond its size the oldest token is verified again", async () => {
    const { auth, add, token, lookups } = await setup(2);
    add("sa-x");
    const tokens = [await token("sa-x"), await token("sa-x"), await token("sa-x")];
    for (const t of tokens) await auth.authenticate(t);
    expect(lookups()).toBe(3);
    await auth.authenticate(tokens[2]); // still cached
    expect(lookups()).toBe(3);
    await auth.authenticate(tokens[0]); // dropped when the third came in
    expect(lookups()).toBe(4);
  });
});
