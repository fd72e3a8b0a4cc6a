// A run whose last delivery's runner also died must not read `running`
// forever. When a run consumer's message passes max_deliver, JetStream
// publishes a MAX_DELIVERIES advisory, possibly while no runner is up (all
// of them died), so the advisory is kept in stream SKIFF_LOST_RUNS. One
// runner takes each through a shared durable consumer, fails the run
// (`runner_lost`) unless it is final already, publishes the event, and
// removes the message from the work queue, where it would otherwise stay.
import type { NatsConnection } from "nats";
import type { Logger } from "../config/index.js";
import { JsErrorCode, MAX_RUN_ATTEMPTS, consumers, ensureConsumer, isJsError, streams } from "../nats/index.js";
import { publishRunEvent, isFinal, type RunRecord, type RunStore, type BodyTransfer } from "../runs/index.js";
import { requestMeta } from "../runner-client/index.js";

interface Advisory {
  stream: string;
  stream_seq: number;
}

/**
 * Fails a run whose runner was lost on every attempt (`runner_lost`), unless
 * it is final; publishes its event. `queued`: the record its queue message
 * carries, written failed when the run has no record (no attempt got as far
 * as writing one).
 */
export async function failLostRun(
  runs: RunStore,
  logger: Logger,
  run: { projectId: string; appName: string; runId: string },
  queued?: RunRecord,
): Promise<void> {
  const { projectId, appName, runId } = run;
  const failed = (record: RunRecord): RunRecord => ({
    ...record,
    status: "failure",
    finished_at: new Date().toISOString(),
    error: {
      type: "runner_lost",
      message: `the runner running it stopped before finishing, ${MAX_RUN_ATTEMPTS} times`,
    },
  });
  const final = await runs.update(
    projectId,
    appName,
    runId,
    (record) => (isFinal(record.status) ? undefined : failed(record)),
    queued,
  );
  if (!final) return;
  await publishRunEvent(runs.nc, final);
  logger.warn(
    { runId, app: `${projectId}/${appName}`, attempts: final.attempts },
    "async run failed: its runner was lost on every attempt",
  );
}

/**
 * Fails the runs whose MAX_DELIVERIES advisory SKIFF_LOST_RUNS kept (one
 * runner of all takes each, through the shared durable consumer); an
 * advisory is acknowledged once its run is final and its message gone.
 */
export async function followLostRuns(
  nc: NatsConnection,
  runs: RunStore,
  transfer: BodyTransfer,
  logger: Logger,
  ackWaitMs: number,
): Promise<{ stop(): void }> {
  const jsm = await nc.jetstreamManager();
  const failLost = async (advisory: Advisory) => {
    let msg;
    try {
      msg = await jsm.streams.getMessage(streams.runs.name, { seq: advisory.stream_seq });
    } catch (err) {
      if (isJsError(err, JsErrorCode.NoMessageFound)) return; // another runner (or an earlier try) finished it
      throw err;
    }
    // skiff.runs.queue.{project}.{app}
    const [, , , projectId, appName] = msg.subject.split(".");
    const { run_id: runId, body_object: object, record } = requestMeta(msg.data);
    await failLostRun(runs, logger, { projectId, appName, runId }, record);
    await transfer.drop(object);
    await jsm.streams.deleteMessage(streams.runs.name, advisory.stream_seq, false).catch((err: unknown) => {
      if (!isJsError(err, JsErrorCode.NoMessageFound)) throw err;
    });
  };
  await ensureConsumer(jsm, consumers.lostRuns, ackWaitMs);
  const consumer = await nc.jetstream().consumers.get(consumers.lostRuns.stream, consumers.lostRuns.name);
  const messages = await consumer.consume({ max_messages: 16 });
  void (async () => {
    for await (const m of messages) {
      let advisory: Advisory;
      try {
        advisory = JSON.parse(m.string()) as Advisory;
      } catch {
        m.term();
        continue;
      }
      try {
        await failLost(advisory);
        m.ack();
      } catch (err) {
        logger.error({ err, seq: advisory.stream_seq }, "cannot fail a run whose runner was lost; trying again");
        m.nak(RETRY_LOST_MS);
      }
    }
  })();
  return { stop: () => void messages.close().catch(() => undefined) };
}

const RETRY_LOST_MS = 5_000;
