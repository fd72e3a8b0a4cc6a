// Streams end with their credentials: an open WatchRuns stream stops with
// `unauthenticated` once its service account is deleted or its token
// expires, while an admin's stream and a valid token's keep going.
import { Code, ConnectError } from "@connectrpc/connect";
import { v7 } from "uuid";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { publishRunEvent } from "../../services/runs/events.js";
import { cortexApp, deploy } from "../helpers/run-apps.js";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";

const P = "p-dev";

describe("streams end with their credentials", () => {
  let t: TestSkiff;

  beforeAll(async () => {
    t = await startTestSkiff();
  });
  afterAll(() => t?.close());

  /** Publishes a run's event as a gateway would, so that an open WatchRuns stream has something to send. */
  async function writeRun(app: string): Promise<string> {
    const runId = v7();
    await publishRunEvent(t.skiff.nats.nc, {
      run_id: runId,
      project_id: P,
      app_name: app,
      path: "run",
      async: true,
      status: "queued",
      queued_at: new Date().toISOString(),
      attempts: 0,
    });
    return runId;
  }

  async function serviceAccount(expiresAt: Date): Promise<{ id: string; token: string }> {
    const made = await t.management().createServiceAccount({
      projectId: P,
      name: "watcher",
      expiresAt: { seconds: BigInt(Math.floor(expiresAt.getTime() / 1000)), nanos: 0 },
    });
    return { id: made.serviceAccount!.serviceAccountId, token: made.token };
  }

  /** Opens WatchRuns, waits for one run to come through, then lets `after` act; resolves with how the stream ended. */
  async function watchThen(token: string, after: () => Promise<unknown>): Promise<ConnectError | "still open"> {
    const controller = new AbortController();
    const stream = t.management(token).watchRuns({ projectId: P, appName: "" }, { signal: controller.signal });
    const it = stream[Symbol.asyncIterator]();
    const first = it.next();
    // The server subscribes once the call arrives; write until a run comes through.
    let seen = false;
    void (async () => {
      while (!seen) {
        await writeRun("watched");
        await new Promise((r) => setTimeout(r, 100));
      }
    })();
    expect((await first).done).toBe(false);
    seen = true;
    await after();
    const ended = (async () => {
      try {
        for (;;) if ((await it.next()).done) return new ConnectError("ended without an error", Code.Unknown);
      } catch (err) {
        return ConnectError.from(err);
      }
    })();
    const outcome = await Promise.race([
      ended,
      new Promise<"still open">((r) => setTimeout(() => r("still open"), 3000)),
    ]);
    controller.abort();
    return outcome;
  }

  it("a service account deleted while its WatchRuns stream is open: the stream ends with unauthenticated", async () => {
    const sa = await serviceAccount(new Date(Date.now() + 3600_000));
    const outcome = await watchThen(sa.token, () =>
      t.management().deleteServiceAccount({ projectId: P, serviceAccountId: sa.id }),
    );
    expect(outcome).toBeInstanceOf(ConnectError);
    expect((outcome as ConnectError).code).toBe(Code.Unauthenticated);
  });

  it("a token that expires while its stream is open: the stream ends with unauthenticated", async () => {
    const sa = await serviceAccount(new Date(Date.now() + 2500));
    const outcome = await watchThen(sa.token, () => new Promise((r) => setTimeout(r, 2600)));
    expect(outcome).toBeInstanceOf(ConnectError);
    expect((outcome as ConnectError).code).toBe(Code.Unauthenticated);
  });

  it("a service account deleted while its TailAppLogs stream is open: the stream ends with unauthenticated", async () => {
    const dir = await mkdtemp(path.join(tmpdir(), "skiff-tail-"));
    try {
      await deploy(dir, t.management(), cortexApp("tailed", { max_replicas: 1 }));
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
    const sa = await serviceAccount(new Date(Date.now() + 3600_000));
    const controller = new AbortController();
    const it = t
      .management(sa.token)
      .tailAppLogs({ projectId: P, appName: "tailed" }, { signal: controller.signal })
      [Symbol.asyncIterator]();
    const ended = (async () => {
      try {
        for (;;) if ((await it.next()).done) return "ended without an error";
      } catch (err) {
        return ConnectError.from(err);
      }
    })();
    // Open and quiet: nothing ends it until the account goes.
    expect(await Promise.race([ended, new Promise((r) => setTimeout(() => r("still open"), 1000))])).toBe("still open");
    await t.management().deleteServiceAccount({ projectId: P, serviceAccountId: sa.id });
    const outcome = await Promise.race([ended, new Promise((r) => setTimeout(() => r("still open"), 3000))]);
    controller.abort();
    expect(outcome).toBeInstanceOf(ConnectError);
    expect((outcome as ConnectError).code).toBe(Code.Unauthenticated);
  });

  it("a valid token's stream and an admin's stay open (the checks end only revoked ones)", async () => {
    const sa = await serviceAccount(new Date(Date.now() + 3600_000));
    expect(await watchThen(sa.token, async () => undefined)).toBe("still open");
    expect(await watchThen(t.adminToken, async () => undefined)).toBe("still open");
  });
});
