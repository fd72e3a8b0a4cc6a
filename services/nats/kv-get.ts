// One KV entry, read by its stream's leader through the connection's shared
// reply subscription (acked-publish.ts). nats.js's kv.get() is a request of
// its own, and a finished request makes an error object (with its stack)
// only to cancel itself: 1.7% of the async path's main thread, where a runner
// reads each run's record as it takes the run (bench/profile.ts async).
//
// It asks `$JS.API.STREAM.MSG.GET`, which the leader answers, as kv.get() does
// on a bucket bound without its stream info (how skiff binds). Not a direct
// get: on a cluster any replica answers those, one still catching up
// included, and a runner that read a run's record stale left the run
// `queued` for good (the fault suite's rolling restart).
import type { NatsConnection } from "nats";
import { PublishError, requestPipelined } from "./acked-publish.js";

export interface KvGetEntry {
  value: Uint8Array;
  /** The entry's stream sequence. */
  revision: number;
  operation: "PUT" | "DEL" | "PURGE";
}

interface MsgGetAnswer {
  message?: { seq?: number; hdrs?: string; data?: string };
  error?: { code?: number; err_code?: number; description?: string };
}

/** JetStream's "no message found". */
const NO_MESSAGE = 10037;
const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** The latest entry of `key` in `bucket`; undefined when it has none. */
export async function kvGetLatest(nc: NatsConnection, bucket: string, key: string): Promise<KvGetEntry | undefined> {
  const request = encoder.encode(JSON.stringify({ last_by_subj: `$KV.${bucket}.${key}` }));
  const msg = await requestPipelined(nc, `$JS.API.STREAM.MSG.GET.KV_${bucket}`, request);
  let answer: MsgGetAnswer;
  try {
    answer = JSON.parse(decoder.decode(msg.data)) as MsgGetAnswer;
  } catch {
    throw new PublishError(`cannot read ${key} of KV ${bucket}: JetStream's answer is not JSON`);
  }
  if (answer.error?.err_code === NO_MESSAGE) return undefined;
  const m = answer.message;
  if (answer.error || !m || !Number.isSafeInteger(m.seq) || m.seq! <= 0)
    throw new PublishError(
      `cannot read ${key} of KV ${bucket}: ${answer.error?.description ?? "no message in JetStream's answer"}`,
      answer.error?.err_code,
    );
  const op = m.hdrs
    ? /^KV-Operation:\s*(DEL|PURGE)\s*$/im.exec(Buffer.from(m.hdrs, "base64").toString("latin1"))
    : null;
  const value = m.data ? Buffer.from(m.data, "base64") : new Uint8Array(0);
  return { value, revision: m.seq!, operation: op ? (op[1].toUpperCase() as "DEL" | "PURGE") : "PUT" };
}
