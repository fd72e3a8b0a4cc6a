// The run records a skiff publishes, as its events carry them (header
// `Skiff-Run`): a sync run (a WebSocket connection too) has no other record
// than its events, so tests read its states here, as the run history does.
import type { NatsConnection, Subscription } from "nats";
import { v7 } from "uuid";
import { vi } from "vitest";
import { recordOfEvent } from "../../services/runs/events.js";
import type { RunRecord } from "../../services/runs/store.js";

export interface RunRecords {
  /** The ids of every run seen so far. */
  ids(): IterableIterator<string>;
  /** The latest record of the run seen so far. */
  latest(runId: string): RunRecord | undefined;
  /** Waits for the run's record to leave `running` (and `queued`). */
  final(runId: string, timeoutMs?: number): Promise<RunRecord>;
  stop(): void;
}

/** Follows every run event published from now on (core NATS, not JetStream: nothing is replayed). */
export async function followRunRecords(nc: NatsConnection): Promise<RunRecords> {
  const seen = new Map<string, RunRecord>();
  const sub: Subscription = nc.subscribe("skiff.events.runs.>", {
    callback: (_err, m) => {
      const record = recordOfEvent(m.headers);
      if (record) seen.set(record.run_id, record);
    },
  });
  await nc.flush();
  return {
    ids: () => seen.keys(),
    latest: (runId) => seen.get(runId),
    final: (runId, timeoutMs = 10_000) =>
      vi.waitUntil(
        () => {
          const r = seen.get(runId);
          return r && r.status !== "running" && r.status !== "queued" ? r : undefined;
        },
        { timeout: timeoutMs, interval: 20 },
      ),
    stop: () => sub.unsubscribe(),
  };
}

/** A successful sync run's final record of app `a` in `project`, made now, with `over` on top. */
export function finishedRun(project: string, over: Partial<RunRecord> = {}): RunRecord {
  return {
    run_id: v7(),
    project_id: project,
    app_name: "a",
    path: "run",
    async: false,
    status: "success",
    queued_at: new Date().toISOString(),
    finished_at: new Date().toISOString(),
    run_time_ms: 1,
    status_code: 200,
    attempts: 1,
    ...over,
  };
}
