import { describe, expect, test } from "vitest";
import { AddressGuard } from "../../services/webhooks/address-guard.js";
import {
  InvalidWebhookEndpointError,
  MAX_WEBHOOK_URL_LENGTH,
  validateWebhookEndpoint,
  type InvalidWebhookEndpointReason,
} from "../../services/webhooks/endpoint.js";

async function reason(raw: string, guard = new AddressGuard()): Promise<InvalidWebhookEndpointReason | undefined> {
  try {
    await validateWebhookEndpoint(raw, guard);
    return undefined;
  } catch (err) {
    if (err instanceof InvalidWebhookEndpointError) return err.reason;
    throw err;
  }
}

describe("webhookEndpoint validation", () => {
  test.each([
    ["/relative/path", "not_a_url"],
    ["not a url", "not_a_url"],
    ["ftp://93.184.216.34/x", "scheme"],
    ["file:///etc/passwd", "scheme"],
    ["javascript:alert(1)", "scheme"],
    ["https://user:pass@93.184.216.34/hook", "credentials"],
    [`https://93.184.216.34/${"a".repeat(MAX_WEBHOOK_URL_LENGTH)}`, "too_long"],
    ["https://name.invalid/hook", "unresolvable"],
    ["http://127.0.0.1:8080/hook", "blocked"],
    ["http://localhost/hook", "blocked"],
    ["http://169.254.169.254/latest/meta-data", "blocked"],
    ["http://[::1]/hook", "blocked"],
    ["http://10.0.0.7/hook", "blocked"],
  ])("webhook - %s is refused (%s)", async (raw, why) => {
    expect(await reason(raw)).toBe(why);
  });

  test("webhook - an invalid endpoint's message names webhookEndpoint and says why", async () => {
    await expect(validateWebhookEndpoint("http://127.0.0.1/x", new AddressGuard())).rejects.toThrow(
      /^webhookEndpoint: .*127\.0\.0\.1.*SKIFF_WEBHOOK_ALLOWED_CIDRS/,
    );
    await expect(validateWebhookEndpoint("gopher://93.184.216.34/", new AddressGuard())).rejects.toThrow(
      "webhookEndpoint: scheme gopher is not supported; use http or https",
    );
  });

  test("webhook - public http(s) endpoints, and exempted ranges, are accepted as URLs", async () => {
    const url = await validateWebhookEndpoint("https://93.184.216.34:8443/hook?token=abc", new AddressGuard());
    expect(url.href).toBe("https://93.184.216.34:8443/hook?token=abc");
    expect(
      (await validateWebhookEndpoint("http://localhost:9/x", new AddressGuard(["127.0.0.0/8", "::1/128"]))).hostname,
    ).toBe("localhost");
  });
});
