// Deploy-time steps run in the sandbox, and what they report quotes no file
// and no path of this machine: a requirements.txt that includes a system
// file, a module that raises with a file's contents at import.
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parseAppConfig } from "../../services/apps/app-config.js";
import { parseCerebriumConfig } from "../../services/apps/cerebrium-config.js";
import { silentLogger } from "../../services/config/logger.js";
import { PrepareFailed } from "../../services/runs/errors.js";
import { prepareDeployment } from "../../services/runner/prepare.js";
import { skiffToml, writeApp, type CortexRuntime } from "../helpers/apps.js";

let tmp: string;
let hosts: string;
beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), "skiff-sandbox-deploy-"));
  hosts = (await readFile("/etc/hosts", "utf8")).trim();
});
afterAll(() => rm(tmp, { recursive: true, force: true }));

const cortex = (language: CortexRuntime["language"], entry: string) =>
  parseAppConfig(skiffToml({ name: "a", runtime: { kind: "cortex", language, entry } }));

async function failure(dir: string, language: CortexRuntime["language"], entry: string): Promise<string> {
  const err = await prepareDeployment(dir, cortex(language, entry), silentLogger).catch((e: unknown) => e);
  expect(err).toBeInstanceOf(PrepareFailed);
  const message = (err as Error).message;
  // Nothing of the file that was read, no path of this machine.
  for (const line of hosts.split("\n").filter((l) => l.trim().length > 3)) expect(message).not.toContain(line.trim());
  expect(message).not.toContain("/etc/");
  expect(message).not.toContain(tmp);
  expect(message).not.toContain(dir);
  return message;
}

describe("deploy-time steps: errors name the app's file and line, never what a file holds", () => {
  it("requirements.txt including a system file: a generic reason", async () => {
    const dir = await writeApp(tmp, { "main.py": "def f():\n    return 1\n", "requirements.txt": "-r /etc/hosts\n" });
    expect(await failure(dir, "python", "main.py")).toMatch(/^could not install requirements\.txt/);
    const passwd = await writeApp(tmp, {
      "main.py": "def f():\n    return 1\n",
      "requirements.txt": "-r /etc/passwd\n",
    });
    expect(await failure(passwd, "python", "main.py")).toMatch(/^could not install requirements\.txt/);
  }, 60_000);

  it("a Python module that raises with a file's contents: its type and app file:line only", async () => {
    const dir = await writeApp(tmp, {
      "main.py": "import helper\n",
      "helper.py": "\n\nraise RuntimeError(open('/etc/hosts').read())\n",
    });
    expect(await failure(dir, "python", "main.py")).toBe(
      "cannot load main.py:\nRuntimeError: raised while the module was imported at helper.py:3; its output is in the app's log: skiff logs a",
    );
  });

  it("a Node module that throws with a file's contents: its type and app file:line only", async () => {
    const dir = await writeApp(tmp, {
      "index.mjs":
        "import { readFileSync } from 'node:fs';\n\nthrow new TypeError(readFileSync('/etc/hosts', 'utf8'));\n",
    });
    expect(await failure(dir, "node", "index.mjs")).toBe(
      "cannot load index.mjs:\nTypeError: raised while the module was imported at index.mjs:3; its output is in the app's log: skiff logs a",
    );
  });

  it("the import check runs in the sandbox: the module sees /app, not the host's folder", async () => {
    const dir = await writeApp(tmp, {
      "main.py":
        "import os\nif os.getcwd() != '/app' or os.path.exists('" +
        tmp +
        "'):\n    raise SystemError('not sandboxed')\n\ndef ok():\n    return 1\n",
    });
    expect(await prepareDeployment(dir, cortex("python", "main.py"), silentLogger)).toEqual({ functions: ["ok"] });
  });
});

describe("deploy-time steps of a cerebrium.toml", () => {
  it("shell_commands run after the installs, in the sandbox, with the operator's package index and the venv first on PATH", async () => {
    const dir = await writeApp(tmp, {
      "cerebrium.toml": "",
      "main.py": "def f():\n    return 1\n",
    });
    const { config } = parseCerebriumConfig(
      '[cerebrium.deployment]\nname = "steps"\nshell_commands = ["env > env.txt; id -u > uid.txt; command -v python > python.txt; pwd > pwd.txt"]\n\n[cerebrium.dependencies.pip]\nloguru = "latest"\n',
    );
    const prepared = await prepareDeployment(dir, config, silentLogger, {
      pip: { indexUrl: "https://pypi.example.internal/simple", extraIndexUrls: ["https://extra.example/simple"] },
    });
    expect(prepared.python).toBe(path.join(dir, ".skiff", "venv", "bin", "python"));
    expect(prepared.functions).toEqual(["f"]);
    const env = await readFile(path.join(dir, "env.txt"), "utf8");
    expect(env).toContain("PIP_INDEX_URL=https://pypi.example.internal/simple\n");
    expect(env).toContain("PIP_EXTRA_INDEX_URL=https://extra.example/simple\n");
    expect((await readFile(path.join(dir, "python.txt"), "utf8")).trim()).toBe("/app/.skiff/venv/bin/python");
    expect((await readFile(path.join(dir, "pwd.txt"), "utf8")).trim()).toBe("/app");
    expect(Number(await readFile(path.join(dir, "uid.txt"), "utf8"))).not.toBe(0);
  });
});
