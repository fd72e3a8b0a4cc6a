// A thread holding one connection to the history's SQLite file (started by
// sqlite-thread.ts through bin/thread.js): it runs each message's steps in
// the order they came and answers with their results or SQLite's error.
import { parentPort, workerData } from "node:worker_threads";
import { SqliteSession, type SqliteOptions, type Step } from "./sqlite-session.js";
import type { Reply } from "./sqlite-thread.js";

const port = parentPort!;
const { file, ...options } = workerData as SqliteOptions & { file: string };
const failure = (err: unknown): Reply["error"] => ({
  message: String((err as Error)?.message ?? err),
  code: (err as { code?: unknown })?.code ? String((err as { code: unknown }).code) : undefined,
});
const post = (reply: Reply) => port.postMessage(reply);

let session: SqliteSession | undefined;
try {
  session = new SqliteSession(file, options);
} catch (err) {
  post({ id: 0, error: failure(err) });
}
if (session !== undefined) {
  const db = session;
  port.on("message", (m: { id: number; steps?: Step[]; tx?: boolean; close?: true }) => {
    try {
      if (m.close) {
        db.close();
        post({ id: m.id, results: [] });
      } else post({ id: m.id, results: db.run(m.steps ?? [], m.tx === true) });
    } catch (err) {
      post({ id: m.id, error: failure(err) });
    }
  });
  post({ id: 0, results: [] });
}
