// Byte budgets of the NATS stores: provisioning gives every stream, bucket
// and object store its `max_bytes` (the setting's, or a share of the free
// disk made once and kept), JetStream enforces them (the oldest events go,
// the queue refuses), and StoreWatch measures them, warns at 80 % and names
// the full ones.
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { connect, DiscardPolicy, type NatsConnection } from "nats";
import { afterEach, describe, expect, test } from "vitest";
import { loadConfig } from "../../services/config/config.js";
import { silentLogger } from "../../services/config/logger.js";
import { publishAcked } from "../../services/nats/acked-publish.js";
import {
  STORE_SPECS,
  StoreWatch,
  derivedBudget,
  freeDiskBytes,
  type BudgetSettings,
} from "../../services/nats/budgets.js";
import { provision } from "../../services/nats/connect.js";
import { isStreamFull, NatsProvisionError } from "../../services/nats/errors.js";
import { buckets, objectStores, streams, subjects } from "../../services/nats/layout.js";
import { capturingLogger } from "../helpers/logs.js";
import { startNatsServer, type TestNats } from "../helpers/nats-server.js";

const MiB = 1024 * 1024;
const cleanups: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function server(args?: string[]): Promise<TestNats> {
  const s = await startNatsServer({ args });
  cleanups.push(() => s.stop());
  return s;
}

async function client(url: string): Promise<NatsConnection> {
  const nc = await connect({ servers: url });
  cleanups.push(() => nc.close());
  return nc;
}

async function tempDir(): Promise<string> {
  const dir = await mkdtemp(path.join(tmpdir(), "skiff-budgets-"));
  cleanups.push(() => rm(dir, { recursive: true, force: true }));
  return dir;
}

/** The budget settings of SKIFF_* variables, as the process reads them. */
const settings = (env: Record<string, string> = {}): BudgetSettings => loadConfig(env);

/** Every stream of the layout with its max_bytes and discard policy. */
async function limits(nc: NatsConnection): Promise<Record<string, { max_bytes: number; discard: string }>> {
  const jsm = await nc.jetstreamManager();
  const out: Record<string, { max_bytes: number; discard: string }> = {};
  for await (const si of jsm.streams.list())
    out[si.config.name] = { max_bytes: si.config.max_bytes, discard: si.config.discard };
  return out;
}

describe("store budgets - provisioning", () => {
  test("every stream, bucket and object store gets the budget its setting names, discarding old only where old may go", async () => {
    const nats = await server();
    const nc = await client(nats.url);
    const env = {
      SKIFF_EVENTS_MAX_BYTES: "40MB",
      SKIFF_WEBHOOKS_MAX_BYTES: "8MiB",
      SKIFF_RUN_QUEUE_MAX_BYTES: "20MB",
      SKIFF_LOGS_MAX_BYTES: "4194304",
      SKIFF_RESULTS_MAX_BYTES: "30MB",
      SKIFF_BUNDLES_MAX_BYTES: "50MB",
      SKIFF_KV_MAX_BYTES: "2MB",
    };
    await provision(nc, silentLogger, { budgets: { settings: settings(env), dataDir: await tempDir() } });
    const got = await limits(nc);
    expect(got[streams.events.name]).toEqual({ max_bytes: 40 * MiB, discard: DiscardPolicy.Old });
    expect(got[streams.webhooks.name]).toEqual({ max_bytes: 8 * MiB, discard: DiscardPolicy.Old });
    expect(got[streams.logs.name]).toEqual({ max_bytes: 4 * MiB, discard: DiscardPolicy.Old });
    // An accepted run is never dropped: the queue and its advisories refuse at the budget.
    expect(got[streams.runs.name]).toEqual({ max_bytes: 20 * MiB, discard: DiscardPolicy.New });
    expect(got[streams.lostRuns.name]).toEqual({ max_bytes: 2 * MiB, discard: DiscardPolicy.New });
    expect(got[`OBJ_${objectStores.results.name}`]).toEqual({ max_bytes: 30 * MiB, discard: DiscardPolicy.New });
    expect(got[`OBJ_${objectStores.bundles.name}`]).toEqual({ max_bytes: 50 * MiB, discard: DiscardPolicy.New });
    for (const b of Object.values(buckets))
      expect(got[`KV_${b.name}`], b.name).toEqual({ max_bytes: 2 * MiB, discard: DiscardPolicy.New });

    // A changed setting changes the budget of the existing stream; the other settings stay.
    await provision(nc, silentLogger, {
      budgets: { settings: settings({ ...env, SKIFF_EVENTS_MAX_BYTES: "10MB" }), dataDir: await tempDir() },
    });
    const again = await limits(nc);
    expect(again[streams.events.name]).toEqual({ max_bytes: 10 * MiB, discard: DiscardPolicy.Old });
    expect(again[streams.runs.name]).toEqual(got[streams.runs.name]);
  });

  test("an unset budget is a share of the free disk, said in the log, and kept at later starts", async () => {
    const nats = await server();
    const nc = await client(nats.url);
    const dataDir = await tempDir();
    const { logger, lines } = capturingLogger();
    const free = await freeDiskBytes(dataDir);
    await provision(nc, logger, { budgets: { settings: settings({ SKIFF_STORAGE_SHARE: "2" }), dataDir } });
    const first = await limits(nc);
    for (const spec of STORE_SPECS) {
      if (spec.stream === undefined) continue;
      const want = derivedBudget(spec, 2, free);
      // The disk's free space moves a little while the test runs (other processes write).
      expect(first[spec.stream].max_bytes / want, spec.store).toBeGreaterThan(0.95);
      expect(first[spec.stream].max_bytes / want, spec.store).toBeLessThan(1.05);
    }
    const said = lines.filter((l) => /budget .*SKIFF_STORAGE_SHARE/.test(l.msg)).map((l) => l.name);
    expect(said.sort()).toEqual(
      STORE_SPECS.filter((s) => s.stream !== undefined)
        .map((s) => s.store)
        .sort(),
    );

    // Another start, with another share: the budgets made at the first stay (they do not shrink as a disk fills).
    const later = capturingLogger();
    await provision(nc, later.logger, { budgets: { settings: settings({ SKIFF_STORAGE_SHARE: "1" }), dataDir } });
    expect(await limits(nc)).toEqual(first);
    expect(later.lines.filter((l) => /budget|updated/.test(l.msg))).toEqual([]);
  });

  test("a budget the NATS server cannot reserve: a set one stops provisioning naming its setting, a derived one is halved until it fits", async () => {
    const dir = await tempDir();
    const conf = path.join(dir, "nats.conf");
    await writeFile(conf, "jetstream { max_file_store: 256MB }\n");
    const nats = await server(["-c", conf]);
    const nc = await client(nats.url);
    const err = await provision(nc, silentLogger, {
      budgets: { settings: settings({ SKIFF_EVENTS_MAX_BYTES: "1GB" }), dataDir: dir },
    }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(NatsProvisionError);
    expect((err as Error).message).toMatch(/SKIFF_EVENTS.*cannot reserve 1024 MiB.*lower SKIFF_EVENTS_MAX_BYTES/);

    const fresh = await server(["-c", conf]);
    const nc2 = await client(fresh.url);
    const { logger, lines } = capturingLogger();
    // 90 % of this disk's free space is far beyond the server's 256 MB.
    await provision(nc2, logger, { budgets: { settings: settings({ SKIFF_STORAGE_SHARE: "90" }), dataDir: dir } });
    const got = await limits(nc2);
    const total = Object.values(got).reduce((sum, l) => sum + l.max_bytes, 0);
    expect(total).toBeLessThanOrEqual(256 * MiB);
    expect(Object.values(got).every((l) => l.max_bytes > 0)).toBe(true);
    expect(lines.some((l) => /cannot reserve the budgets of .*every derived budget is halved/.test(l.msg))).toBe(true);
    // Halved together, each keeps its part: the events 24 % of the share, the results 15 %, as their shares say.
    const ratio = got[streams.events.name].max_bytes / got[`OBJ_${objectStores.results.name}`].max_bytes;
    expect(ratio).toBeCloseTo(24 / 15, 1);
  });
});

describe("store budgets - enforced by JetStream", () => {
  test("SKIFF_EVENTS at its budget drops its oldest events; SKIFF_RUNS refuses the message past its budget", async () => {
    const nats = await server();
    const nc = await client(nats.url);
    const env = { SKIFF_EVENTS_MAX_BYTES: "1MB", SKIFF_RUN_QUEUE_MAX_BYTES: "1MB" };
    await provision(nc, silentLogger, { budgets: { settings: settings(env), dataDir: await tempDir() } });
    const jsm = await nc.jetstreamManager();
    const chunk = new Uint8Array(16 * 1024);
    for (let i = 0; i < 200; i++) await publishAcked(nc, subjects.runEvent("p", "a", "success"), chunk);
    const events = await jsm.streams.info(streams.events.name);
    expect(events.state.bytes).toBeLessThanOrEqual(MiB);
    expect(events.state.first_seq).toBeGreaterThan(100);
    expect(events.state.last_seq).toBe(200);

    let refused: unknown;
    let stored = 0;
    for (let i = 0; i < 200 && refused === undefined; i++) {
      await publishAcked(nc, subjects.runQueue("p", "a"), chunk, { msgId: `run-${i}` }).then(
        () => stored++,
        (e: unknown) => (refused = e),
      );
    }
    expect(isStreamFull(refused)).toBe(true);
    const runs = await jsm.streams.info(streams.runs.name);
    // Nothing accepted went: every stored run is still there.
    expect(runs.state.messages).toBe(stored);
    expect(runs.state.first_seq).toBe(1);
    expect(runs.state.bytes).toBeLessThanOrEqual(MiB);
  });
});

describe("store budgets - StoreWatch", () => {
  test("measures every store, warns once at 80 %, names a full queue, and counts what this process adds", async () => {
    const nats = await server();
    const nc = await client(nats.url);
    await provision(nc, silentLogger, {
      budgets: {
        settings: settings({ SKIFF_RUN_QUEUE_MAX_BYTES: "1MB", SKIFF_STORAGE_SHARE: "1" }),
        dataDir: await tempDir(),
      },
    });
    const { logger, lines } = capturingLogger();
    const watch = new StoreWatch(nc, logger, 60_000);
    cleanups.push(() => watch.stop());
    const fullSeen: string[][] = [];
    watch.onFull = (full) => fullSeen.push(full);
    let historyBytes = 100;
    watch.addStore("run-history", 1000, async () => historyBytes);
    await watch.measure();
    const names = watch
      .snapshot()
      .map((u) => u.store)
      .sort();
    expect(names).toEqual(STORE_SPECS.map((s) => s.store).sort());
    expect(watch.get(streams.runs.name)).toMatchObject({ bytes: 0, budget: MiB, atBudget: "refuses new" });
    expect(watch.hasRoom(streams.runs.name, 900 * 1024)).toBe(true);
    watch.add(streams.runs.name, 900 * 1024);
    expect(watch.hasRoom(streams.runs.name, 200 * 1024)).toBe(false);

    const chunk = new Uint8Array(8 * 1024);
    for (let i = 0; ; i++) {
      const stored = await publishAcked(nc, subjects.runQueue("p", "a"), chunk, { msgId: `r${i}` }).then(
        () => true,
        () => false,
      );
      if (!stored) break;
    }
    historyBytes = 850;
    await watch.measure();
    await watch.measure();
    expect(watch.full()).toEqual([streams.runs.name]);
    expect(fullSeen).toEqual([[streams.runs.name]]);
    expect(watch.hasRoom(streams.runs.name, 1024)).toBe(false);
    const warned = lines.filter((l) => l.level >= 40).map((l) => [l.store, l.msg]);
    expect(warned).toEqual([
      [
        streams.runs.name,
        expect.stringMatching(/SKIFF_RUNS holds 9\d % of its budget .*SKIFF_RUN_QUEUE_MAX_BYTES.*refuses new writes/),
      ],
      [
        "run-history",
        expect.stringMatching(/run-history holds 85 % .*SKIFF_HISTORY_MAX_BYTES.*oldest entries are dropped/),
      ],
    ]);
    // The queue drains: no longer full, said once.
    await (await nc.jetstreamManager()).streams.purge(streams.runs.name);
    await watch.measure();
    expect(watch.full()).toEqual([]);
    expect(fullSeen).toEqual([[streams.runs.name], []]);
  });
});
