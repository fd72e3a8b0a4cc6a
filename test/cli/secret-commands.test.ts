// `skiff secrets` against a test skiff: set reads the value from stdin and
// never prints it, list shows names and times, delete removes it, and the
// server's refusals come back as sentences with their status.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runCli } from "../helpers/cli.js";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";

const VALUE = "s3cr3t-value-from-stdin-91f2";

describe("skiff secrets", () => {
  let t: TestSkiff;
  let cwd: string;
  const skiff = (args: string[], input?: string) =>
    runCli(args, { env: { SKIFF_URL: t.url, SKIFF_TOKEN: t.devToken }, cwd, input });

  beforeAll(async () => {
    t = await startTestSkiff();
    cwd = await mkdtemp(path.join(tmpdir(), "skiff-cli-secrets-"));
  }, 60_000);
  afterAll(async () => {
    await t?.close();
    await rm(cwd, { recursive: true, force: true });
  });

  it("set (from stdin), list, set again, delete: a round trip that never prints the value", async () => {
    const set = await skiff(["secrets", "set", "HF_TOKEN"], `${VALUE}\n`);
    expect(set).toMatchObject({
      code: 0,
      stdout: "created secret HF_TOKEN of project p-dev; the project's replicas are being replaced\n",
    });

    const list = await skiff(["secrets", "list"]);
    expect(list.code).toBe(0);
    expect(list.stdout).toMatch(/^NAME\s+CREATED\s+UPDATED\nHF_TOKEN\s+\d{4}-\S+\s+\d{4}-\S+\n$/);

    const again = await skiff(["secrets", "set", "HF_TOKEN", "--json"], "other");
    expect(again.code).toBe(0);
    expect(JSON.parse(again.stdout).secret.name).toBe("HF_TOKEN");
    const json = JSON.parse((await skiff(["secrets", "list", "--json"])).stdout);
    expect(json.secrets.map((s: { name: string }) => s.name)).toEqual(["HF_TOKEN"]);

    const deleted = await skiff(["secrets", "delete", "HF_TOKEN"]);
    expect(deleted).toMatchObject({ code: 0, stdout: "deleted secret HF_TOKEN of project p-dev\n" });
    expect((await skiff(["secrets", "list", "--json"])).stdout).toBe("{}\n");
    for (const r of [set, list, again, deleted]) expect(r.stdout + r.stderr).not.toContain(VALUE);
  });

  it("the value set is the bytes of stdin less one final line break", async () => {
    // Seen through an app's environment in test/e2e/project-secrets.test.ts; here, through the server's check:
    // a value of 64 KiB and one line break is taken, one byte more is not.
    const max = "v".repeat(64 * 1024);
    expect((await skiff(["secrets", "set", "BIG"], `${max}\n`)).code).toBe(0);
    const over = await skiff(["secrets", "set", "BIG"], `${max}v\n`);
    expect(over.code).toBe(1);
    expect(over.stderr).toMatch(/^skiff: invalid request \(400\): value is 65537 bytes/);
  });

  it("a bad name is 400, a missing one 404, a missing argument a usage error", async () => {
    expect(await skiff(["secrets", "set", "SKIFF_X"], "v")).toMatchObject({
      code: 1,
      stderr: expect.stringContaining("invalid request (400): name starts with SKIFF_"),
    });
    expect(await skiff(["secrets", "delete", "NOPE"])).toMatchObject({
      code: 1,
      stderr: expect.stringContaining("not found (404)"),
    });
    expect(await skiff(["secrets", "set"])).toMatchObject({ code: 2 });
    // What `printf '%s' "$UNSET" | skiff secrets set …` sends: refused before anything is stored.
    for (const empty of ["", "\n"])
      expect(await skiff(["secrets", "set", "EMPTY"], empty)).toMatchObject({
        code: 1,
        stderr: expect.stringContaining(
          "the value of EMPTY read from stdin is empty (an unset variable?); nothing was set",
        ),
      });
    expect((await skiff(["secrets", "list"])).stdout).not.toContain("EMPTY");
    expect(await skiff(["secrets", "list", "-p", "p-elsewhere"])).toMatchObject({
      code: 1,
      stderr: expect.stringContaining("(403)"),
    });
  });
});
