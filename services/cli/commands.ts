// The CLI's commands: each parses its own arguments, calls ManagementService
// through the generated Connect client, and prints a table or JSON.
import { toJson, type DescMessage, type MessageShape } from "@bufbuild/protobuf";
import { timestampDate, timestampFromDate, type Timestamp } from "@bufbuild/protobuf/wkt";
import type { Client, Transport } from "@connectrpc/connect";
import {
  CreateProjectResponseSchema,
  CreateServiceAccountResponseSchema,
  DeleteProjectResponseSchema,
  ListProjectsResponseSchema,
  ListServiceAccountsResponseSchema,
  type ManagementService,
  type ServiceAccount,
} from "../../gen/skiff/management/v2/management_pb.js";
import { exampleExpiry, PROJECT_ID } from "../auth/account-rules.js";
import { table } from "./table.js";

export class UsageError extends Error {
  override name = "UsageError";
}

export interface CommandContext {
  client: Client<typeof ManagementService>;
  /** The connection to skiff, sending the token; for clients of other services. */
  transport: Transport;
  /** Options and positionals after the command's two words. */
  options: Record<string, string | boolean | undefined>;
  positionals: string[];
  json: boolean;
  /** Server and token, for the commands that talk HTTP themselves (deploy). */
  target: { url: string; token: string };
  out: (text: string) => void;
  err: (text: string) => void;
}

export interface Command {
  /** Options it accepts besides the global ones. */
  options: string[];
  /** Most positionals it takes. */
  positionals: number;
  run(ctx: CommandContext): Promise<void>;
}

export const DEFAULT_PROJECT = "p-dev";
export const DEFAULT_EXPIRES_IN = "90d";

const UNITS: Record<string, number> = { m: 60_000, h: 3_600_000, d: 86_400_000 };

/** "90d", "12h", "30m", or an RFC 3339 time for --expires-at. */
function parseExpiry(expiresIn: string | undefined, expiresAt: string | undefined, now = Date.now()): Timestamp {
  if (expiresIn !== undefined && expiresAt !== undefined)
    throw new UsageError("give --expires-in or --expires-at, not both");
  if (expiresAt !== undefined) {
    const ms = Date.parse(expiresAt);
    if (Number.isNaN(ms))
      throw new UsageError(`--expires-at: expected an RFC 3339 time like ${exampleExpiry()}, got "${expiresAt}"`);
    return timestampFromDate(new Date(ms));
  }
  const m = /^(\d+)([mhd])$/.exec(expiresIn ?? DEFAULT_EXPIRES_IN);
  if (!m) throw new UsageError(`--expires-in: expected a number and a unit (m, h or d) like 90d, got "${expiresIn}"`);
  return timestampFromDate(new Date(now + Number(m[1]) * UNITS[m[2]]));
}

function print<D extends DescMessage>(
  ctx: CommandContext,
  schema: D,
  message: MessageShape<D>,
  human: () => string,
): void {
  ctx.out(ctx.json ? JSON.stringify(toJson(schema, message, { useProtoFieldName: true }), null, 2) : human());
}

const time = (t: Timestamp | undefined) => (t ? timestampDate(t).toISOString() : "");
/** The project of a command: --project, SKIFF_PROJECT, a service account token's own project, else p-dev. */
export const projectOf = (ctx: CommandContext) =>
  (ctx.options.project as string | undefined) ??
  (process.env.SKIFF_PROJECT || undefined) ??
  tokenProject(ctx.target.token) ??
  DEFAULT_PROJECT;

/**
 * The `project_id` claim of a service account token (a JWT), read without checking it: only a default for
 * --project, which the server checks as it checks every call. Undefined for an admin token or anything else.
 */
export function tokenProject(token: string): string | undefined {
  const parts = token.split(".");
  if (parts.length !== 3) return undefined;
  try {
    const claims = JSON.parse(Buffer.from(parts[1], "base64url").toString("utf8")) as { project_id?: unknown };
    return typeof claims.project_id === "string" && PROJECT_ID.test(claims.project_id) ? claims.project_id : undefined;
  } catch {
    return undefined;
  }
}

const accountRows = (accounts: ServiceAccount[]) =>
  accounts.map((a) => [a.serviceAccountId, a.name, time(a.createdAt), time(a.expiresAt)]);
const ACCOUNT_HEADERS = ["id", "name", "created", "expires"];

export const COMMANDS: Record<string, Record<string, Command>> = {
  projects: {
    list: {
      options: [],
      positionals: 0,
      async run(ctx) {
        const res = await ctx.client.listProjects({});
        print(ctx, ListProjectsResponseSchema, res, () =>
          table(
            ["id", "name", "created"],
            res.projects.map((p) => [p.projectId, p.name, time(p.createdAt)]),
          ),
        );
      },
    },
    create: {
      options: ["name"],
      positionals: 1,
      async run(ctx) {
        const res = await ctx.client.createProject({
          projectId: ctx.positionals[0] ?? "",
          name: (ctx.options.name as string | undefined) ?? "",
        });
        const p = res.project!;
        print(ctx, CreateProjectResponseSchema, res, () =>
          table(["id", "name", "created"], [[p.projectId, p.name, time(p.createdAt)]]),
        );
      },
    },
    delete: {
      options: [],
      positionals: 1,
      async run(ctx) {
        const id = ctx.positionals[0];
        if (id === undefined) throw new UsageError("projects delete needs an id: skiff projects delete <project-id>");
        const res = await ctx.client.deleteProject({ projectId: id });
        print(
          ctx,
          DeleteProjectResponseSchema,
          res,
          () =>
            `deleted project ${id} with ${res.appsDeleted} apps, ${res.serviceAccountsDeleted} service accounts and ${res.secretsDeleted} secrets; its persistent storage goes once its replicas stop`,
        );
      },
    },
  },
  "service-accounts": {
    list: {
      options: ["project"],
      positionals: 0,
      async run(ctx) {
        const res = await ctx.client.listServiceAccounts({ projectId: projectOf(ctx) });
        print(ctx, ListServiceAccountsResponseSchema, res, () =>
          table(ACCOUNT_HEADERS, accountRows(res.serviceAccounts)),
        );
      },
    },
    create: {
      options: ["project", "expires-in", "expires-at"],
      positionals: 1,
      async run(ctx) {
        const name = ctx.positionals[0];
        if (name === undefined)
          throw new UsageError("service-accounts create needs a name: skiff service-accounts create <name>");
        const expiresAt = parseExpiry(
          ctx.options["expires-in"] as string | undefined,
          ctx.options["expires-at"] as string | undefined,
        );
        const res = await ctx.client.createServiceAccount({ projectId: projectOf(ctx), name, expiresAt });
        print(
          ctx,
          CreateServiceAccountResponseSchema,
          res,
          () => `${table(ACCOUNT_HEADERS, accountRows([res.serviceAccount!]))}\n\ntoken: ${res.token}`,
        );
        if (!ctx.json) ctx.err("The token is shown only this once: store it as a secret now.");
      },
    },
    delete: {
      options: ["project"],
      positionals: 1,
      async run(ctx) {
        const id = ctx.positionals[0];
        if (id === undefined)
          throw new UsageError(
            "service-accounts delete needs an id: skiff service-accounts delete <service-account-id>",
          );
        await ctx.client.deleteServiceAccount({ projectId: projectOf(ctx), serviceAccountId: id });
        ctx.out(
          ctx.json ? "{}" : `deleted service account ${id} of project ${projectOf(ctx)}; its token no longer works`,
        );
      },
    },
  },
};
