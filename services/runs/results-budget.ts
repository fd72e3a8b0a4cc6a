// Object store `skiff-results` at its byte budget. It discards nothing by
// itself (an accepted async run's large body waits there under
// `transfer.{id}`, and must not go), so skiff makes room: from TRIM_FROM of
// the budget, the results of ended runs are removed, oldest first, until the
// store is down to TRIM_TO of it. A run whose result is gone still has its
// record; GetRun then shows no result, as after SKIFF_RESULT_TTL, and a
// webhook redelivery says the body is no longer kept.
import type { Logger } from "../config/index.js";
import { mib, objectStores, type StoreUsage } from "../nats/index.js";
import type { RunResults } from "./results.js";

/** Part of the budget from which results are removed. */
export const TRIM_FROM = 0.8;
/** Part of the budget the store is brought down to. */
export const TRIM_TO = 0.6;
/** Objects of bodies in transit (runs/wire.ts): never removed to make room. */
const IN_TRANSIT = "transfer.";

/** Removes the oldest results past TRIM_TO of the store's budget when it holds TRIM_FROM of it; says how many. */
export async function trimResults(results: RunResults, usage: StoreUsage | undefined, logger: Logger): Promise<number> {
  if (usage === undefined || usage.budget <= 0 || usage.bytes < usage.budget * TRIM_FROM) return 0;
  const os = await results.objects();
  const oldestFirst = (await os.list())
    .filter((info) => !info.name.startsWith(IN_TRANSIT))
    .sort((a, b) => Date.parse(a.mtime) - Date.parse(b.mtime));
  let excess = usage.bytes - usage.budget * TRIM_TO;
  let removed = 0;
  for (const info of oldestFirst) {
    if (excess <= 0) break;
    try {
      await os.delete(info.name);
      excess -= info.size;
      removed++;
    } catch (err) {
      logger.warn({ err, object: info.name }, "cannot remove a result to make room");
    }
  }
  logger.warn(
    { removed, bytes: usage.bytes, budget: usage.budget },
    `object store ${objectStores.results.name} held ${mib(usage.bytes)} of its ${mib(usage.budget)} budget (SKIFF_RESULTS_MAX_BYTES): its ${removed} oldest results were removed`,
  );
  return removed;
}
