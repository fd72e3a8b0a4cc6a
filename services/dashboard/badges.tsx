// Run status and the async mark. `failure` must be unmistakable: it is
// written out, in red, with a cross, so it reads without colour too.
const STATUS_MARK: Record<string, string> = {
  queued: "◷",
  running: "▶",
  success: "✓",
  failure: "✕",
  cancelled: "⊘",
};

export function StatusBadge({ status }: { status: string }) {
  const known = status in STATUS_MARK;
  return (
    <span className={`badge status status-${known ? status : "unknown"}`} data-status={status}>
      <span aria-hidden="true">{STATUS_MARK[status] ?? "?"}</span> {status || "unknown"}
    </span>
  );
}

export function AsyncBadge() {
  return (
    <span className="badge async" title="Called with async=true: the caller got only the run id">
      async
    </span>
  );
}

const DELIVERY_CLASS: Record<string, string> = { delivered: "ok", failed: "bad", pending: "wait", retry: "wait" };

/** A webhook delivery's state or an attempt's outcome, with the word skiff uses unless told otherwise. */
export function OutcomeBadge({ outcome, label }: { outcome: string; label?: string }) {
  return (
    <span className={`badge outcome outcome-${DELIVERY_CLASS[outcome] ?? "none"}`} data-outcome={outcome}>
      {label ?? outcome}
    </span>
  );
}
