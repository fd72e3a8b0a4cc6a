// Recording how a run ended: the final record and the terminal event, whose
// `response` is the body the sync caller got (or would have got), byte for
// byte, for the webhook role.
import type { JetStreamClient, NatsConnection } from "nats";
import type { Logger } from "../config/index.js";
import { publishRunEvent, publishRunEventUnacked } from "./events.js";
import type { RunOutcome } from "./outcome.js";
import type { RunResults } from "./results.js";
import { isFinal, type RunRecord, type RunStore } from "./store.js";

export interface FinishDeps {
  js: JetStreamClient;
  runs: RunStore;
  results: RunResults;
  logger: Logger;
}

function finalRecord(record: RunRecord, outcome: RunOutcome, now: Date): RunRecord {
  return {
    ...record,
    status: outcome.status,
    finished_at: now.toISOString(),
    run_time_ms: outcome.runTimeMs,
    status_code: outcome.statusCode,
    ...(outcome.error ? { error: outcome.error } : {}),
  };
}

/**
 * A sync run: only its gateway writes its record, in order on one
 * connection, so a plain unacknowledged publish does; its caller has the
 * answer already. Only a terminal event that a webhook depends on is
 * published with an acknowledgement (and logged when that fails). Never
 * awaited on the request path.
 */
export function finishSync(deps: FinishDeps & { nc: NatsConnection }, running: RunRecord, outcome: RunOutcome): void {
  const now = new Date();
  const final = finalRecord(running, outcome, now);
  void (async () => {
    // Results of sync runs are not kept (the caller has them); the event carries the body.
    const { event } = await deps.results.keep(running.run_id, outcome.body, now, false);
    deps.runs.putUnacked(final);
    if (final.webhook_endpoint) await publishRunEvent(deps.js, final, event);
    else publishRunEventUnacked(deps.nc, final, event);
  })().catch((err: unknown) => deps.logger.error({ err, runId: final.run_id }, "cannot publish a run's final event"));
}

/**
 * An async run: compare-and-set from a non-final state, so a cancel or
 * another attempt that finished first wins. Resolves with the record written,
 * or undefined when the run was already final (nothing is published then).
 */
export async function finishAsync(
  deps: FinishDeps,
  running: RunRecord,
  outcome: RunOutcome,
): Promise<RunRecord | undefined> {
  const now = new Date();
  const { result, event } = await deps.results.keep(running.run_id, outcome.body, now, true);
  const final = await deps.runs.update(running.project_id, running.app_name, running.run_id, (cur) =>
    isFinal(cur.status) ? undefined : { ...finalRecord(cur, outcome, now), ...(result ? { result } : {}) },
  );
  if (final) await publishRunEvent(deps.js, final, event);
  return final;
}
