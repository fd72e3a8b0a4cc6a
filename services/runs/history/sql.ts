// The two databases the run history can live in, behind one small interface:
// embedded PGlite (PostgreSQL compiled to WebAssembly, its files in a folder)
// when no server is configured, and a PostgreSQL server through `pg` when
// several processes share one. Both speak the same SQL; the rest of the
// history never knows which it has.
// Each driver is loaded when a database of its kind is opened, not with the module.
import { access, cp, mkdir, mkdtemp, readFile, rename, rm } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Worker } from "node:worker_threads";
import { startPgliteThread } from "./pglite-thread.js";

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

/** The embedded database's buffer pool, in its memory for good. */
const PGLITE_SHARED_BUFFERS = "16MB";

/** PostgreSQL embedded in this process (on a worker thread), its files in `dir`. One process per folder. */
export async function openPglite(dir: string, signal?: AbortSignal): Promise<Database> {
  const exists = await access(path.join(dir, "PG_VERSION")).then(
    () => true,
    () => false,
  );
  if (!exists) await initPglite(dir, signal);
  signal?.throwIfAborted();
  // On a thread of its own (pglite-thread.ts), off the thread that answers requests. A smaller buffer pool than
  // PostgreSQL's default 128 MB: listing reads a few pages, and the rest is the operating system's file cache.
  const db = await startPgliteThread(dir, { postgresqlconf: [`shared_buffers = ${PGLITE_SHARED_BUFFERS}`] });
  const query = <R>(text: string, params?: unknown[]) => db.query<R>(text, params);
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

/**
 * Makes a new database folder, beside `dir` and renamed into place once
 * complete, so a process stopped meanwhile (`signal`) leaves no half-made
 * database behind. Its files are a copy of a template made once per PGlite
 * version (`pgliteTemplate`): making one from nothing (initdb) costs several
 * seconds of CPU and several hundred MB, on every fresh data folder.
 */
async function initPglite(dir: string, signal?: AbortSignal): Promise<void> {
  await mkdir(path.dirname(dir), { recursive: true });
  const template = await pgliteTemplate(signal);
  const scratch = await mkdtemp(`${dir}.new-`);
  try {
    if (template === undefined) await makePglite(scratch, signal);
    else await cp(template, scratch, { recursive: true, force: true });
    signal?.throwIfAborted();
    await rename(scratch, dir);
  } finally {
    await rm(scratch, { recursive: true, force: true });
  }
}

/** Runs initdb in `dir` on a worker thread: its memory goes with the worker instead of staying in the process. */
async function makePglite(dir: string, signal?: AbortSignal): Promise<void> {
  const source = `
    const { workerData } = require("node:worker_threads");
    import(workerData.module).then(async ({ PGlite }) => (await PGlite.create(workerData.dir)).close());`;
  await new Promise<void>((resolve, reject) => {
    const worker = new Worker(source, {
      eval: true,
      workerData: { module: import.meta.resolve("@electric-sql/pglite"), dir },
    });
    const abort = () => void worker.terminate();
    signal?.addEventListener("abort", abort, { once: true });
    worker.once("error", reject);
    worker.once("exit", (code) => {
      signal?.removeEventListener("abort", abort);
      if (signal?.aborted) reject(signal.reason);
      else if (code === 0) resolve();
      else reject(new Error(`creating a run history database in ${dir} failed (${code})`));
    });
  });
}

/**
 * The folder of an empty database as initdb leaves it, for this PGlite
 * version: in `node_modules/.cache/skiff/` beside the installed package (as
 * trusted as the code beside it; never a shared temporary folder), made the
 * first time it is needed, by whichever process gets there first (each makes
 * its own and renames it into place). Undefined where it cannot be kept (a
 * read-only install): each database is then made from nothing.
 */
async function pgliteTemplate(signal?: AbortSignal): Promise<string | undefined> {
  try {
    const entry = fileURLToPath(import.meta.resolve("@electric-sql/pglite"));
    const marker = `${path.sep}node_modules${path.sep}@electric-sql${path.sep}pglite${path.sep}`;
    const at = entry.lastIndexOf(marker);
    if (at < 0) return undefined;
    const pkg = entry.slice(0, at + marker.length);
    const { version } = JSON.parse(await readFile(path.join(pkg, "package.json"), "utf8")) as { version: string };
    const cache = path.join(entry.slice(0, at), "node_modules", ".cache", "skiff");
    const template = path.join(cache, `run-history-pglite-${version}`);
    const ready = () =>
      access(path.join(template, "PG_VERSION")).then(
        () => true,
        () => false,
      );
    if (await ready()) return template;
    await mkdir(cache, { recursive: true });
    const scratch = await mkdtemp(`${template}.new-`);
    try {
      await makePglite(scratch, signal);
      await rename(scratch, template).catch(async (err: NodeJS.ErrnoException) => {
        if (!(await ready())) throw err; // another process put its own in place first: that one serves
      });
    } finally {
      await rm(scratch, { recursive: true, force: true });
    }
    return template;
  } catch {
    signal?.throwIfAborted();
    return undefined;
  }
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
    kind: "postgres",
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
