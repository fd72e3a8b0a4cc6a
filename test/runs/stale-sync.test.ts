// The sweep of sync runs whose gateway is gone (runs/stale-sync.ts), against
// a real nats-server and a real run history (embedded SQLite): events published as a
// gateway publishes them (a sync run's record is its events), gateways that are RunControls listening on NATS (or
// closed, as a dead process is), two looks `confirmMs` apart.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import type { Subscription } from "nats";
import { v7 } from "uuid";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { silentLogger } from "../../services/config/logger.js";
import { RunControl } from "../../services/runs/control.js";
import { openRunHistory, type RunHistory } from "../../services/runs/history/index.js";
import { sweepStaleSyncRuns, type StaleSyncSweep } from "../../services/runs/stale-sync.js";
import { publishRunEvent } from "../../services/runs/events.js";
import type { RunRecord } from "../../services/runs/store.js";
import { startProvisionedNats } from "../helpers/nats-server.js";

const CONFIRM_MS = 300;
const WAIT = { timeout: 60_000, interval: 50 };
let n: Awaited<ReturnType<typeof startProvisionedNats>>;
let dir: string;
let history: RunHistory;
let sweep: StaleSyncSweep;
let events: Subscription;
const terminal: string[] = [];

beforeAll(async () => {
  n = await startProvisionedNats();
  dir = await mkdtemp(path.join(tmpdir(), "skiff-stale-sync-"));
  history = await openRunHistory({
    nc: n.nc,
    logger: silentLogger,
    databaseUrl: undefined,
    dataDir: dir,
    projector: { batchMs: 20 },
  });
  // everyMs: the timer stays out of the way; the test looks itself.
  sweep = sweepStaleSyncRuns({
    nc: n.nc,
    history: async () => history,
    logger: silentLogger,
    everyMs: 3_600_000,
    confirmMs: CONFIRM_MS,
  });
  events = n.nc.subscribe("skiff.events.runs.p.a.*", { callback: (_, m) => terminal.push(m.subject) });
}, 60_000);
afterAll(async () => {
  sweep?.stop();
  events?.unsubscribe();
  await history?.close();
  await n?.stop();
  await rm(dir, { recursive: true, force: true });
});

/** A sync run as its gateway records it once it passes a second. */
async function runningSync(runner: string, extra: Partial<RunRecord> = {}): Promise<RunRecord> {
  const now = new Date().toISOString();
  const record: RunRecord = {
    run_id: v7(),
    project_id: "p",
    app_name: "a",
    path: "sleep",
    async: false,
    status: "running",
    queued_at: now,
    started_at: now,
    attempts: 1,
    runner,
    ...extra,
  };
  await publishRunEvent(n.nc, record);
  return record;
}

/** Until the history has projected these writes. */
const projected = (ids: string[]) =>
  vi.waitUntil(async () => {
    const running = new Set((await history.runningSync(1000)).map((r) => r.run_id));
    return ids.every((id) => running.has(id));
  }, WAIT);

/** The run as the history holds it (a sync run's record is its events). */
const status = async (r: RunRecord) => (await history.get("p", "a", r.run_id))!;
/** The run once the history holds it in `state`. */
const reaches = (r: RunRecord, state: string) =>
  vi.waitUntil(async () => {
    const cur = await history.get("p", "a", r.run_id);
    return cur?.status === state ? cur : undefined;
  }, WAIT);

describe("stale sync runs", () => {
  it("a run whose gateway is gone fails (gateway_lost) on the second look, with its event; live gateways' runs are left", async () => {
    const dead = new RunControl();
    dead.listen(n.nc);
    dead.close(); // as a killed process: nothing answers on its subjects any more
    const live = new RunControl();
    live.listen(n.nc);
    const orphan = await runningSync(dead.id);
    const held = await runningSync(live.id);
    let finish!: () => void;
    live.track(held.run_id, new AbortController(), new Promise<void>((resolve) => (finish = resolve)));
    const asyncRun = await runningSync(dead.id, { async: true });
    await projected([orphan.run_id, held.run_id]);

    // First look: suspected only.
    expect(await sweep.look()).toEqual([]);
    expect((await status(orphan)).status).toBe("running");
    await new Promise((r) => setTimeout(r, CONFIRM_MS + 50));
    const failed = await sweep.look();
    expect(failed.map((r) => r.run_id)).toEqual([orphan.run_id]);
    const after = await reaches(orphan, "failure");
    expect(after).toMatchObject({ status: "failure", error: { type: "gateway_lost" }, runner: dead.id });
    expect(after.error!.message).toContain("stopped before recording how it ended");
    expect(after.finished_at).toBeDefined();
    await vi.waitUntil(() => terminal.includes("skiff.events.runs.p.a.failure"), WAIT);
    expect((await status(held)).status).toBe("running");
    expect((await status(asyncRun)).status).toBe("running");
    // A third look finds nothing more: the failed record left the history's running runs.
    await vi.waitUntil(async () => !(await history.runningSync(1000)).some((r) => r.run_id === orphan.run_id), WAIT);
    expect(await sweep.look()).toEqual([]);
    // The live gateway ends its run as a gateway does: final record first, then it stops holding it.
    await publishRunEvent(n.nc, {
      ...held,
      status: "success",
      finished_at: new Date().toISOString(),
      status_code: 200,
    });
    finish();
    live.close();
  });

  it("a live gateway that no longer holds its run (its final record lost) sees it failed; one finished between looks is left as it is", async () => {
    const gw = new RunControl();
    gw.listen(n.nc);
    const lost = await runningSync(gw.id);
    const finishing = await runningSync(gw.id);
    await projected([lost.run_id, finishing.run_id]);
    expect(await sweep.look()).toEqual([]);
    // The final record arrives late, between the two looks.
    await publishRunEvent(n.nc, {
      ...finishing,
      status: "success",
      finished_at: new Date().toISOString(),
      status_code: 200,
    });
    await new Promise((r) => setTimeout(r, CONFIRM_MS + 50));
    const failed = await sweep.look();
    expect(failed.map((r) => r.run_id)).toEqual([lost.run_id]);
    expect((await reaches(lost, "failure")).error!.message).toContain("no longer runs it");
    expect((await status(finishing)).status).toBe("success");
    gw.close();
  });
});
