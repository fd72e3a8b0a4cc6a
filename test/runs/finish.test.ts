// How an async run's final record and event go out (runs/finish.ts
// finishAsync), against a real nats-server, on a connection whose writes are
// coalesced as skiff's are: a run alone writes them at once, each in the
// turn it is made, with no timer; with other runs under way (`together`)
// they are held for the connection's next write, and the runs still end,
// their records final and their events published.
import { connect, type NatsConnection, type Subscription } from "nats";
import { v7 } from "uuid";
import { afterAll, afterEach, beforeAll, expect, it, vi } from "vitest";
import { silentLogger } from "../../services/config/logger.js";
import { coalesceWrites } from "../../services/nats/coalesce.js";
import { finishAsync, type FinishDeps } from "../../services/runs/finish.js";
import type { RunOutcome } from "../../services/runs/outcome.js";
import { RunResults } from "../../services/runs/results.js";
import { RunStore, type RunRecord } from "../../services/runs/store.js";
import { startProvisionedNats } from "../helpers/nats-server.js";

const RUNS = 8;
let n: Awaited<ReturnType<typeof startProvisionedNats>>;
let nc: NatsConnection;
let deps: FinishDeps;
let events: Subscription;
const ended = new Set<string>();
/** Socket writes of `nc` (nats.js writes through its transport's send() only). */
const writes = { count: 0 };

beforeAll(async () => {
  n = await startProvisionedNats();
  nc = await connect({ servers: n.nats.url });
  expect(coalesceWrites(nc)).toBe(true);
  const transport = (nc as unknown as { protocol: { transport: { send(frame: Uint8Array): void } } }).protocol
    .transport;
  const send = transport.send.bind(transport);
  transport.send = (frame) => {
    writes.count++;
    send(frame);
  };
  deps = { runs: new RunStore(nc), results: new RunResults(nc.jetstream(), nc, 60), logger: silentLogger };
  events = n.nc.subscribe("skiff.events.runs.p-finish.a.success", {
    callback: (_, m) => ended.add(JSON.parse(m.headers!.get("Skiff-Run")).run_id),
  });
  await n.nc.flush();
}, 60_000);
afterEach(() => vi.useRealTimers());
afterAll(async () => {
  events?.unsubscribe();
  await nc?.close();
  await n?.stop();
});

/** `RUNS` runs recorded `running`, as a runner writes them when it starts them. */
function startRuns(): Promise<{ record: RunRecord; revision: number }[]> {
  const now = new Date().toISOString();
  return Promise.all(
    Array.from({ length: RUNS }, async () => {
      const record: RunRecord = {
        run_id: v7(),
        project_id: "p-finish",
        app_name: "a",
        path: "/run",
        async: true,
        status: "running",
        queued_at: now,
        started_at: now,
        attempts: 1,
      };
      const created = await deps.runs.create(record);
      expect(created).toBeDefined();
      return created!;
    }),
  );
}

const outcome: RunOutcome = {
  status: "success",
  statusCode: 200,
  runTimeMs: 3,
  body: { contentType: "application/json", data: new TextEncoder().encode('{"sum":3}') },
};
const turn = () => new Promise((resolve) => setImmediate(resolve));

/** Ends each run in a turn of the event loop of its own, as replicas' answers come; resolves with the finishes. */
async function finishInTurns(
  runs: { record: RunRecord; revision: number }[],
  together: boolean,
): Promise<Promise<unknown>[]> {
  const finishes: Promise<unknown>[] = [];
  for (const run of runs) {
    finishes.push(finishAsync(deps, run, outcome, together));
    // One turn for the record's publish (after the result is kept), one for the write the publish scheduled.
    await turn();
    await turn();
  }
  return finishes;
}

async function expectEnded(runs: { record: RunRecord }[]): Promise<void> {
  for (const { record } of runs) {
    const cur = await deps.runs.get(record.project_id, record.app_name, record.run_id);
    expect(cur?.record.status).toBe("success");
  }
  await vi.waitUntil(() => runs.every((r) => ended.has(r.record.run_id)), { timeout: 10_000, interval: 20 });
}

it("a run alone writes its final record and event at once, each in a write of its own, without a timer", async () => {
  const runs = await startRuns();
  // No timer fires while the runs end: a write that waited for one would never go, and the test time out.
  vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout"] });
  const before = writes.count;
  const finishes = await finishInTurns(runs, false);
  expect(writes.count - before).toBeGreaterThanOrEqual(RUNS);
  await Promise.all(finishes);
  vi.useRealTimers();
  await expectEnded(runs);
});

it("runs ending together hold their final writes for the connection's next write, and still end", async () => {
  const runs = await startRuns();
  vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout"] });
  const before = writes.count;
  const finishes = await finishInTurns(runs, true);
  // Each run ended in a turn of its own, and none of their records has been written: they wait for company.
  expect(writes.count - before).toBe(0);
  vi.useRealTimers();
  // A write of something else takes every record along, in one write; the events then go out together too.
  nc.publish("skiff.test.unrelated", new Uint8Array(1));
  await turn();
  await turn();
  expect(writes.count - before).toBe(1);
  await Promise.all(finishes);
  expect(writes.count - before).toBeLessThan(RUNS);
  await expectEnded(runs);
});
