// The webhook role: a durable pull consumer on SKIFF_WEBHOOKS, shared by name
// by every webhook process, so any number of them split the deliveries and
// one that stops leaves its messages to the others. Each message is handled
// by deliver.ts and acked when its delivery is over, or nacked with a delay
// until its next attempt is due; delivery runs here, off the request path,
// and never touches the caller's response.
//
// A delivery that is over (delivered or failed) is published, its record in
// a header, to SKIFF_EVENTS for the run history, before its message is
// acked with a confirmed ack; a minute later the run's KV entry is purged,
// when none of its deliveries is under way (a redelivery), so that
// nats-server holds nothing per delivered run. The same delay as a run
// record's, for the same reasons (runner/run-worker.ts): a redelivered
// message must still find its delivery over, and the history has it by then.
import { fromBinary } from "@bufbuild/protobuf";
import { headers, type JsMsg, type NatsConnection, type ObjectStore } from "nats";
import { RunEventSchema } from "../../gen/skiff/events/v1/events_pb.js";
import type { Logger } from "../config/index.js";
import type { Metrics } from "../metrics/index.js";
import {
  buckets,
  consumers,
  ensureConsumer,
  keepAfterAckMs,
  KvPurger,
  kvRemoveKey,
  objectStores,
  publishAcked,
  subjects,
} from "../nats/index.js";
import { DELIVERY_RECORD_HEADER } from "../runs/index.js";
import {
  AddressGuard,
  createSecretBox,
  DeliveryStore,
  revisionsIfOver,
  type DeliveryRecord,
} from "../webhooks/index.js";
import { advanceDelivery, type DeliveryDeps } from "./deliver.js";

export const WEBHOOK_CONSUMER = consumers.webhook.name;
/** SKIFF_WEBHOOK_TIMEOUT_MS: the whole of one attempt. */
export const DEFAULT_WEBHOOK_TIMEOUT_MS = 10_000;
/** Deliveries one process works on at once. */
const DEFAULT_WEBHOOK_CONCURRENCY = 64;
/**
 * How long JetStream waits before giving a message whose process went silent
 * to another. Handlers call working() every third of it, so it bounds how
 * late a crashed process's delivery resumes, not how long an attempt may take.
 */
const DEFAULT_WEBHOOK_ACK_WAIT_MS = 30_000;
/** After an unexpected error (NATS unavailable), when the message is tried again. */
const RETRY_AFTER_ERROR_MS = 2_000;

export interface WebhookRoleOptions {
  nc: NatsConnection;
  logger: Logger;
  /** SKIFF_WEBHOOK_ALLOWED_CIDRS: ranges exempt from the SSRF guard. */
  allowedCidrs?: readonly string[];
  /** SKIFF_WEBHOOK_TIMEOUT_MS. */
  timeoutMs?: number;
  /** SKIFF_SECRETS_KEY (base64); undefined: the cluster's key in KV skiff-keys. */
  secretsKey?: string;
  concurrency?: number;
  /** The shared consumer's ack_wait; the last process to start sets it. */
  ackWaitMs?: number;
  /** How long a run's delivery entry stays in KV once its deliveries are over; twice ackWaitMs at least. */
  keepMs?: number;
  metrics?: Metrics;
}

export interface WebhookRole {
  /** Stops taking messages and lets the attempts under way finish and be recorded. */
  close(): Promise<void>;
}

export async function startWebhookRole(opts: WebhookRoleOptions): Promise<WebhookRole> {
  const { nc, logger } = opts;
  const concurrency = opts.concurrency ?? DEFAULT_WEBHOOK_CONCURRENCY;
  const ackWaitMs = opts.ackWaitMs ?? DEFAULT_WEBHOOK_ACK_WAIT_MS;
  const js = nc.jetstream();
  const guard = new AddressGuard(opts.allowedCidrs ?? []);
  let results: Promise<ObjectStore> | undefined;
  const deps: DeliveryDeps = {
    store: new DeliveryStore(await js.views.kv(buckets.webhooks.name, { bindOnly: true })),
    secrets: await js.views.kv(buckets.secrets.name, { bindOnly: true }),
    box: await createSecretBox(nc, { key: opts.secretsKey }),
    metrics: opts.metrics,
    results: () =>
      (results ??= js.views.os(objectStores.results.name).catch((err: unknown) => {
        results = undefined; // try again next time rather than keep the failure
        throw err;
      })),
    guard,
    timeoutMs: opts.timeoutMs ?? DEFAULT_WEBHOOK_TIMEOUT_MS,
    logger,
  };
  if ((await ensureConsumer(await nc.jetstreamManager(), consumers.webhook, ackWaitMs)) === "updated")
    logger.info({ consumer: WEBHOOK_CONSUMER, ackWaitMs }, "updated the webhook consumer");
  // A run's entry leaves KV when every delivery in it is over: a redelivery started since keeps it.
  const purger = new KvPurger(
    (runId) => kvRemoveKey(nc, buckets.webhooks.name, runId, (entry) => revisionsIfOver(entry.value, entry.revision)),
    logger,
    keepAfterAckMs(opts.keepMs, ackWaitMs),
    "webhook delivery entries",
  );
  /** The delivery, over, for the run history; deduplicated, since a message that comes again publishes it again. */
  const record = (d: DeliveryRecord) => {
    const h = headers();
    h.set(DELIVERY_RECORD_HEADER, JSON.stringify(d));
    return publishAcked(nc, subjects.deliveryRecord(d.project_id, d.app_name), new Uint8Array(0), {
      headers: h,
      msgId: `${d.run_id}.delivery.${d.delivery_id}`,
    });
  };
  const consumer = await js.consumers.get(consumers.webhook.stream, WEBHOOK_CONSUMER);
  const messages = await consumer.consume({ max_messages: concurrency });

  const handle = async (msg: JsMsg): Promise<void> => {
    const heartbeat = setInterval(() => msg.working(), ackWaitMs / 3);
    try {
      let event;
      try {
        event = fromBinary(RunEventSchema, msg.data);
      } catch (err) {
        logger.warn({ err, subject: msg.subject, seq: msg.seq }, "not a skiff.events.v1.RunEvent; skipped");
        msg.ack();
        return;
      }
      const step = await advanceDelivery(deps, event, msg.seq, msg.info.deliveryCount === 1);
      if ("nakMs" in step) msg.nak(Math.max(1, Math.ceil(step.nakMs)));
      else if (step.over) {
        await record(step.over);
        purger.afterAck(msg, step.over.run_id);
      } else msg.ack();
    } catch (err) {
      logger.warn(
        { err, subject: msg.subject, seq: msg.seq },
        `webhook delivery step failed; trying again in ${RETRY_AFTER_ERROR_MS} ms`,
      );
      msg.nak(RETRY_AFTER_ERROR_MS);
    } finally {
      clearInterval(heartbeat);
    }
  };

  const inflight = new Set<Promise<void>>();
  const loop = (async () => {
    for await (const msg of messages) {
      const handled: Promise<void> = handle(msg).finally(() => inflight.delete(handled));
      inflight.add(handled);
      // At most `concurrency` deliveries at once; the pull asks for no more than that many ahead.
      if (inflight.size >= concurrency) await Promise.race(inflight);
    }
  })();
  logger.info(
    { consumer: WEBHOOK_CONSUMER, timeoutMs: deps.timeoutMs, allowedCidrs: guard.allowedCidrs },
    "webhook role consuming run events",
  );

  let closing: Promise<void> | undefined;
  return {
    close: () =>
      (closing ??= (async () => {
        messages.stop();
        await loop;
        await Promise.allSettled(inflight);
        purger.close();
      })()),
  };
}
