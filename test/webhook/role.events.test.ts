import { execFile } from "node:child_process";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import type { NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { silentLogger } from "../../services/config/logger.js";
import { connectNats, provision } from "../../services/nats/index.js";
import { publishRunEvent, terminalEvent } from "../helpers/webhook-events.js";
import { startProvisionedNats } from "../helpers/nats-server.js";

const run = promisify(execFile);

describe("public run events", () => {
  let server: Awaited<ReturnType<typeof startProvisionedNats>>;
  let nc: NatsConnection;
  beforeAll(async () => {
    server = await startProvisionedNats();
    nc = server.nc;
  });
  afterAll(async () => {
    await server?.stop();
  });

  test("events - the example consumer decodes a published RunEvent and prints its run id and status", async () => {
    const other = terminalEvent("", "{}", { projectId: "p-other" });
    const event = terminalEvent("", "{}", { projectId: "p-dev", status: "failure", error: undefined });
    await publishRunEvent(nc, other);
    await publishRunEvent(nc, event);
    const { stdout } = await run(
      process.execPath,
      [
        "--import",
        "tsx",
        "examples/event-consumer/consume.ts",
        "--subject",
        "skiff.events.runs.p-dev.>",
        "--from-start",
        "--max",
        "1",
      ],
      {
        env: { ...process.env, SKIFF_NATS_URL: server.nats.url },
        timeout: 60_000,
      },
    );
    const lines = stdout.trim().split("\n");
    expect(lines).toHaveLength(1);
    expect(lines[0]).toContain(`${event.runId} p-dev/hello/predict failure async`);
    expect(stdout).not.toContain(other.runId);
  });
});

describe("the example consumer and the nats-server that skiff starts", () => {
  test("events - without SKIFF_NATS_URL it finds the data folder's server and its nkey, as README's npm start makes them", async () => {
    const dataDir = await mkdtemp(path.join(tmpdir(), "skiff-consumer-"));
    // As `npm start` without SKIFF_NATS_URL: a nats-server of the data folder's own, admitting only its nkey.
    const handle = await connectNats({ dataDir, logger: silentLogger });
    try {
      expect(handle.embedded).toBe(true);
      await provision(handle.nc, silentLogger);
      const event = terminalEvent("", "{}", { projectId: "p-dev" });
      await publishRunEvent(handle.nc, event);
      const consume = (env: NodeJS.ProcessEnv) =>
        run(process.execPath, ["--import", "tsx", "examples/event-consumer/consume.ts", "--from-start", "--max", "1"], {
          env: { ...process.env, SKIFF_NATS_URL: "", ...env },
          timeout: 60_000,
        });
      const { stdout } = await consume({ SKIFF_DATA_DIR: dataDir });
      expect(stdout).toContain(`${event.runId} p-dev/hello/predict success async`);
      // No such server: a sentence saying where it looked and what to set, not a connection error.
      const empty = await mkdtemp(path.join(tmpdir(), "skiff-consumer-none-"));
      try {
        await expect(consume({ SKIFF_DATA_DIR: empty })).rejects.toMatchObject({
          stderr: expect.stringContaining(`no nats-server started by skiff runs from ${path.join(empty, "nats")}`),
        });
      } finally {
        await rm(empty, { recursive: true, force: true });
      }
    } finally {
      await handle.close();
      await rm(dataDir, { recursive: true, force: true });
    }
  });
});

describe("events documentation", () => {
  test("events - EVENTS.md shows the RunEvent schema and the Python verifier exactly as they are in the repository", async () => {
    const doc = await readFile("services/webhook/EVENTS.md", "utf8");
    const proto = await readFile("proto/skiff/events/v1/events.proto", "utf8");
    const python = await readFile("examples/webhook-receiver/verify_webhook.py", "utf8");
    expect(doc).toContain(proto.slice(proto.indexOf("message RunEvent {")).trimEnd());
    expect(doc).toContain(python.slice(python.indexOf("def verify_webhook")).trimEnd());
    expect(doc).toContain("npx tsx examples/event-consumer/consume.ts");
  });
});
