// A connection to the embedded history's SQLite file on a thread of its own.
// better-sqlite3 runs every statement synchronously on the thread that holds
// the connection: a batch of the projector's upserts takes milliseconds of
// CPU, and an hour of an app's statistics more, which must not stall the
// thread that answers requests. Statements and their rows cross a MessagePort
// (structured clone); the thread runs them one message at a time, in the
// order they were sent.
import { createRequire } from "node:module";
import { Worker } from "node:worker_threads";

/** One statement of a message: `params` runs it once, `many` once per parameter list. */
export interface Step {
  sql: string;
  params?: unknown[];
  many?: unknown[][];
  /** "all": its rows; "run": how many rows it changed (summed over `many`). */
  mode: "all" | "run";
}

export interface SqliteThread {
  /** Runs the steps, in one transaction when `tx` (all or nothing); resolves with each step's result. */
  run(steps: Step[], tx?: boolean): Promise<unknown[]>;
  close(): Promise<void>;
}

interface Reply {
  id: number;
  results?: unknown[];
  /** A failed statement: its message and SQLite's code. */
  error?: { message: string; code?: string };
}

// Plain JavaScript, evaluated: the thread needs no TypeScript loader (tests run without one).
const SOURCE = `
const { parentPort, workerData } = require("node:worker_threads");
const Database = require(workerData.module);
const failure = (err) => ({ message: String((err && err.message) || err), code: err && err.code ? String(err.code) : undefined });
const open = () => {
  const db = new Database(workerData.file);
  for (const p of workerData.pragmas) db.pragma(p);
  for (const sql of workerData.setup) db.exec(sql);
  return db;
};
let db;
try {
  db = open();
} catch (err) {
  parentPort.postMessage({ id: 0, error: failure(err) });
}
if (db !== undefined) {
const statements = new Map();
const prepared = (sql) => {
  let s = statements.get(sql);
  if (s === undefined) statements.set(sql, (s = db.prepare(sql)));
  return s;
};
const step = (s) => {
  const st = prepared(s.sql);
  if (s.mode === "all") return st.all(...(s.params || []));
  if (s.many) {
    let n = 0;
    for (const p of s.many) n += st.run(...p).changes;
    return n;
  }
  return st.run(...(s.params || [])).changes;
};
const steps = (list) => list.map(step);
const inTransaction = db.transaction(steps);
parentPort.on("message", (m) => {
  if (m.close) {
    try {
      db.close();
      parentPort.postMessage({ id: m.id, results: [] });
    } catch (err) {
      parentPort.postMessage({ id: m.id, error: failure(err) });
    }
    return;
  }
  try {
    parentPort.postMessage({ id: m.id, results: m.tx ? inTransaction.immediate(m.steps) : steps(m.steps) });
  } catch (err) {
    parentPort.postMessage({ id: m.id, error: failure(err) });
  }
});
parentPort.postMessage({ id: 0, results: [] });
}
`;

export interface SqliteThreadOptions {
  /** PRAGMA settings of the connection, run first (`journal_mode = WAL`, ...). */
  pragmas: string[];
  /** Statements run once the connection is open (the schema). */
  setup: string[];
}

/** Opens the SQLite file `file` on a worker thread; resolves once it is open and set up. */
export async function startSqliteThread(file: string, options: SqliteThreadOptions): Promise<SqliteThread> {
  const worker = new Worker(SOURCE, {
    eval: true,
    workerData: { module: createRequire(import.meta.url).resolve("better-sqlite3"), file, ...options },
  });
  const pending = new Map<number, { resolve(results: unknown[]): void; reject(err: Error): void }>();
  let next = 1;
  let stopped: Error | undefined;
  const stop = (err: Error) => {
    stopped ??= err;
    for (const p of pending.values()) p.reject(stopped);
    pending.clear();
  };
  const ready = new Promise<void>((resolve, reject) => pending.set(0, { resolve: () => resolve(), reject }));
  worker.on("message", (reply: Reply) => {
    const p = pending.get(reply.id);
    if (p === undefined) return;
    pending.delete(reply.id);
    if (reply.error) p.reject(Object.assign(new Error(reply.error.message), reply.error));
    else p.resolve(reply.results ?? []);
  });
  worker.on("error", (err) => stop(err));
  worker.on("exit", (code) => stop(new Error(`the run history's database thread stopped (exit code ${code})`)));

  const send = (message: { steps?: Step[]; tx?: boolean; close?: true }): Promise<unknown[]> => {
    if (stopped) return Promise.reject(stopped);
    const id = next++;
    return new Promise((resolve, reject) => {
      pending.set(id, { resolve, reject });
      worker.postMessage({ id, ...message });
    });
  };
  try {
    await ready;
  } catch (err) {
    await worker.terminate();
    throw err;
  }
  let closing: Promise<void> | undefined;
  return {
    run: (steps, tx = false) => send({ steps, tx }),
    close() {
      closing ??= send({ close: true }).then(
        async () => void (await worker.terminate()),
        async (err: unknown) => {
          await worker.terminate();
          if (!stopped || err !== stopped) throw err;
        },
      );
      return closing;
    },
  };
}
