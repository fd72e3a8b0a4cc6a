// The `skiff` command (bin/skiff.js) against a test skiff.
import { mkdtemp, mkdir, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { runCli } from "../helpers/cli.js";
import { cortexApp, deploy, P } from "../helpers/run-apps.js";
import { skiffToml, writeApp } from "../helpers/apps.js";
import { verifyWebhook } from "../../services/webhook/signature.js";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";
import { startReceiver } from "../helpers/webhook-receiver.js";

describe("skiff CLI", () => {
  let t: TestSkiff;
  let cwd: string;

  /** Runs the CLI in an empty folder, with the given environment on top of PATH and HOME. */
  const skiff = (args: string[], env: Record<string, string> = {}, dir = cwd) => runCli(args, { env, cwd: dir });
  const asAdmin = (args: string[]) => skiff(args, { SKIFF_URL: t.url, SKIFF_TOKEN: t.adminToken });

  beforeAll(async () => {
    // Webhooks to this machine's receivers (a test's own), which skiff refuses by default.
    t = await startTestSkiff({ env: { SKIFF_WEBHOOK_ALLOWED_CIDRS: "127.0.0.0/8" } });
    cwd = await mkdtemp(path.join(tmpdir(), "skiff-cli-"));
    await deploy(cwd, t.management(), cortexApp("answers", { max_replicas: 1 }));
    await vi.waitUntil(() => t.skiff.runner!.version(P, "answers") === 1, { timeout: 60_000 });
  }, 60_000);
  afterAll(async () => {
    await t?.close();
    await rm(cwd, { recursive: true, force: true });
  });

  it("projects create and list, as a table and as JSON", async () => {
    const created = await asAdmin(["projects", "create", "p-cli", "--name", "CLI"]);
    expect(created).toMatchObject({ code: 0 });
    expect(created.stdout).toMatch(/^ID\s+NAME\s+CREATED\np-cli\s+CLI\s+\d{4}-/);
    const list = await asAdmin(["projects", "list", "--json"]);
    expect(list.code).toBe(0);
    expect(JSON.parse(list.stdout).projects.map((p: { project_id: string }) => p.project_id)).toEqual([
      "p-cli",
      "p-dev",
    ]);
    const again = await asAdmin(["projects", "create", "p-cli"]);
    expect(again).toMatchObject({ code: 1, stderr: expect.stringContaining("already exists (409)") });
  });

  it("projects delete removes a project and says what went with it; a second delete is 404", async () => {
    expect((await asAdmin(["projects", "create", "p-cligone"])).code).toBe(0);
    const deleted = await asAdmin(["projects", "delete", "p-cligone"]);
    expect(deleted).toMatchObject({
      code: 0,
      stdout:
        "deleted project p-cligone with 0 apps, 0 service accounts and 0 secrets; its persistent storage goes once its replicas stop\n",
    });
    const list = JSON.parse((await asAdmin(["projects", "list", "--json"])).stdout);
    expect(list.projects.map((p: { project_id: string }) => p.project_id)).not.toContain("p-cligone");
    expect(await asAdmin(["projects", "delete", "p-cligone"])).toMatchObject({
      code: 1,
      stderr: expect.stringContaining("not found (404)"),
    });
  });

  it("service-accounts create prints the token once; list shows the account; delete revokes it", async () => {
    const created = await asAdmin([
      "service-accounts",
      "create",
      "deploy-bot",
      "--project",
      "p-cli",
      "--expires-in",
      "7d",
      "--json",
    ]);
    expect(created.code).toBe(0);
    const { service_account: sa, token } = JSON.parse(created.stdout);
    expect(sa.name).toBe("deploy-bot");
    expect(Date.parse(sa.expires_at) - Date.now()).toBeGreaterThan(6.9 * 86_400_000);

    const list = await asAdmin(["sa", "list", "-p", "p-cli"]);
    expect(list.code).toBe(0);
    expect(list.stdout).toMatch(
      new RegExp(`^ID\\s+NAME\\s+CREATED\\s+EXPIRES\\n${sa.service_account_id}\\s+deploy-bot\\s`),
    );

    // The new token works for its own project through the CLI too, which is its default project.
    expect(await skiff(["sa", "list", "-p", "p-cli"], { SKIFF_URL: t.url, SKIFF_TOKEN: token })).toMatchObject({
      code: 0,
    });
    expect(await skiff(["sa", "list"], { SKIFF_URL: t.url, SKIFF_TOKEN: token })).toMatchObject({
      code: 0,
      stdout: expect.stringContaining(sa.service_account_id),
    });
    // --project and SKIFF_PROJECT still win (and the server says no to another project).
    expect(await skiff(["sa", "list"], { SKIFF_URL: t.url, SKIFF_TOKEN: token, SKIFF_PROJECT: "p-dev" })).toMatchObject(
      { code: 1, stderr: expect.stringContaining("403") },
    );

    const deleted = await asAdmin(["service-accounts", "delete", sa.service_account_id, "-p", "p-cli"]);
    expect(deleted).toMatchObject({
      code: 0,
      stdout: expect.stringContaining(`deleted service account ${sa.service_account_id}`),
    });
    const refused = await skiff(["sa", "list", "-p", "p-cli"], { SKIFF_URL: t.url, SKIFF_TOKEN: token });
    expect(refused).toMatchObject({ code: 1, stderr: expect.stringContaining("401") });
    const twice = await asAdmin(["service-accounts", "delete", sa.service_account_id, "-p", "p-cli"]);
    expect(twice).toMatchObject({ code: 1, stderr: expect.stringContaining("not found (404)") });
  });

  it("the human table of create shows the token and warns it is shown once", async () => {
    const created = await asAdmin([
      "sa",
      "create",
      "human",
      "-p",
      "p-cli",
      "--expires-at",
      new Date(Date.now() + 86_400_000).toISOString(),
    ]);
    expect(created.code).toBe(0);
    expect(created.stdout).toMatch(/\ntoken: eyJ[\w-]+\.[\w-]+\.[\w-]+\n$/);
    expect(created.stderr).toContain("shown only this once");
  });

  it("finds the admin token in .data/admin-token of the current folder", async () => {
    const dir = await mkdtemp(path.join(tmpdir(), "skiff-cli-home-"));
    try {
      await mkdir(path.join(dir, ".data"));
      await writeFile(path.join(dir, ".data", "admin-token"), t.adminToken + "\n");
      expect(await skiff(["projects", "list"], { SKIFF_URL: t.url }, dir)).toMatchObject({
        code: 0,
        stdout: expect.stringContaining("p-dev"),
      });
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("goes to SKIFF_PORT, as npm start reads it, when no URL is given", async () => {
    const port = new URL(t.url).port;
    const res = await skiff(["projects", "list"], { SKIFF_PORT: port, SKIFF_TOKEN: t.adminToken });
    expect(res).toMatchObject({ code: 0, stdout: expect.stringContaining("p-dev") });
  });

  it("finds the address and admin token a running skiff keeps in SKIFF_DATA_DIR", async () => {
    expect((await readFile(path.join(t.dataDir, "address"), "utf8")).trim()).toBe(t.url);
    const res = await skiff(["projects", "list"], { SKIFF_DATA_DIR: t.dataDir });
    expect(res).toMatchObject({ code: 0, stdout: expect.stringContaining("p-dev") });
    // A folder whose skiff is gone: the message names where the address came from.
    const gone = await mkdtemp(path.join(tmpdir(), "skiff-cli-gone-"));
    try {
      await writeFile(path.join(gone, "address"), "http://127.0.0.1:1\n");
      await writeFile(path.join(gone, "admin-token"), t.adminToken);
      const refused = await skiff(["projects", "list"], { SKIFF_DATA_DIR: gone });
      expect(refused.code).toBe(1);
      expect(refused.stderr).toContain(`cannot reach skiff at http://127.0.0.1:1 (from ${path.join(gone, "address")})`);
    } finally {
      await rm(gone, { recursive: true, force: true });
    }
  });

  it("run --webhook-secret-file signs the webhook with the file's secret, which never goes on the command line", async () => {
    const receiver = await startReceiver(() => 200);
    const dir = await mkdtemp(path.join(tmpdir(), "skiff-cli-secret-"));
    try {
      const file = path.join(dir, "webhook-secret");
      await writeFile(file, "wh-sëcret-42\n");
      const hook = `${receiver.url}/hook`;
      const ran = await asAdmin([
        "run",
        "answers/add",
        "-d",
        '{"a":2,"b":3}',
        "--webhook",
        hook,
        "--webhook-secret-file",
        file,
      ]);
      expect(ran).toMatchObject({ code: 0, stdout: expect.stringContaining("5") });
      const [delivery] = await receiver.waitFor("/hook", 1);
      // The secret is the file's text less its line break, as its UTF-8 bytes.
      expect(verifyWebhook({ secret: "wh-sëcret-42", headers: delivery.headers, body: delivery.body })).toMatch(
        /^[0-9a-f-]{36}$/,
      );
      expect(await asAdmin(["run", "answers/add", "--webhook-secret-file", file])).toMatchObject({
        code: 2,
        stderr: expect.stringContaining("--webhook-secret-file signs a webhook: give --webhook <url> too"),
      });
      expect(
        await asAdmin(["run", "answers/add", "--webhook", hook, "--webhook-secret-file", path.join(dir, "none")]),
      ).toMatchObject({ code: 1, stderr: expect.stringContaining("cannot read the file (ENOENT)") });
    } finally {
      await receiver.close();
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("an app whose first deploy failed has its log: the module's output, this project's only", async () => {
    expect(await asAdmin(["projects", "create", "p-logs"])).toMatchObject({ code: 0 });
    const dir = await writeApp(cwd, {
      "skiff.toml": skiffToml({ name: "broken", runtime: { kind: "cortex", language: "python", entry: "main.py" } }),
      "main.py": "import nonexistent_mod_xyz\n",
    });
    const refused = await asAdmin(["deploy", dir, "-p", "p-logs"]);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toContain("its output is in the app's log: skiff logs broken");
    const logs = await asAdmin(["logs", "broken", "-p", "p-logs"]);
    expect(logs).toMatchObject({ code: 0, stdout: expect.stringContaining("nonexistent_mod_xyz") });
    // The project made again under its id is another's: the earlier one's lines are not its own.
    expect(await asAdmin(["projects", "delete", "p-logs"])).toMatchObject({ code: 0 });
    expect(await asAdmin(["projects", "create", "p-logs"])).toMatchObject({ code: 0 });
    expect(await asAdmin(["logs", "broken", "-p", "p-logs"])).toMatchObject({
      code: 1,
      stderr: expect.stringContaining("not found (404)"),
    });
    // Nor once it deploys an app of that name: its log starts with its own project.
    const fixed = await writeApp(cwd, {
      "skiff.toml": skiffToml({ name: "broken", runtime: { kind: "cortex", language: "python", entry: "main.py" } }),
      "main.py": "def run():\n    return 1\n",
    });
    expect(await asAdmin(["deploy", fixed, "-p", "p-logs"])).toMatchObject({ code: 0 });
    const own = await asAdmin(["logs", "broken", "-p", "p-logs"]);
    expect(own.code).toBe(0);
    expect(own.stdout).not.toContain("nonexistent_mod_xyz");
  });

  it("says an app's error answer and a server error in sentences, never a Connect code name", async () => {
    const failed = await asAdmin(["run", "answers/fail"]);
    expect(failed.code).toBe(1);
    expect(failed.stdout).toContain("TypeError");
    expect(failed.stderr).toMatch(/^skiff: the app answered 500 \(run [0-9a-f-]{36}\)\n$/);
    const missing = await asAdmin(["run", "answers/nope"]);
    expect(missing.code).toBe(1);
    for (const res of [failed, missing])
      expect(res.stderr).not.toMatch(
        /\b(Unknown|Internal|Unavailable|NotFound|InvalidArgument|FailedPrecondition|Canceled|DeadlineExceeded|Unimplemented|DataLoss|Aborted|OutOfRange|ResourceExhausted|PermissionDenied|Unauthenticated|AlreadyExists):/,
      );
  });

  it.each([
    [
      "validation",
      1,
      ["sa", "create", "x", "--expires-in", "400d"],
      /invalid request \(400\): expires_at must be at most one year ahead/,
    ],
    ["a refused token", 1, ["projects", "list", "--token", "nope"], /the server refused the token \(401/],
    [
      "an unreachable server",
      1,
      ["projects", "list", "--url", "http://127.0.0.1:1"],
      /cannot reach skiff at http:\/\/127\.0\.0\.1:1/,
    ],
    ["an unknown command", 2, ["frobnicate"], /unknown command "frobnicate"/],
    ["an unknown option", 2, ["projects", "list", "--frob"], /Unknown option '--frob'/],
    ["an option of another command", 2, ["projects", "list", "--expires-in", "1d"], /--expires-in does not apply/],
    [
      "a bad --expires-in",
      2,
      ["sa", "create", "x", "--expires-in", "soon"],
      /--expires-in: expected a number and a unit/,
    ],
    ["a missing name", 2, ["sa", "create"], /needs a name/],
  ])("%s: exit code %i and a clear message", async (_name, code, args, message) => {
    const res = await asAdmin(args as string[]);
    expect(res.code).toBe(code);
    expect(res.stderr).toMatch(message);
  });

  it("without a token it never calls unauthenticated; --help exits 0", async () => {
    const res = await skiff(["projects", "list"], { SKIFF_URL: t.url, SKIFF_DATA_DIR: cwd });
    // Exit 2 when no token file exists; on a machine where the checkout has its own
    // .data/admin-token (from npm start), this test skiff refuses that token: exit 1.
    expect(res.stderr).toMatch(/no token: pass --token|the server refused the token/);
    expect(res.code).toBe(res.stderr.includes("no token") ? 2 : 1);
    const help = await skiff(["--help"]);
    expect(help.code).toBe(0);
    expect(help.stdout).toContain("service-accounts create <name>");
  });
});
