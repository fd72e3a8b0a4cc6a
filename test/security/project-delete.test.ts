// DeleteProject attacked: a project token calling it (on its own project or
// another); and what a deleted project leaves behind for whoever gets its id
// next (an admin re-creating `p-reuse` for another tenant): its tokens, its
// secrets, its persistent storage, and above all the async runs still queued
// for its apps, which must not be run by the next app of that name. Real
// skiff, real sandbox, real nats-server.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { Code, ConnectError } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { packApp } from "../../services/apps/bundle.js";
import { streams } from "../../services/nats/layout.js";
import { skiffToml, writeApp } from "../helpers/apps.js";
import { post } from "../helpers/run-apps.js";
import { projectWithToken, startTestSkiff, type TestSkiff } from "../helpers/skiff.js";

const PROJECT = "p-reuse";

/** The first tenant's app: holds its only replica, takes notes. The second tenant's is the same code. */
const INDEX = [
  "const seen = [];",
  "export async function hold({ ms }) { await new Promise((r) => setTimeout(r, ms)); return 'held'; }",
  "export function note(args) { console.log('note', JSON.stringify(args)); seen.push(args); return 'noted'; }",
  "export function seenNotes() { return seen; }",
].join("\n");

describe("DeleteProject", () => {
  let t: TestSkiff;
  let tmp: string;
  let tenantToken: string;

  const rest = async (method: string, p: string, token: string, body?: unknown) => {
    const res = await fetch(t.url + p, {
      method,
      headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    return { status: res.status, text };
  };

  const createProject = () => projectWithToken(t, PROJECT);

  const deployApp = async (token: string) => {
    const dir = await writeApp(tmp, {
      "skiff.toml": skiffToml({
        name: "notes",
        runtime: { kind: "cortex", language: "node", entry: "index.mjs" },
        scaling: { min_replicas: 1, max_replicas: 1, replica_concurrency: 1 },
      }),
      "index.mjs": INDEX,
    });
    await t.management(token).deployApp({
      projectId: PROJECT,
      bundle: { contentType: "application/gzip", data: (await packApp(dir)).bytes },
    });
  };

  /** Messages of the project still in SKIFF_RUNS. */
  const queuedOf = async (projectId: string) => {
    const jsm = await t.skiff.nats.nc.jetstreamManager();
    const info = await jsm.streams.info(streams.runs.name, { subjects_filter: `skiff.runs.queue.${projectId}.>` });
    return Object.values(info.state.subjects ?? {}).reduce((a, b) => a + b, 0);
  };

  beforeAll(async () => {
    tmp = await mkdtemp(path.join(tmpdir(), "skiff-delete-"));
    t = await startTestSkiff();
    tenantToken = await createProject();
    await deployApp(tenantToken);
  }, 120_000);
  afterAll(async () => {
    await t?.close();
    await rm(tmp, { recursive: true, force: true });
  });

  it("a project token cannot delete its own project or another, over REST or Connect", async () => {
    for (const target of [PROJECT, "p-dev"]) {
      const answer = await rest("DELETE", `/v2/projects/${target}`, tenantToken);
      expect(answer.status, answer.text).toBe(403);
      const err = await t
        .management(tenantToken)
        .deleteProject({ projectId: target })
        .catch((e: unknown) => e);
      expect(err).toBeInstanceOf(ConnectError);
      expect((err as ConnectError).code).toBe(Code.PermissionDenied);
    }
    // p-dev's token on p-reuse, likewise.
    expect((await rest("DELETE", `/v2/projects/${PROJECT}`, t.devToken)).status).toBe(403);
    expect((await rest("GET", `/v2/projects/${PROJECT}`, tenantToken)).status).toBe(200);
    expect((await rest("GET", `/v2/projects/p-dev/apps`, tenantToken)).status).toBe(403);
    expect((await rest("GET", `/v2/projects/p-dev`, tenantToken)).status).toBe(403);
    // Creating one (even under a free id) is the admin's too.
    expect((await rest("POST", `/v2/projects`, tenantToken, { project_id: "p-mine" })).status).toBe(403);
  });

  it("the async runs queued for a deleted project's apps are not run by the next app of that name", async () => {
    // The only replica is busy; runs queue behind it.
    // A run of the first tenant that ends, and prints (its log line and record are the first tenant's).
    const done = await post(`${t.url}/v4/${PROJECT}/notes/note`, tenantToken, '{"mark":"first-tenant-done"}');
    expect(done.status, done.text).toBe(200);
    const oldRun = done.json.run_id as string;
    await new Promise((r) => setTimeout(r, 1_000));
    const holding = post(`${t.url}/v4/${PROJECT}/notes/hold`, tenantToken, '{"ms":6000}');
    await new Promise((r) => setTimeout(r, 500));
    const keyed = await post(`${t.url}/v4/${PROJECT}/notes/note?async=true`, tenantToken, '{"mark":"first-tenant-k"}', {
      "idempotency-key": "order-1",
    });
    expect(keyed.status, keyed.text).toBe(202);
    for (let i = 0; i < 4; i++) {
      const accepted = await post(
        `${t.url}/v4/${PROJECT}/notes/note?async=true`,
        tenantToken,
        JSON.stringify({ mark: `first-tenant-${i}` }),
      );
      expect(accepted.status, accepted.text).toBe(202);
    }
    await rest("PUT", `/v2/projects/${PROJECT}/secrets/API_KEY`, tenantToken, { value: "first-tenant-key" });

    const deleted = await rest("DELETE", `/v2/projects/${PROJECT}`, t.adminToken);
    expect(deleted.status, deleted.text).toBe(200);
    await holding.catch(() => undefined);
    // The deleted project's token is refused at once.
    expect((await rest("GET", `/v2/projects/${PROJECT}/apps`, tenantToken)).status).toBe(401);
    // Nothing of the project stays queued.
    await vi.waitUntil(async () => (await queuedOf(PROJECT)) === 0, { timeout: 10_000, interval: 250 });

    // Another tenant gets the id, and an app of the same name.
    const second = await createProject();
    expect((await rest("GET", `/v2/projects/${PROJECT}/secrets`, second)).text).not.toContain("API_KEY");
    await deployApp(second);
    await new Promise((r) => setTimeout(r, 3_000));
    // The second tenant's call with an Idempotency-Key the first used is a run of its own, and runs.
    const again = await post(`${t.url}/v4/${PROJECT}/notes/note?async=true`, second, '{"mark":"second-tenant-k"}', {
      "idempotency-key": "order-1",
    });
    expect(again.status, again.text).toBe(202);
    expect(again.json.run_id).not.toBe(keyed.json.run_id);
    await vi.waitUntil(
      async () => (await post(`${t.url}/v4/${PROJECT}/notes/seenNotes`, second, "{}")).text.includes("second-tenant-k"),
      { timeout: 20_000, interval: 250 },
    );
    const seen = await post(`${t.url}/v4/${PROJECT}/notes/seenNotes`, second, "{}");
    expect(seen.status, seen.text).toBe(200);
    expect(seen.text).not.toContain("first-tenant");
    // Nothing left queued once the second tenant's run is acknowledged (its note is seen a moment before).
    await vi.waitUntil(async () => (await queuedOf(PROJECT)) === 0, { timeout: 10_000, interval: 250 });
    // The first tenant's runs, their results and its app's log are not the second's.
    const paths = async () =>
      JSON.parse((await rest("GET", `/v2/projects/${PROJECT}/apps/notes/runs`, second)).text).runs.map(
        (r: { path: string }) => r.path,
      );
    // The second tenant's own run, once the history has it.
    await vi.waitUntil(async () => (await paths()).includes("seenNotes"), { timeout: 10_000, interval: 200 });
    expect((await paths()).filter((p: string) => p !== "seenNotes")).toEqual(["note"]);
    const all = await rest("GET", `/v2/projects/${PROJECT}/apps/-/runs`, second);
    expect(JSON.stringify(JSON.parse(all.text).runs)).not.toContain(oldRun);
    expect(JSON.stringify(JSON.parse(all.text).runs)).not.toContain(keyed.json.run_id);
    const old = await rest("GET", `/v2/projects/${PROJECT}/apps/notes/runs/${oldRun}`, second);
    expect(old.status, old.text).toBe(404);
    const logs = await rest("GET", `/v2/projects/${PROJECT}/apps/notes/logs`, second);
    expect(logs.status, logs.text).toBe(200);
    expect(logs.text).not.toContain("first-tenant");
    const stats = await rest("GET", `/v2/projects/${PROJECT}/apps/notes/stats`, second);
    expect(stats.status, stats.text).toBe(200);
    const counted = JSON.parse(stats.text).buckets.reduce((n: number, b: { runs?: number }) => n + (b.runs ?? 0), 0);
    // Listed after the stats were made: the history only gains runs meanwhile (the polls above are runs too).
    const listed = JSON.parse((await rest("GET", `/v2/projects/${PROJECT}/apps/notes/runs`, second)).text).runs.length;
    expect(counted).toBeLessThanOrEqual(listed);
  }, 120_000);
});
