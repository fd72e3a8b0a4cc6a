import { execFileSync } from "node:child_process";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { delayAfter, judgeAttempt, MAX_ATTEMPTS, MAX_DELAY_MS, nextStep } from "../../services/webhook/retry-policy.js";
import {
  signWebhook,
  verifyWebhook,
  WebhookVerificationError,
  type WebhookVerificationReason,
} from "../../services/webhook/signature.js";
import { TEST_ROOT } from "../helpers/paths.js";

// Fixed vectors: HMAC-SHA256(secret, "{request id}.{timestamp}.{body}"), lowercase hex,
// computed independently with Python's hmac module.
const VECTORS = [
  {
    secret: "whsec_test",
    requestId: "01JD0Q3ZK8Y7S1V6W5X4T3R2Q1",
    timestamp: 1795238400,
    body: '{"run_id":"01JD0Q3ZK8Y7S1V6W5X4T3R2Q1","result":{"hello":"world"},"run_time_ms":12.5}',
    signature: "v1,02ae6f9c1122b3f313ee3a3db4182e29daf1338fde8dff54806629849923d61e",
  },
  {
    secret: "s3cr3t",
    requestId: "run-2",
    timestamp: 1700000000,
    body: "",
    signature: "v1,67ccbfdcc036a00ea436d1cb4e4922c15560e5f6257dccc49f97bf0c6ae06196",
  },
  {
    // A secret as a caller types it, non-ASCII and with base64 punctuation: the key is its UTF-8 bytes.
    secret: "my-s3cret-ü+/=",
    requestId: "run-3",
    timestamp: 1700000001,
    body: '{"ok":true}',
    signature: "v1,c582e22cbf069d99d06750d9ad47dba2defff01c8f2857d846e214a1a409f2ef",
  },
  {
    secret: "unicode-é",
    requestId: "run-ü",
    timestamp: 1,
    body: "café ☃",
    signature: "v1,7a5ed6628a816160d3239168ab89276fecd034cbf3e06523c3146b52136f12aa",
  },
];

function headersOf(v: (typeof VECTORS)[number]) {
  return {
    "X-Request-Id": v.requestId,
    "X-Service-Webhook-Timestamp": String(v.timestamp),
    "X-Service-Webhook-Signature": v.signature,
  };
}

function reason(f: () => unknown): WebhookVerificationReason | undefined {
  try {
    f();
  } catch (err) {
    if (err instanceof WebhookVerificationError) return err.reason;
    throw err;
  }
  return undefined;
}

describe("webhook signature", () => {
  it.each(VECTORS)("signs the fixed vector $requestId exactly", (v) => {
    const h = signWebhook({ secret: v.secret, requestId: v.requestId, body: v.body, timestamp: v.timestamp });
    expect(h["x-service-webhook-signature"]).toBe(v.signature);
    expect(h["x-service-webhook-timestamp"]).toBe(String(v.timestamp));
    expect(h["x-request-id"]).toBe(v.requestId);
  });

  it.each(VECTORS)("verifies the fixed vector $requestId from a string and from bytes", (v) => {
    expect(verifyWebhook({ secret: v.secret, headers: headersOf(v), body: v.body, now: v.timestamp })).toBe(
      v.requestId,
    );
    expect(
      verifyWebhook({
        secret: v.secret,
        headers: new Headers(headersOf(v) as Record<string, string>),
        body: Buffer.from(v.body),
        now: v.timestamp + 10,
      }),
    ).toBe(v.requestId);
  });

  const v = VECTORS[0];
  const ok = { secret: v.secret, headers: headersOf(v), body: v.body, now: v.timestamp };

  it("a missing header fails as missing_header", () => {
    const { "X-Service-Webhook-Signature": _, ...rest } = headersOf(v);
    expect(reason(() => verifyWebhook({ ...ok, headers: rest }))).toBe("missing_header");
  });

  it("a signature without the v1, prefix or not hex fails as bad_signature_format", () => {
    expect(
      reason(() =>
        verifyWebhook({ ...ok, headers: { ...headersOf(v), "X-Service-Webhook-Signature": v.signature.slice(3) } }),
      ),
    ).toBe("bad_signature_format");
    expect(
      reason(() => verifyWebhook({ ...ok, headers: { ...headersOf(v), "X-Service-Webhook-Signature": "v1,zz" } })),
    ).toBe("bad_signature_format");
  });

  it("a timestamp that is not unix seconds fails as bad_timestamp", () => {
    expect(
      reason(() => verifyWebhook({ ...ok, headers: { ...headersOf(v), "X-Service-Webhook-Timestamp": "2026-11-21" } })),
    ).toBe("bad_timestamp");
  });

  it("a delivery older than the tolerance fails as timestamp_too_old, one from the future as timestamp_in_future", () => {
    expect(reason(() => verifyWebhook({ ...ok, now: v.timestamp + 301 }))).toBe("timestamp_too_old");
    expect(reason(() => verifyWebhook({ ...ok, now: v.timestamp - 301 }))).toBe("timestamp_in_future");
    expect(reason(() => verifyWebhook({ ...ok, now: v.timestamp + 3600, toleranceSeconds: 3600 }))).toBeUndefined();
  });

  it("a changed body, request id, timestamp or secret fails as signature_mismatch", () => {
    expect(reason(() => verifyWebhook({ ...ok, body: v.body + " " }))).toBe("signature_mismatch");
    expect(reason(() => verifyWebhook({ ...ok, headers: { ...headersOf(v), "X-Request-Id": "other" } }))).toBe(
      "signature_mismatch",
    );
    expect(
      reason(() =>
        verifyWebhook({ ...ok, headers: { ...headersOf(v), "X-Service-Webhook-Timestamp": String(v.timestamp + 1) } }),
      ),
    ).toBe("signature_mismatch");
    expect(reason(() => verifyWebhook({ ...ok, secret: "whsec_other" }))).toBe("signature_mismatch");
  });

  it("the README's Python verifier accepts the same vectors and rejects a tampered body", () => {
    const script = `
import json, sys
sys.path.insert(0, ${JSON.stringify(join(TEST_ROOT, "../examples/webhook-receiver"))})
from verify_webhook import verify_webhook
out = []
for v in json.load(sys.stdin):
    h = {"X-Request-Id": v["requestId"], "X-Service-Webhook-Timestamp": str(v["timestamp"]), "X-Service-Webhook-Signature": v["signature"]}
    body = v["body"].encode()
    out.append(verify_webhook(v["secret"], h, body, now=v["timestamp"]))
    try:
        verify_webhook(v["secret"], h, body + b"x", now=v["timestamp"])
        out.append("accepted tampered body")
    except ValueError as e:
        out.append(str(e))
print(json.dumps(out))
`;
    const out = JSON.parse(execFileSync("python3", ["-c", script], { input: JSON.stringify(VECTORS) }).toString());
    expect(out).toEqual(VECTORS.flatMap((x) => [x.requestId, "signature mismatch"]));
  });
});

describe("webhook retry table (spec 6.2)", () => {
  it.each([
    [undefined, "retry"],
    [200, "delivered"],
    [204, "delivered"],
    [299, "delivered"],
    [404, "retry"],
    [400, "failed"],
    [401, "failed"],
    [410, "failed"],
    [499, "failed"],
    [500, "failed"],
    [503, "failed"],
    [301, "retry"],
    [302, "retry"],
    [304, "retry"],
    [100, "retry"],
    [600, "retry"],
  ] as const)("status %s → %s", (status, verdict) => {
    expect(judgeAttempt(status)).toBe(verdict);
  });

  it("stops after 3 attempts in total, at most 5 s apart", () => {
    expect(MAX_ATTEMPTS).toBe(3);
    expect(nextStep(1, "retry")).toBe("retry");
    expect(nextStep(2, "retry")).toBe("retry");
    expect(nextStep(3, "retry")).toBe("give_up");
    expect(nextStep(1, "failed")).toBe("give_up");
    expect(nextStep(2, "delivered")).toBe("done");
    for (let a = 1; a < 10; a++) expect(delayAfter(a)).toBeLessThanOrEqual(MAX_DELAY_MS);
  });
});
