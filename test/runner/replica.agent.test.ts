// The runner's connections to replicas: an idle keep-alive socket is dropped
// by the runner before the replica's server closes it (Node's 5 s, announced
// as `Keep-Alive: timeout=5`), so a run never goes out on a socket at the
// moment the replica closes it (EPIPE, seen by the fault suite under load);
// a request longer than the idle time is not cut.
import http from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, expect, it } from "vitest";
import { REPLICA_IDLE_CONNECTION_MS } from "../../services/runner/replica.js";
import { replicaAgent } from "../../services/runner/runner.js";

let server: http.Server;
let port: number;
const agent = replicaAgent();

beforeAll(async () => {
  // As the Cortex shim's server: Node's defaults (keepAliveTimeout 5 s).
  server = http.createServer((req, res) => {
    const ms = Number(new URL(req.url!, "http://x").searchParams.get("ms") ?? 0);
    setTimeout(() => res.end("ok"), ms);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  port = (server.address() as AddressInfo).port;
});
afterAll(async () => {
  agent.destroy();
  await new Promise((resolve) => server.close(resolve));
});

function get(path: string): Promise<{ status: number; reused: boolean; keepAlive?: string }> {
  return new Promise((resolve, reject) => {
    const req = http.get({ host: "127.0.0.1", port, path, agent }, (res) => {
      res.resume();
      res.on("end", () =>
        resolve({ status: res.statusCode!, reused: req.reusedSocket, keepAlive: String(res.headers["keep-alive"]) }),
      );
    });
    req.on("error", reject);
  });
}

const free = () => Object.values(agent.freeSockets).flat().length;

it("an idle socket leaves the pool before the server's keep-alive timeout; a busy one is reused and not cut", async () => {
  const first = await get("/");
  expect(first.keepAlive).toBe("timeout=5");
  expect(free()).toBe(1);
  // Reused while fresh.
  expect((await get("/")).reused).toBe(true);
  // Past the agent's idle time, still inside the server's 5 s: gone from the pool.
  await new Promise((r) => setTimeout(r, REPLICA_IDLE_CONNECTION_MS + 300));
  expect(free()).toBe(0);
  expect((await get("/")).reused).toBe(false);
  // A request that takes longer than the idle time is answered.
  expect((await get(`/?ms=${REPLICA_IDLE_CONNECTION_MS + 1_000}`)).status).toBe(200);
}, 30_000);
