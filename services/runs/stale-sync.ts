// Sync runs that nobody will finish. A sync run that passes a second is
// recorded `running` with `runner` = its gateway's process id (RunControl),
// and only that gateway writes its final record. A gateway killed mid-run
// never does, and a final record written unacknowledged can be lost when a
// NATS node fails: the record would read `running` forever.
//
// Every management process looks, every `everyMs`, at the sync runs its run
// history holds as `running` (a partial index keeps that cheap) and asks each
// gateway named (`skiff.control.holds.{id}`, one request per gateway) which
// of them it still holds. A run whose gateway is gone (no responders) or no
// longer holds it, on two looks at least `confirmMs` apart, is set `failure`
// (`gateway_lost`) when the history still holds it `running` from that
// gateway: its terminal event is published, which is its record (its
// webhook reports the failure). The
// second look lets a final record that was on its way land first; a gateway
// that does not answer in time is left alone.
import type { NatsConnection } from "nats";
import type { Logger } from "../config/index.js";
import { heldRuns } from "./control.js";
import { publishRunEvent } from "./events.js";
import type { RunHistory } from "./history/index.js";
import type { RunRecord } from "./store.js";

const STALE_SYNC_EVERY_MS = 5_000;
const STALE_SYNC_CONFIRM_MS = 10_000;
/** Candidates read per look. */
const BATCH = 1_000;

interface StaleSyncOptions {
  nc: NatsConnection;
  history: () => Promise<Pick<RunHistory, "runningSync" | "get">>;
  logger: Logger;
  everyMs?: number;
  confirmMs?: number;
}

export interface StaleSyncSweep {
  /** One look now (the timer calls it); resolves with the runs it failed. */
  look(): Promise<RunRecord[]>;
  stop(): void;
}

export function sweepStaleSyncRuns(opts: StaleSyncOptions): StaleSyncSweep {
  const { nc, logger } = opts;
  const confirmMs = opts.confirmMs ?? STALE_SYNC_CONFIRM_MS;
  /** Runs seen orphaned, and when first: failed once seen so again confirmMs later. */
  const suspects = new Map<string, number>();

  async function fail(record: RunRecord, why: "gone" | "not held"): Promise<RunRecord | undefined> {
    const message =
      why === "gone"
        ? `the gateway that ran it (${record.runner}) stopped before recording how it ended`
        : `its gateway (${record.runner}) no longer runs it, and its final record never arrived`;
    // The history's record is the run's latest (a sync run's record is its events): still `running`, and
    // nobody else will write it.
    const cur = await (await opts.history()).get(record.project_id, record.app_name, record.run_id);
    if (!cur || cur.status !== "running" || cur.async || cur.runner !== record.runner) return undefined;
    const final: RunRecord = {
      ...cur,
      status: "failure",
      finished_at: new Date().toISOString(),
      error: { type: "gateway_lost", message },
    };
    await publishRunEvent(nc, final);
    logger.warn(
      { runId: final.run_id, app: `${final.project_id}/${final.app_name}`, why },
      `sync run failed: ${message}`,
    );
    return final;
  }

  async function look(): Promise<RunRecord[]> {
    const now = Date.now();
    const running = (await (await opts.history()).runningSync(BATCH)).filter((r) => r.runner);
    const byGateway = new Map<string, RunRecord[]>();
    for (const r of running) byGateway.set(r.runner!, [...(byGateway.get(r.runner!) ?? []), r]);
    const orphans: { record: RunRecord; why: "gone" | "not held" }[] = [];
    for (const [gateway, records] of byGateway) {
      const held = await heldRuns(
        nc,
        gateway,
        records.map((r) => r.run_id),
      );
      if (held === undefined) continue;
      for (const record of records)
        if (held === "gone" || !held.has(record.run_id))
          orphans.push({ record, why: held === "gone" ? "gone" : "not held" });
    }
    const seen = new Set(orphans.map((o) => o.record.run_id));
    // A run no longer a candidate (finished, or held after all) starts over.
    for (const id of suspects.keys()) if (!seen.has(id)) suspects.delete(id);
    const failed: RunRecord[] = [];
    for (const { record, why } of orphans) {
      const since = suspects.get(record.run_id);
      if (since === undefined) {
        suspects.set(record.run_id, now);
        continue;
      }
      if (now - since < confirmMs) continue;
      suspects.delete(record.run_id);
      const final = await fail(record, why);
      if (final) failed.push(final);
    }
    return failed;
  }

  let busy = false;
  const timer = setInterval(() => {
    if (busy || nc.isClosed()) return;
    busy = true;
    look()
      .catch((err: unknown) => logger.warn({ err }, "cannot look for sync runs whose gateway is gone"))
      .finally(() => (busy = false));
  }, opts.everyMs ?? STALE_SYNC_EVERY_MS);
  timer.unref();
  return { look, stop: () => clearInterval(timer) };
}
