// NATS plumbing: connecting (or starting a local nats-server), the layout of
// every subject, stream, consumer, bucket and object store, provisioning it,
// ensuring consumers, pipelined acknowledged publishes, JetStream API errors,
// views of KV buckets fed by watches, and byte streams between two processes
// over a subject pair.
export { PublishError, confirmAck, publishAcked } from "./acked-publish.js";
export {
  BACKGROUND_FLUSH_MS,
  WAITED_FLUSH_MS,
  beforeWrite,
  inBackground,
  inBackgroundIf,
  publishInBackground,
} from "./coalesce.js";
export { connectNats, provision, STARTED_SERVER_SEED_FILE } from "./connect.js";
export type { NatsHandle } from "./connect.js";
export { ensureConsumer } from "./consumers.js";
export { JsErrorCode, isJsError, isStreamFull, jsErrorCode } from "./errors.js";
export {
  FULL_AT,
  HISTORY_STORE,
  STORE_SPECS,
  StoreWatch,
  WARN_AT,
  derivedBudget,
  explicitBudget,
  freeDiskBytes,
  mib,
} from "./budgets.js";
export type { AtBudget, BudgetPlan, BudgetSettings, StoreMeasure, StoreSpec, StoreUsage } from "./budgets.js";
export { kvGetLatest, streamMessage } from "./kv-get.js";
export { KvPurger, allRevisions, keepAfterAckMs, kvPurgeKey, kvRemoveKey } from "./kv-purge.js";
export type { KvGetEntry } from "./kv-get.js";
export { KvView, followKv, jsonOf, kvKeys } from "./kv-view.js";
export type { KvFollower } from "./kv-view.js";
export {
  MAX_RUN_ATTEMPTS,
  RUN_RETENTION_MS,
  buckets,
  eventsMaxAgeMs,
  consumers,
  objectStores,
  streams,
  subjects,
} from "./layout.js";
