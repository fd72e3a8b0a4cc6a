// Run status and the async mark. `failure` must be unmistakable: it is
// written out, in red, with a cross, so it reads without colour too. The
// HTTP status of the app's answer sits beside it.
const STATUS_MARK: Record<string, string> = {
  queued: "◷",
  running: "▶",
  success: "✓",
  failure: "✕",
  cancelled: "⊘",
};

/**
 * A run's status and, when the app answered, the HTTP status of its answer.
 * A run that succeeded with a 4xx answer (a Custom app refusing the request)
 * is marked as a warning, in amber with "!", not as a plain success.
 */
export function StatusBadge({ status, code = 0 }: { status: string; code?: number }) {
  const known = status in STATUS_MARK;
  const refused = status === "success" && code >= 400 && code < 500;
  const kind = refused ? "warning" : known ? status : "unknown";
  return (
    <span className="status-pair">
      <span
        className={`badge status status-${kind}`}
        data-status={status}
        title={refused ? `The run ended, but the app answered HTTP ${code}` : undefined}
      >
        <span aria-hidden="true">{refused ? "!" : (STATUS_MARK[status] ?? "?")}</span> {status || "unknown"}
      </span>
      {code !== 0 && (
        <>
          {" "}
          <span className={`badge http http-${Math.floor(code / 100)}xx`} data-http-status={code}>
            <span className="sr-only">HTTP status </span>
            {code}
          </span>
        </>
      )}
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
