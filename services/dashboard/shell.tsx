// The frame of every signed-in page: the project, the sections, who is
// signed in; and the page the URL names.
import { useEffect, useId } from "react";
import { AppsPage } from "./apps-page.js";
import { KeysPage } from "./keys-page.js";
import { ProjectsPage } from "./projects-page.js";
import { href, Link, match, navigate, useLocation } from "./router.js";
import { RunPage } from "./run-page.js";
import { RunsPage } from "./runs-page.js";
import { useSession } from "./session-context.js";
import { formatDate, dateOf } from "./format.js";
import { useLoad } from "./use-load.js";

const SECTIONS = [
  { id: "runs", label: "Runs" },
  { id: "apps", label: "Apps" },
  { id: "keys", label: "API Keys" },
] as const;

function ProjectPicker({ project, section }: { project: string | undefined; section: string }) {
  const { client, identity } = useSession();
  const id = useId();
  const projects = useLoad((signal) => client.listProjects({}, { signal }), []);
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
  const { identity } = useSession();
  const loc = useLocation();
  const inProject =
    match("/projects/:project/:section", loc.path) ?? match("/projects/:project/apps/:app/runs/:run", loc.path);
  const project = inProject?.project;
  const section = inProject?.section ?? "runs";
  const home = identity.kind === "admin" ? "/projects" : href("projects", identity.projectId, "runs");

  useEffect(() => {
    if (loc.path === "/" || (loc.path === "/projects" && identity.kind !== "admin")) navigate(home, { replace: true });
  }, [loc.path, home, identity.kind]);

  let page;
  let params;
  if ((params = match("/projects/:project/runs", loc.path)))
    page = <RunsPage project={params.project} query={loc.query} />;
  else if ((params = match("/projects/:project/apps/:app/runs/:run", loc.path)))
    page = <RunPage project={params.project} app={params.app} runId={params.run} />;
  else if ((params = match("/projects/:project/apps", loc.path))) page = <AppsPage project={params.project} />;
  else if ((params = match("/projects/:project/keys", loc.path))) page = <KeysPage project={params.project} />;
  else if (loc.path === "/projects" && identity.kind === "admin") page = <ProjectsPage />;
  else if (loc.path === "/" || loc.path === "/projects") page = null;
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
        <ProjectPicker project={project} section={SECTIONS.some((s) => s.id === section) ? section : "runs"} />
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
