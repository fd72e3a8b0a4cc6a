// A runner takes an app's sync requests over NATS from the moment its Runner
// has the app deployed (version() says so), not at the next look a period
// later. Before, the runner role noticed a finished deploy by polling every
// 250 ms: in between, a runner that had the app (and had published its
// replicas as ready) was not in the app's queue group, and a gateway whose
// request found no other runner answered 503 "no runner hosts app" at once.
// runner.stop-sync.test.ts failed so now and then, with a dozen fast 503s: its
// callers started as soon as both runners had the app, and their first calls
// found neither runner subscribed yet. Both tests below failed on every run
// before the fix (the second with 16 of 16 calls answered 503).
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { ErrorCode, NatsError } from "nats";
import { afterAll, beforeAll, expect, it, vi } from "vitest";
import { subjects } from "../../services/nats/layout.js";
import type { AppDeployment } from "../../services/runner/types.js";
import { cortexApp, deploy, P, post } from "../helpers/run-apps.js";
import { startTestRunner, startTestSkiff, type TestRunner, type TestSkiff } from "../helpers/skiff.js";

let gateway: TestSkiff;
let runner: TestRunner;
let tmp: string;

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-serves-deployed-"));
  gateway = await startTestSkiff({ env: { SKIFF_ROLES: "invocation,management" } });
  runner = await startTestRunner(gateway);
  const r = runner.skiff.runner!;
  const original = r.deploy.bind(r);
  vi.spyOn(r, "deploy").mockImplementation((d: AppDeployment) => {
    const done = original(d);
    const waiter = waiting.get(d.appName);
    if (waiter) done.then(waiter.resolve, waiter.reject);
    return done;
  });
}, 60_000);
afterAll(async () => {
  await runner?.close();
  await gateway?.close();
  await rm(tmp, { recursive: true, force: true });
});

/** Deploys of the runner that tests wait for, by app name. */
const waiting = new Map<string, { resolve(): void; reject(err: unknown): void }>();

/** Resolves once the runner's deploy of `appName` has switched to the new version. */
function deployed(appName: string): Promise<void> {
  return new Promise((resolve, reject) => waiting.set(appName, { resolve, reject }));
}

it("a runner is in the app's queue group as soon as it has deployed the app", async () => {
  const ready = deployed("served");
  await deploy(tmp, gateway.management(), cortexApp("served", { min_replicas: 1, max_replicas: 1 }));
  await ready;
  expect(runner.skiff.runner!.version(P, "served")).toBe(1);
  // Whatever the runner's connection has sent by now has reached the server.
  await runner.skiff.nats.nc.flush();
  // Any answer will do (this is no request frame): what must not come is "no responders".
  const asked = gateway.skiff.nats.nc.request(subjects.invoke(P, "served"), new Uint8Array(0), { timeout: 10_000 });
  await expect(asked.then(() => "answered")).resolves.toBe("answered");
}, 120_000);

it("calls made the moment a runner has deployed the app are answered by it, none with 503", async () => {
  const call = (app: string) => post(`${gateway.url}/v4/${P}/${app}/add`, gateway.devToken, '{"a":1,"b":2}');
  // A warm gateway (tokens checked, connections open) sends a call to NATS within a few milliseconds.
  for (let i = 0; i < 3; i++) await Promise.all(Array.from({ length: 16 }, () => call("missing")));
  const ready = deployed("called");
  await deploy(tmp, gateway.management(), cortexApp("called", { min_replicas: 1, max_replicas: 1 }));
  await ready;
  const answers = await Promise.all(Array.from({ length: 16 }, () => call("called")));
  expect(answers.filter((a) => a.status !== 200).map((a) => `${a.status} ${a.text}`)).toEqual([]);
}, 120_000);

it("a request that finds no runner is told so at once (what the first test must not see)", async () => {
  const asked = gateway.skiff.nats.nc.request(subjects.invoke(P, "nowhere"), new Uint8Array(0), { timeout: 10_000 });
  await expect(asked).rejects.toSatisfy((err) => err instanceof NatsError && err.code === ErrorCode.NoResponders);
});
