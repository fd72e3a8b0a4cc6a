// `npm run cluster`'s run history database on the shared PostgreSQL: one per
// cluster folder, so two clusters never share a run history, and one that
// another folder owns is refused.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { claimClusterDatabase, ClusterDatabaseError, clusterDatabaseName } from "../../scripts/cluster-database.js";

describe("cluster database", () => {
  let admin: pg.Client;
  const made: string[] = [];
  const dirs: string[] = [];
  const folder = () => {
    const dir = mkdtempSync(path.join(tmpdir(), "skiff-cluster-"));
    dirs.push(dir);
    return dir;
  };

  beforeAll(async () => {
    admin = new pg.Client({ host: "127.0.0.1", port: 5432, user: "postgres", database: "postgres" });
    await admin.connect();
  });
  afterAll(async () => {
    for (const name of made) await admin.query(`DROP DATABASE IF EXISTS ${name}`);
    await admin?.end();
    for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
  });

  it("two cluster folders get two databases; a folder gets the same one again", async () => {
    const [a, b] = [folder(), folder()];
    const first = await claimClusterDatabase(admin, a);
    made.push(first);
    const second = await claimClusterDatabase(admin, b);
    made.push(second);
    expect(first).not.toBe(second);
    expect(first).toMatch(/^skiff_cluster_[0-9a-f]{16}$/);
    expect(await claimClusterDatabase(admin, a)).toBe(first);
    const listed = await admin.query("SELECT datname FROM pg_database WHERE datname = ANY($1)", [[first, second]]);
    expect(listed.rowCount).toBe(2);
    // What the gateways are given is a database they can use.
    const client = new pg.Client({ host: "127.0.0.1", port: 5432, user: "postgres", database: first });
    await client.connect();
    expect((await client.query("SELECT 1 AS one")).rows).toEqual([{ one: 1 }]);
    await client.end();
  });

  it("refuses a database of its name that another owner marked", async () => {
    const dir = folder();
    const name = clusterDatabaseName(dir);
    await admin.query(`CREATE DATABASE ${name}`);
    made.push(name);
    await admin.query(`COMMENT ON DATABASE ${name} IS 'skiff cluster /somewhere/else'`);
    const claim = claimClusterDatabase(admin, dir);
    await expect(claim).rejects.toThrow(ClusterDatabaseError);
    await expect(claim).rejects.toThrow(/belongs to skiff cluster \/somewhere\/else.*SKIFF_CLUSTER_DIR/);
  });
});
