// One run: what it is, its timeline, its result or error, and every attempt
// to deliver its webhook, with a button to deliver it again.
import { useState } from "react";
import { toJson } from "@bufbuild/protobuf";
import { timestampMs, ValueSchema } from "@bufbuild/protobuf/wkt";
import { Code } from "@connectrpc/connect";
import type { Run } from "../../gen/skiff/management/v2/management_pb.js";
import { describeError, isCode } from "./api.js";
import { AsyncBadge, StatusBadge } from "./badges.js";
import { dateOf, formatBytes, formatDuration, formatTime } from "./format.js";
import { ErrorNotice, Loading } from "./notices.js";
import { href, Link } from "./router.js";
import { useSession } from "./session-context.js";
import { isFinal } from "../runs/status.js";
import { useLoad } from "./use-load.js";
import { WebhookDeliveries } from "./webhook-deliveries.js";

/** While a run moves, its page refreshes this often. */
export const RUN_REFRESH_MS = 2000;

function Timeline({ run }: { run: Run }) {
  const queued = run.queuedAt ? timestampMs(run.queuedAt) : undefined;
  const step = (label: string, at: Date | undefined, note?: string) => (
    <li className={at ? "done" : "todo"}>
      <span className="step">{label}</span> <time>{at ? formatTime(at) : "not yet"}</time>
      {at && queued !== undefined && label !== "Queued" && (
        <span className="muted"> +{formatDuration(at.getTime() - queued)}</span>
      )}
      {note && <span className="muted"> {note}</span>}
    </li>
  );
  return (
    <ol className="timeline" aria-label="Timeline">
      {step("Queued", dateOf(run.queuedAt))}
      {step("Started", dateOf(run.startedAt), run.attempts > 1 ? `(attempt ${run.attempts})` : undefined)}
      {step(
        run.status === "cancelled" ? "Cancelled" : "Finished",
        dateOf(run.finishedAt),
        isFinal(run.status) && run.startedAt ? `ran ${formatDuration(run.runTimeMs)}` : undefined,
      )}
    </ol>
  );
}

function Outcome({ run }: { run: Run }) {
  if (run.error) {
    return (
      <section aria-labelledby="error-title" className="card error-card">
        <h2 id="error-title">Error</h2>
        <p>
          <code>{run.error.type}</code> {run.error.message}
        </p>
        {run.statusCode !== 0 && <p className="muted">HTTP status of the function's response: {run.statusCode}</p>}
      </section>
    );
  }
  if (!isFinal(run.status)) return null;
  let body: string | undefined;
  if (run.result) body = JSON.stringify(toJson(ValueSchema, run.result), null, 2);
  else if (run.rawResult)
    body =
      run.rawResult.contentType.startsWith("text/") || run.rawResult.contentType.includes("json")
        ? new TextDecoder().decode(run.rawResult.data)
        : `${run.rawResult.data.byteLength} bytes of ${run.rawResult.contentType || "binary data"}`;
  return (
    <section aria-labelledby="result-title" className="card">
      <h2 id="result-title">Result</h2>
      {run.statusCode >= 400 && run.statusCode < 500 ? (
        <p className="notice warn">
          The app answered HTTP {run.statusCode}: the run ended, but the app refused the request.
        </p>
      ) : (
        run.statusCode !== 0 && <p className="muted">HTTP status {run.statusCode}</p>
      )}
      {body !== undefined ? (
        <pre className="result">{body}</pre>
      ) : run.async ? (
        <p className="muted">
          No result is kept for this run (results of async runs are kept for SKIFF_RESULT_TTL, 24 h by default).
        </p>
      ) : (
        <p className="muted">
          This was a sync run: the caller got the answer when it was called, and skiff keeps no result of sync runs.
        </p>
      )}
    </section>
  );
}

export function RunPage({ project, app, runId }: { project: string; app: string; runId: string }) {
  const { client } = useSession();
  const [cancelError, setCancelError] = useState<string>();
  const [cancelling, setCancelling] = useState(false);
  // The run is re-read until it is final; then once more is never needed.
  const [settled, setSettled] = useState(false);
  const run = useLoad(
    async (signal) => {
      const r = (await client.getRun({ projectId: project, appName: app, runId }, { signal })).run;
      setSettled(r !== undefined && isFinal(r.status));
      return r;
    },
    [project, app, runId],
    { refreshMs: settled ? undefined : RUN_REFRESH_MS },
  );
  const r = run.data;

  const cancel = async () => {
    setCancelling(true);
    setCancelError(undefined);
    try {
      await client.cancelRun({ projectId: project, appName: app, runId });
      run.reload();
    } catch (err) {
      setCancelError(describeError(err));
    } finally {
      setCancelling(false);
    }
  };

  return (
    <main className="page">
      <p className="crumbs">
        <Link href={`${href("projects", project, "runs")}?${new URLSearchParams({ app })}`}>← Runs of {app}</Link>
      </p>
      <h1>
        Run <span className="mono">{runId}</span>
      </h1>
      {run.error !== undefined &&
        (isCode(run.error, Code.NotFound) ? (
          <ErrorNotice error={run.error} what="this run (its record may have expired, or the link is wrong)" />
        ) : (
          <ErrorNotice error={run.error} retry={run.reload} what="the run" />
        ))}
      {r === undefined ? (
        run.error === undefined && <Loading what="the run" />
      ) : (
        <>
          <dl className="facts">
            <dt>Status</dt>
            <dd>
              <StatusBadge status={r.status} code={r.statusCode} />{" "}
              {r.async ? <AsyncBadge /> : <span className="muted">sync</span>}
            </dd>
            <dt>App</dt>
            <dd>{r.appName}</dd>
            <dt>Function</dt>
            <dd className="mono">{r.path}</dd>
            <dt>Run time</dt>
            <dd>{isFinal(r.status) && r.startedAt ? formatDuration(r.runTimeMs) : "—"}</dd>
            {isFinal(r.status) && !r.websocket && (
              <>
                <dt>Response</dt>
                <dd>{formatBytes(r.responseBytes)}</dd>
              </>
            )}
            {r.websocket && (
              <>
                <dt>WebSocket</dt>
                <dd>
                  closed with <span className="mono">{r.websocket.closeCode}</span>
                  {r.websocket.closeReason && ` "${r.websocket.closeReason}"`} by {r.websocket.closedBy};{" "}
                  {String(r.websocket.messagesIn)} messages in ({formatBytes(r.websocket.bytesIn)}),{" "}
                  {String(r.websocket.messagesOut)} out ({formatBytes(r.websocket.bytesOut)})
                </dd>
              </>
            )}
          </dl>
          {!isFinal(r.status) && (
            <p>
              <button type="button" onClick={cancel} disabled={cancelling}>
                {cancelling ? "Cancelling…" : "Cancel run"}
              </button>
              {cancelError && (
                <span className="notice error inline" role="alert">
                  {cancelError}
                </span>
              )}
            </p>
          )}
          <Timeline run={r} />
          <Outcome run={r} />
          <WebhookDeliveries project={project} app={app} run={r} />
        </>
      )}
    </main>
  );
}
