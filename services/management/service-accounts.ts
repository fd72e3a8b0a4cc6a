// The service account methods of ManagementService (spec sections 2, 4.1, 5).
// A service account yields one token, returned by CreateServiceAccount only:
// the token is neither stored nor logged.
import { Code, ConnectError, type ServiceImpl } from "@connectrpc/connect";
import type { ManagementService } from "../../gen/skiff/management/v2/management_pb.js";
import { newServiceAccountId, type ServiceAccountRecord, actorOf, principalOf } from "../auth/index.js";
import { audit } from "./audit.js";
import { serviceAccountMessage } from "./convert.js";
import type { ManagementDeps } from "./deps.js";
import * as valid from "./validation.js";

type Impl = ServiceImpl<typeof ManagementService>;

export function serviceAccountHandlers(
  deps: ManagementDeps,
): Pick<Impl, "createServiceAccount" | "listServiceAccounts" | "getServiceAccount" | "deleteServiceAccount"> {
  /** The project must exist before anything is done in it. */
  async function project(id: string): Promise<string> {
    const projectId = valid.projectId(id);
    if (!(await deps.projects.get(projectId))) throw new ConnectError(`project ${projectId} not found`, Code.NotFound);
    return projectId;
  }

  return {
    async createServiceAccount(req, ctx) {
      const p = principalOf(ctx);
      const name = valid.name(req.name, "name", true);
      const expiresAt = valid.expiry(req.expiresAt);
      // A leaked token must not be able to outlive itself by minting a longer-lived one.
      if (p.kind === "service_account" && expiresAt > p.expiresAt) {
        throw new ConnectError(
          `a service account token can only create service accounts that expire no later than itself (${p.expiresAt.toISOString()})`,
          Code.PermissionDenied,
        );
      }
      const projectId = await project(req.projectId);
      const record: ServiceAccountRecord = {
        service_account_id: newServiceAccountId(),
        project_id: projectId,
        name,
        created_at: new Date().toISOString(),
        expires_at: expiresAt.toISOString(),
        created_by: actorOf(p),
      };
      if (!(await deps.serviceAccounts.create(record)))
        throw new ConnectError("service account id collision; try again", Code.Aborted);
      const token = await deps.issueToken({ projectId, serviceAccountId: record.service_account_id, expiresAt });
      audit(deps.logger, p, "service_account.create", `${projectId}/${record.service_account_id}`, {
        name,
        expires_at: record.expires_at,
      });
      return { serviceAccount: serviceAccountMessage(record), token };
    },

    async listServiceAccounts(req) {
      const projectId = await project(req.projectId);
      return { serviceAccounts: (await deps.serviceAccounts.list(projectId)).map(serviceAccountMessage) };
    },

    async getServiceAccount(req) {
      const projectId = await project(req.projectId);
      const record = await deps.serviceAccounts.get(projectId, valid.serviceAccountIdOrNotFound(req.serviceAccountId));
      if (!record)
        throw new ConnectError(
          `service account ${req.serviceAccountId} not found in project ${projectId}`,
          Code.NotFound,
        );
      return { serviceAccount: serviceAccountMessage(record) };
    },

    async deleteServiceAccount(req, ctx) {
      const p = principalOf(ctx);
      const projectId = await project(req.projectId);
      const id = valid.serviceAccountIdOrNotFound(req.serviceAccountId);
      if (!(await deps.serviceAccounts.delete(projectId, id)))
        throw new ConnectError(`service account ${id} not found in project ${projectId}`, Code.NotFound);
      audit(deps.logger, p, "service_account.delete", `${projectId}/${id}`);
      return {};
    },
  };
}
