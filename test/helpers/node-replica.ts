// A replica of a Node app (its server.mjs given as text), unsandboxed, for
// the tests of the hop to a replica (services/runner/replica.ts): started in
// beforeAll, stopped and removed in afterAll.
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll } from "vitest";
import { silentLogger } from "../../services/config/logger.js";
import { freePort } from "../../services/runner/ports.js";
import { Replica } from "../../services/runner/replica.js";
import { replicaAgent } from "../../services/runner/runner.js";

export interface NodeReplica {
  /** Started by the file's beforeAll. */
  replica: Replica;
  /** The folder the app and its work folders are in. */
  tmp: string;
  /** The agent of its health and ready probes. */
  agent: ReturnType<typeof replicaAgent>;
}

/** Registers the hooks that start a replica of `app` (with `connections` pooled connections) and stop it. */
export function nodeReplicaForFile(app: string, appName: string, connections: number): NodeReplica {
  const held = { agent: replicaAgent() } as NodeReplica;
  beforeAll(async () => {
    held.tmp = await mkdtemp(path.join(tmpdir(), `skiff-${appName}-replica-`));
    const source = path.join(held.tmp, "app");
    await mkdir(source);
    await writeFile(path.join(source, "server.mjs"), app);
    held.replica = new Replica(
      {
        projectId: "p",
        appName,
        version: 1,
        replicaId: "r1",
        source,
        workDir: path.join(held.tmp, "work"),
        command: process.execPath,
        args: ["server.mjs"],
        env: {},
        port: await freePort(),
        healthcheck: "/health",
        startTimeoutMs: 20_000,
        connections,
      },
      { agent: held.agent, logger: silentLogger, onExit: () => undefined },
    );
    await held.replica.start();
  }, 30_000);
  afterAll(async () => {
    await held.replica?.stop(2_000);
    held.agent.destroy();
    await rm(held.tmp, { recursive: true, force: true });
  });
  return held;
}
