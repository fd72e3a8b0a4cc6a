// The spec's retry table (section 6.2), as one function: what an attempt's
// outcome means for the delivery.
//
//   network error (connection failure, timeout) → retry
//   404 Not Found                               → retry
//   other 4xx                                   → permanent failure
//   5xx                                         → no retry (avoids duplicate side effects)
//   any other non-2xx (1xx, 3xx: redirects are never followed) → retry
//   2xx                                         → delivered
import type { AttemptVerdict } from "../webhooks/index.js";

export const MAX_ATTEMPTS = 3;
/** Upper bound on the wait between two attempts. */
export const MAX_DELAY_MS = 5_000;

/** status undefined = the attempt got no HTTP answer (network error or timeout). */
export function judgeAttempt(status: number | undefined): AttemptVerdict {
  if (status === undefined) return "retry";
  if (status >= 200 && status < 300) return "delivered";
  if (status === 404) return "retry";
  if (status >= 400 && status < 600) return "failed";
  return "retry";
}

/** What to do after attempt number `attempt` (1-based) ended with `verdict`. */
export function nextStep(attempt: number, verdict: AttemptVerdict): "done" | "retry" | "give_up" {
  if (verdict === "delivered") return "done";
  if (verdict === "failed" || attempt >= MAX_ATTEMPTS) return "give_up";
  return "retry";
}

/** Wait before attempt `attempt + 1`: 1 s, then 2 s... never above MAX_DELAY_MS. */
export function delayAfter(attempt: number): number {
  return Math.min(MAX_DELAY_MS, 1000 * 2 ** (attempt - 1));
}
