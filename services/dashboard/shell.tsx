// The frame of every signed-in page: the project, the sections, who is
// signed in; and the page the URL names.
import { useEffect, useId } from "react";
import type { ListProjectsResponse } from "../../gen/skiff/management/v2/management_pb.js";
import { Loading } from "./notices.js";
import { AppsPage } from "./apps-page.js";
import { KeysPage } from "./keys-page.js";
import { ProjectsPage } from "./projects-page.js";
import { href, Link, match, navigate, redirect, useLocation } from "./router.js";
import { RunPage } from "./run-page.js";
import { RunsPage } from "./runs-page.js";
import { SecretsPage } from "./secrets-page.js";
import { useSession } from "./session-context.js";
import { formatDate, dateOf } from "./format.js";
import { useLoad, type Loaded } from "./use-load.js";

const SECTIONS = [
  { id: "runs", label: "Runs" },
  { id: "apps", label: "Apps" },
  { id: "keys", label: "API Keys" },
  { id: "secrets", label: "Secrets" },
] as const;

function ProjectPicker({
  project,
  section,
  projects,
}: {
  project: string | undefined;
  section: string;
  projects: Loaded<ListProjectsResponse | undefined>;
}) {
  const { identity } = useSession();
  const id = useId();
  if (identity.kind !== "admin") return <span className="project-name">Project {identity.projectId}</span>;
  return (
    <span className="project-picker">
      <label htmlFor={id}>Project</label>
      <select
        id={id}
        value={project ?? ""}
        onChange={(e) => e.target.value && navigate(href("projects", e.target.value, section))}
      >
        <option value="">{projects.loading ? "Loading…" : "Choose a project"}</option>
        {projects.data?.projects.map((p) => (
          <option key={p.projectId} value={p.projectId}>
            {p.name && p.name !== p.projectId ? `${p.name} (${p.projectId})` : p.projectId}
          </option>
        ))}
      </select>
    </span>
  );
}

function Who() {
  const { identity, signOut } = useSession();
  const who = identity.kind === "admin" ? "admin" : `service account ${identity.serviceAccountId}`;
  const until = identity.kind === "admin" ? "" : `, token expires ${formatDate(dateOf(identity.expiresAt))}`;
  return (
    <span className="who">
      <span>
        Signed in as {who}
        {until}
      </span>
      <button type="button" onClick={signOut}>
        Sign out
      </button>
    </span>
  );
}

function NotFound() {
  return (
    <main className="page">
      <h1>No such page</h1>
      <p>
        <Link href="/">Go to the start page</Link>
      </p>
    </main>
  );
}

export function Shell() {
  const { client, identity } = useSession();
  const loc = useLocation();
  const admin = identity.kind === "admin";
  // Only the admin chooses among projects; a service account has its own.
  const projects = useLoad(async (signal) => (admin ? await client.listProjects({}, { signal }) : undefined), [admin]);
  const inProject =
    match("/projects/:project/:section", loc.path) ?? match("/projects/:project/apps/:app/runs/:run", loc.path);
  const project = inProject?.project;
  const section = inProject?.section ?? "runs";
  // The start page: a service account's project; the admin's only project, or the list to choose from.
  const only = projects.data?.projects.length === 1 ? projects.data.projects[0].projectId : undefined;
  const home = admin ? "/" : href("projects", identity.projectId, "runs");
  const start = !admin ? home : only !== undefined ? href("projects", only, "runs") : "/projects";
  const decided = !admin || !projects.loading;

  useEffect(() => {
    if ((loc.path === "/" && decided) || (loc.path === "/projects" && !admin)) redirect(loc, start);
  }, [loc, start, decided, admin]);

  let page;
  let params;
  if ((params = match("/projects/:project/runs", loc.path))) page = <RunsPage project={params.project} loc={loc} />;
  else if ((params = match("/projects/:project/apps/:app/runs/:run", loc.path)))
    page = <RunPage project={params.project} app={params.app} runId={params.run} />;
  else if ((params = match("/projects/:project/apps", loc.path))) page = <AppsPage project={params.project} />;
  else if ((params = match("/projects/:project/keys", loc.path))) page = <KeysPage project={params.project} />;
  else if ((params = match("/projects/:project/secrets", loc.path))) page = <SecretsPage project={params.project} />;
  else if (loc.path === "/projects" && identity.kind === "admin") page = <ProjectsPage />;
  else if (loc.path === "/") page = <Loading what="your projects" />;
  else if (loc.path === "/projects") page = null;
  else page = <NotFound />;

  return (
    <>
      <a className="skip" href="#content">
        Skip to content
      </a>
      <header className="top">
        <Link href={home} className="brand">
          <span className="brand-mark" aria-hidden="true" /> skiff
        </Link>
        <ProjectPicker
          project={project}
          section={SECTIONS.some((s) => s.id === section) ? section : "runs"}
          projects={projects}
        />
        {project && (
          <nav aria-label="Sections">
            {SECTIONS.map((s) => (
              <Link
                key={s.id}
                href={href("projects", project, s.id)}
                aria-current={
                  section === s.id || (s.id === "runs" && !!match("/projects/:p/apps/:a/runs/:r", loc.path))
                    ? "page"
                    : undefined
                }
              >
                {s.label}
              </Link>
            ))}
          </nav>
        )}
        <Who />
      </header>
      <div id="content" tabIndex={-1}>
        {page}
      </div>
    </>
  );
}
