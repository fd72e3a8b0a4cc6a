// The sandbox and bundle limits as a whole skiff shows them: /readyz says
// when apps run unconfined, a project past SKIFF_MAX_APPS_PER_PROJECT or
// SKIFF_MAX_PROJECT_UNPACKED_BYTES gets 429, and a deploy error quotes no
// file.
import { mkdtemp, mkdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { Code, ConnectError } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { packApp } from "../../services/apps/bundle.js";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";

let tmp: string;
beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-sandbox-skiff-"));
});
afterAll(() => rm(tmp, { recursive: true, force: true }));

async function bundle(name: string, files: Record<string, string> = {}): Promise<Uint8Array> {
  const dir = path.join(tmp, `${name}-${Math.random().toString(36).slice(2, 8)}`);
  await mkdir(dir, { recursive: true });
  const all = {
    "skiff.toml": `[app]\nname = "${name}"\n[runtime]\nkind = "cortex"\nlanguage = "python"\nentry = "main.py"\n`,
    "main.py": "def ping():\n    return 'pong'\n",
    ...files,
  };
  for (const [f, text] of Object.entries(all)) await writeFile(path.join(dir, f), text);
  return (await packApp(dir)).bytes;
}

const deploy = (t: TestSkiff, data: Uint8Array) =>
  t.management().deployApp({ projectId: "p-dev", bundle: { contentType: "application/gzip", data } });

describe("sandbox - seen from a running skiff", () => {
  let t: TestSkiff | undefined;
  afterAll(() => t?.close());

  it("sandboxed (the default): /readyz is plain; a new app past SKIFF_MAX_APPS_PER_PROJECT is 429, a new version is not", async () => {
    t = await startTestSkiff({ env: { SKIFF_MAX_APPS_PER_PROJECT: "1" } });
    const ready = await (await fetch(`${t.url}/readyz`)).json();
    expect(ready).toMatchObject({ status: "ready" });
    expect(ready).not.toHaveProperty("sandbox");
    await deploy(t, await bundle("first"));
    await deploy(t, await bundle("first", { "main.py": "def ping():\n    return 'pong again'\n" }));
    const err = await deploy(t, await bundle("second")).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ConnectError);
    expect((err as ConnectError).code).toBe(Code.ResourceExhausted);
    expect((err as ConnectError).rawMessage).toMatch(/SKIFF_MAX_APPS_PER_PROJECT/);
  });

  it("SKIFF_MAX_BUNDLE_FILES reaches the bundle check: a bundle of more entries is 400 naming it", async () => {
    const few = await startTestSkiff({ env: { SKIFF_MAX_BUNDLE_FILES: "3" } });
    try {
      const err = await deploy(few, await bundle("many", { "a.txt": "a", "b.txt": "b" })).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(ConnectError);
      expect((err as ConnectError).code).toBe(Code.InvalidArgument);
      expect((err as ConnectError).rawMessage).toMatch(/more than 3 entries.*SKIFF_MAX_BUNDLE_FILES/);
    } finally {
      await few.close();
    }
  });

  it("a module that raises with a file's contents: the answer names the app's file and line, not the contents", async () => {
    const err = await deploy(
      t!,
      await bundle("first", { "main.py": "raise ValueError(open('/etc/hosts').read())\n" }),
    ).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ConnectError);
    const message = (err as ConnectError).rawMessage;
    expect(message).toContain("ValueError: raised while the module was imported at main.py:1");
    expect(message).not.toMatch(/localhost|\/etc\//);
  });
});

describe("SKIFF_MAX_PROJECT_UNPACKED_BYTES", () => {
  let t: TestSkiff | undefined;
  afterAll(() => t?.close());

  it("counts the current deployment of every app of the project, not the app's own earlier one; a deleted app frees its share", async () => {
    t = await startTestSkiff({ env: { SKIFF_MAX_PROJECT_UNPACKED_BYTES: "70000" } });
    const data = (name: string, kb: number) => bundle(name, { "data.txt": "x".repeat(kb * 1000) });
    await deploy(t, await data("one", 20));
    // A new version of the same app replaces its share: 20 KB then 30 KB is not 50 KB.
    await deploy(t, await data("one", 30));
    await deploy(t, await data("two", 30));
    const err = await deploy(t, await data("three", 15)).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ConnectError);
    expect((err as ConnectError).code).toBe(Code.ResourceExhausted);
    expect((err as ConnectError).rawMessage).toMatch(
      /^this deployment takes \d+ bytes \(its files, with the dependencies its build installed\) and the current deployments of project p-dev's other apps to \d+: together more than the limit of 70000 bytes \(SKIFF_MAX_PROJECT_UNPACKED_BYTES\)/,
    );
    const apps = await t.management().listApps({ projectId: "p-dev" });
    expect(apps.apps.map((a) => a.appName).sort()).toEqual(["one", "two"]);
    // Over REST it is a 429 with the same message.
    const res = await fetch(`${t.url}/v2/projects/p-dev/apps`, {
      method: "POST",
      headers: { authorization: `Bearer ${t.adminToken}`, "content-type": "application/gzip" },
      body: await data("three", 15),
    });
    expect(res.status).toBe(429);
    expect(((await res.json()) as { message: string }).message).toMatch(/SKIFF_MAX_PROJECT_UNPACKED_BYTES/);
    await t.management().deleteApp({ projectId: "p-dev", appName: "two" });
    await deploy(t, await data("three", 15));
  });
});

describe("SKIFF_SANDBOX=off", () => {
  it("/readyz says so", async () => {
    const t = await startTestSkiff({ env: { SKIFF_SANDBOX: "off" } });
    try {
      expect(await (await fetch(`${t.url}/readyz`)).json()).toMatchObject({ status: "ready", sandbox: "off" });
    } finally {
      await t.close();
    }
  });
});
