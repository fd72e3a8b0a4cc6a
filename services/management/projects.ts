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
): Pick<Impl, "getIdentity" | "createProject" | "listProjects" | "getProject"> {
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

    async getProject(req) {
      const project = await deps.projects.get(valid.projectId(req.projectId));
      if (!project) throw new ConnectError(`project ${req.projectId} not found`, Code.NotFound);
      return { project: projectMessage(project) };
    },
  };
}
