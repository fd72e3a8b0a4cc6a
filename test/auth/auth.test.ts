// Authentication of every call: each way a token can be wrong, over REST,
// Connect and gRPC; project scoping; expiry; revocation in one process.
import { Code, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import fc from "fast-check";
import { SignJWT, base64url, decodeJwt, decodeProtectedHeader } from "jose";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ManagementService } from "../../gen/skiff/management/v2/management_pb.js";
import { issueToken, newEd25519Key, publicJwk, signingKeyFrom, type SigningKey } from "../../services/auth/tokens.js";
import { bearer, startTestSkiff, type TestSkiff } from "../helpers/skiff.js";

const DAY_MS = 86_400_000;
const enc = (v: unknown) => base64url.encode(JSON.stringify(v));

describe("authentication", () => {
  let t: TestSkiff;
  let key: SigningKey;
  let tokenA: string;
  let accountA: string;
  let tokenB: string;
  let deletedToken: string;

  /** GET a p-a resource over REST with the given Authorization header (none when undefined). */
  const restStatus = async (authorization: string | undefined, path = "/v2/projects/p-a/service-accounts") => {
    const res = await fetch(t.url + path, { headers: authorization === undefined ? {} : { authorization } });
    return { status: res.status, body: (await res.json()) as { code?: string; message?: string } };
  };

  /** A token signed by the cluster's key with claims changed from a valid one. */
  const resign = (claims: Record<string, unknown>, signWith: SigningKey = key) =>
    new SignJWT({ ...decodeJwt(tokenA), ...claims })
      .setProtectedHeader({ alg: "EdDSA", kid: signWith.kid, typ: "JWT" })
      .sign(signWith.privateKey);

  beforeAll(async () => {
    const privateKey = newEd25519Key();
    key = await signingKeyFrom(privateKey);
    t = await startTestSkiff({ env: { SKIFF_SIGNING_KEY: JSON.stringify(privateKey.export({ format: "jwk" })) } });
    const admin = t.management();
    await admin.createProject({ projectId: "p-a" });
    await admin.createProject({ projectId: "p-b" });
    const expiresAt = timestampFromDate(new Date(Date.now() + DAY_MS));
    const a = await admin.createServiceAccount({ projectId: "p-a", name: "a", expiresAt });
    tokenA = a.token;
    accountA = a.serviceAccount!.serviceAccountId;
    tokenB = (await admin.createServiceAccount({ projectId: "p-b", name: "b", expiresAt })).token;
    const gone = await admin.createServiceAccount({ projectId: "p-a", name: "gone", expiresAt });
    deletedToken = gone.token;
    await admin.deleteServiceAccount({ projectId: "p-a", serviceAccountId: gone.serviceAccount!.serviceAccountId });
  });
  afterAll(async () => {
    await t?.close();
  });

  it("a valid token and the admin token are accepted", async () => {
    expect((await restStatus(`Bearer ${tokenA}`)).status).toBe(200);
    expect((await restStatus(`Bearer ${t.adminToken}`)).status).toBe(200);
  });

  it("tokens carry kid, EdDSA and the claims iss, sub, project_id, iat, exp, jti", () => {
    expect(decodeProtectedHeader(tokenA)).toEqual({ alg: "EdDSA", kid: key.kid, typ: "JWT" });
    const claims = decodeJwt(tokenA);
    expect(Object.keys(claims).sort()).toEqual(["exp", "iat", "iss", "jti", "project_id", "sub"]);
    expect(claims).toMatchObject({ iss: "skiff", sub: accountA, project_id: "p-a" });
  });

  const cases: [string, () => Promise<string | undefined>][] = [
    ["no Authorization header", async () => undefined],
    ["Bearer with nothing", async () => "Bearer "],
    ["another scheme", async () => `Basic ${tokenA}`],
    ["garbage", async () => "Bearer not-a-token"],
    [
      "tampered payload (another account's sub)",
      async () => {
        const [h, , s] = tokenA.split(".");
        return `Bearer ${h}.${enc({ ...decodeJwt(tokenA), sub: "sa-dev", project_id: "p-dev" })}.${s}`;
      },
    ],
    [
      "tampered signature",
      async () => {
        const [h, p, s] = tokenA.split(".");
        return `Bearer ${h}.${p}.${s.slice(0, 10)}${s[10] === "A" ? "B" : "A"}${s.slice(11)}`;
      },
    ],
    [
      "signature spelled otherwise (the same bytes: its last character's unused bits changed)",
      async () => {
        const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        const other = `${tokenA.slice(0, -1)}${alphabet[alphabet.indexOf(tokenA.at(-1)!) ^ 1]}`;
        const signature = (token: string) => Buffer.from(token.split(".")[2], "base64url");
        expect(signature(other)).toEqual(signature(tokenA));
        return `Bearer ${other}`;
      },
    ],
    ["alg none", async () => `Bearer ${enc({ alg: "none", kid: key.kid, typ: "JWT" })}.${enc(decodeJwt(tokenA))}.`],
    [
      "HS256 keyed with the public key",
      async () => {
        const secret = base64url.decode(publicJwk(key.publicKey).x!);
        return `Bearer ${await new SignJWT(decodeJwt(tokenA)).setProtectedHeader({ alg: "HS256", kid: key.kid }).sign(secret)}`;
      },
    ],
    ["wrong issuer", async () => `Bearer ${await resign({ iss: "someone-else" })}`],
    ["expired", async () => `Bearer ${await resign({ exp: Math.floor(Date.now() / 1000) - 60 })}`],
    [
      "no kid",
      async () =>
        `Bearer ${await new SignJWT(decodeJwt(tokenA)).setProtectedHeader({ alg: "EdDSA" }).sign(key.privateKey)}`,
    ],
    ["signed by an unknown key", async () => `Bearer ${await resign({}, await signingKeyFrom(newEd25519Key()))}`],
    ["deleted service account", async () => `Bearer ${deletedToken}`],
    [
      "admin token with one character changed",
      async () => `Bearer ${t.adminToken.slice(0, -1)}${t.adminToken.endsWith("A") ? "B" : "A"}`,
    ],
  ];

  it.each(cases)("REST: %s → 401 unauthenticated, saying nothing of which check failed", async (_name, header) => {
    const { status, body } = await restStatus(await header());
    expect(status).toBe(401);
    expect(body.code).toBe("unauthenticated");
    expect(body.message).toMatch(/^(missing bearer token: send Authorization: Bearer <token>|invalid bearer token)$/);
  });

  it("REST: a token of project p-a on project p-b → 403 permission_denied", async () => {
    const { status, body } = await restStatus(`Bearer ${tokenA}`, "/v2/projects/p-b/service-accounts");
    expect(status).toBe(403);
    expect(body.code).toBe("permission_denied");
    expect((await restStatus(`Bearer ${tokenB}`, "/v2/projects/p-b/service-accounts")).status).toBe(200);
  });

  it("gRPC and Connect: no token and a tampered token are unauthenticated, another project's is permission_denied", async () => {
    const clients = {
      grpc: (token?: string) =>
        createClient(
          ManagementService,
          createGrpcTransport({ baseUrl: t.url, interceptors: token ? [bearer(token)] : [] }),
        ),
      connect: (token?: string) =>
        createClient(
          ManagementService,
          createConnectTransport({ baseUrl: t.url, httpVersion: "1.1", interceptors: token ? [bearer(token)] : [] }),
        ),
    };
    const tampered = `${tokenA.slice(0, -4)}AAAA`;
    for (const [name, client] of Object.entries(clients)) {
      await expect(client().listServiceAccounts({ projectId: "p-a" }), name).rejects.toMatchObject({
        code: Code.Unauthenticated,
      });
      await expect(client(tampered).listServiceAccounts({ projectId: "p-a" }), name).rejects.toMatchObject({
        code: Code.Unauthenticated,
      });
      await expect(client(deletedToken).listServiceAccounts({ projectId: "p-a" }), name).rejects.toMatchObject({
        code: Code.Unauthenticated,
      });
      await expect(client(tokenA).listServiceAccounts({ projectId: "p-b" }), name).rejects.toMatchObject({
        code: Code.PermissionDenied,
      });
      expect(
        (await client(tokenA).listServiceAccounts({ projectId: "p-a" })).serviceAccounts.length,
        name,
      ).toBeGreaterThan(0);
    }
  });

  it("a service account token cannot create projects, and lists only its own project", async () => {
    // Named after what it needs (the admin token), its own project's id or another's, or none.
    for (const projectId of ["p-c", "p-a", ""])
      await expect(t.management(tokenA).createProject({ projectId }), projectId).rejects.toMatchObject({
        code: Code.PermissionDenied,
        rawMessage: "only the admin token can create projects",
      });
    await expect(t.management(tokenA).getProject({ projectId: "p-a" })).resolves.toBeDefined();
    const own = await t.management(tokenA).listProjects({});
    expect(own.projects.map((p) => p.projectId)).toEqual(["p-a"]);
    const all = await t.management().listProjects({});
    expect(all.projects.map((p) => p.projectId)).toEqual(["p-a", "p-b", "p-dev"]);
  });

  it("GetIdentity tells admin from a service account", async () => {
    expect(await t.management().getIdentity({})).toMatchObject({ kind: "admin", projectId: "" });
    expect(await t.management(tokenA).getIdentity({})).toMatchObject({
      kind: "service_account",
      projectId: "p-a",
      serviceAccountId: accountA,
    });
  });

  it("a token whose exp passes is refused, although it was accepted (and cached) before", async () => {
    const expiresAt = new Date(Math.ceil(Date.now() / 1000) * 1000 + 1_000);
    const token = await issueToken(key, { projectId: "p-a", serviceAccountId: accountA, expiresAt });
    expect((await restStatus(`Bearer ${token}`)).status).toBe(200);
    await new Promise((r) => setTimeout(r, expiresAt.getTime() - Date.now() + 50));
    expect((await restStatus(`Bearer ${token}`)).status).toBe(401);
  });

  it("deleting a service account revokes its token at once in the same process, cached or not", async () => {
    const admin = t.management();
    const sa = await admin.createServiceAccount({
      projectId: "p-a",
      name: "short",
      expiresAt: timestampFromDate(new Date(Date.now() + DAY_MS)),
    });
    expect((await restStatus(`Bearer ${sa.token}`)).status).toBe(200);
    await admin.deleteServiceAccount({ projectId: "p-a", serviceAccountId: sa.serviceAccount!.serviceAccountId });
    expect((await restStatus(`Bearer ${sa.token}`)).status).toBe(401);
  });

  it("a service account deleted and made again under the same id does not revive its old tokens", async () => {
    const expiresAt = new Date(Date.now() + DAY_MS);
    const old = await issueToken(key, { projectId: "p-dev", serviceAccountId: "sa-dev", expiresAt });
    expect((await restStatus(`Bearer ${old}`, "/v2/projects/p-dev")).status).toBe(200);
    await t.management().deleteServiceAccount({ projectId: "p-dev", serviceAccountId: "sa-dev" });
    await new Promise((r) => setTimeout(r, 1_100)); // the new record's created_at is a later second than the token's iat
    const again = await startTestSkiff({ nats: t.nats, dataDir: t.dataDir }); // bootstrap makes sa-dev again
    try {
      expect((await restStatus(`Bearer ${again.devToken}`, "/v2/projects/p-dev")).status).toBe(200);
      expect((await restStatus(`Bearer ${old}`, "/v2/projects/p-dev")).status).toBe(401);
    } finally {
      await again.close();
    }
  });

  it("property: random bearer strings never get anything but 401", async () => {
    const b64 = fc.string({
      unit: fc.constantFrom(..."ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"),
      minLength: 0,
      maxLength: 60,
    });
    const printable = fc.string({
      unit: fc.integer({ min: 0x21, max: 0x7e }).map((c) => String.fromCharCode(c)),
      minLength: 1,
      maxLength: 200,
    });
    const jwtShaped = fc.tuple(b64, b64, b64).map((parts) => `eyJ${parts.join(".")}`);
    // The last character of a base64url segment carries padding bits: changing only those keeps the same bytes.
    const lastOfSegment = (i: number) => i === tokenA.length - 1 || tokenA[i + 1] === ".";
    const mutated = fc
      .tuple(
        fc.nat(tokenA.length - 1).filter((i) => !lastOfSegment(i)),
        fc.constantFrom(..."ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_."),
      )
      .map(([i, c]) => tokenA.slice(0, i) + c + tokenA.slice(i + 1))
      .filter((s) => s !== tokenA);
    await fc.assert(
      fc.asyncProperty(fc.oneof(printable, jwtShaped, mutated), async (token) => {
        const { status, body } = await restStatus(`Bearer ${token}`);
        expect(status).toBe(401);
        expect(body.code).toBe("unauthenticated");
      }),
      { numRuns: 300 },
    );
  });
});
