// The admin's start page: which project to look at.
import { dateOf, formatDate } from "./format.js";
import { Empty, ErrorNotice, Loading } from "./notices.js";
import { href, Link } from "./router.js";
import { useSession } from "./session-context.js";
import { useLoad } from "./use-load.js";

export function ProjectsPage() {
  const { client } = useSession();
  const projects = useLoad((signal) => client.listProjects({}, { signal }), []);
  return (
    <main className="page">
      <h1>Projects</h1>
      {projects.error !== undefined && (
        <ErrorNotice error={projects.error} retry={projects.reload} what="the projects" />
      )}
      {projects.data === undefined ? (
        projects.error === undefined && <Loading what="projects" />
      ) : projects.data.projects.length === 0 ? (
        <Empty title="There are no projects yet.">
          <p>
            Create one with the admin token:{" "}
            <code>
              curl -X POST -H "Authorization: Bearer $TOKEN" {location.origin}/v2/projects -d {'\'{"name": "prod"}\''}
            </code>
          </p>
        </Empty>
      ) : (
        <ul className="project-list">
          {projects.data.projects.map((p) => (
            <li key={p.projectId}>
              <Link href={href("projects", p.projectId, "runs")}>{p.name || p.projectId}</Link>{" "}
              <code>{p.projectId}</code>
              <span className="muted"> created {formatDate(dateOf(p.createdAt))}</span>
            </li>
          ))}
        </ul>
      )}
    </main>
  );
}
