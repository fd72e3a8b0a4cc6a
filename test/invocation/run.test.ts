// InvocationService.Run and RunStream, in-process through connect-es's router
// transport, against a fake runner (our HostedRunner) behind the in-process
// runner client: no nats-server. Sync answers whole and streamed, the run
// recorded once it ended, runner errors as RPC codes (and the HTTP statuses
// they map to), the wait for a fresh deploy, and NoRunner when no runner
// hosts the app.
import { Code, ConnectError, createClient, createRouterTransport } from "@connectrpc/connect";
import { afterEach, describe, expect, it, vi } from "vitest";
import { InvocationService } from "../../gen/skiff/invocation/v4/invocation_pb.js";
import type { AppRecord } from "../../services/apps/index.js";
import { silentLogger } from "../../services/config/logger.js";
import type { InvocationDeps } from "../../services/invocation/deps.js";
import { routes } from "../../services/invocation/routes.js";
import { runnerClient } from "../../services/runner-client/index.js";
import { RunControl, type RunOutcome, type RunRecord } from "../../services/runs/index.js";
import { codeHttpStatus } from "../../services/server/index.js";
import { AddressGuard } from "../../services/webhooks/index.js";
import { answer, appRecord, ERRORS, FakeRunner, PROJECT, streamedAnswer } from "../helpers/fake-runner.js";

/**
 * The handles only queued runs and webhooks use (NATS, KV, the object
 * store): no call in this file queues a run or names a webhook, and one that
 * did would fail on them.
 */
const QUEUE_ONLY = {
  nc: undefined,
  js: undefined,
  queueDepths: undefined,
  runs: undefined,
  results: undefined,
  transfer: undefined,
  secrets: undefined,
  box: undefined,
  idempotency: undefined,
  maxQueuedRuns: 0,
} as unknown as Omit<InvocationDeps, "registry" | "runners" | "syncRuns" | "control" | "guard" | "logger">;

interface Recorded {
  running: RunRecord[];
  finished: { record: RunRecord; outcome: RunOutcome }[];
}

function setUp(apps: AppRecord[], runner: FakeRunner) {
  const recorded: Recorded = { running: [], finished: [] };
  const find = (projectId: string, appName: string) =>
    apps.find((a) => a.project_id === projectId && a.app_name === appName);
  const deps: InvocationDeps = {
    ...QUEUE_ONLY,
    registry: { get: find, lookup: async (projectId, appName) => find(projectId, appName) },
    runners: runnerClient({ local: runner }),
    syncRuns: {
      running: (record) => recorded.running.push(record),
      finished: (record, outcome) => recorded.finished.push({ record, outcome }),
    },
    control: new RunControl(),
    guard: new AddressGuard(),
    logger: silentLogger,
  };
  const client = createClient(
    InvocationService,
    createRouterTransport((router) => routes(router, deps)),
  );
  const finished = (runId: string) =>
    vi.waitUntil(() => recorded.finished.find((f) => f.record.run_id === runId), { timeout: 30_000 });
  return { client, recorded, finished };
}

const text = (data: Uint8Array | undefined) => new TextDecoder().decode(data);
const body = (s: string) => ({ contentType: "text/plain", data: new TextEncoder().encode(s) });

afterEach(() => vi.useRealTimers());

describe("invocation - Run against a fake runner, in-process", () => {
  it("a sync call reaches the runner with its path, query-free headers and body; the answer comes back whole and the run is recorded once", async () => {
    const runner = new FakeRunner()
      .host("app")
      .on("/echo", async (req) => answer(201, req.body, { "x-app": "yes", "content-type": "text/csv" }));
    const { client, recorded, finished } = setUp([appRecord("app")], runner);
    let header: Headers | undefined;
    const res = await client.run(
      { projectId: PROJECT, appName: "app", path: "echo", body: body("hi") },
      { onHeader: (h) => (header = h) },
    );
    expect(res).toMatchObject({ statusCode: 201, headers: { "x-app": "yes" } });
    expect(res.body).toMatchObject({ contentType: "text/csv" });
    expect(text(res.body?.data)).toBe("hi");
    expect(header?.get("x-request-id")).toBe(res.runId);
    expect(header?.get("x-app")).toBe("yes");
    expect(runner.calls.at(-1)).toMatchObject({ runId: res.runId, method: "POST", path: "/echo" });
    const { record, outcome } = await finished(res.runId);
    expect(record).toMatchObject({ run_id: res.runId, app_name: "app", status: "running", async: false });
    expect(outcome).toMatchObject({ status: "success", statusCode: 201 });
    expect(recorded.running).toEqual([]); // a run that ends within a second is written once
  });

  it("a streamed answer reaches a RunStream caller as its head, then its chunks; Run gets it whole", async () => {
    const runner = new FakeRunner().host("app").on("/ticks", async () => {
      const { stream } = streamedAnswer(async function* () {
        for (let i = 1; i <= 3; i++) yield new TextEncoder().encode(`tick ${i}\n`);
      });
      return { ...answer(200, "", { "content-type": "text/event-stream" }), stream };
    });
    const { client, finished } = setUp([appRecord("app")], runner);
    const parts: string[] = [];
    let runId = "";
    for await (const m of client.runStream({ projectId: PROJECT, appName: "app", path: "ticks" })) {
      if (m.part.case === "head") {
        runId = m.part.value.runId;
        expect(m.part.value).toMatchObject({ statusCode: 200, body: { contentType: "text/event-stream" } });
      } else if (m.part.case === "chunk") parts.push(text(m.part.value));
    }
    expect(parts).toEqual(["tick 1\n", "tick 2\n", "tick 3\n"]);
    expect((await finished(runId)).outcome).toMatchObject({ status: "success", responseBytes: 21 });

    const whole = await client.run({ projectId: PROJECT, appName: "app", path: "ticks" });
    expect(text(whole.body?.data)).toBe("tick 1\ntick 2\ntick 3\n");
  });

  it("a RunStream caller that goes away cancels the app's answer; the run ends cancelled", async () => {
    let cancelled: Promise<void> | undefined;
    const runner = new FakeRunner().host("app").on("/forever", async (req) => {
      const made = streamedAnswer(async function* () {
        for (;;) {
          yield new Uint8Array(10);
          await new Promise((resolve) => setTimeout(resolve, 10));
        }
      });
      cancelled = made.cancelled;
      // As the runner's pool does: the run's signal stops its answer.
      req.signal?.addEventListener("abort", () => made.stream.cancel(), { once: true });
      return { ...answer(200, ""), stream: made.stream };
    });
    const { client, finished } = setUp([appRecord("app")], runner);
    let runId = "";
    const gone = new AbortController();
    const call = client.runStream({ projectId: PROJECT, appName: "app", path: "forever" }, { signal: gone.signal });
    await expect(
      (async () => {
        for await (const m of call) {
          if (m.part.case === "head") runId = m.part.value.runId;
          if (m.part.case === "chunk") gone.abort();
        }
      })(),
    ).rejects.toThrow();
    await cancelled;
    expect((await finished(runId)).outcome).toMatchObject({ status: "cancelled" });
  });

  it.each([
    ["overloaded", ERRORS.overloaded, Code.ResourceExhausted, 429, "failure"],
    ["past response_grace_period", ERRORS.timeout, Code.DeadlineExceeded, 504, "failure"],
    ["its replica crashed", ERRORS.crashed, Code.Unavailable, 503, "failure"],
  ])(
    "a runner whose app is %s: the RPC code and HTTP status say so, and the run is recorded",
    async (_n, error, code, http, status) => {
      const runner = new FakeRunner().host("app").on("/x", () => Promise.reject(error()));
      const { client, finished } = setUp([appRecord("app")], runner);
      let header: Headers | undefined;
      const err = await client
        .run({ projectId: PROJECT, appName: "app", path: "x" }, { onHeader: (h) => (header = h) })
        .catch((e: unknown) => ConnectError.from(e));
      expect(err).toBeInstanceOf(ConnectError);
      expect((err as ConnectError).code).toBe(code);
      expect(codeHttpStatus((err as ConnectError).code)).toBe(http);
      const runId = header?.get("x-request-id") ?? (err as ConnectError).metadata.get("x-request-id");
      expect(runId).toBeTruthy();
      expect((await finished(runId!)).outcome).toMatchObject({ status });
    },
  );

  it("no runner hosts the app (this process's runner does not, and there is no other): 503 no_runner", async () => {
    const { client, recorded } = setUp([appRecord("app")], new FakeRunner());
    const err = await client
      .run({ projectId: PROJECT, appName: "app", path: "x" })
      .catch((e: unknown) => ConnectError.from(e));
    expect(err).toMatchObject({ code: Code.Unavailable, rawMessage: `no runner hosts app ${PROJECT}/app right now` });
    await vi.waitUntil(() => recorded.finished.length === 1);
    expect(recorded.finished[0].outcome).toMatchObject({ status: "failure", error: { type: "no_runner" } });
  });

  it("an unknown app is 404 before any run; the runner is never asked", async () => {
    const runner = new FakeRunner().host("app");
    const { client, recorded } = setUp([appRecord("app")], runner);
    const err = await client
      .run({ projectId: PROJECT, appName: "nope", path: "x" })
      .catch((e: unknown) => ConnectError.from(e));
    expect(err).toMatchObject({ code: Code.NotFound });
    expect(runner.calls).toEqual([]);
    expect(recorded.finished).toEqual([]);
  });

  it("a Cortex call without a function, or with a stray slash, is 404 listing the functions there are", async () => {
    const runner = new FakeRunner().host("fns");
    const { client } = setUp([appRecord("fns", { cortex: ["predict", "stats"] })], runner);
    const refusal = (path: string) =>
      client
        .run({ projectId: PROJECT, appName: "fns", path, body: body("{}") })
        .catch((e: unknown) => ConnectError.from(e));
    expect(await refusal("")).toMatchObject({
      code: Code.NotFound,
      rawMessage: `app fns is a Cortex app: name the function to call one as /v4/${PROJECT}/fns/<function>; its functions: predict, stats`,
    });
    expect(await refusal("predict/")).toMatchObject({
      code: Code.NotFound,
      rawMessage: 'app fns has no public function "predict/"; its functions: predict, stats',
    });
    expect(runner.calls).toEqual([]);
  });

  it("a Cortex call whose body is not JSON is 400 saying where it broke, never quoting the body", async () => {
    const runner = new FakeRunner().host("fns");
    const { client, recorded } = setUp([appRecord("fns", { cortex: ["predict"] })], runner);
    const err = await client
      .run({ projectId: PROJECT, appName: "fns", path: "predict", body: body('{"token": sk_live_5f}') })
      .catch((e: unknown) => ConnectError.from(e));
    expect(err).toBeInstanceOf(ConnectError);
    expect((err as ConnectError).code).toBe(Code.InvalidArgument);
    expect((err as ConnectError).rawMessage).toMatch(/^malformed JSON body: not valid JSON( \(at position \d+\))?$/);
    // A form (curl -d without a type): said what it was sent as, and what to send.
    const form = await client
      .run({
        projectId: PROJECT,
        appName: "fns",
        path: "predict",
        body: { contentType: "application/x-www-form-urlencoded", data: new TextEncoder().encode("name=Ada") },
      })
      .catch((e: unknown) => ConnectError.from(e));
    expect((form as ConnectError).rawMessage).toMatch(
      /^malformed JSON body: not valid JSON( \(at position \d+\))? \(it was sent as application\/x-www-form-urlencoded; a Cortex function takes a JSON object of its arguments: send Content-Type: application\/json\)$/,
    );
    expect(runner.calls).toEqual([]);
    expect(recorded.finished).toEqual([]);
  });

  it("right after a deploy, a call waits for this process's runner to have the new version", async () => {
    const runner = new FakeRunner().host("app", 1).on("/v", async () => answer(200, "served"));
    const fresh = appRecord("app", { version: 2, createdAt: new Date().toISOString() });
    const { client } = setUp([fresh], runner);
    const call = client.run({ projectId: PROJECT, appName: "app", path: "v" });
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(runner.calls).toEqual([]);
    runner.host("app", 2);
    expect(text((await call).body?.data)).toBe("served");
  });
});
