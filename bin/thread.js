// A worker thread of the server's: runs the TypeScript entry that
// workerData.entry names (a key of THREAD_ENTRIES) from its bundle, as
// bin/skiff-server.js runs the server (bin/bundle.js), so a thread starts as
// fast as the process does.
import { workerData } from "node:worker_threads";
import { runBundled, THREAD_ENTRIES } from "./bundle.js";

const entry = THREAD_ENTRIES[workerData.entry];
if (entry === undefined) throw new Error(`bin/thread.js: no thread entry "${workerData.entry}"`);
await runBundled(entry.source, entry.name);
