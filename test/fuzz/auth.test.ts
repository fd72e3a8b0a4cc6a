// Fuzzing the auth layer through a real skiff (its own nats-server, the real
// interceptor, keyring and account directory): arbitrary Authorization
// headers, bearer strings of any bytes, JWT-shaped garbage, tokens with one
// character changed, and tokens forged with jose: signed by an unknown key,
// with the real kid but another key, alg "none" or HS256 keyed with the
// public key, the real key with claims that are wrong (expired, another
// issuer, a deleted or malformed account, a claim missing or mistyped).
// Every one gets 401 unauthenticated, a valid token on another project 403
// permission_denied; never anything else, never a 5xx.
import assert from "node:assert/strict";
import type { KeyObject } from "node:crypto";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import fc from "fast-check";
import { SignJWT, base64url, decodeJwt } from "jose";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { newEd25519Key, publicJwk, signingKeyFrom, type SigningKey } from "../../services/auth/tokens.js";
import { exchange } from "../helpers/raw-http.js";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";
import { FUZZ_RUNS, fuzzTimeout } from "./runs.js";

const DAY_MS = 86_400_000;
const b64 = (v: unknown) => base64url.encode(typeof v === "string" ? v : JSON.stringify(v));
const nowS = () => Math.floor(Date.now() / 1000);

/** How the Authorization header is written around a token. */
const scheme = fc.oneof(
  { weight: 12, arbitrary: fc.constant("Bearer ") },
  {
    weight: 1,
    arbitrary: fc.constantFrom("bearer ", "BEARER  ", "Bearer\t", "Basic ", "Token ", "", "Bearer", " Bearer "),
  },
);
const B64URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
const b64s = (maxLength: number) => fc.string({ unit: fc.constantFrom(...B64URL), maxLength });
/** JSON values that claims and header fields may be given instead of the right ones. */
const junk = fc.oneof(
  fc.constantFrom(null, 0, -1, 1.5, true, "", [], {}, "EdDSA", "none", "p-a", "sa-x"),
  fc.jsonValue({ maxDepth: 1 }),
);

type Recipe =
  | { kind: "text"; text: string }
  | { kind: "bytes"; bytes: number[] }
  | { kind: "shaped"; header: unknown; payload: unknown; signature: string }
  | { kind: "mutated"; at: number; char: string }
  | { kind: "unknownKey"; realKid: boolean; key: number }
  | { kind: "alg"; alg: string }
  | { kind: "claims"; change: string; value: unknown }
  | { kind: "otherProject" };

const recipe: fc.Arbitrary<Recipe> = fc.oneof(
  fc.record({ kind: fc.constant("text" as const), text: fc.string({ unit: "grapheme-ascii", maxLength: 200 }) }),
  fc.record({
    kind: fc.constant("bytes" as const),
    bytes: fc.array(
      fc.integer({ min: 0, max: 255 }).filter((b) => b !== 10 && b !== 13),
      { maxLength: 120 },
    ),
  }),
  fc.record({
    kind: fc.constant("shaped" as const),
    header: fc.oneof(fc.record({ alg: junk, kid: junk, typ: junk }, { requiredKeys: [] }), junk),
    payload: fc.oneof(
      fc.record({ sub: junk, project_id: junk, iat: junk, exp: junk, iss: junk, jti: junk }, { requiredKeys: [] }),
      junk,
    ),
    signature: b64s(90),
  }),
  fc.record({
    kind: fc.constant("mutated" as const),
    at: fc.nat(),
    char: fc.constantFrom(...`${B64URL}.=+/ `.split("")),
  }),
  fc.record({ kind: fc.constant("unknownKey" as const), realKid: fc.boolean(), key: fc.nat(3) }),
  fc.record({
    kind: fc.constant("alg" as const),
    alg: fc.constantFrom("none", "HS256", "HS512", "RS256", "ES256", "PS256", "EdDSA-none"),
  }),
  fc.record({
    kind: fc.constant("claims" as const),
    change: fc.constantFrom("exp", "iss", "sub", "project_id", "iat", "jti", "deleted", "kid", "typ"),
    value: junk,
  }),
  fc.constant({ kind: "otherProject" as const }),
);

describe("fuzz: auth layer through a real skiff", () => {
  let t: TestSkiff;
  let key: SigningKey;
  let token: string;
  let account: string;
  let deleted: string;
  const strangers: SigningKey[] = [];

  beforeAll(async () => {
    const privateKey = newEd25519Key();
    key = await signingKeyFrom(privateKey);
    t = await startTestSkiff({ env: { SKIFF_SIGNING_KEY: JSON.stringify(privateKey.export({ format: "jwk" })) } });
    const admin = t.management();
    await admin.createProject({ projectId: "p-a" });
    await admin.createProject({ projectId: "p-b" });
    const expiresAt = timestampFromDate(new Date(Date.now() + DAY_MS));
    const a = await admin.createServiceAccount({ projectId: "p-a", name: "a", expiresAt });
    token = a.token;
    account = a.serviceAccount!.serviceAccountId;
    const gone = await admin.createServiceAccount({ projectId: "p-a", name: "gone", expiresAt });
    deleted = gone.serviceAccount!.serviceAccountId;
    await admin.deleteServiceAccount({ projectId: "p-a", serviceAccountId: deleted });
    for (let i = 0; i < 4; i++) strangers.push(await signingKeyFrom(newEd25519Key()));
  }, 120_000);
  afterAll(() => t?.close());

  /** Claims of the valid token, with one changed. */
  const sign = (claims: Record<string, unknown>, header: Record<string, unknown>, with_: KeyObject | Uint8Array) =>
    new SignJWT(claims).setProtectedHeader({ alg: "EdDSA", kid: key.kid, typ: "JWT", ...header } as never).sign(with_);

  /** The header value and the answer expected: 401, or 403 for a valid token on another project. */
  async function build(r: Recipe): Promise<{ value: string; project: string; expect: 401 | 403 }> {
    const claims = decodeJwt(token) as Record<string, unknown>;
    switch (r.kind) {
      case "text":
        return { value: r.text, project: "p-a", expect: 401 };
      case "bytes":
        return { value: Buffer.from(r.bytes).toString("latin1"), project: "p-a", expect: 401 };
      case "shaped":
        return { value: `${b64(r.header)}.${b64(r.payload)}.${r.signature}`, project: "p-a", expect: 401 };
      case "mutated": {
        const i = r.at % token.length;
        const changed = token.slice(0, i) + r.char + token.slice(i + 1);
        // The last character of a base64url segment carries padding bits: some changes keep the same bytes.
        const same = changed === token || ((i === token.length - 1 || token[i + 1] === ".") && r.char !== ".");
        return { value: same ? `${token}x` : changed, project: "p-a", expect: 401 };
      }
      case "unknownKey": {
        const stranger = strangers[r.key];
        const header = { kid: r.realKid ? key.kid : stranger.kid };
        return { value: await sign(claims, header, stranger.privateKey), project: "p-a", expect: 401 };
      }
      case "alg": {
        const secret = base64url.decode(publicJwk(key.publicKey).x!);
        if (r.alg === "HS256" || r.alg === "HS512")
          return { value: await sign(claims, { alg: r.alg }, secret), project: "p-a", expect: 401 };
        const head = b64({ alg: r.alg === "EdDSA-none" ? "EdDSA" : r.alg, kid: key.kid, typ: "JWT" });
        const sig = r.alg === "none" || r.alg === "EdDSA-none" ? "" : b64("not a signature");
        return { value: `${head}.${b64(claims)}.${sig}`, project: "p-a", expect: 401 };
      }
      case "claims": {
        const header: Record<string, unknown> = {};
        const c = { ...claims };
        switch (r.change) {
          case "exp":
            c.exp = typeof r.value === "number" ? Math.min(r.value, nowS() - 1) : r.value;
            break;
          case "iss":
            c.iss = r.value === "skiff" ? "skiff2" : r.value;
            break;
          case "sub":
            c.sub = r.value === account ? `${account}x` : r.value;
            break;
          case "project_id":
            // Another project's id in the token: the account is not there.
            c.project_id = r.value === "p-a" ? "p-b" : r.value;
            break;
          case "iat":
            // Before the account existed, or not a number.
            c.iat = typeof r.value === "number" ? Math.min(r.value, (claims.iat as number) - 3600) : r.value;
            break;
          case "jti":
            if (typeof r.value === "string") delete c.jti;
            else c.jti = r.value;
            break;
          case "deleted":
            c.sub = deleted;
            break;
          case "kid":
            header.kid = r.value === key.kid ? `${key.kid}x` : r.value;
            break;
          case "typ":
            // Not a refusal on its own: with it, the token is made invalid by an expiry in the past.
            header.typ = r.value;
            c.exp = nowS() - 60;
            break;
        }
        // jose refuses to sign some claims (a non-numeric exp): written by hand then, with a real signature.
        let value: string;
        try {
          value = await sign(c, header, key.privateKey);
        } catch {
          value = `${b64({ alg: "EdDSA", kid: key.kid, ...header })}.${b64(c)}.${b64("x")}`;
        }
        return { value, project: "p-a", expect: 401 };
      }
      case "otherProject":
        return { value: token, project: "p-b", expect: 403 };
    }
  }

  const ROUTES = [
    (p: string) => `GET /v2/projects/${p}/service-accounts`,
    (p: string) => `GET /v2/projects/${p}`,
    (p: string) => `POST /v4/${p}/hello/run`,
    (p: string) => `GET /v2/projects/${p}/apps/hello/runs`,
  ];

  /**
   * One request: over a kept-alive connection (fetch) when the header is one fetch sends as it is, else as raw
   * bytes on a connection of its own. Raw: a header line the parser refuses is answered 400 and closed.
   */
  async function send(
    method: string,
    target: string,
    authorization: string,
  ): Promise<{ status: number; body: string }> {
    if (/^[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?$/.test(authorization)) {
      const res = await fetch(t.url + target, {
        method,
        headers: { authorization },
        body: method === "POST" ? "" : undefined,
      });
      return { status: res.status, body: await res.text() };
    }
    const head = `${method} ${target} HTTP/1.1\r\nhost: fuzz\r\nauthorization: ${authorization}\r\ncontent-length: 0\r\n\r\n`;
    const answer = await exchange(t.skiff.port, Buffer.from(head, "latin1"));
    assert.notEqual(answer, "closed", "the connection closed without an answer");
    return answer === "closed" ? { status: 0, body: "" } : { status: answer.status, body: answer.body.toString() };
  }

  it(
    `arbitrary and forged tokens: 401, or 403 for another project's; never a 5xx (${FUZZ_RUNS} cases)`,
    async () => {
      const seen = new Map<string, number>();
      await fc.assert(
        fc.asyncProperty(recipe, scheme, fc.nat(ROUTES.length - 1), async (r, s, route) => {
          const built = await build(r);
          const [method, target] = ROUTES[route](built.project).split(" ");
          const answer = await send(method, target, `${s}${built.value}`);
          const key = `${r.kind} ${answer.status}`;
          seen.set(key, (seen.get(key) ?? 0) + 1);
          assert.ok(answer.status < 500, `status ${answer.status}: ${answer.body}`);
          const body = JSON.parse(answer.body) as { code: string; message: string };
          // A malformed header line is the parser's 400; any token that reaches skiff is refused.
          if (answer.status === 400) {
            assert.equal(body.code, "invalid_argument");
            return;
          }
          // The header's value as the server reads it (surrounding spaces and tabs are not part of it).
          const value = `${s}${built.value}`.replace(/^[ \t]+|[ \t]+$/g, "");
          if (built.expect === 403 && /^Bearer +\S+ *$/i.test(value)) {
            assert.equal(answer.status, 403, `a valid token on another project: ${answer.status}`);
            assert.equal(body.code, "permission_denied");
          } else {
            assert.equal(answer.status, 401, `${answer.status}: ${answer.body}`);
            assert.equal(body.code, "unauthenticated");
          }
        }),
        { numRuns: FUZZ_RUNS, timeout: 10_000 },
      );
      console.log("auth answers by recipe and status:", Object.fromEntries([...seen].sort()));
      // The valid token still works: the refusals were the tokens', not a broken server's.
      const ok = await exchange(
        t.skiff.port,
        Buffer.from(
          `GET /v2/projects/p-a/service-accounts HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${token}\r\n\r\n`,
        ),
      );
      expect(ok !== "closed" && ok.status).toBe(200);
    },
    fuzzTimeout(60),
  );
});
