// Checks a call's webhookEndpoint before the run starts, so a URL that can
// never be delivered to is a 400 to the caller rather than a failed delivery
// found later. The address is checked again at connect time (post.ts): a name
// may resolve differently by then.
import { AddressGuard, BlockedAddressError } from "./address-guard.js";

export const MAX_WEBHOOK_URL_LENGTH = 2048;

export type InvalidWebhookEndpointReason =
  "too_long" | "not_a_url" | "scheme" | "credentials" | "no_host" | "unresolvable" | "blocked";

/** An unusable webhookEndpoint; the invocation role answers it with 400 (invalid_argument). */
export class InvalidWebhookEndpointError extends Error {
  override name = "InvalidWebhookEndpointError";
  constructor(
    readonly reason: InvalidWebhookEndpointReason,
    message: string,
    options?: ErrorOptions,
  ) {
    super(`webhookEndpoint: ${message}`, options);
  }
}

export async function validateWebhookEndpoint(raw: string, guard: AddressGuard): Promise<URL> {
  if (raw.length > MAX_WEBHOOK_URL_LENGTH)
    throw new InvalidWebhookEndpointError("too_long", `longer than ${MAX_WEBHOOK_URL_LENGTH} characters`);
  let url: URL;
  try {
    url = new URL(raw);
  } catch (err) {
    throw new InvalidWebhookEndpointError("not_a_url", "not an absolute URL (http://… or https://…)", { cause: err });
  }
  if (url.protocol !== "http:" && url.protocol !== "https:")
    throw new InvalidWebhookEndpointError(
      "scheme",
      `scheme ${url.protocol.slice(0, -1)} is not supported; use http or https`,
    );
  // Credentials would be stored with the delivery and shown in its listing; X-Webhook-Secret signs instead.
  if (url.username !== "" || url.password !== "")
    throw new InvalidWebhookEndpointError(
      "credentials",
      "user:password@ in the URL is not supported; use X-Webhook-Secret to authenticate deliveries",
    );
  if (url.hostname === "") throw new InvalidWebhookEndpointError("no_host", "the URL has no host");
  try {
    await guard.check(url.hostname);
  } catch (err) {
    if (err instanceof BlockedAddressError)
      throw new InvalidWebhookEndpointError("blocked", err.message, { cause: err });
    const code = (err as NodeJS.ErrnoException).code ?? "";
    throw new InvalidWebhookEndpointError(
      "unresolvable",
      `host ${url.hostname} does not resolve${code ? ` (${code})` : ""}`,
      { cause: err },
    );
  }
  return url;
}
