// NATS plumbing: connecting (or starting a local nats-server), the layout of
// every subject, stream, consumer, bucket and object store, provisioning it,
// ensuring consumers, JetStream API errors, and views of KV buckets fed by
// watches.
export { connectNats, provision } from "./connect.js";
export type { NatsHandle } from "./connect.js";
export { ensureConsumer } from "./consumers.js";
export type { ConsumerChange } from "./consumers.js";
export { JsErrorCode, isJsError, jsErrorCode } from "./errors.js";
export { KvView, followKv, jsonOf } from "./kv-view.js";
export type { KvFollower } from "./kv-view.js";
export { MAX_RUN_ATTEMPTS, RUN_RETENTION_MS, buckets, consumers, objectStores, streams, subjects } from "./layout.js";
export type { ConsumerSpec } from "./layout.js";
