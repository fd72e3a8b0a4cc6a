// Idempotency-Key: the first async call with a key (per app: a new app of
// a deleted one's name, or of a deleted project's id, starts afresh) claims it in KV `skiff-idempotency` (24 h TTL) with a
// create (a compare-and-set on "no entry"), which only one writer can win; a
// repeat, or a call racing the first, reads the winner's run id and answers
// with it. A claim whose run could not be queued is released, so a retry of
// that call runs. The claim is one acknowledged publish on the connection's
// shared reply subscription (nats/acked-publish.ts), as the queue message
// after it is.
import { createHash } from "node:crypto";
import type { KV, NatsConnection } from "nats";
import type { AppRecord } from "../apps/index.js";
import { buckets, kvGetLatest, publishAcked } from "../nats/index.js";
import { isWrongRevision } from "../runs/index.js";

const MAX_KEY_LENGTH = 255;
/** Claims that find the key released (a delete marker) and try again, at most. */
const MAX_CLAIM_TRIES = 10;
const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** The app a key belongs to: this app, not an earlier one of its name (deleted, or of a deleted project of its id). */
type KeyScope = Pick<AppRecord, "project_id" | "app_name" | "created_at">;

/** KV keys allow few characters and the caller's key may hold any: hash it with its scope. */
function kvKey(app: KeyScope, key: string): string {
  return createHash("sha256")
    .update(`${app.project_id}\n${app.app_name}\n${app.created_at}\n${key.slice(0, MAX_KEY_LENGTH)}`)
    .digest("hex");
}

/** Claims the key for `runId`; returns the run id that owns it (runId when this call won). */
export async function claimIdempotencyKey(
  nc: NatsConnection,
  app: KeyScope,
  key: string,
  runId: string,
): Promise<string> {
  const bucket = buckets.idempotency.name;
  const entryKey = kvKey(app, key);
  const subject = `$KV.${bucket}.${entryKey}`;
  // 0: the key has never been written; else the revision of the delete marker a release left.
  let over = 0;
  for (let i = 0; i < MAX_CLAIM_TRIES; i++) {
    try {
      await publishAcked(nc, subject, encoder.encode(runId), { expectedLastSubjectSequence: over });
      return runId;
    } catch (err) {
      if (!isWrongRevision(err)) throw err;
    }
    const entry = await kvGetLatest(nc, bucket, entryKey);
    if (entry?.operation === "PUT") return decoder.decode(entry.value);
    over = entry?.revision ?? 0;
  }
  throw new Error(`Idempotency-Key ${entryKey}: claimed and released ${MAX_CLAIM_TRIES} times while claiming it`);
}

export async function releaseIdempotencyKey(kv: KV, app: KeyScope, key: string, runId: string): Promise<void> {
  const entryKey = kvKey(app, key);
  const entry = await kv.get(entryKey).catch(() => null);
  if (entry?.operation === "PUT" && entry.string() === runId)
    await kv.delete(entryKey, { previousSeq: entry.revision }).catch(() => undefined);
}
