// What the invocation handlers work with; role.ts builds it once per process.
// A sync run reaches its app through `runners` and is recorded through
// `syncRuns`; the NATS handles below them serve the async queue and webhook
// secrets.
import type { JetStreamClient, KV, NatsConnection } from "nats";
import type { AppRegistry } from "../apps/index.js";
import type { Logger } from "../config/index.js";
import type { StoreWatch } from "../nats/index.js";
import type { RunnerClient } from "../runner-client/index.js";
import type { RunControl, RunOutcome, RunRecord, RunResults, RunStore, BodyTransfer } from "../runs/index.js";
import type { SecretBox, AddressGuard } from "../webhooks/index.js";
import type { QueueDepths } from "./queue-depth.js";

/** How a sync run (or a WebSocket) is recorded; neither waits for it. */
export interface SyncRunRecorder {
  /** The run is under way (its `running` event). */
  running(record: RunRecord): void;
  /** The run has ended: its final record and event (finishSync). */
  finished(record: RunRecord, outcome: RunOutcome): void;
}

export interface InvocationDeps {
  nc: NatsConnection;
  js: JetStreamClient;
  /** Runs waiting or running per app, for SKIFF_MAX_QUEUED_RUNS. */
  queueDepths: QueueDepths;
  /** The apps, as the process's registry has them. */
  registry: Pick<AppRegistry, "get" | "lookup">;
  /** The runners of apps: this process's when it hosts the app, else one over NATS. */
  runners: RunnerClient;
  syncRuns: SyncRunRecorder;
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
