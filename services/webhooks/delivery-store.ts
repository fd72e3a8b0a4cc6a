// Webhook deliveries in KV `skiff-webhooks`: one entry per run, under the run
// id, holding all its deliveries (the first, and one per redelivery). The
// entry is the truth about them: every change is a compare-and-set on its
// revision, so two webhook processes holding the same event never both start
// the same attempt. One entry per run also makes listing one read: nothing
// has to scan keys.
import type { KV } from "nats";
import type { RunEvent } from "../../gen/skiff/events/v1/events_pb.js";
import { JsErrorCode, allRevisions, isJsError } from "../nats/index.js";

type DeliveryState = "pending" | "delivered" | "failed";
/** What an attempt's answer leads to under the spec's retry table (webhook/retry-policy.ts). */
export type AttemptVerdict = "delivered" | "retry" | "failed";

export interface AttemptRecord {
  /** 1-based. */
  attempt: number;
  /** ISO time the attempt was recorded as started, before anything was sent. */
  started_at: string;
  /** After this (ISO) an attempt still without outcome is taken as interrupted: its process stopped mid-attempt. */
  deadline: string;
  duration_ms?: number;
  /** The receiver's HTTP status; 0 when none came. */
  status_code?: number;
  error?: string;
  /** What followed the attempt ("failed": no retry); absent while the attempt is in flight. */
  outcome?: AttemptVerdict;
}

export interface DeliveryRecord {
  delivery_id: string;
  run_id: string;
  project_id: string;
  app_name: string;
  url: string;
  state: DeliveryState;
  created_at: string;
  /** SKIFF_WEBHOOKS sequence of the terminal event whose response this delivery sends; a redelivery re-reads it. */
  event_seq: number;
  attempts: AttemptRecord[];
}

/** A delivery of the run's terminal event `e` (read at `eventSeq` of SKIFF_WEBHOOKS), pending, with no attempt yet. */
export function newDeliveryRecord(e: RunEvent, deliveryId: string, eventSeq: number): DeliveryRecord {
  return {
    delivery_id: deliveryId,
    run_id: e.runId,
    project_id: e.projectId,
    app_name: e.appName,
    url: e.webhookEndpoint,
    state: "pending",
    created_at: new Date().toISOString(),
    event_seq: eventSeq,
    attempts: [],
  };
}

interface Versioned {
  record: DeliveryRecord;
  /** Revision of the run's entry. */
  revision: number;
}

interface RunEntry {
  deliveries: DeliveryRecord[];
  /** The stream sequences of the entry's earlier revisions: with its own, what its removal deletes. */
  prior_revisions?: number[];
}

/** Where a run's entry stands: its deliveries, and its revision with the earlier ones (none: no entry). */
interface Current {
  deliveries: DeliveryRecord[];
  revision: number | undefined;
  prior: number[];
}

const decoder = new TextDecoder();

/** Every revision of a run's entry, or false while one of its deliveries is under way (keep it); for kvRemoveKey. */
export function revisionsIfOver(value: Uint8Array, revision: number): number[] | false | undefined {
  let entry: RunEntry;
  try {
    entry = JSON.parse(decoder.decode(value)) as RunEntry;
  } catch {
    return undefined;
  }
  if (!Array.isArray(entry?.deliveries) || entry.deliveries.some((d) => d.state === "pending")) return false;
  return allRevisions(entry.prior_revisions, revision);
}

/** KV keys and subject tokens: no dots, wildcards or spaces. */
const TOKEN = /^[A-Za-z0-9_-]{1,128}$/;

export function isKeyToken(value: string): boolean {
  return TOKEN.test(value);
}

/** What the attempts say about the delivery: one 2xx delivers it; an attempt after which no retry follows fails it. */
export function stateOf(attempts: readonly AttemptRecord[]): DeliveryState {
  if (attempts.some((attempt) => attempt.outcome === "delivered")) return "delivered";
  return attempts.at(-1)?.outcome === "failed" ? "failed" : "pending";
}

const NO_ENTRY: Current = { deliveries: [], revision: undefined, prior: [] };

export class DeliveryStore {
  constructor(readonly kv: KV) {}

  private async read(runId: string): Promise<Current> {
    const entry = await this.kv.get(runId);
    if (entry?.operation !== "PUT") return { deliveries: [], revision: undefined, prior: [] };
    const value = entry.json<RunEntry>();
    return { deliveries: value.deliveries, revision: entry.revision, prior: value.prior_revisions ?? [] };
  }

  /**
   * Compare-and-set of the run's entry over `cur` (no revision: only if there is none): the entry's new
   * revision, or false on a conflict.
   */
  private async write(runId: string, deliveries: DeliveryRecord[], cur: Current): Promise<number | false> {
    const { revision } = cur;
    const prior_revisions = revision === undefined ? [] : [...cur.prior, revision];
    const value = JSON.stringify({ deliveries, prior_revisions } satisfies RunEntry);
    try {
      return revision === undefined ? await this.kv.create(runId, value) : await this.kv.update(runId, value, revision);
    } catch (err) {
      // A compare-and-set on a stale revision: another process wrote first.
      if (isJsError(err, JsErrorCode.WrongLastSequence)) return false;
      // kv.create reports an existing key with its own error; a fresh read settles it.
      if (revision === undefined && (await this.read(runId)).revision !== undefined) return false;
      throw err;
    }
  }

  async get(runId: string, deliveryId: string): Promise<Versioned | undefined> {
    const { deliveries, revision } = await this.read(runId);
    const record = deliveries.find((delivery) => delivery.delivery_id === deliveryId);
    return record === undefined || revision === undefined ? undefined : { record, revision };
  }

  /** Adds the delivery unless it exists; either way returns what is stored, and whether this call added it. */
  async create(record: DeliveryRecord): Promise<Versioned & { created: boolean }> {
    for (;;) {
      const cur = await this.read(record.run_id);
      const { deliveries, revision } = cur;
      const existing = deliveries.find((delivery) => delivery.delivery_id === record.delivery_id);
      if (existing !== undefined && revision !== undefined) return { record: existing, revision, created: false };
      if ((await this.write(record.run_id, [...deliveries, record], cur)) !== false)
        return { ...(await this.get(record.run_id, record.delivery_id))!, created: true };
    }
  }

  /** Compare-and-set of one delivery: false when the run's entry changed since `revision`. */
  async replace(record: DeliveryRecord, revision: number): Promise<boolean> {
    const cur = await this.read(record.run_id);
    if (cur.revision !== revision) return false;
    const written = await this.write(
      record.run_id,
      cur.deliveries.map((delivery) => (delivery.delivery_id === record.delivery_id ? record : delivery)),
      cur,
    );
    return written !== false;
  }

  /**
   * Makes the run's entry, holding this one delivery, when the run has none (one write, no read):
   * undefined, with nothing written, when it has one.
   */
  async start(record: DeliveryRecord): Promise<Versioned | undefined> {
    const revision = await this.write(record.run_id, [record], NO_ENTRY);
    return revision === false ? undefined : { record, revision };
  }

  /**
   * Compare-and-set of an entry as `start` made it (this delivery alone, at `revision`), without reading
   * it first: false when it changed since.
   */
  async replaceStarted(record: DeliveryRecord, revision: number): Promise<Versioned | false> {
    const written = await this.write(record.run_id, [record], { deliveries: [record], revision, prior: [] });
    return written === false ? false : { record, revision: written };
  }

  /**
   * Applies `change` to the current delivery until the compare-and-set holds.
   * Returns the delivery before and after (equal when `change` returned undefined).
   */
  async modify(
    runId: string,
    deliveryId: string,
    change: (record: DeliveryRecord) => DeliveryRecord | undefined,
  ): Promise<{ before: DeliveryRecord; after: DeliveryRecord }> {
    for (;;) {
      const cur = await this.get(runId, deliveryId);
      if (cur === undefined) throw new Error(`webhook delivery ${deliveryId} of run ${runId} vanished from KV`);
      const next = change(structuredClone(cur.record));
      if (next === undefined) return { before: cur.record, after: cur.record };
      if (await this.replace(next, cur.revision)) return { before: cur.record, after: next };
    }
  }

  async remove(runId: string, deliveryId: string): Promise<void> {
    for (;;) {
      const cur = await this.read(runId);
      if (
        cur.revision === undefined ||
        (await this.write(
          runId,
          cur.deliveries.filter((delivery) => delivery.delivery_id !== deliveryId),
          cur,
        )) !== false
      )
        return;
    }
  }

  /** Every delivery of a run, oldest first. */
  async list(runId: string): Promise<DeliveryRecord[]> {
    if (!isKeyToken(runId)) return [];
    return (await this.read(runId)).deliveries;
  }
}
