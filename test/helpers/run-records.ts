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

/** A stored message of a stream: its body as text, and its `Skiff-Run` header (an event's record). */
export interface StoredMessage {
  seq: number;
  subject: string;
  text: string;
  header: string | undefined;
}

/** The messages of `stream` after sequence `from` (those gone from it left out), read through `nc`. */
export async function storedAfter(nc: NatsConnection, stream: string, from: number): Promise<StoredMessage[]> {
  const jsm = await nc.jetstreamManager();
  const last = (await jsm.streams.info(stream)).state.last_seq;
  const out: StoredMessage[] = [];
  for (let seq = from + 1; seq <= last; seq++) {
    const m = await jsm.streams.getMessage(stream, { seq }).catch(() => undefined);
    if (m)
      out.push({ seq, subject: m.subject, text: new TextDecoder().decode(m.data), header: m.header?.get("Skiff-Run") });
  }
  return out;
}
