// Audit lines: one JSON log line per change to projects, service accounts, apps and secrets,
// marked `audit: true` so they can be filtered out of the stream. They say
// who, what, on which target and when; never a token nor a secret's value.
import { actorOf, type Principal } from "../auth/index.js";
import type { Logger } from "../config/index.js";

type AuditAction =
  | "project.create"
  | "project.delete"
  | "service_account.create"
  | "service_account.delete"
  | "service_account.renew"
  | "app.deploy"
  | "app.delete"
  | "secret.create"
  | "secret.update"
  | "secret.delete";

export function audit(
  logger: Logger,
  who: Principal | "bootstrap",
  action: AuditAction,
  target: string,
  details: Record<string, unknown> = {},
): void {
  const actor = who === "bootstrap" ? "bootstrap" : actorOf(who);
  logger.info(
    { audit: true, actor, action, target, at: new Date().toISOString(), ...details },
    `audit: ${actor} ${action} ${target}`,
  );
}
