// The projector's thread (started by projector-thread.ts through
// bin/thread.js): a NATS connection of its own, the history's writer, and the
// RunProjector following the run events. It reports its state and its log
// lines to the thread that started it, and stops when asked.
import { parentPort, workerData } from "node:worker_threads";
import { pino } from "pino";
import { dialNats } from "../../nats/index.js";
import { openPostgresHistory } from "./postgres.js";
import { RunProjector } from "./projector.js";
import type { ProjectorThreadData, ThreadMessage } from "./projector-thread.js";
import { openSqliteWriter } from "./sqlite.js";

const port = parentPort!;
const data = workerData as ProjectorThreadData;
const post = (m: ThreadMessage) => port.postMessage(m);
// Log lines go to the process's logger, which writes them (projector-thread.ts).
const logger = pino({ level: data.logLevel, base: undefined }, { write: (line: string) => post({ log: line }) });

try {
  const nc = await dialNats(data.dial);
  const backend =
    data.databaseUrl === undefined
      ? await openSqliteWriter(data.sqliteDir)
      : await openPostgresHistory(data.databaseUrl, data.schema, logger);
  const projector = new RunProjector({
    ...data.options,
    nc,
    backend,
    logger,
    onState: ({ applied, leading }) => post({ state: { applied, leading } }),
  });
  port.on("message", (m: { stop?: true }) => {
    if (!m?.stop) return;
    void (async () => {
      await projector.stop();
      await backend
        .close()
        .catch((err: unknown) => logger.warn({ err }, "run history: cannot close the projector's database connection"));
      await nc.close().catch(() => undefined);
      post({ stopped: true });
    })();
  });
  post({ started: true });
} catch (err) {
  post({ failed: { message: (err as Error)?.message ?? String(err) } });
}
