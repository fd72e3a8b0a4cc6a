// The OpenAPI documents as tools that skiff did not write read them: Redocly
// lints the committed documents with its recommended rules, and
// openapi-typescript turns the documents a running skiff serves into types
// for openapi-fetch. A small program is type-checked (tsc) against those
// types, then run against the same skiff.
import { execFile } from "node:child_process";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import openapiTS from "openapi-typescript";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { packApp } from "../../../services/apps/bundle.js";
import { cortexApp, deploy, P } from "../../helpers/run-apps.js";
import { startTestSkiff, type TestSkiff } from "../../helpers/skiff.js";
import { TEST_ROOT } from "../../helpers/paths.js";

const run = promisify(execFile);
const root = path.join(TEST_ROOT, "..");
const bin = (name: string) => path.join(root, "node_modules", ".bin", name);

/**
 * The program a user of the generated client would write: list projects,
 * create and delete a service account, run an app sync and async. It prints
 * what it saw as JSON.
 */
const PROGRAM = `
import createClient from "openapi-fetch";
import type { paths as Invocation } from "./invocation.js";
import type { paths as Management } from "./management.js";

const [baseUrl, adminToken, project, app, customApp] = process.argv.slice(2);
const management = createClient<Management>({ baseUrl, headers: { Authorization: \`Bearer \${adminToken}\` } });
const invocation = createClient<Invocation>({ baseUrl });

const listed = await management.GET("/v2/projects");
if (listed.error) throw new Error(\`ListProjects: \${listed.error.code} \${listed.error.message}\`);
const projectIds: string[] = listed.data.projects.map((p) => p.project_id);

const created = await management.POST("/v2/projects/{project_id}/service-accounts", {
  params: { path: { project_id: project } },
  body: { name: "openapi-client", expires_at: new Date(Date.now() + 3_600_000).toISOString() },
});
if (created.error) throw new Error(\`CreateServiceAccount: \${created.error.message}\`);
const token: string = created.data.token;
const serviceAccountId: string = created.data.service_account.service_account_id;
const expiresAt: string = created.data.service_account.expires_at;

const runPath = { project_id: project, app_name: app, path: "add" };
const auth = { Authorization: \`Bearer \${token}\` };
const sync = await invocation.POST("/v4/{project_id}/{app_name}/{path}", {
  params: { path: runPath },
  headers: auth,
  body: { a: 2, b: 3 },
});
if (sync.error) throw new Error(\`Run: \${JSON.stringify(sync.error)}\`);
const syncRunId: string = sync.data.run_id;

const queued = await invocation.POST("/v4/{project_id}/{app_name}/{path}", {
  params: { path: runPath, query: { async: true } },
  headers: auth,
  body: { a: 1, b: 1 },
});
if (queued.error) throw new Error(\`Run async: \${JSON.stringify(queued.error)}\`);
const asyncRunId: string = queued.data.run_id;

// A Custom app's path of several segments, a space and a "%" among them: the client encodes the value whole.
const deep = await invocation.POST("/v4/{project_id}/{app_name}/{path}", {
  params: { path: { project_id: project, app_name: customApp, path: "echo/a b/50%" } },
  headers: auth,
  parseAs: "text",
});
if (deep.error) throw new Error(\`Run deep: \${JSON.stringify(deep.error)}\`);

const deleted = await management.DELETE("/v2/projects/{project_id}/service-accounts/{service_account_id}", {
  params: { path: { project_id: project, service_account_id: serviceAccountId } },
});

console.log(JSON.stringify({
  projectIds,
  serviceAccountId,
  expiresAt,
  sync: { status: sync.response.status, runId: syncRunId, body: sync.data, requestId: sync.response.headers.get("x-request-id") },
  async: { status: queued.response.status, runId: asyncRunId, body: queued.data, requestId: queued.response.headers.get("x-request-id") },
  deep: { status: deep.response.status, url: deep.response.url, body: JSON.parse(deep.data) },
  deleteStatus: deleted.response.status,
}));
`;

/** The same calls with a mistake a typed client must catch: a field the API does not have. */
const WRONG_PROGRAM = `
import createClient from "openapi-fetch";
import type { paths as Management } from "./management.js";

const management = createClient<Management>({ baseUrl: "http://127.0.0.1:1" });
const listed = await management.GET("/v2/projects");
if (listed.data) console.log(listed.data.projects.map((p) => p.project_identifier));
`;

const TSCONFIG = {
  compilerOptions: {
    target: "ES2022",
    module: "NodeNext",
    moduleResolution: "NodeNext",
    lib: ["ES2023", "DOM"],
    types: ["node"],
    strict: true,
    skipLibCheck: true,
    noEmit: true,
  },
};

describe("openapi - a generated client", () => {
  let t: TestSkiff;
  let dir: string;
  let appTmp: string;

  beforeAll(async () => {
    t = await startTestSkiff();
    appTmp = await mkdtemp(path.join(tmpdir(), "skiff-openapi-client-"));
    await deploy(appTmp, t.management(), cortexApp("calc", { min_replicas: 0, max_replicas: 1 }));
    await t.management().deployApp({
      projectId: P,
      bundle: {
        contentType: "application/gzip",
        data: (await packApp(path.join(root, "examples", "custom-http"))).bytes,
      },
    });
    // Inside the repository, so that openapi-fetch and @types/node resolve from its node_modules.
    await mkdir(path.join(root, "test-results"), { recursive: true });
    dir = await mkdtemp(path.join(root, "test-results", "openapi-client-"));
    await writeFile(path.join(dir, "package.json"), JSON.stringify({ type: "module" }));
    await writeFile(path.join(dir, "tsconfig.json"), JSON.stringify(TSCONFIG));
    for (const [name, servedAt] of [
      ["management", "/v2/openapi.json"],
      ["invocation", "/v4/openapi.json"],
    ]) {
      const res = await fetch(`${t.url}${servedAt}`);
      expect(res.status).toBe(200);
      const types = await openapiTS((await res.json()) as Parameters<typeof openapiTS>[0]);
      await writeFile(path.join(dir, `${name}.ts`), types);
    }
  }, 120_000);

  afterAll(async () => {
    await t?.close();
    if (appTmp) await rm(appTmp, { recursive: true, force: true });
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it("type-checks a program that reads data.run_id, and refuses one that reads a field the API does not have", async () => {
    await writeFile(path.join(dir, "program.ts"), PROGRAM);
    await writeFile(path.join(dir, "wrong.ts"), WRONG_PROGRAM);
    const check = (file: string) =>
      run(bin("tsc"), ["-p", "tsconfig.json", "--pretty", "false"], { cwd: dir }).then(
        () => "",
        (err: { stdout?: string }) => err.stdout ?? String(err),
      );
    await writeFile(path.join(dir, "tsconfig.json"), JSON.stringify({ ...TSCONFIG, files: ["program.ts"] }));
    expect(await check("program.ts")).toBe("");
    await writeFile(path.join(dir, "tsconfig.json"), JSON.stringify({ ...TSCONFIG, files: ["wrong.ts"] }));
    expect(await check("wrong.ts")).toMatch(/project_identifier/);
  }, 120_000);

  it("runs against a real skiff: lists projects, creates and deletes a service account, runs an app sync and async", async () => {
    await writeFile(path.join(dir, "program.ts"), PROGRAM);
    const { stdout } = await run(bin("tsx"), ["program.ts", t.url, t.adminToken, P, "calc", "custom-http"], {
      cwd: dir,
    });
    const seen = JSON.parse(stdout) as {
      projectIds: string[];
      serviceAccountId: string;
      expiresAt: string;
      sync: { status: number; runId: string; body: { run_id: string; result: unknown }; requestId: string };
      async: { status: number; runId: string; body: unknown; requestId: string };
      deep: { status: number; url: string; body: { path: string } };
      deleteStatus: number;
    };
    expect(seen.projectIds).toContain(P);
    expect(seen.serviceAccountId).not.toBe("");
    expect(Date.parse(seen.expiresAt)).toBeGreaterThan(Date.now());
    expect(seen.sync).toMatchObject({ status: 200, body: { result: 5 } });
    expect(seen.sync.runId).toBe(seen.sync.requestId);
    expect(seen.async.status).toBe(202);
    expect(seen.async.body).toEqual({ run_id: seen.async.runId });
    expect(seen.async.runId).toBe(seen.async.requestId);
    expect(seen.deleteStatus).toBe(200);
    // The client wrote every "/" of the value as %2F; the app gets the segments, other escapes as written.
    expect(seen.deep.url).toContain("/custom-http/echo%2Fa%20b%2F50%25");
    expect(seen.deep).toMatchObject({ status: 200, body: { path: "/echo/a%20b/50%25" } });
  }, 120_000);
});

describe("openapi - Redocly", () => {
  for (const file of ["gen/openapi/management.v2.json", "gen/openapi/invocation.v4.json"]) {
    it(`${file}: passes its recommended rules (redocly.yaml) without errors or warnings`, async () => {
      const result = await run(bin("redocly"), ["lint", "--format", "json", file], { cwd: root }).then(
        (r) => ({ ok: true, stdout: r.stdout }),
        (err: { stdout?: string }) => ({ ok: false, stdout: err.stdout ?? "" }),
      );
      const report = JSON.parse(result.stdout) as { totals: { errors: number; warnings: number }; problems: unknown[] };
      expect(report.problems).toEqual([]);
      expect(report.totals).toMatchObject({ errors: 0, warnings: 0 });
      expect(result.ok).toBe(true);
    }, 120_000);
  }
});
