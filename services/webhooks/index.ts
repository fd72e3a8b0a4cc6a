// Webhooks: the records of their deliveries (KV `skiff-webhooks`) and what
// the management API shows of them, redelivery, the SSRF guard for webhook
// addresses, and sealed webhook secrets (KV `skiff-secrets`). The webhook
// role delivers; the invocation role checks addresses and seals secrets.
export { AddressGuard, BlockedAddressError } from "./address-guard.js";
export { RedeliveryError, listDeliveries, redeliver } from "./deliveries.js";
export { DeliveryStore, isKeyToken, newDeliveryRecord, revisionsIfOver, stateOf } from "./delivery-store.js";
export type { AttemptRecord, AttemptVerdict, DeliveryRecord } from "./delivery-store.js";
export { InvalidWebhookEndpointError, validateWebhookEndpoint } from "./endpoint.js";
export { UnsealError, createSecretBox, loadWebhookSecret, secretsBucket, storeWebhookSecret } from "./secrets.js";
export type { SecretBox } from "./secrets.js";
