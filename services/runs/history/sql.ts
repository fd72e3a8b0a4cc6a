// The two databases the run history can live in, behind one small interface:
// embedded PGlite (PostgreSQL compiled to WebAssembly, its files in a folder)
// when no server is configured, and a PostgreSQL server through `pg` when
// several processes share one. Both speak the same SQL; the rest of the
// history never knows which it has.
// Each driver is loaded when a database of its kind is opened, not with the module.
import { mkdir } from "node:fs/promises";

/** Something that runs one SQL statement with $n parameters. */
export interface Sql {
  query<R = Record<string, unknown>>(text: string, params?: unknown[]): Promise<R[]>;
}

/**
 * A connection of its own, for what must stay on one session (advisory
 * locks). `release(broken)` hands it back; broken ones are closed.
 */
export interface Session extends Sql {
  release(broken?: boolean): void;
}

export interface Database extends Sql {
  readonly kind: "pglite" | "postgres";
  session(): Promise<Session>;
  close(): Promise<void>;
}

/** PostgreSQL embedded in this process, its files in `dir`. One process per folder. */
export async function openPglite(dir: string): Promise<Database> {
  await mkdir(dir, { recursive: true });
  const { PGlite } = await import("@electric-sql/pglite");
  const db = await PGlite.create(dir);
  const query = async <R>(text: string, params?: unknown[]) => (await db.query<R>(text, params)).rows;
  return {
    kind: "pglite",
    query,
    // One connection is all PGlite has: every session is it, and its locks are held as long as it is open.
    async session() {
      return { query, release() {} };
    },
    close: () => db.close(),
  };
}

/** How many connections one process opens to a PostgreSQL server at most. */
export const POOL_SIZE = 4;

/** A PostgreSQL server, shared by every process that names the same URL. */
export async function openPostgres(url: string): Promise<Database> {
  const { default: pg } = await import("pg");
  const pool = new pg.Pool({ connectionString: url, max: POOL_SIZE, idleTimeoutMillis: 30_000 });
  // A connection that breaks while idle must not bring the process down; the next query opens another.
  pool.on("error", () => undefined);
  const client = await pool.connect(); // fails here, at start, when the server cannot be reached
  client.release();
  return {
    kind: "postgres",
    async query<R>(text: string, params?: unknown[]) {
      return (await pool.query(text, params)).rows as R[];
    },
    async session() {
      const c = await pool.connect();
      c.on("error", () => undefined);
      return {
        async query<R>(text: string, params?: unknown[]) {
          return (await c.query(text, params)).rows as R[];
        },
        release: (broken = false) => c.release(broken),
      };
    },
    close: () => pool.end(),
  };
}
