// What a runner process does for runs, beside hosting the apps: answers
// sync requests over NATS (dispatch.ts), works the async queue
// (run-worker.ts), fails runs lost on every attempt (run-advisories.ts), and
// answers cancel requests for the runs it holds (run-control.ts), for the
// apps its runner has deployed.
import type { NatsConnection } from "nats";
import type { AppRegistry } from "../apps/index.js";
import type { Logger } from "../config/index.js";
import { RunControl, RunResults, RunStore, BodyTransfer } from "../runs/index.js";
import { followDeployedApps } from "./deployed-apps.js";
import { SyncDispatch } from "./dispatch.js";
import { followLostRuns } from "./run-advisories.js";
import { DEFAULT_RUN_ACK_WAIT_MS, RunWorker } from "./run-worker.js";
import type { Runner } from "./runner.js";

export interface RunServicesOptions {
  nc: NatsConnection;
  runner: Runner;
  registry: AppRegistry;
  logger: Logger;
  /** SKIFF_RESULT_TTL, seconds. */
  resultTtlSeconds: number;
  /** SKIFF_RUN_ACK_WAIT_MS. */
  ackWaitMs?: number;
}

export interface RunServices {
  /** Stops taking runs; runs under way finish. Call before the runner closes. */
  close(): Promise<void>;
}

export async function startRunServices(opts: RunServicesOptions): Promise<RunServices> {
  const { nc, runner, registry, logger } = opts;
  const js = nc.jetstream();
  const runs = await RunStore.open(nc);
  const results = new RunResults(js, nc, opts.resultTtlSeconds);
  const transfer = new BodyTransfer(nc, () => results.objects());
  const control = new RunControl();
  control.listen(nc);
  const dispatch = new SyncDispatch({ nc, runner, transfer, control, logger });
  const worker = new RunWorker({
    js,
    jsm: await nc.jetstreamManager(),
    runner,
    registry,
    runs,
    results,
    transfer,
    control,
    logger,
    ackWaitMs: opts.ackWaitMs ?? DEFAULT_RUN_ACK_WAIT_MS,
  });
  const lost = followLostRuns(nc, runs, transfer, logger);
  const stopFollowing = followDeployedApps(runner, registry, {
    added(app) {
      dispatch.add(app);
      worker.add(app);
    },
    removed(app) {
      dispatch.remove(app);
      worker.remove(app);
    },
  });
  return {
    async close() {
      stopFollowing();
      lost.unsubscribe();
      dispatch.close();
      await worker.close();
      control.close();
    },
  };
}
