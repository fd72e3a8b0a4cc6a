import { mkdtemp, readFile, rm } from "node:fs/promises";
import net from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { connect, nanos, RetentionPolicy, StorageType, StringCodec, type NatsConnection } from "nats";
import { capturingLogger } from "../helpers/logs.js";
import { afterEach, beforeEach, describe, expect, test } from "vitest";
import { silentLogger } from "../../services/config/logger.js";
import { buckets, objectStores, streams } from "../../services/nats/layout.js";
import {
  connectNats,
  JetStreamDisabledError,
  NatsConnectError,
  NatsStartError,
  provision,
  STARTED_SERVER_MAX_PAYLOAD_BYTES,
  type NatsHandle,
} from "../../services/nats/connect.js";
import { startNatsServer, type TestNats } from "../helpers/nats-server.js";

const sc = StringCodec();

// Everything a test starts is registered here and stopped after it, pass or fail.
const cleanups: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function server(opts?: Parameters<typeof startNatsServer>[0]): Promise<TestNats> {
  const s = await startNatsServer(opts);
  cleanups.push(() => s.stop());
  return s;
}

async function client(url: string): Promise<NatsConnection> {
  const nc = await connect({ servers: url });
  cleanups.push(() => nc.close());
  return nc;
}

async function tempDir(): Promise<string> {
  const dir = await mkdtemp(path.join(tmpdir(), "skiff-nats-test-"));
  cleanups.push(() => rm(dir, { recursive: true, force: true }));
  return dir;
}

function track(handle: NatsHandle): NatsHandle {
  cleanups.push(() => handle.close());
  return handle;
}

/** A URL where nothing listens: a port the OS just handed out and that was closed again. */
async function closedUrl(): Promise<string> {
  const srv = net.createServer();
  await new Promise<void>((resolve) => srv.listen(0, "127.0.0.1", resolve));
  const { port } = srv.address() as net.AddressInfo;
  await new Promise((resolve) => srv.close(resolve));
  return `nats://127.0.0.1:${port}`;
}

function isRunning(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

async function streamNames(nc: NatsConnection): Promise<string[]> {
  const jsm = await nc.jetstreamManager();
  const names: string[] = [];
  for await (const n of jsm.streams.names()) names.push(n);
  return names.sort();
}

const layoutStreamNames = [
  ...Object.values(streams).map((s) => s.name),
  ...Object.values(buckets).map((b) => `KV_${b.name}`),
  ...Object.values(objectStores).map((o) => `OBJ_${o.name}`),
].sort();

describe("nats - provision", () => {
  let nats: TestNats;
  beforeEach(async () => {
    nats = await server();
  });

  test("provision creates every stream, bucket and object store of the layout", async () => {
    const nc = await client(nats.url);
    await provision(nc, silentLogger);
    const jsm = await nc.jetstreamManager();
    const js = nc.jetstream();

    expect(await streamNames(nc)).toEqual(layoutStreamNames);
    for (const spec of Object.values(streams)) {
      const { config } = await jsm.streams.info(spec.name);
      expect(config).toMatchObject({
        subjects: [...spec.subjects],
        retention: spec.retention,
        storage: StorageType.File,
        max_age: nanos(spec.maxAgeMs),
        duplicate_window: nanos(spec.duplicateWindowMs),
      });
    }
    for (const spec of Object.values(buckets)) {
      const kv = await js.views.kv(spec.name, { bindOnly: true });
      const status = await kv.status();
      expect({ history: status.history, ttl: status.ttl, storage: status.streamInfo.config.storage }).toEqual({
        history: spec.history,
        ttl: spec.ttlMs,
        storage: StorageType.File,
      });
      await kv.put("k", sc.encode(spec.name));
      expect(sc.decode((await kv.get("k"))!.value)).toBe(spec.name);
    }
    for (const spec of Object.values(objectStores)) {
      const os = await js.views.os(spec.name);
      expect((await os.status()).storage).toBe(StorageType.File);
      await os.putBlob({ name: "o" }, sc.encode(spec.name));
      expect(sc.decode((await os.getBlob("o"))!)).toBe(spec.name);
    }
  });

  test("results kept longer than a week keep the events as long (GetRun reads an ended run's result from its event)", async () => {
    const nc = await client(nats.url);
    const jsm = await nc.jetstreamManager();
    await provision(nc, silentLogger, { resultTtlSeconds: 30 * 86_400 });
    expect((await jsm.streams.info(streams.events.name)).config.max_age).toBe(nanos(30 * 86_400_000));
    await provision(nc, silentLogger, { resultTtlSeconds: 86_400 });
    expect((await jsm.streams.info(streams.events.name)).config.max_age).toBe(nanos(streams.events.maxAgeMs));
  });

  test("provision is idempotent and safe with five concurrent provisioners", async () => {
    const conns = await Promise.all(Array.from({ length: 5 }, () => client(nats.url)));
    const results = await Promise.allSettled(conns.map((nc) => provision(nc, silentLogger)));
    expect(results.filter((r) => r.status === "rejected")).toEqual([]);

    const jsm = await conns[0].jetstreamManager();
    const before = await Promise.all(layoutStreamNames.map((n) => jsm.streams.info(n)));
    const { logger, lines } = capturingLogger();
    await provision(conns[1], logger);
    const after = await Promise.all(layoutStreamNames.map((n) => jsm.streams.info(n)));

    expect(await streamNames(conns[0])).toEqual(layoutStreamNames);
    expect(after.map((i) => [i.created, i.config])).toEqual(before.map((i) => [i.created, i.config]));
    expect(lines.filter((l) => /created|updated|differs/.test(l.msg))).toEqual([]);
  });

  test("first provisioning by eight processes at once never fails, round after round on fresh servers", async () => {
    // Concurrent creates of one KV bucket may be refused with "subjects overlap" rather than
    // "name in use"; both mean another process got there first.
    for (let round = 0; round < 8; round++) {
      const fresh = await startNatsServer();
      const conns = await Promise.all(Array.from({ length: 8 }, () => connect({ servers: fresh.url })));
      try {
        const results = await Promise.allSettled(conns.map((nc) => provision(nc, silentLogger)));
        expect(results.filter((r) => r.status === "rejected")).toEqual([]);
        expect(await streamNames(conns[0])).toEqual(layoutStreamNames);
      } finally {
        await Promise.all(conns.map((nc) => nc.close()));
        await fresh.stop();
      }
    }
  });

  test("provision brings changed settings back to the layout and reports those JetStream cannot change", async () => {
    const nc = await client(nats.url);
    const jsm = await nc.jetstreamManager();
    await jsm.streams.add({
      name: streams.events.name,
      subjects: ["skiff.events.runs.>"],
      max_age: nanos(60_000),
      storage: StorageType.File,
    });
    await jsm.streams.add({
      name: streams.runs.name,
      subjects: [...streams.runs.subjects],
      storage: StorageType.Memory,
      retention: RetentionPolicy.Limits,
    });
    await nc.jetstream().views.kv(buckets.apps.name, { history: 1, storage: StorageType.File });

    const { logger, lines } = capturingLogger();
    await provision(nc, logger);

    const events = (await jsm.streams.info(streams.events.name)).config;
    expect({ subjects: events.subjects, max_age: events.max_age, description: events.description }).toEqual({
      subjects: [...streams.events.subjects],
      max_age: nanos(streams.events.maxAgeMs),
      description: streams.events.description,
    });
    expect((await jsm.streams.info(`KV_${buckets.apps.name}`)).config.max_msgs_per_subject).toBe(buckets.apps.history);

    const runs = (await jsm.streams.info(streams.runs.name)).config;
    expect({ storage: runs.storage, retention: runs.retention, duplicate_window: runs.duplicate_window }).toEqual({
      storage: StorageType.Memory,
      retention: RetentionPolicy.Limits,
      duplicate_window: nanos(streams.runs.duplicateWindowMs),
    });
    const warnings = lines.filter((l) => l.level === 40).map((l) => l.msg);
    expect(warnings).toEqual([expect.stringMatching(/SKIFF_RUNS .*cannot change \(retention, storage\)/)]);
  });
});

describe("nats - connectNats", () => {
  test("connectNats without SKIFF_NATS_URL or credentials starts its own server even when one answers at the probe URL", async () => {
    const nats = await server();
    const dataDir = await tempDir();
    const handle = track(await connectNats({ probeUrl: nats.url, dataDir, logger: silentLogger }));

    expect(handle.url).not.toBe(nats.url);
    expect(handle.embedded).toBe(true);
    expect(handle.authRequired).toBe(true);
    expect(handle.nc.info?.port).not.toBe(nats.port);
    await handle.close();
    expect(handle.nc.isClosed()).toBe(true);
    expect(isRunning(nats.pid)).toBe(true);
  });

  test("connectNats starts nats-server with JetStream when nothing answers, and stops it on close", async () => {
    const dataDir = await tempDir();
    const handle = track(await connectNats({ probeUrl: await closedUrl(), dataDir, logger: silentLogger }));
    const pid = handle.serverPid!;

    expect(handle.embedded).toBe(true);
    expect(isRunning(pid)).toBe(true);
    expect(handle.nc.info?.max_payload).toBe(STARTED_SERVER_MAX_PAYLOAD_BYTES);
    expect(handle.nc.info?.host).toBe("127.0.0.1");
    expect(await readFile(path.join(dataDir, "nats", "nats-server.conf"), "utf8")).toContain("max_payload");
    const kv = await handle.nc.jetstream().views.kv("probe");
    await kv.put("k", sc.encode("v"));

    await handle.close();
    await handle.close();
    expect(isRunning(pid)).toBe(false);
    await expect(connect({ servers: handle.url, reconnect: false })).rejects.toThrow();
  });

  test("a started server keeps its JetStream store in the data folder across restarts", async () => {
    const dataDir = await tempDir();
    const first = track(await connectNats({ probeUrl: await closedUrl(), dataDir, logger: silentLogger }));
    await provision(first.nc, silentLogger);
    await (await first.nc.jetstream().views.kv(buckets.projects.name)).put("p-1", sc.encode("kept"));
    await first.close();

    const second = track(await connectNats({ probeUrl: await closedUrl(), dataDir, logger: silentLogger }));
    expect(second.serverPid).not.toBe(first.serverPid);
    const kv = await second.nc.jetstream().views.kv(buckets.projects.name, { bindOnly: true });
    expect(sc.decode((await kv.get("p-1"))!.value)).toBe("kept");
  });

  test("connectNats without a nats-server binary names apt-get install nats-server and SKIFF_NATS_URL", async () => {
    const dataDir = await tempDir();
    const attempt = connectNats({
      probeUrl: await closedUrl(),
      dataDir,
      logger: silentLogger,
      searchPath: await tempDir(),
    });
    await expect(attempt).rejects.toThrow(NatsStartError);
    await expect(attempt).rejects.toThrow(/apt-get install nats-server.*SKIFF_NATS_URL/);
  });

  test("an explicit URL that does not answer fails with a message naming SKIFF_NATS_URL", async () => {
    const url = `${await closedUrl()},${await closedUrl()}`;
    const attempt = connectNats({ url, dataDir: await tempDir(), logger: silentLogger });
    await expect(attempt).rejects.toThrow(NatsConnectError);
    await expect(attempt).rejects.toThrow(/SKIFF_NATS_URL/);
  });

  test("an explicit URL that lists no server is refused instead of falling back to localhost", async () => {
    await expect(connectNats({ url: " , ", dataDir: await tempDir(), logger: silentLogger })).rejects.toThrow(
      /SKIFF_NATS_URL names no server/,
    );
  });

  test("an explicit URL may list several servers, comma-separated", async () => {
    const nats = await server();
    const handle = track(
      await connectNats({ url: `${await closedUrl()}, ${nats.url}`, dataDir: await tempDir(), logger: silentLogger }),
    );
    expect(handle.nc.info?.port).toBe(nats.port);
  });

  test("a server without JetStream is refused with an error saying so", async () => {
    const nats = await server({ jetstream: false });
    const attempt = connectNats({ url: nats.url, dataDir: await tempDir(), logger: silentLogger });
    await expect(attempt).rejects.toThrow(JetStreamDisabledError);
    await expect(attempt).rejects.toThrow(/JetStream disabled/);
  });

  test("a connection survives the server being restarted", { timeout: 30_000 }, async () => {
    const nats = await server();
    const handle = track(await connectNats({ url: nats.url, dataDir: await tempDir(), logger: silentLogger }));
    await provision(handle.nc, silentLogger);
    const kv = await handle.nc.jetstream().views.kv(buckets.runs.name, { bindOnly: true });
    await kv.put("before", sc.encode("1"));

    const reconnected = (async () => {
      for await (const s of handle.nc.status()) if (s.type === "reconnect") return;
      throw new Error("the connection closed instead of reconnecting");
    })();
    await nats.kill();
    await nats.restart();
    await reconnected;

    await kv.put("after", sc.encode("2"));
    expect(sc.decode((await kv.get("before"))!.value)).toBe("1");
    expect(sc.decode((await kv.get("after"))!.value)).toBe("2");
  });
});
