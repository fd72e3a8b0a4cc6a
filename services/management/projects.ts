// GetIdentity and the project methods of ManagementService.
import { Code, ConnectError, type ServiceImpl } from "@connectrpc/connect";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { ManagementService } from "../../gen/skiff/management/v2/management_pb.js";
import { newProjectId, actorOf, principalOf } from "../auth/index.js";
import { audit } from "./audit.js";
import { projectMessage } from "./convert.js";
import type { ManagementDeps } from "./deps.js";
import * as valid from "./validation.js";

type Impl = ServiceImpl<typeof ManagementService>;

export function projectHandlers(
  deps: ManagementDeps,
): Pick<Impl, "getIdentity" | "createProject" | "listProjects" | "getProject" | "deleteProject"> {
  return {
    getIdentity(_req, ctx) {
      const p = principalOf(ctx);
      if (p.kind === "admin") return { kind: "admin" };
      return {
        kind: "service_account",
        projectId: p.projectId,
        serviceAccountId: p.serviceAccountId,
        expiresAt: timestampFromDate(p.expiresAt),
      };
    },

    async createProject(req, ctx) {
      const p = principalOf(ctx);
      if (p.kind !== "admin") throw new ConnectError("only the admin token can create projects", Code.PermissionDenied);
      const projectId = req.projectId === "" ? newProjectId() : valid.projectId(req.projectId);
      const name = valid.name(req.name, "name", false);
      const record = {
        project_id: projectId,
        name: name === "" ? projectId : name,
        created_at: new Date().toISOString(),
        created_by: actorOf(p),
      };
      if (!(await deps.projects.create(record)))
        throw new ConnectError(`project ${projectId} already exists`, Code.AlreadyExists);
      audit(deps.logger, p, "project.create", projectId);
      return { project: projectMessage(record) };
    },

    async listProjects(_req, ctx) {
      const p = principalOf(ctx);
      if (p.kind === "admin") return { projects: (await deps.projects.list()).map(projectMessage) };
      const own = await deps.projects.get(p.projectId);
      return { projects: own ? [projectMessage(own)] : [] };
    },

    /**
     * The project's record goes first, so that no deploy, service account or
     * secret can be made in it any more; then everything it held, swept twice
     * for what a call that passed its project check just before may have
     * added. Runners follow the projects' bucket and remove the project's
     * persistent storage once its replicas have stopped.
     */
    async deleteProject(req, ctx) {
      const p = principalOf(ctx);
      if (p.kind !== "admin") throw new ConnectError("only the admin token can delete projects", Code.PermissionDenied);
      const projectId = valid.projectId(req.projectId);
      if (!(await deps.projects.delete(projectId)))
        throw new ConnectError(`project ${projectId} not found`, Code.NotFound);
      const counts = { appsDeleted: 0, serviceAccountsDeleted: 0, secretsDeleted: 0 };
      for (let pass = 0; pass < 2; pass++) {
        for (const app of await deps.apps.store.list(projectId))
          if (await deps.apps.store.delete(projectId, app.app_name)) counts.appsDeleted++;
        for (const sa of await deps.serviceAccounts.list(projectId))
          if (await deps.serviceAccounts.delete(projectId, sa.service_account_id)) counts.serviceAccountsDeleted++;
        for (const secret of await deps.secrets.list(projectId))
          if (await deps.secrets.delete(projectId, secret.name)) counts.secretsDeleted++;
      }
      audit(deps.logger, p, "project.delete", projectId, {
        apps: counts.appsDeleted,
        service_accounts: counts.serviceAccountsDeleted,
        secrets: counts.secretsDeleted,
      });
      return counts;
    },

    async getProject(req) {
      const project = await deps.projects.get(valid.projectId(req.projectId));
      if (!project) throw new ConnectError(`project ${req.projectId} not found`, Code.NotFound);
      return { project: projectMessage(project) };
    },
  };
}
