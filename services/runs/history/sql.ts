// The PostgreSQL server the run history can live in (SKIFF_DATABASE_URL), through
// `pg`: a pool of connections, and sessions of their own for what must stay
// on one connection (advisory locks). The driver is loaded when a database is
// opened, not with the module.
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
  session(): Promise<Session>;
  close(): Promise<void>;
}

/** How many connections one process opens to a PostgreSQL server at most. */
const POOL_SIZE = 4;

/** A PostgreSQL server, shared by every process that names the same URL. */
export async function openPostgres(url: string): Promise<Database> {
  const { default: pg } = await import("pg");
  const pool = new pg.Pool({ connectionString: url, max: POOL_SIZE, idleTimeoutMillis: 30_000 });
  // A connection that breaks (idle or checked out) must not bring the process down; the next query opens another.
  // One listener per connection, when it is made: a session reuses pooled connections.
  pool.on("error", () => undefined);
  pool.on("connect", (c) => c.on("error", () => undefined));
  const client = await pool.connect(); // fails here, at start, when the server cannot be reached
  client.release();
  return {
    async query<R>(text: string, params?: unknown[]) {
      return (await pool.query(text, params)).rows as R[];
    },
    async session() {
      const c = await pool.connect();
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
