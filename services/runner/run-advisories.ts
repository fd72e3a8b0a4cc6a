// A run whose last delivery's runner also died must not read `running`
// forever. When a run consumer's message passes max_deliver, JetStream
// publishes a MAX_DELIVERIES advisory (when it next looks for a message to
// give a runner, i.e. while any runner pulls). One runner of the queue group
// takes it, fails the run (`runner_lost`) unless it is final already,
// publishes the event, and removes the message from the work queue, where
// it would otherwise stay.
import type { JetStreamClient, NatsConnection, Subscription } from "nats";
import type { Logger } from "../config/index.js";
import { MAX_RUN_ATTEMPTS, streams, subjects } from "../nats/index.js";
import { publishRunEvent, isFinal, type RunStore, requestMeta, type BodyTransfer } from "../runs/index.js";

export const MAX_DELIVERIES_ADVISORY = `$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.${streams.runs.name}.*`;

interface Advisory {
  stream: string;
  stream_seq: number;
}

/** Fails a run whose runner was lost on every attempt (`runner_lost`), unless it is final; publishes its event. */
export async function failLostRun(
  runs: RunStore,
  js: JetStreamClient,
  logger: Logger,
  run: { projectId: string; appName: string; runId: string },
): Promise<void> {
  const { projectId, appName, runId } = run;
  const final = await runs.update(projectId, appName, runId, (record) =>
    isFinal(record.status)
      ? undefined
      : {
          ...record,
          status: "failure",
          finished_at: new Date().toISOString(),
          error: {
            type: "runner_lost",
            message: `the runner running it stopped before finishing, ${MAX_RUN_ATTEMPTS} times`,
          },
        },
  );
  if (!final) return;
  await publishRunEvent(js, final);
  logger.warn(
    { runId, app: `${projectId}/${appName}`, attempts: final.attempts },
    "async run failed: its runner was lost on every attempt",
  );
}

export function followLostRuns(
  nc: NatsConnection,
  runs: RunStore,
  transfer: BodyTransfer,
  logger: Logger,
): Subscription {
  const js = nc.jetstream();
  const jsmP = nc.jetstreamManager();
  const failLost = async (advisory: Advisory) => {
    const jsm = await jsmP;
    const msg = await jsm.streams.getMessage(streams.runs.name, { seq: advisory.stream_seq });
    // skiff.runs.queue.{project}.{app}
    const [, , , projectId, appName] = msg.subject.split(".");
    const { run_id: runId, body_object: object } = requestMeta(msg.data);
    await failLostRun(runs, js, logger, { projectId, appName, runId });
    await transfer.drop(object);
    await jsm.streams.deleteMessage(streams.runs.name, advisory.stream_seq, false);
  };
  return nc.subscribe(MAX_DELIVERIES_ADVISORY, {
    queue: subjects.invokeQueueGroup,
    callback: (err, msg) => {
      if (err) return;
      let advisory: Advisory;
      try {
        advisory = JSON.parse(msg.string()) as Advisory;
      } catch {
        return;
      }
      failLost(advisory).catch((error: unknown) =>
        logger.error({ err: error, seq: advisory.stream_seq }, "cannot fail a run whose runner was lost"),
      );
    },
  });
}
