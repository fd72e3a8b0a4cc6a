// Where a finished run's response body goes.
//
//   - For GetRun, for async runs, while SKIFF_RESULT_TTL lasts (0: not kept): inline in the
//     run record when small, else in object store `skiff-results` under the
//     run id. Expiry is checked on read: a record past `expires_at` shows no
//     result, and sweep() removes objects older than both the TTL and the
//     events' age limit.
//   - For the terminal event (and so the webhook): inline when it fits an
//     event, else the same `skiff-results` object, named by `response_object`.
//     Such an object is kept at least as long as SKIFF_EVENTS keeps events,
//     so a webhook redelivery can still read it.
//   - Once an async run's record has left KV (nats/kv-purge.ts), GetRun
//     reads the result from the run's terminal event (readFromEvent), which
//     SKIFF_EVENTS keeps at least as long as SKIFF_RESULT_TTL (eventsMaxAgeMs).
import { fromBinary } from "@bufbuild/protobuf";
import type { JetStreamClient, NatsConnection, ObjectStore } from "nats";
import { RunEventSchema } from "../../gen/skiff/events/v1/events_pb.js";
import type { EventResponse } from "./event-bytes.js";
import { eventResponseLimit } from "./events.js";
import type { Logger } from "../config/index.js";
import { eventsMaxAgeMs, objectStores, streamMessage, streams } from "../nats/index.js";
import { isFinal } from "./status.js";
import type { RunRecord, StoredResult } from "./store.js";

/** Largest result kept inside the run record; larger ones go to the object store. */
const MAX_INLINE_RESULT_BYTES = 16 * 1024;

export interface Body {
  contentType: string;
  data: Uint8Array;
}

export class RunResults {
  private store: Promise<ObjectStore> | undefined;
  private readonly eventLimit: number;

  constructor(
    private readonly js: JetStreamClient,
    private readonly nc: NatsConnection,
    /** SKIFF_RESULT_TTL in seconds; 0 keeps no results. */
    readonly ttlSeconds: number,
  ) {
    this.eventLimit = eventResponseLimit(nc);
  }

  objects(): Promise<ObjectStore> {
    return (this.store ??= this.js.views.os(objectStores.results.name).catch((err: unknown) => {
      this.store = undefined;
      throw err;
    }));
  }

  /** Whether a sync run's body fits its event, so that ending the run stores nothing (keep() not needed). */
  fitsEvent(body: Body): boolean {
    return body.data.byteLength <= this.eventLimit;
  }

  /**
   * Stores what must outlive the run and says how the record and the event
   * refer to it. `forGetRun`: keep the result for GetRun (async runs).
   */
  async keep(
    runId: string,
    body: Body,
    now: Date,
    forGetRun: boolean,
  ): Promise<{ result: StoredResult | undefined; event: EventResponse }> {
    const size = body.data.byteLength;
    const keepResult = forGetRun && this.ttlSeconds > 0;
    const needObject = size > this.eventLimit || (keepResult && size > MAX_INLINE_RESULT_BYTES);
    if (needObject) await (await this.objects()).putBlob({ name: runId, description: body.contentType }, body.data);
    const expires_at = new Date(now.getTime() + this.ttlSeconds * 1000).toISOString();
    const result: StoredResult | undefined = !keepResult
      ? undefined
      : size > MAX_INLINE_RESULT_BYTES
        ? { content_type: body.contentType, object: runId, expires_at }
        : { content_type: body.contentType, data: Buffer.from(body.data).toString("base64"), expires_at };
    const event: EventResponse = size > this.eventLimit ? { object: runId } : body;
    return { result, event };
  }

  /** The run's result while it is kept; undefined once expired or when none was kept. */
  async read(record: RunRecord, now = new Date()): Promise<Body | undefined> {
    const kept = record.result;
    if (!kept || Date.parse(kept.expires_at) <= now.getTime()) return undefined;
    if (kept.data !== undefined) return { contentType: kept.content_type, data: Buffer.from(kept.data, "base64") };
    const data = kept.object ? await (await this.objects()).getBlob(kept.object) : null;
    return data ? { contentType: kept.content_type, data } : undefined;
  }

  /**
   * The result of a final async run whose record has left KV, from its
   * terminal event (SKIFF_EVENTS sequence `eventSeq`, as the run history
   * holds it) while SKIFF_RESULT_TTL lasts from the run's end; undefined
   * when none is kept, it has expired, or the event is gone.
   */
  async readFromEvent(record: RunRecord, eventSeq: number, now = Date.now()): Promise<Body | undefined> {
    if (!record.async || !isFinal(record.status) || this.ttlSeconds === 0 || eventSeq <= 0) return undefined;
    const ended = Date.parse(record.finished_at ?? "");
    if (!(ended + this.ttlSeconds * 1000 > now)) return undefined;
    const stored = await streamMessage(this.nc, streams.events.name, { seq: eventSeq });
    if (!stored) return undefined;
    let event;
    try {
      event = fromBinary(RunEventSchema, stored.data);
    } catch {
      return undefined;
    }
    if (event.runId !== record.run_id || event.status !== record.status) return undefined;
    if (event.response) return { contentType: event.response.contentType, data: event.response.data };
    if (!event.responseObject) return undefined;
    const os = await this.objects();
    const info = await os.info(event.responseObject);
    const data = info ? await os.getBlob(event.responseObject) : null;
    return info && data ? { contentType: info.description ?? "", data } : undefined;
  }

  /**
   * Removes objects older than both the result TTL and the events' age
   * limit (a webhook redelivery may still need them until then). Returns
   * how many were removed.
   */
  async sweep(logger: Logger, now = Date.now()): Promise<number> {
    const keepMs = eventsMaxAgeMs(this.ttlSeconds);
    const os = await this.objects();
    let removed = 0;
    for (const info of await os.list()) {
      if (now - Date.parse(info.mtime) <= keepMs) continue;
      try {
        await os.delete(info.name);
        removed++;
      } catch (err) {
        logger.warn({ err, object: info.name }, "cannot remove an expired result");
      }
    }
    return removed;
  }
}
