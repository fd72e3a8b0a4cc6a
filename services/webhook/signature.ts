// Webhook signatures (spec section 6.3). Standalone: only node:crypto, so a
// receiver can import this file (or copy it) to verify deliveries.
//
//   X-Request-Id:                 the run id
//   X-Service-Webhook-Timestamp:  unix seconds when this attempt was sent
//   X-Service-Webhook-Signature:  "v1," + lowercase hex HMAC-SHA256(secret,
//                                 "{X-Request-Id}.{timestamp}.{raw body}")
import { createHmac, timingSafeEqual } from "node:crypto";

const HEADER_REQUEST_ID = "x-request-id";
const HEADER_TIMESTAMP = "x-service-webhook-timestamp";
const HEADER_SIGNATURE = "x-service-webhook-signature";
const SIGNATURE_VERSION = "v1";
/** How far a delivery's timestamp may be from the receiver's clock by default. */
const DEFAULT_TOLERANCE_SECONDS = 5 * 60;

type Body = string | Uint8Array;

function hmacHex(secret: string, requestId: string, timestamp: string, body: Body): string {
  const mac = createHmac("sha256", secret);
  mac.update(`${requestId}.${timestamp}.`);
  mac.update(body);
  return mac.digest("hex");
}

/** The headers that sign one delivery attempt. */
export function signWebhook(opts: {
  secret: string;
  requestId: string;
  body: Body;
  timestamp?: number;
}): Record<string, string> {
  const timestamp = String(opts.timestamp ?? Math.floor(Date.now() / 1000));
  return {
    [HEADER_REQUEST_ID]: opts.requestId,
    [HEADER_TIMESTAMP]: timestamp,
    [HEADER_SIGNATURE]: `${SIGNATURE_VERSION},${hmacHex(opts.secret, opts.requestId, timestamp, opts.body)}`,
  };
}

export type WebhookVerificationReason =
  | "missing_header"
  | "bad_signature_format"
  | "bad_timestamp"
  | "timestamp_too_old"
  | "timestamp_in_future"
  | "signature_mismatch";

export class WebhookVerificationError extends Error {
  override name = "WebhookVerificationError";
  constructor(
    readonly reason: WebhookVerificationReason,
    message: string,
  ) {
    super(message);
  }
}

type HeaderSource = Headers | Record<string, string | string[] | undefined>;

function header(headers: HeaderSource, name: string): string | undefined {
  if (headers instanceof Headers) return headers.get(name) ?? undefined;
  for (const [k, v] of Object.entries(headers)) {
    if (k.toLowerCase() === name) return Array.isArray(v) ? v[0] : v;
  }
  return undefined;
}

/**
 * Verifies a delivery: the raw body exactly as received, its headers and the
 * secret given in X-Webhook-Secret on the invoking call. Throws a
 * WebhookVerificationError saying why it failed; returns the request id.
 * The comparison is constant-time.
 */
export function verifyWebhook(opts: {
  secret: string;
  headers: HeaderSource;
  body: Body;
  toleranceSeconds?: number;
  now?: number;
}): string {
  const requestId = header(opts.headers, HEADER_REQUEST_ID);
  const timestamp = header(opts.headers, HEADER_TIMESTAMP);
  const signature = header(opts.headers, HEADER_SIGNATURE);
  if (!requestId || !timestamp || !signature) {
    throw new WebhookVerificationError(
      "missing_header",
      `missing one of ${HEADER_REQUEST_ID}, ${HEADER_TIMESTAMP}, ${HEADER_SIGNATURE}`,
    );
  }
  const prefix = `${SIGNATURE_VERSION},`;
  const received = signature.startsWith(prefix) ? signature.slice(prefix.length) : "";
  if (!/^[0-9a-f]{64}$/.test(received))
    throw new WebhookVerificationError(
      "bad_signature_format",
      `signature must be "${prefix}" and 64 lowercase hex digits`,
    );
  if (!/^\d{1,12}$/.test(timestamp))
    throw new WebhookVerificationError("bad_timestamp", "timestamp must be unix seconds");
  const tolerance = opts.toleranceSeconds ?? DEFAULT_TOLERANCE_SECONDS;
  const now = opts.now ?? Math.floor(Date.now() / 1000);
  const age = now - Number(timestamp);
  if (age > tolerance)
    throw new WebhookVerificationError("timestamp_too_old", `timestamp is ${age} s old (tolerance ${tolerance} s)`);
  if (-age > tolerance)
    throw new WebhookVerificationError(
      "timestamp_in_future",
      `timestamp is ${-age} s in the future (tolerance ${tolerance} s)`,
    );
  const expected = Buffer.from(hmacHex(opts.secret, requestId, timestamp, opts.body), "hex");
  if (!timingSafeEqual(expected, Buffer.from(received, "hex")))
    throw new WebhookVerificationError("signature_mismatch", "signature does not match");
  return requestId;
}
