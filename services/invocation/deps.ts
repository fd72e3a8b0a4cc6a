// What the invocation handlers work with; role.ts builds it once per process.
import type { JetStreamClient, JetStreamManager, KV, NatsConnection } from "nats";
import type { Runner } from "../runner/runner.js";
import type { AppRegistry } from "../shared/app-registry.js";
import type { Logger } from "../shared/logger.js";
import type { RunControl } from "../shared/run-control.js";
import type { RunResults } from "../shared/run-results.js";
import type { RunStore } from "../shared/run-store.js";
import type { BodyTransfer } from "../shared/run-wire.js";
import type { SecretBox } from "../shared/secrets.js";
import type { AddressGuard } from "../webhook/address-guard.js";

export interface InvocationDeps {
  nc: NatsConnection;
  js: JetStreamClient;
  jsm: JetStreamManager;
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
  /** SKIFF_MAX_QUEUED_RUNS: async runs one app may have in its queue (running ones included). */
  maxQueuedRuns: number;
  logger: Logger;
}
