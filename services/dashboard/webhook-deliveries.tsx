// Every delivery of a run's webhook and every attempt of each (time, the
// receiver's status or the network error, duration, what followed), and a
// Redeliver button that starts a fresh set of up to 3 attempts.
import { useState } from "react";
import type { Run, WebhookAttempt, WebhookDelivery } from "../../gen/skiff/management/v2/management_pb.js";
import { describeError } from "./api.js";
import { OutcomeBadge } from "./badges.js";
import { dateOf, formatDuration, formatTime } from "./format.js";
import { ErrorNotice, Loading } from "./notices.js";
import { isFinal } from "../runs/status.js";
import { useSession } from "./session-context.js";
import { useLoad } from "./use-load.js";

const REFRESH_MS = 2000;

const OUTCOME_TEXT: Record<string, string> = {
  delivered: "delivered",
  retry: "retried",
  failed: "failed, not retried",
};

function Attempt({ a }: { a: WebhookAttempt }) {
  const answer = a.error ? (
    <span className="bad-text">{a.statusCode ? `HTTP ${a.statusCode}: ${a.error}` : a.error}</span>
  ) : a.statusCode ? (
    <span className={a.statusCode >= 200 && a.statusCode < 300 ? "ok-text" : "bad-text"}>HTTP {a.statusCode}</span>
  ) : (
    <span className="muted">in flight</span>
  );
  return (
    <tr>
      <td className="num" data-label="Attempt">
        {a.attempt}
      </td>
      <td data-label="Time">{formatTime(dateOf(a.startedAt))}</td>
      <td data-label="Answer">{answer}</td>
      <td className="num" data-label="Duration">
        {a.outcome ? formatDuration(a.durationMs) : "—"}
      </td>
      <td data-label="Outcome">
        {a.outcome ? (
          <OutcomeBadge outcome={a.outcome} label={OUTCOME_TEXT[a.outcome]} />
        ) : (
          <span className="muted">pending</span>
        )}
      </td>
    </tr>
  );
}

function Delivery({ d, n }: { d: WebhookDelivery; n: number }) {
  return (
    <section className="delivery" aria-label={`Delivery ${n}`}>
      <h3>
        Delivery {n} <OutcomeBadge outcome={d.state} />{" "}
        <span className="muted">started {formatTime(dateOf(d.createdAt))}</span>
      </h3>
      {d.attempts.length === 0 ? (
        <p className="muted">No attempt yet.</p>
      ) : (
        <div className="table-scroll">
          <table className="attempts stack">
            <caption className="sr-only">Attempts of delivery {n}</caption>
            <thead>
              <tr>
                <th scope="col">Attempt</th>
                <th scope="col">Time</th>
                <th scope="col">Answer</th>
                <th scope="col">Duration</th>
                <th scope="col">Outcome</th>
              </tr>
            </thead>
            <tbody>
              {d.attempts.map((a) => (
                <Attempt key={a.attempt} a={a} />
              ))}
            </tbody>
          </table>
        </div>
      )}
    </section>
  );
}

export function WebhookDeliveries({ project, app, run }: { project: string; app: string; run: Run }) {
  const { client } = useSession();
  const [redelivering, setRedelivering] = useState(false);
  const [message, setMessage] = useState<{ ok: boolean; text: string }>();
  const final = isFinal(run.status);
  const [quiet, setQuiet] = useState(false);
  const deliveries = useLoad(
    async (signal) => {
      const res = await client.listWebhookDeliveries(
        { projectId: project, appName: app, runId: run.runId },
        { signal },
      );
      // Nothing more will change once every delivery has ended.
      setQuiet(res.deliveries.length > 0 && res.deliveries.every((d) => d.state !== "pending"));
      return res.deliveries;
    },
    [project, app, run.runId, final],
    { refreshMs: run.webhookEndpoint && !quiet ? REFRESH_MS : undefined },
  );

  if (!run.webhookEndpoint) {
    return (
      <section className="card" aria-labelledby="webhook-title">
        <h2 id="webhook-title">Webhook</h2>
        <p className="muted">
          This run was called without <code>webhookEndpoint</code>, so its result is not forwarded anywhere.
        </p>
      </section>
    );
  }

  const redeliver = async () => {
    setRedelivering(true);
    setMessage(undefined);
    try {
      await client.redeliverWebhook({ projectId: project, appName: app, runId: run.runId });
      setMessage({ ok: true, text: "A fresh delivery has started (up to 3 attempts)." });
      setQuiet(false);
      deliveries.reload();
    } catch (err) {
      setMessage({ ok: false, text: describeError(err) });
    } finally {
      setRedelivering(false);
    }
  };

  const list = deliveries.data;
  return (
    <section className="card" aria-labelledby="webhook-title">
      <h2 id="webhook-title">Webhook</h2>
      <p>
        Forwarded to <code className="url">{run.webhookEndpoint}</code>
      </p>
      <p>
        <button type="button" onClick={redeliver} disabled={!final || redelivering} aria-describedby="redeliver-help">
          {redelivering ? "Redelivering…" : "Redeliver"}
        </button>{" "}
        <span id="redeliver-help" className="help">
          {final
            ? "Sends the run's result again; receivers should be idempotent."
            : "Possible once the run has finished."}
        </span>
      </p>
      {message && (
        <p className={`notice ${message.ok ? "ok" : "error"}`} role={message.ok ? "status" : "alert"}>
          {message.text}
        </p>
      )}
      {deliveries.error !== undefined && (
        <ErrorNotice error={deliveries.error} retry={deliveries.reload} what="the webhook deliveries" />
      )}
      {list === undefined ? (
        deliveries.error === undefined && <Loading what="webhook deliveries" />
      ) : list.length === 0 ? (
        <p className="muted">
          {final
            ? "No delivery recorded yet; it starts moments after the run finishes."
            : "The webhook is sent once the run finishes."}
        </p>
      ) : (
        list.map((d, i) => <Delivery key={d.deliveryId} d={d} n={i + 1} />)
      )}
    </section>
  );
}
