// The run history's worker threads: each runs a TypeScript entry of this
// folder from its bundle through bin/thread.js (THREAD_ENTRIES names them),
// as the server itself runs, so a thread starts as fast as the process does.
import path from "node:path";
import { Worker } from "node:worker_threads";

const THREAD_JS = path.join(import.meta.dirname, "..", "..", "..", "bin", "thread.js");

/** Starts the thread of `entry` (sqlite-entry.ts, projector-entry.ts) with `data` as its workerData (plain data). */
export function startThread(entry: "sqlite" | "projector", data: object): Worker {
  return new Worker(THREAD_JS, { workerData: { entry, ...data } });
}
