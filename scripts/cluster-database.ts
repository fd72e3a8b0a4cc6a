// The run history database of one `npm run cluster` folder on a shared
// PostgreSQL: its name is derived from the folder, so two clusters (two
// checkouts, two SKIFF_CLUSTER_DIRs) never share a run history, and the
// folder is written as the database's comment, so a database that another
// folder owns is refused rather than joined.
import { createHash } from "node:crypto";
import path from "node:path";
import type pg from "pg";

/** `skiff_cluster_` and 16 hex digits of the folder's SHA-256: a valid, lowercase PostgreSQL name. */
export function clusterDatabaseName(dir: string): string {
  return `skiff_cluster_${createHash("sha256").update(path.resolve(dir)).digest("hex").slice(0, 16)}`;
}

export class ClusterDatabaseError extends Error {
  override name = "ClusterDatabaseError";
}

/**
 * The database of the cluster in `dir`, made (and marked as its) if missing,
 * through `admin`, a client connected to the server's `postgres` database.
 */
export async function claimClusterDatabase(admin: pg.Client, dir: string): Promise<string> {
  const name = clusterDatabaseName(dir);
  const owner = path.resolve(dir);
  const found = await admin.query<{ owner: string | null }>(
    "SELECT shobj_description(oid, 'pg_database') AS owner FROM pg_database WHERE datname = $1",
    [name],
  );
  if (found.rowCount === 0) {
    await admin.query(`CREATE DATABASE ${name}`);
    await admin.query(`COMMENT ON DATABASE ${name} IS ${admin.escapeLiteral(`skiff cluster ${owner}`)}`);
    return name;
  }
  const comment = found.rows[0].owner;
  if (comment !== `skiff cluster ${owner}`)
    throw new ClusterDatabaseError(
      `database ${name} belongs to ${comment ?? "an unknown owner"}, not to the cluster in ${owner}: set SKIFF_DATABASE_URL or SKIFF_CLUSTER_DIR`,
    );
  return name;
}
