// One KV entry, read by its stream's leader through the connection's shared
// reply subscription (acked-publish.ts). nats.js's kv.get() is a request of
// its own, and a finished request makes an error object (with its stack)
// only to cancel itself, on the async path, where a runner reads each run's
// record as it takes the run (`bench/profile.ts async`; bench/README.md).
//
// It asks `$JS.API.STREAM.MSG.GET`, which the leader answers, as kv.get() does
// on a bucket bound without its stream info (how skiff binds). Not a direct
// get: on a cluster any replica answers those, one still catching up
// included, and a runner that read a run's record stale left the run
// `queued` for good (the fault suite's rolling restart).
import type { NatsConnection } from "nats";
import { apiFailure, apiRequest } from "./acked-publish.js";

export interface KvGetEntry {
  value: Uint8Array;
  /** The entry's stream sequence. */
  revision: number;
  operation: "PUT" | "DEL" | "PURGE";
}

interface MsgGetAnswer {
  message?: { seq?: number; hdrs?: string; data?: string };
}

/** JetStream's "no message found". */
const NO_MESSAGE = 10037;

/** A message of a stream as its leader gave it. */
interface StoredMessage {
  seq: number;
  /** The headers as sent (NATS/1.0 header block), latin1; "" when none. */
  headers: string;
  data: Uint8Array;
}

/** One message of `stream` read by the leader: by sequence, or the last on a subject; undefined when there is none. */
export async function streamMessage(
  nc: NatsConnection,
  stream: string,
  which: { seq: number } | { last_by_subj: string },
  /** What errors call it; default the message's sequence or subject and the stream. */
  what = "seq" in which ? `message ${which.seq} of ${stream}` : `${which.last_by_subj} in ${stream}`,
): Promise<StoredMessage | undefined> {
  const answer = await apiRequest<MsgGetAnswer>(nc, `$JS.API.STREAM.MSG.GET.${stream}`, which, `read ${what}`);
  if (answer.error?.err_code === NO_MESSAGE) return undefined;
  const m = answer.message;
  if (answer.error || !m || !Number.isSafeInteger(m.seq) || m.seq! <= 0)
    throw apiFailure(`read ${what}`, answer.error, "no message in JetStream's answer");
  return {
    seq: m.seq!,
    headers: m.hdrs ? Buffer.from(m.hdrs, "base64").toString("latin1") : "",
    data: m.data ? Buffer.from(m.data, "base64") : new Uint8Array(0),
  };
}

/** A KV key as NATS takes one (nats.js's rule): no wildcard, no empty token, so it names one subject. */
const KV_KEY = /^[-/=\w]+(\.[-/=\w]+)*$/;

/** The latest entry of `key` in `bucket`; undefined when it has none. Throws for a key that is none (`*`, `>`, ...). */
export async function kvGetLatest(nc: NatsConnection, bucket: string, key: string): Promise<KvGetEntry | undefined> {
  if (!KV_KEY.test(key)) throw new Error(`invalid KV key ${JSON.stringify(key.slice(0, 80))}`);
  const m = await streamMessage(nc, `KV_${bucket}`, { last_by_subj: `$KV.${bucket}.${key}` }, `${key} of KV ${bucket}`);
  if (!m) return undefined;
  const op = /^KV-Operation:\s*(DEL|PURGE)\s*$/im.exec(m.headers);
  return { value: m.data, revision: m.seq, operation: op ? (op[1].toUpperCase() as "DEL" | "PURGE") : "PUT" };
}
