// NATS plumbing: connecting (or starting a local nats-server), the layout of
// every subject, stream, bucket and object store, provisioning it, and views
// of KV buckets fed by watches.
export { connectNats, provision } from "./connect.js";
export type { NatsHandle } from "./connect.js";
export { JsErrorCode, isJsError, jsErrorCode } from "./errors.js";
export { KvView, followKv, jsonOf } from "./kv-view.js";
export type { KvFollower } from "./kv-view.js";
export { RUN_RETENTION_MS, buckets, objectStores, streams, subjects } from "./layout.js";
