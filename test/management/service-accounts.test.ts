// Projects and service accounts through the management API: the spec's
// DELETE, creation with its validation, listing, buf curl over gRPC, audit
// lines, and tokens that are never stored or logged.
import { execFile } from "node:child_process";
import { Writable } from "node:stream";
import { join } from "node:path";
import { promisify } from "node:util";
import { connect, type NatsConnection } from "nats";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { buckets } from "../../services/nats/layout.js";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";
import { TEST_ROOT } from "../helpers/paths.js";

const run = promisify(execFile);
const root = join(TEST_ROOT, "..");
const DAY_MS = 86_400_000;

describe("projects and service accounts", () => {
  let t: TestSkiff;
  const logLines: Record<string, unknown>[] = [];
  let logText = "";

  const inDays = (days: number) => new Date(Date.now() + days * DAY_MS).toISOString();

  beforeAll(async () => {
    const sink = new Writable({
      write(chunk, _enc, done) {
        logText += chunk.toString();
        for (const line of chunk.toString().split("\n").filter(Boolean)) logLines.push(JSON.parse(line));
        done();
      },
    });
    t = await startTestSkiff({ logger: pino({ level: "info" }, sink) });
    expect((await t.api("POST", "/v2/projects", { project_id: "p-a", name: "A" })).status).toBe(200);
  });
  afterAll(async () => {
    await t?.close();
  });

  it("POST service-accounts answers the account and its token; GET lists it and gets it", async () => {
    const expiresAt = new Date(Math.floor(Date.now() / 1000) * 1000 + 30 * DAY_MS).toISOString().replace(".000Z", "Z");
    const created = await t.api("POST", "/v2/projects/p-a/service-accounts", { name: "ci", expires_at: expiresAt });
    expect(created.status).toBe(200);
    expect(Object.keys(created.body).sort()).toEqual(["service_account", "token"]);
    const sa = created.body.service_account;
    expect(Object.keys(sa).sort()).toEqual(["created_at", "expires_at", "name", "service_account_id"]);
    expect(sa).toMatchObject({ name: "ci", expires_at: expiresAt });
    expect(sa.service_account_id).toMatch(/^sa-[a-z0-9]+$/);
    const claims = JSON.parse(Buffer.from(created.body.token.split(".")[1], "base64url").toString());
    expect(claims.exp * 1000).toBe(Date.parse(expiresAt));

    const list = await t.api("GET", "/v2/projects/p-a/service-accounts");
    expect(list.body.service_accounts).toContainEqual(sa);
    expect((await t.api("GET", `/v2/projects/p-a/service-accounts/${sa.service_account_id}`)).body).toEqual({
      service_account: sa,
    });
  });

  it("DELETE answers 200 with {}, a second DELETE 404; the deleted token no longer works", async () => {
    const { body } = await t.api("POST", "/v2/projects/p-a/service-accounts", {
      name: "to-delete",
      expires_at: inDays(1),
    });
    const path = `/v2/projects/p-a/service-accounts/${body.service_account.service_account_id}`;
    expect(await t.api("GET", "/v2/projects/p-a/service-accounts", undefined, body.token)).toMatchObject({
      status: 200,
    });
    const deleted = await t.api("DELETE", path);
    expect([deleted.status, deleted.body]).toEqual([200, {}]);
    expect(await t.api("DELETE", path)).toMatchObject({ status: 404, body: { code: "not_found" } });
    expect(await t.api("GET", path)).toMatchObject({ status: 404 });
    expect(await t.api("GET", "/v2/projects/p-a/service-accounts", undefined, body.token)).toMatchObject({
      status: 401,
    });
  });

  it("a service account can delete accounts of its own project, itself included", async () => {
    const { body } = await t.api("POST", "/v2/projects/p-a/service-accounts", { name: "self", expires_at: inDays(1) });
    const path = `/v2/projects/p-a/service-accounts/${body.service_account.service_account_id}`;
    expect((await t.api("DELETE", path, undefined, body.token)).status).toBe(200);
    expect((await t.api("GET", "/v2/projects/p-a/service-accounts", undefined, body.token)).status).toBe(401);
  });

  it.each([
    ["name missing", { expires_at: "+1d" }, /name is required/],
    ["name of 65 characters", { name: "x".repeat(65), expires_at: "+1d" }, /name must be at most 64 characters/],
    ["expires_at missing", { name: "n" }, /expires_at is required/],
    ["expires_at in the past", { name: "n", expires_at: "2020-01-01T00:00:00Z" }, /expires_at must be in the future/],
    ["expires_at now", { name: "n", expires_at: "+0d" }, /expires_at must be in the future/],
    ["expires_at beyond one year", { name: "n", expires_at: "+367d" }, /expires_at must be at most one year ahead/],
    [
      "expires_at far out of range",
      { name: "n", expires_at: "9999-12-31T23:59:59Z" },
      /expires_at must be at most one year ahead/,
    ],
    ["expires_at not a time", { name: "n", expires_at: "tomorrow" }, /RFC 3339/],
  ])("create with %s → 400 invalid_argument with a clear message", async (_name, input, message) => {
    const body: Record<string, unknown> = { ...input };
    if (typeof body.expires_at === "string" && body.expires_at.startsWith("+"))
      body.expires_at = inDays(Number(body.expires_at.slice(1, -1)));
    const res = await t.api("POST", "/v2/projects/p-a/service-accounts", body);
    expect(res.status).toBe(400);
    expect(res.body.code).toBe("invalid_argument");
    expect(res.body.message).toMatch(message);
  });

  it("the expiry that the message of a missing expires_at gives as an example is accepted", async () => {
    const missing = await t.api("POST", "/v2/projects/p-a/service-accounts", { name: "n" });
    const example = /\(e\.g\. ([^)]+)\)/.exec(missing.body.message)?.[1];
    expect(example, missing.body.message).toMatch(/^\d{4}-\d\d-\d\dT00:00:00Z$/);
    const created = await t.api("POST", "/v2/projects/p-a/service-accounts", { name: "n", expires_at: example });
    expect(created.status, JSON.stringify(created.body)).toBe(200);
  });

  it("names of 1 and 64 characters and an expiry of 365 days are accepted", async () => {
    for (const [name, days] of [
      ["x", 1],
      ["é".repeat(64), 365],
    ] as const) {
      expect(
        (await t.api("POST", "/v2/projects/p-a/service-accounts", { name, expires_at: inDays(days) })).status,
      ).toBe(200);
    }
  });

  it("service accounts of a project that does not exist → 404; a malformed project id → 400", async () => {
    expect(
      await t.api("POST", "/v2/projects/p-nothere/service-accounts", { name: "n", expires_at: inDays(1) }),
    ).toMatchObject({ status: 404, body: { code: "not_found" } });
    expect(await t.api("GET", "/v2/projects/p-nothere/service-accounts")).toMatchObject({ status: 404 });
    expect(await t.api("GET", "/v2/projects/Project_X/service-accounts")).toMatchObject({
      status: 400,
      body: { code: "invalid_argument" },
    });
    expect(await t.api("DELETE", "/v2/projects/p-a/service-accounts/not-an-id")).toMatchObject({ status: 404 });
  });

  it("a service account cannot create one that outlives itself", async () => {
    const { body } = await t.api("POST", "/v2/projects/p-a/service-accounts", { name: "short", expires_at: inDays(2) });
    expect(
      await t.api("POST", "/v2/projects/p-a/service-accounts", { name: "longer", expires_at: inDays(3) }, body.token),
    ).toMatchObject({ status: 403 });
    expect(
      await t.api("POST", "/v2/projects/p-a/service-accounts", { name: "shorter", expires_at: inDays(1) }, body.token),
    ).toMatchObject({ status: 200 });
  });

  it("projects: created with a given or generated id, 409 when the id exists, 400 for a malformed id, listed and got", async () => {
    expect(await t.api("POST", "/v2/projects", { project_id: "p-a" })).toMatchObject({
      status: 409,
      body: { code: "already_exists" },
    });
    expect(await t.api("POST", "/v2/projects", { project_id: "P-Upper" })).toMatchObject({
      status: 400,
      body: { code: "invalid_argument" },
    });
    const generated = await t.api("POST", "/v2/projects", { name: "Generated" });
    expect(generated.status).toBe(200);
    expect(generated.body.project.project_id).toMatch(/^p-[a-z0-9]+$/);
    expect(generated.body.project.name).toBe("Generated");
    const list = await t.api("GET", "/v2/projects");
    expect(list.body.projects.map((p: { project_id: string }) => p.project_id)).toEqual(
      expect.arrayContaining(["p-a", "p-dev", generated.body.project.project_id]),
    );
    expect(await t.api("GET", "/v2/projects/p-a")).toMatchObject({
      status: 200,
      body: { project: { project_id: "p-a", name: "A" } },
    });
    expect(await t.api("GET", "/v2/projects/p-zzz")).toMatchObject({ status: 404 });
  });

  it("buf curl over gRPC deletes a service account; the REST DELETE then answers 404", async () => {
    const { body } = await t.api("POST", "/v2/projects/p-a/service-accounts", { name: "buf", expires_at: inDays(1) });
    const id = body.service_account.service_account_id;
    const buf = join(root, "node_modules/.bin/buf");
    const out = await run(
      buf,
      [
        "curl",
        "--schema",
        "proto",
        "--protocol",
        "grpc",
        "--http2-prior-knowledge",
        "-H",
        `Authorization: Bearer ${t.adminToken}`,
        "-d",
        JSON.stringify({ project_id: "p-a", service_account_id: id }),
        `${t.url}/skiff.management.v2.ManagementService/DeleteServiceAccount`,
      ],
      { cwd: root },
    );
    expect(JSON.parse(out.stdout)).toEqual({});
    expect((await t.api("DELETE", `/v2/projects/p-a/service-accounts/${id}`)).status).toBe(404);
  });

  it("audit lines say who, what, which target and when for creates and deletes", async () => {
    const { body } = await t.api("POST", "/v2/projects/p-a/service-accounts", {
      name: "audited",
      expires_at: inDays(1),
    });
    const id = body.service_account.service_account_id;
    await t.api("DELETE", `/v2/projects/p-a/service-accounts/${id}`, undefined, body.token);
    const audit = logLines.filter((l) => l.audit === true && l.target === `p-a/${id}`);
    expect(audit.map((l) => [l.actor, l.action])).toEqual([
      ["admin", "service_account.create"],
      [id, "service_account.delete"],
    ]);
    for (const l of audit) expect(Date.parse(l.at as string)).toBeGreaterThan(Date.now() - 60_000);
    expect(logLines).toContainEqual(
      expect.objectContaining({ audit: true, actor: "admin", action: "project.create", target: "p-a" }),
    );
  });

  it("tokens are never stored in NATS nor written to the log", async () => {
    const { body } = await t.api("POST", "/v2/projects/p-a/service-accounts", {
      name: "secret",
      expires_at: inDays(1),
    });
    const signature = body.token.split(".")[2];
    const nc: NatsConnection = await connect({ servers: t.nats.url });
    try {
      const js = nc.jetstream();
      for (const bucket of [buckets.serviceAccounts.name, buckets.keys.name, buckets.projects.name]) {
        const kv = await js.views.kv(bucket, { bindOnly: true });
        for await (const key of await kv.keys()) {
          const value = (await kv.get(key))?.string() ?? "";
          expect(value).not.toContain(signature);
          expect(value).not.toContain(t.adminToken);
          expect(value).not.toContain(t.devToken.split(".")[2]);
        }
      }
    } finally {
      await nc.close();
    }
    expect(logText).not.toContain(signature);
    expect(logText).not.toContain(t.adminToken);
    expect(logText).not.toContain(t.devToken);
  });
});
