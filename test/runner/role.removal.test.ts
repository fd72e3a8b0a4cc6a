// A deleted app's replicas stop even when its deletion comes while the runner
// is deploying it again for a secret change. The runner role used to forget
// an app it was about to replace: a secret set marked the app for redeploy by
// dropping it from what the role had deployed, so when the app's record (or
// its whole project) was deleted before the redeploy got to the runner, the
// redeploy gave up (no record) and the deletion found nothing to remove: the
// replicas ran on, for good (the CI failure of test/management/projects.test.ts,
// where the project's secrets were set just before its app was deployed).
// Here the redeploy is held in its prepare step until the deletion is seen.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, afterEach, beforeAll, expect, it, vi } from "vitest";
import { packApp } from "../../services/apps/bundle.js";
import { DeploymentCache } from "../../services/runner/deployment-cache.js";
import { writeApp } from "../helpers/apps.js";
import { cortexApp, post } from "../helpers/run-apps.js";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";

let t: TestSkiff;
let tmp: string;

beforeAll(async () => {
  t = await startTestSkiff();
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-role-removal-"));
}, 60_000);
afterAll(async () => {
  await t?.close();
  await rm(tmp, { recursive: true, force: true });
});
afterEach(() => vi.restoreAllMocks());

/** Holds every prepare step of the runner from now until the returned release() is called. */
function holdPrepares(): { entered: Promise<void>; release(): void } {
  let entered!: () => void;
  let release!: () => void;
  const gate = new Promise<void>((resolve) => (release = resolve));
  const original = DeploymentCache.prototype.get;
  vi.spyOn(DeploymentCache.prototype, "get").mockImplementation(async function (this: DeploymentCache, ...args) {
    entered();
    await gate;
    return original.apply(this, args);
  });
  return { entered: new Promise((resolve) => (entered = resolve)), release };
}

async function deployRunning(projectId: string, appName: string): Promise<void> {
  const dir = await writeApp(tmp, cortexApp(appName, { min_replicas: 1, max_replicas: 1 }));
  await t.management().deployApp({
    projectId,
    bundle: { contentType: "application/gzip", data: (await packApp(dir)).bytes },
  });
  const runner = t.skiff.runner!;
  await vi.waitUntil(
    () =>
      runner.version(projectId, appName) === 1 && runner.replicas(projectId, appName).some((r) => r.state === "ready"),
    { timeout: 60_000, interval: 50 },
  );
}

/** Until the process's registry no longer has the app: its calls are 404 (the view first, then KV). */
async function untilUnknown(projectId: string, appName: string): Promise<void> {
  await vi.waitUntil(
    async () => (await post(`${t.url}/v4/${projectId}/${appName}/add`, t.adminToken, '{"a":1,"b":2}')).status === 404,
    { timeout: 20_000, interval: 50 },
  );
}

it("an app deleted while a secret change is redeploying it: its replicas stop", async () => {
  await deployRunning("p-dev", "resecreted");
  const held = holdPrepares();
  expect((await t.api("PUT", "/v2/projects/p-dev/secrets/ROTATED", { value: "1" })).status).toBe(200);
  await held.entered;
  await t.management().deleteApp({ projectId: "p-dev", appName: "resecreted" });
  await untilUnknown("p-dev", "resecreted");
  held.release();
  await vi.waitUntil(() => t.skiff.runner!.replicas("p-dev", "resecreted").length === 0, {
    timeout: 30_000,
    interval: 50,
  });
  expect(t.skiff.runner!.version("p-dev", "resecreted")).toBeUndefined();
  await t.api("DELETE", "/v2/projects/p-dev/secrets/ROTATED");
}, 120_000);

it("a project deleted while a secret change is redeploying its app: the app's replicas stop", async () => {
  expect((await t.api("POST", "/v2/projects", { project_id: "p-held" })).status).toBe(200);
  await deployRunning("p-held", "doomed");
  const held = holdPrepares();
  expect((await t.api("PUT", "/v2/projects/p-held/secrets/A", { value: "1" })).status).toBe(200);
  await held.entered;
  expect(await t.api("DELETE", "/v2/projects/p-held")).toMatchObject({ status: 200 });
  await untilUnknown("p-held", "doomed");
  held.release();
  await vi.waitUntil(() => t.skiff.runner!.replicas("p-held", "doomed").length === 0, {
    timeout: 30_000,
    interval: 50,
  });
  expect(t.skiff.runner!.version("p-held", "doomed")).toBeUndefined();
}, 120_000);
