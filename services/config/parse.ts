// Parsers of setting values that need more than a type check: CIDR ranges,
// the Ed25519 signing key and the AES secrets key. They live here, below every
// domain, so that validating the configuration loads nothing but node: modules.
import { createPrivateKey, type JsonWebKey, type KeyObject } from "node:crypto";
import net from "node:net";

export const SECRETS_KEY_BYTES = 32;

export class SecretsKeyError extends Error {
  override name = "SecretsKeyError";
}

/** Decodes a SKIFF_SECRETS_KEY value; throws SecretsKeyError saying what is wrong. */
export function parseSecretsKey(raw: string): Buffer {
  const text = raw.trim();
  if (!/^[A-Za-z0-9+/_-]+={0,2}$/.test(text)) throw new SecretsKeyError("must be base64");
  const key = Buffer.from(text, "base64");
  if (key.length !== SECRETS_KEY_BYTES)
    throw new SecretsKeyError(
      `must decode to ${SECRETS_KEY_BYTES} bytes, got ${key.length} (make one with: openssl rand -base64 32)`,
    );
  return key;
}

/**
 * Reads an Ed25519 private key given as a JWK (JSON, `{"kty":"OKP","crv":"Ed25519","d":…,"x":…}`)
 * or as PKCS#8 PEM (`-----BEGIN PRIVATE KEY-----`). Throws a message fit for the operator.
 */
export function parsePrivateKey(text: string): KeyObject {
  const raw = text.trim();
  let key: KeyObject;
  try {
    key = raw.startsWith("{")
      ? createPrivateKey({ key: JSON.parse(raw) as JsonWebKey, format: "jwk" })
      : createPrivateKey(raw.replace(/\\n/g, "\n"));
  } catch {
    throw new TypeError("expected an Ed25519 private key as a JWK (JSON) or PKCS#8 PEM");
  }
  if (key.asymmetricKeyType !== "ed25519")
    throw new TypeError(`expected an Ed25519 key, got ${key.asymmetricKeyType ?? "another kind of key"}`);
  return key;
}

export function parseCidr(cidr: string): { address: string; prefix: number; family: "ipv4" | "ipv6" } {
  const [address, bits, extra] = cidr.trim().split("/");
  const kind = net.isIP(address ?? "");
  if (kind === 0 || extra !== undefined) throw new Error(`not a CIDR range: "${cidr}"`);
  const max = kind === 4 ? 32 : 128;
  const prefix = bits === undefined ? max : Number(bits);
  if (!/^\d+$/.test(bits ?? String(max)) || prefix > max) throw new Error(`bad prefix length in "${cidr}"`);
  return { address, prefix, family: kind === 4 ? "ipv4" : "ipv6" };
}
