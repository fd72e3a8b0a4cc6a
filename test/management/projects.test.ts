// DeleteProject: admin only; it removes the project's apps (their replicas
// stop), service accounts (their tokens stop working) and secrets, and the
// project can be made again, empty.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { packApp } from "../../services/apps/bundle.js";
import { skiffToml, writeApp } from "../helpers/apps.js";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";

describe("DeleteProject", () => {
  let t: TestSkiff;
  let tmp: string;

  beforeAll(async () => {
    t = await startTestSkiff();
    tmp = await mkdtemp(path.join(tmpdir(), "skiff-projects-"));
  }, 60_000);
  afterAll(async () => {
    await t?.close();
    await rm(tmp, { recursive: true, force: true });
  });

  it("deletes the project with its apps, service accounts and secrets; a second DELETE is 404", async () => {
    expect((await t.api("POST", "/v2/projects", { project_id: "p-gone" })).status).toBe(200);
    const sa = await t.api("POST", "/v2/projects/p-gone/service-accounts", {
      name: "ci",
      expires_at: new Date(Date.now() + 86_400_000).toISOString(),
    });
    const token = sa.body.token as string;
    expect((await t.api("PUT", "/v2/projects/p-gone/secrets/A", { value: "1" })).status).toBe(200);
    expect((await t.api("PUT", "/v2/projects/p-gone/secrets/B", { value: "2" })).status).toBe(200);
    const dir = await writeApp(tmp, {
      "skiff.toml": skiffToml({
        name: "doomed",
        runtime: { kind: "cortex", language: "node", entry: "index.mjs" },
        scaling: { min_replicas: 1 },
      }),
      "index.mjs": "export function ping() { return 'pong'; }",
    });
    await t.management().deployApp({
      projectId: "p-gone",
      bundle: { contentType: "application/gzip", data: (await packApp(dir)).bytes },
    });
    await vi.waitUntil(() => t.skiff.runner!.version("p-gone", "doomed") === 1, { timeout: 60_000 });

    // A service account, even of the project itself, may not delete it.
    expect(await t.api("DELETE", "/v2/projects/p-gone", undefined, token)).toMatchObject({
      status: 403,
      body: { code: "permission_denied" },
    });
    const deleted = await t.api("DELETE", "/v2/projects/p-gone");
    expect([deleted.status, deleted.body]).toEqual([
      200,
      { apps_deleted: 1, service_accounts_deleted: 1, secrets_deleted: 2 },
    ]);
    expect(await t.api("DELETE", "/v2/projects/p-gone")).toMatchObject({ status: 404, body: { code: "not_found" } });
    expect((await t.api("GET", "/v2/projects/p-gone")).status).toBe(404);
    expect((await t.api("GET", "/v2/projects")).body.projects.map((p: any) => p.project_id)).not.toContain("p-gone");
    // Its token stops working; its replicas stop.
    expect((await t.api("GET", "/v2/identity", undefined, token)).status).toBe(401);
    await vi.waitUntil(() => t.skiff.runner!.version("p-gone", "doomed") === undefined, { timeout: 30_000 });

    // Made again, it is empty.
    expect((await t.api("POST", "/v2/projects", { project_id: "p-gone" })).status).toBe(200);
    expect((await t.api("GET", "/v2/projects/p-gone/apps")).body.apps ?? []).toEqual([]);
    expect((await t.api("GET", "/v2/projects/p-gone/secrets")).body.secrets).toEqual([]);
    expect((await t.api("GET", "/v2/projects/p-gone/service-accounts")).body.service_accounts ?? []).toEqual([]);
    expect((await t.api("DELETE", "/v2/projects/p-nope")).status).toBe(404);
    expect((await t.api("DELETE", "/v2/projects/NOT_AN_ID")).status).toBe(400);
  }, 120_000);
});
