// The project secret methods of ManagementService. A value goes in through
// SetSecret and never comes out: answers, errors and audit lines name the
// secret only. Any token of the project may manage them, as it may its apps
// and service accounts.
import { Code, ConnectError, type ServiceImpl } from "@connectrpc/connect";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { ManagementService } from "../../gen/skiff/management/v2/management_pb.js";
import { principalOf } from "../auth/index.js";
import {
  secretNameProblem,
  secretValueProblem,
  SecretsStoreFull,
  TooManySecrets,
  type SecretInfo,
} from "../secrets/index.js";
import { audit } from "./audit.js";
import type { ManagementDeps } from "./deps.js";
import * as valid from "./validation.js";

type Impl = ServiceImpl<typeof ManagementService>;

function secretMessage(s: SecretInfo) {
  return {
    name: s.name,
    createdAt: timestampFromDate(new Date(s.created_at)),
    updatedAt: timestampFromDate(new Date(s.updated_at)),
  };
}

function secretName(name: string): string {
  const problem = secretNameProblem(name);
  if (problem)
    throw new ConnectError(`name ${problem}, got ${JSON.stringify(name.slice(0, 80))}`, Code.InvalidArgument);
  return name;
}

export function secretHandlers(deps: ManagementDeps): Pick<Impl, "setSecret" | "listSecrets" | "deleteSecret"> {
  async function project(id: string): Promise<string> {
    const projectId = valid.projectId(id);
    if (!(await deps.projects.get(projectId))) throw new ConnectError(`project ${projectId} not found`, Code.NotFound);
    return projectId;
  }

  return {
    async setSecret(req, ctx) {
      const p = principalOf(ctx);
      const name = secretName(req.name);
      const problem = secretValueProblem(req.value);
      // The value itself is never part of an error.
      if (problem) throw new ConnectError(`value ${problem}`, Code.InvalidArgument);
      const projectId = await project(req.projectId);
      try {
        const { secret, created } = await deps.secrets.set(projectId, name, req.value);
        audit(deps.logger, p, created ? "secret.create" : "secret.update", `${projectId}/${name}`);
        return { secret: secretMessage(secret), created };
      } catch (err) {
        if (err instanceof TooManySecrets) throw new ConnectError(err.message, Code.ResourceExhausted);
        if (err instanceof SecretsStoreFull) throw new ConnectError(err.message, Code.Unavailable);
        throw err;
      }
    },

    async listSecrets(req) {
      const projectId = await project(req.projectId);
      return { secrets: (await deps.secrets.list(projectId)).map(secretMessage) };
    },

    async deleteSecret(req, ctx) {
      const p = principalOf(ctx);
      const projectId = await project(req.projectId);
      // A name that cannot be a secret names none: 404, like any unknown name.
      if (secretNameProblem(req.name) || !(await deps.secrets.delete(projectId, req.name)))
        throw new ConnectError(
          `secret ${JSON.stringify(req.name.slice(0, 80))} not found in project ${projectId}`,
          Code.NotFound,
        );
      audit(deps.logger, p, "secret.delete", `${projectId}/${req.name}`);
      return {};
    },
  };
}
