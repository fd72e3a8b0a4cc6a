// Webhook deliveries as the management API shows them, and redelivery: a
// fresh delivery (new id, a new set of up to 3 attempts) of a run's response,
// made by publishing the run's terminal event again with the new delivery id,
// so the webhook role delivers it like any other.
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { NatsConnection } from "nats";
import { RunEventSchema } from "../../gen/skiff/events/v1/events_pb.js";
import {
  WebhookAttemptSchema,
  WebhookDeliverySchema,
  type WebhookDelivery,
} from "../../gen/skiff/management/v2/management_pb.js";
import { JsErrorCode, buckets, isJsError, streams, subjects } from "../nats/index.js";
import { DeliveryStore, newDeliveryRecord, type DeliveryRecord } from "./delivery-store.js";

type RedeliveryErrorReason = "no_webhook" | "event_gone";

/** A run whose response cannot be delivered again; the management API answers failed_precondition. */
export class RedeliveryError extends Error {
  override name = "RedeliveryError";
  constructor(
    readonly reason: RedeliveryErrorReason,
    message: string,
  ) {
    super(message);
  }
}

/** One bound store per connection: GetRun and the run list ask for deliveries often. */
const stores = new WeakMap<NatsConnection, Promise<DeliveryStore>>();

function storeOf(nc: NatsConnection): Promise<DeliveryStore> {
  let store = stores.get(nc);
  if (!store) {
    store = nc
      .jetstream()
      .views.kv(buckets.webhooks.name, { bindOnly: true })
      .then((kv) => new DeliveryStore(kv));
    stores.set(nc, store);
    store.catch(() => stores.delete(nc)); // bind again next time rather than keep the failure
  }
  return store;
}

function toWebhookDelivery(record: DeliveryRecord): WebhookDelivery {
  return create(WebhookDeliverySchema, {
    deliveryId: record.delivery_id,
    runId: record.run_id,
    url: record.url,
    state: record.state,
    createdAt: timestampFromDate(new Date(record.created_at)),
    attempts: record.attempts.map((attempt) =>
      create(WebhookAttemptSchema, {
        attempt: attempt.attempt,
        startedAt: timestampFromDate(new Date(attempt.started_at)),
        durationMs: attempt.duration_ms ?? 0,
        statusCode: attempt.status_code ?? 0,
        error: attempt.error ?? "",
        // Empty while the attempt is under way.
        outcome: attempt.outcome ?? "",
      }),
    ),
  });
}

/**
 * A run's deliveries in KV together with `kept`, those the run history holds
 * (over, and gone from KV); KV's copy of a delivery wins. In delivery order.
 */
function merged(live: DeliveryRecord[], kept: readonly unknown[]): DeliveryRecord[] {
  const byId = new Map<string, DeliveryRecord>();
  for (const k of kept as Partial<DeliveryRecord>[])
    if (typeof k?.delivery_id === "string" && Array.isArray(k.attempts)) byId.set(k.delivery_id, k as DeliveryRecord);
  for (const d of live) byId.set(d.delivery_id, d);
  return [...byId.values()].sort((a, b) => Number(a.delivery_id) - Number(b.delivery_id));
}

/**
 * The webhook deliveries of a run, oldest first; none for a run called
 * without webhookEndpoint. `kept`: the run history's (RunHistory.deliveries).
 */
export async function listDeliveries(
  nc: NatsConnection,
  runId: string,
  kept: readonly unknown[] = [],
): Promise<WebhookDelivery[]> {
  return merged(await (await storeOf(nc)).list(runId), kept).map(toWebhookDelivery);
}

/**
 * Starts a fresh delivery of a finished run's response and returns it
 * (state pending, no attempts yet). Throws RedeliveryError when the run has
 * no delivery to repeat or its event has aged out of SKIFF_WEBHOOKS.
 */
export async function redeliver(
  nc: NatsConnection,
  runId: string,
  kept: readonly unknown[] = [],
): Promise<WebhookDelivery> {
  const store = await storeOf(nc);
  const previous = merged(await store.list(runId), kept);
  const source = previous.at(-1);
  if (source === undefined) {
    throw new RedeliveryError(
      "no_webhook",
      `run ${runId} has no webhook delivery to repeat: it was called without webhookEndpoint, or it has not finished`,
    );
  }
  const event = await terminalEvent(nc, source);
  // Delivery ids count up per run; two concurrent redeliveries get different ones.
  let number = Math.max(...previous.map((delivery) => Number(delivery.delivery_id) || 0)) + 1;
  let made = await store.create(newDeliveryRecord(event, String(number), source.event_seq));
  while (!made.created) made = await store.create(newDeliveryRecord(event, String(++number), source.event_seq));
  event.deliveryId = String(number);
  try {
    const js = nc.jetstream();
    // To the webhook role only: the public event stream has had this run's terminal event once.
    await js.publish(subjects.webhookRun(event.projectId, event.appName), toBinary(RunEventSchema, event), {
      msgID: `${runId}.webhook.${number}`,
    });
  } catch (err) {
    // Without its event nothing would ever work on the delivery: do not leave it pending.
    await store.remove(runId, String(number));
    throw err;
  }
  return toWebhookDelivery(made.record);
}

async function terminalEvent(nc: NatsConnection, source: DeliveryRecord) {
  const jsm = await nc.jetstreamManager();
  const gone = () =>
    new RedeliveryError(
      "event_gone",
      `the response of run ${source.run_id} is no longer kept: its event has aged out of ${streams.webhooks.name} (kept ${streams.webhooks.maxAgeMs / 86_400_000} days)`,
    );
  let data: Uint8Array;
  try {
    data = (await jsm.streams.getMessage(streams.webhooks.name, { seq: source.event_seq })).data;
  } catch (err) {
    // The stream no longer holds that sequence.
    if (isJsError(err, JsErrorCode.NoMessageFound)) throw gone();
    throw err;
  }
  const event = fromBinary(RunEventSchema, data);
  if (event.runId !== source.run_id) throw gone();
  return event;
}
