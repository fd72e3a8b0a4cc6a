// The run states, as skiff writes them in REST JSON and here.
export const RUN_STATUSES = ["queued", "running", "success", "failure", "cancelled"] as const;

export const isFinal = (status: string): boolean => status === "success" || status === "failure" || status === "cancelled";
