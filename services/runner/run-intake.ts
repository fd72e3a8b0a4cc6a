// How the runner role takes runs in, for the apps its runner has deployed:
// it answers gateways' sync requests and WebSocket handshakes over NATS (the
// runner's end of the runner client, runner-client/nats.ts), works their
// async queues (run-worker.ts), and fails the async runs lost on every
// attempt (run-advisories.ts). The runs it holds are tracked in the process's
// RunControl, which answers cancel requests for them.
import type { NatsConnection } from "nats";
import type { AppRegistry } from "../apps/index.js";
import type { Logger } from "../config/index.js";
import { buckets, keepAfterAckMs, KvPurger, kvRemoveKey } from "../nats/index.js";
import { NatsRunnerServer } from "../runner-client/index.js";
import { decodeRunRecord, revisionsOf, type RunContext } from "../runs/index.js";
import { followDeployedApps } from "./deployed-apps.js";
import { followLostRuns } from "./run-advisories.js";
import { RunWorker } from "./run-worker.js";
import type { Runner } from "./runner.js";

export interface RunIntakeOptions {
  nc: NatsConnection;
  runner: Runner;
  registry: AppRegistry;
  runs: RunContext;
  logger: Logger;
  /** SKIFF_RUN_ACK_WAIT_MS. */
  ackWaitMs: number;
  /** How long a final record stays in KV once its message was acked; twice ackWaitMs at least. */
  finalRecordKeepMs?: number;
  /** SKIFF_MAX_ASYNC_RESULT_BYTES: the largest async result stored; none: no limit. */
  maxAsyncResultBytes?: number;
}

export interface RunIntake {
  /** Stops taking runs; runs under way finish. Call before the runner closes. */
  close(): Promise<void>;
}

export async function startRunIntake(opts: RunIntakeOptions): Promise<RunIntake> {
  const { nc, runner, registry, runs, logger } = opts;
  const purger = new KvPurger(
    (key, revisions) =>
      kvRemoveKey(
        nc,
        buckets.runs.name,
        key,
        (entry) => {
          const record = decodeRunRecord(entry);
          return record && revisionsOf(record, entry.revision);
        },
        revisions,
      ),
    logger,
    keepAfterAckMs(opts.finalRecordKeepMs, opts.ackWaitMs),
    "ended async run records",
  );
  const server = new NatsRunnerServer({ nc, runner, transfer: runs.transfer, control: runs.control, logger });
  const worker = new RunWorker({
    js: nc.jetstream(),
    jsm: await nc.jetstreamManager(),
    runner,
    registry,
    runs: runs.store,
    results: runs.results,
    transfer: runs.transfer,
    control: runs.control,
    logger,
    ackWaitMs: opts.ackWaitMs,
    purger,
    maxResultBytes: opts.maxAsyncResultBytes,
  });
  const lost = await followLostRuns(nc, runs.store, runs.transfer, logger, opts.ackWaitMs);
  const stopFollowing = followDeployedApps(runner, registry, {
    added(app) {
      server.add(app);
      worker.add(app);
    },
    removed(app) {
      server.remove(app);
      worker.remove(app);
    },
  });
  return {
    async close() {
      stopFollowing();
      lost.stop();
      await Promise.all([server.close(), worker.close()]);
      purger.close();
    },
  };
}
