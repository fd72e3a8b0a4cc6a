// skiff-results at its byte budget: from 80 % the results of ended runs are
// removed, oldest first, down to 60 %; bodies in transit (an accepted async
// run's large body) are never removed. A real NATS server, provisioned as
// skiff provisions it, with a small budget.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { connect, type NatsConnection } from "nats";
import { afterAll, beforeAll, expect, it } from "vitest";
import { loadConfig } from "../../services/config/config.js";
import { StoreWatch } from "../../services/nats/budgets.js";
import { provision } from "../../services/nats/connect.js";
import { objectStores } from "../../services/nats/layout.js";
import { RunResults } from "../../services/runs/results.js";
import { TRIM_TO, trimResults } from "../../services/runs/results-budget.js";
import { capturingLogger } from "../helpers/logs.js";
import { startNatsServer, type TestNats } from "../helpers/nats-server.js";

const MiB = 2 ** 20;
let nats: TestNats;
let nc: NatsConnection;
let dir: string;

beforeAll(async () => {
  nats = await startNatsServer();
  nc = await connect({ servers: nats.url });
  dir = await mkdtemp(path.join(tmpdir(), "skiff-results-budget-"));
  const { logger } = capturingLogger();
  await provision(nc, logger, {
    budgets: { settings: loadConfig({ SKIFF_RESULTS_MAX_BYTES: "4MB" }), dataDir: dir },
  });
});

afterAll(async () => {
  await nc?.close();
  await nats?.stop();
  await rm(dir, { recursive: true, force: true });
});

it("removes the oldest results of ended runs down to 60 % of the budget, never a body in transit", async () => {
  const results = new RunResults(nc.jetstream(), nc, 86_400);
  const os = await results.objects();
  const blob = new Uint8Array(200 * 1024).fill(7);
  // The oldest object of all is an accepted run's body on its way to a runner.
  await os.putBlob({ name: "transfer.run-0.request" }, blob);
  const names: string[] = [];
  for (let i = 1; i <= 16; i++) {
    const name = `0190a0b0-0000-7000-8000-${String(i).padStart(12, "0")}`;
    await results.keep(name, { contentType: "text/plain", data: blob }, new Date(), true);
    names.push(name);
    await new Promise((r) => setTimeout(r, 5));
  }
  const { logger, lines } = capturingLogger();
  const watch = new StoreWatch(nc, logger, 3_600_000);
  await watch.measure();
  const before = watch.get(objectStores.results.name)!;
  expect(before.budget).toBe(4 * MiB);
  expect(before.bytes).toBeGreaterThan(0.8 * 4 * MiB);

  const removed = await trimResults(results, before, logger);
  await watch.measure();
  const after = watch.get(objectStores.results.name)!;
  const left = (await os.list()).map((i) => i.name).sort();
  expect(removed).toBeGreaterThan(0);
  expect(after.bytes).toBeLessThanOrEqual(TRIM_TO * 4 * MiB);
  // The oldest results went; the body in transit and the newest results stayed.
  expect(left).toEqual(["transfer.run-0.request", ...names.slice(removed)].sort());
  expect(lines.some((l) => /oldest results were removed/.test(l.msg))).toBe(true);

  // Below 80 %: nothing more goes.
  expect(await trimResults(results, after, logger)).toBe(0);
});
