// The run helpers of one process, built once (start.ts) and shared by every
// role in it that runs, records or reads runs: the store of run records,
// the results, the transfer of large bodies, and the RunControl whose id
// names this process in the records of the runs it holds, whichever role
// runs them.
import type { NatsConnection } from "nats";
import { RunControl } from "./control.js";
import { RunResults } from "./results.js";
import { RunStore } from "./store.js";
import { BodyTransfer } from "./transfer.js";

export interface RunContext {
  store: RunStore;
  results: RunResults;
  transfer: BodyTransfer;
  /** Already answering cancel requests and abort broadcasts for the runs tracked in it. */
  control: RunControl;
  /** Stops answering cancel requests; call once no role of the process runs runs any more. */
  close(): void;
}

export async function openRunContext(nc: NatsConnection, opts: { resultTtlSeconds: number }): Promise<RunContext> {
  const store = await RunStore.open(nc);
  const results = new RunResults(nc.jetstream(), nc, opts.resultTtlSeconds);
  const control = new RunControl();
  control.listen(nc);
  return {
    store,
    results,
    transfer: new BodyTransfer(nc, () => results.objects()),
    control,
    close: () => control.close(),
  };
}
