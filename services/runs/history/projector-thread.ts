// The run history's projector on a worker thread of its own, with a NATS
// connection of its own: it reads every run event of the cluster (a message
// parsed, a header decoded, a row made and written per event), which on the
// thread that answers requests took about 13% of a sync call's CPU there
// (bench/README.md). The thread (projector-entry.ts) reports what it applied
// and its log lines here; one that dies is started again.
import type { Worker } from "node:worker_threads";
import type { Logger } from "../../config/index.js";
import type { NatsDial } from "../../nats/index.js";
import type { ProjectorOptions, ProjectorState } from "./projector.js";
import { startThread } from "./threads.js";

/** How long a stop lets the thread finish the batch it writes before it is ended. */
const STOP_MS = 10_000;
const DEFAULT_RESTART_MS = 2_000;

/** What the thread is given (plain data). */
export interface ProjectorThreadData {
  dial: NatsDial;
  /** SKIFF_DATABASE_URL; undefined: SQLite in `sqliteDir`. */
  databaseUrl: string | undefined;
  schema: string;
  sqliteDir: string;
  options: Pick<ProjectorOptions, "batchSize" | "batchMs" | "leaderRetryMs">;
  logLevel: string;
}

/** What the thread says. */
export type ThreadMessage =
  { started: true } | { failed: { message: string } } | { state: ProjectorState } | { log: string } | { stopped: true };

export class ProjectorThread implements ProjectorState {
  /** Stream messages applied by the projector since this process started it (over its thread's restarts). */
  applied = 0;
  leading = false;
  /** What threads that ended had applied. */
  private before = 0;
  private worker: Worker | undefined;
  private restart: NodeJS.Timeout | undefined;
  private stopping: Promise<void> | undefined;
  private onStopped: (() => void) | undefined;

  constructor(
    private readonly data: Omit<ProjectorThreadData, "logLevel">,
    private readonly logger: Logger,
  ) {
    this.start();
  }

  private start(): void {
    const logLevel = this.logger.isLevelEnabled("debug")
      ? "debug"
      : this.logger.isLevelEnabled("info")
        ? "info"
        : "warn";
    const worker = startThread("projector", { ...this.data, logLevel });
    this.worker = worker;
    worker.on("message", (m: ThreadMessage) => this.heard(m));
    worker.on("error", (err) => this.logger.error({ err }, "run history: the projector's thread failed"));
    worker.on("exit", (code) => {
      if (this.worker !== worker) return;
      this.worker = undefined;
      this.leading = false;
      this.before = this.applied;
      if (this.stopping !== undefined) return this.onStopped?.();
      this.logger.warn({ code }, "run history: the projector's thread ended; starting it again");
      this.restart = setTimeout(() => this.start(), this.data.options.leaderRetryMs ?? DEFAULT_RESTART_MS);
    });
  }

  private heard(m: ThreadMessage): void {
    if ("state" in m) {
      this.applied = this.before + m.state.applied;
      this.leading = m.state.leading;
    } else if ("log" in m) this.log(m.log);
    else if ("failed" in m) {
      this.logger.error({ error: m.failed.message }, `run history: the projector cannot start: ${m.failed.message}`);
      void this.worker?.terminate();
    } else if ("stopped" in m) void this.worker?.terminate();
  }

  /** A pino line of the thread's, written by this process's logger. */
  private log(line: string): void {
    let entry: Record<string, unknown>;
    try {
      entry = JSON.parse(line) as Record<string, unknown>;
    } catch {
      return;
    }
    const { level, msg, time, ...fields } = entry;
    void time;
    const label = this.logger.levels.labels[level as number] as "debug" | "info" | "warn" | "error" | undefined;
    if (label !== undefined && typeof this.logger[label] === "function") this.logger[label](fields, String(msg ?? ""));
  }

  /** Stops the projector (the batch it writes is finished, up to STOP_MS) and its thread. */
  stop(): Promise<void> {
    this.stopping ??= (async () => {
      clearTimeout(this.restart);
      const worker = this.worker;
      if (worker === undefined) return;
      const exited = new Promise<void>((resolve) => (this.onStopped = resolve));
      worker.postMessage({ stop: true });
      const timer = setTimeout(() => void worker.terminate(), STOP_MS);
      await exited;
      clearTimeout(timer);
    })();
    return this.stopping;
  }
}
