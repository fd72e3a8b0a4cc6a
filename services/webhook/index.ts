// The webhook role: signed, retried, durable delivery of run results, the
// SSRF guard for webhook addresses, and sealed webhook secrets.
export { AddressGuard } from "./address-guard.js";
export { RedeliveryError, listDeliveries, redeliver } from "./deliveries.js";
export { InvalidWebhookEndpointError, validateWebhookEndpoint } from "./endpoint.js";
export { startWebhookRole } from "./role.js";
export { createSecretBox, secretsBucket, storeWebhookSecret } from "./secrets.js";
export type { SecretBox } from "./secrets.js";
