// The durable consumers of layout.ts, made real: created when missing, or
// brought to the wanted settings when they differ. Every process that works
// a consumer ensures it at start, several at once when a cluster boots: two
// identical adds both succeed, and the last process to start sets ack_wait.
import {
  AckPolicy,
  DeliverPolicy,
  ErrorCode,
  NatsError,
  nanos,
  type ConsumerUpdateConfig,
  type JetStreamManager,
} from "nats";
import { JsErrorCode, isJsError } from "./errors.js";
import type { ConsumerSpec } from "./layout.js";

/** Settings compared with an existing consumer's, and updated when they differ. */
const UPDATABLE = ["ack_wait", "max_deliver", "description"] as const satisfies readonly (keyof ConsumerUpdateConfig)[];

type ConsumerChange = "created" | "updated" | "unchanged";

/** Attempts when JetStream does not answer in time: a cluster that has just formed may still be placing copies. */
const ATTEMPTS = 4;

/** Creates the consumer `spec` with this ack_wait, or brings an existing one to it; says which it did. */
export async function ensureConsumer(
  jsm: JetStreamManager,
  spec: ConsumerSpec,
  ackWaitMs: number,
): Promise<ConsumerChange> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await ensureOnce(jsm, spec, ackWaitMs);
    } catch (err) {
      if (attempt >= ATTEMPTS || !(err instanceof NatsError && err.code === ErrorCode.Timeout)) throw err;
      await new Promise((resolve) => setTimeout(resolve, 500 * attempt));
    }
  }
}

async function ensureOnce(jsm: JetStreamManager, spec: ConsumerSpec, ackWaitMs: number): Promise<ConsumerChange> {
  const settings: Pick<ConsumerUpdateConfig, (typeof UPDATABLE)[number]> = {
    ack_wait: nanos(ackWaitMs),
    max_deliver: spec.maxDeliver,
    description: spec.description,
  };
  try {
    const info = await jsm.consumers.info(spec.stream, spec.name);
    if (UPDATABLE.every((key) => info.config[key] === settings[key])) return "unchanged";
    await jsm.consumers.update(spec.stream, spec.name, settings);
    return "updated";
  } catch (err) {
    if (!isJsError(err, JsErrorCode.ConsumerNotFound)) throw err;
  }
  await jsm.consumers.add(spec.stream, {
    ...settings,
    durable_name: spec.name,
    filter_subject: spec.filterSubject,
    ack_policy: AckPolicy.Explicit,
    deliver_policy: DeliverPolicy.All,
  });
  return "created";
}
