// The webhook role: a durable pull consumer on SKIFF_EVENTS, shared by name
// by every webhook process, so any number of them split the deliveries and
// one that stops leaves its messages to the others. Each message is handled
// by deliver.ts and acked when its delivery is over, or nacked with a delay
// until its next attempt is due; delivery runs here, off the request path,
// and never touches the caller's response.
import { fromBinary } from "@bufbuild/protobuf";
import {
  AckPolicy,
  DeliverPolicy,
  nanos,
  type JetStreamManager,
  type JsMsg,
  type NatsConnection,
  type ObjectStore,
} from "nats";
import { RunEventSchema } from "../../gen/skiff/events/v1/events_pb.js";
import type { Logger } from "../config/index.js";
import { JsErrorCode, buckets, isJsError, objectStores, streams, subjects } from "../nats/index.js";
import { createSecretBox } from "./secrets.js";
import { AddressGuard } from "./address-guard.js";
import { advanceDelivery, type DeliveryDeps } from "./deliver.js";
import { DeliveryStore } from "./delivery-store.js";

export const WEBHOOK_CONSUMER = "skiff-webhook";
/** SKIFF_WEBHOOK_TIMEOUT_MS: the whole of one attempt. */
export const DEFAULT_WEBHOOK_TIMEOUT_MS = 10_000;
/** Deliveries one process works on at once. */
export const DEFAULT_WEBHOOK_CONCURRENCY = 64;
/**
 * How long JetStream waits before giving a message whose process went silent
 * to another. Handlers call working() every third of it, so it bounds how
 * late a crashed process's delivery resumes, not how long an attempt may take.
 */
export const DEFAULT_WEBHOOK_ACK_WAIT_MS = 30_000;
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
}

export interface WebhookRole {
  /** The guard deliveries go through; validateWebhookEndpoint can use the same. */
  guard: AddressGuard;
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
    results: () =>
      (results ??= js.views.os(objectStores.results.name).catch((err: unknown) => {
        results = undefined; // try again next time rather than keep the failure
        throw err;
      })),
    guard,
    timeoutMs: opts.timeoutMs ?? DEFAULT_WEBHOOK_TIMEOUT_MS,
    logger,
  };
  await ensureConsumer(await nc.jetstreamManager(), ackWaitMs, logger);
  const consumer = await js.consumers.get(streams.events.name, WEBHOOK_CONSUMER);
  const messages = await consumer.consume({ max_messages: concurrency });

  const handle = async (m: JsMsg): Promise<void> => {
    const heartbeat = setInterval(() => m.working(), ackWaitMs / 3);
    try {
      let event;
      try {
        event = fromBinary(RunEventSchema, m.data);
      } catch (err) {
        logger.warn({ err, subject: m.subject, seq: m.seq }, "not a skiff.events.v1.RunEvent; skipped");
        m.ack();
        return;
      }
      const step = await advanceDelivery(deps, event, m.seq);
      if ("nakMs" in step) m.nak(Math.max(1, Math.ceil(step.nakMs)));
      else m.ack();
    } catch (err) {
      logger.warn(
        { err, subject: m.subject, seq: m.seq },
        `webhook delivery step failed; trying again in ${RETRY_AFTER_ERROR_MS} ms`,
      );
      m.nak(RETRY_AFTER_ERROR_MS);
    } finally {
      clearInterval(heartbeat);
    }
  };

  const inflight = new Set<Promise<void>>();
  const loop = (async () => {
    for await (const m of messages) {
      const p: Promise<void> = handle(m).finally(() => inflight.delete(p));
      inflight.add(p);
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
    guard,
    close: () =>
      (closing ??= (async () => {
        messages.stop();
        await loop;
        await Promise.allSettled(inflight);
      })()),
  };
}

/**
 * The shared consumer: explicit acks; every run event from the start of the
 * stream (the stream's age limit bounds the backlog); no max_deliver, since
 * naks between attempts count as deliveries and the KV entry already caps
 * the attempts.
 */
async function ensureConsumer(jsm: JetStreamManager, ackWaitMs: number, logger: Logger): Promise<void> {
  const update = {
    ack_wait: nanos(ackWaitMs),
    max_deliver: -1,
    description: "webhook deliveries of terminal run events",
  };
  try {
    const info = await jsm.consumers.info(streams.events.name, WEBHOOK_CONSUMER);
    if (info.config.ack_wait === update.ack_wait && info.config.max_deliver === update.max_deliver) return;
    await jsm.consumers.update(streams.events.name, WEBHOOK_CONSUMER, update);
    logger.info({ consumer: WEBHOOK_CONSUMER, ackWaitMs }, "updated the webhook consumer");
    return;
  } catch (err) {
    if (!isJsError(err, JsErrorCode.ConsumerNotFound)) throw err;
  }
  // Concurrent starts: an identical add by another process succeeds too.
  await jsm.consumers.add(streams.events.name, {
    ...update,
    durable_name: WEBHOOK_CONSUMER,
    ack_policy: AckPolicy.Explicit,
    deliver_policy: DeliverPolicy.All,
    filter_subject: subjects.runEventsAll,
  });
}
