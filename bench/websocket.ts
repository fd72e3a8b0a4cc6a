// WebSocket echo through skiff against the same app called directly: the
// ws-echo example (examples/ws-echo) as a Custom app of a skiff process
// (sandboxed replica, every role, its own NATS), and the same server.mjs
// listening on a port of its own. Measures the handshake (connect to open),
// the round trip of one 64-byte message on one connection, and messages per
// second over 32 connections each sending one message at a time; then the
// same through a second skiff process without a runner, whose connections
// travel over NATS to the first one's. The `ws` client is the load, in this
// process. Writes bench/results/websocket.json;
// the ratios are the result.
//
//   npx tsx bench/websocket.ts [--quick]     (or benchWebSocket(quick) from another bench)
import { spawn } from "node:child_process";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { performance } from "node:perf_hooks";
import WebSocket from "ws";
import { startNatsServer, type TestNats } from "../test/helpers/nats-server.js";
import { deployFolder } from "./deploy.js";
import { writeResults } from "./pipeline.js";
import { startSkiffProcess, type SkiffProcess } from "./skiff-process.js";
import { freePort, percentile, round, stop } from "./tools.js";

const CONNECTIONS = 32;
const EXAMPLE = path.resolve(import.meta.dirname, "..", "examples", "ws-echo");
const MESSAGE = "x".repeat(64);

function connect(url: string, token?: string): Promise<WebSocket> {
  const ws = new WebSocket(url, { headers: token ? { authorization: `Bearer ${token}` } : {} });
  return new Promise((resolve, reject) => {
    ws.once("open", () => resolve(ws));
    ws.once("error", reject);
    ws.once("unexpected-response", (_req, res) => reject(new Error(`handshake answered ${res.statusCode}`)));
  });
}

function echo(ws: WebSocket): Promise<void> {
  return new Promise((resolve) => {
    ws.once("message", () => resolve());
    ws.send(MESSAGE);
  });
}

function closeAll(sockets: WebSocket[]): Promise<unknown> {
  return Promise.all(sockets.map((ws) => new Promise((resolve) => (ws.once("close", resolve), ws.close(1000)))));
}

interface Figures {
  handshake_ms: { p50: number; p99: number };
  round_trip_ms: { p50: number; p99: number };
  messages_per_s_32: number;
}

async function measure(
  url: string,
  token: string | undefined,
  { HANDSHAKES, ROUND_TRIPS, SECONDS }: { HANDSHAKES: number; ROUND_TRIPS: number; SECONDS: number },
): Promise<Figures> {
  const handshakes: number[] = [];
  for (let i = 0; i < HANDSHAKES; i++) {
    const t0 = performance.now();
    const ws = await connect(url, token);
    handshakes.push(performance.now() - t0);
    await closeAll([ws]);
  }
  const ws = await connect(url, token);
  for (let i = 0; i < 200; i++) await echo(ws); // warm-up
  const trips: number[] = [];
  for (let i = 0; i < ROUND_TRIPS; i++) {
    const t0 = performance.now();
    await echo(ws);
    trips.push(performance.now() - t0);
  }
  await closeAll([ws]);
  const many = await Promise.all(Array.from({ length: CONNECTIONS }, () => connect(url, token)));
  let count = 0;
  const end = performance.now() + SECONDS * 1000;
  await Promise.all(
    many.map(async (c) => {
      while (performance.now() < end) {
        await echo(c);
        count++;
      }
    }),
  );
  await closeAll(many);
  return {
    handshake_ms: { p50: round(percentile(handshakes, 0.5), 3), p99: round(percentile(handshakes, 0.99), 3) },
    round_trip_ms: { p50: round(percentile(trips, 0.5), 3), p99: round(percentile(trips, 0.99), 3) },
    messages_per_s_32: Math.round(count / SECONDS),
  };
}

/** Runs the whole comparison, writes bench/results/websocket.json and returns what it wrote. */
export async function benchWebSocket(quick: boolean) {
  const ROUND_TRIPS = quick ? 2_000 : 10_000;
  const HANDSHAKES = quick ? 100 : 500;
  const SECONDS = quick ? 3 : 10;
  const sizes = { HANDSHAKES, ROUND_TRIPS, SECONDS };
  const tmp = await mkdtemp(path.join(tmpdir(), "skiff-bench-ws-"));
  let nats: TestNats | undefined;
  let skiff: SkiffProcess | undefined;
  let gateway: SkiffProcess | undefined;
  const port = await freePort();
  const direct = spawn(process.execPath, ["server.mjs"], {
    cwd: EXAMPLE,
    env: { PATH: process.env.PATH, PORT: String(port) },
    stdio: ["ignore", "pipe", "inherit"],
  });
  try {
    await new Promise((resolve) => direct.stdout!.once("data", resolve));
    nats = await startNatsServer();
    skiff = await startSkiffProcess({ natsUrl: nats.url, dataDir: path.join(tmp, "data") });
    const files = Object.fromEntries(
      await Promise.all(
        ["skiff.toml", "server.mjs"].map(async (f) => [f, await readFile(path.join(EXAMPLE, f), "utf8")] as const),
      ),
    );
    await deployFolder(skiff, tmp, files);
    const url = `${skiff.url.replace(/^http/, "ws")}/v4/p-dev/ws-echo/echo`;
    // The first handshake waits for the fresh deployment's replica.
    for (;;) {
      const ws = await connect(url, skiff.devToken).catch(() => undefined);
      if (ws) {
        await closeAll([ws]);
        break;
      }
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
    console.log("== direct");
    const bare = await measure(`ws://127.0.0.1:${port}/echo`, undefined, sizes);
    console.log(bare);
    console.log("== through skiff");
    const through = await measure(url, skiff.devToken, sizes);
    console.log(through);
    // A gateway without a runner: the handshake and the bytes go over NATS to the first process's runner.
    gateway = await startSkiffProcess({
      natsUrl: nats.url,
      dataDir: path.join(tmp, "gateway"),
      roles: "invocation",
      env: { SKIFF_ADMIN_TOKEN: skiff.adminToken },
    });
    console.log("== through a gateway without a runner (over NATS)");
    const remote = await measure(`${gateway.url.replace(/^http/, "ws")}/v4/p-dev/ws-echo/echo`, skiff.devToken, sizes);
    console.log(remote);
    const results = {
      quick,
      round_trips: ROUND_TRIPS,
      connections: CONNECTIONS,
      seconds: SECONDS,
      direct: bare,
      skiff: through,
      skiff_over_nats: remote,
      ratios: {
        round_trip_p50: round(through.round_trip_ms.p50 / bare.round_trip_ms.p50),
        round_trip_p99: round(through.round_trip_ms.p99 / bare.round_trip_ms.p99),
        handshake_p50: round(through.handshake_ms.p50 / bare.handshake_ms.p50),
        messages_per_s_32: round(through.messages_per_s_32 / bare.messages_per_s_32),
        over_nats_round_trip_p50: round(remote.round_trip_ms.p50 / bare.round_trip_ms.p50),
        over_nats_messages_per_s_32: round(remote.messages_per_s_32 / bare.messages_per_s_32),
      },
    };
    const file = await writeResults("websocket.json", results);
    console.log(`\n${JSON.stringify(results.ratios, null, 2)}\nwritten to ${path.relative(process.cwd(), file)}`);
    return results;
  } finally {
    await stop(direct);
    await gateway?.stop();
    await skiff?.stop();
    await nats?.stop();
    await rm(tmp, { recursive: true, force: true });
  }
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href)
  await benchWebSocket(process.argv.includes("--quick"));
