// One connection to the embedded history's SQLite file (better-sqlite3),
// which runs every statement synchronously on the thread that holds it. The
// process's reads and deletes each have one on a thread of their own
// (sqlite-thread.ts, sqlite-entry.ts), so that neither stalls the thread that
// answers requests; the projector's thread writes through one it holds itself.
import { createRequire } from "node:module";

/** One statement of a message: `params` runs it once, `many` once per parameter list. */
export interface Step {
  sql: string;
  params?: unknown[];
  many?: unknown[][];
  /** "all": its rows; "run": how many rows it changed (summed over `many`). */
  mode: "all" | "run";
}

export interface SqliteOptions {
  /** PRAGMA settings of the connection, run first (`journal_mode = WAL`, ...). */
  pragmas: string[];
  /** Statements run once the connection is open (the schema). */
  setup: string[];
}

/** The part of better-sqlite3 used here (it ships no types). */
interface Statement {
  all(...params: unknown[]): unknown[];
  run(...params: unknown[]): { changes: number };
}
interface Database {
  pragma(source: string): unknown;
  exec(source: string): void;
  prepare(source: string): Statement;
  transaction<A extends unknown[], R>(fn: (...args: A) => R): { immediate(...args: A): R };
  close(): void;
}

const load = createRequire(import.meta.url);

export class SqliteSession {
  private readonly db: Database;
  private readonly statements = new Map<string, Statement>();
  private readonly inTransaction: { immediate(steps: Step[]): unknown[] };

  /** Opens `file` (made when missing) and sets it up; throws SQLite's error. */
  constructor(file: string, options: SqliteOptions) {
    const Driver = load("better-sqlite3") as new (file: string) => Database;
    this.db = new Driver(file);
    try {
      for (const p of options.pragmas) this.db.pragma(p);
      for (const sql of options.setup) this.db.exec(sql);
    } catch (err) {
      this.db.close();
      throw err;
    }
    this.inTransaction = this.db.transaction((steps: Step[]) => steps.map((s) => this.step(s)));
  }

  /** Runs the steps, in one transaction when `tx` (all or nothing); each step's result. */
  run(steps: Step[], tx: boolean): unknown[] {
    return tx ? this.inTransaction.immediate(steps) : steps.map((s) => this.step(s));
  }

  close(): void {
    this.db.close();
  }

  private step(s: Step): unknown {
    let st = this.statements.get(s.sql);
    if (st === undefined) this.statements.set(s.sql, (st = this.db.prepare(s.sql)));
    if (s.mode === "all") return st.all(...(s.params ?? []));
    if (s.many) {
      let n = 0;
      for (const p of s.many) n += st.run(...p).changes;
      return n;
    }
    return st.run(...(s.params ?? [])).changes;
  }
}
