// The embedded database on a thread of its own: PGlite (PostgreSQL compiled
// to WebAssembly) runs every statement on the thread that holds it, and the
// projector's batches cost the process's main thread about a fifth of its
// time under load (the REST answers, auth and NATS all share that thread).
// Here PGlite lives in a worker thread; statements and their rows cross a
// MessagePort (structured clone). PGlite runs one statement at a time
// anyway, so queries keep the order they were sent in.
import { Worker } from "node:worker_threads";

interface PgliteThread {
  query<R>(text: string, params?: unknown[]): Promise<R[]>;
  close(): Promise<void>;
}

interface Reply {
  id: number;
  rows?: unknown[];
  /** A failed statement: its message and the fields PostgreSQL sets (code, detail, ...). */
  error?: Record<string, unknown> & { message: string };
}

// Plain JavaScript, evaluated: the thread needs no TypeScript loader (tests run without one).
const SOURCE = `
const { parentPort, workerData } = require("node:worker_threads");
const failure = (err) => {
  const fields = {};
  for (const key of ["code", "detail", "hint", "position", "severity", "schema", "table", "column", "constraint"])
    if (err && err[key] !== undefined) fields[key] = String(err[key]);
  return { ...fields, message: String((err && err.message) || err) };
};
import(workerData.module).then(async ({ PGlite }) => {
  const db = await PGlite.create(workerData.dir, workerData.options);
  parentPort.on("message", (m) => {
    if (m.close) {
      db.close().then(() => parentPort.postMessage({ id: m.id, rows: [] }), (err) => parentPort.postMessage({ id: m.id, error: failure(err) }));
      return;
    }
    db.query(m.text, m.params).then(
      (r) => parentPort.postMessage({ id: m.id, rows: r.rows }),
      (err) => parentPort.postMessage({ id: m.id, error: failure(err) }),
    );
  });
  parentPort.postMessage({ id: 0, rows: [] });
}).catch((err) => parentPort.postMessage({ id: 0, error: failure(err) }));
`;

/** Opens the PGlite database in `dir` (which must exist) on a worker thread; resolves once it answers. */
export async function startPgliteThread(dir: string, options: Record<string, unknown>): Promise<PgliteThread> {
  const worker = new Worker(SOURCE, {
    eval: true,
    workerData: { module: import.meta.resolve("@electric-sql/pglite"), dir, options },
  });
  const pending = new Map<number, { resolve(rows: unknown[]): void; reject(err: Error): void }>();
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
    else p.resolve(reply.rows ?? []);
  });
  worker.on("error", (err) => stop(err));
  worker.on("exit", (code) => stop(new Error(`the run history's database thread stopped (exit code ${code})`)));

  const send = (message: { text?: string; params?: unknown[]; close?: true }): Promise<unknown[]> => {
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
    query: <R>(text: string, params?: unknown[]) => send({ text, params }) as Promise<R[]>,
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
