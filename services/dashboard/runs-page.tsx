// Runs of one app or of every app of the project (?app=-), newest first and
// live, with the async and status filters kept in the URL
// (?app=…&async=1&status=failure).
import { useEffect, useId, useState, type ReactNode } from "react";
import type { Run } from "../../gen/skiff/management/v2/management_pb.js";
import { AsyncBadge, OutcomeBadge, StatusBadge } from "./badges.js";
import { dateOf, formatDuration, formatTime } from "./format.js";
import { Empty, ErrorNotice, Loading } from "./notices.js";
import { href, Link, navigate, redirect, type Location } from "./router.js";
import { isFinal, RUN_STATUSES } from "../runs/status.js";
import { useSession } from "./session-context.js";
import { ALL_APPS, useLiveRuns, POLL_MS, type Liveness, type RunFilter } from "./use-live-runs.js";
import { useLoad } from "./use-load.js";

const WEBHOOK_REFRESH_MS = 3000;

function runsHref(project: string, app: string, filter: RunFilter): string {
  const q = new URLSearchParams({ app });
  if (filter.asyncOnly) q.set("async", "1");
  if (filter.status) q.set("status", filter.status);
  return `${href("projects", project, "runs")}?${q}`;
}

function LiveIndicator({ liveness }: { liveness: Liveness }) {
  if (liveness.mode === "polling") {
    return (
      <p className="live polling" role="status">
        Live updates are unavailable ({liveness.reason}); refreshing every {POLL_MS / 1000} s instead.
      </p>
    );
  }
  return (
    <p className={`live ${liveness.mode}`} role="status">
      <span className="dot" aria-hidden="true" /> {liveness.mode === "stream" ? "Live" : "Connecting…"}
    </p>
  );
}

/**
 * What became of the run's webhook. A listed run does not carry its
 * deliveries, so a finished run with a webhook asks for them, once when they
 * have ended, again every few seconds while one is pending.
 */
function Webhook({ project, run }: { project: string; run: Run }) {
  const { client } = useSession();
  const final = isFinal(run.status);
  const [pending, setPending] = useState(true);
  const asked = run.webhookEndpoint !== "" && final && run.webhookDeliveries.length === 0;
  const deliveries = useLoad(
    async (signal) => {
      if (!asked) return run.webhookDeliveries;
      const res = await client.listWebhookDeliveries(
        { projectId: project, appName: run.appName, runId: run.runId },
        { signal },
      );
      setPending(res.deliveries.length === 0 || res.deliveries.some((d) => d.state === "pending"));
      return res.deliveries;
    },
    [project, run.appName, run.runId, asked],
    { refreshMs: asked && pending ? WEBHOOK_REFRESH_MS : undefined },
  );
  if (!run.webhookEndpoint) return <span className="muted">none</span>;
  let host = run.webhookEndpoint;
  try {
    host = new URL(run.webhookEndpoint).host;
  } catch {
    // shown as it is
  }
  const last = deliveries.data?.at(-1);
  const state = !final ? (
    <span className="muted">after the run</span>
  ) : last ? (
    <OutcomeBadge outcome={last.state} />
  ) : deliveries.error !== undefined ? (
    <span className="muted">unknown</span>
  ) : (
    <span className="muted">not yet sent</span>
  );
  return (
    <span className="webhook-cell" title={run.webhookEndpoint}>
      {state} <span className="muted">{host}</span>
    </span>
  );
}

/** A path with a line break allowed after each "/", so a long one wraps at its segments. */
function breakable(path: string): ReactNode[] {
  return path.split("/").flatMap((part, i) => (i === 0 ? [part] : [<wbr key={i} />, `/${part}`]));
}

function RunRow({ project, run, showApp }: { project: string; run: Run; showApp: boolean }) {
  const final = isFinal(run.status);
  return (
    <tr className={run.status === "failure" ? "row-failure" : undefined}>
      <td data-label="Run" className="wraps">
        <Link href={href("projects", project, "apps", run.appName, "runs", run.runId)} className="mono">
          {run.runId}
        </Link>
      </td>
      {showApp && (
        <td data-label="App" className="wraps">
          {run.appName}
        </td>
      )}
      <td className="mono wraps" data-label="Function">
        {breakable(run.path)}
      </td>
      <td data-label="Mode">{run.async ? <AsyncBadge /> : <span className="muted">sync</span>}</td>
      <td data-label="Status">
        <StatusBadge status={run.status} code={run.statusCode} />
      </td>
      <td data-label="Queued">{formatTime(dateOf(run.queuedAt))}</td>
      <td className="num" data-label="Run time">
        {final && run.startedAt ? formatDuration(run.runTimeMs) : "—"}
      </td>
      <td data-label="Webhook" className="wraps">
        <Webhook project={project} run={run} />
      </td>
    </tr>
  );
}

function RunTable({
  project,
  app,
  example,
  filter,
}: {
  project: string;
  app: string;
  /** The app the empty page's example calls. */
  example: string;
  filter: RunFilter;
}) {
  const { client } = useSession();
  const live = useLiveRuns(client, project, app, filter);
  const filtered = filter.asyncOnly || filter.status !== "";
  const all = app === ALL_APPS;
  return (
    <>
      <LiveIndicator liveness={live.liveness} />
      {live.error !== undefined && <ErrorNotice error={live.error} what="the runs" />}
      {live.loading && live.runs.length === 0 ? (
        <Loading what="runs" />
      ) : live.runs.length === 0 ? (
        live.error === undefined &&
        (filtered ? (
          <Empty title="No runs match these filters.">
            <p>
              <Link href={runsHref(project, app, { asyncOnly: false, status: "" })}>
                Show every run of {all ? "every app" : app}
              </Link>
            </p>
          </Empty>
        ) : (
          <Empty title={all ? `No app of ${project} has run yet.` : `${app} has not run yet.`}>
            <p>
              Call it, and its runs appear here as they happen:{" "}
              <code>
                curl -X POST -H "Authorization: Bearer $TOKEN" "{location.origin}/v4/{project}/{example}/run?async=true"
                -d '{"{}"}'
              </code>
            </p>
          </Empty>
        ))
      ) : (
        <div className="table-wrap">
          <table className="runs stack">
            <caption className="sr-only">Runs of {all ? `every app of ${project}` : app}, newest first</caption>
            <thead>
              <tr>
                <th scope="col">Run</th>
                {all && <th scope="col">App</th>}
                <th scope="col">Function</th>
                <th scope="col">Mode</th>
                <th scope="col">Status</th>
                <th scope="col">Queued</th>
                <th scope="col">Run time</th>
                <th scope="col">Webhook</th>
              </tr>
            </thead>
            <tbody>
              {live.runs.map((r) => (
                <RunRow key={r.runId} project={project} run={r} showApp={all} />
              ))}
            </tbody>
          </table>
        </div>
      )}
      {live.loadOlder && (
        <button type="button" onClick={live.loadOlder} disabled={live.loadingOlder}>
          {live.loadingOlder ? "Loading…" : "Load older runs"}
        </button>
      )}
    </>
  );
}

export function RunsPage({ project, loc }: { project: string; loc: Location }) {
  const query = loc.query;
  const { client } = useSession();
  const ids = { app: useId(), async: useId(), status: useId() };
  const apps = useLoad((signal) => client.listApps({ projectId: project }, { signal }), [project]);
  const names = apps.data?.apps.map((a) => a.appName) ?? [];
  const app = query.get("app") ?? "";
  const filter: RunFilter = { asyncOnly: query.get("async") === "1", status: query.get("status") ?? "" };

  // Without an app in the URL: every app when there are several, else the one.
  useEffect(() => {
    if (!app && names.length > 0) redirect(loc, runsHref(project, names.length > 1 ? ALL_APPS : names[0], filter));
  });

  return (
    <main className="page">
      <h1>Runs</h1>
      {apps.error !== undefined && <ErrorNotice error={apps.error} retry={apps.reload} what="the apps" />}
      {apps.data === undefined ? (
        apps.error === undefined && <Loading what="apps" />
      ) : names.length === 0 ? (
        <Empty title={`Project ${project} has no apps yet.`}>
          <p>
            Deploy one, then call it: <code>npx skiff deploy examples/hello-python --project {project}</code>
          </p>
        </Empty>
      ) : (
        <>
          <form className="filters" onSubmit={(e) => e.preventDefault()}>
            <span>
              <label htmlFor={ids.app}>App</label>
              <select id={ids.app} value={app} onChange={(e) => navigate(runsHref(project, e.target.value, filter))}>
                {app !== ALL_APPS && !names.includes(app) && <option value={app}>{app || "Choose an app"}</option>}
                <option value={ALL_APPS}>All apps</option>
                {names.map((n) => (
                  <option key={n} value={n}>
                    {n}
                  </option>
                ))}
              </select>
            </span>
            <span>
              <input
                id={ids.async}
                type="checkbox"
                checked={filter.asyncOnly}
                onChange={(e) => navigate(runsHref(project, app, { ...filter, asyncOnly: e.target.checked }))}
              />
              <label htmlFor={ids.async}>Async runs only</label>
            </span>
            <span>
              <label htmlFor={ids.status}>Status</label>
              <select
                id={ids.status}
                value={filter.status}
                onChange={(e) => navigate(runsHref(project, app, { ...filter, status: e.target.value }))}
              >
                <option value="">Any status</option>
                {RUN_STATUSES.map((s) => (
                  <option key={s} value={s}>
                    {s}
                  </option>
                ))}
              </select>
            </span>
          </form>
          {app && (
            <RunTable
              key={`${project}/${app}`}
              project={project}
              app={app}
              example={app === ALL_APPS ? names[0] : app}
              filter={filter}
            />
          )}
        </>
      )}
    </main>
  );
}
