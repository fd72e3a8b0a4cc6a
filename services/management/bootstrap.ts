// First-start set-up of the management role, idempotent and safe when several
// processes start at once:
//
//   - the admin token: SKIFF_ADMIN_TOKEN, else `<data>/admin-token` (0600),
//     made once; its SHA-256 goes to KV so every process accepts it;
//   - project `p-dev` and service account `sa-dev` ("dev") with a 30-day
//     expiry, renewed when fewer than 7 days are left; a token for it in
//     `<data>/dev-token` (0600).
//
// The files hold the only copies of the tokens; logs name the files, never
// their content.
import { randomBytes } from "node:crypto";
import { link, mkdir, readFile, rename, unlink, writeFile } from "node:fs/promises";
import path from "node:path";
import { newAdminToken, type AdminTokens, type ServiceAccountRecord, type Authenticator } from "../auth/index.js";
import type { Logger } from "../config/index.js";
import { audit } from "./audit.js";
import type { ManagementDeps } from "./deps.js";

export const DEV_PROJECT_ID = "p-dev";
const DEV_SERVICE_ACCOUNT_ID = "sa-dev";
const DAY_MS = 24 * 60 * 60 * 1000;
const DEV_TOKEN_LIFETIME_MS = 30 * DAY_MS;
const DEV_TOKEN_RENEW_BEFORE_MS = 7 * DAY_MS;

export const adminTokenFile = (dataDir: string): string => path.join(dataDir, "admin-token");
export const devTokenFile = (dataDir: string): string => path.join(dataDir, "dev-token");

async function readToken(file: string): Promise<string | undefined> {
  try {
    const token = (await readFile(file, "utf8")).trim();
    return token === "" ? undefined : token;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw err;
  }
}

const tempName = (file: string) => `${file}.${randomBytes(6).toString("hex")}.tmp`;

/** Writes the file only if it does not exist yet, whole or not at all; false when it existed. */
async function createFile(file: string, content: string): Promise<boolean> {
  const tmp = tempName(file);
  await writeFile(tmp, content + "\n", { mode: 0o600 });
  try {
    await link(tmp, file);
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "EEXIST") return false;
    throw err;
  } finally {
    await unlink(tmp);
  }
}

/** Replaces the file in one step, so a reader never sees half a token. */
async function replaceFile(file: string, content: string): Promise<void> {
  const tmp = tempName(file);
  await writeFile(tmp, content + "\n", { mode: 0o600 });
  await rename(tmp, file);
}

interface AdminTokenOptions {
  dataDir: string;
  /** SKIFF_ADMIN_TOKEN. */
  configured: string | undefined;
  admins: AdminTokens;
}

/** Returns the file holding the admin token, or undefined when it comes from SKIFF_ADMIN_TOKEN. */
export async function ensureAdminToken(opts: AdminTokenOptions): Promise<string | undefined> {
  if (opts.configured !== undefined) {
    await opts.admins.register(opts.configured, "SKIFF_ADMIN_TOKEN");
    return undefined;
  }
  await mkdir(opts.dataDir, { recursive: true, mode: 0o700 });
  const file = adminTokenFile(opts.dataDir);
  let token = await readToken(file);
  if (token === undefined && !(await createFile(file, (token = newAdminToken())))) {
    token = await readToken(file); // another process made it first
  }
  if (token === undefined) throw new Error(`${file} exists but is empty; delete it to have a new admin token made`);
  await opts.admins.register(token, "file");
  return file;
}

interface DevAccountOptions {
  dataDir: string;
  deps: ManagementDeps;
  authenticator: Authenticator;
  logger: Logger;
}

/** Ensures p-dev, sa-dev with more than 7 days left, and a dev-token file holding its token; returns the file. */
export async function ensureDevAccount(opts: DevAccountOptions): Promise<string> {
  const { deps, logger } = opts;
  await mkdir(opts.dataDir, { recursive: true, mode: 0o700 });
  const file = devTokenFile(opts.dataDir);
  const now = Date.now();
  if (
    await deps.projects.create({
      project_id: DEV_PROJECT_ID,
      name: "dev",
      created_at: new Date(now).toISOString(),
      created_by: "bootstrap",
    })
  ) {
    audit(logger, "bootstrap", "project.create", DEV_PROJECT_ID);
  }

  const record = await devRecord(deps, now, logger);
  // Keep the file while it holds a working token for the account as it is now.
  const current = await readToken(file);
  const principal = current === undefined ? undefined : await opts.authenticator.authenticate(current);
  if (
    principal?.kind === "service_account" &&
    principal.projectId === DEV_PROJECT_ID &&
    principal.serviceAccountId === DEV_SERVICE_ACCOUNT_ID &&
    principal.expiresAt.getTime() === Date.parse(record.expires_at)
  ) {
    return file;
  }
  const token = await deps.issueToken({
    projectId: DEV_PROJECT_ID,
    serviceAccountId: DEV_SERVICE_ACCOUNT_ID,
    expiresAt: new Date(record.expires_at),
  });
  await replaceFile(file, token);
  return file;
}

/** The dev account with more than 7 days left: found, made, or renewed (compare-and-set, so concurrent starts agree). */
async function devRecord(deps: ManagementDeps, now: number, logger: Logger): Promise<ServiceAccountRecord> {
  const expiresAt = new Date(Math.floor((now + DEV_TOKEN_LIFETIME_MS) / 1000) * 1000).toISOString();
  for (;;) {
    const found = await deps.serviceAccounts.entry(DEV_PROJECT_ID, DEV_SERVICE_ACCOUNT_ID);
    if (!found) {
      const record: ServiceAccountRecord = {
        service_account_id: DEV_SERVICE_ACCOUNT_ID,
        project_id: DEV_PROJECT_ID,
        name: "dev",
        created_at: new Date(now).toISOString(),
        expires_at: expiresAt,
        created_by: "bootstrap",
      };
      if (await deps.serviceAccounts.create(record)) {
        audit(logger, "bootstrap", "service_account.create", `${DEV_PROJECT_ID}/${DEV_SERVICE_ACCOUNT_ID}`, {
          expires_at: expiresAt,
        });
        return record;
      }
    } else if (Date.parse(found.record.expires_at) - now > DEV_TOKEN_RENEW_BEFORE_MS) {
      return found.record;
    } else {
      const renewed = { ...found.record, expires_at: expiresAt };
      if (await deps.serviceAccounts.update(renewed, found.revision)) {
        audit(logger, "bootstrap", "service_account.renew", `${DEV_PROJECT_ID}/${DEV_SERVICE_ACCOUNT_ID}`, {
          expires_at: expiresAt,
        });
        return renewed;
      }
    }
    // Lost a race with another process: look again.
  }
}
