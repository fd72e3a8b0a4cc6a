// Deployed apps: runtime, deployment, live replicas, scaling, and the last
// hour's runs and latency.
import type { App } from "../../gen/skiff/management/v2/management_pb.js";
import { LatencyChart, RunsChart } from "./charts.js";
import { dateOf, formatBytes, formatRelative, formatTime } from "./format.js";
import { Empty, ErrorNotice, Loading } from "./notices.js";
import { href, Link } from "./router.js";
import { useSession } from "./session-context.js";
import { useLoad } from "./use-load.js";

/** Replicas come and go within seconds; the list follows them this closely. */
export const APPS_REFRESH_MS = 3000;
const STATS_REFRESH_MS = 15_000;

function Runtime({ app }: { app: App }) {
  const r = app.runtime;
  if (!r) return <span className="muted">unknown</span>;
  if (r.kind === "cortex") {
    return (
      <>
        Cortex, {r.language} <span className="muted">(entry</span> <code>{r.entry}</code>
        <span className="muted">)</span>
      </>
    );
  }
  return (
    <>
      Custom <code>{r.command.join(" ")}</code>
      {r.healthcheck && <span className="muted"> health {r.healthcheck}</span>}
    </>
  );
}

function Replicas({ app }: { app: App }) {
  if (app.replicas.length === 0) {
    return (
      <p className="muted">
        No replicas running. {app.scaling?.minReplicas ? "" : "They start on the first call (min_replicas is 0)."}
      </p>
    );
  }
  return (
    <div className="table-scroll">
      <table className="replicas stack">
        <caption className="sr-only">Replicas of {app.appName}</caption>
        <thead>
          <tr>
            <th scope="col">Replica</th>
            <th scope="col">State</th>
            <th scope="col">In flight</th>
            <th scope="col">Version</th>
            <th scope="col">Host</th>
            <th scope="col">Started</th>
          </tr>
        </thead>
        <tbody>
          {app.replicas.map((r) => (
            <tr key={r.replicaId}>
              <td className="mono" data-label="Replica">
                {r.replicaId}
              </td>
              <td data-label="State">
                <span className={`badge replica-${r.state}`}>{r.state}</span>
              </td>
              <td className="num" data-label="In flight">
                {r.inFlight}
              </td>
              <td className="num" data-label="Version">
                {r.deploymentVersion}
              </td>
              <td data-label="Host">{r.host}</td>
              <td data-label="Started">{formatRelative(dateOf(r.startedAt))}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

function Stats({ project, app }: { project: string; app: string }) {
  const { client } = useSession();
  const stats = useLoad(
    (signal) => client.getAppStats({ projectId: project, appName: app }, { signal }),
    [project, app],
    { refreshMs: STATS_REFRESH_MS },
  );
  if (stats.data === undefined)
    return stats.error !== undefined ? (
      <ErrorNotice error={stats.error} retry={stats.reload} what={`the statistics of ${app}`} />
    ) : (
      <Loading what="statistics" />
    );
  const buckets = stats.data.buckets;
  if (buckets.length === 0) return <p className="muted">No statistics for the last hour.</p>;
  return (
    <div className="charts">
      <RunsChart buckets={buckets} title="Runs per minute" />
      <LatencyChart buckets={buckets} title="Run time percentiles" />
    </div>
  );
}

function AppCard({ project, app }: { project: string; app: App }) {
  const d = app.deployment;
  const s = app.scaling;
  return (
    <article className="card app" aria-labelledby={`app-${app.appName}`}>
      <header>
        <h2 id={`app-${app.appName}`}>{app.appName}</h2>
        <Link href={`${href("projects", project, "runs")}?${new URLSearchParams({ app: app.appName })}`}>
          Runs of {app.appName} →
        </Link>
      </header>
      <dl className="facts">
        <dt>Runtime</dt>
        <dd>
          <Runtime app={app} />
        </dd>
        <dt>Deployment</dt>
        <dd>
          {d ? (
            <>
              version <strong>{d.version}</strong>{" "}
              <span className="muted">
                deployed {formatTime(dateOf(d.createdAt))} by {d.createdBy}, {formatBytes(d.bundleBytes)}, sha256{" "}
              </span>
              <code title={d.digest}>{d.digest.slice(0, 12)}</code>
            </>
          ) : (
            "—"
          )}
        </dd>
        <dt>Scaling</dt>
        <dd>
          {s ? (
            <>
              {s.minReplicas}–{s.maxReplicas} replicas, {s.replicaConcurrency} request
              {s.replicaConcurrency === 1 ? "" : "s"} at once each, cooldown {s.cooldown} s, response grace period{" "}
              {s.responseGracePeriod} s
            </>
          ) : (
            "—"
          )}
        </dd>
        {app.envNames.length > 0 && (
          <>
            <dt>Environment</dt>
            <dd>{app.envNames.join(", ")}</dd>
          </>
        )}
      </dl>
      <h3>Replicas ({app.replicas.length})</h3>
      <Replicas app={app} />
      <h3>Last hour</h3>
      <Stats project={project} app={app.appName} />
    </article>
  );
}

export function AppsPage({ project }: { project: string }) {
  const { client } = useSession();
  const apps = useLoad((signal) => client.listApps({ projectId: project }, { signal }), [project], {
    refreshMs: APPS_REFRESH_MS,
  });
  const list = apps.data?.apps;
  return (
    <main className="page">
      <h1>Apps</h1>
      {apps.error !== undefined && <ErrorNotice error={apps.error} retry={apps.reload} what="the apps" />}
      {list === undefined ? (
        apps.error === undefined && <Loading what="apps" />
      ) : list.length === 0 ? (
        <Empty title={`Project ${project} has no apps yet.`}>
          <p>
            Deploy one from a folder with a <code>skiff.toml</code> or a <code>cerebrium.toml</code>:{" "}
            <code>npx skiff deploy examples/hello-python --project {project}</code>
          </p>
        </Empty>
      ) : (
        list.map((a) => <AppCard key={a.appName} project={project} app={a} />)
      )}
    </main>
  );
}
