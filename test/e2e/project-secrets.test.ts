// Project secrets reach replicas: an app reads one with os.environ.get; the
// app's own [env] wins over a secret of the same name; setting a new value
// or deleting it replaces the project's replicas, which then see the change.
// No value appears in the whole run's log, the app record, its replicas or
// its runs.
import { mkdtemp, rm } from "node:fs/promises";
import { createHash } from "node:crypto";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { packApp } from "../../services/apps/bundle.js";
import { skiffToml, writeApp } from "../helpers/apps.js";
import { capturingLogger } from "../helpers/logs.js";
import { post } from "../helpers/run-apps.js";
import { startTestSkiff, type TestSkiff } from "../helpers/skiff.js";

const VALUE = "hf_b1d8e0c2c4f94e6c_first";
const VALUE2 = "hf_7a93d2f0aa1b44e1_second";
const sha = (s: string) => createHash("sha256").update(s).digest("hex");

const MAIN = `import hashlib
import os


def digest(name: str):
    print(f"checked {name}", flush=True)
    value = os.environ.get(name)
    return None if value is None else hashlib.sha256(value.encode()).hexdigest()


def plain(name: str):
    return os.environ.get(name)
`;

describe("project secrets in replicas", () => {
  let t: TestSkiff;
  let tmp: string;
  const { logger, lines } = capturingLogger();

  const call = (fn: string, name: string) =>
    post(`${t.url}/v4/p-dev/reader/${fn}`, t.devToken, JSON.stringify({ name }));

  /** Calls until the answer is `want` (replicas are being replaced), at most `ms`. */
  async function until(name: string, want: string | null, ms = 60_000): Promise<void> {
    const end = Date.now() + ms;
    let last: unknown;
    while (Date.now() < end) {
      const a = await call("digest", name);
      last = a.json;
      if (a.status === 200 && a.json.result === want) return;
      await new Promise((r) => setTimeout(r, 250));
    }
    throw new Error(`${name} never became ${want}; last answer ${JSON.stringify(last)}`);
  }

  beforeAll(async () => {
    tmp = await mkdtemp(path.join(tmpdir(), "skiff-secrets-"));
    t = await startTestSkiff({ logger });
    expect((await t.api("PUT", "/v2/projects/p-dev/secrets/hf_auth_token", { value: VALUE })).status).toBe(200);
    expect((await t.api("PUT", "/v2/projects/p-dev/secrets/SHADOWED", { value: "from-secret" })).status).toBe(200);
    const dir = await writeApp(tmp, {
      "skiff.toml": skiffToml({
        name: "reader",
        runtime: { kind: "cortex", language: "python", entry: "main.py" },
        env: { SHADOWED: "from-env" },
        scaling: { min_replicas: 1 },
      }),
      "main.py": MAIN,
    });
    await t.management().deployApp({
      projectId: "p-dev",
      bundle: { contentType: "application/gzip", data: (await packApp(dir)).bytes },
    });
  }, 120_000);
  afterAll(async () => {
    await t?.close();
    await rm(tmp, { recursive: true, force: true });
  });

  it("a replica reads the secret with os.environ.get; the app's [env] wins over a secret", async () => {
    const a = await call("digest", "hf_auth_token");
    expect(a.status).toBe(200);
    expect(a.json.result).toBe(sha(VALUE));
    expect((await call("plain", "SHADOWED")).json.result).toBe("from-env");
  });

  it("a module that reads a secret as it loads (os.environ[...]) deploys: the import check runs it with the secrets", async () => {
    const dir = await writeApp(tmp, {
      "skiff.toml": skiffToml({ name: "loader", runtime: { kind: "cortex", language: "python", entry: "main.py" } }),
      "main.py": [
        "import hashlib, os",
        'TOKEN = os.environ["hf_auth_token"]',
        "def token_digest():",
        "    return hashlib.sha256(TOKEN.encode()).hexdigest()",
      ].join("\n"),
    });
    await t.management().deployApp({
      projectId: "p-dev",
      bundle: { contentType: "application/gzip", data: (await packApp(dir)).bytes },
    });
    const a = await post(`${t.url}/v4/p-dev/loader/token_digest`, t.devToken, "{}");
    expect(a.status).toBe(200);
    expect(a.json.result).toBe(sha(VALUE));
  });

  it("[build] secrets reach the build steps of the project's own build; another project's deploy of the same bundle builds without them; a new value builds again", async () => {
    const files = {
      "skiff.toml":
        skiffToml({ name: "builder", runtime: { kind: "cortex", language: "node", entry: "main.mjs" } }) +
        '\n[build]\nsecrets = ["hf_auth_token"]\n',
      "package.json": JSON.stringify({
        name: "builder",
        version: "1.0.0",
        // A dependency from the folder itself: the install runs (and with it the postinstall) with no registry.
        dependencies: { local: "file:./local" },
        scripts: {
          postinstall:
            "node -e \"require('fs').writeFileSync('built.txt', require('crypto').createHash('sha256').update(process.env.hf_auth_token || 'none').digest('hex'))\"",
        },
      }),
      "local/package.json": JSON.stringify({ name: "local", version: "1.0.0" }),
      "main.mjs": [
        'import { readFileSync } from "node:fs";',
        'export function built() { return readFileSync(new URL("./built.txt", import.meta.url), "utf8"); }',
        "export function runtime() { return process.env.hf_auth_token ? 'set' : 'unset'; }",
      ].join("\n"),
    };
    const bundle = (await packApp(await writeApp(tmp, files))).bytes;
    const deploy = (projectId: string) =>
      t.management().deployApp({ projectId, bundle: { contentType: "application/gzip", data: bundle } });
    const built = async (projectId: string) => {
      const token = projectId === "p-dev" ? t.devToken : t.adminToken;
      const a = await post(`${t.url}/v4/${projectId}/builder/built`, token, "{}");
      expect(a.status, a.text).toBe(200);
      return a.json.result as string;
    };
    await deploy("p-dev");
    expect(await built("p-dev")).toBe(sha(VALUE));

    expect((await t.management().createProject({ projectId: "p-other", name: "other" })).project?.projectId).toBe(
      "p-other",
    );
    await deploy("p-other");
    expect(await built("p-other")).toBe(sha("none"));
    expect(await built("p-dev")).toBe(sha(VALUE));

    // A new value: the project's replicas are replaced, and the build made again with it.
    const VALUE3 = "hf_0c1d2e3f40516273_third";
    expect((await t.api("PUT", "/v2/projects/p-dev/secrets/hf_auth_token", { value: VALUE3 })).status).toBe(200);
    const end = Date.now() + 90_000;
    let now = await built("p-dev");
    while (now !== sha(VALUE3) && Date.now() < end) {
      await new Promise((r) => setTimeout(r, 250));
      now = await built("p-dev");
    }
    expect(now).toBe(sha(VALUE3));
    expect((await t.api("PUT", "/v2/projects/p-dev/secrets/hf_auth_token", { value: VALUE })).status).toBe(200);
    await until("hf_auth_token", sha(VALUE));
  }, 150_000);

  it("a new value replaces the replicas, which see it; a deleted secret is gone from new replicas", async () => {
    expect((await t.api("PUT", "/v2/projects/p-dev/secrets/hf_auth_token", { value: VALUE2 })).status).toBe(200);
    await until("hf_auth_token", sha(VALUE2));
    expect((await t.api("DELETE", "/v2/projects/p-dev/secrets/hf_auth_token")).status).toBe(200);
    await until("hf_auth_token", null);
    expect(lines.some((l) => /a project secret changed; replacing the app's replicas/.test(l.msg))).toBe(true);
  }, 150_000);

  it("several secrets set at once replace the replicas once", async () => {
    // One line per app of the project replaced: the reader's.
    const replacing = () =>
      lines.filter((l) => /a project secret changed; replacing/.test(l.msg) && l.app === "p-dev.reader").length;
    const before = replacing();
    await Promise.all(
      ["ONE", "TWO", "THREE"].map((name) => t.api("PUT", `/v2/projects/p-dev/secrets/${name}`, { value: name })),
    );
    await until("THREE", sha("THREE"));
    expect((await call("plain", "ONE")).json.result).toBe("ONE");
    await new Promise((r) => setTimeout(r, 1000));
    expect(replacing() - before).toBe(1);
  }, 150_000);

  it("no value is in the run's log lines, the app record, its replicas, its runs or its log", async () => {
    const app = await t.api("GET", "/v2/projects/p-dev/apps/reader");
    let runs = await t.api("GET", "/v2/projects/p-dev/apps/reader/runs?page_size=500");
    // The run history is a few milliseconds behind the runs.
    for (let i = 0; i < 100 && (JSON.parse(runs.text).runs ?? []).length < 3; i++) {
      await new Promise((r) => setTimeout(r, 100));
      runs = await t.api("GET", "/v2/projects/p-dev/apps/reader/runs?page_size=500");
    }
    const logs = await t.api("GET", "/v2/projects/p-dev/apps/reader/logs?limit=5000");
    expect(app.status).toBe(200);
    expect(runs.status).toBe(200);
    expect(JSON.parse(runs.text).runs.length).toBeGreaterThan(2);
    const everything = [JSON.stringify(lines), app.text, runs.text, logs.text].join("\n");
    for (const v of [VALUE, VALUE2]) expect(everything).not.toContain(v);
    // What the app printed is there: a value it printed would be too.
    expect(logs.text).toContain("checked hf_auth_token");
  });
});
