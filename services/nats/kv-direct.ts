// One KV entry, read with a direct get on the connection's shared reply
// subscription (acked-publish.ts). nats.js's kv.get() is a request of its
// own, and a finished request makes an error object (with its stack) only to
// cancel itself: 1.7% of the async path's main thread, where a runner reads
// each run's record as it takes the run (bench/profile.ts async). Direct
// gets are what kv.get() uses too, on buckets that allow them (nats.js
// creates every bucket so on servers from 2.9 on).
import type { NatsConnection } from "nats";
import { PublishError, requestPipelined } from "./acked-publish.js";

export interface DirectEntry {
  value: Uint8Array;
  /** The entry's stream sequence. */
  revision: number;
  operation: "PUT" | "DEL" | "PURGE";
}

const encoder = new TextEncoder();

/** The latest entry of `key` in `bucket`; undefined when it has none. */
export async function kvGetDirect(nc: NatsConnection, bucket: string, key: string): Promise<DirectEntry | undefined> {
  const request = encoder.encode(JSON.stringify({ last_by_subj: `$KV.${bucket}.${key}` }));
  const msg = await requestPipelined(nc, `$JS.API.DIRECT.GET.KV_${bucket}`, request);
  const h = msg.headers;
  if (h?.code === 404) return undefined;
  const revision = Number(h?.get("Nats-Sequence"));
  if (!h || h.code >= 300 || !Number.isSafeInteger(revision) || revision <= 0)
    throw new PublishError(`cannot read ${key} of KV ${bucket}: ${h ? `${h.code} ${h.description}` : "no headers"}`);
  const op = h.get("KV-Operation");
  return { value: msg.data, revision, operation: op === "DEL" || op === "PURGE" ? op : "PUT" };
}
