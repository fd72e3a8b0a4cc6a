// A connection to the embedded history's SQLite file on a thread of its own
// (sqlite-entry.ts). better-sqlite3 runs every statement synchronously on the
// thread that holds the connection: a batch of upserts takes milliseconds of
// CPU, and an hour of an app's statistics more, which must not stall the
// thread that answers requests. Statements and their rows cross a MessagePort
// (structured clone); the thread runs them one message at a time, in the
// order they were sent. `sqliteHere` is the same connection held by the
// calling thread, for a thread that is itself not the one answering requests
// (the projector's).
import { SqliteSession, type SqliteOptions, type Step } from "./sqlite-session.js";
import { startThread } from "./threads.js";

export type { SqliteOptions, Step } from "./sqlite-session.js";

export interface SqliteThread {
  /** Runs the steps, in one transaction when `tx` (all or nothing); resolves with each step's result. */
  run(steps: Step[], tx?: boolean): Promise<unknown[]>;
  close(): Promise<void>;
}

/** What the thread answers to message `id` (0: its start). */
export interface Reply {
  id: number;
  results?: unknown[];
  /** A failed statement: its message and SQLite's code. */
  error?: { message: string; code?: string };
}

/** Opens the SQLite file `file` on a worker thread; resolves once it is open and set up. */
export async function startSqliteThread(file: string, options: SqliteOptions): Promise<SqliteThread> {
  const worker = startThread("sqlite", { file, ...options });
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

/** The same connection on the calling thread: each run blocks it for as long as its statements take. */
export function sqliteHere(file: string, options: SqliteOptions): SqliteThread {
  const session = new SqliteSession(file, options);
  let closed = false;
  return {
    run: async (steps, tx = false) => session.run(steps, tx),
    async close() {
      if (!closed) session.close();
      closed = true;
    },
  };
}
