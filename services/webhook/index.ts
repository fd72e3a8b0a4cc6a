// The webhook role: signed, retried, durable delivery of run results from a
// consumer of SKIFF_WEBHOOKS shared by every webhook process.
export { startWebhookRole } from "./role.js";
