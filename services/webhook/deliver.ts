// One step of a webhook delivery, driven by a run event from SKIFF_WEBHOOKS.
// The KV entry of the delivery says where it stands; this module moves it on
// by at most one attempt and tells the caller what to do with the JetStream
// message: ack (the delivery is over) or nak with a delay (come back when the
// next attempt is due). A process that stops at any point leaves the entry
// and an unacked message behind, and whichever process gets the message next
// carries on from the entry: attempts already made, or started, still count.
import type { KV, ObjectStore } from "nats";
import type { RunEvent } from "../../gen/skiff/events/v1/events_pb.js";
import type { Logger } from "../config/index.js";
import type { Metrics } from "../metrics/index.js";
import { objectStores } from "../nats/index.js";
import {
  isKeyToken,
  loadWebhookSecret,
  newDeliveryRecord,
  stateOf,
  UnsealError,
  type AddressGuard,
  type AttemptRecord,
  type AttemptVerdict,
  type DeliveryRecord,
  type DeliveryStore,
  type SecretBox,
} from "../webhooks/index.js";
import { postWebhook, type AttemptResult } from "./post.js";
import { delayAfter, judgeAttempt, nextStep } from "./retry-policy.js";
import { signWebhook } from "./signature.js";

/** The delivery a run's own terminal event asks for; redeliveries are numbered after it. */
const FIRST_DELIVERY_ID = "1";
const USER_AGENT = "skiff-webhook/1";
/**
 * How long past an attempt's deadline its process may still record the
 * outcome; after that another process takes the attempt as interrupted.
 */
export const INTERRUPTED_GRACE_MS = 2_000;

const OUTCOME: Record<ReturnType<typeof nextStep>, AttemptVerdict> = {
  done: "delivered",
  retry: "retry",
  give_up: "failed",
};

/** What to do with the message: ack it (with the delivery, when there is one and it is over) or nak it for later. */
type Step = { ack: true; over?: DeliveryRecord } | { nakMs: number };
const ACK: Step = { ack: true };

export interface DeliveryDeps {
  store: DeliveryStore;
  /** KV skiff-secrets. */
  secrets: KV;
  box: SecretBox;
  /** The skiff-results object store, opened on first use. */
  results: () => Promise<ObjectStore>;
  guard: AddressGuard;
  timeoutMs: number;
  logger: Logger;
  /** Counts attempts by outcome. */
  metrics?: Metrics;
}

/**
 * Terminal events of runs called with webhookEndpoint. A cancelled run is
 * delivered only when it produced a response: one cancelled while queued has
 * no body to forward.
 */
function wantsDelivery(e: RunEvent): boolean {
  if (e.webhookEndpoint === "") return false;
  if (e.status === "success" || e.status === "failure") return true;
  return e.status === "cancelled" && (e.response !== undefined || e.responseObject !== "");
}

export async function advanceDelivery(
  d: DeliveryDeps,
  event: RunEvent,
  eventSeq: number,
  firstDelivery = false,
): Promise<Step> {
  if (!wantsDelivery(event)) return ACK;
  const runId = event.runId;
  const deliveryId = event.deliveryId || FIRST_DELIVERY_ID;
  if (!isKeyToken(runId) || !isKeyToken(deliveryId)) {
    d.logger.warn({ runId, deliveryId }, "run event with an unusable run id or delivery id; not delivered");
    return ACK;
  }
  let prepared: Prepared | undefined;
  if (firstDelivery && deliveryId === FIRST_DELIVERY_ID) {
    prepared = await prepare(d, event, event.webhookEndpoint);
    const step = await firstAttempt(d, newDeliveryRecord(event, deliveryId, eventSeq), prepared);
    if (step !== undefined) return step;
  }
  for (;;) {
    const cur =
      (await d.store.get(runId, deliveryId)) ?? (await d.store.create(newDeliveryRecord(event, deliveryId, eventSeq)));
    const r = cur.record;
    if (r.state !== "pending") return { ack: true, over: r };
    const now = Date.now();
    const open = r.attempts.find((a) => a.outcome === undefined);
    if (open !== undefined) {
      const takeOverAt = Date.parse(open.deadline) + INTERRUPTED_GRACE_MS;
      if (now < takeOverAt) return { nakMs: takeOverAt - now };
      await finishAttempt(d, r, open.attempt, {
        error: "interrupted: the webhook process stopped during the attempt",
        durationMs: takeOverAt - Date.parse(open.started_at),
      });
      continue;
    }
    const last = r.attempts.at(-1);
    if (last !== undefined) {
      const due = Date.parse(last.started_at) + (last.duration_ms ?? 0) + delayAfter(last.attempt);
      if (now < due) return { nakMs: due - now };
    }
    prepared ??= await prepare(d, event, r.url);
    const attempt = startAttempt(d, r.attempts.length + 1);
    // Recorded before anything is sent: an attempt cut short by a crash still counts.
    if (!(await d.store.replace({ ...r, attempts: [...r.attempts, attempt] }, cur.revision))) continue;
    const result =
      "problem" in prepared
        ? { error: prepared.problem, permanent: true, durationMs: 0 }
        : await send(d, runId, prepared);
    const after = await finishAttempt(d, r, attempt.attempt, result);
    return after.state === "pending" ? { nakMs: delayAfter(attempt.attempt) } : { ack: true, over: after };
  }
}

type Prepared = { url: URL; body: Uint8Array; secret: string | undefined } | { problem: string };

/**
 * The usual case, a run's delivery on its event's first arrival, in one
 * write before the POST: the run's entry is made with attempt 1 started
 * (its body and secret were read before, so a NATS error there spends no
 * attempt), and the outcome is written over that revision, without reads.
 * Undefined, with nothing written, when the run has an entry already: the
 * caller then reads where the delivery stands.
 */
async function firstAttempt(d: DeliveryDeps, fresh: DeliveryRecord, prepared: Prepared): Promise<Step | undefined> {
  const attempt = startAttempt(d, 1);
  const started = await d.store.start({ ...fresh, attempts: [attempt] });
  if (started === undefined) return undefined;
  const result =
    "problem" in prepared
      ? { error: prepared.problem, permanent: true, durationMs: 0 }
      : await send(d, fresh.run_id, prepared);
  const after = await finishAttempt(d, started.record, attempt.attempt, result, started.revision);
  return after.state === "pending" ? { nakMs: delayAfter(attempt.attempt) } : { ack: true, over: after };
}

function startAttempt(d: DeliveryDeps, n: number): AttemptRecord {
  const start = Date.now();
  return {
    attempt: n,
    started_at: new Date(start).toISOString(),
    deadline: new Date(start + d.timeoutMs).toISOString(),
  };
}

/**
 * The body and secret of the delivery. Problems that no retry can fix are
 * returned, and fail the delivery; NATS errors are thrown, and the message
 * comes back later without an attempt spent.
 */
async function prepare(d: DeliveryDeps, e: RunEvent, rawUrl: string): Promise<Prepared> {
  let url: URL;
  try {
    url = new URL(rawUrl);
  } catch {
    return { problem: "the webhook endpoint is not a valid URL" };
  }
  let body = e.response?.data ?? new Uint8Array();
  if (e.responseObject !== "") {
    const blob = await (await d.results()).getBlob(e.responseObject);
    if (blob === null)
      return { problem: `the response body is no longer kept in the ${objectStores.results.name} object store` };
    body = blob;
  }
  // A call without X-Webhook-Secret stored none (its events say so since the first version): nothing to read.
  if (!e.webhookSigned) return { url, body, secret: undefined };
  let secret: string | undefined;
  try {
    secret = await loadWebhookSecret(d.secrets, d.box, e.runId);
  } catch (err) {
    if (err instanceof UnsealError) return { problem: `cannot unseal the webhook secret: ${err.message}` };
    throw err;
  }
  // Sending it unsigned would make a verifying receiver reject it, or worse, teach it to accept unsigned ones.
  if (secret === undefined && e.webhookSigned)
    return { problem: "the call carried X-Webhook-Secret but its sealed secret has expired" };
  return { url, body, secret };
}

function send(
  d: DeliveryDeps,
  runId: string,
  p: { url: URL; body: Uint8Array; secret: string | undefined },
): Promise<AttemptResult> {
  const headers: Record<string, string> = {
    "content-type": "application/json",
    "user-agent": USER_AGENT,
    "x-request-id": runId,
    // The timestamp is this attempt's: a retry is signed afresh.
    ...(p.secret !== undefined ? signWebhook({ secret: p.secret, requestId: runId, body: p.body }) : {}),
  };
  return postWebhook({ url: p.url, body: p.body, headers, timeoutMs: d.timeoutMs, guard: d.guard });
}

/**
 * Stores an attempt's outcome and the delivery state it leads to; logs a
 * delivery that just failed. `startedAt`: the revision of the entry that
 * `firstAttempt` made, written over without a read (read when it changed).
 */
async function finishAttempt(
  d: DeliveryDeps,
  r: DeliveryRecord,
  n: number,
  result: AttemptResult,
  startedAt?: number,
): Promise<DeliveryRecord> {
  const verdict = result.permanent ? "failed" : judgeAttempt(result.status);
  // The outcome says what followed: a retryable answer to the last attempt is a failure.
  const outcome = OUTCOME[nextStep(n, verdict)];
  d.metrics?.webhookAttempts.inc({ outcome });
  const change = (rec: DeliveryRecord) => {
    const a = rec.attempts.find((x) => x.attempt === n);
    if (a === undefined) return undefined;
    Object.assign(
      a,
      { duration_ms: result.durationMs, status_code: result.status ?? 0, outcome },
      result.error !== undefined ? { error: result.error } : {},
    );
    rec.state = stateOf(rec.attempts);
    return rec;
  };
  const known = startedAt === undefined ? undefined : change(structuredClone(r));
  const { before, after } =
    known !== undefined && (await d.store.replaceStarted(known, startedAt!)) !== false
      ? { before: r, after: known }
      : await d.store.modify(r.run_id, r.delivery_id, change);
  if (before.state !== "failed" && after.state === "failed") logFailure(d.logger, after);
  return after;
}

function logFailure(logger: Logger, r: DeliveryRecord): void {
  // The host only: the path and query of a webhook URL may carry tokens.
  let host = "(invalid URL)";
  try {
    host = new URL(r.url).host;
  } catch {
    // host stays as above
  }
  const attempts = r.attempts.map((a) => ({
    attempt: a.attempt,
    status: a.status_code ?? 0,
    error: a.error,
    outcome: a.outcome,
    duration_ms: a.duration_ms,
  }));
  logger.error(
    { runId: r.run_id, deliveryId: r.delivery_id, host, attempts },
    `webhook delivery of run ${r.run_id} to ${host} failed after ${r.attempts.length} attempt(s)`,
  );
}
