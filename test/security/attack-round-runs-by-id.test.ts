// GetRun, ListWebhookDeliveries, RedeliverWebhook and CancelRun take app "-"
// and find the run by its id in whichever app of the project ran it (from the
// run history). Attacked as another project's token holder: another
// project's run ids (known from a log, a webhook, a shared screen) asked for
// under the caller's own project and under the victim's, over REST and
// Connect; odd ids; and a project deleted and made again under its id, whose
// new tenant asks for the old tenant's runs. Real skiff, real NATS, real
// sandboxed replicas.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { Code, ConnectError } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { skiffToml } from "../helpers/apps.js";
import { deploy, post } from "../helpers/run-apps.js";
import { projectWithToken, startTestSkiff, type TestSkiff } from "../helpers/skiff.js";

const VICTIM = "p-victim";
const REUSED = "p-reused";
const MARK = "victim-secret-result-51c3";

const INDEX = [
  "export async function hold({ ms }) { await new Promise((r) => setTimeout(r, ms)); return 'held'; }",
  `export function note() { return ${JSON.stringify(MARK)}; }`,
].join("\n");

let t: TestSkiff;
let tmp: string;
let victimToken: string;
/** A project token of p-dev: the attacker. */
let attacker: string;

/** The victim's app: its runs are what the attacker looks for. */
const notesApp = {
  "skiff.toml": skiffToml({
    name: "notes",
    runtime: { kind: "cortex", language: "node", entry: "index.mjs" },
    scaling: { min_replicas: 1, max_replicas: 1, replica_concurrency: 1 },
  }),
  "index.mjs": INDEX,
};
const deployNotes = (projectId: string, token: string) => deploy(tmp, t.management(token), notesApp, projectId);

const rest = async (method: string, p: string, token: string) => {
  const res = await fetch(t.url + p, {
    method,
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    body: method === "POST" ? "{}" : undefined,
  });
  return { status: res.status, text: await res.text() };
};

/** The code of a Connect call's error (undefined when it did not fail). */
const codeOf = async (call: Promise<unknown>): Promise<Code | undefined> => {
  const err = await call.then(
    () => undefined,
    (e: unknown) => e,
  );
  if (err === undefined) return undefined;
  expect(err).toBeInstanceOf(ConnectError);
  expect((err as ConnectError).message).not.toContain(MARK);
  return (err as ConnectError).code;
};

/** The victim's runs: one ended (its result is MARK), one queued behind a long hold. */
let ended: string;
let queued: string;
let holding: Promise<unknown>;

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-attack-runs-"));
  t = await startTestSkiff();
  attacker = t.devToken;
  victimToken = await projectWithToken(t, VICTIM);
  await deployNotes(VICTIM, victimToken);
  const done = await post(`${t.url}/v4/${VICTIM}/notes/note`, victimToken, "{}");
  expect(done.status, done.text).toBe(200);
  ended = done.json.run_id as string;
  holding = post(`${t.url}/v4/${VICTIM}/notes/hold`, victimToken, '{"ms":20000}');
  await new Promise((r) => setTimeout(r, 500));
  const accepted = await post(`${t.url}/v4/${VICTIM}/notes/note?async=true`, victimToken, "{}");
  expect(accepted.status, accepted.text).toBe(202);
  queued = accepted.json.run_id as string;
  // The victim itself finds both by id alone (app "-"): the history has them.
  await vi.waitUntil(
    async () => (await rest("GET", `/v2/projects/${VICTIM}/apps/-/runs/${ended}`, victimToken)).status === 200,
    { timeout: 10_000, interval: 200 },
  );
}, 180_000);
afterAll(async () => {
  await holding?.catch(() => undefined);
  await t?.close();
  await rm(tmp, { recursive: true, force: true });
});

describe("attack - a run found by its id alone (app '-')", () => {
  it("another project's token asks for the victim's runs under its own project: not found, over REST", async () => {
    for (const id of [ended, queued]) {
      for (const [method, p] of [
        ["GET", `/v2/projects/p-dev/apps/-/runs/${id}`],
        ["GET", `/v2/projects/p-dev/apps/-/runs/${id}/webhook-deliveries`],
        ["POST", `/v2/projects/p-dev/apps/-/runs/${id}/webhook:redeliver`],
        ["POST", `/v2/projects/p-dev/apps/-/runs/${id}:cancel`],
        ["GET", `/v2/projects/p-dev/apps/%2D/runs/${id}`],
        ["POST", `/v2/projects/p-dev/apps/%2d/runs/${id}:cancel`],
      ] as const) {
        const answer = await rest(method, p, attacker);
        expect(answer.status, `${method} ${p}: ${answer.text}`).toBe(404);
        expect(answer.text).not.toContain(MARK);
        expect(answer.text).not.toContain("notes");
        expect(answer.text).not.toContain(VICTIM);
      }
    }
  });

  it("…and under the victim's project: refused before anything is looked up, over REST", async () => {
    for (const id of [ended, queued]) {
      for (const [method, p] of [
        ["GET", `/v2/projects/${VICTIM}/apps/-/runs/${id}`],
        ["GET", `/v2/projects/${VICTIM}/apps/-/runs/${id}/webhook-deliveries`],
        ["POST", `/v2/projects/${VICTIM}/apps/-/runs/${id}/webhook:redeliver`],
        ["POST", `/v2/projects/${VICTIM}/apps/-/runs/${id}:cancel`],
      ] as const) {
        const answer = await rest(method, p, attacker);
        expect(answer.status, `${method} ${p}: ${answer.text}`).toBe(403);
        expect(answer.text).not.toContain(MARK);
      }
    }
  });

  it("the same over Connect: not found under its own project, permission denied under the victim's", async () => {
    const m = t.management(attacker);
    for (const runId of [ended, queued]) {
      for (const [projectId, expected] of [
        ["p-dev", Code.NotFound],
        [VICTIM, Code.PermissionDenied],
      ] as const) {
        const req = { projectId, appName: "-", runId };
        expect(await codeOf(m.getRun(req))).toBe(expected);
        expect(await codeOf(m.listWebhookDeliveries(req))).toBe(expected);
        expect(await codeOf(m.redeliverWebhook(req))).toBe(expected);
        expect(await codeOf(m.cancelRun(req))).toBe(expected);
      }
    }
    // The victim's queued run was not cancelled by any of it.
    const still = await rest("GET", `/v2/projects/${VICTIM}/apps/-/runs/${queued}`, victimToken);
    expect(still.status, still.text).toBe(200);
    expect(JSON.parse(still.text).run.status).not.toBe("cancelled");
  });

  it("odd ids (case, spaces, encodings, SQL, other projects' ids with a twist) find nothing and break nothing", async () => {
    const odd = [
      ended.toUpperCase(),
      ` ${ended}`,
      `${ended} `,
      `${ended}%00`,
      `${ended}%0a`,
      `{${ended}}`,
      ended.replace(/-/g, ""),
      `${ended.slice(0, 35)}'`,
      "' OR '1'='1",
      "00000000-0000-0000-0000-000000000000",
      "ffffffff-ffff-7fff-bfff-ffffffffffff",
      "-",
      "%2D",
      "..",
      `..%2F..%2F${VICTIM}%2Fapps%2Fnotes%2Fruns%2F${ended}`,
      "x".repeat(5000),
    ];
    for (const id of odd) {
      for (const [method, suffix] of [
        ["GET", ""],
        ["POST", ":cancel"],
      ] as const) {
        const answer = await rest(method, `/v2/projects/p-dev/apps/-/runs/${id}${suffix}`, attacker);
        expect([400, 404], `${method} ${JSON.stringify(id.slice(0, 60))}: ${answer.text}`).toContain(answer.status);
        expect(answer.text).not.toContain(MARK);
      }
    }
    expect((await fetch(`${t.url}/healthz`)).status).toBe(200);
  }, 180_000);

  it("a project deleted and made again under its id: the new tenant finds none of the old one's runs by id", async () => {
    const first = await projectWithToken(t, REUSED);
    await deployNotes(REUSED, first);
    const old = await post(`${t.url}/v4/${REUSED}/notes/note`, first, "{}");
    expect(old.status, old.text).toBe(200);
    const oldRun = old.json.run_id as string;
    await vi.waitUntil(
      async () => (await rest("GET", `/v2/projects/${REUSED}/apps/-/runs/${oldRun}`, first)).status === 200,
      { timeout: 10_000, interval: 200 },
    );
    expect((await rest("DELETE", `/v2/projects/${REUSED}`, t.adminToken)).status).toBe(200);
    await new Promise((r) => setTimeout(r, 1_100));
    const second = await projectWithToken(t, REUSED);
    // Same id, same app name: the history still holds the old run under both.
    await deployNotes(REUSED, second);
    for (const [method, p] of [
      ["GET", `/v2/projects/${REUSED}/apps/-/runs/${oldRun}`],
      ["GET", `/v2/projects/${REUSED}/apps/notes/runs/${oldRun}`],
      ["GET", `/v2/projects/${REUSED}/apps/-/runs/${oldRun}/webhook-deliveries`],
      ["POST", `/v2/projects/${REUSED}/apps/-/runs/${oldRun}/webhook:redeliver`],
      ["POST", `/v2/projects/${REUSED}/apps/-/runs/${oldRun}:cancel`],
    ] as const) {
      const answer = await rest(method, p, second);
      expect(answer.status, `${method} ${p}: ${answer.text}`).toBe(404);
      expect(answer.text).not.toContain(MARK);
    }
    const m = t.management(second);
    const req = { projectId: REUSED, appName: "-", runId: oldRun };
    expect(await codeOf(m.getRun(req))).toBe(Code.NotFound);
    expect(await codeOf(m.cancelRun(req))).toBe(Code.NotFound);
    // The old tenant's token is gone with its project.
    expect((await rest("GET", `/v2/projects/${REUSED}/apps/-/runs/${oldRun}`, first)).status).toBe(401);
  }, 120_000);
});
