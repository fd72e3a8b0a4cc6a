// The states of a run, as they appear in REST JSON, run events, records and
// the dashboard. Free of imports: the dashboard's browser bundle uses it too.

export const RUN_STATUSES = ["queued", "running", "success", "failure", "cancelled"] as const;
export type RunStatus = (typeof RUN_STATUSES)[number];

/** A final state is never changed again. */
const FINAL_STATUSES = ["success", "failure", "cancelled"] as const satisfies readonly RunStatus[];
export type FinalStatus = (typeof FINAL_STATUSES)[number];

export const isFinal = (status: string): status is FinalStatus =>
  (FINAL_STATUSES as readonly string[]).includes(status);
