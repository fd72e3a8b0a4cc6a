// Service account tokens: JWTs signed with Ed25519 (JWS alg "EdDSA"), the
// signing key named by the `kid` header so that keys can rotate while tokens
// signed with an older key keep verifying. Claims: iss, sub (service account
// id), project_id, iat, exp (the expiry chosen for the account), jti.
import { createPrivateKey, createPublicKey, generateKeyPairSync, randomUUID, type KeyObject } from "node:crypto";
import { SignJWT, calculateJwkThumbprint, jwtVerify, type JWK } from "jose";
import { parsePrivateKey } from "../config/index.js";
import { PROJECT_ID, SERVICE_ACCOUNT_ID } from "./account-rules.js";

export { parsePrivateKey };

const TOKEN_ISSUER = "skiff";
const TOKEN_ALGORITHM = "EdDSA";
/** Key ids are JWK thumbprints (base64url SHA-256): anything else is not one of ours. */
export const KID = /^[A-Za-z0-9_-]{43}$/;

export interface SigningKey {
  kid: string;
  privateKey: KeyObject;
  publicKey: KeyObject;
}

/** Why a token was refused; for debug logs only, never for the caller. */
export class TokenError extends Error {
  override name = "TokenError";
}

/** The public half of a key, as the JWK stored for verifiers. */
export function publicJwk(key: KeyObject): JWK {
  return (key.type === "public" ? key : createPublicKey(key)).export({ format: "jwk" }) as JWK;
}

/**
 * A new Ed25519 private key, as a key object of its own. Node's key
 * generation leaves a job object holding the key's lock until the garbage
 * collector frees it: a collection that frees it while that same key is
 * being exported (to JWK, or as a public key) deadlocks the process, which
 * hung a first start of skiff (its signing key made and exported at once)
 * and, in a loop of 15 s with a small young generation, happened every
 * time. The key is made in DER and read again, so nothing else holds its
 * lock.
 */
export function newEd25519Key(): KeyObject {
  const { privateKey } = generateKeyPairSync("ed25519", {
    privateKeyEncoding: { format: "der", type: "pkcs8" },
    publicKeyEncoding: { format: "der", type: "spki" },
  });
  return createPrivateKey({ key: privateKey, format: "der", type: "pkcs8" });
}

export async function signingKeyFrom(privateKey: KeyObject): Promise<SigningKey> {
  const publicKey = createPublicKey(privateKey);
  return { kid: await calculateJwkThumbprint(publicJwk(publicKey)), privateKey, publicKey };
}

export interface TokenSubject {
  projectId: string;
  serviceAccountId: string;
  /** Becomes `exp`, in whole seconds. */
  expiresAt: Date;
}

export async function issueToken(key: SigningKey, subject: TokenSubject): Promise<string> {
  return new SignJWT({ project_id: subject.projectId })
    .setProtectedHeader({ alg: TOKEN_ALGORITHM, kid: key.kid, typ: "JWT" })
    .setIssuer(TOKEN_ISSUER)
    .setSubject(subject.serviceAccountId)
    .setIssuedAt()
    .setExpirationTime(Math.floor(subject.expiresAt.getTime() / 1000))
    .setJti(randomUUID())
    .sign(key.privateKey);
}

export interface VerifiedToken {
  projectId: string;
  serviceAccountId: string;
  /** Seconds since the epoch. */
  issuedAt: number;
  expiresAt: number;
  tokenId: string;
}

/** Finds the public key of a kid; undefined when there is none. */
export type KeyLookup = (kid: string) => KeyObject | undefined | Promise<KeyObject | undefined>;

/**
 * Checks signature, algorithm, issuer, expiry and claim shapes. Throws
 * TokenError for a token that is refused; an error of the key lookup itself
 * (NATS unreachable) is thrown as it is, since it says nothing of the token.
 */
export async function verifyToken(token: string, lookup: KeyLookup): Promise<VerifiedToken> {
  // base64url leaves the last character's low bits unused: several spellings decode to the same signature, and
  // jose accepts them all. One token has one spelling (what was issued): an altered character is refused.
  const signature = token.slice(token.lastIndexOf(".") + 1);
  if (Buffer.from(signature, "base64url").toString("base64url") !== signature)
    throw new TokenError("signature not written as base64url writes it");
  let lookupError: unknown;
  let payload;
  try {
    ({ payload } = await jwtVerify(
      token,
      async (header) => {
        if (typeof header.kid !== "string" || !KID.test(header.kid)) throw new TokenError("no kid of ours");
        let key;
        try {
          key = await lookup(header.kid);
        } catch (err) {
          lookupError = err;
          throw err;
        }
        if (!key) throw new TokenError("unknown kid");
        return key;
      },
      { algorithms: [TOKEN_ALGORITHM], issuer: TOKEN_ISSUER, requiredClaims: ["sub", "iat", "exp", "jti"] },
    ));
  } catch (err) {
    if (lookupError !== undefined) throw lookupError;
    throw err instanceof TokenError ? err : new TokenError(err instanceof Error ? err.message : String(err));
  }
  const { sub, project_id, iat, exp, jti } = payload;
  if (typeof sub !== "string" || !SERVICE_ACCOUNT_ID.test(sub)) throw new TokenError("bad sub");
  if (typeof project_id !== "string" || !PROJECT_ID.test(project_id)) throw new TokenError("bad project_id");
  if (typeof iat !== "number" || typeof exp !== "number" || typeof jti !== "string") throw new TokenError("bad claims");
  return { projectId: project_id, serviceAccountId: sub, issuedAt: iat, expiresAt: exp, tokenId: jti };
}
