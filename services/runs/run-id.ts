// Run ids: UUIDv7, time-ordered, and in order within a millisecond too (a
// counter seeded at random, as uuid's own v7() keeps one), with their random
// bytes drawn 4 KiB at a time: uuid's v7() draws 16 bytes through WebCrypto
// for every id, a visible share of an async accept's main thread
// (`bench/profile.ts accept`; bench/README.md).
import { randomFillSync } from "node:crypto";
import { v7 } from "uuid";

const pool = new Uint8Array(4096);
let used = pool.length;
/** The last id's millisecond and counter. */
const state = { msecs: -Infinity, seq: 0 };

/** A new run id, greater than every id this process made before. */
export function newRunId(now = Date.now()): string {
  if (used + 16 > pool.length) {
    randomFillSync(pool);
    used = 0;
  }
  const random = pool.subarray(used, (used += 16));
  if (now > state.msecs) {
    // A new millisecond: the counter starts at a random value below 2^31, as uuid's does.
    state.seq = ((random[6] & 0x7f) << 24) | (random[7] << 16) | (random[8] << 8) | random[9];
    state.msecs = now;
  } else {
    state.seq = (state.seq + 1) | 0;
    if (state.seq === 0) state.msecs++; // the counter ran over: borrow the next millisecond
  }
  return v7({ random, msecs: state.msecs, seq: state.seq });
}
