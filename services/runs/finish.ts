// Recording how a run ended: the final record and the terminal event, whose
// `response` is the body the sync caller got (or would have got), byte for
// byte, for the webhook role.
import type { NatsConnection } from "nats";
import type { Logger } from "../config/index.js";
import { inBackgroundIf } from "../nats/index.js";
import { publishRunEvent, publishRunEventUnacked } from "./events.js";
import type { RunOutcome } from "./outcome.js";
import type { RunResults } from "./results.js";
import { copyRecord, isFinal, type RunRecord, type RunStore, type StoredResult } from "./store.js";

export interface FinishDeps {
  runs: RunStore;
  results: RunResults;
  logger: Logger;
}

/**
 * The record with how the run ended (with `result`, the result kept for
 * GetRun, when one is). Written field by field, not spread: it is built on
 * the answer path of every sync run, and a spread of a record costs several
 * times as much (bench/README.md).
 */
function finalRecord(r: RunRecord, outcome: RunOutcome, now: Date, result?: StoredResult): RunRecord {
  const final = copyRecord(r);
  final.status = outcome.status;
  final.finished_at = now.toISOString();
  final.run_time_ms = outcome.runTimeMs;
  final.status_code = outcome.statusCode;
  final.error = outcome.error ?? r.error;
  final.response_bytes = outcome.responseBytes ?? outcome.body.data.byteLength;
  if (result) final.result = result;
  return final;
}

/**
 * A sync run: its record is its events (runs/events.ts), which only its
 * gateway publishes, in order on one connection, so one plain
 * unacknowledged publish records how it ended; its caller has the answer
 * already. Only a terminal event that a webhook depends on is published with
 * an acknowledgement (and logged when that fails). Never awaited on the
 * request path.
 */
export function finishSync(deps: FinishDeps & { nc: NatsConnection }, running: RunRecord, outcome: RunOutcome): void {
  const now = new Date();
  const final = finalRecord(running, outcome, now);
  void (async () => {
    // Results of sync runs are not kept (the caller has them); the event carries the body, which only one too
    // large for it makes wait (for the object store). Most runs reach their publish without an await.
    const event = deps.results.fitsEvent(outcome.body)
      ? outcome.body
      : (await deps.results.keep(running.run_id, outcome.body, now, false)).event;
    deps.runs.ended(final);
    if (final.webhook_endpoint) await publishRunEvent(deps.nc, final, event);
    else publishRunEventUnacked(deps.nc, final, event);
  })().catch((err: unknown) => deps.logger.error({ err, runId: final.run_id }, "cannot publish a run's final event"));
}

/**
 * An async run: compare-and-set from a non-final state, starting from the
 * `running` record and revision this runner wrote (re-read only when another
 * write came first), so a cancel or another attempt that finished first wins.
 * Resolves with the record written and its revision, or undefined when the
 * run was already final (nothing is published then).
 *
 * `together`: other runs are under way on the connection, so their writes
 * come soon; the final record and then the event each go with the next of
 * them (WAITED_FLUSH_MS at most) rather than in a socket write of their own,
 * which under load is most of a drained run's writes (bench/README.md). A
 * run alone writes at once: there is nothing to wait for.
 */
export async function finishAsync(
  deps: FinishDeps,
  running: { record: RunRecord; revision: number },
  outcome: RunOutcome,
  together = false,
): Promise<{ record: RunRecord; revision: number } | undefined> {
  const now = new Date();
  const nc = deps.runs.nc;
  const { result, event } = await deps.results.keep(running.record.run_id, outcome.body, now, true);
  const final = await inBackgroundIf(together, nc, () =>
    deps.runs.updateFrom(running, (cur) => (isFinal(cur.status) ? undefined : finalRecord(cur, outcome, now, result))),
  );
  if (final) await inBackgroundIf(together, nc, () => publishRunEvent(nc, final.record, event, together));
  return final;
}

/**
 * The terminal event of a run found final when its queue message comes again:
 * the runner that wrote the final record may have died before it published
 * the event (the message, never acked, then goes to another runner), and
 * without the event no webhook is ever sent. Published again with the same
 * message id (`{run_id}.{status}.{attempt}`), so JetStream drops it when the
 * first one did land (the message comes back within ack_wait, well inside
 * the streams' duplicate window). Its response is the result kept for
 * GetRun; none once that has expired or with SKIFF_RESULT_TTL=0.
 */
export async function republishFinal(runs: RunStore, record: RunRecord): Promise<void> {
  const kept = record.result;
  const response =
    kept === undefined || Date.parse(kept.expires_at) <= Date.now()
      ? undefined
      : kept.data !== undefined
        ? { contentType: kept.content_type, data: Buffer.from(kept.data, "base64") }
        : kept.object !== undefined
          ? { object: kept.object }
          : undefined;
  await publishRunEvent(runs.nc, record, response);
}
