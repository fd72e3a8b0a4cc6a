// What the invocation handlers work with; role.ts builds it once per process.
import type { JetStreamClient, KV, NatsConnection } from "nats";
import type { Runner } from "../runner/index.js";
import type { AppRegistry } from "../apps/index.js";
import type { Logger } from "../config/index.js";
import type { StoreWatch } from "../nats/index.js";
import type { RunControl, RunResults, RunStore, BodyTransfer } from "../runs/index.js";
import type { SecretBox, AddressGuard } from "../webhook/index.js";
import type { QueueDepths } from "./queue-depth.js";

export interface InvocationDeps {
  nc: NatsConnection;
  js: JetStreamClient;
  /** Runs waiting or running per app, for SKIFF_MAX_QUEUED_RUNS. */
  queueDepths: QueueDepths;
  registry: AppRegistry;
  /** This process's runner, when the runner role runs here: sync runs of its apps skip NATS. */
  runner: Runner | undefined;
  runs: RunStore;
  results: RunResults;
  transfer: BodyTransfer;
  control: RunControl;
  secrets: KV;
  box: SecretBox;
  idempotency: KV;
  guard: AddressGuard;
  /** Every store's bytes against its budget: an async run is refused (503) when SKIFF_RUNS has no room for it. */
  storeWatch: StoreWatch | undefined;
  /** SKIFF_MAX_QUEUED_RUNS: async runs one app may have in its queue (running ones included). */
  maxQueuedRuns: number;
  logger: Logger;
}
