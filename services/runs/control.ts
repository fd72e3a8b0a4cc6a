// Cancelling a running run from any process. Every process that executes
// runs (a gateway dispatching in-process or waiting on a runner, a runner
// answering sync requests or working the async queue) tracks its runs here
// under a process id, which the run record names (`runner`). CancelRun asks
// that process on `skiff.control.cancel.{id}`: it aborts the run's request
// (the runner destroys the HTTP exchange with the replica, which keeps
// serving), waits until the run is recorded as cancelled, and answers. A
// gateway whose run is on a remote runner passes the abort on through the
// broadcast `skiff.control.abort`, heard by every runner.
import { randomBytes } from "node:crypto";
import { hostname } from "node:os";
import { ErrorCode, NatsError, type NatsConnection, type Subscription } from "nats";
import { subjects } from "../nats/index.js";

const ABORT_SUBJECT = subjects.control("abort");
export const cancelSubject = (processId: string): string => subjects.control(`cancel.${processId}`);
/** Which of some run ids a process holds (a JSON array asked, the held ones answered): see runs/stale-sync.ts. */
const holdsSubject = (processId: string): string => subjects.control(`holds.${processId}`);
/** How long a cancel waits for the run's final record after aborting it. */
const SETTLE_TIMEOUT_MS = 10_000;

type CancelAnswer = "aborted" | "unknown" | "gone";

/** What a cancel aborts: the run's AbortController, or a REST call's own (HttpExchange.abort). */
interface Abortable {
  abort(reason?: unknown): void;
}

interface InFlight {
  controller: Abortable;
  done: Promise<void>;
}

const encoder = new TextEncoder();

export class RunControl {
  /** Names this process in run records; subject-token safe. */
  readonly id = `${hostname()
    .replace(/[^A-Za-z0-9-]/g, "-")
    .slice(0, 40)}-${process.pid}-${randomBytes(3).toString("hex")}`;
  private readonly runs = new Map<string, InFlight>();
  private readonly subs: Subscription[] = [];

  /** Answers cancel requests for the runs tracked here and hears broadcast aborts. */
  listen(nc: NatsConnection): void {
    this.subs.push(
      nc.subscribe(cancelSubject(this.id), {
        callback: (err, msg) => {
          if (err) return;
          const run = this.runs.get(msg.string());
          if (!run) return void msg.respond(encoder.encode("unknown"));
          run.controller.abort();
          const settled = new Promise<void>((resolve) => setTimeout(resolve, SETTLE_TIMEOUT_MS).unref());
          void Promise.race([run.done, settled]).then(() => msg.respond(encoder.encode("aborted")));
        },
      }),
      nc.subscribe(ABORT_SUBJECT, { callback: (err, msg) => err || this.runs.get(msg.string())?.controller.abort() }),
      nc.subscribe(holdsSubject(this.id), {
        callback: (err, msg) => {
          if (err) return;
          let asked: unknown;
          try {
            asked = msg.json();
          } catch {
            asked = [];
          }
          const held = Array.isArray(asked) ? asked.filter((id) => typeof id === "string" && this.runs.has(id)) : [];
          msg.respond(encoder.encode(JSON.stringify(held)));
        },
      }),
    );
  }

  /** Tracks a run until `done` settles (its final record is written); cancel aborts `controller`. */
  track(runId: string, controller: Abortable, done: Promise<unknown>): void {
    // One settle handler that also drops the entry: every sync run is tracked, so no second chain.
    const untrack = () => {
      if (this.runs.get(runId) === entry) this.runs.delete(runId);
    };
    const entry: InFlight = { controller, done: done.then(untrack, untrack) };
    this.runs.set(runId, entry);
  }

  close(): void {
    for (const sub of this.subs.splice(0)) sub.unsubscribe();
  }
}

/** Asks process `processId` to abort `runId`: "aborted" once it did, "unknown" if it does not hold the run, "gone" if the process is not there. */
export async function requestCancel(nc: NatsConnection, processId: string, runId: string): Promise<CancelAnswer> {
  try {
    const reply = await nc.request(cancelSubject(processId), encoder.encode(runId), {
      timeout: SETTLE_TIMEOUT_MS + 2_000,
    });
    return reply.string() === "aborted" ? "aborted" : "unknown";
  } catch (err) {
    if (err instanceof NatsError && (err.code === ErrorCode.NoResponders || err.code === ErrorCode.Timeout))
      return "gone";
    throw err;
  }
}

/**
 * Which of `runIds` process `processId` holds now; "gone" when no process of
 * that id is there, undefined when it did not answer in time (a busy or
 * reconnecting process: nothing can be concluded).
 */
export async function heldRuns(
  nc: NatsConnection,
  processId: string,
  runIds: string[],
  timeoutMs = 5_000,
): Promise<Set<string> | "gone" | undefined> {
  try {
    const reply = await nc.request(holdsSubject(processId), encoder.encode(JSON.stringify(runIds)), {
      timeout: timeoutMs,
    });
    const held: unknown = reply.json();
    return new Set(Array.isArray(held) ? held.filter((id): id is string => typeof id === "string") : []);
  } catch (err) {
    if (err instanceof NatsError && err.code === ErrorCode.NoResponders) return "gone";
    if (err instanceof NatsError && err.code === ErrorCode.Timeout) return undefined;
    throw err;
  }
}

/** Tells every runner to abort `runId` if it runs it (a gateway's sync run dispatched over NATS). */
export function broadcastAbort(nc: NatsConnection, runId: string): void {
  nc.publish(ABORT_SUBJECT, encoder.encode(runId));
}
